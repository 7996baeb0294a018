"""The distributed (vocabulary-parallel) linear+CE properties, on every loaded impl of kind ``dist_linear_ce`` (the
plugin's ``dist_linear_ce_impl`` fixture: the built-ins of numcheck.impls.registry, or those ``--impl`` names), on
the backend of numcheck.properties.distributed.pool.pool.default_backend (gloo on CPU): accuracy against the unsharded
float64 oracle at every declared world size (targets on shard boundaries and ranks owning no target drawn on
purpose, ignored rows, every rank's loss the same; judgement (b) against the declared path), the world-size
relation at 2 and 4 against 1, determinism where declared. The ci profile's example count applies per (test, impl,
world size); a timeout fails its case once."""

from __future__ import annotations

import pytest

from numcheck.properties.distributed.linear_ce.props import dist_accuracy, dist_determinism, dist_world_size_invariance
from numcheck.properties.distributed.linear_ce.suite import EveryDrawKnown, run_property
from numcheck.properties.distributed.pool.pool import default_backend, world_size_unavailable
from numcheck.tests.plugin import profile_name

pytestmark = pytest.mark.torch_versions_impls(
    "vocab_parallel[nan]", reason="torch.distributed (gloo) of this torch, on one built-in"
)


def _usable(impl, world_size: int) -> None:
    """Skip where the impl does not declare this world size or backend, or the backend cannot run that many ranks
    here (nccl: one GPU per rank); the fixture already skipped an impl that cannot run here at all."""
    if world_size not in impl.dist.world_sizes or default_backend() not in impl.dist.backends:
        pytest.skip(f"{impl.name} declares world sizes {impl.dist.world_sizes} on {impl.dist.backends}")
    why = world_size_unavailable(world_size, default_backend())
    if why:
        pytest.skip(why)


def _profile() -> str:
    return profile_name()


def _run(prop, impl, world_size: int, **kwargs) -> None:
    """``run_property`` for the suite: a test none of whose draws could be judged because each was a recorded
    known divergence of the impl (e.g. a release whose backward raises on every call the adapter makes) is skipped with those reasons."""
    try:
        run_property(prop, impl, world_size, _profile(), **kwargs)
    except EveryDrawKnown as exc:
        pytest.skip(str(exc))


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_dist_accuracy(dist_linear_ce_impl, world_size):
    """Every output (every rank's grad_x, the assembled grad_W and grad_b shards) within the sharded model's bound
    of the float64 oracle, and every rank's loss bitwise equal."""
    impl = dist_linear_ce_impl
    _usable(impl, world_size)
    _run(dist_accuracy, impl, world_size)


@pytest.mark.parametrize("world_size", [2, 4])
def test_dist_world_size_invariance(dist_linear_ce_impl, world_size):
    """The same case (targets placed on this world size's shards) at world size 1 (or the smallest other declared)
    and at this one: each output of the one within what the world size may change under the declaration of the
    other's (the reduce dtype's roundings of the grad_x partials, their order, the fp32 statistics' order)."""
    impl = dist_linear_ce_impl
    _usable(impl, world_size)
    _run(dist_world_size_invariance, impl, world_size)


def test_dist_determinism(dist_linear_ce_impl):
    """Two calls at world size 4 are bitwise equal, for impls declaring determinism."""
    impl = dist_linear_ce_impl
    if not impl.dist.deterministic:
        pytest.skip(f"{impl.name} does not declare deterministic")
    _usable(impl, 4)
    _run(dist_determinism, impl, 4, share=1 / 3)
