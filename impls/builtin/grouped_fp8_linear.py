"""Built-in grouped FP8 linears (mixture-of-experts): a per-expert loop, a fused-style one, one on
``torch._scaled_grouped_mm``; the protocol is :mod:`impls.protocols.grouped_fp8_linear`.

* ``grouped_fp8_linear[loop]`` calls the single FP8 linear (:class:`impls.builtin.fp8_linear.Fp8Linear`, the
  built-in of the recipe's kind) once per expert on its rows; an expert with no rows contributes an empty block
  whose backward gives exact-zero weight and bias gradients (and records amax 0 for its x and dy under delayed
  scaling).
* ``grouped_fp8_linear[fused]`` quantizes the whole input at once: per-tensor recipes take one amax per split
  (a segmented reduction over the rows, 0 for an empty split) and scale each row by its split's scale; rowwise
  blocks (1×128, 1×32) run along K inside one row, so they are the whole tensor's; columnwise blocks (128×1, 32×1,
  along M) restart at every split boundary (a block id per row, a segmented amax per block and column). Its GEMMs
  run per expert through :meth:`Fp8Linear.gemm_nt` on the expert's slice of the quantized tensors, so its outputs
  are bitwise the loop's. It also accumulates wgrad into a given fp32 ``main_grad`` (fp32 GEMM result, fp32 add).
* ``grouped_fp8_linear[scaled_grouped_mm]`` (CUDA, where the probe
  :func:`impls.measure.capabilities.scaled_grouped_mm` passes on the tensor's device) quantizes as the fused one
  (per-tensor current scaling, E4M3) and runs fprop and dgrad as one ``torch._scaled_grouped_mm`` each (2-D FP8
  rows × 3-D per-expert FP8 weights, ``offs`` the split ends, per-row fp32 scales) and wgrad as one 2-D × 2-D call
  split along the reduction; bf16 output. Empty experts are left out of the calls (their gradients are zero).

The methods of :class:`GroupedFusedLinear` named in its docstring are the seams the mutants of
``tests/self/helpers/grouped_fp8_mutants.py`` override.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from numcheck.impls.builtin.fp8_linear import Fp8Linear, check_recipe_call
from numcheck.impls.measure import capabilities
from numcheck.impls.protocols.fp8_linear import DelayedScalingState
from numcheck.impls.protocols.grouped_fp8_linear import GROUPED_KIND, GroupedFp8Support
from numcheck.reference.fp8_formats import DTYPE_MAX, FP32_MAX, Fp8Format
from numcheck.reference.fp8_recipes import RECIPE_KINDS, Fp8Recipe, standard_recipes
from numcheck.reference.grouped_fp8_linear import expert_list, split_offsets
from numcheck.reference.numerics.fp8_linear import (
    QTensor,
    accumulation_declaration,
    e8m0_scale_inv,
    k_major_fp32,
    pow2_f32,
    tensor_amax,
)

_ALL_DTYPES = frozenset({torch.float32, torch.bfloat16, torch.float16})


@dataclass(frozen=True)
class Call:
    """One call's arguments, checked: the experts' weights and biases as lists, the split offsets."""

    recipe: Fp8Recipe
    m_splits: tuple[int, ...]
    offsets: tuple[int, ...]
    ws: list[torch.Tensor]
    bs: list[torch.Tensor] | None
    grouped: bool
    soi: bool
    states: tuple[DelayedScalingState, ...] | None
    main_grad: list[torch.Tensor] | None

    @property
    def G(self) -> int:
        return len(self.m_splits)

    def rows(self, i: int) -> slice:
        return slice(self.offsets[i], self.offsets[i + 1])

    def state(self, i: int) -> DelayedScalingState | None:
        return self.states[i] if self.states is not None else None


class GroupedBase:
    """What the built-ins share: the declaration, the single linears per recipe kind, the call's checks."""

    kind = GROUPED_KIND

    def __init__(self, name: str, description: str = "", **support: Any) -> None:
        self.name = name
        self.description = description
        fields = dict(
            recipes=standard_recipes(),
            dtypes=_ALL_DTYPES,
            save_original_input=frozenset({False, True}),
            bias=True,
            **accumulation_declaration("current"),
        )
        fields.update(support)
        self.support = GroupedFp8Support(**fields)
        kinds = sorted({r.kind for r in self.support.recipes}, key=RECIPE_KINDS.index)
        self.single = {
            k: Fp8Linear(f"{name}/{k}", tuple(r for r in self.support.recipes if r.kind == k)) for k in kinds
        }

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

    def check(
        self,
        x: torch.Tensor,
        weights: Any,
        biases: Any,
        m_splits: Any,
        recipe: Any,
        soi: bool,
        states: Any,
        main_grad: Any,
    ) -> Call:
        """The call's arguments checked against the protocol and this declaration (``ValueError`` naming what)."""
        if not isinstance(recipe, Fp8Recipe) or recipe.kind not in self.single:
            raise ValueError(f"{self.name}: recipe must be an Fp8Recipe of kind {sorted(self.single)}, got {recipe!r}")
        if x.dim() != 2:
            raise ValueError(f"{self.name}: x must be [M, K], got {tuple(x.shape)}")
        splits = tuple(m_splits) if isinstance(m_splits, (list, tuple)) else m_splits
        grouped = isinstance(weights, torch.Tensor)
        G = len(splits) if isinstance(splits, tuple) else -1
        N = int(weights.shape[1] if grouped else weights[0].shape[0]) if len(weights) else 0
        why = self.support.split_refusal(
            splits if isinstance(splits, tuple) else (splits,), int(x.shape[0]), K=int(x.shape[1]), N=N
        )
        if why:
            raise ValueError(f"{self.name}: m_splits outside the declaration: {why}")
        ws = expert_list(weights, G, f"{self.name}: weights", (N, int(x.shape[1])))
        bs = expert_list(biases, G, f"{self.name}: biases", (N,))
        if recipe.kind == "delayed" and not (
            isinstance(states, tuple) and len(states) == G and all(isinstance(s, DelayedScalingState) for s in states)
        ):
            raise ValueError(
                f"{self.name}: delayed scaling needs scaling_state = one DelayedScalingState per expert "
                f"({G}), got {states!r}"
            )
        check_recipe_call(self.name, recipe.kind, recipe, soi, states[0] if recipe.kind == "delayed" else None)
        mg = None
        if main_grad is not None:
            if True not in self.support.fused_wgrad_accumulation:
                raise ValueError(f"{self.name}: main_grad (fused wgrad accumulation) is not declared")
            mg = expert_list(main_grad, G, f"{self.name}: main_grad", (N, int(x.shape[1])))
            if any(t.dtype != torch.float32 for t in mg):
                raise ValueError(f"{self.name}: main_grad must be float32")
        if grouped != ("grouped" in self.support.weight_layouts) and not (
            {"grouped", "list"} <= self.support.weight_layouts
        ):
            raise ValueError(f"{self.name}: weights given as {'one tensor' if grouped else 'a list'}, not declared")
        return Call(recipe, splits, split_offsets(splits), ws, bs, grouped, bool(soi), states, mg)


# -- the per-expert loop ---------------------------------------------------------------------------------------
class _EmptyExpert(torch.autograd.Function):
    """An expert with no rows: an empty ``[0, N]`` block of y whose backward gives exact-zero gradients of its
    weight and bias (and records amax 0 for its x and dy under delayed scaling)."""

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, state: DelayedScalingState | None
    ) -> torch.Tensor:
        if state is not None:
            state.record("x", 0.0)
            state.record("w", tensor_amax(k_major_fp32(weight, "rowwise")))
        ctx.state, ctx.has_bias = state, bias is not None
        ctx.shapes = (tuple(weight.shape), weight.dtype, bias.dtype if bias is not None else None)
        return x.new_zeros(0, weight.shape[0])

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor):  # type: ignore[override]
        if ctx.state is not None:
            ctx.state.record("dy", 0.0)
        shape, w_dtype, b_dtype = ctx.shapes
        dw = torch.zeros(shape, dtype=w_dtype, device=dy.device)
        db = torch.zeros(shape[0], dtype=b_dtype, device=dy.device) if ctx.has_bias else None
        return None, dw, db, None


class GroupedLoopLinear(GroupedBase):
    """``grouped_fp8_linear[loop]``: the single FP8 linear once per expert (module docstring)."""

    def __call__(
        self,
        x: torch.Tensor,
        weights: Any,
        biases: Any = None,
        *,
        m_splits: Sequence[int],
        recipe: Fp8Recipe,
        save_original_input: bool,
        scaling_state: Any = None,
        main_grad: Any = None,
    ) -> torch.Tensor:
        c = self.check(x, weights, biases, m_splits, recipe, save_original_input, scaling_state, main_grad)
        lin = self.single[recipe.kind]
        blocks = []
        for i in range(c.G):
            b_i = c.bs[i] if c.bs is not None else None
            if c.m_splits[i] == 0:
                blocks.append(_EmptyExpert.apply(x, c.ws[i], b_i, c.state(i)))
            else:
                blocks.append(
                    lin(x[c.rows(i)], c.ws[i], b_i, recipe=recipe, save_original_input=c.soi, scaling_state=c.state(i))
                )
        return torch.cat(blocks, dim=0)


# -- the fused-style impl -----------------------------------------------------------------------------------------
@dataclass
class SplitQuantized:
    """A row-split operand ``[M, C]`` (x or dy) quantized for one usage, in its own orientation: FP8 ``data``, and
    per expert the scales. Per-tensor: ``scale_inv`` ``[G]``. Rowwise blocks: ``scale_inv`` (and ``code``) per row
    ``[M, nbC]``. Columnwise blocks: per block of rows ``[nbR_total, C]``, expert ``i``'s blocks from
    ``block_start[i]``."""

    data: torch.Tensor
    scale_inv: torch.Tensor
    code: torch.Tensor | None
    usage: str
    per_tensor: bool
    block: tuple[int, int] | None
    block_start: tuple[int, ...]
    fmt: Fp8Format

    def expert(self, c: Call, i: int) -> QTensor:
        """Expert ``i``'s part as the K-major :class:`QTensor` the single linear's GEMM takes (bitwise what
        :meth:`Fp8Linear.quantize_operand` gives for its rows)."""
        rows = c.rows(i)
        data = self.data[rows]
        if self.usage == "columnwise":
            data = data.t()
        data = data.contiguous()
        if self.per_tensor:
            return QTensor(data, self.scale_inv[i].clone(), None, (data.shape[0], data.shape[1]), self.fmt)
        if self.usage == "rowwise":
            si, code = self.scale_inv[rows], self.code[rows] if self.code is not None else None
            return QTensor(data, si.contiguous(), code.contiguous() if code is not None else None, self.block, self.fmt)
        blk = slice(self.block_start[i], self.block_start[i + 1])
        si = self.scale_inv[blk].t().contiguous()
        code = self.code[blk].t().contiguous() if self.code is not None else None
        return QTensor(data, si, code, (self.block[1], self.block[0]), self.fmt)

    def saved(self) -> tuple[torch.Tensor, ...]:
        """What save_original_input=False keeps: the data and the scales (or E8M0 codes)."""
        return (self.data, self.code if self.code is not None else self.scale_inv)


class GroupedFusedLinear(GroupedBase):
    """``grouped_fp8_linear[fused]`` (module docstring). Seams: :meth:`row_offsets`, :meth:`split_amax`,
    :meth:`split_scales`, :meth:`column_block_ids`, :meth:`dy_quantizer_of`, :meth:`original_x_to_save`,
    :meth:`requantize_saved_x`, :meth:`wgrad_buffer`, :meth:`accumulate_main_grad`."""

    def __call__(
        self,
        x: torch.Tensor,
        weights: Any,
        biases: Any = None,
        *,
        m_splits: Sequence[int],
        recipe: Fp8Recipe,
        save_original_input: bool,
        scaling_state: Any = None,
        main_grad: Any = None,
    ) -> torch.Tensor:
        c = self.check(x, weights, biases, m_splits, recipe, save_original_input, scaling_state, main_grad)
        c = Call(
            c.recipe, c.m_splits, self.row_offsets(c.m_splits), c.ws, c.bs, c.grouped, c.soi, c.states, c.main_grad
        )
        w_args = (weights,) if c.grouped else tuple(c.ws)
        b_args = () if biases is None else ((biases,) if isinstance(biases, torch.Tensor) else tuple(c.bs))
        return _FusedFunction.apply(self, c, len(w_args), isinstance(biases, torch.Tensor), x, *w_args, *b_args)

    # -- seams ----------------------------------------------------------------------------------------------
    def row_offsets(self, m_splits: tuple[int, ...]) -> tuple[int, ...]:
        """Where each expert's rows start (and M): the cumulative split sizes."""
        return split_offsets(m_splits)

    def split_amax(self, t32: torch.Tensor, c: Call) -> torch.Tensor:
        """fp32 ``[G]``: max |t| over each expert's rows, NaN ignored, 0 for an expert with no rows (a segmented
        max over the rows' maxima, starting from 0)."""
        a = t32.abs()
        a = torch.where(torch.isnan(a), torch.zeros_like(a), a)
        row_max = a.amax(dim=1) if a.shape[1] else torch.zeros(a.shape[0], device=a.device)
        lengths = torch.tensor([c.offsets[i + 1] - c.offsets[i] for i in range(c.G)], device=a.device)
        expert = torch.repeat_interleave(torch.arange(c.G, device=a.device), lengths)
        out = torch.zeros(c.G, dtype=torch.float32, device=a.device)
        return out.scatter_reduce(0, expert, row_max, "amax", include_self=True)

    def split_scales(
        self, amax: torch.Tensor, fmt: Fp8Format, recipe: Fp8Recipe, role: str, c: Call, experts: Sequence[int]
    ) -> torch.Tensor:
        """fp32 ``[G]``: each expert's per-tensor scale of ``role``: the stored one of the quantizer of
        ``experts[i]`` (delayed), or TE's rule on its amax (current)."""
        if recipe.kind == "delayed":
            return torch.stack([c.states[e].scale_tensor(role, amax.device) for e in experts])  # type: ignore[index]
        lin = self.single[recipe.kind]
        return lin.scale_from_amax(
            amax,
            fmt.max_finite,
            power_of_2=bool(recipe.power_of_2_scales),
            epsilon=recipe.amax_epsilon,
            value_for_inf=FP32_MAX,
        )

    def column_block_ids(self, c: Call, b: int, device: torch.device) -> tuple[torch.Tensor, tuple[int, ...]]:
        """Per row, the id of its columnwise block (blocks of ``b`` rows restarting at each expert's first row), and
        where each expert's blocks start (and the total)."""
        ids, starts = [], [0]
        for i in range(c.G):
            m = c.offsets[i + 1] - c.offsets[i]
            ids.append(starts[-1] + torch.arange(m, device=device) // b)
            starts.append(starts[-1] + -(-m // b))
        return torch.cat(ids) if ids else torch.zeros(0, dtype=torch.long, device=device), tuple(starts)

    def dy_quantizer_of(self, i: int, c: Call) -> int:
        """Whose quantizer (scaling state, scale) expert ``i``'s dy is quantized with in backward: its own."""
        return i

    def original_x_to_save(self, x: torch.Tensor) -> torch.Tensor:
        """What save_original_input=True keeps for backward: the caller's x itself."""
        return x

    def requantize_saved_x(self, x: torch.Tensor, c: Call) -> SplitQuantized:
        """save_original_input=True: x quantized columnwise in backward from the saved original, per expert."""
        return self.quantize_split(x, c, "x", "columnwise", record=False)

    def wgrad_buffer(self, c: Call, shape: tuple[int, int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """The ``[G, N, K]`` weight gradient the experts' GEMMs write into: zeros (an empty expert's stays zero)."""
        return torch.zeros((c.G, *shape), dtype=dtype, device=device)

    def accumulate_main_grad(self, main_grad: torch.Tensor, wgrad32: torch.Tensor) -> None:
        """Fused wgrad accumulation: the fp32 GEMM result added into fp32 ``main_grad`` in place."""
        main_grad.add_(wgrad32)

    # -- the GEMMs, per expert through the single linear's GEMM -------------------------------------------------
    def fprop(self, c: Call, qx: SplitQuantized, qws: list[QTensor]) -> torch.Tensor:
        """fp32 ``[M, N]``: each expert's rows of ``Q(x)·Q(W_i)ᵀ``."""
        lin = self.single[c.recipe.kind]
        y32 = torch.zeros(qx.data.shape[0], qws[0].data.shape[0], dtype=torch.float32, device=qx.data.device)
        for i in range(c.G):
            if c.m_splits[i]:
                y32[c.rows(i)] = lin.gemm_nt(qx.expert(c, i), qws[i])
        return y32

    def dgrad(self, c: Call, qdy: SplitQuantized, qwcs: list[QTensor]) -> torch.Tensor:
        """fp32 ``[M, K]``: each expert's rows of ``Q(dy)·Q(W_i)``."""
        lin = self.single[c.recipe.kind]
        out = torch.zeros(qdy.data.shape[0], qwcs[0].data.shape[0], dtype=torch.float32, device=qdy.data.device)
        for i in range(c.G):
            if c.m_splits[i]:
                out[c.rows(i)] = lin.gemm_nt(qdy.expert(c, i), qwcs[i])
        return out

    def wgrad(self, c: Call, qdyc: SplitQuantized, qxc: SplitQuantized) -> list[torch.Tensor | None]:
        """Per expert the fp32 ``Q(dy_i)ᵀ·Q(x_i)`` ``[N, K]``; ``None`` for an empty expert (its gradient is 0)."""
        lin = self.single[c.recipe.kind]
        return [lin.gemm_nt(qdyc.expert(c, i), qxc.expert(c, i)) if c.m_splits[i] else None for i in range(c.G)]

    # -- quantization ------------------------------------------------------------------------------------
    def quantize_split(
        self, t: torch.Tensor, c: Call, role: str, usage: str, *, record: bool, experts: Sequence[int] | None = None
    ) -> SplitQuantized:
        """The row-split operand ``t`` ``[M, C]`` quantized for ``usage`` at once (module docstring); delayed
        scaling records each expert's amax into its own state when ``record``."""
        recipe, lin = c.recipe, self.single[c.recipe.kind]
        fmt = recipe.format_of(role)
        t32 = t.detach().to(torch.float32).contiguous()
        experts = list(range(c.G)) if experts is None else list(experts)
        if recipe.kind in ("delayed", "current"):
            amax = self.split_amax(t32, c)
            if record and recipe.kind == "delayed":
                for i in range(c.G):
                    c.states[experts[i]].record(role, amax[i])  # type: ignore[index]
            scale = self.split_scales(amax, fmt, recipe, role, c, experts)
            lengths = torch.tensor([c.offsets[i + 1] - c.offsets[i] for i in range(c.G)], device=t32.device)
            data = lin.cast(t32, torch.repeat_interleave(scale, lengths)[:, None], fmt)
            return SplitQuantized(data, torch.ones_like(scale) / scale, None, usage, True, None, (), fmt)
        if usage == "rowwise":  # 1×b blocks along C lie inside one row: the whole tensor's blocks are the experts'
            q = lin.quantize_operand(t, recipe, role, "rowwise", None, record=False)
            return SplitQuantized(q.data, q.scale_inv, q.code, usage, False, q.block, (), fmt)
        return self._column_blocks(t32, t.dtype, c, role, fmt)

    def _column_blocks(
        self, t32: torch.Tensor, dtype: torch.dtype, c: Call, role: str, fmt: Fp8Format
    ) -> SplitQuantized:
        """Columnwise block quantization (b×1 along M) with blocks restarting at every expert's first row."""
        recipe, lin = c.recipe, self.single[c.recipe.kind]
        b = recipe.block_of(role, "columnwise")[0]  # type: ignore[index]
        ids, starts = self.column_block_ids(c, b, t32.device)
        a = t32.abs()
        a = torch.where(torch.isnan(a), torch.zeros_like(a), a)
        amax = torch.zeros(starts[-1], t32.shape[1], dtype=torch.float32, device=t32.device)
        amax = amax.scatter_reduce(0, ids[:, None].expand_as(a), a, "amax", include_self=True)
        code = None
        if recipe.kind == "blockwise":
            scale = lin.scale_from_amax(
                amax,
                fmt.max_finite,
                power_of_2=bool(recipe.power_of_2_scales),
                epsilon=recipe.amax_epsilon,
                value_for_inf=DTYPE_MAX.get(dtype, FP32_MAX),
            )
            scale_inv = torch.ones_like(scale) / scale
        else:
            code = lin.mx_scale_code(amax, fmt, recipe.mx_scale_rounding)
            scale = torch.where(code == 255, torch.full_like(amax, float("nan")), pow2_f32(127 - code))
            scale_inv = e8m0_scale_inv(code)
            code = code.to(torch.uint8)
        data = lin.cast(t32, scale[ids], fmt)
        return SplitQuantized(data, scale_inv, code, "columnwise", False, (b, 1), starts, fmt)


class _FusedFunction(torch.autograd.Function):
    """Forward and backward of :class:`GroupedFusedLinear` (the tensors: x, the weights, the biases)."""

    @staticmethod
    def forward(
        ctx: Any, impl: GroupedFusedLinear, c: Call, n_w: int, b_grouped: bool, x: torch.Tensor, *wb: torch.Tensor
    ) -> torch.Tensor:
        lin = impl.single[c.recipe.kind]
        qx = impl.quantize_split(x, c, "x", "rowwise", record=True)
        qws = [lin.quantize_operand(w, c.recipe, "w", "rowwise", c.state(i), record=True) for i, w in enumerate(c.ws)]
        y32 = impl.fprop(c, qx, qws)
        if c.bs is not None:
            for i in range(c.G):
                y32[c.rows(i)] += c.bs[i].to(torch.float32)
        ctx.impl, ctx.call, ctx.n_w, ctx.b_grouped = impl, c, n_w, b_grouped
        ctx.meta = (x.dtype, [w.dtype for w in wb[:n_w]], [b.dtype for b in wb[n_w:]])
        if c.soi:
            ctx.save_for_backward(impl.original_x_to_save(x), *wb[:n_w])
        else:
            qxc = impl.quantize_split(x, c, "x", "columnwise", record=False)
            ctx.qxc = (qxc.usage, qxc.per_tensor, qxc.block, qxc.block_start, qxc.fmt, qxc.code is not None)
            ctx.save_for_backward(*qxc.saved(), *wb[:n_w])
        return y32.to(x.dtype)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor):  # type: ignore[override]
        impl, c, n_w = ctx.impl, ctx.call, ctx.n_w
        lin = impl.single[c.recipe.kind]
        saved = ctx.saved_tensors
        if c.soi:
            qxc = impl.requantize_saved_x(saved[0], c)
        else:
            usage, per_tensor, block, starts, fmt, is_mx = ctx.qxc
            s = saved[1]
            qxc = SplitQuantized(
                saved[0],
                e8m0_scale_inv(s) if is_mx else s,
                s if is_mx else None,
                usage,
                per_tensor,
                block,
                starts,
                fmt,
            )
        dy = dy.contiguous()
        owners = [impl.dy_quantizer_of(i, c) for i in range(c.G)]
        qdy = impl.quantize_split(dy, c, "dy", "rowwise", record=True, experts=owners)
        qdyc = impl.quantize_split(dy, c, "dy", "columnwise", record=False, experts=owners)
        x_dtype, w_dtypes, b_dtypes = ctx.meta
        qwcs = [
            lin.quantize_operand(w, c.recipe, "w", "columnwise", c.state(i), record=False) for i, w in enumerate(c.ws)
        ]
        dgrad32 = impl.dgrad(c, qdy, qwcs)
        wgrads32 = impl.wgrad(c, qdyc, qxc)
        N, K = c.ws[0].shape
        wgrad = impl.wgrad_buffer(c, (N, K), w_dtypes[0], dy.device)
        for i, wg32 in enumerate(wgrads32):
            if wg32 is None:
                continue
            if c.main_grad is not None:
                impl.accumulate_main_grad(c.main_grad[i], wg32)
            else:
                wgrad[i] = wg32.to(w_dtypes[0])
        dws = _weight_grads(c, wgrad, n_w)
        dbs = _bias_grads(c, dy, b_dtypes, ctx.b_grouped)
        return (None, None, None, None, dgrad32.to(x_dtype), *dws, *dbs)


def _weight_grads(c: Call, wgrad: torch.Tensor, n_w: int) -> list[torch.Tensor | None]:
    """The weights' gradients in the call's form (``None`` with fused accumulation into ``main_grad``)."""
    if c.main_grad is not None:
        return [None] * n_w
    return [wgrad] if c.grouped else list(wgrad.unbind(0))


def _bias_grads(c: Call, dy: torch.Tensor, b_dtypes: list[torch.dtype], b_grouped: bool) -> list[torch.Tensor]:
    """Σ rows of each expert's unquantized dy, summed in fp32 (zero for an empty expert), in the biases' form."""
    if c.bs is None:
        return []
    sums = torch.zeros(c.G, dy.shape[1], dtype=torch.float32, device=dy.device)
    dy32 = dy.to(torch.float32)
    for i in range(c.G):
        if c.m_splits[i]:
            sums[i] = dy32[c.rows(i)].sum(dim=0)
    if b_grouped:
        return [sums.to(b_dtypes[0])]
    return [s.to(d) for s, d in zip(sums.unbind(0), b_dtypes)]


# -- torch._scaled_grouped_mm ----------------------------------------------------------------------------------
_SGMM_FORMS = ("2d_3d", "2d_2d")


def _scaled_grouped_mm_reason(device: str | torch.device) -> str | None:
    """Why ``torch._scaled_grouped_mm`` cannot serve here (a probe that failed on ``device``), or ``None``."""
    dev = torch.device(device).type
    missing = [f for f in _SGMM_FORMS if not capabilities.scaled_grouped_mm(dev, f)]
    if not missing:
        return None
    return (
        f"torch._scaled_grouped_mm does not run exactly on {dev} here (probe "
        f"{', '.join(f'scaled_grouped_mm[{f}]' for f in missing)} on {dev}: no; it has no CPU kernel)"
    )


def _requires_scaled_grouped_mm() -> str | None:
    return _scaled_grouped_mm_reason("cuda" if torch.cuda.is_available() else "cpu")


class GroupedScaledMMLinear(GroupedFusedLinear):
    """``grouped_fp8_linear[scaled_grouped_mm]`` (module docstring): the fused quantization, one
    ``torch._scaled_grouped_mm`` per GEMM over the experts that have rows."""

    def __call__(self, x: torch.Tensor, weights: Any, biases: Any = None, **kw: Any) -> torch.Tensor:
        why = _scaled_grouped_mm_reason(x.device)
        if why:
            raise RuntimeError(f"{self.name}: {why}")
        return super().__call__(x, weights, biases, **kw)

    @staticmethod
    def _groups(c: Call, device: torch.device) -> tuple[list[int], torch.Tensor, torch.Tensor]:
        """The experts with rows, their split ends (int32, the kernel's ``offs``) and their row counts."""
        idx = [i for i in range(c.G) if c.m_splits[i]]
        lengths = torch.tensor([c.m_splits[i] for i in idx], device=device)
        return idx, torch.cumsum(lengths, 0).to(torch.int32), lengths

    @staticmethod
    def _per(scale_inv: torch.Tensor, idx: list[int], n: int) -> torch.Tensor:
        """Each listed expert's per-tensor dequantization scale repeated ``n`` times: ``[len(idx), n]``."""
        return scale_inv[idx][:, None].expand(len(idx), n).contiguous()

    def fprop(self, c: Call, qx: SplitQuantized, qws: list[QTensor]) -> torch.Tensor:
        idx, offs, lengths = self._groups(c, qx.data.device)
        N = qws[0].data.shape[0]
        if not idx:
            return torch.zeros(qx.data.shape[0], N, dtype=torch.float32, device=qx.data.device)
        mat_b = torch.stack([qws[i].data for i in idx]).transpose(-2, -1)  # [G', K, N] column-major
        scale_b = torch.stack([qws[i].scale_inv.expand(N) for i in idx])
        out = torch._scaled_grouped_mm(
            qx.data,
            mat_b,
            torch.repeat_interleave(qx.scale_inv[idx], lengths),
            scale_b,
            offs=offs,
            out_dtype=torch.bfloat16,
        )
        return out.to(torch.float32)

    def dgrad(self, c: Call, qdy: SplitQuantized, qwcs: list[QTensor]) -> torch.Tensor:
        idx, offs, lengths = self._groups(c, qdy.data.device)
        K = qwcs[0].data.shape[0]
        if not idx:
            return torch.zeros(qdy.data.shape[0], K, dtype=torch.float32, device=qdy.data.device)
        mat_b = torch.stack([qwcs[i].data for i in idx]).transpose(-2, -1)  # W_i as [N, K] column-major
        scale_b = torch.stack([qwcs[i].scale_inv.expand(K) for i in idx])
        out = torch._scaled_grouped_mm(
            qdy.data,
            mat_b,
            torch.repeat_interleave(qdy.scale_inv[idx], lengths),
            scale_b,
            offs=offs,
            out_dtype=torch.bfloat16,
        )
        return out.to(torch.float32)

    def wgrad(self, c: Call, qdyc: SplitQuantized, qxc: SplitQuantized) -> list[torch.Tensor | None]:
        idx, offs, _ = self._groups(c, qdyc.data.device)
        if not idx:
            return [None] * c.G
        N, K = qdyc.data.shape[1], qxc.data.shape[1]
        a = qdyc.data.t().contiguous()  # dyᵀ [N, M], the reduction (M) split by offs
        b = qxc.data.t().contiguous()  # xᵀ [K, M]
        out = torch._scaled_grouped_mm(
            a,
            b.t(),
            self._per(qdyc.scale_inv, idx, N).reshape(-1),
            self._per(qxc.scale_inv, idx, K).reshape(-1),
            offs=offs,
            out_dtype=torch.bfloat16,
        )
        res: list[torch.Tensor | None] = [None] * c.G
        for j, i in enumerate(idx):
            res[i] = out[j].to(torch.float32)
        return res


def grouped_fp8_linear_impls() -> list[GroupedBase]:
    """The built-in grouped FP8 linears: the per-expert loop and the fused-style impl over every standard recipe,
    and the ``torch._scaled_grouped_mm`` one (CUDA; unavailable elsewhere, with the probe's reason)."""
    e4m3 = (Fp8Recipe("current", fp8_format="E4M3"), Fp8Recipe("current", fp8_format="E4M3", power_of_2_scales=True))
    return [
        GroupedLoopLinear(
            "grouped_fp8_linear[loop]",
            "the single FP8 linear per expert; empty experts give zero gradients",
            bitwise_per_expert=True,
        ),
        GroupedFusedLinear(
            "grouped_fp8_linear[fused]",
            "whole input quantized at once with per-split scales and "
            "split-aligned column blocks; fused wgrad accumulation into fp32 main_grad",
            bitwise_per_expert=True,
            fused_wgrad_accumulation=frozenset({False, True}),
        ),
        GroupedScaledMMLinear(
            "grouped_fp8_linear[scaled_grouped_mm]",
            "torch._scaled_grouped_mm (2-D x 3-D, offs, per-row scales; wgrad 2-D x 2-D), per-tensor E4M3, bf16 out",
            recipes=e4m3,
            dtypes=frozenset({torch.bfloat16}),
            devices=frozenset({"cuda"}),
            bias=False,
            split_alignment=16,
            feature_alignment=16,
            requires=_requires_scaled_grouped_mm,
            accum_unit_roundoff={"cuda": 2.0**-13},
            accum_chunk={"cuda": 128},
        ),
    ]
