"""Known divergences of torchao's MoE FP8 rowwise grouped GEMM (``torchao_grouped_fp8[rowwise]``,
:mod:`numcheck.impls.adapters.torchao_prototype`) from numcheck's grouped FP8 contract, as
:class:`~numcheck.properties.core.known.KnownDivergence` entries whose ``applies`` and ``example`` take a
:class:`~numcheck.properties.fp8.grouped.cases.GroupedCase`.

The grouped suite's draws leave a case an entry covers out (:func:`known_grouped_divergence`,
:mod:`numcheck.properties.fp8.grouped.suite`), the report names it, and ``tests/adapters/test_torchao_prototype.py``
runs each entry's example as a strict expected failure on the entry's device (the release's grouped GEMM runs on CUDA
only: on the CPU the check is skipped, naming where it runs).

**NaN made finite** (CUDA, seen on an H100 with torch 2.11 and torchao 0.18.0,
``results/gpu/h100-torch2.11-h200fp8-families/fp8/logs/grouped.txt``): every operand of the release's three grouped
GEMMs is scaled and cast by a Triton kernel (``prototype/moe_training/kernels/float8_rowwise.py`` and
``jagged_float8_scales.py``) whose amax (``tl.max``, ``tl.maximum``) and saturation (``tl.clamp``) are Triton's
defaults, which do not propagate NaN: a NaN element drops out of its row's amax and its cast lands on a finite FP8
code. The outputs it feeds come out finite where the product is NaN, in x's row, W's row and dy's row alike, so a
NaN in an expert's activations, weights or gradients is hidden from every check downstream. The contract (and the
unquantized product) make those outputs NaN; the other experts' outputs stay as the contract's in that run.
"""

from __future__ import annotations

from typing import Any

from numcheck.properties.core.known import KnownDivergence, Releases
from numcheck.properties.fp8.grouped.cases import GroupedCase
from numcheck.properties.fp8.known_torchao import torchao_release
from numcheck.reference.fp8_recipes import Fp8Recipe

#: Measured on CUDA with 0.18.0 only (the newest release importing beside the device's torch 2.11).
MEASURED = Releases("torchao", ">=0.18.0,<=0.18.0", torchao_release)
#: The release's one grouped recipe: rowwise, E4M3, power-of-2 scales, its kernels' EPS 1e-12.
ROWWISE = Fp8Recipe("rowwise", amax_epsilon=1e-12)

_NAN_FINITE = (
    "torchao's MoE FP8 rowwise grouped GEMM scales and casts every operand with Triton kernels "
    "(prototype/moe_training/kernels/float8_rowwise.py, jagged_float8_scales.py) whose amax (tl.max, tl.maximum) "
    "and saturation (tl.clamp) do not propagate NaN: a NaN element drops out of its row's amax and is cast to a "
    "finite FP8 code, so every output it feeds is finite where the product is NaN (the H100 run, "
    "results/gpu/h100-torch2.11-h200fp8-families/fp8/logs/grouped.txt: the suite's nan_expert case with NaN in "
    "expert 0's x (2 elements), W (1) and dy (1) gave finite values at all 190 of y's elements the contract makes "
    "NaN, 79 of dgrad's and 206 of wgrad's); the contract makes them NaN, so a NaN in training is not hidden"
)


def _nan_expert(case: Any) -> bool:
    return getattr(case, "regime", None) == "nan_expert"


#: Every entry, each with the case the H100 run failed as its example.
GROUPED_TORCHAO_KNOWN: tuple[KnownDivergence, ...] = (
    KnownDivergence(
        impls="torchao_grouped_fp8[[]rowwise]",
        properties=("accuracy",),
        devices=("cuda",),
        applies=_nan_expert,
        reason=_NAN_FINITE,
        library="torchao",
        summary="a NaN in an expert's x, W or dy is cast to a finite FP8 code: the outputs it feeds are finite, not NaN",
        example=GroupedCase(
            ROWWISE,
            (32, 0, 48, 48, 16),
            48,
            80,
            dtype="bfloat16",
            regime="nan_expert",
            seed=0,
            save_original_input=True,
            device="cuda",
        ),
        releases=MEASURED,
    ),
)


def known_grouped_divergence(impl_name: str, prop: str, case: GroupedCase) -> KnownDivergence | None:
    """The grouped known divergence covering ``case`` of impl ``impl_name`` under property ``prop``, or ``None``.

    >>> c = GROUPED_TORCHAO_KNOWN[0].example
    >>> known_grouped_divergence("torchao_grouped_fp8[rowwise]", "accuracy", c.replace(device="cpu")) is None
    True
    >>> known_grouped_divergence("my_grouped", "accuracy", c) is None
    True
    """
    return next((e for e in GROUPED_TORCHAO_KNOWN if e.matches(impl_name, prop, case)), None)
