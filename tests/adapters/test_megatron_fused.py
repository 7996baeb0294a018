"""Megatron-core's vocab-parallel cross-entropy, fused and unfused, and its known divergences
(numcheck.properties.distributed.linear_ce.known): every entry's example still diverges where the entry holds
(strict, so a fixed release is noticed); an entry of some outputs diverges in its covered outputs only, passes on a
release outside the range, and a covered case still has every output judged (the covered gradients under the
divergence's model, the loss under the impl's own); an entry of every output is a case the suite leaves out."""

from __future__ import annotations

import fnmatch

import pytest

from numcheck.errors import PropertyFailure
from numcheck.impls.adapters.megatron import MegatronVocabParallel
from numcheck.impls.registry import dist_impls
from numcheck.properties.distributed.linear_ce import known as dist_known
from numcheck.properties.distributed.linear_ce.cases import DistCase
from numcheck.properties.distributed.linear_ce.known import DIST_KNOWN
from numcheck.properties.distributed.linear_ce.props import OUTPUT_NAMES, dist_accuracy
from numcheck.properties.distributed.linear_ce.suite import known_divergence

pytestmark = pytest.mark.torch_versions(reason="megatron-core imported and run under this torch")

#: Megatron's entries: those off in some outputs, judged under their model, and those off in every output, left
#: out of the draws.
MEGATRON_KNOWN = [d for d in DIST_KNOWN if d.impls.startswith("megatron_")]
OUTPUT_KNOWN = [d for d in MEGATRON_KNOWN if not d.every_output]
WHOLE_CASE_KNOWN = [d for d in MEGATRON_KNOWN if d.every_output]
IDS = [f"{d.impls}:{d.example.short()}" for d in OUTPUT_KNOWN]
WHOLE_CASE_IDS = [f"{d.impls}:{d.example.short()}" for d in WHOLE_CASE_KNOWN]


class FusedNoGradXAllReduce(MegatronVocabParallel):
    """The fused adapter with grad_x left as the rank's partial (x fed to the shard's matmul without Megatron's copy
    region, so its backward has no all-reduce): a defect in a covered output."""

    def __init__(self) -> None:
        super().__init__(fused=True)

    def rank_call(self, x, weight, target, bias=None, *, group, vocab_start, vocab_size, **options):
        import megatron.core.tensor_parallel.mappings as mappings

        saved = mappings.copy_to_tensor_model_parallel_region
        mappings.copy_to_tensor_model_parallel_region = lambda t, group=None: t
        try:
            return super().rank_call(
                x, weight, target, bias, group=group, vocab_start=vocab_start, vocab_size=vocab_size, **options
            )
        finally:
            mappings.copy_to_tensor_model_parallel_region = saved


class FusedLossScaled(MegatronVocabParallel):
    """The fused adapter with its loss scaled by 1 + 1e-4 (the gradients too, by far less than bf16's 2⁻⁸): a
    defect in the output the divergence does not cover."""

    def __init__(self) -> None:
        super().__init__(fused=True)

    def rank_call(self, *args, **kwargs):
        return super().rank_call(*args, **kwargs) * (1 + 1e-4)


def _case(entry) -> DistCase:
    return DistCase(problem=entry.example, world_size=entry.example_world_size, placement=entry.example_placement)


def _impl(pattern: str):
    """The one registered distributed impl ``pattern`` (an entry's ``impls``) names; skips where it cannot run."""
    (impl,) = [i for i in dist_impls() if fnmatch.fnmatchcase(i.name, pattern)]
    name = impl.name
    why = impl.support.unavailable_reason()
    if why:
        pytest.skip(f"impl {name!r} unavailable here: {why}")
    return impl


def _failing_outputs(exc: PropertyFailure) -> set[str]:
    """The outputs a house-format failure names (``grad_x[rank 1]`` counted as ``grad_x``)."""
    heads = [ln.strip().split(" ", 1)[0].split("[", 1)[0].rstrip(":") for ln in str(exc).splitlines()[1:]]
    return {h for h in heads if h in OUTPUT_NAMES}


@pytest.mark.parametrize("entry", OUTPUT_KNOWN, ids=IDS)
def test_entry_names_a_registered_impl_and_its_outputs(entry):
    """An entry names a registered distributed impl and outputs the suite judges, and covers its own example."""
    assert entry.impls in {i.name for i in dist_impls()}, f"{entry.impls!r} is not in dist_impls(): remove the entry"
    assert set(entry.outputs) < set(OUTPUT_NAMES), (
        f"{entry.impls!r}: outputs {entry.outputs} (a whole-case divergence has outputs=('*',))"
    )
    assert entry.applies(_case(entry)), f"{entry.impls!r}: its example is not a case it covers"


def test_bf16_is_not_covered():
    """The fused variant's bf16 cases are judged under the impl's own model (bf16 rounds G anyway)."""
    (entry,) = [d for d in OUTPUT_KNOWN if d.impls == "megatron_fused_vocab_parallel"]
    assert not entry.applies(DistCase(problem=entry.example.replace(dtype="bfloat16"), world_size=2))


@pytest.mark.parametrize("entry", OUTPUT_KNOWN, ids=IDS)
def test_divergence_still_present(entry, monkeypatch):
    """On a release inside the entry's range its example fails the impl's own model in exactly the covered outputs
    (strict: a fixed release turns this red), and holds as the suite judges it."""
    impl = _impl(entry.impls)
    if not entry.releases.hold():
        pytest.skip(f"{entry.impls!r} holds for {entry.releases.describe()}: outside its range")
    case = _case(entry)
    assert dist_accuracy(impl, case)["error/bound"] <= 1.0
    monkeypatch.setattr(dist_known, "DIST_KNOWN", ())
    with pytest.raises(PropertyFailure) as info:
        dist_accuracy(impl, case)
    assert _failing_outputs(info.value) == {o for o in entry.outputs if o != "grad_bias" or entry.example.bias}


@pytest.mark.parametrize("entry", OUTPUT_KNOWN, ids=IDS)
def test_divergence_absent_outside_its_releases(entry):
    """On a known release outside the entry's range its example passes under the impl's own model."""
    impl = _impl(entry.impls)
    if entry.releases.version() is None or entry.releases.hold():
        pytest.skip(f"{entry.impls!r}: installed release inside the range or unknown ({entry.releases.describe()})")
    assert not dist_known.output_divergences(impl, _case(entry))
    dist_accuracy(impl, _case(entry))


@pytest.mark.parametrize(
    "mutant, output",
    [(FusedNoGradXAllReduce(), "grad_x"), (FusedLossScaled(), "loss")],
    ids=["no_grad_x_all_reduce", "loss_scaled"],
)
def test_covered_case_still_judges_every_output(mutant, output):
    """On the divergence's own fp32 example a further defect is caught: in a covered output (grad_x without its
    all-reduce) under the divergence's model, in the loss under the impl's own."""
    _impl(mutant.name)
    (entry,) = [d for d in OUTPUT_KNOWN if d.impls == mutant.name]
    if not entry.releases.hold():
        pytest.skip(f"{entry.impls!r} holds for {entry.releases.describe()}: outside its range")
    assert entry.example.dtype == "float32" and entry.example_world_size > 1
    with pytest.raises(PropertyFailure) as info:
        dist_accuracy(mutant, _case(entry))
    assert output in _failing_outputs(info.value)


@pytest.mark.parametrize("entry", WHOLE_CASE_KNOWN, ids=WHOLE_CASE_IDS)
def test_whole_case_entry_names_a_registered_impl_and_covers_its_example(entry):
    """An entry of every output names a registered distributed impl and covers its own example, which the suite
    therefore leaves out of its draws (the reason it rejects the draw with is this entry's)."""
    assert entry.impls in {i.name for i in dist_impls()}, f"{entry.impls!r} is not in dist_impls(): remove the entry"
    assert entry.applies(_case(entry)), f"{entry.impls!r}: its example is not a case it covers"
    impl = next(i for i in dist_impls() if i.name == entry.impls)
    if entry.releases is None or entry.releases.hold():
        assert known_divergence(impl, _case(entry)) == entry.reason


@pytest.mark.parametrize("entry", WHOLE_CASE_KNOWN, ids=WHOLE_CASE_IDS)
def test_whole_case_divergence_still_present(entry):
    """An entry of every output: its example still fails the impl's own model in the loss, on a release inside the
    entry's range (strict: a fixed release turns this red, and the entry goes)."""
    impl = _impl(entry.impls)
    if entry.releases is not None and not entry.releases.hold():
        pytest.skip(f"{entry.impls!r} holds for {entry.releases.describe()}: outside its range")
    with pytest.raises(PropertyFailure) as info:
        dist_accuracy(impl, _case(entry))
    assert "loss" in _failing_outputs(info.value)
