"""A quantized-linear case as one printable value, and the tensors it stands for.

:class:`Fp8Case`'s ``repr`` is valid Python (with :class:`~reference.fp8_recipes.Fp8Recipe` in scope),
which is what reproduction commands carry. :func:`build_fp8` makes the tensors deterministically from a
CPU ``torch.Generator`` seeded with ``(seed, step)``, in float64, then rounds them to the case's dtype and
moves them to its device — so a case means the same tensors everywhere.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, NamedTuple, TypeVar

import torch

from numcheck.reference.fp8_recipes import Fp8Recipe

QUANT_REGIMES: tuple[str, ...] = (
    "normal",
    "wide",
    "outlier",
    "zeros",
    "tiny",
    "nan",
    "inf",
    "growing",
    "tail_outlier",
    "pruned",
    "scale_floor",
    "scale_edge",
    "block_exponents",
    "same_sign",
)
#: Regimes whose inputs hold NaN or inf (outputs are compared under the non-finite contract).
NONFINITE_REGIMES: tuple[str, ...] = ("nan", "inf")
#: The input regimes of the suite's fixed edge-input cases (``test_edge_inputs_every_recipe``, and the report's cases
#: for it): all-zero (amax 0), outlier-per-block, NaN, inf, tiny and wide inputs, an amax in the tail, zero tiles and
#: scales at their floor.
EDGE_INPUT_REGIMES: tuple[str, ...] = (
    "zeros",
    "outlier",
    "nan",
    "inf",
    "tiny",
    "wide",
    "tail_outlier",
    "pruned",
    "scale_floor",
)
#: (M, K, N, dtype ("first" or "low"), regime) of the fixed shapes of the suite's
#: ``test_multi_tile_and_long_reduction_every_recipe`` (and the report's cases for it).
LARGE_CASES: tuple[tuple[int, int, int, str, str], ...] = (
    (16, 264, 257, "first", "wide"),  # a 3×3 grid of 128×128 W tiles, tile scales apart
    (16, 264, 257, "first", "pruned"),  # three all-zero 128×128 W tiles
    (8, 1040, 24, "low", "normal"),  # K = 1040: partial sums must stay fp32
    (16, 4096, 32, "low", "normal"),  # y reduces over K = 4096: past a 2048 split-K
    (2304, 64, 32, "low", "normal"),  # wgrad reduces over M = 2304: past a 2048 split
    (300, 256, 64, "first", "tail_outlier"),  # x of 76800 elements, W and dy too, the amax in the last element
)
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
#: Stored mantissa bits of each input dtype (its ulp at 2^e is 2^(e − bits)).
MANTISSA_BITS = {"float32": 23, "bfloat16": 7, "float16": 10}
#: Width of the runs that :func:`plant_scale_edges` puts one edge value in: an MXFP8 block (1×32), four per
#: 1×128 block and per 128-wide row of a 128×128 tile.
EDGE_RUN = 32
#: The ulps (of the input dtype) an edge value sits from fp8_max·2^k.
EDGE_ULPS = (-2, -1, 0, 1, 2)
#: ``block_exponents``: the exponents the K-blocks of a row take (a permutation of them per tensor, repeating past
#: seven blocks), and the step between row blocks' exponents (−step, 0, +step, rotated), larger than the K-blocks'
#: span, so the exponent λ_q + κ_g of block (q, g) differs from those of (q, g ± 1) and of the transposed (g, q).
BLOCK_EXPONENTS: tuple[int, ...] = (-3, -2, -1, 0, 1, 2, 3)
ROW_BLOCK_STEP = 7


_Case = TypeVar("_Case", bound="Fp8CaseFields")


@dataclass(frozen=True)
class Fp8CaseFields:
    """What a single-device :class:`Fp8Case` and a tensor-parallel case
    (:class:`~properties.distributed.tp_fp8.cases.TPFp8Case`) share: the recipe, the global tensors and the mode.

    Attributes:
        recipe: the FP8 recipe.
        M, K, N: tokens, input features, output features (x ``[M, K]``, W ``[N, K]``, dy ``[M, N]``).
        dtype: name of the dtype of x, W, dy and bias.
        bias: whether a bias is passed.
        regime: how values are drawn (:func:`build_fp8`).
        seed: generator seed.
        save_original_input: the mode to run (properties that compare modes run both).
        steps: delayed scaling: how many steps to run with one state (each with its own inputs).
    """

    recipe: Fp8Recipe
    M: int
    K: int
    N: int
    dtype: str = "float32"
    bias: bool = False
    regime: str = "normal"
    seed: int = 0
    save_original_input: bool = False
    steps: int = 1

    def replace(self: _Case, **changes: Any) -> _Case:
        """A copy of this case with ``changes`` (validated again)."""
        return replace(self, **changes)


def declared_mode(support: Any) -> bool:
    """The ``save_original_input`` value a case runs with where the property does not set it: False where
    ``support`` declares it, else True (an impl declaring only True, such as torchao's Float8Linear, which always
    saves x itself, is never called in a mode it did not declare).

    >>> from types import SimpleNamespace
    >>> both, only_true = SimpleNamespace(save_original_input=(False, True)), SimpleNamespace(save_original_input=(True,))
    >>> declared_mode(both), declared_mode(only_true)
    (False, True)
    """
    return False not in support.save_original_input


@dataclass(frozen=True)
class Fp8Case(Fp8CaseFields):
    """One quantized-linear case: the fields of :class:`Fp8CaseFields`, and ``device``, where the tensors live."""

    device: str = "cpu"

    def __post_init__(self) -> None:
        if not isinstance(self.recipe, Fp8Recipe):
            raise ValueError(f"Fp8Case.recipe must be an Fp8Recipe, got {self.recipe!r}")
        for name in ("M", "K", "N", "steps"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"Fp8Case.{name} must be a positive int, got {v!r}")
        if self.dtype not in _DTYPES:
            raise ValueError(f"Fp8Case.dtype={self.dtype!r} is not one of {sorted(_DTYPES)}")
        if self.regime not in QUANT_REGIMES:
            raise ValueError(f"Fp8Case.regime={self.regime!r} is not one of {QUANT_REGIMES}")
        if self.steps > 1 and self.recipe.kind != "delayed":
            raise ValueError("Fp8Case.steps > 1 applies to delayed scaling only")

    @property
    def torch_dtype(self) -> torch.dtype:
        return _DTYPES[self.dtype]

    def short(self) -> str:
        """Compact label for ids and tables."""
        b = "+b" if self.bias else ""
        soi = "-soi" if self.save_original_input else ""
        return f"{self.recipe.name}-M{self.M}K{self.K}N{self.N}-{self.dtype}{b}-{self.regime}{soi}-s{self.seed}"


class Fp8Tensors(NamedTuple):
    """The tensors of one step of a case, in the case's dtype and device."""

    x: torch.Tensor
    weight: torch.Tensor
    dy: torch.Tensor
    bias: torch.Tensor | None


def _one_per_block(t: torch.Tensor, g: torch.Generator, width: int, factor: float) -> torch.Tensor:
    """Multiply one random element in every run of ``width`` consecutive elements of each row by ``factor``."""
    R, C = t.shape
    out = t.clone()
    for c0 in range(0, C, width):
        w = min(width, C - c0)
        cols = c0 + torch.randint(0, w, (R,), generator=g)
        out[torch.arange(R), cols] *= factor
    return out


def edge_exponents(fmt_max: float, dtype: str) -> tuple[int, int]:
    """The k of fp8_max·2^k that ``dtype`` holds as a normal number, with :data:`EDGE_ULPS` above it: [−20, 20] in
    fp32 and bf16; in fp16 from −12 up to the largest k with fp8_max·2^k ≤ 60000 (2 ulps above stay below 65504)."""
    if dtype != "float16":
        return -20, 20
    return -12, int(math.floor(math.log2(60000.0 / fmt_max)))


def plant_scale_edges(t: torch.Tensor, g: torch.Generator, fmt_max: float, dtype: str) -> torch.Tensor:
    """``t`` (float64, 2-D) with one value within :data:`EDGE_ULPS` ulps of ``dtype`` of ±fp8_max·2^k_i in every run
    of :data:`EDGE_RUN` elements of row i (k_i drawn per row in :func:`edge_exponents`' range), and the row's other
    elements scaled below half of it: every row-wise block's amax (1×32, 1×128, a 128×128 tile, the tensor) sits
    a few ulps beside fp8_max times a power of two. There a scale's exponent comes from a rounded log2 or a
    division (E8M0 rounding, power-of-2 scales picks the neighbouring exponent), and amax·scale lands on or just
    past fp8_max (saturation at the format's maximum). Exact in ``dtype``."""
    R, C = t.shape
    lo, hi = edge_exponents(fmt_max, dtype)
    k = torch.randint(lo, hi + 1, (R, 1), generator=g).to(torch.float64)
    base = fmt_max * torch.exp2(k)
    ulp = torch.exp2(torch.floor(torch.log2(base)) - MANTISSA_BITS[dtype])
    out = t * (0.5 * base / t.abs().amax(dim=1, keepdim=True).clamp_min(1e-300))
    ulps = torch.tensor(EDGE_ULPS, dtype=torch.float64)
    for c0 in range(0, C, EDGE_RUN):
        w = min(EDGE_RUN, C - c0)
        cols = c0 + torch.randint(0, w, (R,), generator=g)
        off = ulps[torch.randint(0, len(EDGE_ULPS), (R,), generator=g)]
        sign = torch.where(torch.rand(R, generator=g) < 0.5, -1.0, 1.0).to(torch.float64)
        out[torch.arange(R), cols] = sign * (base[:, 0] + off * ulp[:, 0])
    return out


def scale_block(recipe: Fp8Recipe) -> int:
    """The edge of ``recipe``'s scaling blocks along K (128 blockwise, 32 MXFP8; 32 for the per-tensor recipes,
    where the ``block_exponents`` regime's structure changes nothing, and for the rowwise kinds, whose one scale per
    row or column it makes diverse: every row its own exponent (δ_i, λ_q of :func:`plant_block_exponents`), every
    column's amax the exponent of its K-block (κ_g), so a row scale applied to another row, or along the wrong axis,
    or one scale for all rows, lands on another exponent)."""
    return 128 if recipe.kind == "blockwise" else 32


def plant_block_exponents(t: torch.Tensor, g: torch.Generator, block: int) -> torch.Tensor:
    """``t`` (float64, 2-D) remade as ±(1 + u)·2^(e_ij + c): the signs of ``t``, u drawn on a grid of 2^−7 (exact in
    every input dtype, below 1: each element's binade is its e), c = ⌊log2 rms(t)⌋ (the role's magnitude), and
    e_ij = λ_q + κ_g − δ_i for q = i // ``block`` its row block, g = j // ``block`` its K-block: κ a permutation of
    :data:`BLOCK_EXPONENTS` (each K-block of a row its own exponent), λ_q = :data:`ROW_BLOCK_STEP` · (−1, 0, 1)
    rotated (each row block its own), δ_i = (i + s) mod 3 (neighbouring rows apart; every block of ≥ 3 rows holds
    a δ = 0 row). Every block's amax — a 1×b or b×1 block, a b×b tile — is then 2^e·m, m in [1, 2), with e distinct
    from its neighbours' along K, along the rows and from the transposed block's, so a scale read from the wrong
    block, or transposed, lands on another exponent (random data repeats exponents and hides that: flashinfer
    #4087/#4093; TIRx PR #5's fix tests give each row and K-block its own exponent)."""
    R, C = t.shape
    kappa = torch.tensor(BLOCK_EXPONENTS)[torch.randperm(len(BLOCK_EXPONENTS), generator=g)]
    s = int(torch.randint(0, 3, (1,), generator=g))
    rows, cols = torch.arange(R), torch.arange(C)
    lam = ROW_BLOCK_STEP * (((rows // block + s) % 3) - 1) - (rows + s) % 3
    e = lam[:, None] + kappa[(cols // block) % len(BLOCK_EXPONENTS)][None, :]
    rms = float(t.square().mean().sqrt()) if t.numel() else 1.0
    c = math.floor(math.log2(rms)) if rms > 0 else 0
    u = torch.floor(torch.rand(R, C, generator=g, dtype=torch.float64) * 128) / 128
    sign = torch.where(t < 0, -1.0, 1.0).to(torch.float64)
    return sign * (1 + u) * torch.exp2((e + c).to(torch.float64))


def build_fp8(case: Fp8Case, step: int = 0) -> Fp8Tensors:
    """Materialize the tensors of ``case`` (for delayed scaling, of step ``step``).

    Regimes (x, W and dy are N(0,1) scaled by 1, 1/√K and 1/√N unless said otherwise):
        ``normal``; ``wide``: every element times 2^U(−12, 12) (many block scales, FP8 subnormals);
        ``outlier``: one element of every 32 along each row of x and dy times 2^10 (the block's amax is
        the outlier, the rest lose precision); ``zeros``: x and dy all zero (amax 0 → scale 1);
        ``tiny``: x times 2^−128 (fp16: 2^−16), so amax·scale leaves binary32's range and the scale rule's
        inf branch is taken; ``nan``: two NaN in x, one in dy and one in W; ``inf``: +inf in x, −inf in dy
        and +inf in W; ``growing``: normal values, but delayed-scaling steps shrink x and grow dy (below);
        ``tail_outlier``: the last element of x, W and dy (in memory order) times 2^8, so a tensor's amax sits in
        its last chunk or block (an amax reduction that drops a partial tail saturates it); ``pruned``: W's first
        ⌈N/2⌉ rows zero (pruned or zero-initialised outputs: all-zero W blocks and, for N ≥ 256, whole 128×128
        tiles, whose amax 0 must give scale 1); ``scale_floor``: x times 2^−119 (fp16: zero), so block amaxes
        sit near 2^−118 and an MXFP8 E8M0 scale at the bottom of its range, where a descale flushed to zero
        (fast-math FTZ) moves the code; ``scale_edge``: x, W and dy with every block's amax a few ulps beside
        fp8_max·2^k of the role's format (:func:`plant_scale_edges`): E8M0 and power-of-2 scale rounding,
        saturation at the format maximum; ``block_exponents``: x, W and dy with each row and each K-block (blocks of
        the recipe's edge, :func:`scale_block`) its own exponent (:func:`plant_block_exponents`): a block scale
        misplaced along K, across rows or transposed lands on a different one; ``same_sign``: |x|, |W| and |dy|,
        so every output sums terms of one sign and a running sum grows linearly along the reduction (where a
        truncating accumulator's errors, all of one sign, add up: :mod:`properties.fp8.tolerance`).
    Delayed-scaling steps multiply x by 2^(3·step) and dy by 2^(−2·step) so stored scales lag the data; under
    ``growing`` x by 2^(−2·step) and dy by 2^(4·step), so dy outgrows its stored scale 16× a step and its
    cast must saturate (a gradient spike).
    """
    g = torch.Generator(device="cpu").manual_seed(case.seed * 1009 + step)
    M, K, N = case.M, case.K, case.N
    x = torch.randn(M, K, generator=g, dtype=torch.float64)
    w = torch.randn(N, K, generator=g, dtype=torch.float64) / math.sqrt(K)
    dy = torch.randn(M, N, generator=g, dtype=torch.float64) / math.sqrt(N)
    b = torch.randn(N, generator=g, dtype=torch.float64) * 0.5 if case.bias else None
    x, w, dy = _regime_values(case, g, x, w, dy)
    r = case.regime
    if case.recipe.kind == "delayed" and step:
        gx, gdy = (-2, 4) if r == "growing" else (3, -2)
        x = x * 2.0 ** (gx * step)
        dy = dy * 2.0 ** (gdy * step)
    dt, dev = case.torch_dtype, torch.device(case.device)
    return Fp8Tensors(
        x.to(dt).to(dev), w.to(dt).to(dev), dy.to(dt).to(dev), b.to(dt).to(dev) if b is not None else None
    )


def _regime_values(
    case: Fp8Case, g: torch.Generator, x: torch.Tensor, w: torch.Tensor, dy: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(x, w, dy)`` (float64, as drawn) changed as ``case.regime`` says (:func:`build_fp8`), drawing from ``g``."""
    M, K, N = case.M, case.K, case.N
    r = case.regime
    if r == "wide":
        x = x * torch.exp2(torch.randint(-12, 13, (M, K), generator=g).to(torch.float64))
        w = w * torch.exp2(torch.randint(-12, 13, (N, K), generator=g).to(torch.float64))
        dy = dy * torch.exp2(torch.randint(-12, 13, (M, N), generator=g).to(torch.float64))
    elif r == "outlier":
        x = _one_per_block(x, g, 32, 2.0**10)
        dy = _one_per_block(dy, g, 32, 2.0**10)
    elif r == "zeros":
        x = torch.zeros_like(x)
        dy = torch.zeros_like(dy)
    elif r == "tiny":
        x = x * (2.0**-16 if case.dtype == "float16" else 2.0**-128)
    elif r == "nan":
        x.view(-1)[torch.randint(0, M * K, (2,), generator=g)] = float("nan")
        dy.view(-1)[torch.randint(0, M * N, (1,), generator=g)] = float("nan")
        w.view(-1)[torch.randint(0, N * K, (1,), generator=g)] = float("nan")
    elif r == "tail_outlier":
        for t in (x, w, dy):
            t.view(-1)[-1] *= 2.0**8
    elif r == "pruned":
        w[: (N + 1) // 2] = 0.0
    elif r == "scale_floor":
        x = x * 2.0**-119
    elif r == "scale_edge":
        x = plant_scale_edges(x, g, case.recipe.format_of("x").max_finite, case.dtype)
        w = plant_scale_edges(w, g, case.recipe.format_of("w").max_finite, case.dtype)
        dy = plant_scale_edges(dy, g, case.recipe.format_of("dy").max_finite, case.dtype)
    elif r == "block_exponents":
        b = scale_block(case.recipe)
        x, w, dy = (plant_block_exponents(t, g, b) for t in (x, w, dy))
    elif r == "same_sign":
        x, w, dy = x.abs(), w.abs(), dy.abs()
    elif r == "inf":
        x.view(-1)[torch.randint(0, M * K, (1,), generator=g)] = float("inf")
        dy.view(-1)[torch.randint(0, M * N, (1,), generator=g)] = float("-inf")
        w.view(-1)[torch.randint(0, N * K, (1,), generator=g)] = float("inf")
    return x, w, dy


# -- the quantizer property's cases: a tensor as a printable value ---------------------------------------------
@dataclass(frozen=True)
class DrawnTensor:
    """A 2-D float32 test tensor of the quantizer property as a printable value: the values
    :func:`~numcheck.properties.fp8.strategies.fp8_tensor_specs` draws, from which :meth:`build` makes the same
    tensor in every process (a CPU generator seeded with ``seed``), so a failure's repro line carries it.

    ``rows`` × ``cols`` N(0, 1) values, each times 2^U(−``binade_spread``, ``binade_spread``) (0: none), all
    times 2^``magnitude_exp``, clamped to binary32; ``specials``: ``(row, col, value)`` written over them;
    ``edges``: ``"none"``, ``"every block"`` (every 32-element run's amax a few ulps of ``dtype`` beside
    ``format_max``·2^k, :func:`plant_scale_edges`) or ``"one element"`` (``boundary`` = ``(exp, ulps, row, col,
    sign)``: format_max·2^exp moved ``ulps`` binary32 ulps, at that element, every other finite element below
    half of it)."""

    rows: int
    cols: int
    seed: int
    binade_spread: int = 0
    magnitude_exp: int = 0
    specials: tuple[tuple[int, int, float], ...] = ()
    edges: str = "none"
    format_max: float = 448.0
    boundary: tuple[int, int, int, int, float] | None = None
    dtype: str = "float32"

    def __post_init__(self) -> None:
        if self.edges not in ("none", "one element", "every block"):
            raise ValueError(f"DrawnTensor.edges={self.edges!r} is not 'none', 'one element' or 'every block'")
        if (self.edges == "one element") != (self.boundary is not None):
            raise ValueError("DrawnTensor.boundary is given exactly when edges='one element'")
        if self.dtype not in _DTYPES:
            raise ValueError(f"DrawnTensor.dtype={self.dtype!r} is not one of {sorted(_DTYPES)}")

    def build(self) -> torch.Tensor:
        """The float32 tensor (on the CPU)."""
        R, C = self.rows, self.cols
        g = torch.Generator().manual_seed(self.seed)
        t = torch.randn(R, C, generator=g, dtype=torch.float64)
        if self.binade_spread:
            s = self.binade_spread
            t = t * torch.exp2(torch.randint(-s, s + 1, (R, C), generator=g).to(torch.float64))
        fp32_max = torch.finfo(torch.float32).max
        t = (t * 2.0**self.magnitude_exp).clamp(-fp32_max, fp32_max).to(torch.float32)
        for i, j, v in self.specials:
            t[i, j] = v
        if self.edges == "every block":
            finite = torch.isfinite(t)
            planted = plant_scale_edges(torch.where(finite, t, 0.0).double(), g, self.format_max, self.dtype)
            t = torch.where(finite, planted.to(torch.float32), t)
        elif self.boundary is not None:
            exp, ulps, i, j, sign = self.boundary
            v = torch.tensor(self.format_max * 2.0**exp, dtype=torch.float32)
            toward = torch.tensor(math.copysign(math.inf, ulps), dtype=torch.float32)
            for _ in range(abs(ulps)):
                v = torch.nextafter(v, toward)
            finite = t[torch.isfinite(t)].abs()
            m = float(finite.max()) if finite.numel() else 0.0
            if m > 0:  # every other finite element below half of it, so it is its block's amax
                t = torch.where(torch.isfinite(t), t * (float(v) / (2 * m)), t)
            t[i, j] = float(v) * sign
        return t


@dataclass(frozen=True)
class FormatCodes:
    """Every one of the 256 values of an FP8 format (``"e4m3"`` or ``"e5m2"``) as an 8×32 float32 tensor
    (``transposed``: 32×8): saturation, NaN, subnormals and signed zero in one tensor."""

    fmt: str
    transposed: bool = False

    def build(self) -> torch.Tensor:
        """The float32 tensor (on the CPU)."""
        from numcheck.reference.fp8_formats import all_codes, decode_fp8

        t = decode_fp8(all_codes(), self.fmt).to(torch.float32).reshape(8, 32)
        return t.t().contiguous() if self.transposed else t


@dataclass(frozen=True)
class QuantizerCase:
    """A case of the quantizer property as one printable value (what its failures and repro lines carry): the
    recipe, the tensor (:class:`DrawnTensor` or :class:`FormatCodes`), the dtype it is cast to, the stored scale
    delayed scaling quantizes with, and the device."""

    recipe: Fp8Recipe
    tensor: DrawnTensor | FormatCodes
    dtype: str = "float32"
    delayed_scale: float = 1.0
    device: str = "cpu"

    def __post_init__(self) -> None:
        if not isinstance(self.recipe, Fp8Recipe):
            raise ValueError(f"QuantizerCase.recipe must be an Fp8Recipe, got {self.recipe!r}")
        if not isinstance(self.tensor, (DrawnTensor, FormatCodes)):
            raise ValueError(f"QuantizerCase.tensor must be a DrawnTensor or FormatCodes, got {self.tensor!r}")
        if self.dtype not in _DTYPES:
            raise ValueError(f"QuantizerCase.dtype={self.dtype!r} is not one of {sorted(_DTYPES)}")

    def build(self) -> torch.Tensor:
        """The tensor the quantizer is given: :attr:`tensor`'s values in :attr:`dtype` on :attr:`device`."""
        return self.tensor.build().to(torch.device(self.device), _DTYPES[self.dtype])

    def short(self) -> str:
        """Compact label for ids and tables."""
        shape = (
            ("32x8" if self.tensor.transposed else "8x32")
            if isinstance(self.tensor, FormatCodes)
            else f"{self.tensor.rows}x{self.tensor.cols}"
        )
        return f"{self.recipe.name}-quantizer-{shape}-{self.dtype}-s{getattr(self.tensor, 'seed', 0)}"
