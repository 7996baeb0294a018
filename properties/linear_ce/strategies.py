"""Hypothesis strategies for linear+CE problems, drawn as a whole and only within what an impl declares.

Shapes lean to the edges (N = 1, N not a multiple of a chunk, V of 1, 2, odd, prime, V ≫ H and V < H, H not a
multiple of 16/32/128); dtypes fp32/bf16/fp16 and AMP; bias on/off and its dtype; ignored fraction from none to
all; every option alone and combined; value regimes ordinary, confident, large, tiny, outlier rows.
Sizes are capped by ``NUMCHECK_MAX_N`` / ``NUMCHECK_MAX_H`` / ``NUMCHECK_MAX_V`` (defaults 96 / 80 / 160);
``NUMCHECK_DEVICE`` (default ``cpu``, :mod:`numcheck.properties.core.device`) picks the device problems live on.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import difflib
import os
from typing import Any, Iterable, Iterator

import torch
from hypothesis import assume
from hypothesis import strategies as st

from numcheck.impls.measure import capabilities
from numcheck.impls.protocols.linear_ce import LINEAR_CE_OPTIONS, LinearCESupport
from numcheck.properties.core.device import DEVICE, DEVICE_TYPE
from numcheck.properties.linear_ce import chunks
from numcheck.properties.linear_ce.cases import HEAD_REGIME, REGIMES, Problem
from numcheck.properties.linear_ce.harness import run_oracle


def _cap(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        v = int(raw)
    except ValueError:
        raise ValueError(f"{name} must be a positive integer, got {raw!r}") from None
    if v < 1:
        raise ValueError(f"{name} must be a positive integer, got {raw!r}")
    return v


MAX_N = _cap("NUMCHECK_MAX_N", 96)
MAX_H = _cap("NUMCHECK_MAX_H", 80)
MAX_V = _cap("NUMCHECK_MAX_V", 160)

_PRIMES = (2, 3, 5, 7, 11, 13, 31, 61, 127, 131, 157)


def sizes(cap: int, edges: tuple[int, ...]) -> st.SearchStrategy[int]:
    """Integers in [1, cap], leaning to ``edges`` (those ≤ cap) and to the ends."""
    pinned = sorted({e for e in edges if 1 <= e <= cap} | {1, cap})
    return st.one_of(st.sampled_from(pinned), st.integers(1, cap))


def n_sizes() -> st.SearchStrategy[int]:
    """Token counts: 1, around chunk sizes (7, 8, 9, 17, 33, 64, 65) and anything up to the cap."""
    return sizes(MAX_N, (1, 2, 7, 8, 9, 17, 33, 64, 65))


def h_sizes() -> st.SearchStrategy[int]:
    """Hidden sizes, including ones not a multiple of 16/32/128."""
    return sizes(MAX_H, (1, 3, 16, 17, 33, 48, 63, 64))


def v_sizes() -> st.SearchStrategy[int]:
    """Vocabulary sizes: 1, 2, odd, prime, powers of two ± 1."""
    return sizes(MAX_V, _PRIMES + (1, 2, 9, 63, 64, 65, 128, 129))


_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}

#: The fields of :class:`Problem` that ``problems(force=...)`` can pin (the device is its own argument).
FORCEABLE: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Problem) if f.name != "device")


def _check_names(what: str, given: Iterable[str], known: Iterable[str]) -> None:
    """``ValueError`` naming each unknown key of ``what``, with the closest known names and the full list."""
    known = tuple(known)
    for name in sorted(set(given) - set(known)):
        close = difflib.get_close_matches(name, known, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"problems: {what} has unknown key {name!r}{hint} (known: {', '.join(known)})")


class _Fields:
    """One draw of a problem: the strategy's ``draw``, the support's options, and the caller's ``force`` (pinned
    :class:`Problem` fields) and ``require`` (options that must be on where declared)."""

    def __init__(
        self, draw: st.DrawFn, options: frozenset[str], force: dict[str, Any], require: frozenset[str]
    ) -> None:
        self.draw, self.options, self.force, self.require = draw, options, force, require

    def pinned_or(self, name: str, strat: st.SearchStrategy, label: str | None = None) -> Any:
        """The pinned value of field ``name``, else one drawn from ``strat``."""
        return self.force[name] if name in self.force else self.draw(strat, label=label or name)

    def option(self, option: str, field: str, strat: st.SearchStrategy, off: Any) -> Any:
        """Field ``field`` of option ``option``: pinned, else ``off`` where the support lacks the option, else
        drawn from ``strat`` (``off`` included unless the option is required)."""
        if field in self.force:
            return self.force[field]
        if option not in self.options:
            return off
        if option in self.require:
            return self.draw(strat, label=option)
        return self.draw(st.one_of(st.just(off), strat), label=option)


def _precision(f: _Fields, s: LinearCESupport, device: str) -> tuple[str, str | None]:
    """``(dtype, autocast)``: pinned, else a plain dtype or an AMP mode the support declares and the device runs."""
    force = f.force
    if "dtype" in force or "autocast" in force:
        mode = ("amp", force["autocast"]) if force.get("autocast") else ("plain", force.get("dtype", "float32"))
    else:
        dev_type = torch.device(device).type
        dtypes = [_DTYPE_NAMES[d] for d in (torch.float32, torch.bfloat16, torch.float16) if d in s.dtypes]
        amp = [
            d
            for d in (torch.bfloat16, torch.float16)
            if d in s.autocast and torch.float32 in s.dtypes and capabilities.autocast_dtype(dev_type, d)
        ]
        modes = [("plain", d) for d in dtypes] + [("amp", _DTYPE_NAMES[d]) for d in amp]
        if not modes:
            raise ValueError(f"support declares no dtype usable on {device}: {s.dtypes}")
        mode = f.draw(st.sampled_from(modes), label="dtype mode")
    return ("float32", mode[1]) if mode[0] == "amp" else (mode[1], None)


def _bias(f: _Fields, autocast: str | None) -> tuple[bool, str | None]:
    """``(bias, bias_dtype)``. A bias of another dtype is an AMP situation (fp32 parameters, bias in the autocast
    dtype or fp32); outside autocast the bias has the parameters' dtype, as F.linear requires."""
    bias = f.option("bias", "bias", st.just(True), False)
    if "bias_dtype" in f.force:
        return bias, f.force["bias_dtype"]
    if not bias:
        return bias, None
    choices = [None, autocast] if autocast else [None]
    return bias, f.draw(st.sampled_from(choices), label="bias_dtype")


def _ignored(f: _Fields, s: LinearCESupport, allow_all_ignored: bool) -> float:
    """The fraction of ignored rows: pinned, else from none to all (all only where the support has a convention
    for it and the caller allows it), at least one where ``ignore_index`` is required."""
    if "ignored" in f.force:
        return f.force["ignored"]
    if "ignore_index" not in f.options:
        return 0.0
    if "ignore_index" in f.require:
        return f.draw(st.sampled_from([0.1, 0.5, 0.9]), label="ignored")
    hi = 1.0 if (allow_all_ignored and s.all_ignored is not None) else 0.99
    return f.draw(st.one_of(st.just(0.0), st.sampled_from([0.1, 0.5, hi]), st.floats(0.0, hi)), label="ignored")


def _loss_options(f: _Fields) -> dict[str, Any]:
    """``label_smoothing``, ``class_weights``, ``softcap`` and ``z_loss_scale``, each off or drawn where declared.
    Smoothing is 0 or at least 1e-4: smaller values are no training setting, and below fp32's normal range
    Triton specializes a Python float argument as fp64 (Liger's kernel then fails to compile on CUDA)."""
    return dict(
        label_smoothing=f.option(
            "label_smoothing", "label_smoothing", st.sampled_from([0.1, 0.5, 1.0]) | st.floats(1e-4, 1.0), 0.0
        ),
        class_weights=f.option("class_weights", "class_weights", st.just(True), False),
        softcap=f.option("softcap", "softcap", st.sampled_from([1.0, 5.0, 30.0]) | st.floats(0.5, 50.0), None),
        z_loss_scale=f.option("z_loss", "z_loss_scale", st.sampled_from([1e-4, 1e-2, 0.5]), 0.0),
    )


def _ignore_index(f: _Fields, ignored: float, V: int) -> int:
    """Which value marks ignored rows: -100 (the default, where shrinking ends), -1, V (one past the classes) or
    class 0 (a pad token id): a kernel that compares with a hard-coded -100, or that treats every target outside
    [0, V) as ignored, is wrong on one of them. -100 when no row is ignored."""
    if "ignore_index" in f.force or ignored == 0:
        return f.force.get("ignore_index", -100)
    return f.draw(st.sampled_from([-100, -1, V] + ([0] if V >= 2 else [])), label="ignore_index")


def _upstream(f: _Fields, reduction: str, autocast: str | None, softcap: float | None) -> str:
    """The upstream gradient: one, a scalar, a per-row vector for ``none``, or a loss scale where mixed precision
    uses one: AMP fp16, 'mean' (see :func:`scaled_gradients_fit`), not with a softcap (Problem says why: eager
    overflowed at s=30 while G itself was 1e4)."""
    if reduction == "none":
        ups = ["one", "per_row"]
    else:
        loss_scale = autocast == "float16" and reduction == "mean" and softcap is None
        ups = ["one", "scalar"] + (["loss_scale"] if loss_scale else [])
    return f.pinned_or("upstream", st.sampled_from(ups))


#: The covering row (:class:`numcheck.properties.core.rows.Row`) the draws are inside, if any (see :func:`pinned_row`).
_ROW: contextvars.ContextVar[Any] = contextvars.ContextVar("numcheck_covering_row", default=None)


@contextlib.contextmanager
def pinned_row(row: Any) -> Iterator[None]:
    """Inside this block every :func:`problems` draw pins ``row.force``'s fields and requires ``row.require``'s
    options (the caller's own ``force`` wins where both pin a field): a covering row run through a property's own
    draw (:func:`numcheck.properties.core.runner.run_rows`)."""
    token = _ROW.set(row)
    try:
        yield
    finally:
        _ROW.reset(token)


def _pins(force: dict[str, Any] | None, require: frozenset[str]) -> tuple[dict[str, Any], frozenset[str]]:
    """:func:`problems`'s ``force`` and ``require``, checked, with those of the :func:`pinned_row` being drawn
    (the call's own pins win over the row's)."""
    force = dict(force or {})
    _check_names("force", force, FORCEABLE)
    _check_names("require", require, LINEAR_CE_OPTIONS)
    row = _ROW.get()
    if row is not None:
        force = {**row.force, **force}
        require = frozenset(require) | row.require
    return force, require


@st.composite
def problems(
    draw: st.DrawFn,
    support: LinearCESupport | None = None,
    device: str | None = None,
    *,
    regimes: tuple[str, ...] = REGIMES,
    reductions: tuple[str, ...] | None = None,
    allow_all_ignored: bool = True,
    force: dict[str, Any] | None = None,
    require: frozenset[str] = frozenset(),
) -> Problem:
    """A :class:`Problem` inside ``support`` (a :class:`impls.protocols.linear_ce.LinearCESupport`; ``None`` = everything).

    ``force`` pins :class:`Problem` fields by their names (:data:`FORCEABLE`, e.g. ``{"dtype": "float32",
    "z_loss_scale": 0.0}``); pinned fields are still checked against the support. ``require`` names options
    (of :data:`impls.protocols.linear_ce.LINEAR_CE_OPTIONS`) that must be on wherever the support declares them — "every
    declared option at once", where interaction bugs live. An unknown key of either raises ``ValueError``.
    Inside :func:`pinned_row` the row's fields are pinned too.
    """
    force, require = _pins(force, require)
    s = support if support is not None else LinearCESupport()
    device = device or DEVICE
    f = _Fields(draw, frozenset(s.options), force, frozenset(require))
    dtype, autocast = _precision(f, s, device)
    reds = [r for r in (reductions or ("mean", "sum", "none")) if r in s.reductions]
    reduction = f.pinned_or("reduction", st.sampled_from(reds))
    N = f.pinned_or("N", n_sizes())
    H = f.pinned_or("H", h_sizes())
    V = f.pinned_or("V", v_sizes())
    bias, bias_dtype = _bias(f, autocast)
    ignored = _ignored(f, s, allow_all_ignored)
    opts = _loss_options(f)
    ignore_index = _ignore_index(f, ignored, V)
    upstream = _upstream(f, reduction, autocast, opts["softcap"])
    regime = f.pinned_or("regime", st.sampled_from(regimes))
    seed = f.pinned_or("seed", st.integers(0, 2**31 - 1))
    p = Problem(
        N=N,
        H=H,
        V=V,
        dtype=dtype,
        autocast=autocast,
        bias=bias,
        bias_dtype=bias_dtype,
        ignored=ignored,
        reduction=reduction,
        ignore_index=ignore_index,
        upstream=upstream,
        regime=regime,
        seed=seed,
        device=device,
        **opts,
    )
    assume(refusal(s, p) is None)
    if p.upstream == "loss_scale":
        assume(scaled_gradients_fit(p))
    return p


#: Headroom kept below the compute dtype's largest finite value by a loss-scaled problem's exact gradients.
LOSS_SCALE_HEADROOM = 4.0


def scaled_gradients_fit(p: Problem) -> bool:
    """Whether every exact gradient of ``p`` — of the logits, x, W and b, all carrying the loss scale — stays
    below the compute dtype's largest value / :data:`LOSS_SCALE_HEADROOM`. A loss scale is right for a step
    only then: where they do not fit, inf is the correct fp16 answer and GradScaler skips the step; where they
    do, an impl that scales before it normalizes (|p − y|·2^17 > 65504) overflows on its own account. The
    headroom covers the rounding of values near the top and the (C·p, q) parts of G formed apart."""

    class _MaxG:
        g = 0.0

        def block(self, blk: Any, rows: Any) -> None:
            if blk.G.numel():
                self.g = max(self.g, float(blk.G.abs().max()))

    obs = _MaxG()
    ref = run_oracle(p, all_ignored="zero", observer=obs)
    top = torch.finfo(p.compute_dtype).max / LOSS_SCALE_HEADROOM
    grads = [g for g in (ref.grad_x, ref.grad_weight, ref.grad_bias) if g is not None and g.numel()]
    return obs.g <= top and all(float(g.abs().max()) <= top for g in grads)


#: Vocabulary sizes beyond any single block of a V-tiled kernel (blocks of 128 to 4096 columns): one past a
#: power of two, one short, and primes between, so an online log-sum-exp must combine several blocks.
LARGE_V: tuple[int, ...] = (1025, 2047, 2049, 3001, 4097, 4099)
#: Token counts past the integers bf16 holds exactly (256) and fp16 (2048): a token count or normalizer
#: kept in the compute dtype rounds there.
LONG_N: tuple[int, ...] = (257, 259, 513, 2049, 2051)
#: The long-batch token counts of a draw by its compute dtype (the plain dtype, or the autocast one): the
#: cheapest of :data:`LONG_N` that pass that dtype's exact integers, each rounding another way there. bf16
#: (8 bits, integers exact to 256): 257 rounds down to 256 (a tie, to even), 259 up to 260, 513 down to 512 (its
#: ulp is 4 there). fp16 (11 bits, exact to 2048): 2049 down to 2048, 2051 up to 2052; its draws below 2049 met
#: only exact counts, so they never reached the regime. A bf16 draw of 2049 rows crossed no boundary that 257 did
#: not, at 8× the rows: under Triton's interpreter (TransformerEngine's CE: a program per row) that was most of
#: the property's cost. Any other compute dtype (an impl declaring fp32 only) keeps every count of LONG_N.
LONG_N_BY_COMPUTE: dict[str, tuple[int, ...]] = {"bfloat16": (257, 259, 513), "float16": (2049, 2051)}
#: Hidden sizes past the draws' cap, where kernels switch to a split or tiled reduction over H.
WIDE_H: tuple[int, ...] = (256, 257, 512, 1031)


#: Vocabularies of trained tokenizers (Llama 3: 128256; Qwen2's padded 151936): over 128-class blocks a
#: running sum takes 1002 or 1187 roundings, past the ~2/u_bf16 = 256–512 after which a bf16 one stagnates (a
#: block's share of a spread softmax falls under half an ulp of the sum; docs/detection.md derives it).
HEAD_V: tuple[int, ...] = (128256, 151936)
#: Rows and hidden size of :data:`HEAD_V`'s draws (ranges; N < H, as the ``anisotropic_head`` regime needs): the
#: float64 oracle and bounds cost O(N·V·H).
HEAD_N, HEAD_H = (2, 4), (8, 16)
#: Reductions of :data:`HEAD_V`'s draws, where declared: a fused pass forms grad_x in forward only for a scalar
#: loss (the built-ins, Liger and cut-cross-entropy alike; under 'none' they recompute in backward), and the
#: head row is there for that pass's grad_x sum.
HEAD_REDUCTIONS: tuple[str, ...] = ("mean", "sum")


@st.composite
def large_vocab_problems(draw: st.DrawFn, support) -> Problem:
    """Problems with V in :data:`LARGE_V` (or any V in 1000..4100), few rows (N ≤ 12) and small H ≤ 16, every
    other field drawn as usual but the regime, which is one where blocks disagree (a wide logit spread, or a
    confident target anywhere): a V-blocked softmax or gradient must be right across block boundaries.

    Inside a covering row that pins :data:`HEAD_REGIME` (coverage dimension ``head``), a trained head's shape
    instead: V in :data:`HEAD_V`, N and H in :data:`HEAD_N`, :data:`HEAD_H`, every other field drawn as usual
    but three, each shown to hide what the row is for (docs/detection.md): no label smoothing (ε/V per class
    cancels each block's share of a spread softmax), :data:`HEAD_REDUCTIONS` where declared, and no all-ignored
    batch (its grad_x is 0 whatever the arithmetic). grad_x = G·W summed over vocabulary blocks in bf16 then
    loses the share of the head's mean direction that each late block adds."""
    row = _ROW.get()
    if row is not None and row.force.get("regime") == HEAD_REGIME:
        force = {
            "N": draw(st.integers(*HEAD_N), label="N"),
            "H": draw(st.integers(*HEAD_H), label="H"),
            "V": draw(st.sampled_from(HEAD_V), label="V"),
            "label_smoothing": 0.0,
        }
        reds = HEAD_REDUCTIONS if set(HEAD_REDUCTIONS) & set(support.reductions) else None
        return draw(problems(support, force=force, reductions=reds, allow_all_ignored=False), label="problem")
    V = draw(st.one_of(st.sampled_from(LARGE_V), st.integers(1000, 4100)), label="V")
    force = {"N": draw(st.integers(1, 12), label="N"), "H": draw(st.integers(1, 16), label="H"), "V": V}
    return draw(problems(support, force=force, regimes=LARGE_V_REGIMES), label="problem")


#: Regimes of the large-vocabulary draws: outlier rows and large logits spread a row's logits past exp's range
#: across blocks; a confident target puts the row's max in whichever block holds it. (Tiny logits, a flat
#: softmax, hide every blocking bug.)
LARGE_V_REGIMES = ("outlier_rows", "large", "confident", "ordinary")


@st.composite
def wide_hidden_problems(draw: st.DrawFn, support) -> Problem:
    """Problems with H in :data:`WIDE_H` (or any H in 200..1100), few rows (N ≤ 8) and V ≤ 24, every other field
    drawn as usual: a reduction over H that is split or tiled must still add the bias once and combine exactly."""
    H = draw(st.one_of(st.sampled_from(WIDE_H), st.integers(200, 1100)), label="H")
    force = {"N": draw(st.integers(1, 8), label="N"), "H": H, "V": draw(st.integers(1, 24), label="V")}
    return draw(problems(support, force=force), label="problem")


def long_batch_modes(support: Any) -> list[tuple[str, str]]:
    """The long-batch draws' precisions, ``(kind, compute dtype)`` with kind ``plain`` or ``amp``: each declared
    plain bf16 or fp16 dtype and, where fp32 is declared, each AMP mode the device runs; for an impl that declares
    ``slow``, those of the coarsest compute dtype only (bf16 where any mode computes in it), as its many-chunk
    draws take the coarsest dtype only. Its regime (a count or running sum past the compute dtype's exact
    integers) is the same in either dtype, and an fp16 draw takes 2049 rows to reach it where bf16 takes 257:
    under Triton's interpreter (Liger: a program per row) 8× the cost, most of the property's. Compiled on a GPU
    the same impls declare ``slow=False`` and draw every mode."""
    modes = [("plain", n) for d, n in ((torch.bfloat16, "bfloat16"), (torch.float16, "float16")) if d in support.dtypes]
    if torch.float32 in support.dtypes:
        modes += [
            ("amp", n)
            for d, n in ((torch.bfloat16, "bfloat16"), (torch.float16, "float16"))
            if d in support.autocast and capabilities.autocast_dtype(DEVICE_TYPE, d)
        ]
    if getattr(support, "slow", False) and modes:
        coarsest = "bfloat16" if any(c == "bfloat16" for _, c in modes) else "float16"
        modes = [m for m in modes if m[1] == coarsest]
    return modes


@st.composite
def long_batch_problems(draw: st.DrawFn, support) -> Problem:
    """Problems with N past the compute dtype's exact integers (:data:`LONG_N_BY_COMPUTE`: 257 to 513 rows in bf16,
    2049 or 2051 in fp16; any of :data:`LONG_N` where no narrow one is declared), small H ≤ 8 and V ≤ 24, in a
    low-precision dtype or an AMP mode where declared (:func:`long_batch_modes`: of the coarsest compute dtype
    only for a slow impl; else as drawn; a covering row's where in one), with a bias
    where declared: token counts, normalizers and the running sums of grad_weight and grad_bias must not be kept
    in the compute dtype."""
    modes = long_batch_modes(support)
    force: dict[str, Any] = {}
    row = _ROW.get()
    if row is not None and "dtype" in row.force:  # a covering row's precision
        compute = row.force.get("autocast") or row.force["dtype"]
    elif modes:
        kind, compute = draw(st.sampled_from(modes), label="precision")
        if kind == "plain":
            force.update(dtype=compute, autocast=None)
        else:
            force.update(dtype="float32", autocast=compute)
    else:
        compute = None
    force.update(
        N=draw(st.sampled_from(LONG_N_BY_COMPUTE.get(compute, LONG_N)), label="N"),
        H=draw(st.integers(1, 8), label="H"),
        V=draw(st.integers(2, 24), label="V"),
    )
    return draw(problems(support, force=force, require=frozenset({"bias"})), label="problem")


def loss_scale_available(support) -> bool:
    """Whether ``support`` declares AMP fp16 and ``mean``, where :func:`loss_scale_problems` draws."""
    return (
        torch.float16 in support.autocast
        and torch.float32 in support.dtypes
        and "mean" in support.reductions
        and capabilities.autocast_dtype(DEVICE_TYPE, torch.float16)
    )


@st.composite
def loss_scale_problems(draw: st.DrawFn, support) -> Problem:
    """AMP fp16 ``mean`` problems under the loss scale :data:`properties.linear_ce.cases.LOSS_SCALE`, with N ≥ 16 and
    at most a quarter of the rows ignored, so the scaled gradients fit fp16 (:func:`scaled_gradients_fit`) and
    |p − y|·2^17 passes 65504 on some element of most draws: an impl that applies the scale before it
    normalizes overflows there."""
    force: dict[str, Any] = {
        "dtype": "float32",
        "autocast": "float16",
        "reduction": "mean",
        "upstream": "loss_scale",
        "softcap": None,
        "N": draw(st.integers(16, max(16, MAX_N)), label="N"),
        "ignored": draw(st.sampled_from([0.0, 0.1, 0.25]), label="ignored"),
    }
    return draw(problems(support, force=force), label="problem")


def many_chunk_layout(impl: Any) -> chunks.Layout:
    """Where the many-chunk draws put ``impl``'s chunk boundaries, from its declaration alone
    (:func:`numcheck.properties.linear_ce.chunks.layout`; ``with_chunk_rows``, where the impl has it, only makes the
    draws cheaper: one row a chunk)."""
    return chunks.layout(impl)


def _plain_dtype_names(support: Any) -> list[str]:
    """The declared plain dtypes by name; the coarsest alone (bf16, else fp16) for a slow impl."""
    names = [
        n
        for d, n in ((torch.bfloat16, "bfloat16"), (torch.float16, "float16"), (torch.float32, "float32"))
        if d in support.dtypes
    ]
    return names[:1] if support.slow else names


@st.composite
def many_chunk_problems(draw: st.DrawFn, support, layout: chunks.Layout) -> Problem:
    """Problems in a declared plain dtype (no autocast: the coarsest only for slow impls; a covering row's where in
    one) whose rows make :func:`chunks.many_chunks` of that dtype of ``layout``'s chunks (at least
    :data:`chunks.MANY_CHUNKS`; that many for a slow impl) (:meth:`chunks.Layout.shape_strategy`), with few classes and hidden features (:data:`chunks.MANY_CHUNK_MIN_V`
    ≤ V ≤ 24, :data:`chunks.MANY_CHUNK_MIN_H` ≤ H ≤ 8: the error of grad_weight comes from its accumulation
    across chunks rather than from long dot products), not all rows ignored."""
    row = _ROW.get()
    dtype = (
        row.force["dtype"]
        if row is not None and "dtype" in row.force
        else draw(st.sampled_from(_plain_dtype_names(support)), label="dtype")
    )
    shape = layout.shape_strategy(
        chunks.many_chunks(dtype, layout.rows, bool(support.slow)),
        min_h=chunks.MANY_CHUNK_MIN_H,
        min_v=chunks.MANY_CHUNK_MIN_V,
    )
    N, H, V = draw(shape, label="shape")
    force: dict[str, Any] = {"N": N, "H": H, "V": V, "dtype": dtype, "autocast": None}
    return draw(problems(support, force=force, allow_all_ignored=False), label="problem")


#: Rows per chunk of the determinism draws' variant of an impl that exposes ``with_chunk_rows``: N up to the cap
#: then spans up to ⌈MAX_N/7⌉ chunks, whose partial sums an impl may combine in any order.
DETERMINISM_CHUNK_ROWS = 7


def determinism_layout(impl: Any) -> tuple[Any, chunks.Layout | None, int]:
    """``(impl, layout, min V)`` for determinism draws that span :data:`chunks.SEVERAL_CHUNKS` chunks of ``impl``
    (:func:`chunks.layout`: its variant of :data:`DETERMINISM_CHUNK_ROWS` rows a chunk where it exposes
    ``with_chunk_rows``, else from its declaration; no layout, any N, for an impl that declares no chunking over
    rows, :func:`chunks.declares_chunks`) and more classes than its ``chunk_cols`` where declared."""
    s = impl.support
    min_v = s.chunk_cols + 1 if s.chunk_cols else 1
    if not chunks.declares_chunks(impl):
        return impl, None, min_v
    lay = chunks.layout(impl, speed_up_rows=DETERMINISM_CHUNK_ROWS)
    return lay.impl, lay, min_v


@st.composite
def determinism_problems(draw: st.DrawFn, support, layout: chunks.Layout | None = None, min_v: int = 1) -> Problem:
    """Problems where a nondeterministic order shows: :data:`chunks.SEVERAL_CHUNKS` chunks of ``layout`` or more
    (:func:`determinism_layout`: a rule's shapes, else N from the layout's least up to max(MAX_N, twice that))
    and V ≥ ``min_v``, plain fp32 in two draws of three where declared (fp32 keeps the low bits that a reordered
    sum changes; a bf16 result often rounds them away), every reduction and option drawn as usual."""
    force: dict[str, Any] = {}
    if layout is not None and layout.rule is not None:
        shapes = chunks.rule_shapes(layout.rule, chunks.SEVERAL_CHUNKS)
        force.update(zip(("N", "H", "V"), draw(st.sampled_from(shapes), label="shape")))
    elif layout is not None:
        lo = layout.n_range(chunks.SEVERAL_CHUNKS)[0]
        force["N"] = draw(st.one_of(st.just(lo), st.integers(lo, max(lo, MAX_N, 2 * lo - 1))), label="N")
    if min_v > 1 and "V" not in force:
        force["V"] = draw(st.integers(min_v, 2 * min_v), label="V")
    if torch.float32 in support.dtypes and draw(st.sampled_from([True, True, False]), label="fp32"):
        force.update(dtype="float32", autocast=None)
    return draw(problems(support, force=force), label="problem")


@st.composite
def chunk_invariance_problems(draw: st.DrawFn, support, layout: chunks.Layout) -> Problem:
    """Problems spanning :data:`chunks.SEVERAL_CHUNKS` chunks of ``layout`` (a rule's shapes, else its rows with
    H ≤ 16 and V ≤ 24 where N is large), not all rows ignored: rows moved across their boundaries must not
    change the outputs beyond the runs' bounds (:func:`numcheck.properties.linear_ce.props.chunk_invariance`)."""
    N, H, V = draw(layout.shape_strategy(chunks.SEVERAL_CHUNKS, max_h=16), label="shape")
    return draw(problems(support, force={"N": N, "H": H, "V": V}, allow_all_ignored=False), label="problem")


def why_not_run(impl: Any, p: Problem) -> str | None:
    """Why ``impl`` is not run on ``p`` here: it is unavailable (its reason), or ``p`` is outside what it
    declares (:func:`refusal`). ``None`` when it runs."""
    reason = impl.support.unavailable_reason()
    if reason:
        return f"{impl.name}: {reason}"
    refused = refusal(impl.support, p)
    if refused:
        return f"{impl.name} does not declare this case: {refused}"
    return None


def refusal(support, p: Problem) -> str | None:
    """Why ``support`` excludes problem ``p`` (None when it is declared supported)."""
    return support.refuses(
        dtype=p.param_dtype,
        device=torch.device(p.device).type,
        options=p.features,
        reduction=p.reduction,
        autocast=p.compute_dtype if p.autocast else None,
        all_ignored=p.all_ignored,
    )
