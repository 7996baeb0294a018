"""The protocol of a tensor/sequence-parallel FP8 linear: called on every rank with its shards.

With the global layer ``y = Q(x)·Q(W)ᵀ + b`` (x ``[M, K]``, W ``[N, K]``, b ``[N]``, dy ``[M, N]``) on ``P``
ranks, rank ``r`` holds (Megatron-LM's layouts; ``M_r = M/P`` etc. are contiguous, rank-ordered slices):

==========  =====  ======================  ==================  ===========================  =====================
parallel    SP     x given                 W, b given          y returned                   dx returned
==========  =====  ======================  ==================  ===========================  =====================
column      off    x ``[M, K]`` (full)     W_r ``[N/P, K]``,   y_r ``[M, N/P]``              dx ``[M, K]`` (all-
                                           b_r ``[N/P]``                                     reduced, full)
column      on     x_r ``[M/P, K]``        W_r, b_r            y_r ``[M, N/P]`` (x all-      dx_r ``[M/P, K]``
                                                               gathered)                     (reduce-scattered)
row         off    x_r ``[M, K/P]``        W_r ``[N, K/P]``,   y ``[M, N]`` (partials all-  dx_r ``[M, K/P]``
                                           b ``[N]`` (full)    reduced, then + b)
row         on     x_r ``[M, K/P]``        W_r, b              y_r ``[M/P, N]`` (partials   dx_r ``[M, K/P]``
                                                               reduce-scattered, then + b)
==========  =====  ======================  ==================  ===========================  =====================

``y.backward(dy_local)`` gets the rank's share of dy in y's layout; ``weight.grad`` is the rank's shard's
gradient, ``bias.grad`` the rank's bias gradient — for row-parallel with SP the partial ``Σ_{i∈rows r} dy_i``
(the all-reduce of a sequence-parallel bias gradient is the optimizer's, Megatron's ``finalize_model_grads``).

**The call** ``impl(x, weight, bias=None, *, recipe, parallel, sequence_parallel, save_original_input, group,
scale_log, scaling_state=None) -> y``. ``group`` is the rank's ``torch.distributed`` process group (one made for the call by
:class:`~properties.distributed.pool.pool.DistPool`);
``scale_log`` a :class:`ScaleLog` the impl reports every scale it quantized a GEMM operand with;
``scaling_state`` the rank's :class:`~impls.protocols.fp8_linear.DelayedScalingState` (delayed recipes).

**Quantization semantics: the unsharded layer's.** The suite judges the assembled outputs against the float64
oracle :func:`reference.fp8_linear.quantized_linear` run on the *global* tensors, so every operand must be
quantized exactly as the global tensor would be:

* *Per-tensor scales* (delayed, current): the amax of every operand (x, W, dy) is all-reduced (max) over the
  group before the scale is computed, so every rank quantizes with the one global scale. Delayed scaling records
  the reduced amax. (TransformerEngine's current scaling reduces only the input and grad-output amaxes and keeps
  each weight shard's own scale; that layer is not the unsharded one and is outside this protocol.)
* *Block scales* (blockwise 1×128 / 128×1 / 128×128, MXFP8 1×32 / 32×1) are legitimately local where a block
  lies inside one rank's shard. The suite only draws sharded weight dimensions (N/P for column, K/P for row)
  that are multiples of the recipe's block edge, so W's and the local dy's and x's blocks never cross a shard.
  The sequence dimension M/P is drawn freely: a columnwise block (b×1, along M) of a gathered tensor may
  straddle ranks, so it must be computed from the gathered tensor (or locally only when M/P is a multiple of b).
* *Sequence parallel*: x (column) and dy (row) are all-gathered; the impl may gather them already quantized
  (with the global scale, or with row-wise blocks, which never cross ranks) or in high precision and quantize
  after. ``save_original_input=True`` saves the local original shard and, in backward, quantizes the
  *gathered* original columnwise; the outputs must be bitwise those of ``False``.

Partial sums of a sharded reduction (dgrad of column-parallel, y of row-parallel) are rounded to the dtype
declared as ``partial_dtype`` and reduced in it (:mod:`properties.distributed.tp_fp8.tolerance` derives the bound).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from numcheck.impls.protocols import declaration as decl
from numcheck.impls.protocols.declaration import invalid
from numcheck.impls.protocols.fp8_linear import QUANT_DTYPES, call_refusal
from numcheck.impls.protocols.kind import Kind, renamed_attributes
from numcheck.reference.fp8_recipes import RECIPE_KINDS, ROLES, ROWWISE_KINDS, USAGES, Fp8Recipe, standard_recipes

TP_KIND = "tp-fp8-linear"
PARALLEL_MODES: tuple[str, ...] = ("column", "row")
PARTIAL_DTYPES: tuple[str, ...] = ("output", "float32")
#: The keywords every call passes after ``x, weight, bias``.
TP_CALL_KEYWORDS: tuple[str, ...] = (
    "recipe",
    "parallel",
    "sequence_parallel",
    "save_original_input",
    "group",
    "scale_log",
    "scaling_state",
)


@dataclass(frozen=True)
class TPFp8Support:
    """What a tensor-parallel quantized linear declares.

    Attributes:
        recipes: the recipes it implements.
        dtypes: dtypes of x, weight, bias, y and the gradients.
        parallel: ``"column"`` and/or ``"row"``.
        sequence_parallel: the SP values it accepts.
        save_original_input: the values it accepts (``True`` is refused with ValueError for delayed recipes).
        bias: whether a bias may be passed.
        world_sizes: the group sizes it runs at.
        accum_unit_roundoff: unit roundoff of its GEMM accumulation (2⁻²⁴: fp32).
        partial_dtype: ``"output"`` (partials of a sharded reduction are rounded to the output dtype and reduced in
            it, Megatron's way) or ``"float32"`` (reduced in fp32, rounded once after).
        deterministic: repeated calls at one world size give bitwise equal outputs.
        requires: ``None`` when it can run here, else the reason.
    """

    recipes: tuple[Fp8Recipe, ...] = field(default_factory=standard_recipes)
    dtypes: frozenset[torch.dtype] = frozenset({torch.float32, torch.bfloat16})
    parallel: frozenset[str] = frozenset(PARALLEL_MODES)
    sequence_parallel: frozenset[bool] = frozenset({False, True})
    save_original_input: frozenset[bool] = frozenset({False, True})
    bias: bool = True
    world_sizes: tuple[int, ...] = (1, 2, 4)
    accum_unit_roundoff: float = 2.0**-24
    partial_dtype: str = "output"
    deterministic: bool = True
    requires: Callable[[], str | None] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        own = "TPFp8Support"
        set_ = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731 - a frozen dataclass
        recipes = tuple(
            Fp8Recipe(r) if isinstance(r, str) and r in RECIPE_KINDS else r
            for r in decl.collection(own, "recipes", self.recipes, "(Fp8Recipe('current'),)")
        )
        if not recipes or not all(isinstance(r, Fp8Recipe) for r in recipes):
            raise invalid(
                f"{own}.recipes={self.recipes!r} must be a non-empty collection of Fp8Recipe (or kind names)",
                f"e.g. recipes=(Fp8Recipe('current'),); kinds: {RECIPE_KINDS}.",
            )
        rowwise = [r.name for r in recipes if r.kind in ROWWISE_KINDS]
        if rowwise:
            raise invalid(
                f"{own}.recipes declares {rowwise}: the tensor-parallel oracle has no rowwise kind yet",
                "Declare rowwise recipes on a single-device Fp8LinearSupport; TP impls take the kinds of "
                "standard_recipes().",
            )
        set_("recipes", recipes)
        set_("dtypes", decl.dtypes(own, "dtypes", self.dtypes, QUANT_DTYPES, empty_ok=False))
        for name, allowed in (
            ("parallel", PARALLEL_MODES),
            ("sequence_parallel", (False, True)),
            ("save_original_input", (False, True)),
        ):
            vals = decl.collection(own, name, getattr(self, name), repr(allowed))
            if not vals or any(v not in allowed or type(v) is not type(allowed[0]) for v in vals):
                raise invalid(
                    f"{own}.{name}={getattr(self, name)!r} must be a non-empty collection of {allowed}",
                    f"e.g. {name}={allowed!r}.",
                )
            set_(name, frozenset(vals))
        ws = tuple(self.world_sizes)
        if not ws or any(not isinstance(p, int) or isinstance(p, bool) or p < 1 for p in ws):
            raise invalid(
                f"{own}.world_sizes={self.world_sizes!r} must be positive ints", "e.g. world_sizes=(1, 2, 4)."
            )
        set_("world_sizes", ws)
        if self.partial_dtype not in PARTIAL_DTYPES:
            raise invalid(
                f"{own}.partial_dtype={self.partial_dtype!r} is not one of {PARTIAL_DTYPES}",
                "'output': partials rounded to the output dtype and reduced in it; 'float32': reduced in fp32.",
            )
        if not (isinstance(self.accum_unit_roundoff, float) and 0.0 < self.accum_unit_roundoff < 0.5):
            raise invalid(
                f"{own}.accum_unit_roundoff={self.accum_unit_roundoff!r} must be a float in (0, 0.5)",
                "2.0**-24 for fp32 accumulation.",
            )
        decl.bools(own, self, ("bias", "deterministic"))
        decl.requirement(own, self.requires)

    def unavailable_reason(self) -> str | None:
        """Why the impl cannot run here at all, or ``None``."""
        return decl.requirement_unmet(self.requires)

    def accumulation(self, device: str | torch.device) -> tuple[float, int | None]:
        """``(unit roundoff, promotion chunk)`` of the GEMM accumulation (one fp32 level: no chunk)."""
        return float(self.accum_unit_roundoff), None

    def describe(self) -> str:
        """Multi-line description for ``numcheck list``."""
        dts = ",".join(sorted(str(d).replace("torch.", "") for d in self.dtypes))
        return "\n".join(
            [
                f"parallel: {','.join(sorted(self.parallel))}; sequence_parallel: "
                f"{','.join(str(v) for v in sorted(self.sequence_parallel))}; world sizes: "
                f"{','.join(map(str, self.world_sizes))}; backend: torch.distributed (gloo on CPU, nccl on CUDA)",
                f"dtypes: {dts}; bias: {'yes' if self.bias else 'no'}; save_original_input: "
                f"{','.join(str(v) for v in sorted(self.save_original_input))}; partials reduced in: {self.partial_dtype}",
                "recipes: " + ", ".join(r.name for r in self.recipes),
            ]
        )


@dataclass
class ScaleLog:
    """The scales a rank quantized its GEMM operands with, as the impl reports them.

    ``scales[(role, usage)]`` is the fp32 ``scale_inv`` of the operand as it entered the rank's GEMM, in the
    source tensor's orientation: 0-d for per-tensor recipes, the block grid ``[ceil(R/br), ceil(C/bc)]`` of the
    rank's operand (local shard or gathered tensor) otherwise. Recorded once per (role, usage) and step.
    """

    scales: dict[tuple[str, str], torch.Tensor] = field(default_factory=dict)

    def record(self, role: str, usage: str, scale_inv: torch.Tensor) -> None:
        """Report the ``scale_inv`` of operand ``(role, usage)``; a second report for the same pair is an error."""
        if role not in ROLES or usage not in USAGES:
            raise ValueError(f"ScaleLog.record: role {role!r} / usage {usage!r} not in {ROLES} / {USAGES}")
        if (role, usage) in self.scales:
            raise RuntimeError(f"ScaleLog: scale of {(role, usage)} recorded twice in one step")
        self.scales[(role, usage)] = scale_inv.detach().to("cpu", torch.float32).clone()


class Collectives:
    """The four collectives the built-in impls use, over a ``torch.distributed`` group (every tensor contiguous,
    gathers and scatters along dim 0)."""

    def __init__(self, group: Any) -> None:
        self.group = group

    @property
    def world(self) -> int:
        import torch.distributed as dist

        return dist.get_world_size(self.group)

    @property
    def rank(self) -> int:
        import torch.distributed as dist

        return dist.get_rank(self.group)

    def all_reduce(self, t: torch.Tensor, op: str) -> torch.Tensor:
        """``op`` ∈ {"sum", "max"} over the group, in place and returned."""
        import torch.distributed as dist

        dist.all_reduce(t, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX, group=self.group)
        return t

    def all_gather(self, t: torch.Tensor) -> torch.Tensor:
        """The ranks' ``t`` concatenated along dim 0, rank order."""
        import torch.distributed as dist

        out = torch.empty((t.shape[0] * self.world, *t.shape[1:]), dtype=t.dtype, device=t.device)
        # all_gather_single is the name from torch 2.13 on (all_gather_into_tensor is deprecated there)
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        gather(out, t.contiguous(), group=self.group)
        return out

    def reduce_scatter(self, t: torch.Tensor) -> torch.Tensor:
        """The sum over ranks of ``t``, rank ``r`` keeping rows ``[r·R/P, (r+1)·R/P)``."""
        import torch.distributed as dist

        out = torch.empty((t.shape[0] // self.world, *t.shape[1:]), dtype=t.dtype, device=t.device)
        scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor  # as all_gather_single
        scatter(out, t.contiguous(), group=self.group)
        return out


def collectives(group: Any) -> Collectives:
    """The collectives of the ``torch.distributed`` group ``group``."""
    return Collectives(group)


@dataclass(frozen=True)
class TPFp8FunctionImpl(decl.PickledByReference):
    """A tensor-parallel quantized linear from a module-level function with the call's signature (module
    docstring). Built, it has checked that the function takes ``(x, weight, bias, *,`` :data:`TP_CALL_KEYWORDS`
    ``)``; the ranks receive it pickled, as its module-level name where it is bound to one."""

    name: str
    fn: Callable[..., torch.Tensor] = field(repr=False)
    support: TPFp8Support = field(default_factory=TPFp8Support)
    description: str = ""
    kind: str = TP_KIND

    def __post_init__(self) -> None:
        decl.built(
            self,
            TPFp8Support,
            "Build it with TPFp8Support(recipes=..., parallel=..., world_sizes=...).",
            "mymod_tp_fp8",
            [("function", self.fn, _refusal)],
            "the calls the suite makes",
        )

    def __call__(self, x, weight, bias=None, **kwargs):  # noqa: D102 - the call of the module docstring
        return self.fn(x, weight, bias, **kwargs)


#: The keywords :func:`tp_fp8_linear_impl` takes for the declaration.
TP_SUPPORT_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(TPFp8Support))


def tp_fp8_linear_impl(
    *, name: str, description: str = "", **support: Any
) -> Callable[[Callable[..., torch.Tensor]], TPFp8FunctionImpl]:
    """Decorator turning a module-level function into a tensor/sequence-parallel quantized linear the distributed
    FP8 suite runs (``pytest --pyargs numcheck.tests.suite --impl mymod:impl``).

    Every rank calls ``fn(x, weight, bias, *, recipe, parallel, sequence_parallel, save_original_input, group,
    scale_log, scaling_state)`` with its shards (module docstring: the layouts, the quantization semantics, what
    it reports to ``scale_log``). ``support`` keywords are the fields of :class:`TPFp8Support` (``recipes``
    may be kind names). A bad keyword or value, or a function that cannot take the calls, raises
    :class:`~numcheck.impls.protocols.declaration.InvalidDeclaration` naming the decorator's ``file:line``. Bind the
    result at module level: the ranks unpickle it by that name.

    >>> @tp_fp8_linear_impl(name="doc_tp", recipes=("current",), parallel=("column",), world_sizes=(1, 2))
    ... def doc_tp(x, weight, bias=None, *, recipe, parallel, sequence_parallel, save_original_input, group,
    ...            scale_log, scaling_state=None):
    ...     ...
    >>> doc_tp.kind, sorted(doc_tp.support.parallel)
    ('tp-fp8-linear', ['column'])
    """
    site, owner = decl.opening("tp_fp8_linear_impl", name, support, TP_SUPPORT_FIELDS, "mymod_tp_fp8")
    declared = TPFp8Support(**support)

    def wrap(fn: Callable[..., torch.Tensor]) -> TPFp8FunctionImpl:
        doc = decl.decorated(
            owner,
            site,
            fn,
            "Put the decorator on the function each rank calls.",
            [(getattr(fn, "__name__", "the function"), fn, _refusal)],
            "the calls the suite makes",
            description,
        )
        return TPFp8FunctionImpl(name=name, fn=fn, support=declared, description=doc)

    return wrap


def _refusal(fn: Callable[..., Any]) -> str | None:
    """Why ``fn`` cannot take a rank's call ``fn(x, weight, bias, *,`` :data:`TP_CALL_KEYWORDS` ``)``, or ``None``."""
    return call_refusal(fn, 3, TP_CALL_KEYWORDS)


def validate_tp_fp8_linear_impl(obj: Any, origin: str) -> None:
    """Raise ``TypeError`` naming ``origin`` when ``obj`` breaks this protocol."""
    support = getattr(obj, "support", None)
    decl.conformance(
        obj,
        origin,
        TP_KIND,
        [
            (
                isinstance(support, TPFp8Support),
                f"needs 'support' of type impls.protocols.tp_fp8_linear.TPFp8Support, got {type(support).__name__}",
            ),
            (callable(obj), "is not callable"),
        ],
        [("", obj.fn if isinstance(obj, TPFp8FunctionImpl) else obj, _refusal)],
        "the calls the suite makes",
        pickled=True,
        decorator="tp_fp8_linear_impl",
    )


#: The tensor/sequence-parallel quantized-linear kind, as every layer iterates it (:mod:`impls.protocols.kinds`).
KIND = Kind(
    name=TP_KIND,
    protocol=TPFp8FunctionImpl,
    decorator=tp_fp8_linear_impl,
    validate=validate_tp_fp8_linear_impl,
    public=("TPFp8FunctionImpl", "TPFp8Support", "tp_fp8_linear_impl"),
    fixture="tp_fp8_linear_impl",
    former="tp_quant_linear",
    former_fixture="tp_quant_impl",
    renamed=(
        ("TPQuantFunctionImpl", "TPFp8FunctionImpl"),
        ("TPQuantSupport", "TPFp8Support"),
        ("tp_quant_linear_impl", "tp_fp8_linear_impl"),
    ),
)

#: The public names before 0.2.0 (``KIND.renamed``), still importable from here with a warning until 0.3.0.
__getattr__ = renamed_attributes(__name__, KIND.renamed)
