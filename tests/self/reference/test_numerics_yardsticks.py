"""The judge's yardsticks, made of :mod:`numcheck.reference.numerics`, are the built-ins they stand for, bit for bit.

Until issue 45 the judge ran the built-ins themselves: eager (``impls/builtin/eager.py``) as judgement (b)'s
yardstick and the convergence baseline, the single FP8 built-in ``fp8_linear[<kind>]`` as the grouped family's
``per_expert_linear`` yardstick, and the chunked built-ins' accumulators (``impls/builtin/grad_accum.py``) inside
the declared-path yardstick. Now the judge builds its own from the shared numerics and imports no built-in
(``tests/self/test_layers.py``). Each test here runs the old yardstick (the built-in, through the registry's
factory) and the new one (what the judge runs) on the same inputs and asks for the same bits in every output: a
change to one side that is not made to the other (a declaration, a cast, a step) fails here, before it moves a
verdict.
"""

from __future__ import annotations

import pytest
import torch

from numcheck.impls.builtin import grad_accum
from numcheck.impls.builtin.eager import eager_impls
from numcheck.impls.builtin.fp8_linear import fp8_linear_impls
from numcheck.properties.fp8.cases import Fp8Case, build_fp8
from numcheck.properties.fp8.props import run_fp8_impl
from numcheck.properties.fp8.yardstick import SingleFp8Linear
from numcheck.properties.linear_ce.cases import Problem, build
from numcheck.properties.linear_ce.harness import eager_yardstick, run_impl, same_bits
from numcheck.reference.fp8_recipes import standard_recipes
from numcheck.reference.numerics import accumulation

pytestmark = pytest.mark.torch_versions(
    reason="both sides take the paths a torch release switches (the _scaled_mm and addmm(out_dtype=) probes, eager "
    "casts): the same bits must come out of each"
)

#: Problems that reach the eager composition's branches: bias, fp16 with smoothing, z-loss and ignored rows,
#: autocast with a loss scale, per-row upstream with softcap and class weights.
PROBLEMS = [
    Problem(N=9, H=16, V=33, dtype="bfloat16", bias=True, seed=1),
    Problem(
        N=12, H=8, V=40, dtype="float16", reduction="sum", label_smoothing=0.1, z_loss_scale=1e-3, ignored=0.25, seed=2
    ),
    Problem(N=10, H=12, V=24, dtype="float32", autocast="bfloat16", bias=True, upstream="loss_scale", seed=3),
    Problem(
        N=7,
        H=16,
        V=19,
        dtype="float32",
        reduction="none",
        upstream="per_row",
        softcap=5.0,
        class_weights=True,
        seed=4,
    ),
]


def _differing(old: dict[str, torch.Tensor | None], new: dict[str, torch.Tensor | None]) -> list[str]:
    """The outputs whose presence, dtype, shape or bits differ between the two runs."""
    out = []
    for name in sorted(set(old) | set(new)):
        a, b = old.get(name), new.get(name)
        if (a is None) != (b is None) or (a is not None and not same_bits(a, b)):
            out.append(name)
    return out


@pytest.mark.parametrize("p", PROBLEMS, ids=lambda p: f"{p.dtype}-{p.autocast}-{p.reduction}-{p.upstream}")
def test_eager_yardstick_is_the_eager_builtin(p: Problem) -> None:
    """Judgement (b)'s yardstick equals the built-in ``eager`` in every output and in its declaration."""
    builtin, yardstick = eager_impls()[0], eager_yardstick()
    assert (yardstick.name, yardstick.support) == (builtin.name, builtin.support)
    t = build(p)
    outs = [run_impl(impl, p, t) for impl in (builtin, yardstick)]
    old, new = ({k: getattr(o, k) for k in ("loss", "z_loss", "grad_x", "grad_weight", "grad_bias")} for o in outs)
    assert not _differing(old, new), f"{p}: eager yardstick differs from the built-in in {_differing(old, new)}"


def _fp8_cases() -> list[Fp8Case]:
    cases = []
    for r in standard_recipes():
        for dtype in ("bfloat16", "float32"):
            for soi in (False, True) if r.allows_save_original_input else (False,):
                cases.append(Fp8Case(r, 32, 256, 64, dtype=dtype, bias=True, save_original_input=soi))
    return cases


@pytest.mark.parametrize("case", _fp8_cases(), ids=lambda c: f"{c.recipe}-{c.dtype}-soi{int(c.save_original_input)}")
def test_per_expert_yardstick_is_the_single_fp8_builtin(case: Fp8Case) -> None:
    """``per_expert_linear``'s single FP8 linear equals the built-in ``fp8_linear[<kind>]`` in y and every
    gradient, and in name and declaration (its accumulation bounds the comparison)."""
    builtin = next(i for i in fp8_linear_impls() if i.recipe_kind == case.recipe.kind)
    yardstick = SingleFp8Linear(case.recipe.kind)
    assert (yardstick.name, yardstick.support) == (builtin.name, builtin.support)
    t = build_fp8(case)
    runs = [run_fp8_impl(impl, case, t) for impl in (builtin, yardstick)]
    old, new = ({k: getattr(r, k) for k in ("y", "dgrad", "wgrad", "bgrad")} for r in runs)
    assert not _differing(old, new), f"{case}: yardstick differs from {builtin.name} in {_differing(old, new)}"


@pytest.mark.parametrize("path", sorted(accumulation.PROBE_FREE_STEPS))
@pytest.mark.parametrize("param_dtype", [torch.bfloat16, torch.float32])
def test_declared_path_accumulators_are_the_builtins(path: str, param_dtype: torch.dtype) -> None:
    """The declared-path yardstick's accumulators (a reference buffer and step) equal the chunked built-ins'
    (:func:`impls.builtin.grad_accum.make_accumulator`) for a weight and a bias, finished with a loss scale."""
    g = torch.Generator().manual_seed(5)
    V, H, C = 24, 16, 8
    chunks = [(torch.randn(C, V, generator=g).bfloat16(), torch.randn(C, H, generator=g).bfloat16()) for _ in range(6)]
    scale = torch.tensor(1024.0 + 1 / 3)
    got = {}
    for side in ("old", "new"):
        for shape in ((V, H), (V,)):
            if side == "old":
                acc = grad_accum.make_accumulator(path, shape, param_dtype, "cpu")
            else:
                step = accumulation.PROBE_FREE_STEPS[path]
                acc = accumulation.BufferAccumulator(path, step, shape, param_dtype, "cpu")
            for G, x in chunks:
                acc.add_(G, x if len(shape) == 2 else None)
            got[side, shape] = acc.finish(scale, param_dtype)
    for shape in ((V, H), (V,)):
        assert same_bits(got["old", shape], got["new", shape]), f"path {path}, {param_dtype}, shape {shape}"
