"""The grouped FP8 suite's sharpness: each mutant in tests/self/helpers/grouped_fp8_mutants.py fails the property
meant to catch it, on a case drawn inside its declaration, and the built-in it was made from passes there."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, Phase, find, settings

from numcheck.errors import PropertyFailure
from numcheck.impls.builtin.grouped_fp8_linear import GroupedFusedLinear
from numcheck.properties.fp8.grouped.cases import GroupedCase
from numcheck.properties.fp8.grouped.props import GROUPED_PROPERTIES
from numcheck.properties.fp8.grouped.strategies import grouped_cases
from numcheck.reference.fp8_recipes import Fp8Recipe
from numcheck.tests.self.helpers.grouped_fp8_mutants import CAUGHT_BY, MUTANTS

# No shrinking: the first failing case shows the mutant is caught.
_FIND = settings(
    max_examples=40,
    derandomize=True,
    database=None,
    deadline=None,
    phases=[Phase.generate],
    suppress_health_check=list(HealthCheck),
)

#: One intra-op thread while this module runs (the fixture is in tests/plugin.py).
pytestmark = pytest.mark.usefixtures("one_thread_per_module")

#: What each mutant's search draws from (keywords of grouped_cases): the regimes and modes its bug needs, all of
#: them among the suite's own draws for that property (properties/fp8/grouped/suite.py).
DRAWS: dict[str, dict] = {
    "mutant_grouped_shared_scale": dict(regimes=("normal", "wide", "outlier")),
    "mutant_grouped_offsets_off_by_one": dict(regimes=("normal", "outlier")),
    "mutant_grouped_zero_amax_inf_scale": dict(regimes=("zero_expert",)),
    "mutant_grouped_wrong_expert_dy_quantizer": dict(regimes=("normal", "wide")),
    "mutant_grouped_bf16_main_grad": dict(regimes=("normal", "wide"), main_grad=True),
    "mutant_grouped_first_micro_batch_main_grad": dict(regimes=("normal",), main_grad=True),
    "mutant_grouped_stale_wgrad_workspace": dict(regimes=("normal",), empty=True, main_grad=False),
    "mutant_grouped_soi_whole_input": dict(regimes=("normal", "outlier"), require_soi=True),
    "mutant_grouped_saves_copy_of_x": dict(regimes=("normal",), require_soi=True),
}


def _fails(prop, impl, case: GroupedCase) -> bool:
    try:
        prop(impl, case)
    except PropertyFailure:
        return True
    return False


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name for m in MUTANTS])
def test_grouped_mutant_is_caught(mutant):
    """Hypothesis finds a case inside the mutant's declaration on which its property fails; the correct fused
    built-in with the same declaration passes that case."""
    prop = GROUPED_PROPERTIES[CAUGHT_BY[mutant.name]]
    found = find(grouped_cases(mutant.support, **DRAWS[mutant.name]), lambda c: _fails(prop, mutant, c), settings=_FIND)
    assert _fails(prop, mutant, found)
    correct = GroupedFusedLinear(
        "correct_twin",
        recipes=mutant.support.recipes,
        bitwise_per_expert=True,
        fused_wgrad_accumulation=mutant.support.fused_wgrad_accumulation,
    )
    prop(correct, found)


def test_every_mutant_has_a_draw():
    """Each mutant names its draw, and the draws stay inside the suite's regimes."""
    assert set(DRAWS) == {m.name for m in MUTANTS}


def test_zero_amax_mutant_is_invisible_on_an_empty_expert():
    """Documented limit: an infinite scale for an expert with no rows meets no element, so only a non-empty expert
    whose amax is 0 (zero / padding rows, the suite's ``zero_expert`` regime) shows it."""
    mutant = next(m for m in MUTANTS if m.name == "mutant_grouped_zero_amax_inf_scale")
    GROUPED_PROPERTIES["accuracy"](mutant, GroupedCase(Fp8Recipe("current"), (0, 16, 0, 9), 24, 16, seed=3))
    with pytest.raises(PropertyFailure, match="non-finite"):
        GROUPED_PROPERTIES["accuracy"](
            mutant, GroupedCase(Fp8Recipe("current"), (0, 16, 0, 9), 24, 16, seed=3, regime="zero_expert")
        )


def test_grouped_mutants_load_as_outside_impls():
    """The mutants load through the registry's spec path like any outside impl."""
    from numcheck.impls.registry import ImplEntry, load_spec

    entries = load_spec("numcheck.tests.self.helpers.grouped_fp8_mutants:MUTANTS", "--impl")
    assert entries and all(isinstance(e, ImplEntry) and e.kind == "grouped-fp8-linear" for e in entries), entries


#: The drawn suite test of each property a mutant must fail.
SUITE_TEST = {
    "accuracy": "grouped_accuracy_against_both_references",
    "empty_experts": "grouped_empty_experts_exact_zero",
    "save_original_input": "grouped_save_original_input_is_bitwise_identical",
    "saved_bytes": "grouped_saved_bytes_measured",
    "wgrad_accumulation": "grouped_wgrad_accumulation_over_micro_batches",
}


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name for m in MUTANTS])
def test_ci_profile_catches_grouped_mutant(mutant):
    """The shipped suite's own drawn test, under the ci profile's budget and draws (numcheck.check's runner, no
    shrinking), fails the mutant."""
    from hypothesis import settings as hsettings

    from numcheck.properties.check import _run_drawn
    from numcheck.properties.fp8.grouped.suite import GROUPED_SUITE

    base = hsettings(hsettings.get_profile("numcheck-ci"), phases=[p for p in Phase if p is not Phase.shrink])
    verdict = _run_drawn(GROUPED_SUITE[SUITE_TEST[CAUGHT_BY[mutant.name]]], mutant, base)
    assert verdict.status == "failed", verdict


def test_per_expert_equality_holds_up_to_the_sign_of_zero():
    """The built-in loop's dgrad holds +0 where the single linear's GEMM gives -0 (the CPU sweep's seed 0 case, a
    false alarm before): per_expert_linear passes it, as TE's per-expert check (rtol = atol = 0) does; a
    mutant off by one bit still fails it (test_grouped_mutant_is_caught)."""
    from numcheck.impls.registry import builtin

    case = GroupedCase(Fp8Recipe("delayed"), (0, 3, 1), 8, 1, dtype="bfloat16", seed=779, weights="grouped")
    GROUPED_PROPERTIES["per_expert_linear"](builtin("grouped_fp8_linear[loop]"), case)


def test_ci_profile_catches_hybrid_backward_dy_as_e4m3():
    """A grouped backward quantizing dy as E4M3 under a HYBRID recipe (TE #3342; forward right) fails the grouped
    accuracy test's ci draws, which already hold HYBRID recipes where declared: dgrad against the dequantized
    reference (error/bound 25.6 on the first draw here)."""
    from hypothesis import settings as hsettings

    from numcheck.properties.check import _run_drawn
    from numcheck.properties.fp8.grouped.suite import GROUPED_SUITE
    from numcheck.tests.self.helpers.grouped_fp8_mutants import hybrid_dy_e4m3

    base = hsettings(hsettings.get_profile("numcheck-ci"), phases=[p for p in Phase if p is not Phase.shrink])
    verdict = _run_drawn(GROUPED_SUITE[SUITE_TEST[CAUGHT_BY[hybrid_dy_e4m3.name]]], hybrid_dy_e4m3, base)
    assert verdict.status == "failed" and "dgrad" in verdict.message, verdict


def test_numcheck_check_judges_a_grouped_impl(capsys, monkeypatch):
    """``numcheck.check`` runs the grouped family's drawn tests (its SUITES entry): the fused built-in passes the
    empty-expert test on 2 draws, the stale-workspace mutant fails it with one verdict naming the impl, the case,
    the output, where and by how much, and a ``numcheck repro`` line that reruns the failure as printed."""
    import shlex

    import numcheck
    from numcheck.reports import cli

    name = "grouped_empty_experts_exact_zero"
    ok = numcheck.check("grouped_fp8_linear[fused]", [name], profile="ci", max_examples=2)
    assert ok.ok and ok.verdicts[name].status == "passed" and ok.verdicts[name].examples == 2, ok
    spec = "numcheck.tests.self.helpers.grouped_fp8_mutants:stale_wgrad_workspace"
    bad = numcheck.check(spec, [name], profile="ci", max_examples=2)
    v = bad.verdicts[name]
    assert not bad.ok and v.status == "failed" and isinstance(v.worst_case, GroupedCase), bad
    assert "for impl 'mutant_grouped_stale_wgrad_workspace'" in v.message and "case: GroupedCase(" in v.message
    assert "wgrad of empty expert" in v.message and "at [" in v.message and "bound 0" in v.message, v.message
    line = next(ln.strip() for ln in v.message.splitlines() if ln.strip().startswith("reproduce: "))
    words = shlex.split(line.removeprefix("reproduce: "))
    # NUMCHECK_IMPLS=<spec> first where an earlier test of this worker loaded the mutant by a spec naming several
    # (registry.spec_of keeps the first: test_report_grouped's MUTANTS); the line sets it as a shell would.
    while words and "=" in words[0] and words[0] != "numcheck":
        monkeypatch.setenv(*words.pop(0).split("=", 1))
    assert words[:2] == ["numcheck", "repro"], line
    capsys.readouterr()
    assert cli.main(words[1:]) == 1
    assert capsys.readouterr().out.startswith("FAIL")


def test_numcheck_check_verdict_of_a_grouped_accuracy_failure_carries_its_error_bound():
    """A grouped accuracy failure fills ``numcheck.check``'s verdict as the single FP8 family's does: the failing
    case and its error/bound (the largest over the failing outputs and both references, above 1), one its message
    prints."""
    import re

    import numcheck

    name = "grouped_accuracy_against_both_references"
    spec = "numcheck.tests.self.helpers.grouped_fp8_mutants:shared_scale"
    v = numcheck.check(spec, [name], profile="ci", max_examples=2).verdicts[name]
    assert v.status == "failed" and not v.impl_raised and isinstance(v.worst_case, GroupedCase), v
    shown = [float(x) for x in re.findall(r"error/bound ([0-9.e+]+)", v.message)]
    assert v.worst_ratio is not None and v.worst_ratio > 1, v
    assert any(v.worst_ratio == pytest.approx(x, rel=1e-2) for x in shown), (v.worst_ratio, shown)
    assert f"the failing case's error/bound {v.worst_ratio:.3g}" in str(v), v
