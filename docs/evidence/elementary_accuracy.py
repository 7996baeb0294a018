"""Measure the accuracy of the exp, log and tanh paths numcheck's Triton kernels and torch's ops use, against
float64, over the arguments the CE kernels see, and compare it with what the Triton impls declare
(``elementary_error``, impls/builtin/triton_ce.py).

Run from the repository root: ``PYTHONPATH=. python docs/evidence/elementary_accuracy.py``. With CUDA the Triton
kernels run compiled and torch's ops on the GPU; without it the kernels run under Triton's interpreter (numpy)
and torch's ops on the CPU. One row per path: the largest error in ulps of the correctly rounded result (from
the exact value), the largest relative error in units of u = 2⁻²⁴, and the largest ratio of the error to the
declared budget (≤ 1 means the declaration covers it). Exit status 1 when a declared budget is exceeded.

Budgets (relative, units of u): exp(x): 1 + 2·(exp + exp_per_arg·|x|) (one rounding plus the declared ulps; only
where e^x is a normal fp32, x ≥ −87: below, the model's absolute η term applies, reported separately);
log(x): (1 + 2·log)·max(|log x|, 1); numcheck's composite tanh(z/s) and a libdevice tanh(z/s): 2 + 2·tanh (the
model counts the division and tanh once each).
"""

from __future__ import annotations

import math
import sys

from numcheck.impls.interpreter import arrange

arrange()

import torch  # noqa: E402

from numcheck.impls.builtin.triton_ce import _tanh, elementary_error, triton_library_elementary  # noqa: E402
from numcheck.impls.triton_lang import INTERPRET, tl, triton  # noqa: E402

U = 2.0**-24
DEV = "cuda" if torch.cuda.is_available() else "cpu"
BLOCK = 4096

try:  # libdevice's tanh, as Liger-Kernel and cut-cross-entropy call it
    from triton.language.extra import libdevice
except ImportError:  # pragma: no cover - depends on the triton release
    libdevice = None


@triton.jit
def _probe(X, Y, S, n, OP: tl.constexpr, BLOCK_: tl.constexpr):
    offs = tl.program_id(0) * BLOCK_ + tl.arange(0, BLOCK_)
    mask = offs < n
    x = tl.load(X + offs, mask=mask, other=1.0)
    s = tl.load(S)
    if OP == 0:
        y = tl.exp(x)
    elif OP == 1:
        y = tl.log(x)
    elif OP == 2:
        y = _tanh(x / s)
    elif OP == 3:
        y = tl.exp2(x * 1.4426950408889634)
    else:
        y = libdevice.tanh(x / s)
    tl.store(Y + offs, y, mask=mask)


def _triton(op: int, x: torch.Tensor, s: float = 1.0) -> torch.Tensor:
    y = torch.empty_like(x)
    _probe[(triton.cdiv(x.numel(), BLOCK),)](
        x, y, torch.tensor([s], dtype=torch.float32, device=x.device), x.numel(), OP=op, BLOCK_=BLOCK
    )
    return y


def _args(lo: float, hi: float, n: int, seed: int) -> torch.Tensor:
    """A dense grid and uniform draws on [lo, hi], fp32."""
    g = torch.Generator().manual_seed(seed)
    x = torch.cat(
        [
            torch.linspace(lo, hi, n, dtype=torch.float64),
            lo + (hi - lo) * torch.rand(n, generator=g, dtype=torch.float64),
        ]
    )
    return x.float().to(DEV)


def _measure(approx: torch.Tensor, exact: torch.Tensor, budget_u: torch.Tensor) -> tuple[float, float, float]:
    """(max ulps from exact, max relative error / u, max error / budget) over finite nonzero exact values."""
    a, e = approx.double().cpu(), exact.double().cpu()
    keep = torch.isfinite(e) & (e != 0)
    a, e, b = a[keep], e[keep], budget_u.double().cpu()[keep]
    cr = e.float()
    ulp = (torch.nextafter(cr.abs(), torch.tensor(math.inf)) - cr.abs()).double()
    err = (a - e).abs()
    return float((err / ulp).max()), float((err / e.abs()).max() / U), float((err / (b * U * e.abs())).max())


def main() -> int:
    """Print the table and return 1 when a declared budget is exceeded."""
    own, lib = elementary_error(INTERPRET), triton_library_elementary(INTERPRET, softmax_divides=False)
    where = "Triton interpreter (numpy) and torch on CPU" if INTERPRET else f"{torch.cuda.get_device_name()}, compiled"
    print(f"{where}; torch {torch.__version__}, triton {triton.__version__}")
    print(f"declared, numcheck's kernels: {own}\ndeclared, library kernels (Liger/CCE): {lib}\n")
    rows = []
    x = _args(-87.0, 0.0, 200_000, 1)
    ex = torch.exp(x.double())
    b_exp = lambda d: 1 + 2 * (d.exp + d.exp_per_arg * x.double().abs())  # noqa: E731
    rows.append(("tl.exp", "x in [-87, 0]", _measure(_triton(0, x), ex, b_exp(own))))
    rows.append(("tl.exp2(x*log2e)", "x in [-87, 0]", _measure(_triton(3, x), ex, b_exp(lib))))
    rows.append(("torch.exp", "x in [-87, 0]", _measure(torch.exp(x), ex, b_exp(own))))
    sub = _args(-100.0, -87.0, 20_000, 2)
    abs_err = float((_triton(0, sub).double() - torch.exp(sub.double())).abs().max())
    for lo, hi, seed in ((1.0, 2.0, 3), (1.0, 262144.0, 4)):
        y = _args(lo, hi, 200_000, seed)
        ly = torch.log(y.double())
        b_log = lambda d: (1 + 2 * d.log) * ly.abs().clamp_min(1.0) / ly.abs()  # noqa: E731
        rows.append(("tl.log", f"x in [{lo:g}, {hi:g}]", _measure(_triton(1, y), ly, b_log(own))))
        rows.append(("torch.log", f"x in [{lo:g}, {hi:g}]", _measure(torch.log(y), ly, b_log(own))))
    for s in (1.0, 5.0, 30.0):
        z = _args(-20 * s, 20 * s, 200_000, int(s) + 10)
        tz = torch.tanh(z.double() / s)
        rows.append(
            (
                "numcheck _tanh(z/s)",
                f"s={s:g}, |z/s| <= 20",
                _measure(_triton(2, z, s), tz, torch.full_like(tz, 2 + 2 * own.tanh)),
            )
        )
        if libdevice is not None and not INTERPRET:  # the interpreter has no libdevice tanh
            rows.append(
                (
                    "libdevice.tanh(z/s)",
                    f"s={s:g}, |z/s| <= 20",
                    _measure(_triton(4, z, s), tz, torch.full_like(tz, 2 + 2 * lib.tanh)),
                )
            )
        rows.append(
            (
                "torch.tanh(z/s)",
                f"s={s:g}, |z/s| <= 20",
                _measure(torch.tanh(z / s), tz, torch.full_like(tz, 2 + 2 * own.tanh)),
            )
        )
    print(f"{'path':22s} {'arguments':22s} {'ulps':>8s} {'rel/u':>8s} {'err/budget':>10s}")
    worst = 0.0
    for name, rng, (ulps, rel, ratio) in rows:
        print(f"{name:22s} {rng:22s} {ulps:8.3f} {rel:8.3f} {ratio:10.3f}")
        worst = max(worst, ratio)
    print(
        f"\ntl.exp for x in [-100, -87] (subnormal or flushed results): max absolute error {abs_err:.3g} "
        f"(the model's eta for fp32 is 2^-126 = {2.0**-126:.3g})"
    )
    print(f"worst error/budget: {worst:.3f} ({'covered' if worst <= 1 else 'NOT covered'})")
    return 0 if worst <= 1 else 1


if __name__ == "__main__":
    sys.exit(main())
