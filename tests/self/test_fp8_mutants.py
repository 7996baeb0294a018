"""The FP8 suite's own sharpness: each mutant in tests/self/fp8_mutants.py must fail the property meant to catch it."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, Phase, find, settings

from numcheck.properties import fp8_checks as checks
from numcheck.properties.failures import PropertyFailure
from numcheck.properties.fp8_cases import QuantCase
from numcheck.properties.fp8_strategies import quant_cases
from numcheck.tests.self.fp8_mutants import CAUGHT_BY, MUTANTS

# No shrinking: the first failing case is enough to show the mutant is caught (shrinking only costs time).
_FIND = settings(max_examples=60, derandomize=True, database=None, deadline=None, phases=[Phase.generate],
                 suppress_health_check=list(HealthCheck))


#: One intra-op thread while this module runs (the fixture is in tests/plugin.py).
pytestmark = pytest.mark.usefixtures("one_thread_per_module")


def _fails(prop, impl, case: QuantCase) -> bool:
    try:
        prop(impl, case)
    except PropertyFailure:
        return True
    return False


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name for m in MUTANTS])
def test_mutant_is_caught(mutant):
    """Hypothesis finds a case inside the mutant's declaration on which its property fails."""
    prop = checks.FP8_PROPERTIES[CAUGHT_BY[mutant.name]]
    soi = CAUGHT_BY[mutant.name] == "save_original_input" and mutant.recipe_kind != "delayed"
    mode = True if mutant.name == "mutant_shared_saved_x_workspace" else None  # its workspace holds the original x
    strategy = quant_cases(mutant.support, regimes=("normal", "wide", "outlier"), require_soi=soi,
                           save_original_input=mode)
    found = find(strategy, lambda c: _fails(prop, mutant, c), settings=_FIND)
    assert _fails(prop, mutant, found)


def test_mx_scale_mutant_fails_the_quantizer_property():
    """The wrong-way MXFP8 scale is also caught bitwise by the quantizer property, on ordinary data."""
    mutant = next(m for m in MUTANTS if m.name == "mutant_mx_scale_wrong_way")
    t = torch.randn(16, 64, generator=torch.Generator().manual_seed(0))
    for recipe in mutant.support.recipes:
        with pytest.raises(PropertyFailure, match="differ"):
            checks.quantizer(mutant, recipe, t)


def test_colwise_from_rowwise_mutant_is_invisible_to_per_tensor_scaling():
    """Documented limit: with one scale per tensor, requantizing the rowwise-quantized x gives the same bits,
    so this mutant is only observable for block-scaled recipes (which the suite therefore always draws)."""
    from numcheck.impls.quant_linear import Fp8Linear
    from numcheck.reference.fp8_recipes import Fp8Recipe
    from numcheck.tests.self.fp8_mutants import ColumnwiseFromRowwiseQuantized

    per_tensor = ColumnwiseFromRowwiseQuantized("per_tensor_variant", (Fp8Recipe("current", power_of_2_scales=True, fp8_format="E4M3"),))
    case = QuantCase(per_tensor.support.recipes[0], 32, 64, 16, seed=1)
    checks.save_original_input(per_tensor, case)  # passes: pow2 per-tensor requantization is idempotent
    assert isinstance(per_tensor, Fp8Linear)


def test_mutants_load_as_outside_impls():
    """The mutants load through the registry's spec path like any outside impl, and describe themselves."""
    from numcheck.impls.registry import ImplEntry, load_spec

    entries = load_spec("numcheck.tests.self.fp8_mutants:MUTANTS", "--impl")
    assert entries and all(isinstance(e, ImplEntry) for e in entries), entries
    assert all("recipes:" in e.impl.support.describe() for e in entries)
