"""The megatron label-smoothing convention (ε/(V−1) over the other classes) equals the oracle's PyTorch convention
at ε' = ε·V/(V−1), checked against the formula summed directly in float64 and against F.cross_entropy."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from numcheck.reference.linear_ce import linear_ce
from numcheck.reference.options import CEOptions
from numcheck.reference.smoothing import oracle_smoothing

pytestmark = pytest.mark.torch_versions(
    reason="an oracle: torch ops (and what it compares them with) a torch release can change"
)


@pytest.mark.parametrize("V", [2, 3, 17])
@pytest.mark.parametrize("eps", [0.0, 0.1, 0.4])
def test_megatron_convention_is_torch_at_rescaled_eps(V, eps):
    """ℓ = (1−ε)(−log p_y) + ε/(V−1)·Σ_{j≠y}(−log p_j), summed directly, equals the oracle at ε·V/(V−1)."""
    g = torch.Generator().manual_seed(V)
    x, w = torch.randn(9, 5, generator=g, dtype=torch.float64), torch.randn(V, 5, generator=g, dtype=torch.float64)
    t = torch.randint(0, V, (9,), generator=g)
    logp = torch.log_softmax(x @ w.T, dim=-1)
    nll = -logp.gather(1, t[:, None]).squeeze(1)
    others = -(logp.sum(-1)) - nll
    direct = ((1 - eps) * nll + eps / (V - 1) * others).mean()
    eps_o = oracle_smoothing(eps, V, "megatron")
    ref = linear_ce(x, w, t, None, options=CEOptions(label_smoothing=eps_o)).loss
    assert torch.allclose(ref, direct, rtol=1e-13, atol=1e-15)
    assert torch.allclose(F.cross_entropy(x @ w.T, t, label_smoothing=eps_o), direct, rtol=1e-13)


def test_torch_convention_is_unchanged_and_bad_input_named():
    """'torch' keeps ε; an unknown convention, V < 2 or an ε past (V−1)/V is refused by name."""
    assert oracle_smoothing(0.3, 7, "torch") == 0.3
    with pytest.raises(ValueError, match="convention 'nemo'"):
        oracle_smoothing(0.1, 7, "nemo")
    with pytest.raises(ValueError, match="V >= 2"):
        oracle_smoothing(0.1, 1, "megatron")
    with pytest.raises(ValueError, match="<= \\(V-1\\)/V"):
        oracle_smoothing(0.9, 2, "megatron")
