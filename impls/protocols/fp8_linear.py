"""The public protocol for a quantized-linear (FP8) implementation under test.

A quantized-linear implementation is any object with

``name: str``
    Unique, short, printable (``"fp8_linear[mxfp8]"``, ``"mymod_fp8"``).
``kind: str``
    ``"fp8-linear"``.
``support: Fp8LinearSupport``
    What it claims to handle: the recipes (each an :class:`~reference.fp8_recipes.Fp8Recipe` with all its
    parameters), input dtypes, devices, ``save_original_input`` values, bias, and the unit roundoff of its
    GEMM accumulation. The suite checks everything declared and nothing else.
``__call__(x, weight, bias=None, *, recipe, save_original_input, scaling_state=None) -> y``
    ``x`` ``[M, K]`` and ``weight`` ``[N, K]`` of one dtype in ``support.dtypes`` (both ``requires_grad``),
    ``bias`` ``[N]`` or ``None``. Returns ``y = Q(x)·Q(W)ᵀ + b`` ``[M, N]`` in ``x``'s dtype, connected
    to autograd; ``y.backward(dy)`` must fill ``x.grad`` (dgrad), ``weight.grad`` (wgrad) and
    ``bias.grad`` in their own dtypes (``bias.grad`` = Σ_i dy_i of the unquantized dy, summed in at least
    fp32). Only 2-D ``x`` is passed. Semantics — formats, blocks, scales, the rounded cast, which
    operand is quantized along which dimension in each GEMM, shapes not divisible by blocks — are those of
    the float64 oracle :func:`reference.fp8_linear.quantized_linear`; the module docstrings of
    :mod:`reference.fp8_recipes` and :mod:`reference.fp8_scaling` state them.
``quantize(t, *, recipe, role, usage, scaling_state=None) -> QuantizedTensor`` (only when ``support.exposes_quantize``)
    The impl's own quantizer, for bitwise checks: ``role`` in ``"x" | "w" | "dy"``, ``usage`` in
    ``"rowwise" | "columnwise"``; for delayed recipes the scale is ``scaling_state.scale(role)`` and
    nothing is recorded. Results are in ``t``'s orientation (see :class:`QuantizedTensor`).

``save_original_input`` (TransformerEngine PR #1865):

* ``False``: forward quantizes x rowwise (for fprop) and columnwise (kept for wgrad) and saves the
  columnwise FP8 copy — never x itself.
* ``True``: forward quantizes x rowwise only and saves **x itself** (the caller's tensor, same storage);
  backward quantizes it columnwise. ``y``, ``dgrad``, ``wgrad`` and ``bgrad`` must be bitwise identical
  to the ``False`` run.
* With a ``delayed`` recipe, ``True`` must raise ``ValueError`` whose message names ``save_original_input``
  (the amax history changes between forward and backward, so the backward could not reproduce the bits).

**What is held for backward** (checked by :func:`held_for_backward`): everything the impl keeps from
forward to backward must be visible to the suite: saved through autograd (``ctx.save_for_backward``, or
by autograd-recorded ops — both pass through ``torch.autograd.graph.saved_tensors_hooks``) or stored as
tensor attributes of the ``ctx`` of a custom ``autograd.Function`` (the suite scans those too). The bytes
held are those of the distinct storages seen, leaving out the storages of the caller's x, weight and
bias. The recipe predicts the difference between the two modes exactly: held(False) − held(True) =
the columnwise copy of x = ``M·K`` bytes of FP8 data plus its scales, unpadded —
4 bytes for the one fp32 scale of per-tensor recipes, ``4·K·ceil(M/128)`` for blockwise,
``K·ceil(M/32)`` E8M0 bytes for MXFP8 (:func:`predicted_columnwise_x_bytes`). Nothing else may differ.

**Delayed scaling** needs state across steps; the suite owns it as a :class:`DelayedScalingState` and
passes it as ``scaling_state``. The impl quantizes role ``r`` with ``scaling_state.scale(r)`` (a binary32
value; :meth:`DelayedScalingState.scale_tensor` gives it as a tensor) and records the amax it observed
(max |t| over the tensor, NaN ignored) with ``scaling_state.record(r, amax)`` exactly once per step and
role: x and W in forward, dy in backward. The suite calls :meth:`DelayedScalingState.update` between
steps (the rule is :func:`reference.fp8_scaling.delayed_scale_update`).

**Non-finite inputs.** NaN elements are ignored by amax and quantize to NaN; ±inf makes amax inf (scale 1
for per-tensor and blockwise scaling, E8M0 code 254 for MXFP8) and saturates to ±max. Outputs whose
reduction contains a NaN operand must be NaN. Outputs whose reduction contains an operand whose
dequantized value lies beyond binary32's range (only an MXFP8 block with an inf, dequantized at 2^127),
or a nonzero element of an MXFP8 block whose E8M0 code is 0 (amax below about 2^−118, where TE, torchao
and the OCP rule differ), are unspecified. Every other output is compared with the oracle as usual.

The simplest way to write one is :func:`fp8_linear_impl` (or :class:`Fp8FunctionImpl` directly); the
declaration is checked where it is written (:class:`~numcheck.impls.protocols.declaration.InvalidDeclaration`)::

    from numcheck import fp8_linear_impl

    @fp8_linear_impl(name="mine", recipes=("current",), dtypes=("bfloat16",))
    def mine(x, weight, bias=None, *, recipe, save_original_input, scaling_state=None):
        ...

and name it with ``--impl mypkg.mymod:mine`` or ``NUMCHECK_IMPLS``, or an entry point in the
``numcheck.impls`` group.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Iterable, NamedTuple

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from numcheck.errors import InvalidDeclaration
from numcheck.impls.protocols import declaration as decl
from numcheck.impls.protocols.declaration import invalid
from numcheck.impls.protocols.kind import Kind, renamed_attributes
from numcheck.reference.fp8_formats import F64, FP32_MAX, round_to_fp32
from numcheck.reference.fp8_recipes import RECIPE_KINDS, ROLES, Fp8Recipe, standard_recipes
from numcheck.reference.fp8_scaling import block_grid, delayed_scale_update

__all__ = [
    "DelayedScalingState",
    "Fp8Recipe",
    "InvalidDeclaration",
    "Fp8FunctionImpl",
    "Fp8LinearSupport",
    "QuantizedTensor",
    "held_for_backward",
    "make_fp8_support",
    "predicted_columnwise_x_bytes",
    "fp8_linear_impl",
    "standard_recipes",
    "validate_fp8_linear_impl",
]

QUANT_DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16, torch.float16)
_RECIPE_ALIASES: dict[str, str] = {
    "tensorwise": "current",
    "per_tensor": "current",
    "mx": "mxfp8",
    "blockwise_fp8": "blockwise",
    "block": "blockwise",
}

#: The ``kind`` of a quantized linear impl (the only place that spells it).
FP8_KIND = "fp8-linear"


@dataclass(frozen=True)
class QuantizedTensor:
    """What an impl's ``quantize`` returns, in the source tensor's orientation ``[R, C]``.

    Attributes:
        data: the FP8 codes ``[R, C]``, as a ``torch.float8_*`` tensor or ``uint8``.
        scale_inv: fp32 dequantization scales ``[ceil(R/br), ceil(C/bc)]`` (one element for per-tensor).
        scale_code: for MXFP8, the E8M0 codes (``uint8``, same shape as ``scale_inv``); else ``None``.
    """

    data: torch.Tensor
    scale_inv: torch.Tensor
    scale_code: torch.Tensor | None = None


def _declared_recipes(own: str, value: object) -> tuple[Fp8Recipe, ...]:
    """``recipes`` as :class:`Fp8Recipe` objects (a kind name stands for that kind's defaults); none is invalid."""
    recipes = decl.collection(own, "recipes", value, "(Fp8Recipe('current'),)")
    if not recipes:
        raise invalid(
            f"{own}.recipes is empty: the suite could draw no case for the impl",
            "Name at least one recipe, e.g. recipes=(Fp8Recipe('current'),) or recipes=('current',).",
        )
    out = []
    for r in recipes:
        if isinstance(r, str):  # a recipe kind with its default parameters
            if r not in RECIPE_KINDS:
                raise invalid(
                    f"{own}.recipes names {r!r}, which is not a recipe kind",
                    f"Recipe kinds are {RECIPE_KINDS}; give Fp8Recipe(kind, ...) for other "
                    f"parameters.{decl.did_you_mean(r, RECIPE_KINDS, _RECIPE_ALIASES)}",
                )
            r = Fp8Recipe(r)
        if not isinstance(r, Fp8Recipe):
            raise invalid(
                f"{own}.recipes must hold Fp8Recipe objects (or recipe kind names), got {r!r}",
                f"e.g. recipes=(Fp8Recipe('current'), Fp8Recipe('mxfp8')); kinds: {RECIPE_KINDS}.",
            )
        out.append(r)
    return tuple(out)


def _declared_save_original_input(own: str, value: object) -> frozenset[bool]:
    """``save_original_input`` as a frozenset: a non-empty collection of bools."""
    soi = decl.collection(own, "save_original_input", value, "(False, True)")
    if not soi or any(not isinstance(v, bool) for v in soi):
        raise invalid(
            f"{own}.save_original_input={value!r} must be a non-empty collection of False and/or True",
            "e.g. save_original_input=(False, True), or (False,) without PR #1865.",
        )
    return frozenset(soi)


class _PerDevice(NamedTuple):
    """A field declared once or per device type: what each value ``must`` be and the test of it (``ok``), and how
    to fix a mapping that misses a declared device (``fix_missing``) or a wrong value (``fix_value``)."""

    must: str
    ok: Callable[[Any], bool]
    fix_missing: str
    fix_value: str


_PER_DEVICE: dict[str, _PerDevice] = {
    "accum_unit_roundoff": _PerDevice(
        "floats in (0, 0.5)",
        lambda v: isinstance(v, float) and 0.0 < v < 0.5,
        "Give one float per declared device, e.g. {'cpu': 2.0**-24, 'cuda': 2.0**-13}.",
        "Give the GEMM accumulation's unit roundoff: 2.0**-24 for fp32, 2.0**-13 for Hopper's FP8 tensor cores.",
    ),
    "accum_chunk": _PerDevice(
        "positive ints or None",
        lambda c: c is None or (isinstance(c, int) and not isinstance(c, bool) and c >= 1),
        "Give one entry per declared device (an int, or None for no promotion).",
        "Give the promotion interval in products, or None when the whole reduction runs at accum_unit_roundoff.",
    ),
    "accum_block": _PerDevice(
        "positive ints or None",
        lambda c: c is None or (isinstance(c, int) and not isinstance(c, bool) and c >= 1),
        "Give one entry per declared device (an int, or None where each addition is rounded on its own).",
        "Give the products one truncating accumulator step adds (32 for Hopper's FP8 tensor cores), or None where "
        "each addition is rounded on its own (IEEE fp32).",
    ),
}


#: The dimensions ``dim_multiple`` names: x ``[M, K]``, W ``[N, K]``.
SHAPE_DIMS: tuple[str, ...] = ("M", "K", "N")


def _declared_dim_multiple(own: str, value: object) -> object:
    """``dim_multiple`` as stored: an int >= 1, or a read-only mapping of some of ``M``, ``K``, ``N`` to ints >= 1."""
    ok = lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1  # noqa: E731
    if isinstance(value, Mapping):
        unknown = sorted(set(value) - set(SHAPE_DIMS), key=str)
        if unknown:
            raise invalid(
                f"{own}.dim_multiple names {unknown}, which are not dimensions of x [M, K] and W [N, K]",
                f"Name some of {list(SHAPE_DIMS)}, e.g. dim_multiple={{'K': 16, 'N': 16}}.{_dim_hint(unknown)}",
            )
        if not all(ok(v) for v in value.values()):
            raise invalid(
                f"{own}.dim_multiple={dict(value)!r} must map each dimension to an int >= 1",
                "e.g. dim_multiple={'M': 16, 'K': 16, 'N': 16} (1 or left out: any size).",
            )
        return MappingProxyType(dict(value))
    if not ok(value):
        raise invalid(
            f"{own}.dim_multiple={value!r} must be an int >= 1 or a mapping of 'M', 'K', 'N' to ints >= 1",
            "e.g. dim_multiple=16 (M, K and N multiples of 16), or dim_multiple={'K': 32} (1: any shape).",
        )
    return value


def _dim_hint(unknown: list[Any]) -> str:
    lower = [u for u in unknown if isinstance(u, str) and u.upper() in SHAPE_DIMS]
    return f" The dimensions are upper case: {[u.upper() for u in lower]}." if lower else ""


def _multiples_text(multiples: Mapping[str, int]) -> str:
    """``"M, K, N multiples of 16"`` or ``"K multiple of 32, N multiple of 16"``: the dimensions with a multiple."""
    by: dict[int, list[str]] = {}
    for d, m in multiples.items():
        if m > 1:
            by.setdefault(m, []).append(d)
    return ", ".join(f"{', '.join(ds)} multiple{'s' if len(ds) > 1 else ''} of {m}" for m, ds in by.items()) or "any"


def _declared_per_device(own: str, name: str, value: object, devices: frozenset[str]) -> object:
    """``value`` of the :data:`_PER_DEVICE` field ``name`` as stored: a mapping, read-only, must name every declared
    device; each value (or the one value) must pass the field's test."""
    rule = _PER_DEVICE[name]
    if isinstance(value, Mapping):
        missing = set(devices) - set(value)
        if missing:
            raise invalid(f"{own}.{name} has no entry for declared devices {sorted(missing)}", rule.fix_missing)
        stored, values = MappingProxyType(dict(value)), list(value.values())
    else:
        stored, values = value, [value]
    if not all(rule.ok(v) for v in values):
        raise invalid(f"{own}.{name} must be {rule.must}, got {value!r}", rule.fix_value)
    return stored


def _on_device(support: Any, name: str, device: str | torch.device) -> Any:
    """The value of the per-device field ``name`` of ``support`` for ``device``'s type."""
    dev = torch.device(device).type
    v = getattr(support, name)
    if isinstance(v, Mapping):
        if dev not in v:
            raise ValueError(f"{name} declares no entry for device {dev!r} (has {sorted(v)})")
        v = v[dev]
    return v


def _check_accum_block(own: str, support: Any) -> None:
    """``accum_block``: only on the single linear (the grouped and tensor-parallel bounds do not model it), and where
    both are declared on a device, ``accum_chunk`` a multiple of it (a chain restarts at a step's boundary)."""
    if all(_on_device(support, "accum_block", d) is None for d in support.devices):
        return
    if own != "Fp8LinearSupport":
        raise invalid(
            f"{own}.accum_block={support.accum_block!r}: the {own} bound does not model truncating block steps",
            "Leave accum_block out and declare accum_unit_roundoff (and accum_chunk) only.",
        )
    for d in sorted(support.devices):
        block, chunk = _on_device(support, "accum_block", d), _on_device(support, "accum_chunk", d)
        if block is not None and chunk is not None and chunk % block:
            raise invalid(
                f"{own}.accum_chunk={chunk} on {d!r} is not a multiple of accum_block={block}",
                "A chain restarts at a step's boundary: declare accum_chunk as a multiple of accum_block "
                "(Hopper: accum_block=32, accum_chunk=128).",
            )


@dataclass(frozen=True)
class Fp8LinearSupport:
    """What a quantized-linear implementation declares.

    Attributes:
        recipes: the recipes it implements (exact parameter sets; the suite runs each).
        dtypes: dtypes of x and weight (also of y and the gradients).
        devices: device types.
        save_original_input: the values of ``save_original_input`` it accepts.
        bias: whether a bias may be passed.
        accum_unit_roundoff: unit roundoff of its GEMM accumulation — one float for every device, or
            ``{device_type: float}`` when it differs by device (2⁻²⁴ for fp32 accumulation; Hopper's FP8
            tensor cores keep about 14 bits, so native CUDA FP8 GEMMs declare 2⁻¹³).
        accum_chunk: partial sums over at most this many consecutive products are accumulated at
            ``accum_unit_roundoff`` and then added in fp32 (promotion interval); ``None`` when the whole
            reduction runs at ``accum_unit_roundoff``. A scalar or ``{device_type: int | None}``.
            Together they set the accuracy bound (:mod:`properties.fp8.tolerance`).
        accum_block: the accumulator adds this many products per step, each aligned to the step's largest exponent
            (the running sum's included) and truncated toward zero to ``accum_unit_roundoff`` of it, then the step's
            sum truncated to ``accum_unit_roundoff`` of itself (Hopper's FP8 tensor cores: 32 products, 2⁻¹³); a chain
            of such steps restarts every ``accum_chunk`` products (``None``: one chain, ``use_fast_accum=True``).
            ``None`` (the default): every addition rounds on its own. A scalar or ``{device_type: int | None}``;
            ``accum_chunk`` must be a multiple of it. Its bound grows linearly in the chain's length on same-sign
            data (truncation errors all have one sign), :mod:`properties.fp8.tolerance`.
        exposes_quantize: it has a ``quantize`` method (enables the bitwise quantizer properties).
        bias_after_output_rounding: ``y`` is ``fl(fl(x·Wᵀ) + b)``: the product is rounded to the output dtype and
            the bias added after, in the output dtype (torchao's ``Float8Linear``), instead of inside the
            accumulation; the bound of ``y`` then counts that rounding of the bias-free product.
        dim_multiple: the shapes it takes: M, K and N (x ``[M, K]``, W ``[N, K]``) each a multiple of this int, or
            ``{"M": m, "K": k, "N": n}`` per dimension (a dimension left out: any size). 1 (the default): any
            shape. ``torch._scaled_mm`` needs K and N multiples of 16 in every GEMM, and backward reduces over M
            and N too, so an impl running all three GEMMs on it declares ``dim_multiple=16``; an MXFP8 kernel
            without partial blocks ``dim_multiple=32``. The suite draws only such shapes; a regime no such shape
            reaches (a partial scale block when every dimension is a multiple of the block) is skipped with the
            reason.
        slow: costly here (a GEMM modelled in Python, an interpreter): the drawn tests run a quarter of the
            profile's examples on it (:func:`properties.core.runner.budget`).
        requires: returns ``None`` when it can run here, else the reason (checked before every use).
    """

    recipes: tuple[Fp8Recipe, ...] = field(default_factory=standard_recipes)
    dtypes: frozenset[torch.dtype] = frozenset({torch.float32, torch.bfloat16})
    devices: frozenset[str] = frozenset({"cpu", "cuda"})
    save_original_input: frozenset[bool] = frozenset({False, True})
    bias: bool = True
    accum_unit_roundoff: float | Mapping[str, float] = 2.0**-24
    accum_chunk: int | None | Mapping[str, int | None] = None
    accum_block: int | None | Mapping[str, int | None] = None
    exposes_quantize: bool = False
    bias_after_output_rounding: bool = False
    dim_multiple: int | Mapping[str, int] = 1
    slow: bool = False
    requires: Callable[[], str | None] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        own = type(self).__name__  # a subclass (the grouped declaration) names itself
        set_ = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731 - a frozen dataclass
        set_("recipes", _declared_recipes(own, self.recipes))
        set_("dtypes", decl.dtypes(own, "dtypes", self.dtypes, QUANT_DTYPES, empty_ok=False))
        set_("devices", decl.device_types(own, self.devices))
        set_("save_original_input", _declared_save_original_input(own, self.save_original_input))
        decl.bools(own, self, ("bias", "exposes_quantize", "bias_after_output_rounding", "slow"))
        decl.requirement(own, self.requires)
        for name in _PER_DEVICE:
            set_(name, _declared_per_device(own, name, getattr(self, name), self.devices))
        set_("dim_multiple", _declared_dim_multiple(own, self.dim_multiple))
        _check_accum_block(own, self)

    @property
    def dim_multiples(self) -> dict[str, int]:
        """``{"M": m, "K": k, "N": n}``: the multiple each dimension must be (1: any size), from ``dim_multiple``."""
        v = self.dim_multiple
        return {d: (v.get(d, 1) if isinstance(v, Mapping) else v) for d in SHAPE_DIMS}

    def shape_refusal(self, M: int, K: int, N: int) -> str | None:
        """Why x ``[M, K]`` and W ``[N, K]`` are outside ``dim_multiple``, or ``None``."""
        bad = [f"{d}={v}" for (d, m), v in zip(self.dim_multiples.items(), (M, K, N)) if v % m]
        if not bad:
            return None
        return f"{', '.join(bad)} not a multiple of the declared dim_multiple ({_multiples_text(self.dim_multiples)})"

    def unavailable_reason(self) -> str | None:
        """Why the impl cannot run on this machine at all, or ``None``."""
        return decl.requirement_unmet(self.requires)

    def accumulation(self, device: str | torch.device) -> tuple[float, int | None]:
        """``(unit roundoff, promotion chunk or None)`` of the GEMM accumulation declared for ``device``."""
        u, chunk = (_on_device(self, name, device) for name in ("accum_unit_roundoff", "accum_chunk"))
        return float(u), chunk

    def accumulation_block(self, device: str | torch.device) -> int | None:
        """``accum_block`` declared for ``device``: products per truncating accumulator step, or ``None``."""
        return _on_device(self, "accum_block", device)

    def refuses(
        self,
        *,
        recipe: Fp8Recipe,
        dtype: torch.dtype,
        device: str,
        save_original_input: bool = False,
        bias: bool = False,
        shape: tuple[int, int, int] | None = None,
    ) -> str | None:
        """The reason this declaration excludes a case, or ``None`` when the case is declared supported.
        ``shape``: the case's ``(M, K, N)``, checked against ``dim_multiple`` when given.

        Delayed scaling with ``save_original_input=True`` is *not* refused here: the impl must raise
        ``ValueError`` for it (a property checks that).
        """
        if recipe not in self.recipes:
            return f"recipe {recipe.name} not declared"
        if dtype not in self.dtypes:
            return f"dtype {dtype} not declared"
        if torch.device(device).type not in self.devices:
            return f"device {device} not declared"
        if bool(save_original_input) not in self.save_original_input:
            return f"save_original_input={save_original_input} not declared"
        if bias and not self.bias:
            return "bias not declared"
        return None if shape is None else self.shape_refusal(*shape)

    def describe(self) -> str:
        """Multi-line description for ``numcheck list``."""
        dts = ",".join(sorted(str(d).replace("torch.", "") for d in self.dtypes))
        soi = ",".join(str(v) for v in sorted(self.save_original_input))
        lines = [
            f"dtypes: {dts}; devices: {','.join(sorted(self.devices))}; bias: {'yes' if self.bias else 'no'}"
            + (", added after y is rounded to the output dtype" if self.bias_after_output_rounding else ""),
            f"save_original_input: {soi}; accumulation unit roundoff: {self._accum_text()}; "
            f"quantize exposed: {'yes' if self.exposes_quantize else 'no'}",
            "recipes: " + ", ".join(r.name for r in self.recipes),
        ]
        if any(m > 1 for m in self.dim_multiples.values()):
            lines[0] += f"; shapes: {_multiples_text(self.dim_multiples)}"
        return "\n".join(lines)

    def _accum_text(self) -> str:
        parts = []
        for d in sorted(self.devices):
            try:
                u, c = self.accumulation(d)
            except ValueError:
                continue
            b = self.accumulation_block(d)
            if b:
                chain = f"chains of {c} added in fp32" if c else "one chain"
                parts.append(f"{d} 2^{_log2(u)} truncated every {b} products, {chain}")
            else:
                parts.append(f"{d} 2^{_log2(u)}" + (f" promoted to fp32 every {c}" if c else ""))
        return ", ".join(parts)


def _log2(v: float) -> str:
    import math

    e = math.log2(v)
    return f"{e:.0f}" if e == int(e) else f"{e:.2f}"


class DelayedScalingState:
    """The amax histories and stored scales of one delayed-scaling linear, owned by the suite.

    Roles ``x``, ``w``, ``dy``; initial scale 1. Per step the impl calls :meth:`record` once per role;
    :meth:`update` then appends the recorded amaxes to the windows and recomputes the scales.
    """

    def __init__(self, recipe: Fp8Recipe) -> None:
        if recipe.kind != "delayed":
            raise ValueError(f"DelayedScalingState needs a delayed recipe, got {recipe.name}")
        self.recipe = recipe
        self._scales: dict[str, float] = {r: 1.0 for r in ROLES}
        self.history: dict[str, list[float]] = {r: [] for r in ROLES}
        self.pending: dict[str, float] = {}

    def scale(self, role: str) -> float:
        """The stored scale of ``role`` (a binary32 value)."""
        if role not in ROLES:
            raise ValueError(f"role={role!r} is not one of {ROLES}")
        return self._scales[role]

    def scale_tensor(self, role: str, device: torch.device | str = "cpu") -> torch.Tensor:
        """The stored scale as a 0-d float32 tensor on ``device``."""
        return torch.tensor(self.scale(role), dtype=torch.float32, device=device)

    def set_scale(self, role: str, value: float) -> None:
        """Set a stored scale (tests use it to start from a chosen state); rounded to binary32."""
        v = float(round_to_fp32(torch.tensor(float(value), dtype=F64)))
        if not (v > 0 and v <= FP32_MAX):
            raise ValueError(f"scale for {role!r} must be positive and finite in binary32, got {value!r}")
        self.scale(role)
        self._scales[role] = v

    def record(self, role: str, amax: float | torch.Tensor) -> None:
        """Record the amax the impl observed for ``role`` in this step (once per role and step)."""
        self.scale(role)
        if role in self.pending:
            raise RuntimeError(f"delayed scaling: amax of {role!r} recorded twice in one step")
        self.pending[role] = float(amax.detach().float().cpu()) if isinstance(amax, torch.Tensor) else float(amax)

    def update(self) -> None:
        """End of step: append the recorded amaxes to the windows, recompute the scales, clear pending."""
        r = self.recipe
        for role, amax in self.pending.items():
            h = self.history[role]
            h.append(amax)
            del h[: max(0, len(h) - r.amax_history_len)]
            fmax = r.format_of(role).max_finite
            self._scales[role] = delayed_scale_update(
                h, self._scales[role], fmax, margin=r.margin, algo=r.amax_compute_algo
            )
        self.pending = {}


def predicted_columnwise_x_bytes(recipe: Fp8Recipe, M: int, K: int) -> int:
    """Bytes of the columnwise FP8 copy of ``x`` ``[M, K]``: data plus unpadded scales (protocol docstring); 0 for a
    recipe whose wgrad reads x in high precision (``rowwise_gw_hp``: there is no FP8 copy of x)."""
    if M < 1 or K < 1:
        raise ValueError(f"M and K must be positive, got M={M}, K={K}")
    if "columnwise" not in recipe.usages_of("x"):
        return 0
    block = recipe.block_of("x", "columnwise")
    nr, nc = block_grid((M, K), block)
    per_scale = 1 if recipe.scale_is_e8m0 else 4
    return M * K + nr * nc * per_scale


@dataclass
class HeldTensors:
    """What an autograd graph holds for backward (see :func:`held_for_backward`).

    Attributes:
        storages: ``{storage pointer: nbytes}`` of every distinct storage seen.
        tensors: ``(description, tensor)`` for every saved tensor or ctx tensor attribute seen.
    """

    storages: dict[int, int] = field(default_factory=dict)
    tensors: list[tuple[str, torch.Tensor]] = field(default_factory=list)

    def add(self, desc: str, t: torch.Tensor) -> None:
        if not isinstance(t, torch.Tensor) or t.is_meta:
            return
        if is_traceable_wrapper_subclass(t):  # a wrapper (torchao's Float8Tensor) has no storage: count its parts
            for attr in t.__tensor_flatten__()[0]:
                self.add(f"{desc}.{attr}", getattr(t, attr))
            return
        st = t.untyped_storage()
        self.storages.setdefault(st.data_ptr(), st.nbytes())
        self.tensors.append((desc, t))

    def new_bytes(self, exclude: Iterable[torch.Tensor | None]) -> int:
        """Bytes of the storages held, leaving out those of ``exclude`` (the caller's own tensors)."""
        skip = {t.untyped_storage().data_ptr() for t in exclude if t is not None}
        return sum(n for p, n in self.storages.items() if p not in skip)

    def holds_storage_of(self, t: torch.Tensor) -> bool:
        return t.untyped_storage().data_ptr() in self.storages

    def aliases(self, t: torch.Tensor) -> list[str]:
        """Descriptions of held tensors that are views of ``t``'s storage."""
        p = t.untyped_storage().data_ptr()
        return [d for d, s in self.tensors if s.untyped_storage().data_ptr() == p]


class held_for_backward:
    """Context manager recording what the forward inside it keeps for backward.

    ``with held_for_backward() as held: y = impl(...)`` then ``held.scan(y)`` adds the tensor attributes of
    custom-Function ctx objects reachable from ``y.grad_fn``; ``held.result`` is the :class:`HeldTensors`.
    """

    def __init__(self) -> None:
        self.result = HeldTensors()
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._n = 0

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        self._n += 1
        self.result.add(f"saved#{self._n} {tuple(t.shape)} {t.dtype}", t)
        return t

    @staticmethod
    def _unpack(t: torch.Tensor) -> torch.Tensor:
        return t

    def __enter__(self) -> "held_for_backward":
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._hooks.__exit__(*exc)

    def scan(self, out: torch.Tensor) -> HeldTensors:
        """Add tensors held as attributes of custom-Function nodes reachable from ``out.grad_fn``."""
        seen: set[int] = set()
        stack = [out.grad_fn] if out.grad_fn is not None else []
        while stack:
            node = stack.pop()
            if node is None or id(node) in seen:
                continue
            seen.add(id(node))
            attrs = getattr(node, "__dict__", {}) or {}
            for k, v in attrs.items():
                vals = v if isinstance(v, (list, tuple)) else [v]
                for i, t in enumerate(vals):
                    if isinstance(t, torch.Tensor):
                        self.result.add(
                            f"ctx.{k}"
                            + (f"[{i}]" if isinstance(v, (list, tuple)) else "")
                            + f" {tuple(t.shape)} {t.dtype}",
                            t,
                        )
            for nxt, _ in getattr(node, "next_functions", ()) or ():
                stack.append(nxt)
        return self.result


#: The keywords every quantized-linear call passes (after ``x, weight, bias``), and every ``quantize`` call (after ``t``).
CALL_KEYWORDS: tuple[str, ...] = ("recipe", "save_original_input", "scaling_state")
QUANTIZE_KEYWORDS: tuple[str, ...] = ("recipe", "role", "usage", "scaling_state")


def call_refusal(fn: Callable[..., Any], positional: int, keywords: tuple[str, ...]) -> str | None:
    """Why ``fn`` cannot be called with ``positional`` positional arguments and ``keywords``, with a fix; ``None``
    when it can, or when its signature cannot be read (a C callable: calling it will tell)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    try:
        sig.bind(*([None] * positional), **dict.fromkeys(keywords))
    except TypeError as exc:
        label = f"{getattr(fn, '__name__', type(fn).__name__)}{sig}"
        var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values())
        missing = [
            k
            for k in keywords
            if not var_kw
            and (
                k not in sig.parameters
                or sig.parameters[k].kind
                not in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
            )
        ]
        if missing:
            return f"{label} takes no keyword {', '.join(missing)}, which every call passes: add it to the signature."
        return (
            f"{label} cannot be called with {positional} positional arguments and the keywords "
            f"{', '.join(keywords)}: {exc}."
        )
    return None


@dataclass(frozen=True)
class Fp8FunctionImpl:
    """A quantized-linear impl made from a plain function (and optionally a quantizer).

    Built, it has checked that ``fn`` takes ``(x, weight, bias, *, recipe, save_original_input, scaling_state)``,
    that ``quantize_fn`` (if any) takes ``(t, *, recipe, role, usage, scaling_state)``, and that
    ``support.exposes_quantize`` has a ``quantize_fn``; an :class:`InvalidDeclaration` names the building line."""

    name: str
    fn: Callable[..., torch.Tensor] = field(repr=False)
    support: Fp8LinearSupport = field(default_factory=Fp8LinearSupport)
    quantize_fn: Callable[..., QuantizedTensor] | None = field(default=None, repr=False)
    kind: str = FP8_KIND
    description: str = ""

    def __post_init__(self) -> None:
        decl.built(
            self,
            Fp8LinearSupport,
            "Build it with numcheck.make_fp8_support(...) or Fp8LinearSupport(...).",
            "mymod_fp8",
            _calls(self.fn, self.quantize_fn, "fn", "quantize_fn"),
            "the calls the suite makes",
        )
        if self.support.exposes_quantize and self.quantize_fn is None:
            raise invalid(
                f"impl {self.name!r} declares exposes_quantize=True but has no quantize_fn",
                "Pass quantize_fn=... (quantize= to fp8_linear_impl), or declare exposes_quantize=False.",
            )

    def __call__(self, x, weight, bias=None, *, recipe, save_original_input, scaling_state=None):  # noqa: D102
        return self.fn(
            x, weight, bias, recipe=recipe, save_original_input=save_original_input, scaling_state=scaling_state
        )

    def quantize(self, t, *, recipe, role, usage, scaling_state=None):  # noqa: D102 - see the module docstring
        if self.quantize_fn is None:
            raise NotImplementedError(f"impl {self.name!r} does not expose quantize")
        return self.quantize_fn(t, recipe=recipe, role=role, usage=usage, scaling_state=scaling_state)


#: The keywords :func:`make_fp8_support` and :func:`fp8_linear_impl` take for the declaration.
SUPPORT_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Fp8LinearSupport))


def make_fp8_support(**fields: Any) -> Fp8LinearSupport:
    """Build a :class:`Fp8LinearSupport` from its field names; omitted fields keep their defaults.

    ``recipes`` may hold :class:`Fp8Recipe` objects or recipe kind names (``"current"``: that kind's default
    parameters), ``dtypes`` ``torch.dtype`` objects or their names. Every value is checked here and an
    :class:`InvalidDeclaration` names the calling line, what is wrong and how to fix it.

    >>> sorted(r.name for r in make_fp8_support(recipes=("current", "mxfp8"), dtypes=("bfloat16",)).recipes)
    ['current-hybrid', 'mxfp8-e4m3-rceil']
    """
    decl.unknown_keywords("make_fp8_support()", fields, SUPPORT_FIELDS)
    return Fp8LinearSupport(**fields)


def fp8_linear_impl(
    *, name: str, description: str = "", quantize: Callable[..., QuantizedTensor] | None = None, **support: Any
) -> Callable[[Callable[..., torch.Tensor]], Fp8FunctionImpl]:
    """Decorator turning a function into a quantized-linear impl the suite can load (the counterpart of
    :func:`numcheck.impls.protocols.linear_ce.linear_ce_impl`).

    The function is called ``fn(x, weight, bias, *, recipe, save_original_input, scaling_state)``; ``quantize``,
    when given, is the impl's own quantizer ``(t, *, recipe, role, usage, scaling_state)`` and sets
    ``exposes_quantize`` unless that is declared. ``support`` keywords are the fields of
    :class:`Fp8LinearSupport` (:func:`make_fp8_support`). The declaration is checked where it is written: a
    bad keyword, recipe, device type or dtype name, an empty ``recipes``/``dtypes``/``devices``, or a function
    that cannot take the suite's calls raise :class:`InvalidDeclaration` naming the decorator's ``file:line``.

    >>> import torch.nn.functional as F
    >>> @fp8_linear_impl(name="doc_unquantized", recipes=("current",), dtypes=("float32",))
    ... def unquantized(x, weight, bias=None, *, recipe, save_original_input, scaling_state=None):
    ...     return F.linear(x, weight, bias)
    >>> unquantized.kind, [r.name for r in unquantized.support.recipes]
    ('fp8-linear', ['current-hybrid'])

    An impl that takes only some shapes declares them with ``dim_multiple`` (one int for M, K and N, or per
    dimension), and the suite draws only those shapes: here all three GEMMs run on ``torch._scaled_mm``, whose
    operands need K and N multiples of 16 (backward reduces over M and N):

    >>> @fp8_linear_impl(name="doc_scaled_mm", recipes=("current",), devices=("cuda",), dim_multiple=16)
    ... def on_scaled_mm(x, weight, bias=None, *, recipe, save_original_input, scaling_state=None):
    ...     ...
    >>> on_scaled_mm.support.dim_multiples, on_scaled_mm.support.shape_refusal(M=33, K=48, N=16)
    ({'M': 16, 'K': 16, 'N': 16}, 'M=33 not a multiple of the declared dim_multiple (M, K, N multiples of 16)')
    """
    site, owner = decl.opening("fp8_linear_impl", name, support, SUPPORT_FIELDS, "mymod_fp8")
    if quantize is not None and "exposes_quantize" not in support:
        support = {**support, "exposes_quantize": True}
    declared = make_fp8_support(**support)

    def wrap(fn: Callable[..., torch.Tensor]) -> Fp8FunctionImpl:
        doc = decl.decorated(
            owner,
            site,
            fn,
            "Put the decorator on the function computing y = Q(x)·Q(W)ᵀ + b.",
            _calls(fn, quantize, "its function", "its quantize"),
            "the calls the suite makes",
            description,
        )
        if declared.exposes_quantize and quantize is None:
            raise invalid(
                f"{owner} declares exposes_quantize=True without quantize=",
                "Pass quantize=my_quantizer, or leave exposes_quantize out.",
                site=site,
            )
        return Fp8FunctionImpl(name=name, fn=fn, support=declared, quantize_fn=quantize, description=doc)

    return wrap


def _calls(fn: object, quantize: object, fn_label: str, quantize_label: str) -> list[decl.Call]:
    """The two calls a quantized linear must take: the linear itself and (when it has one) its quantizer."""
    return [
        (fn_label, fn, lambda f: call_refusal(f, 3, CALL_KEYWORDS)),
        (quantize_label, quantize, lambda f: call_refusal(f, 1, QUANTIZE_KEYWORDS)),
    ]


def validate_fp8_linear_impl(obj: Any, origin: str) -> None:
    """Raise ``TypeError`` naming ``origin`` when ``obj`` does not follow this protocol (including a call or
    ``quantize`` signature that cannot take the suite's calls: :func:`call_refusal`)."""
    name = getattr(obj, "name", None)
    if isinstance(name, str) and name and getattr(obj, "kind", None) != FP8_KIND:
        raise TypeError(f"{origin}: impl {name!r} has kind {getattr(obj, 'kind', None)!r}, expected {FP8_KIND!r}")
    sup = getattr(obj, "support", None)
    typed = isinstance(sup, Fp8LinearSupport)
    checks = [(typed, f"needs 'support' of type impls.protocols.fp8_linear.Fp8LinearSupport, got {type(sup).__name__}")]
    checks += [(callable(getattr(sup, a, None)), f"support lacks {a}()") for a in ("unavailable_reason", "describe")]
    checks += [
        (callable(obj), "is not callable"),
        (
            not (typed and sup.exposes_quantize) or callable(getattr(obj, "quantize", None)),
            "declares exposes_quantize but has no callable 'quantize'",
        ),
        (
            not typed or all(r.kind in RECIPE_KINDS for r in sup.recipes),
            f"declares unknown recipes {[r for r in getattr(sup, 'recipes', ()) if r.kind not in RECIPE_KINDS]!r}",
        ),
    ]
    own = isinstance(obj, Fp8FunctionImpl)
    quantize = (obj.quantize_fn if own else getattr(obj, "quantize", None)) if typed and sup.exposes_quantize else None
    decl.conformance(
        obj,
        origin,
        FP8_KIND,
        checks,
        _calls(obj.fn if own else obj, quantize, ": its call", ": its quantize"),
        "the calls the suite makes",
    )


#: The quantized-linear kind, as every layer iterates it (:mod:`impls.protocols.kinds`).
KIND = Kind(
    name=FP8_KIND,
    protocol=Fp8FunctionImpl,
    decorator=fp8_linear_impl,
    validate=validate_fp8_linear_impl,
    public=("Fp8FunctionImpl", "Fp8LinearSupport", "make_fp8_support", "fp8_linear_impl"),
    fixture="fp8_linear_impl",
    generic=True,
    former="quant_linear",
    former_fixture="quant_impl",
    renamed=(
        ("QuantFunctionImpl", "Fp8FunctionImpl"),
        ("QuantLinearSupport", "Fp8LinearSupport"),
        ("make_quant_support", "make_fp8_support"),
        ("quant_linear_impl", "fp8_linear_impl"),
    ),
)

#: The public names before 0.2.0 (``KIND.renamed``), still importable from here with a warning until 0.3.0.
__getattr__ = renamed_attributes(__name__, KIND.renamed)
