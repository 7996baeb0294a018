"""Every linear+CE property against every registered impl (built-in and plugged in), on hypothesis-drawn problems.

One ``@given`` per test, at test level, so hypothesis' statistics, ``@reproduce_failure`` advice and example
database work as for any hypothesis test (one key per (test, impl), free of the path the module was collected by:
numcheck's plugin sets it, numcheck.properties.core.draw_isolation.draw_key). What each test draws and when it is skipped is data,
:data:`numcheck.properties.linear_ce.suite.SUITE`, run by :mod:`numcheck.properties.core.runner`, the same runner
:func:`numcheck.check` uses. Problems are drawn only inside what each impl declares; a property that needs a
feature the impl does not declare is skipped with the reason; a draw a known divergence covers is rejected
(``assume``), and a test all of whose draws are covered is skipped (numcheck's plugin turns hypothesis'
``Unsatisfiable`` into that skip). Failures carry the impl, the case, the output, error, bound, worst element and
a one-line repro command (see properties/core/failures.py). Before its random draws each test runs its covering rows
(:mod:`numcheck.properties.linear_ce.coverage`: a pairwise design over the dimensions the test varies, per impl); impls
declaring ``slow`` get a quarter of the profile's examples (at least 2), less the rows, at least 2 random draws
left: numcheck's plugin runs the rows and sets that budget per call (:func:`numcheck.properties.core.runner.budget`).
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from numcheck.errors import PropertyFailure
from numcheck.properties.core.device import DEVICE
from numcheck.properties.core.runner import judge
from numcheck.properties.linear_ce import props
from numcheck.properties.linear_ce.known import known
from numcheck.properties.linear_ce.strategies import refusal
from numcheck.properties.linear_ce.suite import PINNED, SUITE
from numcheck.tests.suite.drawn import run_drawn

pytestmark = pytest.mark.torch_versions_impls(
    "chunked[addmm_out_dtype]",
    "eager",
    "chunked_triton",
    "torch_native[reference]",
    "liger[accum=fp32]",
    reason="one impl per torch-switched path: the addmm_out_dtype probe, autocast (eager), the Triton torch pins, F.linear_cross_entropy, Liger's import",
)


def _run(name: str, impl: Any, data: Any) -> None:
    """One example of the suite's test ``name`` on ``impl``."""
    __tracebackhide__ = True
    run_drawn(SUITE[name], impl, data)


@given(data=st.data())
def test_accuracy(linear_ce_impl, data):
    """Every output of the impl is within the analytic bound of the float64 oracle and within k× eager's error."""
    _run("accuracy", linear_ce_impl, data)


@given(data=st.data())
def test_accuracy_fp32_sharp(linear_ce_impl, data):
    """In fp32 (where bounds are tightest) every output is within bound, on every option combination declared."""
    _run("accuracy_fp32_sharp", linear_ce_impl, data)


@given(data=st.data())
def test_all_options_combined(linear_ce_impl, data):
    """Every declared option on at once (bias, ignored rows, smoothing, class weights, softcap, z-loss), in fp32
    where declared: interactions such as the z-loss normalizer under class weights are judged at fp32 sharpness."""
    _run("all_options_combined", linear_ce_impl, data)


@given(data=st.data())
@pytest.mark.costly(
    reason="many-chunk draws (at least MANY_CHUNKS chunks of the declared size) on every impl; slowest under Triton's interpreter (split_fp32 kernels, Liger, TE)"
)
def test_many_chunks(linear_ce_impl, data):
    """With many chunks, from the declaration alone (numcheck.properties.linear_ce.chunks: 2/u + 1 chunks of the
    declared chunk_rows in bf16 and fp16, at least 257, or a declared chunk_rule's shapes giving as many; past 8192
    rows when no chunk size is declared; with_chunk_rows, where an impl has it, only makes them cheaper), every
    output is within bounds in a declared plain dtype (the coarsest only for slow impls), each dtype and reduction
    on post-norm rows: a running sum across chunks kept narrower than declared fails here."""
    _run("many_chunks", linear_ce_impl, data)


@given(data=st.data())
def test_large_vocab(linear_ce_impl, data):
    """With V past any single block (1025, 2049, 4097, ... up to 4100) every output is within bounds: an online
    log-sum-exp or a V-tiled gradient must combine its blocks correctly (regimes with a wide logit spread, where
    a later block's max exceeds the first's by more than exp's range)."""
    _run("large_vocab", linear_ce_impl, data)


@given(data=st.data())
def test_long_batch(linear_ce_impl, data):
    """With N just past the compute dtype's exact integers (257 to 513 rows in bf16, past 256; 2049 or 2051 in fp16,
    past 2048), in a declared low-precision dtype or AMP mode and with a bias, every output is within bounds (each
    such mode and reduction on post-norm rows): a token count, normalizer or running gradient sum kept in the
    compute dtype fails. A slow impl draws its coarsest compute dtype only (bf16 where declared), as in
    test_many_chunks."""
    _run("long_batch", linear_ce_impl, data)


@given(data=st.data())
def test_wide_hidden(linear_ce_impl, data):
    """With H past the draws' cap (256, 257, 512, 1031, ... up to 1100) every output is within bounds: a split or
    tiled reduction over H must add the bias once and combine its parts exactly."""
    _run("wide_hidden", linear_ce_impl, data)


@given(data=st.data())
def test_loss_scale(linear_ce_impl, data):
    """Under a mixed-precision loss scale (2^17, AMP fp16, mean), where the scaled gradients fit fp16, every
    output is within bounds: no intermediate may leave fp16's range that the result itself does not."""
    _run("loss_scale", linear_ce_impl, data)


@given(data=st.data())
def test_strided_inputs(linear_ce_impl, data):
    """Non-contiguous inputs (a column slice of x, a transposed weight, strided bias and target) give outputs
    within bounds, or a loud refusal; never values read from the wrong elements."""
    _run("strided_inputs", linear_ce_impl, data)


@pytest.mark.parametrize("prop", ["weight", "x"], ids=["weight", "x"])
@given(data=st.data())
def test_frozen_inputs(linear_ce_impl, prop, data):
    """With the weight frozen grad_x (and grad_bias) stay within bounds; with x frozen grad_weight does."""
    _run(f"frozen_inputs[{prop}]", linear_ce_impl, data)


@given(data=st.data())
def test_two_calls(linear_ce_impl, data):
    """Two calls sharing W and bias in one graph (a batch's halves, `sum` or `mean` each over its own rows, losses
    added, one backward) give the halves' summed oracle values within bounds: no call's state (gradients, a
    token count) is reused by the next."""
    _run("two_calls", linear_ce_impl, data)


@given(data=st.data())
def test_earlier_calls(linear_ce_impl, data):
    """A call's outputs depend on its own inputs only: after a call under the other AMP dtype, and after an
    in-place update of the weight and bias, on the same tensors, they are within bounds (no compiled graph or
    cast weight is reused stale)."""
    _run("earlier_calls", linear_ce_impl, data)


@given(data=st.data())
def test_confident_rows(linear_ce_impl, data):
    """Confident predictions (p_target → 1) keep the true-class gradient accurate relative to itself."""
    _run("confident_rows", linear_ce_impl, data)


@given(data=st.data())
def test_ignored_rows(linear_ce_impl, data):
    """Ignored rows get exactly zero grad_x, and changing x in them changes nothing, bitwise."""
    _run("ignored_rows", linear_ce_impl, data)


@given(data=st.data())
def test_permutation(linear_ce_impl, data):
    """Permuting tokens permutes per-row outputs and leaves reductions and grad_W unchanged, within bounds."""
    _run("permutation", linear_ce_impl, data)


@given(data=st.data())
def test_shift_invariance(linear_ce_impl, data):
    """A constant added to every logit through the bias changes nothing, within bounds (no softcap, no z-loss)."""
    _run("shift_invariance", linear_ce_impl, data)


@given(data=st.data())
def test_option_identities(linear_ce_impl, data):
    """Neutral option values passed explicitly (ε=0, unit class weights, λ=0, softcap→∞) equal the plain call."""
    _run("option_identities", linear_ce_impl, data)


@given(data=st.data())
def test_reduction_consistency(linear_ce_impl, data):
    """sum = mean × normalizer, 'none' rows add to 'sum', upstream gradients scale gradients linearly."""
    _run("reduction_consistency", linear_ce_impl, data)


@given(data=st.data())
def test_determinism(linear_ce_impl, data):
    """Two runs on the same inputs are bitwise equal."""
    _run("determinism", linear_ce_impl, data)


@given(data=st.data())
def test_chunk_invariance(linear_ce_impl, data):
    """What falls in which chunk changes nothing beyond bounds: chunk sizes 1, 3 and N+1 where the impl exposes
    with_chunk_rows, else rows rotated across its declared chunk boundaries and ignored rows prepended."""
    _run("chunk_invariance", linear_ce_impl, data)


@given(data=st.data())
def test_grad_dtypes(linear_ce_impl, data):
    """Gradients come back in the parameters' dtypes, under AMP too."""
    _run("grad_dtypes", linear_ce_impl, data)


@given(data=st.data())
def test_loss_dtype(linear_ce_impl, data):
    """The loss comes back at least as precise as declared: the parameters' dtype, so fp32 under AMP, by default."""
    _run("loss_dtype", linear_ce_impl, data)


def test_pinned_cases(linear_ce_impl):
    """Every pinned case that the impl declares passes the accuracy property. All of them run (the failure names
    each failing case), unless the impl raises: that one failure says so."""
    failures, ran = [], 0
    for case in PINNED.values():
        p = case.replace(device=DEVICE)
        if refusal(linear_ce_impl.support, p) or known(linear_ce_impl.name, "accuracy", p):
            continue
        ran += 1
        try:
            judge(props.accuracy, linear_ce_impl, p)
        except PropertyFailure as exc:
            failures.append(exc)
            if exc.raised:
                break
    if not ran:
        pytest.skip(
            f"{linear_ce_impl.name} declares none of the {len(PINNED)} pinned cases (or a known divergence "
            f"covers them: numcheck.properties.linear_ce.known)"
        )
    if failures:
        first = failures[0]
        others = "".join(f"\n  also fails on pinned case {f.case!r}" for f in failures[1:])
        raise PropertyFailure(f"{first}{others}", case=first.case, ratio=first.ratio, raised=first.raised)
