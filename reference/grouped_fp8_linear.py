"""Float64 oracle of a grouped FP8-quantized linear (mixture-of-experts): one input split by rows among G experts.

With ``x`` ``[M, K]`` split by ``m_splits = (m_0, …, m_{G−1})`` (``Σ m_i = M``) into the row blocks
``x_i = x[o_i : o_i + m_i]`` (``o_i = Σ_{j<i} m_j``), per-expert weights ``W_i`` ``[N, K]``, optional biases
``b_i`` ``[N]`` and the upstream gradient ``dy`` ``[M, N]`` split the same way, expert ``i`` is one quantized linear
(:mod:`reference.fp8_linear`) with quantizers of its own::

    y_i     = Q(x_i)·Q(W_i)ᵀ + b_i          rows o_i … o_i + m_i − 1 of y      [M, N]
    dgrad_i = Q(dy_i)·Q(W_i)                rows o_i … o_i + m_i − 1 of dgrad  [M, K]
    wgrad_i = Q(dy_i)ᵀ·Q(x_i)               wgrad[i]                           [G, N, K]
    bgrad_i = Σ_rows dy_i                   bgrad[i]                           [G, N]

Every scale, per tensor or per block, comes from that expert's own rows: a per-tensor recipe has one scale per
expert and operand, and the blocks of a block recipe (1×128 / 128×1, 128×128, 1×32 / 32×1) tile each ``x_i``,
``dy_i`` and ``W_i`` from its own first row, so a columnwise block (along M) never spans two experts however
unaligned the split sizes are. Each expert's two references (dequantized operands; original operands) are those
of :func:`reference.fp8_linear.quantized_linear` on its tensors, computed by that function.

**Empty experts** (``m_i = 0``, an expert that received no token): no rows of y or dgrad; ``wgrad_i`` and
``bgrad_i`` are empty sums, exactly zero in any arithmetic; the amax of ``x_i`` and ``dy_i`` is 0 (what delayed
scaling records for them, as an amax kernel never run leaves its buffer at 0). ``W_i`` is quantized as always, so
its amax is recorded.

**Delayed scaling** keeps a *per-GEMM* amax history: each expert has its own stored scales for x, W and dy
(``delayed_scales`` is one ``{"x", "w", "dy"}`` dict per expert), and each expert's amaxes are recorded into its
own history.

**save_original_input** (TransformerEngine PR #1865 on ``GroupedLinear``): forward keeps x itself and backward
quantizes each ``x_i`` columnwise from it. Every recipe other than delayed scaling quantizes deterministically
from the source with scales from the expert's own rows, so re-quantizing the original reproduces the forward's
columnwise copy exactly: the oracle's backward operand is computed from the original in both modes and the
outputs are the same. Delayed scaling refuses it (``ValueError``): its stored scale changes between forward and
backward.

Inputs are taken as binary32 values (bf16 and fp16 are exact in it); everything is float64 on the CPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from numcheck.reference.fp8_formats import F64, round_to_fp32
from numcheck.reference.fp8_linear import Fp8LinearReference, quantized_linear
from numcheck.reference.fp8_recipes import Fp8Recipe
from numcheck.reference.fp8_scaling import tensor_amax

#: The outputs of a grouped quantized linear and their shapes: y [M, N], dgrad [M, K], wgrad [G, N, K], bgrad [G, N].
GROUPED_OUTPUTS: tuple[str, ...] = ("y", "dgrad", "wgrad", "bgrad")
#: Outputs laid out by rows of x (expert i owns rows o_i … o_i + m_i − 1) and by expert (index i of dim 0).
ROW_OUTPUTS: tuple[str, ...] = ("y", "dgrad")
EXPERT_OUTPUTS: tuple[str, ...] = ("wgrad", "bgrad")


def split_offsets(m_splits: Sequence[int], M: int | None = None) -> tuple[int, ...]:
    """``(o_0, …, o_G)``: where each expert's rows start, and ``M`` last. ``ValueError`` naming ``m_splits`` for
    an empty sequence, an entry that is not an int ≥ 0, or (given ``M``) a sum other than ``M``."""
    splits = tuple(m_splits)
    if not splits:
        raise ValueError("m_splits is empty: a grouped linear needs at least one expert")
    for i, m in enumerate(splits):
        if isinstance(m, bool) or not isinstance(m, int) or m < 0:
            raise ValueError(f"m_splits[{i}] = {m!r}: every split size must be an int >= 0 (m_splits={splits})")
    offsets = [0]
    for m in splits:
        offsets.append(offsets[-1] + m)
    if M is not None and offsets[-1] != M:
        raise ValueError(f"m_splits={splits} sums to {offsets[-1]}, but x has M={M} rows")
    return tuple(offsets)


def expert_list(
    t: torch.Tensor | Sequence[torch.Tensor] | None, G: int, name: str, shape: tuple[int, ...]
) -> list[torch.Tensor] | None:
    """``t`` (one grouped tensor ``[G, *shape]`` or a sequence of ``G`` tensors of ``shape``) as ``G`` tensors;
    ``None`` stays ``None``. ``ValueError`` naming ``name`` on a count or shape mismatch."""
    if t is None:
        return None
    items = list(t.unbind(0)) if isinstance(t, torch.Tensor) else list(t)
    if len(items) != G:
        raise ValueError(f"{name} holds {len(items)} experts, m_splits names {G}")
    for i, w in enumerate(items):
        if not isinstance(w, torch.Tensor) or tuple(w.shape) != shape:
            got = tuple(w.shape) if isinstance(w, torch.Tensor) else type(w).__name__
            raise ValueError(f"{name}[{i}] must be a tensor of shape {shape}, got {got}")
    return items


@dataclass(frozen=True)
class GroupedFp8LinearReference:
    """The oracle's result for one grouped case (float64, CPU).

    Attributes:
        recipe: the recipe.
        m_splits: the split sizes; ``offsets`` their starts (``offsets[G]`` = M).
        experts: each expert's :class:`~reference.fp8_linear.Fp8LinearReference` (``None`` for an empty one).
        dq, true: ``{output: tensor}`` assembled (module docstring's shapes), dequantized and original reference.
        abs_products: ``{output: Σ|a||b|}`` of the dequantized operands, assembled the same way.
        amax: per expert ``{role: max |t|}`` of its x, W and dy (0 for an empty expert's x and dy).
        save_original_input: the mode the oracle was asked for.
    """

    recipe: Fp8Recipe
    m_splits: tuple[int, ...]
    offsets: tuple[int, ...]
    experts: tuple[Fp8LinearReference | None, ...]
    dq: dict[str, torch.Tensor]
    true: dict[str, torch.Tensor]
    abs_products: dict[str, torch.Tensor]
    amax: tuple[dict[str, float], ...]
    save_original_input: bool = False

    @property
    def G(self) -> int:
        return len(self.m_splits)

    def rows(self, i: int) -> slice:
        """Expert ``i``'s rows of y and dgrad."""
        return slice(self.offsets[i], self.offsets[i + 1])

    def reduction(self, output: str, i: int) -> int:
        """The reduction length of ``output``'s elements of expert ``i`` (K for y, N for dgrad, m_i for wgrad
        and bgrad)."""
        x_shape = self.dq["dgrad"].shape
        return {
            "y": int(x_shape[1]),
            "dgrad": int(self.dq["y"].shape[1]),
            "wgrad": self.m_splits[i],
            "bgrad": self.m_splits[i],
        }[output]


def _f64(t: torch.Tensor) -> torch.Tensor:
    return round_to_fp32(t.detach().to("cpu", F64))


def _check_shapes(x: torch.Tensor, dy: torch.Tensor, w0: torch.Tensor) -> tuple[int, int, int]:
    if x.dim() != 2 or dy.dim() != 2:
        raise ValueError(f"x and dy must be 2-D; got {tuple(x.shape)} and {tuple(dy.shape)}")
    M, K = x.shape
    N = w0.shape[0] if w0.dim() >= 1 else 0
    if tuple(dy.shape) != (M, N):
        raise ValueError(f"dy must be [M, N] = [{M}, {N}], got {tuple(dy.shape)}")
    return int(M), int(K), int(N)


def _empty_expert(w: torch.Tensor, K: int, N: int, has_bias: bool) -> tuple[dict, dict, dict]:
    """dq, true and |products| of an expert with no rows: empty y and dgrad, exactly zero wgrad and bgrad."""
    out = {
        "y": torch.zeros(0, N, dtype=F64),
        "dgrad": torch.zeros(0, K, dtype=F64),
        "wgrad": torch.zeros(N, K, dtype=F64),
    }
    if has_bias:
        out["bgrad"] = torch.zeros(N, dtype=F64)
    return out, dict(out), dict(out)


def grouped_quantized_linear(
    x: torch.Tensor,
    weights: torch.Tensor | Sequence[torch.Tensor],
    dy: torch.Tensor,
    biases: torch.Tensor | Sequence[torch.Tensor] | None,
    m_splits: Sequence[int],
    recipe: Fp8Recipe,
    *,
    delayed_scales: Sequence[dict[str, float]] | None = None,
    save_original_input: bool = False,
) -> GroupedFp8LinearReference:
    """Forward and backward of the grouped quantized linear in float64 (see the module docstring).

    ``weights``: ``[G, N, K]`` or ``G`` tensors ``[N, K]``; ``biases``: ``[G, N]``, ``G`` tensors ``[N]`` or
    ``None``; ``delayed_scales``: one ``{"x", "w", "dy"}`` dict per expert, required for delayed scaling.
    """
    splits = tuple(m_splits)
    G = len(splits)
    w_first = weights[0] if len(weights) else torch.zeros(0)
    M, K, N = _check_shapes(x, dy, w_first)
    offsets = split_offsets(splits, M)
    ws = expert_list(weights, G, "weights", (N, K))
    bs = expert_list(biases, G, "biases", (N,))
    if save_original_input and not recipe.allows_save_original_input:
        raise ValueError(
            "save_original_input=True is not supported with delayed scaling: the stored scale changes "
            "between forward and backward, so the backward could not re-quantize x as the forward did"
        )
    if recipe.kind == "delayed" and (delayed_scales is None or len(delayed_scales) != G):
        raise ValueError(f"delayed scaling needs one delayed_scales dict per expert ({G}), got {delayed_scales!r}")
    experts: list[Fp8LinearReference | None] = []
    parts: dict[str, list[dict]] = {"dq": [], "true": [], "abs": []}
    amax: list[dict[str, float]] = []
    for i in range(G):
        rows = slice(offsets[i], offsets[i + 1])
        b_i = bs[i] if bs is not None else None
        if splits[i] == 0:
            experts.append(None)
            for key, part in zip(("dq", "true", "abs"), _empty_expert(ws[i], K, N, b_i is not None)):
                parts[key].append(part)
            amax.append({"x": 0.0, "w": tensor_amax(ws[i]), "dy": 0.0})
            continue
        scales = delayed_scales[i] if recipe.kind == "delayed" else None  # type: ignore[index]
        ref = quantized_linear(x[rows], ws[i], dy[rows], b_i, recipe, delayed_scales=scales)
        experts.append(ref)
        parts["dq"].append(ref.dq)
        parts["true"].append(ref.true)
        parts["abs"].append(ref.abs_products)
        amax.append(dict(ref.amax))
    dq, true, absp = (_assemble(parts[k]) for k in ("dq", "true", "abs"))
    return GroupedFp8LinearReference(
        recipe, splits, offsets, tuple(experts), dq, true, absp, tuple(amax), bool(save_original_input)
    )


def _assemble(per_expert: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The experts' outputs as the grouped layer's: row outputs concatenated, expert outputs stacked."""
    out: dict[str, torch.Tensor] = {}
    for name in GROUPED_OUTPUTS:
        if name not in per_expert[0]:
            continue
        items = [p[name] for p in per_expert]
        out[name] = torch.cat(items, dim=0) if name in ROW_OUTPUTS else torch.stack(items, dim=0)
    return out


def split_inputs(
    x: torch.Tensor,
    weights: torch.Tensor | Sequence[torch.Tensor],
    dy: torch.Tensor,
    biases: torch.Tensor | Sequence[torch.Tensor] | None,
    m_splits: Sequence[int],
) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]]:
    """Each expert's ``(x_i, W_i, dy_i, b_i)`` as float64 binary32 values (the single linear's inputs)."""
    splits = tuple(m_splits)
    offsets = split_offsets(splits, int(x.shape[0]))
    ws = expert_list(weights, len(splits), "weights", tuple(weights[0].shape))
    bs = expert_list(biases, len(splits), "biases", tuple(biases[0].shape)) if biases is not None else None
    out = []
    for i in range(len(splits)):
        rows = slice(offsets[i], offsets[i + 1])
        out.append((_f64(x[rows]), _f64(ws[i]), _f64(dy[rows]), _f64(bs[i]) if bs is not None else None))
    return out
