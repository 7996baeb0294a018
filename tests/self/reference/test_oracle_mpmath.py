"""The float64 oracle agrees with a 50-digit mpmath evaluation on tiny cases (N=2, H=3, V=4).

The mpmath side is written from the definitions only — PyTorch's documented cross-entropy with class weights
and label smoothing, Liger's z-loss, ``s·tanh(z/s)`` softcap — and its gradients are taken by mpmath's
numerical differentiation at 50 digits, so neither the oracle's code nor its analytic gradient formulas are
reused. Agreement is required to 1e-14 relative to each output's largest magnitude: the oracle's own float64
error on these O(1) cases is a few ulps (≈1e-15), and the mpmath values are exact to far more digits.
"""

from __future__ import annotations

import os
from typing import Callable

import pytest
import torch

from numcheck.reference.linear_ce import linear_ce
from numcheck.reference.options import CEOptions

pytestmark = pytest.mark.torch_versions(
    reason="an oracle: torch ops (and what it compares them with) a torch release can change"
)

mpmath = pytest.importorskip("mpmath")
mp = mpmath.mp

F64 = torch.float64
DIGITS = 50
#: Norm-wise relative agreement required (the oracle's specification: "about 1e-14 relative").
RTOL = 1e-14

Matrix = list[list]


def _mp_matrix(t: torch.Tensor) -> Matrix:
    """Float64 tensor → nested lists of mpf (float64 → mpf is exact)."""
    return (
        [[mp.mpf(float(v)) for v in row] for row in t.tolist()]
        if t.dim() == 2
        else [mp.mpf(float(v)) for v in t.tolist()]
    )


def mp_linear_ce(x: Matrix, W: Matrix, b: list | None, target: list[int], opts: CEOptions, cw: list | None):
    """Loss (scalar, or per-row list for ``none``), per-row lse and per-row total loss, from the definitions.

    logits z_ij = Σ_h x_ih W_jh + b_j, softcapped to s·tanh(z/s); log p_ij = z'_ij − log Σ_k exp z'_ik;
    CE row (PyTorch): (1−ε)·(−w_{y_i} log p_{i,y_i}) + ε·(−Σ_j w_j log p_ij)/V; z-loss row: λ·lse_i².
    mean = Σ CE / Σ_{rows kept} w_{y_i} + Σ z-loss / (rows kept); sum adds; none lists (0 for ignored rows).
    """
    N, V = len(x), len(W)
    eps, lam, s = mp.mpf(opts.label_smoothing), mp.mpf(opts.z_loss_scale), opts.softcap
    w = cw if cw is not None else [mp.mpf(1)] * V
    ce, zl, lses, kept, wsum = [], [], [], 0, mp.mpf(0)
    for i in range(N):
        z = [mp.fsum(a * c for a, c in zip(x[i], W[j])) + (b[j] if b is not None else 0) for j in range(V)]
        if s is not None:
            z = [mp.mpf(s) * mp.tanh(zj / s) for zj in z]
        lse = mp.log(mp.fsum(mp.exp(zj) for zj in z))
        lses.append(lse)
        if target[i] == opts.ignore_index:
            ce.append(mp.mpf(0))
            zl.append(mp.mpf(0))
            continue
        y = target[i]
        logp = [zj - lse for zj in z]
        nll = -w[y] * logp[y]
        smooth = -mp.fsum(w[j] * logp[j] for j in range(V)) / V
        ce.append((1 - eps) * nll + eps * smooth)
        zl.append(lam * lse**2)
        kept += 1
        wsum += w[y]
    rows = [a + c for a, c in zip(ce, zl)]
    if opts.reduction == "none":
        loss = rows
    elif opts.reduction == "sum":
        loss = mp.fsum(rows)
    else:
        loss = mp.fsum(ce) / wsum + mp.fsum(zl) / kept
    return loss, lses, rows


def mp_gradients(x: Matrix, W: Matrix, b: list | None, objective: Callable[[Matrix, Matrix, list | None], object]):
    """∂objective/∂(x, W, b) by mpmath's numerical differentiation (at the working precision, 50 digits)."""

    def partial(which: str, i: int, j: int | None):
        def f(t):
            xx = [row[:] for row in x]
            WW = [row[:] for row in W]
            bb = b[:] if b is not None else None
            if which == "x":
                xx[i][j] = t
            elif which == "W":
                WW[i][j] = t
            else:
                bb[i] = t  # type: ignore[index]
            return objective(xx, WW, bb)

        v = {"x": lambda: x[i][j], "W": lambda: W[i][j], "b": lambda: b[i]}[which]()  # type: ignore[index]
        return mp.diff(f, v)

    gx = [[partial("x", i, j) for j in range(len(x[0]))] for i in range(len(x))]
    gW = [[partial("W", i, j) for j in range(len(W[0]))] for i in range(len(W))]
    gb = [partial("b", i, None) for i in range(len(b))] if b is not None else None
    return gx, gW, gb


#: (reduction, label_smoothing, class_weights, softcap, z_loss_scale, ignore row 1, logit scale)
CASES = {
    "mean-plain": ("mean", 0.0, False, None, 0.0, False, 1.0),
    "mean-smooth-cw": ("mean", 0.3, True, None, 0.0, False, 1.0),
    "mean-everything-ignored-row": ("mean", 0.3, True, 2.0, 0.1, True, 1.0),
    "sum-smooth-cw": ("sum", 0.2, True, None, 0.0, False, 1.0),
    "sum-softcap-saturated": ("sum", 0.0, False, 0.5, 0.0, False, 8.0),
    "none-everything": ("none", 0.25, True, 3.0, 0.05, False, 2.0),
    "none-zloss-ignored-row": ("none", 0.0, False, None, 0.2, True, 1.0),
    "mean-confident": ("mean", 0.1, False, None, 1e-3, False, 20.0),
}


def _assert_rel(name: str, case: str, got: torch.Tensor, want: list, scale_hint: str) -> None:
    __tracebackhide__ = True
    flat_got = got.reshape(-1).tolist()
    flat_want = (
        [want] if not isinstance(want, list) else [v for row in want for v in (row if isinstance(row, list) else [row])]
    )
    scale = max(abs(v) for v in flat_want)
    bound = RTOL * scale
    errs = [abs(mp.mpf(g) - w) for g, w in zip(flat_got, flat_want)]
    k = max(range(len(errs)), key=lambda i: errs[i])
    if errs[k] > bound:
        test = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" ", 1)[0]
        raise AssertionError(
            f"oracle vs mpmath({DIGITS} digits): {name} on case {case}: |error| {mpmath.nstr(errs[k], 3)} > bound "
            f"{mpmath.nstr(bound, 3)} (= {RTOL:g} × max|{name}| {mpmath.nstr(scale, 5)}) at flat index {k} of shape "
            f"{tuple(got.shape)}: oracle {flat_got[k]!r}, mpmath {mpmath.nstr(flat_want[k], 20)}; repro: pytest '{test}' -q"
        )


@pytest.mark.parametrize("case", list(CASES))
def test_oracle_matches_mpmath(case):
    """Loss, lse, per-row loss and grad_x/grad_W/grad_b agree with 50-digit mpmath to 1e-14 relative."""
    reduction, ls, use_cw, softcap, zl, ignore_row, scale = CASES[case]
    g = torch.Generator().manual_seed(len(case))
    N, H, V = 2, 3, 4
    x = torch.randn(N, H, generator=g, dtype=F64)
    W = torch.randn(V, H, generator=g, dtype=F64) * scale / H**0.5
    b = torch.randn(V, generator=g, dtype=F64) * 0.5
    target = torch.tensor([3, 1])
    if case == "mean-confident":  # push row i's logits towards its target: p_y ≈ 1 − 1e-8
        W[3] = x[0] * 7.0
        W[1] = x[1] * 7.0
    if ignore_row:
        target[1] = -100
    cw = torch.rand(V, generator=g, dtype=F64) + 0.5 if use_cw else None
    up = torch.tensor([1.5, -0.75], dtype=F64) if reduction == "none" else torch.tensor(0.625, dtype=F64)
    opts = CEOptions(reduction=reduction, label_smoothing=ls, class_weights=cw, softcap=softcap, z_loss_scale=zl)
    r = linear_ce(x, W, target, b, options=opts, upstream=up, row_chunk=1, vocab_chunk=3)

    with mp.workdps(DIGITS):
        xm, Wm, bm = _mp_matrix(x), _mp_matrix(W), _mp_matrix(b)
        cwm = _mp_matrix(cw) if cw is not None else None
        tl = target.tolist()
        upm = [mp.mpf(float(v)) for v in up.reshape(-1).tolist()]
        loss, lses, rows = mp_linear_ce(xm, Wm, bm, tl, opts, cwm)

        def objective(xx, WW, bb):
            value = mp_linear_ce(xx, WW, bb, tl, opts, cwm)[0]
            return mp.fsum(u * v for u, v in zip(upm, value)) if reduction == "none" else upm[0] * value

        gx, gW, gb = mp_gradients(xm, Wm, bm, objective)
        label = f"[{case}: {opts.describe()}, upstream {up.tolist()}]"
        _assert_rel("loss", label, r.loss, loss, "loss")
        _assert_rel("lse", label, r.lse, lses, "lse")
        _assert_rel("per_row", label, r.per_row, rows, "per_row")
        _assert_rel("grad_x", label, r.grad_x, gx, "grad_x")
        _assert_rel("grad_weight", label, r.grad_weight, gW, "grad_weight")
        _assert_rel("grad_bias", label, r.grad_bias, gb, "grad_bias")
