"""The split fp32 accumulator (impls/builtin/split_accum.py): exact fp32 sums, one round-to-nearest-even at the end,
the memory it saves, and clear errors.

Exactness: with integer-valued bf16 operands every product and every partial sum below 2²⁴ is exact in fp32,
whatever the summation order, so the accumulator must equal the float64 sum bit for bit — and such sums need
more than bf16's 8 significant bits, so the lower half carries information. With random operands the
accumulator must stay within fp32 accumulation's bound γ_{KC}·Σ|G|ᵀ|x| (tests/self/impls/test_grad_accum.py derives it)
and must beat a bf16 running sum by orders of magnitude.
"""

from __future__ import annotations

import pytest
import torch

from numcheck.impls.builtin import grad_accum, split_accum
from numcheck.impls.measure import memory
from numcheck.reference.numerics import accumulation

pytestmark = pytest.mark.skipif(
    split_accum.unavailable_reason() is not None,
    reason=f"Triton kernels unavailable: {split_accum.unavailable_reason()}",
)
DEVICE = "cpu" if split_accum.INTERPRET else "cuda"
U32 = 2.0**-24


def _bits_to_f32(hi: torch.Tensor, lo: torch.Tensor) -> torch.Tensor:
    return ((hi.to(torch.int32) << 16) | (lo.to(torch.int32) & 0xFFFF)).view(torch.float32)


@pytest.mark.parametrize("shape", [(48, 24, 16, 6), (70, 33, 37, 3), (5, 130, 64, 2)], ids=str)
def test_integer_sums_are_exact(shape: tuple[int, int, int, int]) -> None:
    """Integer-valued bf16 chunks: the accumulated value equals the float64 sum exactly (lower half in use)."""
    V, H, C, K = shape
    g = torch.Generator().manual_seed(V * H)
    acc = split_accum.SplitAccumulator((V, H), DEVICE)
    exact = torch.zeros(V, H, dtype=torch.float64)
    for _ in range(K):
        G = torch.randint(-200, 201, (C, V), generator=g).to(torch.bfloat16)
        x = torch.randint(-200, 201, (C, H), generator=g).to(torch.bfloat16)
        G = torch.where(G.abs() > 128, (G / 4).round() * 4, G)  # keep every value exactly representable
        x = torch.where(x.abs() > 128, (x / 4).round() * 4, x)
        acc.add_(G.to(DEVICE), x.to(DEVICE))
        exact += G.double().T @ x.double()
    assert exact.abs().max() < 2**24
    got = acc.value().cpu().double()
    lo_used = int((acc.lo != 0).sum())
    assert lo_used > 0, "test data did not exercise the lower half"
    diff = (got - exact).abs()
    assert torch.equal(got, exact), (
        f"split accumulator differs from the exact integer sum by {diff.max():g} at "
        f"{divmod(int(diff.argmax()), H)}; repro: pytest tests/self/impls/test_split_accum.py -k integer"
    )


@pytest.mark.parametrize("kernel", ["tma", "pointer"])
def test_each_kernel_sums_integers_exactly(kernel: str) -> None:
    """Each GEMM kernel (TMA descriptors, pointers), asked for by name on a shape both take (16-byte rows, edge
    tiles and a K tail), gives the exact integer sum bit for bit."""
    # past one compiled tile (128 × 256) on CUDA, with edge tiles; a few interpreter tiles on CPU
    V, H, C, K = (264, 520, 72, 3) if DEVICE == "cuda" else (72, 40, 24, 3)
    probe = split_accum.SplitAccumulator((V, H), DEVICE)
    if kernel == "tma" and not probe.tma_eligible(
        torch.zeros(C, V, dtype=torch.bfloat16, device=DEVICE), torch.zeros(C, H, dtype=torch.bfloat16, device=DEVICE)
    ):
        pytest.skip("no tensor descriptors here (Triton without them, or a device without TMA)")
    g = torch.Generator().manual_seed(11)
    exact = torch.zeros(V, H, dtype=torch.float64)
    for _ in range(K):
        G = torch.randint(-128, 129, (C, V), generator=g).to(torch.bfloat16)
        x = torch.randint(-128, 129, (C, H), generator=g).to(torch.bfloat16)
        probe.add_(G.to(DEVICE), x.to(DEVICE), kernel=kernel)
        exact += G.double().T @ x.double()
    assert int((probe.lo != 0).sum()) > 0, "test data did not exercise the lower half"
    got = probe.value().cpu().double()
    assert torch.equal(got, exact), (
        f"kernel {kernel!r}: differs from the exact integer sum by "
        f"{(got - exact).abs().max():g}; repro: pytest tests/self/impls/test_split_accum.py -k {kernel}"
    )


def test_tma_kernel_refuses_unaligned_rows() -> None:
    """Asking for the TMA kernel where a row is not 16-byte aligned (H=33 bf16) is a clear error, not a wrong sum."""
    acc = split_accum.SplitAccumulator((8, 33), DEVICE)
    G = torch.ones(4, 8, dtype=torch.bfloat16, device=DEVICE)
    x = torch.ones(4, 33, dtype=torch.bfloat16, device=DEVICE)
    with pytest.raises(ValueError, match="kernel='tma' needs"):
        acc.add_(G, x, kernel="tma")
    with pytest.raises(ValueError, match="kernel must be one of"):
        acc.add_(G, x, kernel="cublas")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_random_sums_within_fp32_bound(dtype: torch.dtype) -> None:
    """Random chunks: |acc − exact| ≤ γ_{KC}·Σ|G|ᵀ|x| (fp32 accumulation), ≥ 100× better than a bf16 running sum."""
    V, H, C, K = 40, 24, 16, 32
    g = torch.Generator().manual_seed(7)
    acc = split_accum.SplitAccumulator((V, H), DEVICE)
    lowp = torch.zeros(V, H, dtype=torch.bfloat16)
    exact = torch.zeros(V, H, dtype=torch.float64)
    A = torch.zeros(V, H, dtype=torch.float64)
    for _ in range(K):
        G = torch.randn(C, V, generator=g).to(dtype)
        x = torch.randn(C, H, generator=g).to(dtype)
        acc.add_(G.to(DEVICE), x.to(DEVICE))
        torch.addmm(lowp, G.t().bfloat16(), x.bfloat16(), out=lowp)
        exact += G.double().T @ x.double()
        A += G.double().abs().T @ x.double().abs()
    n = K * C
    bound = n * U32 / (1 - n * U32) * A
    got = acc.value().cpu().double()
    ratio = ((got - exact).abs() / bound).max()
    assert ratio <= 1, (
        f"{dtype}: error/bound {float(ratio):.3g}; repro: pytest tests/self/impls/test_split_accum.py -k random"
    )
    rel = float((got - exact).norm() / exact.norm())
    rel_lowp = float((lowp.double() - exact).norm() / exact.norm())
    assert rel * 100 < rel_lowp, f"split {rel:.3g} is not ≫ better than a bf16 running sum {rel_lowp:.3g}"


def _crafted(bits: list[int]) -> split_accum.SplitAccumulator:
    acc = split_accum.SplitAccumulator((1, len(bits)), DEVICE)
    b = torch.tensor(bits, dtype=torch.int64)
    b = torch.where(b >= 2**31, b - 2**32, b).to(torch.int32)
    acc.hi.view(torch.int16).copy_(((b >> 16).to(torch.int16)).view(1, -1))
    acc.lo.copy_((b & 0xFFFF).to(torch.int16).view(1, -1))  # type: ignore[union-attr]
    return acc


#: fp32 bit patterns around every rounding case: ties to even (both ways), just above/below a tie, the largest
#: finite fp32 (rounds to +inf in bf16), the bf16 maximum plus half an ulp, subnormals, ±0, ±inf, NaNs whose
#: payload lies only in the lower half.
CASES = [
    0x3F808000,
    0x3F818000,
    0x3F808001,
    0x3F807FFF,
    0x7F7FFFFF,
    0x7F7F8000,
    0x7F7F7FFF,
    0x00008000,
    0x00018000,
    0x00000001,
    0x80000000,
    0x00000000,
    0x7F800000,
    0xFF800000,
    0x7F800001,
    0xFFC00001,
    0xBF808000,
    0xC0A3D70A,
    0x3DCCCCCD,
]


@pytest.mark.filterwarnings("ignore:.*encountered in multiply:RuntimeWarning")  # the interpreter's numpy on inf/NaN
@pytest.mark.parametrize("scale", [None, 1.0, 0.3, -2.5])
def test_finish_rounds_once_to_nearest_even(scale: float | None) -> None:
    """finish() equals torch's bf16 cast of fp32(hi, lo)·scale bit for bit (NaN stays NaN), and releases lo."""
    acc = _crafted(CASES)
    v = acc.value()
    s = torch.tensor(scale, device=DEVICE) if scale is not None else None
    want = (v * s if s is not None else v).to(torch.bfloat16)
    got = acc.finish(s)
    assert got.dtype == torch.bfloat16 and got.data_ptr() == acc.hi.data_ptr()
    nan = want.isnan()
    assert torch.equal(got.isnan(), nan)
    wb, gb = want.view(torch.int16)[~nan], got.view(torch.int16)[~nan]
    bad = (wb != gb).nonzero()
    assert bad.numel() == 0, (
        f"scale {scale}: finish gave bits {[hex(int(gb[i]) & 0xFFFF) for i in bad.flatten()]} "
        f"where torch rounds to {[hex(int(wb[i]) & 0xFFFF) for i in bad.flatten()]}"
    )
    assert acc.lo is None
    with pytest.raises(RuntimeError, match="finish ran twice"):
        acc.finish(s)


def test_split_path_holds_half_an_fp32_buffer() -> None:
    """On meta, a split_fp32 grad_weight accumulator allocates V·H·(2+2) bytes (the bf16 result plus the lower
    half) where addmm_out_dtype allocates V·H·4 plus the bf16 result's V·H·2 at finish."""
    V, H = 131072, 4096
    split = memory.measure(lambda: grad_accum.make_accumulator("split_fp32", (V, H), torch.bfloat16, "meta"))
    plain = memory.measure(lambda: grad_accum.make_accumulator("addmm_out_dtype", (V, H), torch.bfloat16, "meta"))
    assert split.extra_peak == V * H * 4 and plain.extra_peak == V * H * 4
    one = torch.ones((), device="meta")
    acc = grad_accum.make_accumulator("split_fp32", (V, H), torch.bfloat16, "meta")
    fin = memory.measure(lambda: acc.finish(one, torch.bfloat16))
    assert fin.extra_peak == 0, "finish must round in place"
    acc2 = grad_accum.make_accumulator("addmm_out_dtype", (V, H), torch.bfloat16, "meta")
    fin2 = memory.measure(lambda: acc2.finish(one, torch.bfloat16))
    assert fin2.extra_peak == V * H * 2, "the fp32 buffer's finish allocates the bf16 gradient"


def test_non_bf16_parameters_use_the_fp32_buffer() -> None:
    """split_fp32 with fp32/fp16 parameters, and for a bias, is the fp32 addmm_out_dtype buffer."""
    for dt in (torch.float32, torch.float16):
        acc = grad_accum.make_accumulator("split_fp32", (4, 3), dt, "cpu")
        assert isinstance(acc, accumulation.BufferAccumulator) and acc.path == "addmm_out_dtype"
    acc = grad_accum.make_accumulator("split_fp32", (4,), torch.bfloat16, "cpu")
    assert isinstance(acc, accumulation.BufferAccumulator) and acc.buf.dtype == torch.float32


def test_bad_input_names_the_argument() -> None:
    """Mismatched shapes, dtypes, devices and reuse after finish raise errors that name what was wrong."""
    acc = split_accum.SplitAccumulator((8, 4), DEVICE)
    G = torch.zeros(3, 8, dtype=torch.bfloat16, device=DEVICE)
    x = torch.zeros(3, 4, dtype=torch.bfloat16, device=DEVICE)
    with pytest.raises(ValueError, match="G_chunk has 3 rows but x_chunk has 2"):
        acc.add_(G, x[:2])
    with pytest.raises(ValueError, match=r"accumulator is \[V, H\] = \[8, 4\]"):
        acc.add_(G[:, :7], x)
    with pytest.raises(ValueError, match="one dtype"):
        acc.add_(G, x.half())
    with pytest.raises(ValueError, match="G_chunk must be one of"):
        acc.add_(G.double(), x)
    with pytest.raises(ValueError, match="scale must be one element"):
        acc.finish(torch.ones(2, device=DEVICE))
    acc.finish(None)
    with pytest.raises(RuntimeError, match="spent"):
        acc.add_(G, x)
    with pytest.raises(ValueError, match="unknown grad_weight accumulation path"):
        grad_accum.make_accumulator("nope", (2, 2), torch.bfloat16, "cpu")
    with pytest.raises(ValueError, match="yields a bfloat16 gradient"):
        grad_accum.make_accumulator("split_fp32", (2, 2), torch.bfloat16, DEVICE).finish(None, torch.float16)
