"""Probe: does cut-cross-entropy's ``impl="torch_compile"`` reuse a graph compiled under one autocast dtype
when called under another?

Run K' (suite on the H200) found ``cce[impl=torch_compile]`` under AMP fp16 with bf16-sized errors (1 % in the
gradients, loss 0.0035 off) after the same worker had run bf16-autocast draws. This script calls the compiled
function under autocast ``first`` then ``second`` in one fresh process and compares each loss and grad_x with
eager at that autocast dtype and at the other one: a reused graph matches the other dtype's eager.

Usage: python -m reports.probes.cce_compile_autocast [cuda|cpu]
"""
from __future__ import annotations

import sys

import torch
import torch.nn.functional as F


def _eager(x: torch.Tensor, w: torch.Tensor, t: torch.Tensor, dtype: torch.dtype) -> tuple[float, torch.Tensor]:
    """Loss and grad_x of eager linear+CE with the matmul in ``dtype`` and the CE in fp32."""
    xe = x.detach().clone().requires_grad_()
    loss = F.cross_entropy((xe.to(dtype) @ w.to(dtype).T).float(), t)
    loss.backward()
    return loss.item(), xe.grad


def main(device: str) -> None:
    """Print, per call order, the compiled CCE loss/grad_x distance to eager in fp16 and in bf16."""
    from cut_cross_entropy import linear_cross_entropy

    torch.manual_seed(0)
    x = torch.randn(35, 16, device=device)
    w = torch.randn(61, 16, device=device)
    t = torch.randint(0, 61, (35,), device=device)
    ref = {dt: _eager(x, w, t, dt) for dt in (torch.float16, torch.bfloat16)}
    for order in ((torch.float16, torch.bfloat16), (torch.bfloat16, torch.float16)):
        torch._dynamo.reset()
        print("order", [str(d) for d in order])
        for dt in order:
            xc = x.detach().clone().requires_grad_()
            with torch.autocast(device, dtype=dt):
                loss = linear_cross_entropy(xc, w, t, impl="torch_compile")
            loss.backward()
            for ref_dt, (ref_loss, ref_gx) in ref.items():
                print(f"  called under {dt}: vs eager {ref_dt}: |loss diff| {abs(loss.item() - ref_loss):.3e}"
                      f"  max |grad_x diff| {(xc.grad - ref_gx).abs().max().item():.3e}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "cuda")
