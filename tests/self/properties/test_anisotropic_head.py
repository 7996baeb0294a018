"""The ``anisotropic_head`` regime (properties.linear_ce.cases.head_mean): a mean direction shared by the head's rows that
the softmax cannot see, because it is orthogonal to every row of x as the impl's matmul reads it."""

from __future__ import annotations

import pytest
import torch

from numcheck.properties.linear_ce.cases import (
    HEAD_MEAN_RATIO,
    HEAD_REGIME,
    HEAD_SIGMA,
    Problem,
    build,
    head_mean,
    operand_rows,
)

#: float64's unit roundoff: the projection's residual x·m is a few of it relative to |x||m|.
_U64 = 2.0**-53


def _drawn(N: int, H: int, V: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Generator]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N, H, generator=g, dtype=torch.float64) * 30.0  # outlier-sized entries: no help from scale
    w = torch.randn(V, H, generator=g, dtype=torch.float64) / H**0.5
    return x, w, g


@pytest.mark.parametrize("dtype,autocast", [("bfloat16", None), ("float32", "bfloat16"), ("float32", None)])
@pytest.mark.parametrize("seed", range(4))
def test_head_mean_is_orthogonal_to_the_rows_and_leaves_the_softmax_unchanged(dtype, autocast, seed):
    """m is orthogonal (to float64's rounding) to x as the matmul reads it, has the declared length, and the
    float64 softmax of x·(W + m)ᵀ is that of x·Wᵀ: every logit moves by x·m = 0."""
    p = Problem(N=4, H=9, V=300, dtype=dtype, autocast=autocast, regime=HEAD_REGIME, seed=seed)
    x, w, g = _drawn(p.N, p.H, p.V, seed)
    rows = operand_rows(p, x)
    m = head_mean(rows, w, g)
    rms = float(w.pow(2).sum(dim=1).mean().sqrt())
    assert float(m.norm()) == pytest.approx(HEAD_MEAN_RATIO * rms, rel=1e-12)
    k = p.H  # a dot product of length H rounds at most H times
    assert bool(((rows @ m).abs() <= 4 * k * _U64 * (rows.abs() @ m.abs())).all())
    p0 = torch.softmax(rows @ w.T, dim=1)
    p1 = torch.softmax(rows @ (w + m).T, dim=1)
    assert torch.allclose(p1, p0, rtol=1e-10, atol=0.0)


def test_head_regime_needs_fewer_rows_than_features():
    """N ≥ H leaves no direction orthogonal to every row: the Problem names the regime and both sizes."""
    with pytest.raises(ValueError, match=r"anisotropic_head.*N < H.*N=9, H=9"):
        Problem(N=9, H=9, V=300, regime=HEAD_REGIME)
    x, w, g = _drawn(3, 3, 50, 0)
    with pytest.raises(ValueError, match="needs N < H"):
        head_mean(x, w, g)


def test_built_head_logits_are_the_isotropic_draws():
    """build's head problem in fp32: its logits are the post_norm draw's scaled to σ = HEAD_SIGMA (same noise,
    same rows), within the rounding of W + m to fp32 — m moves no logit — and its rows share the mean m."""
    p = Problem(N=3, H=12, V=2000, dtype="float32", regime=HEAD_REGIME, seed=5)
    head, post = build(p), build(p.replace(regime="post_norm"))
    assert torch.equal(head.x, post.x) and torch.equal(head.target, post.target)
    x = head.x.double()
    w_iso = post.weight.double() * (HEAD_SIGMA / 3.0)  # post_norm's σ = 3 (cases.build)
    z_head, z_iso = x @ head.weight.double().T, x @ w_iso.T
    # each weight element rounded once to fp32 (relative 2^-24) in both draws, plus the scaling's rounding
    bound = 2.0**-23 * (x.abs() @ (head.weight.double().abs() + w_iso.abs()).T)
    assert bool(((z_head - z_iso).abs() <= bound).all())
    m = head.weight.double().mean(dim=0) - w_iso.mean(dim=0)
    assert float(m.norm()) == pytest.approx(HEAD_MEAN_RATIO * float(w_iso.pow(2).sum(dim=1).mean().sqrt()), rel=0.05)
