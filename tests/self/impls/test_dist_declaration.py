"""Declaring a distributed impl as a user does: ``numcheck.dist_linear_ce_impl`` and ``numcheck.tp_fp8_linear_impl``
check the declaration where it is written, the registry loads the result through ``--impl``, and the distributed
suite runs the user's impl (and only it) under that ``--impl``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import numcheck
import numcheck.tests
from numcheck.impls.registry import BrokenImpl, ImplEntry, discover

HERE = __file__  # as imported: InvalidDeclaration names the declaring frame's file
SPEC = "numcheck.tests.self.helpers.dist_declared"


def _rank(
    x,
    weight_shard,
    target,
    bias_shard=None,
    *,
    group,
    vocab_start,
    vocab_size,
    reduction="mean",
    ignore_index=-100,
    label_smoothing=0.0,
):
    return None


def test_declaration_splits_rank_numerics_from_distribution():
    """The distributed keywords land in ``dist``, one rank's numerics in ``support``; options come from the
    signature when not given."""
    impl = numcheck.dist_linear_ce_impl(
        name="d", world_sizes=[2, 4], backends=("gloo",), smoothing="megatron", dtypes=("float32",), autocast=()
    )(_rank)
    assert impl.kind == "dist-linear-ce" and impl.dist.world_sizes == (2, 4) and impl.dist.smoothing == "megatron"
    assert sorted(impl.support.options) == ["bias", "ignore_index", "label_smoothing"]


@pytest.mark.parametrize(
    "keywords, says",
    [
        (dict(world_size=(2,)), "unknown keyword argument 'world_size'"),
        (dict(backends=("mpi",)), "backends=('mpi',)"),
        (dict(backends="gloo"), "is one string"),
        (dict(world_sizes=(0, 2)), "positive ints"),
        (dict(smoothing="nemo"), "is not 'torch' or 'megatron'"),
        (dict(deterministic="yes"), "must be True or False"),
    ],
)
def test_bad_declaration_names_this_line(keywords, says):
    """A bad distributed keyword or value raises InvalidDeclaration naming the declaring file:line and the fix."""
    with pytest.raises(numcheck.InvalidDeclaration) as info:
        numcheck.dist_linear_ce_impl(name="bad", **keywords)
    assert str(info.value).startswith(f"{HERE}:") and says in str(info.value)


def test_function_without_rank_keywords_is_refused():
    """A function that cannot take the ranks' ``group``/``vocab_start``/``vocab_size`` is refused at the decorator,
    saying which keywords to add; so is an option its signature cannot take."""

    def no_group(x, weight_shard, target, bias_shard=None, *, reduction="mean", ignore_index=-100):
        return None

    with pytest.raises(numcheck.InvalidDeclaration, match="takes no keyword group, vocab_start, vocab_size"):
        numcheck.dist_linear_ce_impl(name="g")(no_group)
    with pytest.raises(numcheck.InvalidDeclaration, match="softcap"):
        numcheck.dist_linear_ce_impl(name="o", options=("bias", "ignore_index", "softcap"))(_rank)


def test_tp_declaration_is_checked():
    """``tp_fp8_linear_impl`` refuses an unknown parallel mode and a function lacking a keyword every call passes."""

    def tp(
        x, weight, bias=None, *, recipe, parallel, sequence_parallel, save_original_input, group, scaling_state=None
    ):
        return None

    with pytest.raises(numcheck.InvalidDeclaration, match="parallel"):
        numcheck.tp_fp8_linear_impl(name="t", parallel=("diagonal",))
    with pytest.raises(numcheck.InvalidDeclaration, match="scale_log"):
        numcheck.tp_fp8_linear_impl(name="t")(tp)


def test_loaded_through_impl_and_picklable_only_at_module_level(monkeypatch):
    """``--impl module:attr`` loads declared distributed impls of both kinds; one that is not bound at module level
    (so the ranks cannot unpickle it) is a broken entry saying so."""
    entries = discover([f"{SPEC}:declared_vocab_parallel", f"{SPEC}:declared_tp_fp8"])
    assert [(e.name, e.kind) for e in entries if isinstance(e, ImplEntry)] == [
        ("declared_vocab_parallel", "dist-linear-ce"),
        ("declared_tp_fp8", "tp-fp8-linear"),
    ]
    from numcheck.tests.self.helpers import dist_declared

    local = numcheck.dist_linear_ce_impl(name="local", options=("bias", "ignore_index"))(
        lambda x, w, t, b=None, *, group, vocab_start, vocab_size, reduction="mean", ignore_index=-100: None
    )
    monkeypatch.setattr(dist_declared, "LOCAL_FACTORY", lambda: [local], raising=False)
    (bad,) = discover([f"{SPEC}:LOCAL_FACTORY"])
    assert isinstance(bad, BrokenImpl) and "does not pickle" in bad.error and "module level" in bad.error


@pytest.mark.costly(reason="the distributed suite in a pytest subprocess (gloo process groups per world size)")
def test_suite_runs_the_declared_impl_only():
    """``--impl`` naming two declared vocabulary-parallel impls runs the distributed accuracy test on them alone (no
    built-in): the correct one passes, the one whose ranks raise fails with its own message. (A rank's error is
    not latched, since every rank answered: it propagates, and hypothesis shrinks it as any failure; the mutant tests
    show numeric bugs caught.)"""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "NUMCHECK_", "HYPOTHESIS"))}
    env.update(NUMCHECK_CI_EXAMPLES="2", NUMCHECK_DIST_PRELOAD="numcheck.properties.distributed.linear_ce.props")
    root = str(Path(numcheck.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([root, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-rA",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:xdist",
            str(Path(numcheck.tests.__file__).parent / "suite" / "test_distributed.py"),
            "-k",
            "test_dist_accuracy",
            "--impl",
            f"{SPEC}:declared_vocab_parallel",
            "--impl",
            f"{SPEC}:declared_raises",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    out = r.stdout + r.stderr
    results = sorted(
        line.split(" ")[0] + " " + line.split(" ")[1].split("::")[-1].split(" ")[0]
        for line in out.splitlines()
        if line.startswith(("PASSED ", "FAILED "))
    )
    assert results == [
        "FAILED test_dist_accuracy[declared_raises-2]",
        "PASSED test_dist_accuracy[declared_vocab_parallel-2]",
    ], out[-3000:]
    from numcheck.tests.self.helpers.dist_declared import RAISED

    assert RAISED in out and "declared_raises" in out


def test_the_vocabulary_parallel_impls_share_one_rank_call():
    """The built-in and the Megatron-core and TransformerEngine adapters differ only in how x reaches the shard's
    matmul and in the loss from the logits shard: one ``rank_call`` body (the protocol's ``VocabShardImpl``), and
    an option TE's loss does not take is refused as a keyword it has no parameter for."""
    from numcheck.impls.adapters.megatron import MegatronVocabParallel
    from numcheck.impls.adapters.transformer_engine import TEVocabParallel
    from numcheck.impls.builtin.vocab_parallel import VocabParallelCE

    classes = (VocabParallelCE, MegatronVocabParallel, TEVocabParallel)
    assert len({cls.rank_call for cls in classes}) == 1, [cls.rank_call.__qualname__ for cls in classes]
    te = TEVocabParallel("te_probe", reduce_loss=True, info="not installed here")
    with pytest.raises(TypeError, match="unexpected keyword argument 'softcap'"):
        te.rank_call(None, None, None, group=None, vocab_start=0, vocab_size=4, softcap=30.0)
