"""Float64 oracle for fused linear + generalised Jensen–Shannon distillation, with its analytic backward.

Semantics (``docs/linear-distill.md``). A student ``x_s`` ``[N, H]``, ``W_s`` ``[V, H]`` and a frozen teacher
``x_t`` ``[N, H]``, ``W_t`` ``[V, H]``; scaled logits z_s = x_s·W_sᵀ / T_s, z_t = x_t·W_tᵀ / T_t with T_s, T_t the
temperature T on the side(s) :attr:`DistillConvention.temperature_on` names, 1 elsewhere; student q = softmax(z_s),
teacher p = softmax(z_t), per row.

The generalised JSD of mixture weight β ∈ [0, 1] is β·KL(A‖M) + (1−β)·KL(B‖M), M = β·A + (1−β)·B. Which
distribution is A is a convention (:attr:`DistillConvention.beta_zero`): ``"forward_kl"`` (Liger-Kernel's, TRL's)
takes A = p (teacher), B = q (student), and defines β = 0 as the forward KL(p‖q), β = 1 as the reverse KL(q‖p) (the
mixture formula itself gives 0 at both ends); ``"reverse_kl"`` swaps A and B, so β = 0 is KL(q‖p), β = 1 KL(p‖q).

Per row i the loss is ℓ_i (0 on rows whose target equals ``ignore_index``), times T² when
:attr:`DistillConvention.temperature_squared`; the loss is Σ_i ℓ_i / D with D the non-ignored rows (``"tokens"``),
all N rows (``"rows"``, batchmean) or 1 (``"sum"``): :attr:`DistillConvention.denominator`.

Backward (teacher frozen: no gradient reaches x_t or W_t). Per row, with c = upstream·(T² or 1)/D on non-ignored
rows and 0 on ignored ones, the gradient of ℓ w.r.t. z_s is G_z = q ⊙ (g − ⟨q, g⟩) with g = ∂ℓ/∂q:
generalised, g = w·log(q/M), w the mixture weight of q (1−β under ``forward_kl``, β under ``reverse_kl``);
KL(q‖p), g = log(q/p) (+1, which the projection removes); KL(p‖q), G_z = q − p. Then
G = c·G_z / T_s (the gradient w.r.t. the unscaled student logits), grad_x = G·W_s, grad_W = Gᵀ·x_s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

BetaZero = Literal["forward_kl", "reverse_kl"]
TemperatureOn = Literal["both", "student", "teacher"]
Denominator = Literal["tokens", "rows", "sum"]
BETA_ZERO: tuple[str, ...] = ("forward_kl", "reverse_kl")
TEMPERATURE_ON: tuple[str, ...] = ("both", "student", "teacher")
DENOMINATORS: tuple[str, ...] = ("tokens", "rows", "sum")


@dataclass(frozen=True)
class DistillConvention:
    """The conventions libraries differ on (module docstring), as a declaration states them.

    Attributes:
        beta_zero: which KL β = 0 gives: ``"forward_kl"`` KL(teacher‖student) or ``"reverse_kl"``.
        temperature_on: the logits the temperature divides: ``"both"``, ``"student"`` or ``"teacher"``.
        temperature_squared: whether the loss (and its gradients) are multiplied by T².
        denominator: what the summed row losses are divided by: ``"tokens"`` (non-ignored rows), ``"rows"`` (N),
            ``"sum"`` (1).
    """

    beta_zero: BetaZero = "forward_kl"
    temperature_on: TemperatureOn = "both"
    temperature_squared: bool = False
    denominator: Denominator = "tokens"

    def temperatures(self, T: float) -> tuple[float, float]:
        """``(T_s, T_t)``: what the student's and the teacher's logits are divided by."""
        return (
            T if self.temperature_on in ("both", "student") else 1.0,
            T if self.temperature_on in ("both", "teacher") else 1.0,
        )

    def scale(self, T: float) -> float:
        """The loss's factor: T² or 1."""
        return T * T if self.temperature_squared else 1.0


@dataclass(frozen=True)
class DistillResult:
    """The oracle's outputs, float64: ``loss`` (scalar), ``row_loss`` ``[N]`` (ℓ_i, unscaled, 0 where ignored),
    ``grad_x`` ``[N, H]`` and ``grad_weight`` ``[V, H]`` of the student; and what the tolerance model reads: the
    student's and teacher's log-probabilities ``log_q``, ``log_p`` ``[N, V]``, the scaled logits ``z_s``, ``z_t``,
    the kept-row mask ``kept`` ``[N]``, the row factor ``c`` ``[N]`` (upstream·scale/D, 0 where ignored) and the
    gradient w.r.t. the scaled student logits ``G_z`` ``[N, V]`` (per row, before c)."""

    loss: torch.Tensor
    row_loss: torch.Tensor
    grad_x: torch.Tensor
    grad_weight: torch.Tensor
    log_q: torch.Tensor
    log_p: torch.Tensor
    z_s: torch.Tensor
    z_t: torch.Tensor
    kept: torch.Tensor
    c: torch.Tensor
    G_z: torch.Tensor


#: One term c·Σ_j a_j·(log a_j − log o_j) of a row's loss: (c, log a, log o).
Term = tuple[float, torch.Tensor, torch.Tensor]


def log_mixture(log_a: torch.Tensor, log_b: torch.Tensor, beta: float) -> torch.Tensor:
    """log(β·a + (1−β)·b) from log a and log b, for 0 < β < 1."""
    import math

    return torch.logaddexp(log_a + math.log(beta), log_b + math.log1p(-beta))


def jsd_terms(log_q: torch.Tensor, log_p: torch.Tensor, beta: float, beta_zero: str) -> list[Term]:
    """The row loss as terms (:data:`Term`): the generalised JSD of the student's ``log_q`` and the teacher's
    ``log_p`` at ``beta`` under the ``beta_zero`` convention (module docstring)."""
    a, b = (log_p, log_q) if beta_zero == "forward_kl" else (log_q, log_p)
    if beta == 0.0:
        return [(1.0, a, b)]
    if beta == 1.0:
        return [(1.0, b, a)]
    m = log_mixture(a, b, beta)
    return [(beta, a, m), (1.0 - beta, b, m)]


def terms_sum(terms: list[Term]) -> torch.Tensor:
    """Σ over ``terms`` of c·Σ_j a_j·(log a_j − log o_j), per row (a_j = 0 contributes 0)."""
    total = torch.zeros(terms[0][1].shape[:-1], dtype=terms[0][1].dtype, device=terms[0][1].device)
    for c, la, lo in terms:
        a = la.exp()
        total = total + c * torch.where(a > 0, a * (la - lo), torch.zeros_like(a)).sum(-1)
    return total


def student_logit_grad(log_q: torch.Tensor, log_p: torch.Tensor, beta: float, beta_zero: str) -> torch.Tensor:
    """G_z = ∂ℓ/∂z_s per row (module docstring), float64 ``[N, V]``."""
    q = log_q.exp()
    student_first = beta_zero == "reverse_kl"  # A = q under reverse_kl
    if beta in (0.0, 1.0):
        kl_q_first = (beta == 0.0) == student_first  # the KL whose first argument is q: KL(q‖p)
        if not kl_q_first:
            return q - log_p.exp()
        g = log_q - log_p
    else:
        w = beta if student_first else 1.0 - beta
        g = w * (log_q - log_mixture(*((log_q, log_p) if student_first else (log_p, log_q)), beta))
    return q * (g - (q * g).sum(-1, keepdim=True))


def _check(
    xs: torch.Tensor, ws: torch.Tensor, xt: torch.Tensor, wt: torch.Tensor, target: torch.Tensor, beta: float, T: float
) -> None:
    N, H = xs.shape
    if ws.shape[1] != H or xt.shape[0] != N or wt.shape[0] != ws.shape[0] or wt.shape[1] != xt.shape[1]:
        raise ValueError(
            f"linear_distill: shapes disagree: x_s {tuple(xs.shape)}, W_s {tuple(ws.shape)}, x_t {tuple(xt.shape)}, "
            f"W_t {tuple(wt.shape)} (x_s [N, H], W_s [V, H], x_t [N, H_t], W_t [V, H_t])"
        )
    if tuple(target.shape) != (N,):
        raise ValueError(f"linear_distill: target has shape {tuple(target.shape)}, expected ({N},)")
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"linear_distill: beta={beta!r} is outside [0, 1]")
    if not T > 0:
        raise ValueError(f"linear_distill: temperature={T!r} must be > 0")


def linear_distill(
    xs: torch.Tensor,
    ws: torch.Tensor,
    xt: torch.Tensor,
    wt: torch.Tensor,
    target: torch.Tensor,
    *,
    beta: float,
    temperature: float,
    ignore_index: int,
    convention: DistillConvention = DistillConvention(),
    upstream: float = 1.0,
) -> DistillResult:
    """The exact loss and student gradients (module docstring), computed in float64 from the given tensors.

    >>> g = torch.Generator().manual_seed(0)
    >>> xs, ws = torch.randn(3, 4, generator=g), torch.randn(5, 4, generator=g)
    >>> r = linear_distill(xs, ws, xs, ws, torch.zeros(3, dtype=torch.long), beta=0.5, temperature=1.0,
    ...                    ignore_index=-100)
    >>> abs(float(r.loss)) < 1e-15, float(r.grad_weight.abs().max()) < 1e-15  # a student equal to its teacher
    (True, True)
    """
    _check(xs, ws, xt, wt, target, beta, temperature)
    f64 = torch.float64
    xs, ws, xt, wt = (t.detach().to(f64) for t in (xs, ws, xt, wt))
    Ts, Tt = convention.temperatures(temperature)
    z_s, z_t = (xs @ ws.T) / Ts, (xt @ wt.T) / Tt
    log_q, log_p = torch.log_softmax(z_s, -1), torch.log_softmax(z_t, -1)
    kept = target != ignore_index
    row = torch.where(kept, terms_sum(jsd_terms(log_q, log_p, beta, convention.beta_zero)), torch.zeros((), dtype=f64))
    D = {"tokens": float(kept.sum()), "rows": float(xs.shape[0]), "sum": 1.0}[convention.denominator]
    scale = convention.scale(temperature)
    loss = scale * row.sum() / D
    c = torch.where(kept, torch.full_like(row, upstream * scale / D), torch.zeros_like(row))
    G_z = student_logit_grad(log_q, log_p, beta, convention.beta_zero)
    G = c[:, None] * G_z / Ts
    return DistillResult(loss, row, G @ ws, G.T @ xs, log_q, log_p, z_s, z_t, kept, c, G_z)
