"""Capability probes agree with reality on this machine, ignore version strings, cache, and can be forced.

Each "reality" below is an independent attempt at the operation (other shapes, other values), so a probe that
drifted from what it claims to test would disagree. Cost: well under a second.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from numcheck.impls.builtin import grad_accum
from numcheck.impls.measure import capabilities as cap

pytestmark = pytest.mark.torch_versions(
    reason="the capability probes: what they answer is what differs between torch releases"
)

LOWP = (torch.bfloat16, torch.float16)


def _addmm_out_dtype_works(device: str, dtype: torch.dtype) -> bool:
    acc = torch.full((3, 5), 0.5, dtype=torch.float32, device=device)
    a = torch.full((3, 4), 2.0, dtype=dtype, device=device)
    b = torch.full((4, 5), 0.25, dtype=dtype, device=device)
    try:
        torch.addmm(acc, a, b, out_dtype=torch.float32, out=acc)
    except (RuntimeError, NotImplementedError, TypeError):
        return False
    return bool((acc == 2.5).all())


def _version() -> tuple[int, int]:
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    return int(major), int(minor)


@pytest.mark.parametrize("dtype", LOWP, ids=str)
def test_addmm_out_dtype_matches_reality_on_cpu(dtype: torch.dtype) -> None:
    """The CPU addmm(out_dtype=fp32) probe says exactly whether the op works, whatever the torch version."""
    real = _addmm_out_dtype_works("cpu", dtype)
    got = cap.addmm_out_dtype("cpu", dtype)
    assert got == real, (
        f"addmm_out_dtype('cpu', {dtype}) probe says {got}, a direct attempt says {real} "
        f"(torch {torch.__version__}, version >= 2.8: {_version() >= (2, 8)})"
    )


def test_addmm_out_dtype_ignores_version_string(monkeypatch: pytest.MonkeyPatch) -> None:
    """Changing torch.__version__ does not change the probe's answer (it tries the op, it does not compare
    versions): on CPU with torch >= 2.8 it stays False where the op raises."""
    real = _addmm_out_dtype_works("cpu", torch.bfloat16)
    for fake in ("2.1.0", "99.0.0"):
        cap.addmm_out_dtype.cache_clear()
        monkeypatch.setattr(torch, "__version__", fake)
        assert cap.addmm_out_dtype("cpu", torch.bfloat16) == real, f"probe changed with torch.__version__={fake}"
    monkeypatch.undo()
    cap.addmm_out_dtype.cache_clear()


def test_probe_caches(monkeypatch: pytest.MonkeyPatch) -> None:
    """A probe runs its operation once per arguments, then answers from the cache."""
    calls = []
    real_addmm = torch.addmm

    def counting(*a, **k):
        calls.append(1)
        return real_addmm(*a, **k)

    cap.addmm_out_dtype.cache_clear()
    monkeypatch.setattr(torch, "addmm", counting)
    first = cap.addmm_out_dtype("cpu", torch.float16)
    second = cap.addmm_out_dtype("cpu", torch.float16)
    monkeypatch.undo()
    cap.addmm_out_dtype.cache_clear()
    assert first == second and len(calls) == 1, f"addmm ran {len(calls)} times for two probe calls"


def test_forced_overrides_and_restores() -> None:
    """forced(...) pins a probe inside the block, nests, and restores the measured answer after; an unknown
    probe name is a ValueError naming it."""
    real = cap.addmm_out_dtype("cpu", torch.bfloat16)
    with cap.forced(addmm_out_dtype=not real):
        assert cap.addmm_out_dtype("cpu", torch.bfloat16) is (not real)
        with cap.forced(addmm_out_dtype=real):
            assert cap.addmm_out_dtype("cpu", torch.bfloat16) is real
        assert cap.addmm_out_dtype("cpu", torch.bfloat16) is (not real)
    assert cap.addmm_out_dtype("cpu", torch.bfloat16) is real
    with pytest.raises(ValueError, match="no_such_probe"):
        with cap.forced(no_such_probe=True):
            pass


def test_paths_follow_the_probe() -> None:
    """The grad_weight addmm_out_dtype path runs as named exactly when the probe says yes (forced either way)."""
    with cap.forced(addmm_out_dtype=True):
        assert grad_accum.resolved_path("addmm_out_dtype", "cpu", torch.bfloat16) == "addmm_out_dtype"
    with cap.forced(addmm_out_dtype=False):
        assert grad_accum.resolved_path("addmm_out_dtype", "cpu", torch.bfloat16) == "fp32_operands"


@pytest.mark.parametrize("dtype", LOWP, ids=str)
def test_addmm_out_dtype_meta_matches_reality(dtype: torch.dtype) -> None:
    """addmm_out_dtype_meta says whether addmm(out_dtype=fp32, out=) traces on meta to an fp32 result of the
    right shape (another shape here than the probe's)."""
    acc = torch.empty(7, 4, device="meta")
    try:
        out = torch.addmm(
            acc,
            torch.empty(7, 9, dtype=dtype, device="meta"),
            torch.empty(9, 4, dtype=dtype, device="meta"),
            out_dtype=torch.float32,
            out=acc,
        )
        real = out.dtype == torch.float32 and tuple(out.shape) == (7, 4)
    except (RuntimeError, NotImplementedError, TypeError):
        real = False
    assert cap.addmm_out_dtype_meta(dtype) == real


def test_meta_device_answers_no() -> None:
    """On meta (no values to check) the addmm probe answers False, which is why memory accounting forces it."""
    assert cap.addmm_out_dtype("meta", torch.bfloat16) is False


@pytest.mark.parametrize("name", ["float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu", "float8_e4m3fnuz", "float8_bogus"])
def test_dtype_exists_matches_reality(name: str) -> None:
    """dtype_exists(name) is True exactly when torch.<name> is a dtype."""
    assert cap.dtype_exists(name) == isinstance(getattr(torch, name, None), torch.dtype)


@pytest.mark.parametrize("name", ["float8_e4m3fn", "float8_e5m2"])
def test_fp8_probes_match_reality(name: str) -> None:
    """fp8_dtype and eager_fp8_cast_saturates agree with a direct round trip and a direct overflowing cast."""
    if not cap.dtype_exists(name):
        pytest.skip(f"torch.{name} absent")
    dt = getattr(torch, name)
    vals = torch.tensor([0.25, -3.0, 1.5, 0.0])
    try:
        real = bool(torch.equal(vals.to(dt).to(torch.float32), vals))
    except (RuntimeError, TypeError):
        real = False
    assert cap.fp8_dtype("cpu", name) == real
    fmax = torch.finfo(dt).max
    over = torch.tensor([fmax * 1.5, -fmax * 3.0]).to(dt).to(torch.float32)
    real_sat = bool(torch.equal(over, torch.tensor([fmax, -fmax])))
    assert cap.eager_fp8_cast_saturates("cpu", name) == real_sat, f"{name}: overflowing cast gave {over.tolist()}"


@pytest.mark.parametrize("dtype", LOWP, ids=str)
def test_autocast_probe_matches_reality(dtype: torch.dtype) -> None:
    """autocast_dtype('cpu', dtype) says whether F.linear under torch.autocast('cpu', dtype) yields dtype."""
    try:
        with torch.autocast("cpu", dtype=dtype):
            real = F.linear(torch.randn(3, 5), torch.randn(2, 5)).dtype == dtype
    except RuntimeError:
        real = False
    assert cap.autocast_dtype("cpu", dtype) == real


@pytest.mark.parametrize("mode", ["tensorwise", "rowwise"])
def test_scaled_mm_probe_matches_reality(mode: str) -> None:
    """scaled_mm('cpu', mode) agrees with a direct E4M3 _scaled_mm of small integers under that scaling."""
    e4 = torch.float8_e4m3fn
    M, K, N = 16, 32, 16
    a = torch.full((M, K), 2.0).to(e4)
    b = torch.full((N, K), 1.0).to(e4).t()
    if mode == "tensorwise":
        sa = sb = torch.tensor(0.5)
    else:
        sa, sb = torch.full((M, 1), 0.5), torch.full((1, N), 2.0)
    try:
        out = torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.float32)
        real = bool((out == 2.0 * K * float(sa.flatten()[0]) * float(sb.flatten()[0])).all())
    except (RuntimeError, NotImplementedError):
        real = False
    assert cap.scaled_mm("cpu", mode) == real


def test_linear_cross_entropy_probe_matches_reality() -> None:
    """linear_cross_entropy('cpu') is True exactly when F.linear_cross_entropy exists and equals linear+CE."""
    fn = getattr(F, "linear_cross_entropy", None)
    if fn is None:
        real = False
    else:
        x, w, y = torch.randn(4, 3), torch.randn(5, 3), torch.tensor([0, 4, 2, 1])
        real = bool(torch.allclose(fn(x, w, y), F.cross_entropy(F.linear(x, w), y)))
    assert cap.linear_cross_entropy("cpu") == real
