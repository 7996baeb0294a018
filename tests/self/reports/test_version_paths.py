"""Version-dependent paths, exercised on every torch release CI runs.

Each capability that differs between the oldest supported torch (2.6) and the newest (2.13) is pinned
through :func:`impls.measure.capabilities.forced` — off, and on where an emulation of the missing behaviour exists —
so the path the old release takes also runs (and is judged against the oracle) on the new one, and the new
release's path is checked on the old one where it can be emulated:

- ``addmm_out_dtype``: off → the chunked impl's fp32-operand fallback must still meet the fp32-accumulation
  bound it declares; on → an emulated ``addmm(out_dtype=float32)`` (same dtype rules as torch's own op) runs
  the out_dtype call site on CPU, which otherwise only a CUDA device reaches.
- ``eager_fp8_cast_saturates``: off, with torch 2.6's non-saturating casts emulated (E4M3 overflow → NaN,
  E5M2 → inf) → every quantizer must still equal the oracle bitwise. The emulation is the oracle's own
  IEEE encoder; on a torch whose casts do not saturate it is checked against the real cast.
- ``float8_e8m0fnu`` absent (``dtype_exists``) → MXFP8 must run without that dtype.
- ``linear_cross_entropy`` off (or the function removed) → the ``torch_native`` impls are unavailable with
  a reason, never failures.
- ``autocast_dtype`` off → the strategies draw no autocast cases.

``scaled_mm`` forced off is covered by ``tests/suite/test_fp8_impls.py::test_emulated_gemms_match_native``.
Cost: about 4 s on one core (the quantizers under the emulated cast and the two chunked runs dominate).
The emulated addmm(out_dtype=) was checked against the real op on an H200 (torch 2.11): same accepted
dtype combinations, values within fp32 summation-order rounding (``test_addmm_emulation_matches_the_real_op``).
"""

from __future__ import annotations

import contextlib
import re
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from numcheck.impls.builtin import grad_accum
from numcheck.impls.measure import capabilities
from numcheck.impls.registry import builtin_impls
from numcheck.properties.core.failures import fail
from numcheck.properties.fp8 import props as fp8_checks
from numcheck.properties.fp8.cases import Fp8Case, declared_mode
from numcheck.properties.linear_ce.accuracy import check_accuracy
from numcheck.properties.linear_ce.cases import Problem, build
from numcheck.properties.linear_ce.harness import run_impl
from numcheck.properties.linear_ce.strategies import problems
from numcheck.reference.fp8_formats import E4M3, E5M2, all_codes, decode_fp8, encode_fp8, same_codes

pytestmark = pytest.mark.torch_versions(
    reason="the paths the capability probes switch, each forced off and on with its emulation"
)

REPO = Path(__file__).resolve().parents[3]
LOWP = (torch.bfloat16, torch.float16)
FP8_FORMATS = {"float8_e4m3fn": E4M3, "float8_e5m2": E5M2}


def _builtin(name: str) -> Any:
    for e in builtin_impls():
        if e.name == name:
            return e.impl
    raise LookupError(f"built-in {name!r} not registered")


# -- emulations of the capabilities one release lacks -----------------------------------------------------
class AddmmOutDtypeEmulation:
    """``torch.addmm`` with the ``out_dtype`` keyword (torch >= 2.8 on CUDA) on any device and release.

    The dtype rules are torch's: ``mat1`` and ``mat2`` of one dtype; ``out_dtype`` float32 with float16 /
    bfloat16 operands, or the operands' own dtype; ``out``, when given, of dtype ``out_dtype``. The value is
    ``beta·input + alpha·(mat1·mat2)`` with the products of the low-precision operands formed exactly and summed
    in fp32 (what the CUDA kernel computes, up to summation order). Calls without ``out_dtype`` go to the
    real op. ``calls`` counts the emulated ones.
    """

    def __init__(self, real: Callable[..., torch.Tensor]) -> None:
        self.real = real
        self.calls = 0

    def __call__(
        self,
        input: torch.Tensor,
        mat1: torch.Tensor,
        mat2: torch.Tensor,
        *args: Any,
        out_dtype: torch.dtype | None = None,
        beta: float = 1,
        alpha: float = 1,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if out_dtype is None:
            kw = {"out": out} if out is not None else {}
            return self.real(input, mat1, mat2, *args, beta=beta, alpha=alpha, **kw)
        if args:
            raise TypeError(f"addmm(out_dtype=...) emulation: unexpected positional arguments {args!r}")
        if mat1.dtype != mat2.dtype:
            raise RuntimeError(f"expected mat1 and mat2 to have the same dtype, but got: {mat1.dtype} != {mat2.dtype}")
        if not (out_dtype == mat1.dtype or (mat1.dtype in LOWP and out_dtype == torch.float32)):
            raise RuntimeError(
                "out_dtype only supported for torch.float32 output with float16/bfloat16 inputs "
                f"or same as input dtypes (got {mat1.dtype} -> {out_dtype})"
            )
        if out is not None and out.dtype != out_dtype:
            raise RuntimeError(f"out has dtype {out.dtype}, expected out_dtype {out_dtype}")
        self.calls += 1
        acc = input.to(out_dtype)  # no copy when input already is the fp32 accumulator (out=input)
        kw = {"out": out} if out is not None else {}
        return self.real(acc, mat1.to(out_dtype), mat2.to(out_dtype), beta=beta, alpha=alpha, **kw)


def emulated_fp8_cast(src: torch.Tensor, fp8_dtype: torch.dtype) -> torch.Tensor:
    """The codes a non-saturating eager cast gives: IEEE round-to-nearest-even, overflow (and ±inf) → NaN for
    E4M3 (no inf in ``e4m3fn``), ±inf for E5M2 — torch 2.6's ``.to(float8)``. ``uint8`` on ``src``'s device."""
    fmt = FP8_FORMATS[str(fp8_dtype).replace("torch.", "")]
    return encode_fp8(src.detach().to("cpu", torch.float64), fmt, saturate=False).to(src.device)


class _NonSaturatingFp8Casts(TorchDispatchMode):
    """Every float → FP8 conversion (``_to_copy``, ``copy_``) gets :func:`emulated_fp8_cast`'s codes; any other
    op turning a non-FP8 float tensor into FP8 values is an error, so no conversion escapes the emulation."""

    _FP8 = tuple(getattr(torch, n) for n in FP8_FORMATS)
    _NO_VALUES = {"empty_like", "empty_strided", "new_empty", "new_empty_strided", "empty"}

    def __init__(self) -> None:
        super().__init__()
        self.conversions = 0  # float -> FP8 conversions emulated

    def _emulate(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        codes = emulated_fp8_cast(src, dst.dtype)
        self.conversions += 1
        dst.view(torch.uint8).copy_(codes.reshape(dst.shape))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: D105
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor) and t.dtype in self._FP8]
        if not outs:
            return out
        floats = [
            t
            for t in tree_flatten((args, kwargs))[0]
            if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype not in self._FP8
        ]
        if not floats:
            return out
        name = func.overloadpacket.__name__
        if name == "_to_copy" and len(outs) == 1:
            self._emulate(args[0], outs[0])
        elif name == "copy_":
            self._emulate(args[1].expand_as(args[0]), args[0])
        elif name not in self._NO_VALUES:
            raise RuntimeError(
                f"{func} turns a {floats[0].dtype} tensor into FP8 outside _to_copy/copy_: the "
                "non-saturating cast emulation does not cover it"
            )
        return out


@contextlib.contextmanager
def nonsaturating_fp8_casts() -> Iterator[_NonSaturatingFp8Casts]:
    """Run as torch 2.6 does: eager FP8 casts do not saturate, and the probe says so."""
    mode = _NonSaturatingFp8Casts()
    with capabilities.forced(eager_fp8_cast_saturates=False), mode:
        yield mode


@contextlib.contextmanager
def without_attribute(monkeypatch: pytest.MonkeyPatch, obj: Any, name: str, probe: Any) -> Iterator[None]:
    """``obj.<name>`` removed (as in a release that lacks it), with ``probe``'s cache cleared on the way in and
    out so it re-probes the world it is in."""
    probe.cache_clear()
    with monkeypatch.context() as m:
        m.delattr(obj, name, raising=False)
        try:
            yield
        finally:
            probe.cache_clear()
    probe.cache_clear()


# -- addmm(out_dtype) -------------------------------------------------------------------------------------
#: bf16 operands over 16 chunks of 4 rows: per-chunk bf16 rounding of the grad_weight product (the
#: ``fallback`` path) is ~2^-9 relative per chunk, far above the fp32-accumulation bound ``chunked[addmm_out_dtype]``
#: declares, so a fallback that lost fp32 accumulation fails here. The AMP case has fp32 x against bf16 G:
#: both operands must be aligned to bf16 first (as the out_dtype call needs), and the bound assumes they were.
ADDMM_CASES = [
    Problem(N=64, H=24, V=40, dtype="bfloat16", bias=True, seed=21),
    Problem(N=64, H=24, V=40, autocast="bfloat16", ignored=0.1, seed=22),
]
CHUNK_ROWS = 4


@pytest.mark.parametrize("p", ADDMM_CASES, ids=lambda p: p.short())
def test_addmm_out_dtype_off_and_on_agree_and_meet_the_oracle(p: Problem, monkeypatch: pytest.MonkeyPatch) -> None:
    """chunked[addmm_out_dtype] with the probe forced off (fp32-operand fallback) and forced on (the out_dtype
    call, emulated) gives bitwise the same outputs — both sum exact products in fp32 with the same CPU kernel —
    and each meets the oracle within the fp32-accumulation bound it declares."""
    impl = _builtin("chunked[addmm_out_dtype]").with_chunk_rows(CHUNK_ROWS)
    assert impl.support.grad_accumulation == "fp32"
    t = build(p)
    outs = {}
    for on in (False, True):
        emu = AddmmOutDtypeEmulation(torch.addmm)
        with monkeypatch.context() as m, capabilities.forced(addmm_out_dtype=on):
            m.setattr(torch, "addmm", emu)
            runs_as = grad_accum.resolved_path("addmm_out_dtype", p.device, p.compute_dtype)
            assert runs_as == ("addmm_out_dtype" if on else "fp32_operands"), (
                f"probe forced {on}: path runs as {runs_as!r}"
            )
            outs[on] = run_impl(impl, p, t)
            res = check_accuracy(impl, p, t=t, relative=False)
        chunks = -(-p.N // CHUNK_ROWS)
        want = chunks * (2 if p.bias else 1) if on else 0
        assert (emu.calls >= want) if on else emu.calls == 0, (
            f"probe forced {on}: {emu.calls} addmm(out_dtype=) calls on {p.short()}, expected "
            f"{'at least ' + str(want) if on else 'none'} ({chunks} chunks, bias={p.bias})"
        )
        if not res.ok:
            fail(
                impl, f"accuracy (addmm_out_dtype forced {'on, op emulated' if on else 'off'})", p, *res.failure_lines()
            )
    for name in ("loss", "grad_x", "grad_weight", "grad_bias"):
        a, b = getattr(outs[False], name), getattr(outs[True], name)
        if a is None and b is None:
            continue
        assert a is not None and b is not None and torch.equal(a, b), (
            f"chunked[addmm_out_dtype] {name} on {p.short()}: fallback (probe off) and out_dtype call (probe on) differ"
            + (
                ""
                if a is None or b is None
                else f" by up to {float((a.double() - b.double()).abs().max()):.3g} "
                f"at {[int(i) for i in (a != b).nonzero()[0]]}"
            )
            + f"; repro: pytest tests/self/reports/test_version_paths.py -k 'off_and_on and {p.seed}'"
        )


@pytest.mark.parametrize(
    "mats,out_dtype",
    [
        ((torch.bfloat16, torch.bfloat16), torch.float32),
        ((torch.float16, torch.float16), torch.float32),
        ((torch.bfloat16, torch.float32), torch.float32),
        ((torch.bfloat16, torch.bfloat16), torch.float16),
    ],
    ids=str,
)
def test_addmm_emulation_matches_the_real_op(mats: tuple[torch.dtype, torch.dtype], out_dtype: torch.dtype) -> None:
    """Where addmm(out_dtype=) really runs (CUDA, torch >= 2.8), the emulation accepts exactly the dtype
    combinations the op accepts and gives its values to within fp32 summation-order rounding."""
    if not (torch.cuda.is_available() and capabilities.addmm_out_dtype("cuda", torch.bfloat16)):
        pytest.skip("addmm(out_dtype=) does not run on any device here (CUDA with torch >= 2.8 needed)")
    g = torch.Generator().manual_seed(3)
    K = 64
    acc0 = torch.randn(8, 16, generator=g).to(out_dtype)
    a = torch.randn(8, K, generator=g).to(mats[0])
    b = torch.randn(K, 16, generator=g).to(mats[1])
    results = []
    for fn in (torch.addmm, AddmmOutDtypeEmulation(torch.addmm)):
        try:
            results.append(fn(acc0.cuda(), a.cuda(), b.cuda(), out_dtype=out_dtype).cpu())
        except RuntimeError:
            results.append(None)
    real, emu = results
    assert (real is None) == (emu is None), (
        f"addmm({mats}, out_dtype={out_dtype}): real op raised={real is None}, emulation raised={emu is None}"
    )
    if real is not None:
        # Both sum exact products in fp32: |difference| <= 2·K·u32·(|acc| + Σ|a||b|) per element.
        mag = acc0.double().abs() + a.double().abs() @ b.double().abs()
        bound = 2 * (K + 1) * 2.0**-24 * mag
        err = (real.double() - emu.double()).abs()
        assert real.dtype == emu.dtype and bool((err <= bound).all()), (
            f"addmm({mats}, out_dtype={out_dtype}): emulation differs from the op by {float(err.max()):.3g} "
            f"(bound {float(bound.flatten()[int(err.argmax())]):.3g} there), dtypes {real.dtype} / {emu.dtype}"
        )


# -- eager FP8 casts that do not saturate -----------------------------------------------------------------
def _cast_sweep(fmt) -> torch.Tensor:
    """fp32 values that exercise a cast: every finite FP8 value and every midpoint (ties), the overflow
    threshold's neighbourhood, ±inf, NaN, signed zeros, subnormals and random values over 60 binades."""
    v = decode_fp8(all_codes(), fmt)
    v = v[torch.isfinite(v)].sort().values
    mids = (v[:-1] + v[1:]) / 2
    top = fmt.max_finite
    edge = torch.tensor([top * (1 + 2.0**-k) for k in range(2, 24)] + [top * 1.0625, top * 2, 3.0e38])
    g = torch.Generator().manual_seed(0)
    rnd = torch.randn(4096, generator=g, dtype=torch.float64) * torch.exp2(
        torch.randint(-30, 30, (4096,), generator=g).double()
    )
    special = torch.tensor([float("inf"), float("nan"), 0.0, 2.0**-149, 2.0**-20])
    x = torch.cat([v, mids, edge, rnd, special])
    return torch.cat([x, -x]).to(torch.float32)


@pytest.mark.parametrize("name", sorted(FP8_FORMATS))
def test_nonsaturating_cast_emulation_is_torch_26s_cast(name: str) -> None:
    """The emulated non-saturating cast gives exactly the codes of a real cast that does not saturate (on a
    torch where the probe says casts do not saturate), and differs from a saturating one on overflow."""
    dt, fmt = getattr(torch, name), FP8_FORMATS[name]
    x = _cast_sweep(fmt)
    for src in (x, x.to(torch.bfloat16), x.to(torch.float16)):
        emu = emulated_fp8_cast(src, dt)
        real = src.to(dt).view(torch.uint8)
        ok = same_codes(real, emu, fmt)
        if not capabilities.eager_fp8_cast_saturates("cpu", name):
            bad = (~ok).nonzero().flatten()
            assert bool(ok.all()), (
                f"{name} from {src.dtype}: emulated cast differs from torch {torch.__version__}'s "
                f"non-saturating cast at {bad.numel()} values, first {src[bad[:4]].tolist()}: real "
                f"{[hex(int(c)) for c in real[bad[:4]]]}, emulated {[hex(int(c)) for c in emu[bad[:4]]]}"
            )
        else:
            # A saturating cast agrees except on finite values that overflow: there it gives ±max, the emulation
            # NaN/inf. (±inf and NaN inputs give NaN/inf codes in both.)
            over = torch.isfinite(src) & ~torch.isfinite(decode_fp8(emu, fmt))
            assert bool(over.any()), f"{name}: the sweep has no overflowing value"
            assert bool(ok[~over & torch.isfinite(src)].all()), (
                f"{name} from {src.dtype}: emulation differs from the real cast on values that do not overflow"
            )
            assert not bool(ok[over].any()) and bool((decode_fp8(real[over], fmt).abs() == fmt.max_finite).all()), (
                f"{name} from {src.dtype}: on overflow the real cast should give ±max and the emulation NaN/inf"
            )


def _overflowing(recipe, dtype: torch.dtype) -> tuple[torch.Tensor, float]:
    """A tensor holding every value of both FP8 formats (±inf and NaN among them) and, for delayed recipes,
    a stored scale of 2^20: the scaled values overflow every format (for per-tensor and blockwise current
    scaling the ±inf make amax infinite, so the scale is 1 and the E5M2 values overflow E4M3)."""
    vals = torch.cat([decode_fp8(all_codes(), E4M3), decode_fp8(all_codes(), E5M2)])
    return vals.reshape(16, 32).to(dtype), 2.0**20 if recipe.kind == "delayed" else 1.0


def test_quantizers_exact_without_saturating_casts(fp8_linear_impl) -> None:
    """With eager FP8 casts emulated as non-saturating (torch 2.6) and the probe off, every recipe's quantizer
    still equals the oracle bitwise on overflowing inputs, and a quantized linear stays within bounds."""
    if not fp8_linear_impl.support.exposes_quantize:
        pytest.skip(f"{fp8_linear_impl.name} exposes no quantize()")
    for recipe in fp8_linear_impl.support.recipes:
        dtype = (
            torch.float32
            if torch.float32 in fp8_linear_impl.support.dtypes
            else sorted(fp8_linear_impl.support.dtypes, key=str)[0]
        )
        t, scale = _overflowing(recipe, dtype)
        with nonsaturating_fp8_casts() as mode:
            fp8_checks.quantizer(
                fp8_linear_impl, recipe, t, delayed_scale=scale, label="overflowing, non-saturating casts"
            )
            fp8_checks.accuracy(
                fp8_linear_impl,
                Fp8Case(
                    recipe,
                    32,
                    64,
                    48,
                    dtype=str(dtype).replace("torch.", ""),
                    regime="outlier",
                    seed=3,
                    steps=2 if recipe.kind == "delayed" else 1,
                    save_original_input=declared_mode(fp8_linear_impl.support),
                ),
            )
        assert mode.conversions > 0, (
            f"{fp8_linear_impl.name} {recipe.name}: no float -> FP8 cast went through the emulation"
        )


# -- float8_e8m0fnu absent (torch 2.6) ---------------------------------------------------------------------
def test_mxfp8_without_e8m0_dtype(monkeypatch: pytest.MonkeyPatch) -> None:
    """With torch.float8_e8m0fnu removed, dtype_exists says so, the capability summary still builds, and every
    MXFP8 recipe of every built-in quant impl still quantizes bitwise like the oracle and stays within bounds."""
    # numcheck's own emulations that run here, the ones exposing their quantizer: a third party's MXFP8 linear
    # (torchao's, judged where it runs) needs float8_e8m0fnu itself, and its quantizer is not exposed
    impls = [
        e.impl
        for e in builtin_impls()
        if e.kind == "fp8-linear" and e.impl.support.unavailable_reason() is None and e.impl.support.exposes_quantize
    ]
    mx = [(i, r) for i in impls for r in i.support.recipes if r.scale_is_e8m0]
    assert mx, "no built-in declares an MXFP8 recipe"
    with without_attribute(monkeypatch, torch, "float8_e8m0fnu", capabilities.dtype_exists):
        assert capabilities.dtype_exists("float8_e8m0fnu") is False
        assert capabilities.dtype_exists("float8_e4m3fn") is True
        summary = capabilities.summary("cpu")
        assert summary["dtype_exists[float8_e8m0fnu]"] is False and "fp8_dtype[float8_e8m0fnu]" not in summary
        g = torch.Generator().manual_seed(5)
        t = torch.randn(32, 96, generator=g) * torch.exp2(torch.randint(-12, 12, (32, 96), generator=g).float())
        for impl, recipe in mx:
            fp8_checks.quantizer(impl, recipe, t, label="random, no float8_e8m0fnu")
            fp8_checks.accuracy(impl, Fp8Case(recipe, 32, 64, 48, seed=6))


# -- F.linear_cross_entropy absent (before 2.13) ------------------------------------------------------------
def _torch_native() -> list[Any]:
    return [e.impl for e in builtin_impls() if e.name.startswith("torch_native[")]


def test_torch_native_unavailable_when_probe_off() -> None:
    """With linear_cross_entropy forced off, every torch_native impl is still registered and says why it is
    unavailable (so the suite skips it with that reason instead of failing)."""
    natives = _torch_native()
    assert natives, "no torch_native built-ins registered"
    with capabilities.forced(linear_cross_entropy=False):
        for impl in natives:
            reason = impl.support.unavailable_reason()
            assert reason and "linear_cross_entropy" in reason, f"{impl.name}: unavailable_reason() = {reason!r}"


def test_torch_native_unavailable_without_the_function(monkeypatch: pytest.MonkeyPatch) -> None:
    """With F.linear_cross_entropy removed (as before torch 2.13), the probe finds it absent and every
    torch_native impl reports itself unavailable; after, the probe answers as before."""
    before = capabilities.linear_cross_entropy("cpu")
    with without_attribute(monkeypatch, F, "linear_cross_entropy", capabilities.linear_cross_entropy):
        assert capabilities.linear_cross_entropy("cpu") is False
        for impl in _torch_native():
            assert impl.support.unavailable_reason(), f"{impl.name} claims to run without F.linear_cross_entropy"
    assert capabilities.linear_cross_entropy("cpu") == before


# -- autocast ------------------------------------------------------------------------------------------------
@settings(max_examples=20)
@given(data=st.data())
def test_no_autocast_cases_when_probe_off(data: st.DataObject) -> None:
    """With autocast_dtype forced off, the problem strategy draws no autocast case even for an impl that
    declares autocast support; forced on, autocast cases are drawn."""
    impl = _builtin("chunked[fp32_operands]")
    assert impl.support.autocast, "chunked[fp32_operands] declares no autocast dtype"
    with capabilities.forced(autocast_dtype=False):
        p = data.draw(problems(impl.support, "cpu"), label="probe off")
        assert p.autocast is None, f"autocast case drawn with the probe off: {p.short()}"


def test_autocast_cases_drawn_when_probe_on() -> None:
    """With autocast_dtype forced on, the strategy does draw autocast cases (so the test above can fail)."""
    from hypothesis import find

    impl = _builtin("chunked[fp32_operands]")
    with capabilities.forced(autocast_dtype=True):
        p = find(problems(impl.support, "cpu"), lambda q: q.autocast is not None, settings=settings(max_examples=200))
    assert p.autocast in ("bfloat16", "float16")


# -- the supported floor -------------------------------------------------------------------------------------
def test_torch_floor_is_the_release_ci_tests() -> None:
    """pyproject's torch floor is the oldest release .ci/run tests (so the floor is one that was tested)."""
    pyproject = (REPO / "pyproject.toml").read_text()
    ci = REPO / ".ci" / "run"
    if not ci.exists():
        pytest.skip("no .ci/run in this checkout")
    floor = re.search(r'"torch>=([0-9.]+)"', pyproject)
    oldest = re.search(r"^TORCH_OLDEST=([0-9.]+)", ci.read_text(), re.M)
    assert floor and oldest, 'pyproject.toml needs a "torch>=X" dependency and .ci/run a TORCH_OLDEST=X line'

    def release(v: str) -> tuple[int, ...]:
        parts = [int(x) for x in v.split(".")]
        while parts and parts[-1] == 0:
            parts.pop()
        return tuple(parts)

    assert release(floor.group(1)) == release(oldest.group(1)), (
        f"pyproject.toml says torch>={floor.group(1)} but CI tests {oldest.group(1)} as the oldest release"
    )
