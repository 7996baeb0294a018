"""Evidence: torchao's power-of-2 scale rounding (``round_scales_to_power_of_2``, on in its ``rowwise`` and
``rowwise_with_gw_hp`` recipes) rounds a scale just below 2^k *up* to 2^k, where its config documents "rounded
(floor)" and numcheck's ``power_of_2_scales`` (TransformerEngine: keep the exponent bits) gives 2^(k−1).

Cause, read in torchao 0.18.0 (float8/float8_utils.py): ``_round_scale_down_to_power_of_2(scale)`` is
``torch.exp2(torch.floor(torch.log2(scale)))`` in fp32; for ``scale = 2^k·(1 − δ)`` with δ below about half an
fp32 ulp of k (times ln 2), ``log2`` rounds to exactly k. The amax element then times 2^k exceeds fp8_max and
saturates. Only fp32 inputs reach it: a bf16 or fp16 amax gives fp8_max/amax either exactly 2^k or at least
2^−11 away from it.

The script prints, for a few k, the amax of an fp32 tensor one ulp above fp8_max·2^−k, torchao's scale
(``tensor_to_scale`` with rounding on), the floor, and ``amax·scale`` against fp8_max (E4M3). Then the suite's
accuracy property on ``torchao_float8[rowwise]`` and ``[rowwise_with_gw_hp]`` (numcheck's ``rowwise`` and
``rowwise_gw_hp`` kinds) in the ``scale_edge`` regime (every row's amax a few ulps beside fp8_max·2^k; the edge case's
shape 33×40×24, fp32, seeds 11–18), as released and with torchao's rounding replaced by an exact floor
(``frexp``: the exponent bits): the failures go with it, so the scale rule is their one cause. A scale twice the
floor's leaves every normal FP8 value's dequantization unchanged (a power of 2 commutes with the rounding); what
differs is the amax element, saturated by ≤ 2 ulps, and every element in the FP8 subnormal range, quantized on a
grid twice as fine as the contract's: against the dequantized reference those are far beyond the accumulation
bound (hundreds of dgrad elements where W has one scale, under rowwise_with_gw_hp). bf16 inputs never reach it.
``torchao_pow2_scale.txt`` beside this file is its output.

Usage: PYTHONPATH=. python docs/evidence/torchao_pow2_scale.py
"""

from __future__ import annotations

import torch


def main() -> None:
    import torchao
    from torchao.float8.float8_utils import tensor_to_scale

    fmax = torch.finfo(torch.float8_e4m3fn).max
    print(f"torch {torch.__version__}, torchao {torchao.__version__}; E4M3, fp8_max {fmax}")
    for k in (2, 6, 10, 20):
        amax = torch.nextafter(torch.tensor(fmax * 2.0**-k), torch.tensor(1e9))  # one fp32 ulp above
        t = torch.tensor([[float(amax), 0.5 * float(amax)]], dtype=torch.float32)
        s = float(tensor_to_scale(t, torch.float8_e4m3fn, round_scales_to_power_of_2=True))
        plain = float(tensor_to_scale(t, torch.float8_e4m3fn))
        print(
            f"k={k:2d}: amax {float(amax):.9g}  fp32(fp8_max/amax) {plain:.9g}  torchao pow2 scale {s:g} "
            f"(floor: {2.0 ** (k - 1):g})  amax·scale {float(amax) * s:.9g} "
            f"{'> fp8_max: saturates' if float(amax) * s > fmax else '<= fp8_max'}"
        )


def exact_floor(scale: torch.Tensor) -> torch.Tensor:
    """2^floor(log2 s) from the exponent bits (what the recipe documents)."""
    _, e = torch.frexp(scale)
    return torch.ldexp(torch.ones_like(scale), e - 1)


def verdicts(seeds: range) -> list[str]:
    """The accuracy verdict of each torchao rowwise recipe on the scale_edge cases of ``seeds``."""
    from numcheck.errors import PropertyFailure
    from numcheck.impls.adapters.torchao import torchao_impl
    from numcheck.properties.core.runner import judge
    from numcheck.properties.fp8 import props as checks
    from numcheck.properties.fp8.cases import Fp8Case

    out = []
    for name in ("rowwise", "rowwise_with_gw_hp"):
        impl = torchao_impl(name)
        failed = []
        for seed in seeds:
            case = Fp8Case(impl.support.recipes[0], 33, 40, 24, regime="scale_edge", seed=seed, bias=True)
            try:
                judge(checks.accuracy, impl, case.replace(save_original_input=True))
            except PropertyFailure as exc:
                found = [ln.strip() for ln in str(exc).splitlines() if "beyond bound" in ln]
                failed.append(
                    f"seed {seed}: " + "; ".join(ln.split("error): ", 1)[-1].split("; worst")[0] for ln in found)
                )
        out.append(f"  {name}: {len(failed)} of {len(seeds)} fail" + "".join(f"\n    {f}" for f in failed))
    return out


def suite_cases() -> None:
    import torchao.float8.float8_utils as fu

    seeds = range(11, 19)
    print("accuracy on scale_edge (33x40x24, float32, bias), as released:")
    print("\n".join(verdicts(seeds)))
    released = fu._round_scale_down_to_power_of_2
    fu._round_scale_down_to_power_of_2 = exact_floor
    try:
        print("with _round_scale_down_to_power_of_2 replaced by the exact floor:")
        print("\n".join(verdicts(seeds)))
    finally:
        fu._round_scale_down_to_power_of_2 = released


if __name__ == "__main__":
    main()
    suite_cases()
