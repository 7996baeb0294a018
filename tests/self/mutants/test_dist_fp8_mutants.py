"""The TP FP8 suite's sharpness: the ci profile's draws of the suite test named in CAUGHT_BY fail every mutant."""

from __future__ import annotations

import pytest
from hypothesis import Phase, settings

from numcheck.properties.distributed.tp_fp8.suite import run_drawn
from numcheck.properties.distributed.pool.pool import default_backend, world_size_unavailable
from numcheck.properties.core.failures import PropertyFailure
from numcheck.tests.self.helpers.dist_fp8_mutants import CAUGHT_BY, MUTANTS

pytestmark = pytest.mark.usefixtures("one_thread_per_module")


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name for m in MUTANTS])
def test_mutant_is_caught_by_the_ci_profile(mutant):
    """The ci profile's draws (unshrunk: the first failure is enough) of the mutant's suite test fail it."""
    base = settings(settings.get_profile("numcheck-ci"), phases=[p for p in Phase if p is not Phase.shrink])
    sizes = [p for p in mutant.support.world_sizes if p > 1 and world_size_unavailable(p, default_backend()) is None]
    if not sizes:
        pytest.skip(f"the mutants need P >= 2: {world_size_unavailable(2, default_backend())}")
    pin = {} if len(sizes) == len([p for p in mutant.support.world_sizes if p > 1]) else {"world": max(sizes)}
    with pytest.raises(PropertyFailure):
        run_drawn(mutant, CAUGHT_BY[mutant.name], base=base, **pin)
