"""The linear+preference float64 oracle (reference/linear_preference.py): its analytic backward against
torch.autograd in float64 for every loss, layout, reduction and option, its forward against the losses written out
pair by pair from their papers' formulas, and its refusals."""

from __future__ import annotations

import math

import pytest
import torch

from numcheck.reference.linear_preference import (
    AVERAGED_LOSSES,
    LOSSES,
    Conventions,
    PreferenceParams,
    linear_preference,
    pair_rows,
)

pytestmark = pytest.mark.torch_versions(reason="an oracle: torch ops a torch release can change")
F64 = torch.float64


def _inputs(P=3, T=5, H=6, V=7, seed=0, bias=True):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2 * P, T, H, generator=g, dtype=F64)
    w = torch.randn(V, H, generator=g, dtype=F64) / H**0.5
    b = torch.randn(V, generator=g, dtype=F64) if bias else None
    target = torch.randint(0, V, (2 * P, T), generator=g)
    target[torch.rand(2 * P, T, generator=g) < 0.3] = -100
    target[:, 0] = torch.randint(0, V, (2 * P,), generator=g)  # every row keeps a position
    ref = -torch.rand(2 * P, generator=g, dtype=F64) * 3 * T
    return x, w, b, target, ref


def _autograd(x, w, b, target, ref, conv, params):
    """The loss written directly (log σ, log1p, sums) and differentiated by torch.autograd."""
    x, w = x.clone().requires_grad_(), w.clone().requires_grad_()
    b = b.clone().requires_grad_() if b is not None else None
    z = x @ w.T + (b if b is not None else 0)
    logp = torch.log_softmax(z, -1)
    m = target != params.ignore_index
    tok = torch.where(m, logp.gather(-1, target.clamp_min(0).unsqueeze(-1)).squeeze(-1), torch.zeros((), dtype=F64))
    avg = conv.loss in AVERAGED_LOSSES or params.average_log_prob
    a = tok.sum(-1) / m.sum(-1) if avg else tok.sum(-1)
    ci, ri = pair_rows(conv.layout, x.shape[0])
    losses = []
    for i, j in zip(ci.tolist(), ri.tolist()):
        losses.append(_one_pair(conv, params, a[i], a[j], ref[i], ref[j]))
    P = len(ci)
    D = (2 * P if conv.loss == "kto" else P) if conv.reduction == "mean" else 1
    D_nll = m[ci].sum() if conv.nll_reduction == "tokens" else P
    loss = torch.stack(losses).sum() / D - params.nll_weight * tok[ci].sum() / D_nll
    loss.backward()
    return loss.detach(), x.grad, w.grad, (b.grad if b is not None else None)


def _one_pair(conv, params, c, r, rc, rr):
    """One pair's loss from its paper's formula."""
    ls, beta, eps = torch.nn.functional.logsigmoid, params.beta, params.label_smoothing
    if conv.loss == "kto":
        return (1 - torch.sigmoid(beta * (c - rc - params.kl))) + (1 - torch.sigmoid(-beta * (r - rr - params.kl)))
    if conv.loss == "orpo":
        odds = lambda a: torch.exp(a) / (1 - torch.exp(a))  # noqa: E731
        return -beta * ls(torch.log(odds(c) / odds(r)))
    u = {
        "dpo": lambda: beta * (c - rc - (r - rr)),
        "dpo_robust": lambda: beta * (c - rc - (r - rr)),
        "cpo": lambda: beta * (c - r),
        "simpo": lambda: beta * (c - r) - params.gamma,
    }[conv.loss]()
    if conv.loss == "dpo_robust":
        return (-(1 - eps) * ls(u) + eps * ls(-u)) / (1 - 2 * eps)
    return -(1 - eps) * ls(u) - eps * ls(-u)


PARAMS = (
    PreferenceParams(beta=0.5),
    PreferenceParams(beta=2.0, gamma=0.7, label_smoothing=0.2, nll_weight=0.6, average_log_prob=True, kl=0.4),
)


#: Each value of each dimension twice, each pair of layout, reduction and option set once.
COVER = (
    ("halves", "mean", "tokens", PARAMS[0], True),
    ("interleaved", "sum", "sequences", PARAMS[1], False),
    ("halves", "sum", "sequences", PARAMS[1], True),
    ("interleaved", "mean", "tokens", PARAMS[1], False),
    ("interleaved", "sum", "tokens", PARAMS[0], True),
)


@pytest.mark.parametrize("loss", LOSSES)
def test_analytic_backward_equals_autograd(loss):
    """Every loss over a covering set of layout × reductions × option set × bias: loss and every gradient within
    1e-12 of autograd's."""
    for layout, red, nll_red, params, bias in COVER:
        conv = Conventions(loss, layout, red, nll_red)
        x, w, b, target, ref = _inputs(bias=bias, seed=hash((layout, red, nll_red, bias)) % 1000)
        o = linear_preference(x, w, target, b, ref, conv, params)
        want = _autograd(x, w, b, target, ref, conv, params)
        for name, got, exp in zip(
            ("loss", "grad_x", "grad_weight", "grad_bias"), (o.loss, o.grad_x, o.grad_weight, o.grad_bias), want
        ):
            if exp is None:
                assert got is None
                continue
            torch.testing.assert_close(got, exp, rtol=1e-12, atol=1e-13, msg=f"{conv} {params}: {name}")


def test_dpo_by_hand():
    """One pair, one position each, V=2, no reference offset: the sigmoid DPO loss of the logits by hand."""
    x = torch.tensor([[[1.0]], [[-1.0]]], dtype=F64)
    w = torch.tensor([[0.5], [-0.5]], dtype=F64)
    target = torch.tensor([[0], [0]])
    ref = torch.tensor([-0.3, -0.9], dtype=F64)
    o = linear_preference(x, w, target, None, ref, Conventions("dpo"), PreferenceParams(beta=0.1))
    lp = lambda z0, z1: z0 - math.log(math.exp(z0) + math.exp(z1))  # noqa: E731
    u = 0.1 * ((lp(0.5, -0.5) + 0.3) - (lp(-0.5, 0.5) + 0.9))
    assert o.loss.item() == pytest.approx(math.log1p(math.exp(-u)), rel=1e-14)


def test_ignored_positions_and_layouts():
    """Ignored positions' inputs change nothing; the interleaved layout of a batch equals the halves layout of its
    rows reordered."""
    x, w, b, target, ref = _inputs()
    conv, params = Conventions("cpo"), PreferenceParams(beta=1.0, nll_weight=1.0)
    o = linear_preference(x, w, target, b, ref, conv, params)
    x2 = x.clone()
    x2[target == -100] = 1e3
    o2 = linear_preference(x2, w, target, b, ref, conv, params)
    assert torch.equal(o.loss, o2.loss) and torch.equal(o.grad_x[target != -100], o2.grad_x[target != -100])
    assert (o2.grad_x[target == -100] == 0).all()
    P = x.shape[0] // 2
    order = torch.stack([torch.arange(P), torch.arange(P, 2 * P)], 1).flatten()
    oi = linear_preference(x[order], w, target[order], b, ref[order], Conventions("cpo", "interleaved"), params)
    torch.testing.assert_close(oi.loss, o.loss, rtol=1e-14, atol=0)
    torch.testing.assert_close(oi.grad_x, o.grad_x[order], rtol=1e-13, atol=1e-15)


def test_refusals():
    """An odd batch, a row without a kept position, and a reference loss without reference log-probabilities are
    refused by name."""
    x, w, b, target, ref = _inputs()
    with pytest.raises(ValueError, match="odd"):
        linear_preference(x[:5], w, target[:5], b, ref[:5], Conventions("cpo"), PreferenceParams())
    t = target.clone()
    t[2] = -100
    with pytest.raises(ValueError, match=r"rows \[2\]"):
        linear_preference(x, w, t, b, ref, Conventions("cpo"), PreferenceParams())
    with pytest.raises(ValueError, match="ref_logps"):
        linear_preference(x, w, target, b, None, Conventions("dpo"), PreferenceParams())
