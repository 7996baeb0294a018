"""Label-smoothing conventions of vocabulary-parallel cross-entropy, as the float64 oracle's own ε.

``"torch"`` (PyTorch's ``F.cross_entropy``): ℓ = (1−ε)·(−log p_y) + (ε/V)·Σ_j (−log p_j), the smoothing mass ε
spread over all V classes. ``"megatron"`` (Megatron-core's ``vocab_parallel_cross_entropy``, NeMo): ℓ =
(1−ε)·(−log p_y) + (ε/(V−1))·Σ_{j≠y} (−log p_j), the mass spread over the V−1 other classes. Writing
Σ_{j≠y} = Σ_j − (−log p_y):

    ℓ_megatron(ε) = (1 − ε − ε/(V−1))·(−log p_y) + (ε/(V−1))·Σ_j (−log p_j) = ℓ_torch(ε'),  ε' = ε·V/(V−1),

since ε'/V = ε/(V−1) and 1 − ε' = 1 − ε − ε/(V−1). So the megatron convention is the oracle's with ε' (exactly,
without class weights; ε' ≤ 1 needs ε ≤ (V−1)/V). tests/self/reference/test_smoothing_convention.py checks the identity
against the formula summed directly in float64.
"""

from __future__ import annotations

from typing import Literal

SmoothingConvention = Literal["torch", "megatron"]
CONVENTIONS: tuple[str, ...] = ("torch", "megatron")


def oracle_smoothing(eps: float, V: int, convention: str) -> float:
    """The ε the oracle (PyTorch's convention) takes for smoothing ``eps`` under ``convention`` over ``V`` classes.
    ValueError naming what is wrong for an unknown convention or an ε the convention cannot express."""
    if convention not in CONVENTIONS:
        raise ValueError(f"label-smoothing convention {convention!r} is not one of {CONVENTIONS}")
    if convention == "torch" or eps == 0.0:
        return float(eps)
    if V < 2:
        raise ValueError(
            f"the megatron smoothing convention needs V >= 2 (it spreads ε over the V-1 other classes), got V={V}"
        )
    out = eps * V / (V - 1)
    if out > 1.0:
        raise ValueError(
            f"label_smoothing={eps} under the megatron convention at V={V} is ε'={out} > 1 in PyTorch's "
            f"terms; it needs ε <= (V-1)/V"
        )
    return out
