"""Float64 oracle of a linear head + preference loss (DPO, ORPO, CPO, SimPO, KTO), with its analytic backward.

A batch of ``B = 2P`` completions of ``T`` positions each: ``x`` ``[B, T, H]`` (the hidden states), ``weight``
``[V, H]``, ``bias`` ``[V]`` or ``None``, ``target`` ``[B, T]`` (int64; ``ignore_index`` marks ignored positions).
Which rows are the chosen completions and which the rejected is the declared ``layout``: ``"halves"`` (rows
``0 … P−1`` chosen, ``P … 2P−1`` rejected, pair ``i`` = rows ``i`` and ``P + i``; Liger-Kernel's stacking) or
``"interleaved"`` (pair ``i`` = rows ``2i`` chosen and ``2i + 1`` rejected).

Per position: ``z = x·Wᵀ + b``, ``ℓ_{s,t} = log softmax(z_{s,t})[target_{s,t}]``; per sequence, with ``m_{s,t} = 1``
where the target is not ignored and ``n_s = Σ_t m_{s,t}`` (every sequence has at least one)::

    S_s = Σ_t m_{s,t}·ℓ_{s,t}            a_s = S_s / n_s  (average_log_prob)   or   a_s = S_s

For pair ``i`` with chosen ``c = a_chosen``, rejected ``r = a_rejected`` and, for the losses with a reference model,
the reference model's per-sequence log-probabilities ``ref_c``, ``ref_r`` (inputs, given already reduced the same
way; no gradient flows to them), the per-pair loss ``f_i`` is

* ``dpo``: ``u = β((c − ref_c) − (r − ref_r))``, ``f = −(1−ε)·log σ(u) − ε·log σ(−u)`` (conservative label
  smoothing, cDPO; ε = 0 is the sigmoid DPO loss of Rafailov et al. 2023);
* ``dpo_robust``: same ``u``, ``f = (−(1−ε)·log σ(u) + ε·log σ(−u)) / (1 − 2ε)`` (robust DPO, Chowdhury et al.
  2024; ε ∈ [0, ½));
* ``cpo``: ``u = β(c − r)``, ``f`` as ``dpo`` (Xu et al. 2024);
* ``simpo``: ``u = β(c − r) − γ`` with length-normalised ``a`` (SimPO always averages), ``f`` as ``dpo`` (Meng et
  al. 2024);
* ``orpo``: log-odds ``o(a) = a − log(1 − e^a)`` of the length-normalised ``a`` (ORPO always averages),
  ``f = −β·log σ(o(c) − o(r))`` (Hong et al. 2024; β multiplies the odds-ratio term as in Liger-Kernel);
* ``kto``: unpaired: the chosen completion is desirable, the rejected undesirable, each a term of its own,
  ``f = (1 − σ(β(c − ref_c − κ))) + (1 − σ(−β(r − ref_r − κ)))`` with the reference point ``κ = params.kl``
  (Ethayarajh et al. 2024, with Liger-Kernel's unit weights).

The loss is ``L = Σ_i f_i / D + α·NLL``: ``D = P`` for ``reduction="mean"`` (Liger-Kernel's, the number of pairs;
for KTO, whose terms are per completion, the number of completions ``2P``, as Liger-Kernel's),
``1`` for ``"sum"``; ``NLL = −Σ_{chosen s, t} m_{s,t}·ℓ_{s,t} / D_nll`` with ``D_nll`` the number of non-ignored
positions of the chosen completions (``nll_reduction="tokens"``, Liger-Kernel's) or ``P`` (``"sequences"``);
``α = nll_weight`` (0: no NLL term).

**Backward** (analytic; everything in float64): ``∂L/∂a`` of each sequence from the per-pair derivatives
``f'(u)`` (``dpo``/``cpo``/``simpo``: ``−(1−ε)σ(−u) + εσ(u)``; robust: ``(−(1−ε)σ(−u) − εσ(u))/(1−2ε)``;
``orpo``: ``∂f/∂c = −βσ(−v)/(1 − e^c)`` with ``v = o(c) − o(r)``, and its negative with ``e^r`` for r; ``kto``:
``∂f/∂c = −βσ(z_c)σ(−z_c)``, ``∂f/∂r = +βσ(z_r)σ(−z_r)``), ``÷ D``;
then ``k_{s,t} = m_{s,t}·(∂L/∂a_s / (n_s if averaged else 1) − [s chosen]·α/D_nll)``, the gradient w.r.t. the
logits ``G_{s,t} = k_{s,t}·(e_{target} − p_{s,t})``, and ``grad_x = G·W``, ``grad_W = Gᵀ·x``, ``grad_b = Σ G``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

#: The preference losses of the family.
LOSSES: tuple[str, ...] = ("dpo", "dpo_robust", "orpo", "cpo", "simpo", "kto")
#: Losses whose margin subtracts the reference model's log-probabilities (``ref_logps`` required).
REFERENCE_LOSSES: tuple[str, ...] = ("dpo", "dpo_robust", "kto")
#: Losses defined on length-normalised log-probabilities (``average_log_prob`` is always true for them).
AVERAGED_LOSSES: tuple[str, ...] = ("orpo", "simpo")
#: Losses with label smoothing ε, and the one with the margin γ.
SMOOTHED_LOSSES: tuple[str, ...] = ("dpo", "dpo_robust", "cpo", "simpo")
MARGIN_LOSSES: tuple[str, ...] = ("simpo",)
#: Losses with a reference point κ (``params.kl``), and those whose terms are per completion (unpaired).
REFERENCE_POINT_LOSSES: tuple[str, ...] = ("kto",)
UNPAIRED_LOSSES: tuple[str, ...] = ("kto",)
LAYOUTS: tuple[str, ...] = ("halves", "interleaved")
REDUCTIONS: tuple[str, ...] = ("mean", "sum")
NLL_REDUCTIONS: tuple[str, ...] = ("tokens", "sequences")


@dataclass(frozen=True)
class PreferenceParams:
    """The numbers of one call: β, γ (SimPO's margin), ε (label smoothing), α (the NLL term's weight), κ (KTO's
    reference point ``kl``), whether the
    per-sequence log-probability is the mean over non-ignored positions (``average_log_prob``), the ignored target
    value, and how many pairs one chunk holds (``chunk_pairs``; ``None``: the impl's own choice)."""

    beta: float = 0.1
    gamma: float = 0.0
    label_smoothing: float = 0.0
    nll_weight: float = 0.0
    average_log_prob: bool = False
    ignore_index: int = -100
    chunk_pairs: int | None = None
    kl: float = 0.0


@dataclass(frozen=True)
class Conventions:
    """What an impl declares it computes besides the numbers: the loss, the chosen/rejected layout and the two
    reduction denominators (module docstring)."""

    loss: str = "dpo"
    layout: str = "halves"
    reduction: str = "mean"
    nll_reduction: str = "tokens"

    def averaged(self, params: PreferenceParams) -> bool:
        """Whether the per-sequence log-probability is length-normalised."""
        return self.loss in AVERAGED_LOSSES or params.average_log_prob


@dataclass(frozen=True)
class PreferenceReference:
    """The oracle's outputs and the intermediates the error model reads (all float64)."""

    loss: torch.Tensor  # []
    grad_x: torch.Tensor  # [B, T, H]
    grad_weight: torch.Tensor  # [V, H]
    grad_bias: torch.Tensor | None  # [V]
    logits: torch.Tensor  # [B, T, V]
    logp: torch.Tensor  # [B, T, V] log-softmax
    token_logp: torch.Tensor  # [B, T] ℓ at the target (0 where ignored)
    mask: torch.Tensor  # [B, T] float 0/1
    seq_logp: torch.Tensor  # [B] a_s
    dL_da: torch.Tensor  # [B] ∂L/∂a_s
    k: torch.Tensor  # [B, T] the per-position coefficient of (e_target − p)
    pair_losses: torch.Tensor  # [P] f_i
    nll: torch.Tensor  # [] the NLL term before α


def pair_rows(layout: str, B: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The row indices of the chosen and of the rejected completions, pair by pair, for ``layout``."""
    if B % 2:
        raise ValueError(f"a preference batch holds pairs: B={B} rows is odd")
    P = B // 2
    if layout == "halves":
        return torch.arange(P), torch.arange(P, B)
    if layout == "interleaved":
        return torch.arange(0, B, 2), torch.arange(1, B, 2)
    raise ValueError(f"unknown layout {layout!r}; layouts: {LAYOUTS}")


def margin(conv: Conventions, params: PreferenceParams, c, r, ref_c, ref_r):
    """The argument ``u`` of log σ for the sigmoid-family losses (works on tensors of any dtype)."""
    b = params.beta
    if conv.loss in REFERENCE_LOSSES:
        return b * ((c - ref_c) - (r - ref_r))
    if conv.loss == "simpo":
        return b * (c - r) - params.gamma
    return b * (c - r)


def log_odds(a: torch.Tensor) -> torch.Tensor:
    """ORPO's ``log(p / (1 − p))`` of ``p = e^a`` (``a < 0``)."""
    return a - torch.log1p(-torch.exp(a))


def pair_loss_and_slopes(conv: Conventions, params: PreferenceParams, c, r, ref_c, ref_r):
    """Per pair: ``(f, ∂f/∂c, ∂f/∂r)`` in float64 (module docstring)."""
    ls = torch.nn.functional.logsigmoid
    eps = params.label_smoothing
    if conv.loss == "kto":
        zc, zr = params.beta * (c - ref_c - params.kl), -params.beta * (r - ref_r - params.kl)
        sc, sr = torch.sigmoid(zc), torch.sigmoid(zr)
        return (1 - sc) + (1 - sr), -params.beta * sc * (1 - sc), params.beta * sr * (1 - sr)
    if conv.loss == "orpo":
        v = log_odds(c) - log_odds(r)
        s = torch.sigmoid(-v)
        return -params.beta * ls(v), -params.beta * s / (-torch.expm1(c)), params.beta * s / (-torch.expm1(r))
    u = margin(conv, params, c, r, ref_c, ref_r)
    if conv.loss == "dpo_robust":
        f = (-(1 - eps) * ls(u) + eps * ls(-u)) / (1 - 2 * eps)
        df = (-(1 - eps) * torch.sigmoid(-u) - eps * torch.sigmoid(u)) / (1 - 2 * eps)
    else:
        f = -(1 - eps) * ls(u) - eps * ls(-u)
        df = -(1 - eps) * torch.sigmoid(-u) + eps * torch.sigmoid(u)
    return f, params.beta * df, -params.beta * df


def denominators(conv: Conventions, P: int, chosen_tokens: float) -> tuple[float, float]:
    """``(D, D_nll)``: what the summed pair losses and the NLL are divided by."""
    D = float(P * (2 if conv.loss in UNPAIRED_LOSSES else 1)) if conv.reduction == "mean" else 1.0
    D_nll = float(chosen_tokens) if conv.nll_reduction == "tokens" else float(P)
    return D, D_nll


def _per_position(x, weight, bias, target, ignore_index):
    """Logits, log-softmax, the target's log-probability (0 where ignored) and the mask, in float64."""
    z = x.to(torch.float64) @ weight.to(torch.float64).T
    if bias is not None:
        z = z + bias.to(torch.float64)
    logp = torch.log_softmax(z, dim=-1)
    mask = (target != ignore_index).to(torch.float64)
    safe = torch.where(target == ignore_index, torch.zeros_like(target), target)
    tok = logp.gather(-1, safe.unsqueeze(-1)).squeeze(-1) * mask
    return z, logp, tok, mask, safe


def linear_preference(
    x: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None,
    ref_logps: torch.Tensor | None,
    conv: Conventions,
    params: PreferenceParams,
) -> PreferenceReference:
    """The loss and its gradients in float64 (module docstring). ``ref_logps`` ``[B]`` (row order of ``x``) is
    required by the losses of :data:`REFERENCE_LOSSES` and ignored by the others. Computed, and returned, on the CPU
    whatever device the inputs are on (its own index and zero tensors are made there; the bounds are computed there
    too, and a comparison moves the impl's outputs to the oracle's device)."""
    x, weight, target = x.cpu(), weight.cpu(), target.cpu()
    bias = None if bias is None else bias.cpu()
    B = x.shape[0]
    z, logp, tok, mask, safe = _per_position(x, weight, bias, target, params.ignore_index)
    n = mask.sum(-1)
    if bool((n == 0).any()):
        raise ValueError(f"rows {torch.nonzero(n == 0).flatten().tolist()} have every position ignored")
    averaged = conv.averaged(params)
    a = tok.sum(-1) / n if averaged else tok.sum(-1)
    ci, ri = pair_rows(conv.layout, B)
    ref = torch.zeros(B, dtype=torch.float64) if ref_logps is None else ref_logps.to(torch.float64).cpu()
    if conv.loss in REFERENCE_LOSSES and ref_logps is None:
        raise ValueError(f"loss {conv.loss!r} needs the reference model's log-probabilities (ref_logps)")
    f, dc, dr = pair_loss_and_slopes(conv, params, a[ci], a[ri], ref[ci], ref[ri])
    D, D_nll = denominators(conv, len(ci), float(mask[ci].sum()))
    nll = -tok[ci].sum() / D_nll
    loss = f.sum() / D + params.nll_weight * nll
    dL_da = torch.zeros(B, dtype=torch.float64)
    dL_da[ci], dL_da[ri] = dc / D, dr / D
    per_token = dL_da / n if averaged else dL_da
    chosen = torch.zeros(B, dtype=torch.float64)
    chosen[ci] = 1.0
    k = mask * (per_token - chosen * params.nll_weight / D_nll).unsqueeze(-1)
    onehot = torch.nn.functional.one_hot(safe, z.shape[-1]).to(torch.float64)
    G = k.unsqueeze(-1) * (onehot - logp.exp())
    x64, w64 = x.to(torch.float64), weight.to(torch.float64)
    return PreferenceReference(
        loss=loss,
        grad_x=G @ w64,
        grad_weight=G.reshape(-1, G.shape[-1]).T @ x64.reshape(-1, x64.shape[-1]),
        grad_bias=G.sum((0, 1)) if bias is not None else None,
        logits=z,
        logp=logp,
        token_logp=tok,
        mask=mask,
        seq_logp=a,
        dL_da=dL_da,
        k=k,
        pair_losses=f,
        nll=nll,
    )
