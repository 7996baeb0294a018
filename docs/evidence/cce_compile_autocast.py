"""Evidence for the known divergence ``cce[impl=torch_compile]`` (numcheck's known-divergence data): does
cut-cross-entropy's ``impl="torch_compile"`` reuse a graph compiled under one autocast dtype when called under
another?

In one fresh process, for each order of the two autocast dtypes (after ``torch._dynamo.reset()``), the compiled
function is called under the first dtype, then under the second, and each call's loss and grad_x are compared
with eager linear+CE at both dtypes. A call that matches the *other* dtype's eager ran a reused graph.

Result (H200, torch 2.11, cut-cross-entropy 25.1.1; ``cce_compile_autocast.txt`` beside this file): called under
fp16 after a bf16 call, the loss and grad_x equal bf16 eager's (1e-6, 0) and sit 3.4e-3 / 7.9e-4 from fp16 eager's.
torch 2.13 on CPU recompiles, and both orders are right there.

Usage (needs cut-cross-entropy installed): python docs/evidence/cce_compile_autocast.py [cuda|cpu]
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
                print(
                    f"  called under {dt}: vs eager {ref_dt}: |loss diff| {abs(loss.item() - ref_loss):.3e}"
                    f"  max |grad_x diff| {(xc.grad - ref_gx).abs().max().item():.3e}"
                )


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "cuda")
