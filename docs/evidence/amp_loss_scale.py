"""Where eager's gradients go non-finite under CUDA AMP fp16 with a loss scale of 2^17 (seed 12).

``Problem(N=1, H=16, V=44, float32, autocast='float16', bias, class_weights, upstream='loss_scale',
regime='confident', seed=305)``: the exact scaled gradients fit fp16 with 4x headroom
(:func:`properties.linear_ce.strategies.scaled_gradients_fit`), eager passes on CPU, and on the H200 every element of
grad_x, grad_weight and grad_bias came back non-finite. This prints, on the device it runs on, the dtype and the
largest magnitude of each gradient eager's autograd graph forms (the logits' gradient G, and the one entering
cross_entropy), so the step that overflows is named. Run: ``PYTHONPATH=. python docs/evidence/amp_loss_scale.py``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from numcheck.properties.linear_ce.cases import Problem, build
from numcheck.properties.linear_ce.harness import autocast_context

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
CASE = Problem(
    N=1,
    H=16,
    V=44,
    dtype="float32",
    autocast="float16",
    bias=True,
    class_weights=True,
    upstream="loss_scale",
    regime="confident",
    seed=305,
    device=DEVICE,
)


def _show(name: str):
    def hook(g: torch.Tensor) -> None:
        print(
            f"  grad into {name}: dtype {g.dtype}, max |g| {g.abs().max().item():.6g}, finite "
            f"{bool(g.isfinite().all())}"
        )

    return hook


def main() -> None:
    """Print the gradient dtypes and magnitudes along eager's backward, for class weights cast as eager casts
    them (to the logits' dtype) and kept in fp32."""
    t = build(CASE)
    print(f"device {DEVICE}, torch {torch.__version__}; {CASE!r}")
    for cw_cast in (True, False):
        x = t.x.clone().requires_grad_()
        w = t.weight.clone().requires_grad_()
        b = t.bias.clone().requires_grad_()
        cw = t.options.class_weights
        with autocast_context(CASE):
            logits = F.linear(x, w, b)
            logits.register_hook(_show("logits (G, fp16 GEMM input)"))
            weight = cw.to(logits.dtype) if cw_cast else cw
            loss = F.cross_entropy(logits, t.target, weight=weight)
        print(
            f"class weights {'cast to ' + str(logits.dtype) if cw_cast else 'fp32'}: logits {logits.dtype}, "
            f"loss {loss.dtype} = {loss.item():.6g}, target {t.target.tolist()}, "
            f"p_target {logits.float().softmax(-1)[0, t.target[0]].item():.6g}"
        )
        loss.backward(t.upstream.to(loss.device, loss.dtype))
        for n, v in (("grad_x", x.grad), ("grad_weight", w.grad), ("grad_bias", b.grad)):
            print(f"  {n}: max |.| {v.abs().max().item():.6g}, finite {bool(v.isfinite().all())}")


if __name__ == "__main__":
    main()
