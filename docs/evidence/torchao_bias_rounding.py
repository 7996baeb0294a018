"""Evidence for torchao's ``Float8Linear`` rounding y to the input dtype before it adds the bias.

Cause, read in torchao 0.18.0: ``Float8Linear.forward`` (float8/float8_linear.py) computes
``output = matmul_with_hp_or_float8_args.apply(...)``, whose emulated GEMM (float8/float8_ops.py) returns
``mm(a.float() / a_scale, b.float() / b_scale).to(output_dtype)``; then ``output = output + bias.to(output.dtype)``:
two roundings to bf16, the first of the bias-free product. Where the bias cancels most of the product, the first
rounding's error (half an ulp of |x·Wᵀ|) is many ulps of |y|. numcheck's accuracy bound counts the bias add as one
rounding in the accumulation (``properties/fp8/tolerance.py``: "the bias add (1)") before the single rounding to the
output dtype.

For each case the script prints torchao's y, the float64 y on torchao's own FP8 operands (numcheck's dequantized
reference), the two-rounding value ``bf16(bf16(S) + b)`` with S the fp32 product of the same operands, the
one-rounding value ``bf16(S + b)``, whether torchao equals the two-rounding value bit for bit, and the error in
units of the one-rounding bound's output term. ``torchao_bias_rounding.txt`` beside this file is its output.

Usage: PYTHONPATH=. python docs/evidence/torchao_bias_rounding.py
"""

from __future__ import annotations

import torch

from numcheck.impls.adapters.torchao import load, torchao_impl
from numcheck.properties.fp8.cases import Fp8Case, build_fp8
from numcheck.reference.fp8_linear import quantized_linear

SEEDS = range(8)


def one(impl, seed: int) -> str:
    recipe = impl.support.recipes[0]
    case = Fp8Case(recipe, 1, 8, 1, dtype="bfloat16", bias=True, regime="normal", seed=seed, save_original_input=True)
    t = build_fp8(case)
    x, w, b = (v.clone().requires_grad_(True) for v in (t.x, t.weight, t.bias))
    kw = dict(recipe=recipe, save_original_input=True)
    y = impl(x, w, b, **kw).detach().double()
    ref = quantized_linear(t.x, t.weight, t.dy, t.bias, recipe)
    s = ref.dq["y"] - t.bias.double()  # the bias-free product of torchao's operands (exact in float64)
    two = (s.to(torch.float32).to(torch.bfloat16).double() + t.bias.double()).to(torch.bfloat16).double()
    one_r = (s + t.bias.double()).to(torch.float32).to(torch.bfloat16).double()
    ulp_y = 2.0 ** (torch.frexp(ref.dq["y"])[1].double() - 8)
    return (
        f"seed {seed}: S {float(s):+.6g}  b {float(t.bias):+.6g}  y_dq {float(ref.dq['y']):+.6g}  "
        f"torchao {float(y):+.6g}  bf16(bf16(S)+b) {float(two):+.6g}  bf16(S+b) {float(one_r):+.6g}  "
        f"torchao==two-roundings {bool(torch.equal(y, two))}  |err| {float((y - ref.dq['y']).abs()):.3g} "
        f"= {float((y - ref.dq['y']).abs() / ulp_y):.2f} ulp(y)"
    )


def main() -> None:
    info = load()
    print(f"torch {torch.__version__}, torchao {getattr(info, 'version', info)}; x [1, 8], W [1, 8], bias [1], bf16")
    impl = torchao_impl("tensorwise")
    for seed in SEEDS:
        print(one(impl, seed))


if __name__ == "__main__":
    main()
