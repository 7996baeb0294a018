"""The ``liger`` adapters: the installed Liger-Kernel release against the float64 oracle on hand-picked cases,
its declaration (what the interpreter cannot run is left out, with the reason shown), its per-release
signature handling, and that everything still loads when Liger-Kernel is absent.

Cost: about 15 Liger calls under the Triton interpreter (0.05–0.3 s each on 2 busy cores) plus the import of
liger_kernel once per process (~1.5 s): under 10 s in all.
"""

from __future__ import annotations

import pytest
import torch

import numcheck.impls.adapters.liger as liger
from numcheck.impls.registry import builtin as _impl
from numcheck.properties.core.failures import fail, impl_raised, raised_by_suite
from numcheck.properties.linear_ce.accuracy import check_accuracy
from numcheck.properties.linear_ce.cases import Problem
from numcheck.properties.linear_ce.strategies import why_not_run
from numcheck.tests.adapters.uninstalled import impls_while_uninstalled

pytestmark = pytest.mark.torch_versions(
    reason="Liger imported under this torch and its Triton (on torch 2.6 it cannot: unavailable with the reason)"
)

INFO = liger.load()
SKIP_REASON = INFO if isinstance(INFO, str) else None
#: Liger runs on CPU under the Triton interpreter, or compiled on CUDA where a GPU is present.
DEVICE = "cpu" if liger.interpreted() or not torch.cuda.is_available() else "cuda"

#: Hand-picked cases: every option the oracle has, each reduction, ``none`` with a non-uniform per-row
#: upstream gradient, the all-ignored batch (Liger's convention: zero), and low precision and AMP.
#: Shapes have N not a multiple of Liger's chunk (chunk = next_pow2(⌈N/⌈V/H⌉⌉) = 4 rows here, 3 chunks).
CASES: list[Problem] = [
    Problem(N=11, H=16, V=37, seed=1),
    Problem(N=11, H=16, V=37, bias=True, ignored=0.25, reduction="sum", seed=2),
    Problem(N=11, H=16, V=37, reduction="none", upstream="per_row", ignored=0.25, bias=True, seed=3),
    Problem(N=11, H=16, V=37, label_smoothing=0.1, upstream="scalar", seed=4),
    Problem(N=11, H=16, V=37, class_weights=True, label_smoothing=0.1, ignored=0.2, seed=5),
    Problem(N=11, H=16, V=37, z_loss_scale=1e-2, ignored=0.2, seed=6),
    Problem(N=11, H=16, V=37, z_loss_scale=1e-2, reduction="none", upstream="per_row", seed=7),
    Problem(N=11, H=16, V=37, softcap=5.0, seed=8),
    Problem(N=11, H=16, V=37, ignored=1.0, seed=9),
    Problem(N=11, H=16, V=37, ignored=1.0, reduction="none", upstream="per_row", seed=9),
    Problem(N=11, H=16, V=37, regime="confident", seed=10),
    Problem(N=40, H=32, V=67, dtype="bfloat16", bias=True, seed=11),
    Problem(N=40, H=32, V=67, autocast="bfloat16", ignored=0.1, seed=12),
    Problem(N=40, H=32, V=67, autocast="bfloat16", bias=True, ignored=0.1, seed=12),
]
CASES = [p.replace(device=DEVICE) for p in CASES]


def _params():
    for name in liger.VARIANTS:
        for p in CASES:
            yield pytest.param(name, p, id=f"{name}-{p.short()}")


@pytest.mark.parametrize("name,p", list(_params()))
def test_matches_oracle(name: str, p: Problem) -> None:
    """Each Liger variant matches the float64 oracle within the tolerance model on every declared case."""
    impl = _impl(name)
    why = why_not_run(impl, p)
    if why:
        pytest.skip(f"{why}; {impl.description}")
    try:
        res = check_accuracy(impl, p)
    except Exception as exc:  # the impl's own exception, reported as the suite reports it (properties.core.runner)
        if raised_by_suite(exc):
            raise
        raise impl_raised(impl, "accuracy", p, exc) from exc
    if not res.ok:
        fail(impl, "accuracy", p, *res.failure_lines())


def _exclusion_reasons(name: str) -> dict[str, str]:
    """Each option the variant ``name`` does not declare, with the reason its description must give: the
    installed release's signature has no parameter for it, or the interpreter cannot run it."""
    impl = _impl(name)
    gaps = liger.signature_gaps(INFO)
    return {
        opt: gaps.get(opt, "fails under TRITON_INTERPRET=1")
        for opt in set(liger.OPTION_PARAMS) - set(impl.support.options)
    }


def _available_variants() -> list[str]:
    return [n for n in liger.VARIANTS if _impl(n).support.unavailable_reason() is None]


@pytest.mark.skipif(SKIP_REASON is not None, reason=f"{SKIP_REASON}")
def test_exclusions_are_real_and_shown() -> None:
    """Every option a variant leaves out has its reason in the description: the installed release's forward has
    no parameter for it (named), or it really fails under the interpreter (an interpreter error, not Liger's)."""
    for name in _available_variants():
        impl = _impl(name)
        for opt, why in _exclusion_reasons(name).items():
            assert f"{opt}: {why}" in impl.description, (
                f"{name}: option {opt!r} is not declared but the description does not say why: {impl.description!r}"
            )
        if not liger.interpreted():
            continue
        kwargs = {"class_weights": {"class_weights": torch.ones(16)}, "softcap": {"softcap": 3.0}}
        probed = {o for o in _exclusion_reasons(name) if o not in liger.signature_gaps(INFO)}
        for opt in probed & set(kwargs):
            x, w = torch.randn(4, 8, requires_grad=True), torch.randn(16, 8, requires_grad=True)
            with pytest.raises(Exception) as info:
                liger.call_liger(INFO, liger.VARIANTS[name], x, w, torch.zeros(4, dtype=torch.long), **kwargs[opt])
            assert liger._is_interpreter_error(info.value), (
                f"{name}: {opt} excluded as an interpreter limitation but raised {type(info.value).__name__}: "
                f"{info.value} — a Liger error must stay declared so the suite reports it"
            )


@pytest.mark.skipif(SKIP_REASON is not None, reason=f"{SKIP_REASON}")
def test_numcheck_list_shows_reasons(capsys: pytest.CaptureFixture[str]) -> None:
    """``numcheck list`` prints, for each Liger variant, the installed release and the reason for every option
    it does not declare (or, for a variant the release cannot offer, why it is unavailable)."""
    from numcheck.reports.cli import main

    main(["list", "--impl", "liger[accum=None]", "--impl", "liger[accum=fp32]"])
    out = capsys.readouterr().out
    assert f"Liger-Kernel {INFO.version} " in out, out
    for name in liger.VARIANTS:
        assert name in out
        why_not = _impl(name).support.unavailable_reason()
        if why_not:
            assert why_not in out, f"{name}: unavailable, but the reason is not shown in:\n{out}"
            continue
        for opt, why in _exclusion_reasons(name).items():
            assert f"{opt}: {why}" in out, f"{name}: no reason for {opt} in:\n{out}"


@pytest.mark.skipif(SKIP_REASON is not None, reason=f"{SKIP_REASON}")
def test_declaration_follows_installed_release() -> None:
    """The declaration matches the installed release: z-loss returned, the all-ignored convention is zero, and
    accum=None accumulates in the parameter dtype while accum=fp32 does not."""
    assert INFO.has("return_z_loss") == _impl("liger[accum=None]").support.returns_z_loss
    for name in liger.VARIANTS:
        assert _impl(name).support.all_ignored == "zero"
    assert _impl("liger[accum=None]").support.grad_accumulation == "param_dtype"
    if INFO.has("return_z_loss"):  # the declared z-loss really comes back, as a tensor
        impl = _impl("liger[accum=None]")
        x, w = (
            torch.randn(4, 8, device=DEVICE, requires_grad=True),
            torch.randn(16, 8, device=DEVICE, requires_grad=True),
        )
        out = impl(
            x,
            w,
            torch.zeros(4, dtype=torch.long, device=DEVICE),
            None,
            reduction="sum",
            ignore_index=-100,
            z_loss_scale=0.5,
        )
        assert isinstance(out, tuple) and isinstance(out[1], torch.Tensor) and float(out[1]) > 0, out
    assert _impl("liger[accum=fp32]").support.grad_accumulation in ("fp32", "per_chunk_rounding")


class _Recorder:
    """Stands in for an older release's Function: records the positional arguments of ``apply``."""

    calls: list[tuple] = []

    @staticmethod
    def forward(
        ctx,
        _input,
        weight,
        target,
        bias=None,
        ignore_index=-100,
        lse_square_scale=0.0,
        label_smoothing=0.0,
        reduction="mean",
        softcap=None,
    ):
        raise AssertionError("not called")

    @classmethod
    def apply(cls, *args):
        cls.calls.append(args)
        return args[0].sum() * 0.0  # old releases returned the loss tensor alone


def _old_release() -> liger.LigerInfo:
    import inspect

    sig = inspect.signature(_Recorder.forward)
    return liger.LigerInfo(
        version="0.3-like",
        params=tuple(sig.parameters)[1:],
        defaults={n: p.default for n, p in sig.parameters.items() if p.default is not inspect.Parameter.empty},
        function=_Recorder,
    )


def test_older_signature_is_mapped_by_name() -> None:
    """For a release without ce_weight/return_z_loss/accum_dtype the adapter passes arguments in that
    release's order, declares no class weights and no z-loss return, and names the missing parameter."""
    info = _old_release()
    _Recorder.calls.clear()
    x, w, y = torch.randn(3, 4), torch.randn(5, 4), torch.tensor([0, 1, 2])
    b = torch.randn(5)
    out = liger.call_liger(
        info, None, x, w, y, b, reduction="sum", ignore_index=-7, label_smoothing=0.25, z_loss_scale=0.5, softcap=2.0
    )
    assert isinstance(out, torch.Tensor)
    (args,) = _Recorder.calls
    assert args[:4] == (x, w, y, b) and args[4:] == (-7, 0.5, 0.25, "sum", 2.0), args[4:]
    with pytest.raises(ValueError, match="ce_weight"):
        liger.call_liger(info, None, x, w, y, class_weights=torch.ones(5))
    with pytest.raises(ValueError, match="accum_dtype"):
        liger.call_liger(info, torch.float32, x, w, y)
    support, notes = liger.declare(info, None, probe=False)
    assert "class_weights" not in support.options and not support.returns_z_loss
    assert {"bias", "softcap", "z_loss", "label_smoothing"} <= set(support.options)
    assert "class_weights: liger-kernel 0.3-like's forward has no ce_weight parameter" in notes, notes
    assert any(n.startswith("z_loss returned separately: ") and "return_z_loss" in n for n in notes), notes
    fp32 = liger.build_impl("liger[accum=fp32]", torch.float32, info)
    assert "liger-kernel 0.3-like's forward has no accum_dtype parameter" == fp32.support.unavailable_reason()


def test_release_without_reduction_declares_mean_only_with_reasons() -> None:
    """A release whose forward has no reduction (0.2.1: ``(_input, weight, target, bias, ignore_index)``)
    declares mean only, and every option and reduction it lacks is noted with the parameter it lacks."""

    def forward(ctx, _input, weight, target, bias=None, ignore_index=-100):
        raise AssertionError("not called")

    info = liger.LigerInfo(
        version="0.2.1",
        params=("_input", "weight", "target", "bias", "ignore_index"),
        defaults={"bias": None, "ignore_index": -100},
        function=None,
    )
    support, notes = liger.declare(info, None, probe=False)
    assert support.reductions == frozenset({"mean"}) and set(support.options) == {"bias", "ignore_index"}
    for feature, param in [
        ("class_weights", "ce_weight"),
        ("label_smoothing", "label_smoothing"),
        ("softcap", "softcap"),
        ("z_loss", "lse_square_scale"),
        ("reduction=sum", "reduction"),
        ("reduction=none", "reduction"),
    ]:
        assert any(n.startswith(f"{feature}: liger-kernel 0.2.1's forward has no {param} parameter") for n in notes), (
            feature,
            notes,
        )


def _fake_dist(root, version: str, files: list[str], *, init: bool) -> None:
    """A liger-kernel distribution installed under ``root``: its dist-info (RECORD listing ``files``) and files;
    ``init=False`` leaves out liger_kernel/__init__.py, as the 0.2.1 wheel does (a namespace package)."""
    info = root / f"liger_kernel-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: liger_kernel\nVersion: {version}\n")
    listed = files + (["liger_kernel/__init__.py"] if init else [])
    (info / "RECORD").write_text("".join(f"{f},,\n" for f in listed))
    for f in listed:
        (root / f).parent.mkdir(parents=True, exist_ok=True)
        (root / f).write_text("")


def test_version_is_the_imported_modules_release(tmp_path, monkeypatch) -> None:
    """With 0.2.1 (a namespace-package wheel) first on the path and 0.8.5 (a regular package) after it, 0.8.5's
    module is the one imported; the release read is the one whose files hold it (0.8.5), and the note names the
    shadowed 0.2.1; a module no distribution lists gives "unknown", naming both."""
    op = "liger_kernel/ops/fused_linear_cross_entropy.py"
    old, new = tmp_path / "old", tmp_path / "new"
    _fake_dist(old, "0.2.1", [op], init=False)
    _fake_dist(new, "0.8.5", [op], init=True)
    monkeypatch.syspath_prepend(str(new))
    monkeypatch.syspath_prepend(str(old))  # first on the path, as PYTHONPATH=<0.2.1 target> puts it
    from importlib import metadata

    assert metadata.version("liger-kernel") == "0.2.1"  # what metadata alone says
    version, note = liger.imported_release(new / op)
    assert version == "0.8.5" and note is not None and f"0.2.1 at {old.resolve()}" in note, (version, note)
    assert liger.imported_release(old / op)[0] == "0.2.1"
    stray = tmp_path / "src" / op
    stray.parent.mkdir(parents=True)
    stray.write_text("")
    version, note = liger.imported_release(stray)
    assert version == "unknown" and "0.2.1" in note and "0.8.5" in note, (version, note)


@pytest.mark.skipif(SKIP_REASON is not None, reason=f"{SKIP_REASON}")
def test_triton_imported_too_early_is_reported() -> None:
    """If triton was imported before TRITON_INTERPRET=1 (so the interpreter cannot run Liger), the adapters
    register as unavailable with a reason saying so, instead of failing inside every test."""
    if torch.cuda.is_available():
        pytest.skip("compiled Triton: the interpreter is not used")
    import os
    import subprocess
    import sys

    code = (
        "import triton, numcheck.impls.adapters.liger as L; impl = L.liger_impls()[0]; "
        "print('REASON:', impl.support.unavailable_reason())"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert "imported before TRITON_INTERPRET=1" in out.stdout, out.stdout + out.stderr


def test_absent_liger_registers_with_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without liger-kernel both variants still register, and requires() says "liger-kernel not installed"."""
    impls = impls_while_uninstalled(monkeypatch, "liger_kernel", liger.liger_impls, (liger.load,))
    assert [i.name for i in impls] == list(liger.VARIANTS)
    for impl in impls:
        assert impl.support.unavailable_reason() == "liger-kernel not installed"
        with pytest.raises(RuntimeError, match="not installed"):
            impl(torch.zeros(1, 1), torch.zeros(1, 1), torch.zeros(1, dtype=torch.long))
