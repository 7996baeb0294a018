"""The TP FP8 suite's sharpness: the ci profile's draws of the suite test named in CAUGHT_BY fail every mutant; a
declared partial dtype is held; judgement (b) judges every assembled output against the declared path."""

from __future__ import annotations

import pytest
import torch
from hypothesis import Phase, settings

from numcheck.errors import PropertyFailure
from numcheck.impls.builtin.tp_fp8_linear import tp_fp8_linear_impls
from numcheck.properties.core import matmul_precision
from numcheck.properties.distributed.pool.pool import default_backend, world_size_unavailable
from numcheck.properties.distributed.tp_fp8 import props as checks
from numcheck.properties.distributed.tp_fp8.cases import TPFp8Case, steps_tensors
from numcheck.properties.distributed.tp_fp8.suite import run_drawn
from numcheck.properties.distributed.tp_fp8.yardstick import tp_relative
from numcheck.reference.fp8_linear import quantized_linear
from numcheck.tests.self.helpers.dist_fp8_mutants import CAUGHT_BY, DTYPE_CAUGHT_BY, DTYPE_MUTANTS, MUTANTS

pytestmark = pytest.mark.usefixtures("one_thread_per_module")


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name for m in MUTANTS])
def test_mutant_is_caught_by_the_ci_profile(mutant):
    """The ci profile's draws (unshrunk: the first failure is enough) of the mutant's suite test fail it."""
    base = settings(settings.get_profile("numcheck-ci"), phases=[p for p in Phase if p is not Phase.shrink])
    sizes = [p for p in mutant.support.world_sizes if p > 1 and world_size_unavailable(p, default_backend()) is None]
    if not sizes:
        pytest.skip(f"the mutants need P >= 2: {world_size_unavailable(2, default_backend())}")
    pin = {} if len(sizes) == len([p for p in mutant.support.world_sizes if p > 1]) else {"world": max(sizes)}
    with pytest.raises(PropertyFailure):
        run_drawn(mutant, CAUGHT_BY[mutant.name], base=base, **pin)


@pytest.mark.parametrize("mutant", DTYPE_MUTANTS, ids=[m.name for m in DTYPE_MUTANTS])
def test_declared_partial_dtype_is_held(mutant):
    """An impl declaring fp32 partials that reduces them in the output dtype fails the ci profile's draws at P = 2 in
    both parallel modes (the sharded reduction's bound is built from the partials, so it sees their rounding)."""
    base = settings(settings.get_profile("numcheck-ci"), phases=[p for p in Phase if p is not Phase.shrink])
    if world_size_unavailable(2, default_backend()):
        pytest.skip(world_size_unavailable(2, default_backend()))
    for parallel in ("row", "column"):
        with pytest.raises(PropertyFailure):
            run_drawn(mutant, DTYPE_CAUGHT_BY[mutant.name], base=base, parallel=parallel, world=2)


def test_relative_judgement_of_every_assembled_output():
    """dist_accuracy judges every assembled output of every step by (b) against the declared path (partials in the
    output dtype for the built-in); the built-in passes, and a y three times as far off as allowed does not."""
    if world_size_unavailable(2, default_backend()):
        pytest.skip(world_size_unavailable(2, default_backend()))
    impl = tp_fp8_linear_impls()[1]
    case = TPFp8Case(
        impl.support.recipes[0],
        36,
        24,
        40,
        "bfloat16",
        True,
        "outlier",
        5,
        False,
        1,
        world=2,
        parallel="row",
        sequence_parallel=False,
    )
    with matmul_precision.pinned():
        res = checks.run_case(impl, case, "dist_accuracy")
        rel: dict = {}
        checks.judged_steps(impl, case, res, "dist_accuracy", rel)
        assert set(rel) == {"y", "dgrad", "wgrad", "bgrad"}
        assert all(r.judged and r.ok for r in rel.values()), [r.describe() for r in rel.values()]
        assert "partials in output" in rel["y"].yardstick
        t = steps_tensors(case)[0]
        ref = quantized_linear(t.x, t.weight, t.dy, t.bias, case.recipe)
        noise = torch.randn(ref.dq["y"].shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
        off = ref.dq["y"] + noise * (3 * rel["y"].allowed / float(noise.square().mean().sqrt()))
        bad = tp_relative(impl, case, t, ref, "y", off.to(torch.bfloat16), None)["y"]
    assert not bad.ok, bad.describe()
