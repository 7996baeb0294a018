"""Hypothesis strategies for the linear+preference properties: cases inside an impl's declaration.

Shapes stay tiny (the float64 oracle holds ``[2P, T, V]`` log-probabilities and the bound a few tensors of that
size): P from 1 to :data:`MAX_PAIRS` pairs, T from 1 to :data:`MAX_T` positions, H and V small; what the family's
defects need is reached at these sizes (several chunks of pairs, ignored positions, both completions' lengths
different). The numbers β, γ, ε, α are drawn from values that move the loss visibly; each option the declaration
does not honour stays at its neutral value.
"""

from __future__ import annotations

from hypothesis import strategies as st

from numcheck.properties.core.device import DEVICE
from numcheck.properties.linear_preference.cases import PreferenceCase

MAX_PAIRS = 4
MAX_T = 6
BETAS: tuple[float, ...] = (0.1, 0.5, 1.0, 2.5)
GAMMAS: tuple[float, ...] = (0.3, 1.0)
SMOOTHINGS: tuple[float, ...] = (0.1, 0.3)
NLL_WEIGHTS: tuple[float, ...] = (0.5, 1.0)
REFERENCE_POINTS: tuple[float, ...] = (0.5, 2.0)
_DTYPE_NAMES = {"torch.float32": "float32", "torch.bfloat16": "bfloat16", "torch.float16": "float16"}


def _dtype_names(support) -> list[str]:
    return sorted(_DTYPE_NAMES[str(d)] for d in support.dtypes)


@st.composite
def _options(draw: st.DrawFn, support, on: bool | None) -> dict:
    """β and each declared option, each either neutral or drawn (``on``: every declared option set)."""
    pick = lambda name, values: draw(  # noqa: E731
        st.sampled_from(values) if on else st.sampled_from((0.0, *values)), label=name
    )
    out = {"beta": draw(st.sampled_from(BETAS), label="beta")}
    if support.margin:
        out["gamma"] = pick("gamma", GAMMAS)
    if support.label_smoothing:
        out["label_smoothing"] = pick("label_smoothing", SMOOTHINGS)
    if support.nll:
        out["nll_weight"] = pick("nll_weight", NLL_WEIGHTS)
    if support.reference_point:
        out["kl"] = pick("kl", REFERENCE_POINTS)
    out["average_log_prob"] = draw(st.sampled_from(sorted(support.average_log_prob)), label="average_log_prob")
    return out


@st.composite
def preference_cases(
    draw: st.DrawFn,
    support,
    *,
    min_pairs: int = 1,
    chunked: bool | None = None,
    options_on: bool | None = None,
    ignored: bool | None = None,
) -> PreferenceCase:
    """A case inside ``support`` on the suite's device. ``chunked``: with ``chunk_pairs`` set (only where declared;
    ``None``: drawn), ``options_on``: every declared option set, ``ignored``: some positions ignored (``None``:
    drawn)."""
    P = draw(st.integers(min_pairs, MAX_PAIRS), label="P")
    chunk = None
    if support.chunking and (chunked or (chunked is None and draw(st.booleans(), label="chunked"))):
        chunk = draw(st.integers(1, P), label="chunk_pairs")
    frac = draw(st.sampled_from((0.3, 0.6)) if ignored else st.sampled_from((0.0, 0.3)), label="ignored")
    if ignored is False:
        frac = 0.0
    return PreferenceCase(
        P=P,
        T=draw(st.integers(1 if not ignored else 2, MAX_T), label="T"),
        H=draw(st.integers(2, 24), label="H"),
        V=draw(st.integers(2, 40), label="V"),
        dtype=draw(st.sampled_from(_dtype_names(support)), label="dtype"),
        bias=support.bias and draw(st.booleans(), label="bias"),
        chunk_pairs=chunk,
        ignored=frac,
        logit_scale=draw(st.sampled_from((1.0, 4.0)), label="logit_scale"),
        seed=draw(st.integers(0, 2**16), label="seed"),
        device=DEVICE,
        **draw(_options(support, options_on)),
    )
