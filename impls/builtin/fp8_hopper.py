"""Built-in FP8 linears with Hopper's FP8 tensor-core accumulation, computed on any device by mmaemu's reference model.

``fp8_linear[hopper]`` (``use_fast_accum=False``: a new chain every 128 products of K, the chains' results added in
fp32) and ``fp8_linear[hopper_fast]`` (``use_fast_accum=True``: one chain over the whole reduction) are
``fp8_linear[current]`` (:mod:`impls.builtin.fp8_linear`: per-tensor current scaling, its quantizer, autograd and
``save_original_input``) with every GEMM ``deq(a)·deq(b)ᵀ`` computed as ``torch._scaled_mm`` computes it on Hopper's
FP8 tensor cores, by `mmaemu <https://pypi.org/project/mmaemu/>`_ (Apache-2.0; the optional extra ``hopper``):
its ``hopper`` profile, ``splitk=1`` (the suite's shapes are far below a split), its exact float64 reference
backend, fp32 output. Its model: blocks of 32 products aligned to the block's largest exponent (the running sum's
included) and truncated toward zero to 13 fraction bits, the block's sum truncated to 13 fraction bits of itself.

They declare that arithmetic, ``accum_unit_roundoff=2⁻¹³``, ``accum_block=32`` and ``accum_chunk`` 128 or ``None``,
on every device, so the suite's bound for truncating block steps (:mod:`properties.fp8.tolerance`, *Truncating
block steps*) is judged on the CPU against the arithmetic it models. Measured on an H200 (torch 2.11, tensorwise
E4M3, fp32 out; ``docs/evidence/mmaemu_h200.py``): mmaemu's reference backend returned ``torch._scaled_mm``'s bits
in 22 of 24 configurations, every slow-accumulation one with ``splitk=1`` (docs/fp8.md, *Hopper's accumulation on
the CPU*).

mmaemu's ``scaled_mm`` takes what ``torch._scaled_mm`` takes: M, K and N are zero-padded to multiples of 16 here
(zero products leave every block's maximum exponent and truncation unchanged) and the result cut back; the bias is
added after, in fp32. Without mmaemu 0.1.0 both are registered and unavailable with the reason (``numcheck list``).
Per call on this CPU, after a first call's 2–3 s of set-up: 2–15 ms at the suite's small shapes, 0.1–0.25 s at
160×640×144.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util

import torch
import torch.nn.functional as F

from numcheck.impls.builtin.fp8_linear import Fp8Linear
from numcheck.impls.protocols.fp8_linear import Fp8LinearSupport
from numcheck.reference.fp8_recipes import Fp8Recipe
from numcheck.reference.numerics.fp8_linear import NAME, QTensor, declaration

#: The mmaemu release these impls are declared from (the extra ``hopper`` pins it).
MMAEMU_RELEASE = "0.1.0"
#: Hopper's FP8 tensor-core chain as mmaemu's ``hopper`` preset models it: products per block step, the unit
#: roundoff of its 13-fraction-bit truncation, and the slow-accumulation restart.
HOPPER_BLOCK, HOPPER_UNIT_ROUNDOFF, HOPPER_CHUNK = 32, 2.0**-13, 128
_ALIGN = 16  # torch._scaled_mm's (and mmaemu's) multiple for M, K and N


def mmaemu_missing() -> str | None:
    """Why mmaemu's reference backend cannot serve these impls here (not installed, another release), or ``None``."""
    if importlib.util.find_spec("mmaemu") is None:
        return f"mmaemu is not installed: pip install 'numcheck[hopper]' (mmaemu=={MMAEMU_RELEASE}, pure Python)"
    try:
        found = importlib.metadata.version("mmaemu")
    except importlib.metadata.PackageNotFoundError:
        found = "of unknown release"
    if found != MMAEMU_RELEASE:
        return f"mmaemu {found} is installed; these impls are declared from {MMAEMU_RELEASE}'s model"
    return None


def hopper_accumulation(fast: bool) -> dict[str, object]:
    """The declared accumulation: the same on every device, since mmaemu computes Hopper's arithmetic anywhere."""
    return {
        "accum_unit_roundoff": HOPPER_UNIT_ROUNDOFF,
        "accum_block": HOPPER_BLOCK,
        "accum_chunk": None if fast else HOPPER_CHUNK,
    }


def _padded(t: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """FP8 ``t`` zero-padded to ``[rows, cols]`` (through uint8: a zero code is +0 in both formats)."""
    if tuple(t.shape) == (rows, cols):
        return t.contiguous()
    u = F.pad(t.view(torch.uint8), (0, cols - t.shape[1], 0, rows - t.shape[0]))
    return u.view(t.dtype)


def hopper_gemm(a: QTensor, b: QTensor, *, fast: bool) -> torch.Tensor:
    """fp32 ``deq(a)·deq(b)ᵀ`` of two per-tensor K-major operands as Hopper's ``torch._scaled_mm`` computes it."""
    import mmaemu

    if not (a.per_tensor and b.per_tensor):
        raise ValueError("the Hopper impls take per-tensor scales only (mmaemu 0.1.0 models tensorwise scaling)")
    (m, k), n = a.data.shape, b.data.shape[0]
    if 0 in (m, k, n):
        return torch.zeros(m, n, dtype=torch.float32, device=a.data.device)
    mp, kp, np_ = (-(-d // _ALIGN) * _ALIGN for d in (m, k, n))
    ap, bp = _padded(a.data, mp, kp), _padded(b.data, np_, kp)
    out = mmaemu.scaled_mm(
        ap,
        bp.t(),
        a.scale_inv.reshape(1).float(),
        b.scale_inv.reshape(1).float(),
        out_dtype=torch.float32,
        use_fast_accum=fast,
        profile="hopper",
        splitk=1,
        backend="reference",
    )
    return out[:m, :n]


class HopperFp8Linear(Fp8Linear):
    """``fp8_linear[current]`` with Hopper's FP8 GEMM arithmetic (module docstring); ``fast``: ``use_fast_accum``."""

    def __init__(self, name: str, recipes: tuple[Fp8Recipe, ...], description: str, *, fast: bool) -> None:
        super().__init__(name, recipes, description)
        self.fast = fast
        self.support = Fp8LinearSupport(
            **{
                **declaration(recipes, self.recipe_kind),
                **hopper_accumulation(fast),
                "slow": True,  # a GEMM modelled in Python: a quarter of the drawn examples (module docstring)
                "requires": mmaemu_missing,
            }
        )

    def __repr__(self) -> str:
        return f"HopperFp8Linear({self.name!r})"

    def gemm_nt(self, a: QTensor, b: QTensor) -> torch.Tensor:
        """Every GEMM through mmaemu's Hopper model (:func:`hopper_gemm`)."""
        return hopper_gemm(a, b, fast=self.fast)


def fp8_hopper_impls() -> list[HopperFp8Linear]:
    """``fp8_linear[hopper]`` and ``fp8_linear[hopper_fast]``, each declaring per-tensor current scaling with HYBRID
    formats (E4M3 x and W, E5M2 dy: the gradient GEMMs multiply mixed formats), registered with or without mmaemu.
    One recipe: what these impls test is the accumulation, which no other recipe variant changes."""
    recipes = (Fp8Recipe("current"),)
    return [
        HopperFp8Linear(
            f"{NAME}[hopper]",
            recipes,
            "per-tensor current scaling, GEMMs as Hopper's FP8 tensor cores without fast accumulation "
            "(mmaemu: 32-product truncating steps, chains of 128 added in fp32)",
            fast=False,
        ),
        HopperFp8Linear(
            f"{NAME}[hopper_fast]",
            recipes,
            "per-tensor current scaling, GEMMs as Hopper's FP8 tensor cores with use_fast_accum=True "
            "(mmaemu: 32-product truncating steps, one chain over K)",
            fast=True,
        ),
    ]
