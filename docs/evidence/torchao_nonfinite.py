"""Evidence for torchao's ``Float8Linear`` (tensorwise) on non-finite inputs, against numcheck's FP8 contract.

numcheck's contract (``impls/protocols/fp8_linear.py``, "Non-finite inputs", TransformerEngine's convention):
amax ignores NaN elements, a NaN element quantizes to NaN, ±inf makes amax inf, whose scale is 1, and saturates
to ±max; only outputs whose reduction meets a NaN operand are NaN. torchao 0.18.0 (float8/float8_utils.py):
``tensor_to_amax`` is ``torch.max(torch.abs(x))``, which propagates NaN, and ``amax_to_scale`` is
``fp8_max / clamp(amax, min=EPS)``: one NaN makes the tensor's scale NaN and every element of its cast NaN; an inf
makes the scale fp8_max/inf = 0, so finite elements quantize to 0 and the inf to inf·0 = NaN. With one scale per
tensor, one non-finite element of x, W or dy makes every output that tensor feeds NaN or zero.

Per row (``rowwise``, AXISWISE: ``torch.amax(abs(t), dim, keepdim=True)``, float8_utils.py:69) the same rules act on
one row or column: a NaN makes its row's scale NaN, and every output that row feeds is NaN — which the contract
asks anyway, since each of those outputs' reductions meets the NaN (the rowwise recipe passes the NaN case); an inf
makes its row's scale 0 and that row NaN, where the contract saturates it (every output the row or column feeds is
NaN instead of finite). ``rowwise_with_gw_hp`` scales W for grad_input with one scale per tensor
(``cast_config_weight_for_grad_input`` TENSORWISE): one NaN or inf in W makes every element of dgrad NaN.

The script prints, for each torchao recipe and each of numcheck's edge regimes (the suite's
``test_edge_inputs_every_recipe`` case, 33×40×24, seed 11), whether the suite's accuracy property passes, how many
elements of y, dgrad and wgrad are NaN in the nan and inf cases beside what the contract asks, and for a NaN and an
inf input torchao's own tensorwise scale (``tensor_to_scale``).
``torchao_nonfinite.txt`` beside this file is its output.

Usage: PYTHONPATH=. python docs/evidence/torchao_nonfinite.py
"""

from __future__ import annotations

import torch

from numcheck.errors import PropertyFailure
from numcheck.impls.adapters.torchao import load, torchao_impl
from numcheck.properties.core.runner import judge
from numcheck.properties.fp8 import props as checks
from numcheck.properties.fp8.cases import Fp8Case, build_fp8
from numcheck.reference.fp8_linear import quantized_linear

REGIMES = ("zeros", "outlier", "nan", "inf", "tiny", "wide", "tail_outlier", "pruned", "scale_floor")


def verdict(impl, case: Fp8Case) -> str:
    try:
        judge(checks.accuracy, impl, case)
    except PropertyFailure as exc:
        lines = [ln.strip() for ln in str(exc).splitlines() if "reference" in ln]
        return "FAILS: " + (lines[0] if lines else str(exc).splitlines()[0])
    return "passes"


def scales() -> None:
    from torchao.float8.float8_utils import tensor_to_scale

    for label, bad in (("NaN", float("nan")), ("+inf", float("inf"))):
        t = torch.tensor([[1.0, 2.0], [bad, 0.5]])
        print(f"  tensor_to_scale(E4M3) of [[1, 2], [{label}, 0.5]]: {float(tensor_to_scale(t, torch.float8_e4m3fn))}")


def counts(impl, regime: str) -> None:
    recipe = impl.support.recipes[0]
    case = Fp8Case(recipe, 33, 40, 24, dtype="float32", bias=True, regime=regime, seed=11, save_original_input=True)
    t = build_fp8(case)
    x, w = t.x.clone().requires_grad_(True), t.weight.clone().requires_grad_(True)
    y = impl(x, w, t.bias, recipe=recipe, save_original_input=True)
    y.backward(t.dy)
    ref = quantized_linear(t.x, t.weight, t.dy, t.bias, recipe)
    got = {"y": y.detach(), "dgrad": x.grad, "wgrad": w.grad}
    print(
        f"  {regime}: "
        + "; ".join(
            f"{k} NaN in {int(torch.isnan(v).sum())} of {v.numel()} (contract: {int(torch.isnan(ref.dq[k]).sum())})"
            for k, v in got.items()
        )
    )


def main() -> None:
    info = load()
    print(f"torch {torch.__version__}, torchao {getattr(info, 'version', info)}, CPU (emulate=True)")
    for name in ("tensorwise", "rowwise", "rowwise_with_gw_hp"):
        impl = torchao_impl(name)
        recipe = impl.support.recipes[0]
        print(
            f"{impl.name} as {recipe.name}; accuracy on the suite's edge case (M=33, K=40, N=24, float32, bias, seed 11):"
        )
        for regime in REGIMES:
            case = Fp8Case(
                recipe, 33, 40, 24, dtype="float32", bias=True, regime=regime, seed=11, save_original_input=True
            )
            print(f"  {regime}: {verdict(impl, case)}")
        print("outputs of the nan and inf cases:")
        for regime in ("nan", "inf"):
            counts(impl, regime)
    print("torchao's scale of a tensor with one non-finite element:")
    scales()


if __name__ == "__main__":
    main()
