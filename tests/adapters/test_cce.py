"""The ``cce[...]`` adapters (cut-cross-entropy): the declaration read from the installed signature, the option
mapping, the behaviour without the package, the CPU unavailability with its reason, and, where the kernels run
(CUDA), the installed release against the float64 oracle plus what its source says it does outside the model:
the target logit summed from rounded products, gradient filtering, and the undeclared cases that fail.

Cost: without cut-cross-entropy, well under a second. With it on a CPU: the import (~1.5 s), one failing
interpreter probe, and ``cce[impl=torch_compile]`` on the oracle cases (a torch.compile per dtype and
reduction, ~3-7 s each: about a minute). On CUDA: a few seconds of kernel compiles.
"""

from __future__ import annotations

import inspect
import math
from typing import Any, Callable, Iterator

import pytest
import torch

import numcheck.impls.adapters.cce as cce
from numcheck.impls.registry import builtin as _impl
from numcheck.properties.core.failures import fail
from numcheck.properties.linear_ce.accuracy import check_accuracy
from numcheck.properties.linear_ce.cases import Problem, build
from numcheck.properties.linear_ce.harness import run_impl
from numcheck.properties.linear_ce.known import known
from numcheck.properties.linear_ce.strategies import why_not_run
from numcheck.tests.adapters.uninstalled import impls_while_uninstalled

INFO = cce.load()
SKIP_REASON = INFO if isinstance(INFO, str) else None
CUDA = torch.cuda.is_available() and not cce.interpreted()
DEVICE = "cuda" if CUDA else "cpu"
BY_NAME = {v.name: v for v in cce.VARIANTS}

#: Hand-picked cases: each reduction (``none`` with a per-row upstream gradient), ignored rows, softcap, fp16,
#: several 128-row and 128-class blocks (N=V=300: grad_weight and grad_x summed over 3 blocks each), the
#: confident regime, and the cases only ``torch_compile`` declares (fp32, AMP, an all-ignored batch).
CASES: list[Problem] = [
    Problem(N=11, H=16, V=37, dtype="bfloat16", seed=1),
    Problem(N=11, H=16, V=37, dtype="bfloat16", ignored=0.25, reduction="sum", upstream="scalar", seed=2),
    Problem(N=11, H=16, V=37, dtype="bfloat16", reduction="none", upstream="per_row", ignored=0.25, seed=3),
    Problem(N=11, H=16, V=37, dtype="bfloat16", softcap=5.0, seed=4),
    Problem(N=40, H=48, V=67, dtype="float16", ignored=0.1, seed=5),
    Problem(N=300, H=40, V=300, dtype="bfloat16", ignored=0.1, seed=6),
    Problem(N=11, H=16, V=37, dtype="bfloat16", regime="confident", seed=7),
    Problem(N=11, H=16, V=37, dtype="float32", softcap=5.0, ignored=0.25, seed=8),
    Problem(N=40, H=32, V=67, autocast="bfloat16", ignored=0.1, seed=9),
    Problem(N=11, H=16, V=37, dtype="float32", ignored=1.0, seed=10),
]
CASES = [p.replace(device=DEVICE) for p in CASES]


def _params() -> Iterator[Any]:
    """(variant name, case) pairs for :func:`test_matches_oracle`."""
    for v in cce.VARIANTS:
        for p in CASES:
            yield pytest.param(v.name, p, id=f"{v.name}-{p.short()}")


@pytest.mark.parametrize("name,p", list(_params()))
def test_matches_oracle(name: str, p: Problem) -> None:
    """Each variant is within the tolerance model of the float64 oracle for its declaration (25.1.1's kernels declare
    target_logit="rounded_products")."""
    impl = _impl(name)
    why = why_not_run(impl, p)
    if why:
        pytest.skip(why)
    k = known(name, "accuracy", p)
    if k is not None:
        pytest.skip(f"known divergence: {k.reason}")
    res = check_accuracy(impl, p)
    if not res.ok:
        fail(impl, "accuracy", p, *res.failure_lines())


# -- the declaration, without running a kernel -------------------------------------------------------------------


def _release_25_1_1(
    e: torch.Tensor,
    c: torch.Tensor,
    targets: torch.Tensor,
    ignore_index: int = -100,
    softcap: float | None = None,
    reduction: str = "mean",
    shift: bool = False,
    filter_eps: float | str | None = "high",
    impl: str = "cce",
) -> torch.Tensor:
    """Stand-in with the parameter list of cut-cross-entropy 25.1.1's ``linear_cross_entropy``."""
    raise AssertionError("not called")


def _release_with_bias(
    e: torch.Tensor,
    c: torch.Tensor,
    targets: torch.Tensor,
    bias: torch.Tensor | None = None,
    ignore_index: int = -100,
    softcap: float | None = None,
    reduction: str = "mean",
    shift: int = 0,
    return_lse: bool = False,
    filter_eps: float | str | None = "auto",
    impl: str = "cce",
) -> torch.Tensor:
    """Stand-in with a later release's parameter list (a ``bias`` parameter)."""
    raise AssertionError("not called")


def _stand_in(fn: Callable[..., Any], names: frozenset[str] = frozenset({"cce", "torch_compile"})) -> cce.CCEInfo:
    """A :class:`impls.adapters.cce.CCEInfo` for a stand-in function, with 128-row backward blocks."""
    return cce.info_from(fn, "stand-in", names, 128, 128)


def test_declaration_follows_the_signature() -> None:
    """25.1.1's parameter list yields the declarations read from its source, CUDA-only when the kernels fail on CPU."""
    info = _stand_in(_release_25_1_1)
    for v in cce.VARIANTS:
        s, notes = cce.declare(info, v, kernel_reason="kernels fail here", on_cpu=True)
        assert set(s.options) == {"ignore_index", "softcap"} and set(s.reductions) == {"mean", "sum", "none"}
        assert any("bias" in n for n in notes) and any("label_smoothing" in n for n in notes)
        if v.kernels:
            assert s.dtypes == {torch.bfloat16, torch.float16} and not s.autocast and s.all_ignored is None
            assert (s.grad_accumulation, s.chunk_rows, s.logits_dtype, s.ce_dtype) == (
                "param_dtype",
                128,
                "float32",
                "float32",
            )
            assert (s.grad_x_accumulation, s.chunk_cols) == ("param_dtype", 128)
            assert not s.deterministic  # lock-ordered block adds and atomics
            assert s.devices == {"cuda"} and s.unavailable_reason() == "kernels fail here"
        else:
            assert s.dtypes == {torch.float32, torch.bfloat16, torch.float16} and s.all_ignored == "nan"
            assert (s.grad_accumulation, s.logits_dtype, s.ce_dtype) == ("fp32", "compute", "float32")
            assert s.deterministic
            assert s.devices == {"cpu", "cuda"} and s.unavailable_reason() is None
    s, _ = cce.declare(info, BY_NAME["cce[filter_eps=None]"], kernel_reason=None, on_cpu=False)
    assert s.devices == {"cuda"} and s.unavailable_reason() is None
    s, _ = cce.declare(_stand_in(_release_with_bias), BY_NAME["cce[filter_eps=None]"], on_cpu=False)
    assert "bias" in s.options


def test_options_are_passed_by_keyword() -> None:
    """Options go by keyword (filter_eps only when the variant sets it); one without a parameter is refused by name."""
    calls: list[dict] = []

    def recorder(
        e: torch.Tensor,
        c: torch.Tensor,
        targets: torch.Tensor,
        ignore_index: int = -100,
        softcap: float | None = None,
        reduction: str = "mean",
        shift: bool = False,
        filter_eps: float | str | None = "high",
        impl: str = "cce",
    ) -> torch.Tensor:
        """Stand-in that records what it was given."""
        calls.append(
            dict(ignore_index=ignore_index, softcap=softcap, reduction=reduction, filter_eps=filter_eps, impl=impl)
        )
        return e.sum() * 0.0

    info = _stand_in(recorder)
    x, w, y = torch.randn(3, 4), torch.randn(5, 4), torch.tensor([0, 1, 2])
    cce.call_cce(info, BY_NAME["cce[filter_eps=default]"], x, w, y, reduction="sum", ignore_index=-7, softcap=2.0)
    cce.call_cce(info, BY_NAME["cce[filter_eps=None]"], x, w, y)
    cce.call_cce(info, BY_NAME["cce[impl=torch_compile]"], x, w, y, reduction="none")
    assert calls == [
        dict(ignore_index=-7, softcap=2.0, reduction="sum", filter_eps="high", impl="cce"),
        dict(ignore_index=-100, softcap=None, reduction="mean", filter_eps=None, impl="cce"),
        dict(ignore_index=-100, softcap=None, reduction="none", filter_eps="high", impl="torch_compile"),
    ]
    for kw, word in (
        (dict(label_smoothing=0.1), "label_smoothing"),
        (dict(class_weights=torch.ones(5)), "class_weights"),
        (dict(z_loss_scale=0.5), "z_loss_scale"),
    ):
        with pytest.raises(ValueError, match=word):
            cce.call_cce(info, BY_NAME["cce[filter_eps=None]"], x, w, y, **kw)
    with pytest.raises(ValueError, match="bias"):
        cce.call_cce(info, BY_NAME["cce[filter_eps=None]"], x, w, y, torch.zeros(5))


def test_missing_impl_name_makes_the_variant_unavailable() -> None:
    """A release without the 'torch_compile' impl leaves cce[impl=torch_compile] unavailable, naming what it has."""
    impl = cce.build_impl(BY_NAME["cce[impl=torch_compile]"], _stand_in(_release_25_1_1, frozenset({"cce"})))
    assert "no impl 'torch_compile'" in (impl.support.unavailable_reason() or "")


def test_absent_package_registers_with_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without cut-cross-entropy every variant registers, unavailable with "cut-cross-entropy is not installed"."""
    impls = impls_while_uninstalled(monkeypatch, "cut_cross_entropy", cce.cce_impls, (cce.load, cce.kernel_failure))
    assert [i.name for i in impls] == [v.name for v in cce.VARIANTS]
    for impl in impls:
        assert impl.support.unavailable_reason() == "cut-cross-entropy is not installed"
        with pytest.raises(RuntimeError, match="not installed"):
            impl(torch.zeros(1, 1), torch.zeros(1, 1), torch.zeros(1, dtype=torch.long))


# -- the installed release -----------------------------------------------------------------------------------------


@pytest.mark.skipif(SKIP_REASON is not None, reason=f"{SKIP_REASON}")
def test_installed_release_is_what_was_read() -> None:
    """The installed 25.1.1 has the parameters, defaults, impl names and backward block the declarations assume."""
    if INFO.version != cce.SOURCE_READ:
        pytest.skip(f"installed {INFO.version}; the declarations were read from {cce.SOURCE_READ}")
    assert INFO.params == ("e", "c", "targets", "ignore_index", "softcap", "reduction", "shift", "filter_eps", "impl")
    assert INFO.defaults["filter_eps"] == "high" and INFO.defaults["ignore_index"] == -100
    assert INFO.impl_names == {"cce", "torch_compile"}
    assert INFO.backward_block_rows == (None if _autotuned() else 128)
    assert INFO.backward_block_cols == (None if _autotuned() else 128)
    assert _impl("cce[filter_eps=None]").support.chunk_rows == INFO.backward_block_rows
    assert _impl("cce[filter_eps=None]").support.chunk_cols == INFO.backward_block_cols


def _autotuned() -> bool:
    """Whether CCE_AUTOTUNE asks cut-cross-entropy to autotune its block sizes per shape."""
    import os

    return os.getenv("CCE_AUTOTUNE", "0") != "0"


@pytest.mark.skipif(SKIP_REASON is not None, reason=f"{SKIP_REASON}")
def test_kernels_unavailable_on_cpu_with_reason(capsys: pytest.CaptureFixture[str]) -> None:
    """Without CUDA the kernel variants declare CUDA only and say why (a real failure), and ``numcheck list`` shows it."""
    if CUDA:
        pytest.skip("CUDA present: the kernels run compiled")
    from numcheck.reports.cli import main

    names = [v.name for v in cce.VARIANTS if v.kernels]
    for name in names:
        impl = _impl(name)
        reason = impl.support.unavailable_reason() or ""
        assert impl.support.devices == {"cuda"} and "CUDA" in reason, (name, reason)
        if cce.interpreted():
            assert "TRITON_INTERPRET=1" in reason
    if cce.interpreted():
        x = torch.randn(4, 8).to(torch.bfloat16).requires_grad_(True)
        w = torch.randn(16, 8).to(torch.bfloat16).requires_grad_(True)
        with pytest.raises(Exception):  # noqa: B017 - any failure of a kernel that cannot run on CPU
            _impl(names[0])(x, w, torch.zeros(4, dtype=torch.long)).backward()
    main(["list", *[a for n in names for a in ("--impl", n)]])
    out = capsys.readouterr().out
    for name in names:
        assert f"here: unsupported — {_impl(name).support.unavailable_reason()}" in out, out


# -- CUDA: what the source says happens outside the tolerance model ---------------------------------------------------


def _needs_kernels() -> None:
    """Skip unless cut-cross-entropy is installed and its kernels run here."""
    if SKIP_REASON is not None:
        pytest.skip(SKIP_REASON)
    reason = _impl("cce[filter_eps=None]").support.unavailable_reason()
    if reason:
        pytest.skip(reason)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_target_logit_is_summed_from_rounded_products(dtype: torch.dtype) -> None:
    """With V=H=1 (exact loss 0) each row's 25.1.1 loss is exactly fp32(x·w) − round_dtype(x·w) (indexed_dot.py:64)."""
    _needs_kernels()
    if INFO.version != cce.SOURCE_READ:
        pytest.skip(f"pinned for {cce.SOURCE_READ}; installed {INFO.version}")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 1, generator=g).to(dtype).to(DEVICE).requires_grad_(True)
    w = torch.randn(1, 1, generator=g).to(dtype).to(DEVICE).requires_grad_(True)
    loss = _impl("cce[filter_eps=None]")(
        x, w, torch.zeros(64, dtype=torch.long, device=DEVICE), reduction="none", ignore_index=-100
    )
    z = x.detach().float() * w.detach().float()[0]
    expected = (z - z.to(dtype).float())[:, 0]
    assert torch.equal(loss.detach(), expected), (loss, expected)
    assert bool((expected != 0).any())


@pytest.mark.parametrize(
    "p,skips",
    [
        (Problem(N=16, H=32, V=256, dtype="bfloat16", regime="confident", seed=0), True),  # every entry small
        (Problem(N=1, H=1, V=1025, dtype="bfloat16"), True),  # H200: 640 of 1025 grad_weight rows zeroed
        (
            Problem(N=1, H=1, V=1000, dtype="bfloat16"),
            True,
        ),  # H200: the same, with no block of small contiguous classes
        (Problem(N=2, H=1, V=2, dtype="bfloat16", reduction="sum"), True),  # H200: two_calls' one-row halves
        (Problem(N=11, H=16, V=37, dtype="bfloat16", seed=1), False),  # passes on the H200 with filtering on
        (Problem(N=40, H=48, V=67, dtype="float16", ignored=0.1, seed=5), False),  # passes on the H200 likewise
    ],
)
def test_filtering_predicate(p: Problem, skips: bool) -> None:
    """The known divergence's data predicate says a 128-class block may be skipped where some valid row has as
    many |softmax − onehot| below eps/32 as the smallest block has classes (cases seen on the H200 either way)."""
    from numcheck.properties.linear_ce.known_cce import cce_filtering_may_skip

    assert cce_filtering_may_skip(p, block_cols=128) is skips


def test_filtering_zeroes_blocks() -> None:
    """When every |softmax − onehot| < eps/32, the default filter zeroes all gradients; filter_eps=None does not."""
    p = Problem(N=16, H=32, V=256, dtype="bfloat16", regime="confident", seed=0)
    t = build(p)
    z = t.x.double() @ t.weight.double().T
    g = z.softmax(-1) - torch.nn.functional.one_hot(t.target, p.V).double()
    assert float(g.abs().max()) < torch.finfo(torch.bfloat16).eps / 32, "precondition: every block filterable"
    _needs_kernels()
    p = p.replace(device=DEVICE)
    outs = {}
    for name in ("cce[filter_eps=default]", "cce[filter_eps=None]"):
        outs[name] = run_impl(_impl(name), p)
    filt, exact = outs["cce[filter_eps=default]"], outs["cce[filter_eps=None]"]
    assert torch.equal(filt.loss, exact.loss)
    assert not bool(filt.grad_x.any()) and not bool(filt.grad_weight.any())
    assert bool(exact.grad_x.any()) and bool(exact.grad_weight.any())
    res = check_accuracy(_impl("cce[filter_eps=None]"), p)
    grads = [c for c in res.analytic.values() if c.output.startswith("grad_")]
    assert all(c.ok for c in grads), [c.describe() for c in grads if not c.ok]


def test_undeclared_cases_really_fail() -> None:
    """fp32 and AMP fail at backward's bf16/fp16 assertion; an all-ignored 'mean' is NaN, its backward divides by 0."""
    _needs_kernels()
    impl = _impl("cce[filter_eps=None]")
    y = torch.zeros(8, dtype=torch.long, device=DEVICE)

    def operands(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Fresh leaf x [8, 16] and weight [32, 16] of ``dtype`` on the device."""
        return (
            torch.randn(8, 16, device=DEVICE).to(dtype).requires_grad_(True),
            torch.randn(32, 16, device=DEVICE).to(dtype).requires_grad_(True),
        )

    x, w = operands(torch.float32)
    with pytest.raises(AssertionError, match="bf16 or fp16"):
        impl(x, w, y, reduction="sum", ignore_index=-100).backward()
    x, w = operands(torch.float32)
    with pytest.raises(AssertionError, match="bf16 or fp16"):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = impl(x, w, y, reduction="sum", ignore_index=-100)
        loss.backward()
    x, w = operands(torch.bfloat16)
    loss = impl(x, w, torch.full_like(y, -100), reduction="mean", ignore_index=-100)
    assert math.isnan(float(loss))
    with pytest.raises(ZeroDivisionError):
        loss.backward()


def test_stand_ins_have_the_read_signatures() -> None:
    """The stand-in signatures used above are those of the installed release, where it is the one read."""
    if SKIP_REASON is not None or INFO.version != cce.SOURCE_READ:
        pytest.skip(SKIP_REASON or f"installed {INFO.version}")
    assert tuple(inspect.signature(_release_25_1_1).parameters) == INFO.params
