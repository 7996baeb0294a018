"""The linear-distill suite's sharpness: each mutant in tests/self/helpers/distill_mutants.py fails the drawn test
:data:`~tests.self.helpers.distill_mutants.CAUGHT_BY` names for it, on the ci profile's draws (12 derandomized
examples, no shrinking), with error/bound >= 2 on some case or by a bitwise or metamorphic judgement (no ratio);
and the built-in it was made from passes every case that caught it."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from numcheck.errors import PropertyFailure
from numcheck.impls.builtin.linear_distill import linear_distill_impls
from numcheck.properties.core.profiles import ci_examples
from numcheck.properties.linear_distill.suite import DISTILL_SUITE
from numcheck.tests.self.helpers.distill_mutants import CAUGHT_BY, MUTANTS

#: One intra-op thread while this module runs (the fixture is in tests/plugin.py).
pytestmark = pytest.mark.usefixtures("one_thread_per_module")


def _ci_failures(prop, impl) -> list[tuple[object, PropertyFailure]]:
    """Every ci-profile example of ``prop`` on ``impl`` that fails, with its failure."""
    found: list[tuple[object, PropertyFailure]] = []

    @settings(
        max_examples=ci_examples(),
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(st.data())
    def search(data):
        case = prop.draw(impl, data)
        try:
            prop.check(impl, case)
        except PropertyFailure as exc:
            found.append((case, exc))

    search()
    return found


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name for m in MUTANTS])
def test_distill_mutant_is_caught(mutant):
    prop = DISTILL_SUITE[CAUGHT_BY[mutant.name]]
    found = _ci_failures(prop, mutant)
    assert found, f"{mutant.name} passes {prop.name} on every ci example"
    ratios = [exc.ratio for _, exc in found if exc.ratio is not None]
    assert not ratios or max(ratios) >= 2, f"{mutant.name}: caught only at error/bound {max(ratios):.3g} < 2"
    builtin = {i.support.chunk_rows is not None: i for i in linear_distill_impls()}[
        mutant.support.chunk_rows is not None
    ]
    twin = builtin.with_support(dtypes=mutant.support.dtypes, chunk_rows=mutant.support.chunk_rows)
    for case, _ in found[:3]:
        prop.check(twin, case)


def test_ignored_rows_are_not_in_the_denominator_under_fp32():
    """A fixed case: counting the ignored rows halves the loss, far beyond the fp32 bound."""
    from numcheck.properties.linear_distill.cases import DistillCase
    from numcheck.tests.self.helpers.distill_mutants import counts_ignored

    case = DistillCase(N=8, H=4, V=6, ignored=4, seed=3)
    with pytest.raises(PropertyFailure, match="error/bound"):
        DISTILL_SUITE["distill_accuracy"].check(counts_ignored, case)
