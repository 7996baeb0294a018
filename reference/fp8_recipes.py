"""FP8 recipes: which format and which scaling blocks each operand of a quantized linear uses.

A quantized linear ``y = x·Wᵀ`` (``x`` ``[M, K]``, ``W`` ``[N, K]``, upstream gradient ``dy`` ``[M, N]``)
runs three GEMMs, each reducing over one dimension; every operand is quantized with its scaling blocks
along that GEMM's reduction dimension:

==========  ==================  =========================================================
GEMM        operands            quantization (tensor as given → usage)
==========  ==================  =========================================================
fprop       y = x · Wᵀ          x rowwise (blocks along K), W rowwise (along K)
dgrad       dx = dy · W         dy rowwise (along N), W columnwise (along N)
wgrad       dW = dyᵀ · x        dy columnwise (along M), x columnwise (along M)
==========  ==================  =========================================================

"Rowwise" blocks run along a tensor's last dimension (a 1×b block), "columnwise" ones down its first
dimension (b×1). Columnwise quantization of ``t`` is, by definition, rowwise quantization of ``tᵀ``
transposed back (a property the suite checks). Block shapes per recipe kind:

===========  ==========================  ======================  ==================================
kind         x and dy                    W                       scale
===========  ==========================  ======================  ==================================
delayed      one per tensor              one per tensor          stored: from the amax history
current      one per tensor              one per tensor          fp8_max / amax of the tensor
blockwise    1×128 / 128×1               128×128 tiles (both)    fp8_max / amax of the block, fp32,
                                                                  power of 2 by default
mxfp8        1×32 / 32×1                 1×32 / 32×1             E8M0 2^k, RCEIL (TE) or FLOOR (OCP)
rowwise      1×K / M×1 (x), 1×N / M×1    1×K / N×1               fp8_max / amax of the row (column),
             (dy): whole reduction       (whole reduction)       fp32, power of 2 by default
rowwise_     fprop and dgrad as rowwise  1×K (fprop); one per    as rowwise; wgrad in high precision
gw_hp        (x 1×K, dy 1×N); wgrad:     tensor (dgrad)          (no quantization)
             not quantized
===========  ==========================  ======================  ==================================

**rowwise** and **rowwise_gw_hp** are torchao's ``Float8Linear`` recipes ``rowwise`` and ``rowwise_with_gw_hp``
(``Float8LinearConfig.from_recipe_name``; ``ScalingGranularity.AXISWISE``): one scale per row of each GEMM operand
in its K-major form, taken over the *whole* reduction dimension — a block ``(1, None)`` rowwise, ``(None, 1)``
columnwise, ``None`` on a side meaning that whole dimension. ``rowwise_gw_hp`` ("lw's recipe") keeps the wgrad GEMM
in the input precision (``ScalingType.DISABLED``: ``dW = dyᵀ · x`` of the original operands, the plain GEMM of the
input dtype) and scales W for dgrad with one scale per tensor; its x and dy are quantized rowwise only. Both default
to E4M3 for every operand (gradients included) and to power-of-2 scales, as torchao's recipes do.

Formats: ``"E4M3"`` everywhere, or ``"HYBRID"`` — E4M3 for x and W, E5M2 for dy (TransformerEngine's
default for delayed and current scaling; blockwise, MXFP8 and the rowwise kinds default to E4M3).

``save_original_input`` (TransformerEngine PR #1865) is allowed for every kind except ``delayed``: its
scale comes from an amax history that changes between forward and backward, so requantizing x in the
backward pass could not reproduce the forward's bits.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal

from numcheck.reference.fp8_formats import E4M3, E5M2, Fp8Format

RecipeKind = Literal["delayed", "current", "blockwise", "mxfp8", "rowwise", "rowwise_gw_hp"]
RECIPE_KINDS: tuple[str, ...] = ("delayed", "current", "blockwise", "mxfp8", "rowwise", "rowwise_gw_hp")
#: Kinds with one scale per row (or column) over the whole reduction dimension (torchao's AXISWISE granularity).
ROWWISE_KINDS: tuple[str, ...] = ("rowwise", "rowwise_gw_hp")
#: Kinds whose scale comes from the amax of the tensor or block being quantized (``power_of_2_scales`` and
#: ``amax_epsilon`` apply).
_AMAX_KINDS: tuple[str, ...] = ("current", "blockwise", "rowwise", "rowwise_gw_hp")
Role = Literal["x", "w", "dy"]
ROLES: tuple[str, ...] = ("x", "w", "dy")
Usage = Literal["rowwise", "columnwise"]
USAGES: tuple[str, ...] = ("rowwise", "columnwise")
FORMAT_CHOICES: tuple[str, ...] = ("E4M3", "HYBRID")
MX_ROUNDINGS: tuple[str, ...] = ("rceil", "floor")
AMAX_ALGOS: tuple[str, ...] = ("max", "most_recent")

#: Block edge of blockwise (DeepSeek-style) scaling and of MXFP8.
BLOCKWISE_BLOCK = 128
MX_BLOCK = 32

#: The GEMMs of a quantized linear: name → ((role, usage) of the left operand, (role, usage) of the right).
GEMMS: dict[str, tuple[tuple[str, str], tuple[str, str]]] = {
    "fprop": (("x", "rowwise"), ("w", "rowwise")),
    "dgrad": (("dy", "rowwise"), ("w", "columnwise")),
    "wgrad": (("dy", "columnwise"), ("x", "columnwise")),
}

_DEFAULT_FORMAT = {
    "delayed": "HYBRID",
    "current": "HYBRID",
    "blockwise": "E4M3",
    "mxfp8": "E4M3",
    "rowwise": "E4M3",
    "rowwise_gw_hp": "E4M3",
}
#: The GEMMs each kind leaves unquantized (run on the original operands in the input precision).
_HIGH_PRECISION_GEMMS: dict[str, tuple[str, ...]] = {"rowwise_gw_hp": ("wgrad",)}
#: A block side ``None``: the whole dimension (one scale per row, or per column, over the whole reduction).
Block = tuple[int | None, int | None]


@dataclass(frozen=True)
class Fp8Recipe:
    """One FP8 recipe with all its parameters (the fields that do not apply to ``kind`` must keep defaults).

    Attributes:
        kind: ``"delayed" | "current" | "blockwise" | "mxfp8" | "rowwise" | "rowwise_gw_hp"``.
        fp8_format: ``"E4M3"`` or ``"HYBRID"``; ``None`` picks the kind's default.
        power_of_2_scales: round scales down to a power of two (current, blockwise, the rowwise kinds); ``None``
            picks the default (False for current, True for blockwise and the rowwise kinds).
        amax_epsilon: floor for amax before the scale is computed (current, blockwise, the rowwise kinds); TE's
            default 0, torchao's 1e-12.
        margin: delayed scaling's margin: scale = (fp8_max / amax) / 2^margin.
        amax_history_len: delayed scaling's window length.
        amax_compute_algo: ``"max"`` over the window, or ``"most_recent"``.
        mx_scale_rounding: ``"rceil"`` (TransformerEngine: round the descale up) or ``"floor"`` (OCP MX v1.0).
    """

    kind: str
    fp8_format: str | None = None
    power_of_2_scales: bool | None = None
    amax_epsilon: float = 0.0
    margin: int = 0
    amax_history_len: int = 1024
    amax_compute_algo: str = "max"
    mx_scale_rounding: str = "rceil"

    def __post_init__(self) -> None:
        if self.kind not in RECIPE_KINDS:
            raise ValueError(f"Fp8Recipe.kind={self.kind!r} is not one of {RECIPE_KINDS}")
        fmt = self.fp8_format if self.fp8_format is not None else _DEFAULT_FORMAT[self.kind]
        if fmt not in FORMAT_CHOICES:
            raise ValueError(f"Fp8Recipe.fp8_format={self.fp8_format!r} is not one of {FORMAT_CHOICES}")
        object.__setattr__(self, "fp8_format", fmt)
        p2 = self.power_of_2_scales
        if p2 is None:
            p2 = self.kind in ("blockwise",) + ROWWISE_KINDS
        if p2 and self.kind not in _AMAX_KINDS:
            raise ValueError(f"Fp8Recipe.power_of_2_scales=True applies to {_AMAX_KINDS}, not {self.kind!r}")
        object.__setattr__(self, "power_of_2_scales", bool(p2))
        if not (self.amax_epsilon >= 0.0):
            raise ValueError(f"Fp8Recipe.amax_epsilon must be >= 0, got {self.amax_epsilon!r}")
        if self.amax_epsilon and self.kind not in _AMAX_KINDS:
            raise ValueError(f"Fp8Recipe.amax_epsilon applies to {_AMAX_KINDS}, not {self.kind!r}")
        if self.kind != "delayed" and (
            self.margin != 0 or self.amax_history_len != 1024 or self.amax_compute_algo != "max"
        ):
            raise ValueError(
                f"Fp8Recipe margin/amax_history_len/amax_compute_algo apply to 'delayed' only, not {self.kind!r}"
            )
        if not isinstance(self.margin, int) or self.margin < 0:
            raise ValueError(f"Fp8Recipe.margin must be an int >= 0, got {self.margin!r}")
        if not isinstance(self.amax_history_len, int) or self.amax_history_len < 1:
            raise ValueError(f"Fp8Recipe.amax_history_len must be an int >= 1, got {self.amax_history_len!r}")
        if self.amax_compute_algo not in AMAX_ALGOS:
            raise ValueError(f"Fp8Recipe.amax_compute_algo={self.amax_compute_algo!r} is not one of {AMAX_ALGOS}")
        if self.mx_scale_rounding not in MX_ROUNDINGS:
            raise ValueError(f"Fp8Recipe.mx_scale_rounding={self.mx_scale_rounding!r} is not one of {MX_ROUNDINGS}")
        if self.kind != "mxfp8" and self.mx_scale_rounding != "rceil":
            raise ValueError(f"Fp8Recipe.mx_scale_rounding applies to 'mxfp8' only, not {self.kind!r}")

    # -- what each operand gets -------------------------------------------------------------------------
    def format_of(self, role: str) -> Fp8Format:
        """The FP8 format of ``role`` (``"x"``, ``"w"`` or ``"dy"``)."""
        _check_role(role)
        return E5M2 if (self.fp8_format == "HYBRID" and role == "dy") else E4M3

    def block_of(self, role: str, usage: str) -> Block | None:
        """The scaling block ``(rows, cols)`` of ``role`` quantized for ``usage``; ``None`` = one per tensor, a side
        ``None`` = that whole dimension. ``ValueError`` for a (role, usage) no quantized GEMM of the recipe reads
        (x and dy columnwise under ``rowwise_gw_hp``: its wgrad is not quantized)."""
        _check_role(role)
        if usage not in USAGES:
            raise ValueError(f"usage={usage!r} is not one of {USAGES}")
        if usage not in self.usages_of(role):
            raise ValueError(
                f"recipe {self.name}: {role} is not quantized {usage} (it reads {role} only {self.usages_of(role)}: "
                f"its {'/'.join(self.high_precision_gemms)} GEMM runs in high precision)"
            )
        if self.kind in ("delayed", "current"):
            return None
        if self.kind in ROWWISE_KINDS:
            if self.kind == "rowwise_gw_hp" and (role, usage) == ("w", "columnwise"):
                return None
            return (1, None) if usage == "rowwise" else (None, 1)
        if self.kind == "blockwise":
            b = BLOCKWISE_BLOCK
            if role == "w":
                return (b, b)
            return (1, b) if usage == "rowwise" else (b, 1)
        b = MX_BLOCK
        return (1, b) if usage == "rowwise" else (b, 1)

    @property
    def high_precision_gemms(self) -> tuple[str, ...]:
        """The GEMMs (names of :data:`GEMMS`) the recipe leaves unquantized: ``("wgrad",)`` for ``rowwise_gw_hp``."""
        return _HIGH_PRECISION_GEMMS.get(self.kind, ())

    def quantizes(self, gemm: str) -> bool:
        """Whether GEMM ``gemm`` (``"fprop" | "dgrad" | "wgrad"``) reads quantized operands."""
        if gemm not in GEMMS:
            raise ValueError(f"gemm={gemm!r} is not one of {tuple(GEMMS)}")
        return gemm not in self.high_precision_gemms

    def usages_of(self, role: str) -> tuple[str, ...]:
        """The usages ``role`` is quantized for by the recipe's quantized GEMMs, in :data:`USAGES` order."""
        _check_role(role)
        used = {u for g, ops in GEMMS.items() if self.quantizes(g) for r, u in ops if r == role}
        return tuple(u for u in USAGES if u in used)

    @property
    def allows_save_original_input(self) -> bool:
        """False for delayed scaling (see the module docstring)."""
        return self.kind != "delayed"

    @property
    def scale_is_e8m0(self) -> bool:
        return self.kind == "mxfp8"

    @property
    def name(self) -> str:
        """Short label: ``current-hybrid``, ``blockwise-e4m3-pow2``, ``mxfp8-floor``, ``delayed-hybrid-m1``."""
        parts = [self.kind, str(self.fp8_format).lower()]
        if self.kind == "current" and self.power_of_2_scales:
            parts.append("pow2")
        if self.kind in ("blockwise",) + ROWWISE_KINDS:
            parts.append("pow2" if self.power_of_2_scales else "fp32")
        if self.amax_epsilon:
            parts.append(f"eps{self.amax_epsilon:g}")
        if self.kind == "mxfp8":
            parts.append(self.mx_scale_rounding)
        if self.kind == "delayed":
            if self.margin:
                parts.append(f"m{self.margin}")
            if self.amax_history_len != 1024:
                parts.append(f"h{self.amax_history_len}")
            if self.amax_compute_algo != "max":
                parts.append("recent")
        return "-".join(parts)

    def replace(self, **changes: Any) -> "Fp8Recipe":
        return replace(self, **changes)

    def __repr__(self) -> str:  # valid Python, only the fields that differ from the defaults
        base = Fp8Recipe(self.kind)
        diffs = [
            f"{k}={getattr(self, k)!r}"
            for k in (
                "fp8_format",
                "power_of_2_scales",
                "amax_epsilon",
                "margin",
                "amax_history_len",
                "amax_compute_algo",
                "mx_scale_rounding",
            )
            if getattr(self, k) != getattr(base, k)
        ]
        return "Fp8Recipe(" + ", ".join([repr(self.kind)] + diffs) + ")"


def _check_role(role: str) -> None:
    if role not in ROLES:
        raise ValueError(f"role={role!r} is not one of {ROLES}")


def standard_recipes() -> tuple[Fp8Recipe, ...]:
    """The recipe variants the built-in impls declare and the suite draws from by default."""
    return (
        Fp8Recipe("delayed"),
        Fp8Recipe("delayed", margin=1, amax_history_len=4, amax_compute_algo="most_recent"),
        Fp8Recipe("current"),
        Fp8Recipe("current", fp8_format="E4M3", power_of_2_scales=True),
        Fp8Recipe("blockwise"),
        Fp8Recipe("blockwise", power_of_2_scales=False),
        Fp8Recipe("mxfp8"),
        Fp8Recipe("mxfp8", mx_scale_rounding="floor"),
        Fp8Recipe("mxfp8", fp8_format="HYBRID"),
    )


def rowwise_recipes() -> tuple[Fp8Recipe, ...]:
    """The variants of the rowwise kinds numcheck's single-device built-in declares (kept out of
    :func:`standard_recipes`, which the grouped and tensor-parallel built-ins declare): torchao's two recipes
    (E4M3, power-of-2 scales, amax floored at 1e-12), and rowwise with HYBRID formats and fp32 scales (a scale that
    is not a power of two: the dequantization rounds)."""
    return (
        Fp8Recipe("rowwise", amax_epsilon=1e-12),
        Fp8Recipe("rowwise", fp8_format="HYBRID", power_of_2_scales=False),
        Fp8Recipe("rowwise_gw_hp", amax_epsilon=1e-12),
    )
