"""A compiled twin (Liger's chunked losses with ``compiled=True``) runs compiled or raises, never silently eager
(:mod:`numcheck.impls.adapters.compiled_run`): on a tiny compiled function driven past dynamo's default recompile
limit, and on Liger's own twins on the CPU with torch.compile given the ``eager`` backend (dynamo traces, guards,
caches and gives up exactly as with inductor; no C++ compile).
"""

from __future__ import annotations

import functools

import pytest
import torch
from torch._dynamo.utils import counters

from numcheck.impls.adapters import compiled_run, liger_distill, liger_preference
from numcheck.properties.linear_preference.cases import PreferenceCase, build
from numcheck.properties.linear_preference.props import run

pytestmark = pytest.mark.torch_versions(
    reason="dynamo's settings are named differently across torch releases (cache_size_limit up to 2.6, "
    "recompile_limit after): each release's are found and used"
)

#: Functions of distinct code objects: each one the tiny compiled function closes over is a new variant for dynamo,
#: as each β is for Liger's compiled chunk function.
SCALES = [eval(f"lambda y: y * {k} + 1") for k in range(10)]  # noqa: S307 - ten distinct code objects


class Owner:
    """What the tiny compiled function calls inside its compiled region (Liger's ``preference_loss_fn``)."""

    @staticmethod
    def step(y):
        return y.sin()


def tiny(k: int) -> torch.Tensor:
    """One call that compiles its function anew, as Liger's forward does: variant ``k``."""
    scale = SCALES[k]

    def chunk(y):
        return Owner.step(scale(y))

    return torch.compile(chunk, backend="eager")(torch.ones(3))


@pytest.fixture
def dynamo():
    """A fresh dynamo at the default recompile limit (8), reset after; the name the loaded torch has."""
    torch._dynamo.reset()
    with torch._dynamo.config.patch({compiled_run._name("limit"): 8}):
        yield
    torch._dynamo.reset()


def _graphs() -> int:
    return int(counters["stats"]["unique_graphs"])


def test_tiny_function_past_the_default_limit_runs_eager_silently_unless_guarded(dynamo):
    """Dynamo alone: the 9th variant runs eagerly, no error (the witness sees it). Through compiled_call: all 10
    compile."""
    eager_runs = []
    for k in range(10):
        with compiled_run.watching(Owner, "step") as eager:
            tiny(k)
        eager_runs.append(eager[0])
    assert eager_runs == [0] * 8 + [1, 1], eager_runs  # silently eager past the limit
    torch._dynamo.reset()
    before = _graphs()
    for k in range(10):
        compiled_run.compiled_call("tiny_compiled", "tiny", Owner, "step", functools.partial(tiny, k))
    assert _graphs() - before == 10
    assert Owner.__dict__["step"].__func__.__name__ == "step"  # restored


def test_tiny_function_at_the_raised_limit_raises_naming_it(dynamo, monkeypatch):
    monkeypatch.setattr(compiled_run, "RECOMPILE_LIMIT", 2)
    with torch._dynamo.config.patch({compiled_run._name("limit"): 2}):
        for k in range(2):
            compiled_run.compiled_call("tiny_compiled", "tiny", Owner, "step", functools.partial(tiny, k))
        with pytest.raises(RuntimeError) as err:
            compiled_run.compiled_call("tiny_compiled", "tiny", Owner, "step", functools.partial(tiny, 2))
    text = str(err.value)
    assert text.startswith("tiny_compiled: torch.compile reached torch._dynamo.config.") and "_limit=2 " in text
    assert "RECOMPILE_LIMIT" in text and "\n" not in text
    assert compiled_run.STATS["tiny_compiled"]["refused"] >= 1


def test_tiny_function_run_eagerly_otherwise_raises(dynamo):
    with torch._dynamo.config.patch(disable=True), pytest.raises(RuntimeError, match="tiny_compiled: 1 chunk"):
        compiled_run.compiled_call("tiny_compiled", "tiny", Owner, "step", functools.partial(tiny, 0))


def _cpu_eager_backend(monkeypatch) -> None:
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))


def _twin(name: str):
    impl = {i.name: i for i in liger_preference.liger_preference_impls()}[name]
    if impl.support.unavailable_reason() and "judged on CUDA" not in impl.support.unavailable_reason():
        pytest.skip(impl.support.unavailable_reason())
    return impl


def _call(impl, **fields) -> None:
    case = PreferenceCase(P=2, T=3, H=8, V=12, beta=0.5, average_log_prob=True, **fields)
    run(impl.fn, case, build(case, impl.support.conventions))


def test_liger_dpo_twin_compiles_past_the_limit_or_raises(dynamo, monkeypatch):
    """Liger's DPO twin, at a recompile limit of 1 (standing for the default 8 a suite's draws reach): before
    compiled_run the second variant ran eagerly without a word; now it compiles, and at the adapter's own limit it
    raises naming the impl."""
    _cpu_eager_backend(monkeypatch)
    impl = _twin("liger_preference[dpo_compiled]")
    with torch._dynamo.config.patch({compiled_run._name("limit"): 1}):
        before = _graphs()
        _call(impl, bias=True)
        _call(impl, bias=False)  # a new variant: past the limit of 1
        assert _graphs() - before >= 2  # the second variant compiled too (a chunk offset may add one)
        monkeypatch.setattr(compiled_run, "RECOMPILE_LIMIT", 1)
        with pytest.raises(RuntimeError, match=r"^liger_preference\[dpo_compiled\]: torch.compile reached .*_limit=1 "):
            _call(impl, bias=False, dtype="bfloat16")


@pytest.mark.parametrize("name", ["liger_preference[kto_compiled]", liger_distill.CHUNKED_COMPILED])
def test_liger_twins_run_eagerly_raise(dynamo, monkeypatch, name):
    """Every twin's call is watched: with torch.compile disabled it raises instead of being judged eager."""
    _cpu_eager_backend(monkeypatch)
    if name == liger_distill.CHUNKED_COMPILED:
        impl = {i.name: i for i in liger_distill.liger_distill_impls()}[name]
        if "judged on CUDA" not in (impl.support.unavailable_reason() or "judged on CUDA"):
            pytest.skip(impl.support.unavailable_reason())
        t = [torch.randn(6, 4), torch.randn(10, 4), torch.randn(6, 4), torch.randn(10, 4), torch.arange(6)]
        t[0].requires_grad_(), t[1].requires_grad_()
        call = functools.partial(impl.fn, *t, beta=0.5, temperature=1.0, ignore_index=-100)
    else:
        call = functools.partial(_call, _twin(name), bias=False)
    with torch._dynamo.config.patch(disable=True), pytest.raises(RuntimeError, match="ran eagerly") as err:
        call()
    assert str(err.value).startswith(f"{name}: ")
