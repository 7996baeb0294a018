"""The toy family's bound: any summation order of n values in a format of unit roundoff u errs by at most
γ_{n−1}·Σ|x_i| (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., §4.2), γ_k = k·u/(1 − k·u)."""

from __future__ import annotations

import torch


def bound(x: torch.Tensor) -> torch.Tensor:
    """The error bound of ``x.sum()`` in ``x``'s dtype, as a float64 scalar tensor."""
    u = torch.finfo(x.dtype).eps / 2
    k = max(x.numel() - 1, 0)
    gamma = k * u / (1 - k * u)
    return torch.tensor(gamma * float(x.to(torch.float64).abs().sum()), dtype=torch.float64)
