"""A linear+CE problem as one value: shapes, dtypes, options, value regime and seed.

A :class:`Problem` is small, hashable and printable: its ``repr`` is valid Python, which is what the
one-line reproduction commands carry. :func:`build` turns it into tensors, deterministically, from a
``torch.Generator`` seeded with ``problem.seed`` (on CPU, then moved), so a problem means the same tensors
on every machine and device.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Literal, NamedTuple

import torch

from numcheck.reference.options import CEOptions

Regime = Literal["ordinary", "confident", "large", "tiny", "outlier_rows", "post_norm", "anisotropic_head"]
#: The regimes every draw picks from (``strategies.problems``' default, coverage dimension ``regime``).
REGIMES: tuple[str, ...] = ("ordinary", "confident", "large", "tiny", "outlier_rows", "post_norm")
#: The regime of a trained head's draws, drawn only by ``large_vocab``'s covering rows (coverage dimension
#: ``head``, where N < H): it needs a direction orthogonal to every row of x (:func:`head_mean`).
HEAD_REGIME = "anisotropic_head"
#: Every regime :func:`build` takes.
ALL_REGIMES: tuple[str, ...] = (*REGIMES, HEAD_REGIME)
Upstream = Literal["one", "scalar", "per_row"]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}


def dtype_of(name: str | None) -> torch.dtype | None:
    """``"bfloat16"`` → ``torch.bfloat16`` (``None`` stays ``None``); names an unknown dtype in the error."""
    if name is None:
        return None
    try:
        return _DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype name {name!r}; known: {sorted(_DTYPES)}") from None


#: Upstream gradients a problem can take (see :class:`Problem`).
UPSTREAMS = ("one", "scalar", "loss_scale", "per_row")

#: The loss scale of ``upstream="loss_scale"``: torch.amp.GradScaler starts at 2^16 and doubles after 2000
#: steps without overflow. A gradient of the logits multiplied by it *before* the 1/N of ``mean`` leaves
#: fp16's range (65504) wherever |p − y| > 1/2, though the scaled gradient itself, at most 2^17/N, fits.
LOSS_SCALE = 2.0**17


@dataclass(frozen=True)
class Problem:
    """One linear+CE case.

    Attributes:
        N, H, V: tokens, hidden size, vocabulary.
        dtype: dtype name of ``x`` and ``weight`` (the parameters' dtype; ``"float32"`` under AMP).
        autocast: autocast dtype name (``"bfloat16"``/``"float16"``) or ``None``.
        bias: whether a bias is passed; ``bias_dtype`` its dtype name (defaults to ``dtype``).
        ignored: fraction of rows whose target is ``ignore_index`` (0 none, 1 all).
        reduction, label_smoothing, class_weights (bool: draw [V] weights), softcap, z_loss_scale,
        ignore_index: the CE options; ``ignore_index`` may be a class id in [0, V) (a pad token), and then no
            row that is not ignored targets that class.
        upstream: ``"one"`` (backward of 1), ``"scalar"`` (a random scalar), ``"loss_scale"`` (the scalar
            :data:`LOSS_SCALE`, a mixed-precision loss scale; ``mean`` only) or ``"per_row"`` (``none`` only).
        regime: how values are drawn (see :func:`build`).
        seed: the generator seed.
        device: where the tensors live.
    """

    N: int
    H: int
    V: int
    dtype: str = "float32"
    autocast: str | None = None
    bias: bool = False
    bias_dtype: str | None = None
    ignored: float = 0.0
    reduction: str = "mean"
    label_smoothing: float = 0.0
    class_weights: bool = False
    softcap: float | None = None
    z_loss_scale: float = 0.0
    ignore_index: int = -100
    upstream: str = "one"
    regime: str = "ordinary"
    seed: int = 0
    device: str = "cpu"

    def __post_init__(self) -> None:
        for name in ("N", "H", "V"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"Problem.{name} must be a positive int, got {v!r}")
        dtype_of(self.dtype)
        dtype_of(self.autocast)
        dtype_of(self.bias_dtype)
        if self.autocast is not None and self.dtype != "float32":
            raise ValueError(f"Problem.autocast={self.autocast!r} needs dtype='float32' parameters, got {self.dtype!r}")
        if not 0.0 <= self.ignored <= 1.0:
            raise ValueError(f"Problem.ignored must be in [0, 1], got {self.ignored!r}")
        if self.regime not in ALL_REGIMES:
            raise ValueError(f"Problem.regime must be one of {ALL_REGIMES}, got {self.regime!r}")
        if self.regime == HEAD_REGIME and self.N >= self.H:
            raise ValueError(
                f"Problem.regime={HEAD_REGIME!r} needs N < H (its head's mean direction is orthogonal "
                f"to every row of x), got N={self.N}, H={self.H}"
            )
        if self.upstream not in UPSTREAMS:
            raise ValueError(f"Problem.upstream must be one of {UPSTREAMS}, got {self.upstream!r}")
        if self.upstream == "loss_scale" and (self.reduction != "mean" or self.autocast is None):
            raise ValueError(
                "Problem.upstream='loss_scale' needs reduction='mean' under autocast (a loss scale "
                "belongs to mixed precision; under 'sum' the scaled gradients themselves leave "
                "fp16's range, and the scaler would skip the step)"
            )
        if self.upstream == "loss_scale" and self.softcap is not None:
            raise ValueError(
                "Problem.upstream='loss_scale' excludes softcap: s·tanh(z/s) carries ∂L/∂z'·s in the "
                "compute dtype between its ops, past fp16's range where the gradients themselves fit"
            )
        if self.upstream == "per_row" and self.reduction != "none":
            raise ValueError("Problem.upstream='per_row' needs reduction='none'")
        if self.upstream == "scalar" and self.reduction == "none":
            raise ValueError("Problem.upstream='scalar' needs reduction 'mean' or 'sum' ('none' takes 'per_row')")
        if 0 <= self.ignore_index < self.V and self.V < 2:
            raise ValueError(
                f"Problem.ignore_index={self.ignore_index} is the only class of V={self.V}: no class is "
                "left for the rows that are not ignored"
            )
        self.options_template()  # validates the CE options

    # -- derived -------------------------------------------------------------------------------------
    def options_template(self) -> CEOptions:
        """The options without the class-weight tensor (a placeholder flag only)."""
        return CEOptions(
            reduction=self.reduction,
            ignore_index=self.ignore_index,
            label_smoothing=self.label_smoothing,
            softcap=self.softcap,
            z_loss_scale=self.z_loss_scale,
        )

    @property
    def n_ignored(self) -> int:
        """How many rows are ignored (rounded; ``ignored > 0`` ignores at least one row)."""
        k = int(round(self.ignored * self.N))
        if self.ignored > 0 and k == 0:
            k = 1
        if self.ignored < 1 and k == self.N:
            k = self.N - 1
        return k

    @property
    def all_ignored(self) -> bool:
        return self.n_ignored == self.N

    @property
    def features(self) -> frozenset[str]:
        """Option names (as in :data:`impls.protocols.linear_ce.LINEAR_CE_OPTIONS`) this problem uses."""
        out = set(self.options_template().features)
        if self.class_weights:
            out.add("class_weights")
        if self.bias:
            out.add("bias")
        if self.n_ignored:
            out.add("ignore_index")
        return frozenset(out)

    @property
    def param_dtype(self) -> torch.dtype:
        return dtype_of(self.dtype)  # type: ignore[return-value]

    @property
    def compute_dtype(self) -> torch.dtype:
        """The dtype the matmuls run in: the autocast dtype, else the parameters' dtype."""
        return dtype_of(self.autocast) or self.param_dtype  # type: ignore[return-value]

    def replace(self, **changes: Any) -> "Problem":
        return replace(self, **changes)

    def short(self) -> str:
        """Compact label for test ids and tables."""
        amp = f"+amp-{self.autocast}" if self.autocast else ""
        opts = ",".join(sorted(self.features)) or "plain"
        return f"N{self.N}H{self.H}V{self.V}-{self.dtype}{amp}-{self.reduction}-{opts}-{self.regime}-s{self.seed}"


class Tensors(NamedTuple):
    """The tensors of a problem. ``upstream`` is exactly representable in bf16 and fp16."""

    x: torch.Tensor
    weight: torch.Tensor
    target: torch.Tensor
    bias: torch.Tensor | None
    class_weights: torch.Tensor | None
    upstream: torch.Tensor | None
    options: CEOptions


def _round_to_all_low_precisions(t: torch.Tensor) -> torch.Tensor:
    # A value exact in bf16 and in fp16 (and so in fp32): round through bf16, clamp into fp16's normal range.
    t = t.to(torch.bfloat16).to(torch.float32)
    t = t.clamp(-60000.0, 60000.0)
    return torch.where(t.abs() < 2.0**-14, torch.zeros_like(t), t).to(torch.float16).to(torch.float32)


#: post_norm: outlier channels per hidden size (at least one) and the range of their gains.
POST_NORM_OUTLIER_FRACTION = 1 / 32
POST_NORM_OUTLIER_GAIN = (10.0, 100.0)


def _post_norm(
    x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, g: torch.Generator, pad: int | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(x, w, target)`` of the ``post_norm`` regime from the drawn noise ``x`` and ``w``.

    x: noise plus a per-feature offset μ_k ~ N(0, 1) shared by every row (features after a norm layer are not
    zero-mean), each row divided by its RMS (RMSNorm), then a few channels (:data:`POST_NORM_OUTLIER_FRACTION`
    of H, at least one) multiplied by gains drawn in :data:`POST_NORM_OUTLIER_GAIN` (the outlier channels of
    trained transformers). Every column of x then has one sign in most rows, so Σ_i G_ij·x_ik (grad_weight),
    Σ_i G_ij (grad_bias) and the loss grow with N instead of cancelling: an accumulator narrower than declared
    shows. W: the drawn W scaled so the logits' typical size is the regime's σ on these rows (the outlier channels
    would otherwise set it). Targets: token frequencies, Zipf's 1/rank over a random order of the classes, drawn
    apart from the logits (a head mid-training, not yet fitted to the batch): Σ_i (p_ij − y_ij) has one sign per
    frequent class, and times x's column offsets it adds up in grad_weight (targets drawn from the head's own
    softmax would make E[G] = 0, the sums would cancel again). ``pad``, a class id used as ignore_index, is
    never a target."""
    N, H = x.shape
    mu = torch.randn(H, generator=g, dtype=torch.float64)
    h = x + mu
    h = h / h.pow(2).mean(dim=1, keepdim=True).sqrt().clamp_min(1e-30)
    k = max(1, int(H * POST_NORM_OUTLIER_FRACTION))
    channels = torch.randperm(H, generator=g)[:k]
    lo, hi = POST_NORM_OUTLIER_GAIN
    gain = torch.ones(H, dtype=torch.float64)
    gain[channels] = lo + (hi - lo) * torch.rand(k, generator=g, dtype=torch.float64)
    x = h * gain
    w = w * math.sqrt(H / float(x.pow(2).sum(dim=1).mean()))
    V = w.shape[0]
    freq = 1.0 / (torch.randperm(V, generator=g).to(torch.float64) + 1.0)
    if pad is not None:
        freq[pad] = 0.0
    target = torch.multinomial(freq.expand(N, V), 1, replacement=True, generator=g).squeeze(1)
    return x, w, target


#: anisotropic_head, a construction for detection: the head's rows share a mean direction m (trained unembeddings
#: occupy a narrow cone around a common mean, the "representation degeneration" of Gao et al., ICLR 2019; a
#: modelling assumption, no trained head is loaded here), |m| = HEAD_MEAN_RATIO × the RMS length of the drawn
#: rows, so two rows have cosine ≈ r²/(1 + r²) = 0.5. m is orthogonal to every row of x (:func:`head_mean`), so
#: every logit, p, G and target is the isotropic draw's: what changes is only that grad_x's partial sums over
#: classes Σ_{c ≤ k} G_ic·W_c carry s·(p-mass so far − [target passed])·m, up to s·|m|, where the exact grad_x
#: (Σ_c G_ic = 0 under plain CE) has none of it. Still a valid input: a correct impl must be right on any W, and
#: x·m = 0 only makes m the one direction the softmax cannot see. Measured on the bf16-block-summed mutant
#: (tests/self/helpers/mutants.py, N=3, H=9, V=128256, seeds 0–7, grad_x error/bound min/median): r = 1: 6.22/7.65;
#: without the projection off x: 6.41/7.11 (the softmax is shift-invariant; only the logits' |z| changes).
#: docs/detection.md derives the margin.
HEAD_MEAN_RATIO = 1.0
#: anisotropic_head: the logits' typical size σ. A spread softmax (effective classes ≈ V·e^{−σ²}, a third of
#: V at σ = 1; post_norm's σ = 3 leaves ≈ V/8000) puts comparable p-mass in every 128-class block, which is
#: what makes a running sum's increments small against it. Measured as above: σ = 1: 6.22/7.65; σ = 3: 3.60/5.92.
HEAD_SIGMA = 1.0


def operand_rows(p: Problem, x: torch.Tensor) -> torch.Tensor:
    """x [N, H] (float64) as ``p``'s matmul reads it: rounded to the parameters' dtype, then to the compute
    dtype (autocast's cast of the stored x), back in float64."""
    return x.to(p.param_dtype).to(p.compute_dtype).to(torch.float64)


def head_mean(rows: torch.Tensor, w: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """The mean direction m [H] of ``anisotropic_head``: a random direction projected (float64, twice, so the
    residual is at float64's rounding) off the span of ``rows`` [N, H] (x as the impl's matmul reads it), of length
    :data:`HEAD_MEAN_RATIO` × the RMS length of ``w``'s rows. Raises ``ValueError`` when the rows span every
    direction (N ≥ H)."""
    N, H = rows.shape
    q, _ = torch.linalg.qr(rows.T.to(torch.float64))  # [H, N]: an orthonormal basis of the rows' span
    m = torch.randn(H, generator=g, dtype=torch.float64)
    for _ in range(2):
        m = m - q @ (q.T @ m)
    norm = float(m.norm())
    if N >= H or norm < 1e-6:
        raise ValueError(
            f"anisotropic_head: the {N} rows of x span all H={H} directions; no mean direction is "
            "orthogonal to them (needs N < H)"
        )
    rms = float(w.pow(2).sum(dim=1).mean().sqrt())
    return m * (HEAD_MEAN_RATIO * rms / norm)


def build(p: Problem) -> Tensors:
    """Materialize ``p``'s tensors.

    Regimes (logit scale σ is the typical |z|):
        ``ordinary``: x ~ N(0,1), W ~ N(0, σ²/H) with σ ≈ 2; ``large``: σ ≈ 40;
        ``tiny``: σ ≈ 1e-3; ``confident``: x pushed along W[target] until every row's target logit leads by 8 + log V,
        so p_target > 0.9996 (targets W cannot make confident are replaced);
        ``outlier_rows``: ordinary, with a few rows of x scaled by 64;
        ``post_norm``: hidden states as a norm layer hands them to the head (:func:`_post_norm`): per-feature
        mean offsets, rows RMS-normalised, a few outlier channels with gains 10–100, σ ≈ 3 measured on those
        rows, targets at Zipf token frequencies;
        ``anisotropic_head`` (needs N < H): post_norm's rows and targets at σ = :data:`HEAD_SIGMA` (a spread
        softmax), with a head whose rows share a mean direction m orthogonal to every row of x
        (:func:`head_mean`, :data:`HEAD_MEAN_RATIO`): the isotropic draw's logits and softmax, grad_x's partial
        sums over classes carrying m.
    """
    g = torch.Generator(device="cpu").manual_seed(p.seed)
    N, H, V = p.N, p.H, p.V
    sigma = {
        "ordinary": 2.0,
        "confident": 1.0,
        "large": 40.0,
        "tiny": 1e-3,
        "outlier_rows": 2.0,
        "post_norm": 3.0,
        HEAD_REGIME: HEAD_SIGMA,
    }[p.regime]
    x = torch.randn(N, H, generator=g, dtype=torch.float64)
    w = torch.randn(V, H, generator=g, dtype=torch.float64) * (sigma / math.sqrt(H))
    target = torch.randint(0, V, (N,), generator=g)
    pad_class = 0 <= p.ignore_index < V  # a class id used as ignore_index (a pad token): no live row targets it
    if pad_class:
        target = torch.where(target == p.ignore_index, (target + 1) % V, target)
    b = torch.randn(V, generator=g, dtype=torch.float64) * (0.5 * sigma) if p.bias else None
    if p.regime == "confident":
        x, target = _confident(x, w, b, target, p.ignore_index if pad_class else None)
    if p.regime in ("post_norm", HEAD_REGIME):
        x, w, target = _post_norm(x, w, b, g, p.ignore_index if pad_class else None)
    if p.regime == HEAD_REGIME:
        w = w + head_mean(operand_rows(p, x), w, g)
    if p.regime == "outlier_rows" and N > 1:
        k = max(1, N // 8)
        rows = torch.randperm(N, generator=g)[:k]
        x[rows] *= 64.0
    n_ign = p.n_ignored
    if n_ign:
        rows = torch.randperm(N, generator=g)[:n_ign]
        target[rows] = p.ignore_index
    cw = (torch.rand(V, generator=g, dtype=torch.float64) * 1.5 + 0.25) if p.class_weights else None
    return _tensors(p, x, w, target, b, cw, _upstream(p, g))


def _confident(
    x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, target: torch.Tensor, pad: int | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x, target)`` of the ``confident`` regime: every row's target logit made to lead by 8 + log V (targets W
    cannot make confident replaced); ``pad``, a class id used as ignore_index, is never a replacement target."""
    # Every row gets margin z_{i,y} − z_ij ≥ T = 8 + log V over all j ≠ y, so p_target ≥ 1 − (V−1)e^{−T}
    # > 0.9996. Pushing x_i along W_y by lift/|W_y|² raises z_{i,y} by lift and z_ij by lift·c_jy,
    # c_jy = W_j·W_y/|W_y|²: any margin is reached iff every c_jy < 1. Targets with some c_jy > 1/2
    # (likely when H is small; they would need lifts of many T) are replaced, deterministically, by
    # classes with none (else by the class of largest slack, whose rows may then fall short of the margin).
    N, V = x.shape[0], w.shape[0]
    T = 8.0 + math.log(V)
    lift = torch.full((N,), T, dtype=torch.float64)
    if V > 1:
        c = (w @ w.T) / (w * w).sum(dim=1).clamp_min(1e-30)[None, :]
        slack = 1.0 - c.fill_diagonal_(-math.inf).max(dim=0).values  # per class y
        if pad is not None:
            slack[pad] = -math.inf  # never a replacement target
        good = (slack > 0.5).nonzero().squeeze(1)
        if good.numel() == 0:
            good = slack.argmax().reshape(1)
        target = torch.where(slack[target] <= 0.5, good[target % good.numel()], target)
        z0 = x @ w.T + (b if b is not None else 0.0)
        margin = z0.gather(1, target[:, None]) - z0  # [N, V], 0 at the target
        # [N, V]; +inf at the target (c_yy = −inf). A class with c_jy ≥ 1 gains at least as much as the target
        # from any lift: no lift reaches its margin, so it sets none (+inf). Only a fallback target meets one
        # (V = 2 with the other class a pad: seed 1055, N=2049, V=2, ignore_index=0, lifted by 1e12·T before,
        # logits of 1e13); its rows then fall short of the margin.
        one_minus_c = 1.0 - c[:, target].T
        one_minus_c = torch.where(one_minus_c > 0, one_minus_c.clamp_min(1e-12), torch.full_like(one_minus_c, math.inf))
        lift = ((T - margin) / one_minus_c).max(dim=1).values.clamp_min(T)
    wy = w[target]
    return x + wy * (lift[:, None] / (wy * wy).sum(dim=1, keepdim=True).clamp_min(1e-30)), target


def _upstream(p: Problem, g: torch.Generator) -> torch.Tensor | None:
    """The upstream gradient of ``p`` (``None`` for ``"one"``), exact in bf16 and fp16; drawn last from ``g``."""
    if p.upstream == "one":
        return None
    if p.upstream == "loss_scale":
        return torch.tensor(LOSS_SCALE, dtype=torch.float32)
    if p.upstream == "scalar":
        return _round_to_all_low_precisions(torch.rand((), generator=g, dtype=torch.float32) * 3.0 + 0.25)
    return _round_to_all_low_precisions(torch.randn(p.N, generator=g, dtype=torch.float32) * 2.0)


def _tensors(
    p: Problem,
    x: torch.Tensor,
    w: torch.Tensor,
    target: torch.Tensor,
    b: torch.Tensor | None,
    cw: torch.Tensor | None,
    up: torch.Tensor | None,
) -> Tensors:
    """The drawn float64 values in ``p``'s dtypes, on its device, with its CE options."""
    dt = p.param_dtype
    bdt = dtype_of(p.bias_dtype) or dt
    dev = torch.device(p.device)
    opts = CEOptions(
        reduction=p.reduction,
        ignore_index=p.ignore_index,
        label_smoothing=p.label_smoothing,
        class_weights=cw.to(dev, torch.float32) if cw is not None else None,
        softcap=p.softcap,
        z_loss_scale=p.z_loss_scale,
    )
    return Tensors(
        x=x.to(dt).to(dev),
        weight=w.to(dt).to(dev),
        target=target.to(dev),
        bias=b.to(bdt).to(dev) if b is not None else None,
        class_weights=opts.class_weights,
        upstream=up.to(dev) if up is not None else None,
        options=opts,
    )
