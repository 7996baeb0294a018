"""Liger FLCE's arithmetic (bf16 operands, softcap, ``mean``, fp32 grad_W accumulator) emulated on the CPU with
correctly rounded fp32 math, judged by numcheck's ``accuracy`` and ``two_calls`` properties, on the case where the
H200 sweep failed ``liger[accum=fp32]`` at 1.61x (results/sweeps/h200-torch2.11/README.md). Liger's softcap
does not run under the CPU interpreter, so this asks only: does a correct evaluation of what Liger computes pass
the bound? tanh is also pushed up to 32 ulps toward +-1.

Usage: python docs/evidence/liger_softcap_two_calls.py "Problem(...)"   (the failing case by default)
Result (torch 2.13 CPU): every variant passes, accuracy at 0.144 and two_calls at 0.067 of the bound.
"""

import dataclasses
import sys

import torch

from numcheck.properties.linear_ce import props
from numcheck.properties.linear_ce.cases import Problem  # noqa: F401 - the case is eval-ed
from numcheck.reports.repro import find_impl

LOG2E = 1.4426950408889634


def tanh_pert(z, ulps):
    t = torch.tanh(z)
    if ulps:
        t = t + ulps * torch.sign(t) * torch.finfo(torch.float32).eps * t.abs()  # push toward |1|
        t = t.clamp(-1, 1)
    return t


class F(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, target, ignore_index, softcap, reduction, ulps):
        logits = (x.float() @ w.float().t()).to(x.dtype).float()
        s = softcap
        t = tanh_pert(logits / s, ulps)
        zc = s * t
        m = zc.max(dim=1, keepdim=True).values
        e = torch.exp2((zc - m) * LOG2E)
        d = e.sum(dim=1, keepdim=True)
        lse = m + torch.log(d)
        valid = target != ignore_index
        n = int(valid.sum())
        p = e / d
        G = p.clone()
        rows = torch.arange(x.shape[0])
        tv = target.clamp_min(0)
        G[rows, tv] -= 1.0
        if reduction == "mean":
            G = G / n
        G = G * (1 - t * t)
        G[~valid] = 0
        Gb = G.to(x.dtype)
        loss_rows = (lse.squeeze(1) - zc[rows, tv]) * valid
        loss = loss_rows.sum() / (n if reduction == "mean" else 1)
        gx = (Gb.float() @ w.float()).to(x.dtype)
        gw = (Gb.float().t() @ x.float()).to(w.dtype)  # fp32 accumulate, then stored in w's dtype
        ctx.save_for_backward(gx, gw)
        return loss.to(x.dtype) if False else loss

    @staticmethod
    def backward(ctx, go):
        gx, gw = ctx.saved_tensors
        if not torch.equal(go, torch.ones_like(go)):
            gx, gw = gx * go, gw * go
        return gx, gw, None, None, None, None, None


def make(ulps):
    def fn(
        x,
        weight,
        target,
        bias=None,
        *,
        reduction="mean",
        ignore_index=-100,
        label_smoothing=0.0,
        class_weights=None,
        softcap=None,
        z_loss_scale=0.0,
    ):
        loss = F.apply(x, weight, target, ignore_index, softcap, reduction, ulps)
        return (loss, torch.zeros((), dtype=torch.float32)) if lig.support.returns_z_loss else loss

    return fn


lig = find_impl("liger[accum=fp32]")
CASE = (
    "Problem(N=26, H=48, V=141, dtype='bfloat16', ignored=0.25, reduction='mean', softcap=1.0, "
    "upstream='one', regime='large', seed=0)"
)
p = eval(sys.argv[1] if len(sys.argv) > 1 else CASE)
for ulps in (0, 2, 8, 32):
    impl = dataclasses.replace(lig, name=f"emul[tanh+{ulps}ulp]", fn=make(ulps))
    for prop in ("accuracy", "two_calls"):
        try:
            r = getattr(props, prop)(impl, p)
            print(ulps, prop, "PASS", {k: round(v, 3) for k, v in (r or {}).items()})
        except Exception as ex:
            msg = str(ex).splitlines()
            print(ulps, prop, "FAIL", *msg[:8], sep="\n  ")
