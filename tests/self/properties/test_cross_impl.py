"""Properties that compare built-in impls with each other: recompute ≡ chunked, and the accumulation-order claim
of the seed (addmm(out_dtype=fp32) is at least as accurate as mm(...).float()), decided statistically."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from numcheck.impls.registry import builtin as _impl
from numcheck.properties.core.device import DEVICE
from numcheck.properties.linear_ce import props
from numcheck.properties.linear_ce.cases import Problem, build
from numcheck.properties.linear_ce.harness import run_impl, run_oracle
from numcheck.properties.linear_ce.strategies import problems

#: False-alarm rate of the accumulation-order decision: the probability of declaring "addmm_out_dtype is less
#: accurate" when its errors are in fact distributed like the fallback's or better (one-sided Wilcoxon
#: signed-rank test at level ALPHA on paired draws).
ALPHA = 1e-3
DRAWS = 20


@settings(max_examples=6)
@given(data=st.data())
def test_recompute_matches_chunked(data):
    """recompute and chunked[addmm_out_dtype] agree within the sum of their bounds on every output."""
    rec, chk = _impl("recompute"), _impl("chunked[addmm_out_dtype]").with_chunk_rows(5)
    p = data.draw(problems(rec.support, allow_all_ignored=False), label="problem")
    t = build(p)
    a, b = run_impl(rec, p, t), run_impl(chk, p, t)
    _, ba = props._bounds(rec, p, t, a)
    _, bb = props._bounds(chk, p, t, b)
    props._pair_check(rec, "recompute_matches_chunked", p, a, ba, b, bb)


def _grad_weight_error(impl, p: Problem) -> float:
    t = build(p)
    ref = run_oracle(p, t, all_ignored="nan")
    gw = run_impl(impl, p, t).grad_weight.double()
    return float((gw - ref.grad_weight).norm() / ref.grad_weight.norm())


def _alarm(candidate: str, baseline: str) -> tuple[bool, float, list[float], list[float]]:
    """Whether the test declares ``candidate``'s grad_weight error worse than ``baseline``'s (p < ALPHA)."""
    cand = _impl(candidate).with_chunk_rows(8)
    base = _impl(baseline).with_chunk_rows(8)
    ec, eb = [], []
    for seed in range(DRAWS):
        # 32 chunks of 8 rows, on the suite's device: on CUDA addmm_out_dtype is the real out_dtype kernel
        p = Problem(N=256, H=24, V=40, dtype="bfloat16", seed=seed, device=DEVICE)
        ec.append(_grad_weight_error(cand, p))
        eb.append(_grad_weight_error(base, p))
    diff = torch.tensor(ec) - torch.tensor(eb)
    res = stats.wilcoxon(diff.numpy(), alternative="greater")
    return bool(res.pvalue < ALPHA), float(res.pvalue), ec, eb


def test_addmm_out_dtype_not_less_accurate_than_fallback():
    """Over 20 paired bf16 draws (32 chunks each), addmm_out_dtype's grad_W error is not worse than the
    fallback's (one-sided Wilcoxon, false-alarm rate 1e-3)."""
    alarm, pv, ec, eb = _alarm("chunked[addmm_out_dtype]", "chunked[fallback]")
    assert not alarm, f"addmm_out_dtype looks less accurate than fallback: p={pv:.2g}, errors {ec} vs {eb}"
    # And the seed's claim in its strong form: here it is more accurate on every draw.
    assert max(ec) < min(eb), f"expected a clear gap: addmm_out_dtype {max(ec):.3g} vs fallback {min(eb):.3g}"


def test_accumulation_order_test_can_alarm():
    """The same decision does alarm when the candidate really is worse (lowp_accum against fallback)."""
    alarm, pv, ec, eb = _alarm("chunked[lowp_accum]", "chunked[fallback]")
    assert alarm, f"the test failed to see lowp_accum as worse than fallback: p={pv:.2g}"
