"""Evidence: torchao's power-of-2 scale rounding (``round_scales_to_power_of_2``, on in its ``rowwise`` and
``rowwise_with_gw_hp`` recipes) rounds a scale just below 2^k *up* to 2^k, where its config documents "rounded
(floor)" and numcheck's ``power_of_2_scales`` (TransformerEngine: keep the exponent bits) gives 2^(k−1).

Cause, read in torchao 0.18.0 (float8/float8_utils.py): ``_round_scale_down_to_power_of_2(scale)`` is
``torch.exp2(torch.floor(torch.log2(scale)))`` in fp32; for ``scale = 2^k·(1 − δ)`` with δ below about half an
fp32 ulp of k (times ln 2), ``log2`` rounds to exactly k. The amax element then times 2^k exceeds fp8_max and
saturates. Only fp32 inputs reach it: a bf16 or fp16 amax gives fp8_max/amax either exactly 2^k or at least
2^−11 away from it.

The script prints, for a few k, the amax of an fp32 tensor one ulp above fp8_max·2^−k, torchao's scale
(``tensor_to_scale`` with rounding on), the floor, and ``amax·scale`` against fp8_max (E4M3);
``torchao_pow2_scale.txt`` beside this file is its output. No registered torchao recipe is judged with these scales
yet (numcheck has no rowwise recipe kind): this is recorded for when one is.

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


if __name__ == "__main__":
    main()
