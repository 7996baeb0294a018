"""The protocol of a grouped FP8 linear (mixture-of-experts): one input split by rows among G experts.

A grouped quantized-linear implementation is any object with

``name: str``, ``kind: str`` = ``"grouped-fp8-linear"``, ``support: GroupedFp8Support``
    As for a quantized linear (:mod:`impls.protocols.fp8_linear`); :class:`GroupedFp8Support` adds the split
    rules.
``__call__(x, weights, biases=None, *, m_splits, recipe, save_original_input, scaling_state=None, main_grad=None)``
    ``x`` ``[M, K]`` (``requires_grad``); ``weights`` one grouped tensor ``[G, N, K]`` or a list of ``G`` tensors
    ``[N, K]`` (each ``requires_grad``; the forms in ``support.weight_layouts``); ``biases`` ``None`` or the same
    form ``[G, N]`` / ``G`` × ``[N]``; ``m_splits`` a tuple of ``G`` Python ints, ``Σ m_i = M``: expert ``i`` owns
    rows ``o_i … o_i + m_i − 1`` of x (``o_i = Σ_{j<i} m_j``). Returns ``y`` ``[M, N]`` in x's dtype, connected to
    autograd, with ``y_i = Q(x_i)·Q(W_i)ᵀ + b_i``; ``y.backward(dy)`` fills ``x.grad`` (dgrad), every weight's and
    bias's ``.grad`` in its own dtype (``bgrad_i`` = Σ rows of the unquantized ``dy_i``, summed in at least fp32).
    Semantics (formats, blocks, scales *per expert*, the rounded cast, empty experts) are those of the float64
    oracle :func:`reference.grouped_fp8_linear.grouped_quantized_linear`, whose docstring states them.

**Split rules** (declared; the suite draws inside them and checks the refusals outside them). Every ``m_i`` is a
multiple of ``split_alignment`` (1: any size); ``m_i = 0`` is accepted where ``empty_splits``; K and N are multiples
of ``feature_alignment``. A call outside its declared rules — or with ``m_splits`` that is not ``G`` ints ``>= 0``
summing to M — must raise ``ValueError`` whose message names ``m_splits`` (or the dimension), before computing
anything. An *empty expert* (``m_i = 0``) contributes no rows; its weight and bias gradients are exactly zero
tensors (never ``None``, never NaN, never left uninitialised) and nothing anywhere becomes NaN or inf because of it.

**save_original_input** as for the single linear, per expert: ``False`` keeps the columnwise FP8 copy of x (each
expert's data and scales); ``True`` keeps x itself and re-quantizes each ``x_i`` columnwise in backward. Outputs must
be bitwise identical either way; delayed scaling with ``True`` raises ``ValueError`` naming
``save_original_input``. What is held for backward is measured (:mod:`impls.measure.memory`): held(False) −
held(True) is the columnwise copy of x (:func:`predicted_grouped_columnwise_x_bytes`).

**Delayed scaling** has one amax history per GEMM: ``scaling_state`` is a tuple of ``G``
:class:`~impls.protocols.fp8_linear.DelayedScalingState` (:func:`delayed_states`); expert ``i`` quantizes with
``scaling_state[i].scale(role)`` and records its own amaxes into ``scaling_state[i]`` once per step and role (x and
W in forward, dy in backward), empty experts included (amax 0 for their x and dy).

**Fused wgrad accumulation** (where ``True in support.fused_wgrad_accumulation``): ``main_grad`` is fp32 in the
weights' form (``[G, N, K]`` or ``G`` × ``[N, K]``); backward *adds* each ``wgrad_i`` into ``main_grad[i]`` with
fp32 accumulation (the GEMM accumulating onto it, or an fp32 add of its fp32 result: never through the weight
dtype) and leaves every weight's ``.grad`` ``None``; an empty expert's ``main_grad[i]`` is left bitwise as given.

Write one with :func:`grouped_fp8_linear_impl`; its declaration is checked where it is written
(:class:`~numcheck.impls.protocols.declaration.InvalidDeclaration`), with the machinery of the other protocols::

    from numcheck import grouped_fp8_linear_impl

    @grouped_fp8_linear_impl(name="mine", recipes=("current",), dtypes=("bfloat16",), split_alignment=16)
    def mine(x, weights, biases=None, *, m_splits, recipe, save_original_input, scaling_state=None,
             main_grad=None):
        ...
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from numcheck.impls.protocols import declaration as decl
from numcheck.impls.protocols.declaration import invalid
from numcheck.impls.protocols.fp8_linear import (
    DelayedScalingState,
    Fp8LinearSupport,
    call_refusal,
    predicted_columnwise_x_bytes,
)
from numcheck.impls.protocols.kind import Kind, renamed_attributes
from numcheck.reference.fp8_recipes import Fp8Recipe
from numcheck.reference.grouped_fp8_linear import split_offsets

GROUPED_KIND = "grouped-fp8-linear"
WEIGHT_LAYOUTS: tuple[str, ...] = ("grouped", "list")
#: The keywords every call passes after ``x, weights, biases``.
GROUPED_CALL_KEYWORDS: tuple[str, ...] = ("m_splits", "recipe", "save_original_input", "scaling_state", "main_grad")


@dataclass(frozen=True)
class GroupedFp8Support(Fp8LinearSupport):
    """What a grouped quantized linear declares: every field of
    :class:`~impls.protocols.fp8_linear.Fp8LinearSupport` (recipes, dtypes, devices, save_original_input, bias,
    the accumulation's unit roundoff and promotion chunk, requires; checked by it), and:

    Attributes:
        split_alignment: every split size is a multiple of it (1: any size).
        empty_splits: whether an expert may receive no rows (``m_i = 0``).
        feature_alignment: K and N are multiples of it (1: any size).
        weight_layouts: ``"grouped"`` (one ``[G, N, K]`` tensor) and/or ``"list"`` (``G`` tensors ``[N, K]``).
        fused_wgrad_accumulation: the ``main_grad`` modes accepted: ``False`` (weights get ``.grad``) and/or
            ``True`` (wgrad added into a given fp32 ``main_grad``).
        bitwise_per_expert: outputs equal, bitwise, those of the single FP8 linear built-in
            (:mod:`impls.builtin.fp8_linear`) called once per expert on its rows.
        max_experts: the largest G it takes (``None``: any).
    """

    split_alignment: int = 1
    empty_splits: bool = True
    feature_alignment: int = 1
    weight_layouts: frozenset[str] = frozenset(WEIGHT_LAYOUTS)
    fused_wgrad_accumulation: frozenset[bool] = frozenset({False})
    bitwise_per_expert: bool = False
    max_experts: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        own = type(self).__name__
        set_ = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731 - a frozen dataclass
        if any(m > 1 for m in self.dim_multiples.values()):
            raise invalid(
                f"{own}.dim_multiple={self.dim_multiple!r}: a grouped impl declares its shapes per expert",
                "Declare split_alignment (each expert's rows, M_i) and feature_alignment (K and N) instead, e.g. "
                "split_alignment=16, feature_alignment=16.",
            )
        if self.exposes_quantize:
            raise invalid(
                f"{own}.exposes_quantize=True: a grouped impl's quantizer is checked through its outputs",
                "Leave exposes_quantize out (the per-expert quantizer is the single linear's).",
            )
        for name in ("split_alignment", "feature_alignment"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise invalid(f"{own}.{name}={v!r} must be an int >= 1", f"e.g. {name}=16 (1: any size).")
        set_(
            "weight_layouts",
            decl.known_names(
                own,
                "weight_layouts",
                self.weight_layouts,
                WEIGHT_LAYOUTS,
                empty_ok=False,
                note=" 'grouped': one [G, N, K] tensor; 'list': G tensors [N, K].",
            ),
        )
        modes = decl.collection(own, "fused_wgrad_accumulation", self.fused_wgrad_accumulation, "(False, True)")
        if not modes or any(not isinstance(v, bool) for v in modes):
            raise invalid(
                f"{own}.fused_wgrad_accumulation={self.fused_wgrad_accumulation!r} must be a non-empty "
                f"collection of False and/or True",
                "e.g. (False,), or (False, True) with main_grad.",
            )
        set_("fused_wgrad_accumulation", frozenset(modes))
        decl.bools(own, self, ("empty_splits", "bitwise_per_expert"))
        mx = self.max_experts
        if mx is not None and (isinstance(mx, bool) or not isinstance(mx, int) or mx < 1):
            raise invalid(f"{own}.max_experts={mx!r} must be an int >= 1 or None", "e.g. max_experts=64.")

    def split_refusal(
        self, m_splits: Sequence[Any], M: int | None = None, *, K: int | None = None, N: int | None = None
    ) -> str | None:
        """Why a call with ``m_splits`` (and x ``[M, K]``, N outputs) is outside this declaration, or ``None``."""
        try:
            split_offsets(m_splits, M)
        except ValueError as exc:
            return str(exc)
        splits = tuple(m_splits)
        if self.max_experts is not None and len(splits) > self.max_experts:
            return f"m_splits names {len(splits)} experts, more than max_experts={self.max_experts}"
        if not self.empty_splits and 0 in splits:
            return f"m_splits={splits} has an empty expert (m_i = 0), which the declaration excludes"
        bad = [m for m in splits if m % self.split_alignment]
        if bad:
            return f"m_splits={splits}: sizes {bad} are not multiples of split_alignment={self.split_alignment}"
        for dim, v in (("K", K), ("N", N)):
            if v is not None and v % self.feature_alignment:
                return f"{dim}={v} is not a multiple of feature_alignment={self.feature_alignment}"
        return None

    def describe(self) -> str:
        """Multi-line description for ``numcheck list``."""
        lines = super().describe().split("\n")
        lines[1] = lines[1].split("; quantize exposed")[0]
        empty = "empty experts accepted" if self.empty_splits else "no empty expert"
        lines.insert(
            1,
            f"m_splits: multiples of {self.split_alignment}, {empty}; K, N multiples of "
            f"{self.feature_alignment}; weights: {', '.join(sorted(self.weight_layouts))}; fused wgrad "
            f"accumulation: {','.join(str(v) for v in sorted(self.fused_wgrad_accumulation))}; bitwise "
            f"per-expert linear: {'yes' if self.bitwise_per_expert else 'no'}",
        )
        return "\n".join(lines)


def delayed_states(recipe: Fp8Recipe, G: int) -> tuple[DelayedScalingState, ...]:
    """One :class:`~impls.protocols.fp8_linear.DelayedScalingState` per expert GEMM (the per-GEMM amax histories)."""
    return tuple(DelayedScalingState(recipe) for _ in range(G))


def predicted_grouped_columnwise_x_bytes(recipe: Fp8Recipe, m_splits: Sequence[int], K: int) -> tuple[int, int]:
    """``(lo, hi)``: the bytes of the columnwise FP8 copy of x (every expert's data and unpadded scales,
    :func:`~impls.protocols.fp8_linear.predicted_columnwise_x_bytes`). An empty expert has no data and no block; under a
    per-tensor recipe an impl may keep its one fp32 scale (4 bytes) or not, so ``hi − lo`` is 4 per empty expert."""
    lo = sum(predicted_columnwise_x_bytes(recipe, m, K) for m in m_splits if m > 0)
    if "columnwise" not in recipe.usages_of("x"):  # wgrad reads x in high precision (rowwise_gw_hp): no copy
        return lo, lo
    empty = sum(1 for m in m_splits if m == 0)
    per_tensor = recipe.block_of("x", "columnwise") is None
    return lo, lo + (4 * empty if per_tensor else 0)


@dataclass(frozen=True)
class GroupedFunctionImpl:
    """A grouped quantized linear made from a plain function with the call's signature (module docstring); built,
    it has checked that the function takes ``(x, weights, biases, *,`` :data:`GROUPED_CALL_KEYWORDS` ``)``."""

    name: str
    fn: Callable[..., torch.Tensor] = field(repr=False)
    support: GroupedFp8Support = field(default_factory=GroupedFp8Support)
    description: str = ""
    kind: str = GROUPED_KIND

    def __post_init__(self) -> None:
        decl.built(
            self,
            GroupedFp8Support,
            "Build it with GroupedFp8Support(recipes=..., split_alignment=...).",
            "mymod_grouped_fp8",
            [("function", self.fn, _refusal)],
            "the calls the suite makes",
        )

    def __call__(self, x, weights, biases=None, **kwargs):  # noqa: D102 - the call of the module docstring
        return self.fn(x, weights, biases, **kwargs)


#: The keywords :func:`grouped_fp8_linear_impl` takes for the declaration.
GROUPED_SUPPORT_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(GroupedFp8Support))


def grouped_fp8_linear_impl(
    *, name: str, description: str = "", **support: Any
) -> Callable[[Callable[..., torch.Tensor]], GroupedFunctionImpl]:
    """Decorator turning a function into a grouped quantized linear the suite runs
    (``pytest --pyargs numcheck.tests.suite --impl mymod:impl``).

    The function is called ``fn(x, weights, biases, *, m_splits, recipe, save_original_input, scaling_state,
    main_grad)`` (module docstring). ``support`` keywords are the fields of :class:`GroupedFp8Support`
    (``recipes`` may be kind names). A bad keyword or value, or a function that cannot take the calls, raises
    :class:`~numcheck.impls.protocols.declaration.InvalidDeclaration` naming the decorator's ``file:line``.

    >>> @grouped_fp8_linear_impl(name="doc_grouped", recipes=("current",), dtypes=("bfloat16",), split_alignment=16)
    ... def doc_grouped(x, weights, biases=None, *, m_splits, recipe, save_original_input, scaling_state=None,
    ...                 main_grad=None):
    ...     ...
    >>> doc_grouped.kind, doc_grouped.support.split_alignment
    ('grouped-fp8-linear', 16)
    """
    site, owner = decl.opening("grouped_fp8_linear_impl", name, support, GROUPED_SUPPORT_FIELDS, "mymod_grouped_fp8")
    declared = GroupedFp8Support(**support)

    def wrap(fn: Callable[..., torch.Tensor]) -> GroupedFunctionImpl:
        doc = decl.decorated(
            owner,
            site,
            fn,
            "Put the decorator on the function computing y_i = Q(x_i)·Q(W_i)ᵀ + b_i.",
            [(getattr(fn, "__name__", "the function"), fn, _refusal)],
            "the calls the suite makes",
            description,
        )
        return GroupedFunctionImpl(name=name, fn=fn, support=declared, description=doc)

    return wrap


def _refusal(fn: Callable[..., Any]) -> str | None:
    """Why ``fn`` cannot take ``fn(x, weights, biases, *,`` :data:`GROUPED_CALL_KEYWORDS` ``)``, or ``None``."""
    return call_refusal(fn, 3, GROUPED_CALL_KEYWORDS)


def validate_grouped_impl(obj: Any, origin: str) -> None:
    """Raise ``TypeError`` naming ``origin`` when ``obj`` breaks this protocol."""
    support = getattr(obj, "support", None)
    decl.conformance(
        obj,
        origin,
        GROUPED_KIND,
        [
            (
                isinstance(support, GroupedFp8Support),
                f"needs 'support' of type "
                f"impls.protocols.grouped_fp8_linear.GroupedFp8Support, got "
                f"{type(support).__name__}",
            ),
            (callable(obj), "is not callable"),
        ],
        [("", obj.fn if isinstance(obj, GroupedFunctionImpl) else obj, _refusal)],
        "the calls the suite makes",
    )


#: The grouped (mixture-of-experts) quantized-linear kind, as every layer iterates it (:mod:`impls.protocols.kinds`).
KIND = Kind(
    name=GROUPED_KIND,
    protocol=GroupedFunctionImpl,
    decorator=grouped_fp8_linear_impl,
    validate=validate_grouped_impl,
    public=("GroupedFunctionImpl", "GroupedFp8Support", "grouped_fp8_linear_impl"),
    fixture="grouped_fp8_linear_impl",
    former="grouped_quant_linear",
    former_fixture="grouped_quant_impl",
    renamed=(("GroupedQuantSupport", "GroupedFp8Support"), ("grouped_quant_linear_impl", "grouped_fp8_linear_impl")),
)

#: The public names before 0.2.0 (``KIND.renamed``), still importable from here with a warning until 0.3.0.
__getattr__ = renamed_attributes(__name__, KIND.renamed)
