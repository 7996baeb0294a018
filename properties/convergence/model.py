"""The tiny language model of the convergence run, its head calls and one training trajectory.

The model: two position embeddings of the previous two tokens, summed (``h0 = E1[t−1] + E2[t−2]``), one residual
tanh MLP (``h = h0 + W2·tanh(W1·h0 + b1)``), and the head under test: ``loss = linear+CE(h, W)`` called through
the impl protocol (``impl(h, W, target, None, reduction="mean", ignore_index=-100)``). Parameters are drawn
in float64 from the seed and kept as master copies in the *master dtype* (float64 for the float64 run, float32
otherwise); each step casts them to the *compute dtype* (the run's dtype), so the head receives ``x`` and
``weight`` in that dtype, as in mixed-precision training with fp32 master weights. SGD with momentum
(``torch.optim.SGD``) updates the master copies.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F

from numcheck.properties.convergence.data import IGNORE_INDEX, MarkovSource

#: A head: ``(x [N, H], weight [V, H], target [N]) -> scalar mean loss`` connected to autograd.
Head = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]

#: The parameters in a fixed order (the distance from float64 concatenates them in it).
PARAMETERS: tuple[str, ...] = ("E1", "E2", "W1", "b1", "W2", "W")


@dataclass(frozen=True)
class ModelShape:
    """Sizes and optimizer settings of the model (defaults: seconds on CPU for tens of steps)."""

    vocab: int = 64
    hidden: int = 32
    ffn: int = 64
    rows: int = 128
    lr: float = 0.2
    momentum: float = 0.9


def initial_parameters(shape: ModelShape, seed: int) -> dict[str, torch.Tensor]:
    """The float64 initial parameters of ``seed`` (scaled so each layer's output has unit-order entries)."""
    g = torch.Generator().manual_seed(seed + 1_000_003)  # a stream apart from the data's
    V, H, Fh = shape.vocab, shape.hidden, shape.ffn
    n = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    return {
        "E1": n(V, H),
        "E2": 0.5 * n(V, H),
        "W1": n(Fh, H) / math.sqrt(H),
        "b1": 0.1 * n(Fh),
        "W2": 0.5 * n(H, Fh) / math.sqrt(Fh),
        "W": n(V, H) / math.sqrt(H),
    }


def impl_head(impl: Any) -> Head:
    """The head of a linear+CE impl (protocol call; the loss of a ``returns_z_loss`` impl is the first of its two
    results). Raises ``TypeError`` naming the impl when it returns no scalar loss tensor with a graph."""

    def head(x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        out = impl(x, weight, target, None, reduction="mean", ignore_index=IGNORE_INDEX)
        loss = out[0] if impl.support.returns_z_loss and isinstance(out, tuple) else out
        if not isinstance(loss, torch.Tensor) or loss.shape != () or not loss.requires_grad:
            raise TypeError(
                f"impl {impl.name!r} returned {type(loss).__name__} "
                f"{tuple(getattr(loss, 'shape', ()))} for reduction='mean'; the convergence run needs a "
                f"scalar loss tensor connected to autograd"
            )
        return loss

    return head


def float64_head(x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The float64 composition ``F.cross_entropy(F.linear(x, W))`` (the oracle run's head; its rounding, ~1e-16
    relative, is far below any run it judges)."""
    return F.cross_entropy(F.linear(x.double(), weight.double()), target, ignore_index=IGNORE_INDEX)


@dataclass
class Trajectory:
    """One training run: the loss of every step's forward (before its update) and the master parameters after
    every update, flattened in :data:`PARAMETERS` order (float64 copies, on CPU)."""

    loss: list[float]
    params: list[torch.Tensor]


def _forward(p: dict[str, torch.Tensor], batch: Any, dtype: torch.dtype, head: Head, device: str) -> torch.Tensor:
    c = {k: v.to(dtype) for k, v in p.items()}
    prev1, prev2, target = (t.to(device) for t in (batch.prev1, batch.prev2, batch.target))
    h0 = c["E1"][prev1] + c["E2"][prev2]
    h = h0 + F.linear(torch.tanh(F.linear(h0, c["W1"], c["b1"])), c["W2"])
    return head(h, c["W"], target)


def train(
    source: MarkovSource,
    shape: ModelShape,
    init: dict[str, torch.Tensor],
    *,
    dtype: torch.dtype,
    head: Head,
    device: str = "cpu",
) -> Trajectory:
    """Train from ``init`` for ``source.steps`` steps with compute dtype ``dtype`` and ``head``; master dtype
    float64 when ``dtype`` is float64, float32 otherwise. A non-finite loss stops nothing: it is recorded."""
    master = torch.float64 if dtype == torch.float64 else torch.float32
    p = {k: init[k].to(device=device, dtype=master).clone().requires_grad_(True) for k in PARAMETERS}
    opt = torch.optim.SGD(list(p.values()), lr=shape.lr, momentum=shape.momentum)
    losses: list[float] = []
    params: list[torch.Tensor] = []
    for step in range(source.steps):
        opt.zero_grad(set_to_none=True)
        loss = _forward(p, source.batch(step), dtype, head, device)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
        params.append(torch.cat([p[k].detach().reshape(-1).double().cpu() for k in PARAMETERS]))
    return Trajectory(loss=losses, params=params)
