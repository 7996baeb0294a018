"""The linear-distill oracle: its analytic backward equals torch.autograd's in float64 under every convention, and
its conventions give the KLs and scalings they name."""

from __future__ import annotations

import itertools

import pytest
import torch

from numcheck.reference.linear_distill import DistillConvention, linear_distill

pytestmark = pytest.mark.torch_versions(
    reason="an oracle: torch ops (and what it compares them with) a torch release can change"
)


def _tensors(N=6, H=5, V=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    xs, ws, xt, wt = (torch.randn(*s, generator=g, dtype=torch.float64) for s in ((N, H), (V, H), (N, H), (V, H)))
    target = torch.randint(0, V, (N,), generator=g)
    target[1] = -100
    return xs, ws, xt, wt, target


def _autograd(xs, ws, xt, wt, target, beta, T, conv, upstream):
    """The loss written out by hand in float64 with torch's own KL and autograd."""
    xs, ws = xs.clone().requires_grad_(), ws.clone().requires_grad_()
    Ts, Tt = conv.temperatures(T)
    lq, lp = torch.log_softmax(xs @ ws.T / Ts, -1), torch.log_softmax(xt @ wt.T / Tt, -1)
    a, b = (lp, lq) if conv.beta_zero == "forward_kl" else (lq, lp)
    kl = lambda first, other: torch.nn.functional.kl_div(other, first, log_target=True, reduction="none").sum(-1)  # noqa: E731
    if beta == 0:
        row = kl(a, b)
    elif beta == 1:
        row = kl(b, a)
    else:
        m = torch.log(beta * a.exp() + (1 - beta) * b.exp())
        row = beta * kl(a, m) + (1 - beta) * kl(b, m)
    kept = target != -100
    D = {"tokens": kept.sum(), "rows": len(target), "sum": 1}[conv.denominator]
    loss = row[kept].sum() / D * (T * T if conv.temperature_squared else 1)
    (loss * upstream).backward()
    return loss.detach(), xs.grad, ws.grad


#: Every convention with the T² factor on (without it, the loss and gradients only lose that factor:
#: test_conventions_name_what_they_compute checks it).
CONVENTIONS = [
    DistillConvention(bz, on, sq, den)
    for bz, on, sq, den in itertools.product(
        ("forward_kl", "reverse_kl"), ("both", "student", "teacher"), (True,), ("tokens", "rows", "sum")
    )
]


@pytest.mark.parametrize("beta", [0.0, 0.3, 0.5, 1.0])
def test_analytic_backward_equals_autograd(beta):
    t = _tensors()
    for conv, T in itertools.product(CONVENTIONS, (2.5,)):
        r = linear_distill(*t, beta=beta, temperature=T, ignore_index=-100, convention=conv, upstream=0.75)
        loss, gx, gw = _autograd(*t, beta, T, conv, 0.75)
        torch.testing.assert_close(r.loss, loss, rtol=1e-12, atol=1e-14, msg=f"{conv} T={T}")
        torch.testing.assert_close(r.grad_x, gx, rtol=1e-10, atol=1e-13, msg=f"{conv} T={T}")
        torch.testing.assert_close(r.grad_weight, gw, rtol=1e-10, atol=1e-13, msg=f"{conv} T={T}")


def test_conventions_name_what_they_compute():
    """β = 0 is KL(p‖q) under forward_kl and KL(q‖p) under reverse_kl; the two conventions swap the endpoints; an
    ignored row contributes nothing; T² scales; the denominators count what they say."""
    t = _tensors()
    fwd, rev = DistillConvention("forward_kl"), DistillConvention("reverse_kl")
    run = lambda beta, conv, **kw: linear_distill(
        *t, beta=beta, temperature=kw.pop("T", 1.0), ignore_index=-100, convention=conv, **kw
    )  # noqa: E731
    assert torch.equal(run(0.0, fwd).loss, run(1.0, rev).loss)
    assert not torch.allclose(run(0.0, fwd).loss, run(0.0, rev).loss)
    torch.testing.assert_close(run(0.3, fwd).loss, run(0.7, rev).loss, rtol=1e-13, atol=0)
    sq = DistillConvention(temperature_squared=True)
    torch.testing.assert_close(run(0.5, sq, T=2.0).loss, 4 * run(0.5, fwd, T=2.0).loss, rtol=1e-14, atol=0)
    rows = DistillConvention(denominator="rows")
    torch.testing.assert_close(run(0.5, rows).loss * 6, run(0.5, fwd).loss * 5, rtol=1e-13, atol=0)
    xs, ws, xt, wt, target = t
    xs2 = xs.clone()
    xs2[1] += 100.0  # the ignored row
    r2 = linear_distill(xs2, ws, xt, wt, target, beta=0.5, temperature=1.0, ignore_index=-100)
    assert torch.equal(r2.loss, run(0.5, fwd).loss) and float(r2.grad_x[1].abs().max()) == 0.0


def test_bad_arguments_are_refused():
    xs, ws, xt, wt, target = _tensors()
    with pytest.raises(ValueError, match="beta"):
        linear_distill(xs, ws, xt, wt, target, beta=1.5, temperature=1.0, ignore_index=-100)
    with pytest.raises(ValueError, match="temperature"):
        linear_distill(xs, ws, xt, wt, target, beta=0.5, temperature=0.0, ignore_index=-100)
    with pytest.raises(ValueError, match="target"):
        linear_distill(xs, ws, xt, wt, target[:2], beta=0.5, temperature=1.0, ignore_index=-100)
