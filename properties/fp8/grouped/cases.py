"""A grouped quantized-linear case as one printable value, and the tensors it stands for.

:class:`GroupedCase`'s ``repr`` is valid Python (with :class:`~reference.fp8_recipes.Fp8Recipe` in scope): what
reproduction commands carry. :func:`build_grouped` makes each expert's tensors with the single linear's builder
(:func:`properties.fp8.cases.build_fp8`, so every value regime of it is available per expert) from a seed of its
own, scales them by a power of two drawn per expert and operand (so the experts' amaxes, and with them their scales,
differ: a scale shared across experts or one expert's quantizer used for another changes the codes), and stacks
them: x and dy by rows, the weights and biases by expert. A case means the same tensors everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, NamedTuple

import torch

from numcheck.properties.fp8.cases import Fp8Case, build_fp8
from numcheck.reference.fp8_recipes import Fp8Recipe
from numcheck.reference.grouped_fp8_linear import split_offsets

#: Value regimes. Those of the single linear apply to every expert; ``zero_expert`` makes the first expert with
#: rows all-zero in x and dy (padding tokens routed to it: amax 0), ``nan_expert`` puts NaN in the first expert with
#: rows only (it must not reach any other expert's outputs).
GROUPED_REGIMES: tuple[str, ...] = (
    "normal",
    "wide",
    "outlier",
    "zero_expert",
    "nan_expert",
    "inf",
    "tail_outlier",
    "pruned",
    "tiny",
    "scale_edge",
    "block_exponents",
)
#: Regimes under which every expert's operands are also scaled by its own power of two (the others set magnitudes
#: that must stay as they are: tiny values, planted scale edges, non-finite ones).
MAGNITUDE_REGIMES: tuple[str, ...] = ("normal", "wide", "outlier", "zero_expert", "nan_expert", "pruned")
NONFINITE_GROUPED_REGIMES: tuple[str, ...] = ("nan_expert", "inf")
WEIGHT_FORMS: tuple[str, ...] = ("grouped", "list")
#: (m_splits, K, N, regime) of the suite's fixed cases (``test_grouped_edge_splits_every_recipe``, and the report's
#: cases for it): unaligned splits straddling 32- and 128-row blocks with empty experts first and between, one block
#: row past 128, eight one-row experts, and the regimes local to one expert.
EDGE_SPLIT_CASES: tuple[tuple[tuple[int, ...], int, int, str], ...] = (
    ((0, 33, 1, 0, 130), 40, 24, "outlier"),
    ((129, 0, 31), 72, 17, "tail_outlier"),
    ((1, 1, 1, 1, 1, 1, 1, 1), 16, 8, "zero_expert"),
    ((5, 37, 16), 40, 24, "nan_expert"),
)
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class GroupedCase:
    """One grouped quantized-linear case.

    Attributes:
        recipe: the FP8 recipe (every expert's).
        m_splits: rows per expert (``Σ`` = M ≥ 1; zeros are empty experts).
        K, N: input and output features (x ``[M, K]``, each W_i ``[N, K]``).
        dtype: name of the dtype of x, the weights, dy and the biases.
        bias: whether biases are passed.
        regime: how values are drawn (:data:`GROUPED_REGIMES`).
        seed: generator seed.
        save_original_input: the mode to run.
        steps: delayed scaling: steps run with one state per expert (each step its own inputs).
        weights: ``"grouped"`` (one ``[G, N, K]`` tensor) or ``"list"`` (G tensors); biases take the same form.
        main_grad: wgrad accumulated into a given fp32 ``main_grad`` (fused wgrad accumulation).
        device: where the tensors live.
    """

    recipe: Fp8Recipe
    m_splits: tuple[int, ...]
    K: int
    N: int
    dtype: str = "float32"
    bias: bool = False
    regime: str = "normal"
    seed: int = 0
    save_original_input: bool = False
    steps: int = 1
    weights: str = "grouped"
    main_grad: bool = False
    device: str = "cpu"

    def __post_init__(self) -> None:
        if not isinstance(self.recipe, Fp8Recipe):
            raise ValueError(f"GroupedCase.recipe must be an Fp8Recipe, got {self.recipe!r}")
        object.__setattr__(self, "m_splits", tuple(self.m_splits))
        split_offsets(self.m_splits)
        if sum(self.m_splits) < 1:
            raise ValueError(f"GroupedCase.m_splits={self.m_splits} gives no row at all; at least one expert needs one")
        for name in ("K", "N", "steps"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"GroupedCase.{name} must be a positive int, got {v!r}")
        if self.dtype not in _DTYPES:
            raise ValueError(f"GroupedCase.dtype={self.dtype!r} is not one of {sorted(_DTYPES)}")
        if self.regime not in GROUPED_REGIMES:
            raise ValueError(f"GroupedCase.regime={self.regime!r} is not one of {GROUPED_REGIMES}")
        if self.weights not in WEIGHT_FORMS:
            raise ValueError(f"GroupedCase.weights={self.weights!r} is not one of {WEIGHT_FORMS}")
        if self.steps > 1 and self.recipe.kind != "delayed":
            raise ValueError("GroupedCase.steps > 1 applies to delayed scaling only")

    @property
    def G(self) -> int:
        return len(self.m_splits)

    @property
    def M(self) -> int:
        return sum(self.m_splits)

    @property
    def torch_dtype(self) -> torch.dtype:
        return _DTYPES[self.dtype]

    def replace(self, **changes: Any) -> "GroupedCase":
        """A copy with ``changes`` (validated again)."""
        return replace(self, **changes)

    def short(self) -> str:
        """Compact label for ids and tables."""
        extras = "".join(
            s
            for s, on in (
                ("+b", self.bias),
                ("-soi", self.save_original_input),
                ("-mg", self.main_grad),
                ("-list", self.weights == "list"),
            )
            if on
        )
        splits = ",".join(map(str, self.m_splits))
        return f"{self.recipe.name}-[{splits}]K{self.K}N{self.N}-{self.dtype}-{self.regime}{extras}-s{self.seed}"


class GroupedTensors(NamedTuple):
    """The tensors of one step: x ``[M, K]``, weights ``[G, N, K]``, dy ``[M, N]``, biases ``[G, N]`` or ``None``
    (in the case's dtype and device; the call's weight form is made from them by the properties)."""

    x: torch.Tensor
    weights: torch.Tensor
    dy: torch.Tensor
    biases: torch.Tensor | None


def _expert_regimes(case: GroupedCase) -> list[str]:
    """The single-linear regime of each expert (``zero_expert`` and ``nan_expert`` hit the first expert with rows)."""
    local = {"zero_expert": "zeros", "nan_expert": "nan"}.get(case.regime)
    if local is None:
        return [case.regime] * case.G
    first = next(i for i, m in enumerate(case.m_splits) if m)
    return [local if i == first else "normal" for i in range(case.G)]


def _magnitudes(case: GroupedCase, micro: int) -> torch.Tensor:
    """``[G, 3]`` powers of two for each expert's x, W and dy (all ones outside :data:`MAGNITUDE_REGIMES`): 2^e with
    e in [−3, 3] (fp16: [−3, 0], which keeps the ``wide`` regime's 2^12-scaled values finite); under
    ``block_exponents`` e distinct across experts (a permutation of up to five values per operand), so an expert's
    block scale read for another's lands on another exponent."""
    g = torch.Generator().manual_seed(case.seed * 7 + 3 + 104729 * micro)
    if case.regime == "block_exponents":  # each expert its own exponent per operand: a permutation of −2 … 2
        perms = [torch.randperm(case.G, generator=g) % 5 - min(case.G, 5) // 2 for _ in range(3)]
        return torch.exp2(torch.stack(perms, dim=1).to(torch.float64))
    if case.regime not in MAGNITUDE_REGIMES:
        return torch.ones(case.G, 3, dtype=torch.float64)
    hi = 0 if case.dtype == "float16" else 3
    return torch.exp2(torch.randint(-3, hi + 1, (case.G, 3), generator=g).to(torch.float64))


def build_grouped(case: GroupedCase, step: int = 0, micro: int = 0) -> GroupedTensors:
    """The tensors of ``case`` for delayed-scaling step ``step`` and micro-batch ``micro`` (module docstring).
    Micro-batches share the weights and biases (micro-batch 0's) and draw their own x and dy."""
    regimes = _expert_regimes(case)
    mags = _magnitudes(case, micro)
    xs, ws, dys, bs = [], [], [], []
    for i, m in enumerate(case.m_splits):
        sub = Fp8Case(
            case.recipe,
            max(m, 1),
            case.K,
            case.N,
            dtype=case.dtype,
            bias=case.bias,
            regime=regimes[i],
            seed=case.seed * 131 + i,
            steps=case.steps,
            device=case.device,
        )
        t = build_fp8(sub, step)
        if micro:
            tm = build_fp8(sub.replace(seed=sub.seed + 7919 * micro), step)
            t = t._replace(x=tm.x, dy=tm.dy)
        mx, mw, mdy = (float(v) for v in mags[i])
        xs.append(t.x[:m] * mx)
        ws.append(t.weight * mw)
        dys.append(t.dy[:m] * mdy)
        bs.append(t.bias)
    biases = torch.stack(bs) if case.bias else None
    return GroupedTensors(torch.cat(xs), torch.stack(ws), torch.cat(dys), biases)


def refusal(support: Any, case: GroupedCase) -> str | None:
    """Why ``support`` (a :class:`~impls.protocols.grouped_fp8_linear.GroupedFp8Support`) excludes ``case``, or
    ``None`` when the impl declares it."""
    why = support.refuses(
        recipe=case.recipe,
        dtype=case.torch_dtype,
        device=case.device,
        save_original_input=case.save_original_input,
        bias=case.bias,
    )
    if why:
        return why
    why = support.split_refusal(case.m_splits, K=case.K, N=case.N)
    if why:
        return why
    if case.weights not in support.weight_layouts:
        return f"weights as {case.weights!r} not declared"
    if case.main_grad not in support.fused_wgrad_accumulation:
        return f"fused wgrad accumulation (main_grad={case.main_grad}) not declared"
    return None


def fitted(support: Any, case: GroupedCase) -> GroupedCase:
    """``case`` moved into ``support``'s rules where it can be: split sizes, K and N rounded up to the declared
    alignments, empty experts given rows where they are not declared, the first declared weight form, fused wgrad
    accumulation when only that is declared, the declared ``save_original_input`` when only one is, no bias where none
    is. (Whatever else it does not declare stays: :func:`refusal` names it.)"""
    a, fa = support.split_alignment, support.feature_alignment
    splits = tuple((0 if support.empty_splits else a) if m == 0 else -(-m // a) * a for m in case.m_splits)
    weights = case.weights if case.weights in support.weight_layouts else sorted(support.weight_layouts)[0]
    main_grad = case.main_grad if case.main_grad in support.fused_wgrad_accumulation else not case.main_grad
    soi = (
        case.save_original_input
        if case.save_original_input in support.save_original_input
        else not case.save_original_input
    )
    return case.replace(
        save_original_input=soi,
        m_splits=splits,
        K=-(-case.K // fa) * fa,
        N=-(-case.N // fa) * fa,
        weights=weights,
        main_grad=main_grad,
        bias=case.bias and support.bias,
    )
