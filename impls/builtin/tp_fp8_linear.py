"""Built-in tensor/sequence-parallel FP8 linears: ``tp_fp8_linear[<kind>]`` for every recipe kind.

Under the protocol of :mod:`impls.protocols.tp_fp8_linear` (its table gives the layouts), column- and row-parallel,
sequence parallelism on and off, ``save_original_input`` on and off. Quantization is the single-device built-in's
(:class:`impls.builtin.fp8_linear.Fp8Linear`, bit-exact to the oracle), with what the group adds:

* **Per-tensor scales** (delayed, current): each operand's local amax (NaN ignored) is all-reduced with MAX over
  the group, then the scale is computed (current) or the reduced amax recorded (delayed): one scale on every rank.
* **Block scales** (blockwise, MXFP8) are computed locally: the drawn shards never split a block of W or of the
  local dy / x (the protocol's alignment), and a row-wise block never crosses ranks.
* **Column-parallel SP input** is gathered *quantized*: x_r is quantized row-wise with the global scale (or its
  row-wise blocks) and the FP8 codes and scales are all-gathered. The columnwise copy for wgrad
  (``save_original_input=False``) is the transposed codes for per-tensor recipes; for block recipes it is quantized
  locally and gathered when M/P is a multiple of the block edge (blocks inside shards), else quantized from the
  all-gathered high-precision x (blocks that straddle ranks). ``save_original_input=True`` saves x_r and in
  backward all-gathers the original and quantizes the gathered tensor columnwise.
* **Row-parallel SP gradient** dy_r is all-gathered in high precision and the gathered dy quantized.
* **Partials** of a sharded reduction (column dgrad, row y) are rounded to the output dtype and summed in it by
  ``all_reduce`` (SP off) or ``reduce_scatter`` (SP on), as Megatron does; the row-parallel bias is added after.
* GEMMs are exact-product fp32 emulations (dequantize, multiply in fp32): the CPU (gloo) leg; native FP8 GEMMs
  under NCCL are the multi-GPU issue's.

The methods :meth:`TPFp8Linear.reduce_amax`, :meth:`~TPFp8Linear.gather_rowwise_x`,
:meth:`~TPFp8Linear.wgrad_x_from_saved` and :meth:`~TPFp8Linear.reduce_row_output` are the seams the mutants
(``tests/self/helpers/dist_fp8_mutants.py``) override.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from numcheck.impls.builtin.fp8_linear import Fp8Linear, check_recipe_call, one_per_recipe_kind
from numcheck.impls.protocols.fp8_linear import DelayedScalingState
from numcheck.impls.protocols.tp_fp8_linear import TP_KIND, ScaleLog, TPFp8Support, collectives
from numcheck.reference.fp8_recipes import Fp8Recipe
from numcheck.reference.numerics.fp8_linear import QTensor, k_major_fp32, recipes_kind, tensor_amax


@dataclass(frozen=True)
class Dequantized:
    """A GEMM operand given by its fp32 dequantized values, K-major (what a gathered operand whose shards carry
    different scales amounts to)."""

    values: torch.Tensor
    #: The scale the rank reports for it (its own shard's, for a mutant that quantized shards apart).
    scale_inv: torch.Tensor

    def dequantize(self) -> torch.Tensor:
        return self.values


def _logged(q: "QTensor | Dequantized", usage: str) -> torch.Tensor:
    """The ``scale_inv`` a rank reports for operand ``q`` (source orientation)."""
    return _source_scale(q, usage) if isinstance(q, QTensor) else q.scale_inv


@dataclass(frozen=True)
class CallConfig:
    """One call's settings, carried from forward to backward."""

    recipe: Fp8Recipe
    parallel: str
    sequence_parallel: bool
    save_original_input: bool
    comm: Any
    log: ScaleLog
    state: DelayedScalingState | None


def _gemm(a: Any, b: Any) -> torch.Tensor:
    """fp32 ``deq(a)·deq(b)ᵀ`` of two K-major operands (exact FP8 products, fp32 accumulation)."""
    return a.dequantize() @ b.dequantize().t()


def _source_scale(q: QTensor, usage: str) -> torch.Tensor:
    """``q``'s ``scale_inv`` in the source tensor's orientation (0-d for per-tensor)."""
    return q.scale_inv if q.per_tensor or usage == "rowwise" else q.scale_inv.t()


class _TPFunction(torch.autograd.Function):
    """Forward and backward of one rank of the tensor-parallel quantized linear."""

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, impl: "TPFp8Linear", cfg: CallConfig
    ) -> torch.Tensor:
        column = cfg.parallel == "column"
        qx = (
            impl.gather_rowwise_x(x, cfg) if column and cfg.sequence_parallel else impl.quantize(x, "x", "rowwise", cfg)
        )
        cfg.log.record("x", "rowwise", _logged(qx, "rowwise"))
        qw = impl.quantize(weight, "w", "rowwise", cfg)
        cfg.log.record("w", "rowwise", _source_scale(qw, "rowwise"))
        y32 = _gemm(qx, qw)
        if column:
            if bias is not None:
                y32 = y32 + bias.to(torch.float32)
        else:
            y32 = impl.reduce_row_output(y32.to(impl.partial_dtype(x.dtype)), cfg).to(torch.float32)
            if bias is not None:
                y32 = y32 + bias.to(torch.float32)
        ctx.impl, ctx.cfg, ctx.has_bias, ctx.x_dtype = impl, cfg, bias is not None, x.dtype
        ctx.bias_dtype = bias.dtype if bias is not None else None
        if cfg.save_original_input:
            ctx.save_for_backward(weight, x)
            ctx.qxc = None
        else:
            ctx.save_for_backward(weight)
            ctx.qxc = impl.columnwise_x(x, qx, cfg)
        return y32.to(x.dtype)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor):  # type: ignore[override]
        impl, cfg = ctx.impl, ctx.cfg
        weight = ctx.saved_tensors[0]
        qxc = impl.wgrad_x_from_saved(ctx.saved_tensors[1], cfg) if cfg.save_original_input else ctx.qxc
        cfg.log.record("x", "columnwise", _logged(qxc, "columnwise"))
        dy_local = dy.contiguous()
        column = cfg.parallel == "column"
        dy_full = cfg.comm.all_gather(dy_local) if (not column and cfg.sequence_parallel) else dy_local
        qdy = impl.quantize(dy_full, "dy", "rowwise", cfg)
        qdyc = impl.quantize(dy_full, "dy", "columnwise", cfg, record=False)
        qwc = impl.quantize(weight, "w", "columnwise", cfg, record=False)
        for role, usage, q in (("dy", "rowwise", qdy), ("dy", "columnwise", qdyc), ("w", "columnwise", qwc)):
            cfg.log.record(role, usage, _source_scale(q, usage))
        dgrad32 = _gemm(qdy, qwc)
        if column:
            part = dgrad32.to(impl.partial_dtype(ctx.x_dtype))
            part = cfg.comm.reduce_scatter(part) if cfg.sequence_parallel else cfg.comm.all_reduce(part, "sum")
            dgrad = part.to(ctx.x_dtype)
        else:
            dgrad = dgrad32.to(ctx.x_dtype)
        wgrad = _gemm(qdyc, qxc).to(weight.dtype)
        bgrad = dy_local.to(torch.float32).sum(dim=0).to(ctx.bias_dtype) if ctx.has_bias else None
        return dgrad, wgrad, bgrad, None, None


class TPFp8Linear:
    """A tensor-parallel quantized linear for the recipes of one kind (module docstring)."""

    kind = TP_KIND

    def __init__(self, name: str, recipes: tuple[Fp8Recipe, ...], description: str = "") -> None:
        self.name, self.description = name, description
        self.recipe_kind = recipes_kind(recipes, f"TPFp8Linear {name!r}")
        self.base = Fp8Linear(f"{name}/local", recipes)
        self.support = TPFp8Support(
            recipes=recipes,
            dtypes=frozenset({torch.float32, torch.bfloat16}),
            world_sizes=(1, 2, 4),
            partial_dtype="output",
        )

    def __repr__(self) -> str:
        return f"TPFp8Linear({self.name!r})"

    def __reduce__(self) -> Any:
        """Pickled by its constructor's arguments (the ranks rebuild it; the single-device base holds mapping
        proxies, which do not pickle)."""
        return (type(self), (self.name, self.support.recipes, self.description))

    def __call__(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        *,
        recipe: Fp8Recipe,
        parallel: str,
        sequence_parallel: bool,
        save_original_input: bool,
        group: Any,
        scale_log: ScaleLog,
        scaling_state: DelayedScalingState | None = None,
    ) -> torch.Tensor:
        check_recipe_call(self.name, self.recipe_kind, recipe, save_original_input, scaling_state)
        if parallel not in ("column", "row"):
            raise ValueError(f"{self.name}: parallel={parallel!r} must be 'column' or 'row'")
        if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
            raise ValueError(
                f"{self.name}: x must be [M, K_local] and weight [N_local, K_local]; got "
                f"{tuple(x.shape)}, {tuple(weight.shape)}"
            )
        cfg = CallConfig(
            recipe,
            parallel,
            bool(sequence_parallel),
            bool(save_original_input),
            collectives(group),
            scale_log,
            scaling_state,
        )
        return _TPFunction.apply(x, weight, bias, self, cfg)

    # -- quantization with the group ----------------------------------------------------------------------
    def partial_dtype(self, out_dtype: torch.dtype) -> torch.dtype:
        """The dtype partials of a sharded reduction are rounded to and reduced in (the declaration's)."""
        return out_dtype if self.support.partial_dtype == "output" else torch.float32

    def reduce_amax(self, amax: torch.Tensor, cfg: CallConfig) -> torch.Tensor:
        """The group's amax from this rank's (MAX all-reduce; NaN was already dropped from each)."""
        return cfg.comm.all_reduce(amax.reshape(1).clone(), "max").reshape(())

    def quantize(
        self,
        t: torch.Tensor,
        role: str,
        usage: str,
        cfg: CallConfig,
        *,
        record: bool = True,
        amax: torch.Tensor | None = None,
    ) -> QTensor:
        """K-major quantization of ``t`` for (role, usage): per-tensor recipes by the single-device step with the
        group's amax (``amax``, or ``t``'s reduced over the group), recording it for delayed scaling (x and w in
        forward, dy in backward, rowwise only); block recipes locally."""
        recipe = cfg.recipe
        if recipe.kind not in ("delayed", "current"):
            return self.base.quantize_operand(t, recipe, role, usage, None, record=False)
        t32 = k_major_fp32(t, usage)
        if amax is None:
            amax = self.reduce_amax(tensor_amax(t32), cfg)
        return self.base.quantize_per_tensor(t32, amax, recipe, role, cfg.state, record=record and usage == "rowwise")

    def gather_qtensor(self, q: QTensor, usage: str, cfg: CallConfig) -> QTensor:
        """All-gather a local quantization along the source's dim 0 (the sequence): codes as bytes, and the block
        scales (per-tensor: the one scale, already the group's)."""
        data = q.data.view(torch.uint8)
        if usage == "rowwise":
            data = cfg.comm.all_gather(data)
        else:
            data = cfg.comm.all_gather(data.t().contiguous()).t().contiguous()
        data = data.view(q.fmt.torch_dtype)
        if q.per_tensor:
            return QTensor(data, q.scale_inv, None, tuple(data.shape), q.fmt)

        def grid(s: torch.Tensor) -> torch.Tensor:
            return (
                cfg.comm.all_gather(s.contiguous())
                if usage == "rowwise"
                else cfg.comm.all_gather(s.t().contiguous()).t().contiguous()
            )

        code = grid(q.code) if q.code is not None else None
        return QTensor(data, grid(q.scale_inv), code, q.block, q.fmt)

    # -- the seams --------------------------------------------------------------------------------------
    def gather_rowwise_x(self, x_local: torch.Tensor, cfg: CallConfig) -> QTensor | Dequantized:
        """Column-parallel SP: x_r quantized row-wise with the group's scale (per-tensor) or its own row-wise
        blocks, then gathered quantized."""
        return self.gather_qtensor(self.quantize(x_local, "x", "rowwise", cfg), "rowwise", cfg)

    def columnwise_x(self, x: torch.Tensor, qx: QTensor | Dequantized, cfg: CallConfig) -> QTensor | Dequantized:
        """The columnwise x for wgrad, formed in forward (``save_original_input=False``)."""
        gathered = cfg.parallel == "column" and cfg.sequence_parallel
        if not gathered:
            return self.quantize(x, "x", "columnwise", cfg, record=False)
        if cfg.recipe.kind in ("delayed", "current"):  # the same codes with the same global scale, transposed
            assert isinstance(qx, QTensor)
            return QTensor(qx.data.t().contiguous(), qx.scale_inv, None, tuple(qx.data.t().shape), qx.fmt)
        edge = max(cfg.recipe.block_of("x", "columnwise") or (1, 1))
        if x.shape[0] % edge == 0:  # blocks inside the shards: quantize locally, gather
            return self.gather_qtensor(self.quantize(x, "x", "columnwise", cfg, record=False), "columnwise", cfg)
        return self.quantize(cfg.comm.all_gather(x.detach().contiguous()), "x", "columnwise", cfg, record=False)

    def wgrad_x_from_saved(self, x_saved: torch.Tensor, cfg: CallConfig) -> QTensor | Dequantized:
        """``save_original_input=True``: the original x (gathered under column SP) quantized columnwise in backward."""
        if cfg.parallel == "column" and cfg.sequence_parallel:
            x_saved = cfg.comm.all_gather(x_saved.detach().contiguous())
        return self.quantize(x_saved, "x", "columnwise", cfg, record=False)

    def reduce_row_output(self, partial: torch.Tensor, cfg: CallConfig) -> torch.Tensor:
        """Row-parallel y: the partials summed over the group (reduce-scattered along the sequence under SP)."""
        return cfg.comm.reduce_scatter(partial) if cfg.sequence_parallel else cfg.comm.all_reduce(partial, "sum")


_DESCRIPTIONS = {
    "delayed": "TP/SP, per-tensor delayed scaling, amaxes MAX-all-reduced before they are recorded",
    "current": "TP/SP, per-tensor current scaling with the group's amax; SP input gathered as FP8",
    "blockwise": "TP/SP, 1x128 / 128x128 block scales (local; straddling sequence blocks from the gathered x)",
    "mxfp8": "TP/SP, MXFP8 1x32 / 32x1 blocks (local; straddling sequence blocks from the gathered x)",
}


def tp_fp8_linear_impls() -> list[TPFp8Linear]:
    """One built-in per recipe kind, each declaring that kind's standard variants."""
    return one_per_recipe_kind(TPFp8Linear, "tp_fp8_linear", _DESCRIPTIONS)
