"""The production-shape tier as tests: every linear+CE impl at the shapes of :data:`properties.production.tier.SHAPES`
(``production``), bf16 and AMP, judged as ``numcheck production`` judges it (:func:`properties.production.tier.judge_impl`:
the suite's accuracy property against the chunked float64 oracle, on realistic inputs).

Off by default: marked ``numcheck_production`` and run only with ``--numcheck-production``, on CUDA (each case is GiBs
of float64 and about a minute of an H200). ``NUMCHECK_PRODUCTION_SHAPES`` picks another preset or shapes
(``smoke``, or ``NAME=NxHxV,...``). The tests of one case share its inputs, oracle, eager's errors and bounds
(a module-scoped fixture, so pytest runs them case by case); ``numcheck production`` is the same tier with crash
isolation and a JSON + Markdown record.
"""

from __future__ import annotations

import os
from typing import Any, Iterator

import pytest
import torch

from numcheck.impls.protocols.linear_ce import LINEAR_CE_KIND
from numcheck.impls.registry import by_kind, discover
from numcheck.properties.production.tier import DTYPES, Case, CaseContext, env_shapes, judge_impl, parse_shapes

pytestmark = pytest.mark.numcheck_production

_SHAPES = env_shapes(os.environ)
_CASES = [Case(s, prec, "cuda") for prec in DTYPES for s in parse_shapes(_SHAPES)]


@pytest.fixture(scope="module", params=_CASES, ids=[c.label for c in _CASES])
def production_case(request: pytest.FixtureRequest) -> Iterator[CaseContext]:
    """The shared work of one case (built once for every impl of it), on CUDA."""
    if not request.config.getoption("--numcheck-production"):
        pytest.skip("the production-shape tier runs only with --numcheck-production (CUDA, minutes)")
    if not torch.cuda.is_available():
        pytest.skip(
            "the production-shape tier needs CUDA (GiBs of float64 per case); numcheck production --shapes smoke "
            "runs its logic on CPU"
        )
    ctx = CaseContext.build(request.param)
    ctx.bounds.plan([e.impl for e in by_kind(discover([]), LINEAR_CE_KIND)])  # a hint: what shares bound sweeps
    yield ctx
    del ctx
    torch.cuda.empty_cache()


def test_production_accuracy(linear_ce_impl: Any, production_case: CaseContext) -> None:
    """At a production shape the impl's loss and gradients are within the suite's bounds of the float64 oracle."""
    rec = judge_impl(linear_ce_impl, production_case)
    if rec["status"] == "unavailable":
        pytest.skip(f"unavailable here: {rec['reason']}")
    if rec["status"] == "unsupported":
        pytest.skip(f"not declared: {rec['reason']}")
    if rec["status"] == "known":
        pytest.skip(f"known divergence: {rec['known_divergence']}")
    if rec["status"] != "pass":
        pytest.fail(rec.get("failure") or f"{rec['status']}: {rec.get('reason')}", pytrace=False)
