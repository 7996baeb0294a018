"""The two Liger CUDA sweep failures left open (results/sweeps/h200-torch2.11/README.md, classes 2 and 3),
rerun on the device with what tells their causes apart.

A. ``liger[accum=fp32]`` two_calls, bf16, softcap 1, regime large (grad_x 1.61x, grad_W 1.78x the bound).
B. Liger earlier_calls, AMP bf16 z-loss after a call under AMP fp16 (1.08x the bound).

For each: the property as the suite runs it, with cuBLAS's reduced-precision reductions allowed (torch's default)
and forbidden; a lone call; and how far CUDA's bf16 GEMM of the problem's operands is from the correctly rounded
product (in bf16 ulps of the exact value), which the tolerance model assumes to be within half an ulp plus the fp32
accumulation error. Usage (on CUDA): python docs/evidence/liger_cuda_cases.py
"""

import sys

import torch

from numcheck.properties.linear_ce import props
from numcheck.properties.linear_ce.accuracy import check_accuracy
from numcheck.properties.linear_ce.cases import Problem, build
from numcheck.properties.linear_ce.harness import autocast_context, run_impl
from numcheck.reports.repro import find_impl

MATMUL = torch.backends.cuda.matmul
MANTISSA = {torch.bfloat16: 7, torch.float16: 10}  # explicit mantissa bits
A = Problem(
    N=26,
    H=48,
    V=141,
    dtype="bfloat16",
    ignored=0.25,
    reduction="mean",
    softcap=1.0,
    regime="large",
    seed=0,
    device="cuda",
)
B = Problem(
    N=65,
    H=17,
    V=138,
    dtype="float32",
    autocast="bfloat16",
    reduction="none",
    z_loss_scale=1e-4,
    regime="ordinary",
    seed=0,
    device="cuda",
)


def ulps(got: torch.Tensor, exact: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """|got − exact| in ulps of ``dtype`` at ``exact``."""
    e = exact.abs().clamp_min(torch.finfo(dtype).tiny)
    ulp = torch.exp2(torch.floor(torch.log2(e)) - MANTISSA[dtype])
    return (got.double() - exact).abs() / ulp


def gemm_report(label: str, x: torch.Tensor, w: torch.Tensor, dtype: torch.dtype, amp: bool) -> None:
    """CUDA's ``x @ w.T`` in ``dtype`` (under autocast when ``amp``) against the exact product of the rounded
    operands, with reduced-precision reductions allowed and forbidden."""
    xb, wb = x.detach().to(dtype), w.detach().to(dtype)
    exact = xb.double() @ wb.double().t()
    for allow in (True, False):
        MATMUL.allow_bf16_reduced_precision_reduction = allow
        MATMUL.allow_fp16_reduced_precision_reduction = allow
        if amp:
            with torch.autocast("cuda", dtype=dtype):
                got = x.detach() @ w.detach().t()
        else:
            got = xb @ wb.t()
        torch.cuda.synchronize()
        d = ulps(got, exact, dtype)
        print(
            f"  {label} GEMM {tuple(got.shape)} reduced_precision={allow}: max {float(d.max()):.3f} ulp, "
            f"{int((d > 0.5 + 1e-9).sum())} of {d.numel()} beyond half an ulp"
        )
    MATMUL.allow_bf16_reduced_precision_reduction = True
    MATMUL.allow_fp16_reduced_precision_reduction = True


def verdict(label: str, fn) -> None:
    """Run ``fn`` and print PASS with its metrics or FAIL with the first lines of its message."""
    try:
        r = fn()
        print(f"  {label}: PASS {r}")
    except AssertionError as ex:
        lines = [ln for ln in str(ex).splitlines() if ln.strip()]
        print(f"  {label}: FAIL")
        for ln in lines[:12]:
            print("      " + ln[:220])


def with_flag(allow: bool, fn):
    def run():
        MATMUL.allow_bf16_reduced_precision_reduction = allow
        MATMUL.allow_fp16_reduced_precision_reduction = allow
        try:
            return fn()
        finally:
            MATMUL.allow_bf16_reduced_precision_reduction = True
            MATMUL.allow_fp16_reduced_precision_reduction = True

    return run


def case_a() -> None:
    impl = find_impl("liger[accum=fp32]")
    print(f"A. {impl.name}: {A}")
    t = build(A)
    k = A.N // 2
    for allow in (True, False):
        verdict(f"two_calls, reduced_precision={allow}", with_flag(allow, lambda: props.two_calls(impl, A)))
    verdict("accuracy, whole batch", lambda: check_accuracy(impl, A, t=t).worst_ratio)
    for i, s in enumerate((slice(0, k), slice(k, A.N))):
        ph, th = A.replace(N=k), t._replace(x=t.x[s], target=t.target[s])
        verdict(f"accuracy, half {i} alone", lambda: check_accuracy(impl, ph, t=th, relative=False).worst_ratio)
        gemm_report(f"half {i}", t.x[s], t.weight, torch.bfloat16, amp=False)
    # the halves in one graph against each half alone: state carried between calls shows as a difference
    x = t.x.detach().clone().requires_grad_(True)
    w = t.weight.detach().clone().requires_grad_(True)
    kw = t.options.call_kwargs()
    outs = [impl(x[s], w, t.target[s], None, **kw) for s in (slice(0, k), slice(k, A.N))]
    losses = [o[0] if impl.support.returns_z_loss else o for o in outs]
    (losses[0] + losses[1]).backward()
    for i, s in enumerate((slice(0, k), slice(k, A.N))):
        alone = run_impl(impl, A.replace(N=k), t._replace(x=t.x[s], target=t.target[s]))
        print(
            f"  half {i}: grad_x in one graph vs alone, max |diff| "
            f"{float((x.grad[s].float() - alone.grad_x.float()).abs().max()):.3g}"
        )
    gemm_report("whole batch", t.x, t.weight, torch.bfloat16, amp=False)


def case_b() -> None:
    for name in ("liger[accum=None]", "liger[accum=fp32]"):
        impl = find_impl(name)
        print(f"B. {impl.name}: {B}")
        t = build(B)
        verdict("accuracy, lone call first in the process", lambda: check_accuracy(impl, B, t=t).worst_ratio)
        for allow in (True, False):
            verdict(f"earlier_calls, reduced_precision={allow}", with_flag(allow, lambda: props.earlier_calls(impl, B)))
        verdict("accuracy, lone call again", lambda: check_accuracy(impl, B, t=t).worst_ratio)
        verdict(
            "accuracy, lone call, reduced_precision=False",
            with_flag(False, lambda: check_accuracy(impl, B, t=t).worst_ratio),
        )
        gemm_report("AMP bf16", t.x, t.weight, torch.bfloat16, amp=True)
        # after an fp16 AMP matmul of the same leaves, as earlier_calls does
        x = t.x.detach().clone().requires_grad_(True)
        w = t.weight.detach().clone().requires_grad_(True)
        with torch.autocast("cuda", dtype=torch.float16):
            _ = x @ w.t()
        with autocast_context(B):
            got = x @ w.t()
        exact = x.detach().to(torch.bfloat16).double() @ w.detach().to(torch.bfloat16).double().t()
        print(
            f"  AMP bf16 GEMM after an AMP fp16 one on the same leaves: dtype {got.dtype}, max "
            f"{float(ulps(got.detach(), exact, torch.bfloat16).max()):.3f} ulp"
        )


if __name__ == "__main__":
    print("torch", torch.__version__, torch.cuda.get_device_name(), file=sys.stderr)
    which = sys.argv[1:] or ["a", "b"]
    if "b" in which:  # first: its lone call must be the process's first Liger call
        case_b()
    if "a" in which:
        case_a()
