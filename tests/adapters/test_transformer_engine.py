"""TransformerEngine's fused cross-entropy (``numcheck.impls.adapters.transformer_engine``): how it is loaded (by
import where TE is complete, else from the wheel's files without TE's package ``__init__``, else unavailable with
the reason), the per-release declarations, the check of whether TE writes into the logits it is given (failing
either way), both faces against the float64 oracle on hand-picked cases, and TE's release-keyed distributed known
divergences (strict: still there inside their range, gone outside).

Needs a ``transformer-engine`` wheel's files where numcheck looks (``.ci/setup`` puts 2.20.2 in
``<venv>/numcheck-te``; ``NUMCHECK_TE_DIR`` elsewhere); the tests that run TE's kernels skip with the reason
otherwise, the ones about loading and declarations do not. Cost: about 40 TE calls on small problems under the
Triton interpreter and three ``numcheck list`` subprocesses, about a minute on 2 busy cores.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import importlib.util
import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import numcheck.impls.adapters.transformer_engine as te
from numcheck.errors import PropertyFailure
from numcheck.impls.registry import builtin as _impl
from numcheck.impls.registry import dist_impls
from numcheck.properties.core.failures import fail, impl_raised, raised_by_suite
from numcheck.properties.distributed.linear_ce.cases import DistCase
from numcheck.properties.distributed.linear_ce.known import DIST_KNOWN
from numcheck.properties.distributed.linear_ce.props import dist_accuracy
from numcheck.properties.distributed.linear_ce.suite import known_divergence
from numcheck.properties.distributed.pool.pool import RankFailure, default_backend, world_size_unavailable
from numcheck.properties.linear_ce.accuracy import check_accuracy
from numcheck.properties.linear_ce.cases import Problem
from numcheck.properties.linear_ce.known import known
from numcheck.properties.linear_ce.strategies import why_not_run

pytestmark = pytest.mark.torch_versions(
    reason="TE's fused CE loaded and run under this torch's Triton interpreter (3.2 with torch 2.6); the suite on TE runs on the newest torch only"
)

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())
INFO = te.load()
needs_te = pytest.mark.skipif(isinstance(INFO, str), reason=f"TransformerEngine unavailable here: {INFO}")
DEVICE = "cpu" if te.interpreter.active() or not torch.cuda.is_available() else "cuda"


def _dist_case(p: Problem, world_size: int, placement: str = "as_built") -> DistCase:
    """``p`` at ``world_size`` on this run's backend (gloo on the CPU, nccl on CUDA); skips where it cannot run."""
    backend = default_backend()
    why = world_size_unavailable(world_size, backend)
    if why:
        pytest.skip(why)
    return DistCase(problem=p, world_size=world_size, backend=backend, placement=placement)


def _run(impl, p: Problem) -> None:
    """The suite's accuracy judgement of ``impl`` on ``p`` (an impl's exception reported as the suite does); a case a
    recorded divergence of the loaded release covers is skipped, naming it, as the suite leaves it out."""
    why = why_not_run(impl, p)
    if why:
        pytest.skip(f"{why}; {impl.description}")
    entry = known(impl.name, "accuracy", p)
    if entry is not None:
        pytest.skip(
            f"known divergence of {entry.releases.describe() if entry.releases else 'every release'}: "
            f"{entry.reason[:200]}"
        )
    try:
        res = check_accuracy(impl, p)
    except Exception as exc:
        if raised_by_suite(exc):
            raise
        raise impl_raised(impl, "accuracy", p, exc) from exc
    if not res.ok:
        fail(impl, "accuracy", p, *res.failure_lines())


# -------------------------------------------------------------------------------------------------- loading


def _files_folder() -> Path:
    """The folder holding the loaded release's ``transformer_engine/`` and its ``.dist-info``."""
    assert not isinstance(INFO, str)
    return Path(INFO.source.folder)


def _copy_release(dest: Path, *, dist_info: bool = True, package: bool = False) -> Path:
    """The loaded release's fused CE files (and ``.dist-info``) copied under ``dest``; with ``package`` the whole
    ``transformer_engine`` folder instead (TE's own ``__init__`` files, which refuse to import without the core)."""
    src = _files_folder()
    if package:
        shutil.copytree(src / "transformer_engine", dest / "transformer_engine")
    else:
        for rel in te.FILES.values():
            if (src / rel).is_file():
                (dest / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(src / rel, dest / rel)
    if dist_info:
        for d in src.glob("transformer_engine-*.dist-info"):
            shutil.copytree(d, dest / d.name)
    return dest


def _list(env_extra: dict[str, str], *impls: str, pythonpath: str = "") -> str:
    """``numcheck list --impl ...`` in a fresh process with this checkout (and ``pythonpath``) on the path."""
    env = {k: v for k, v in os.environ.items() if k != te.ENV_DIR}
    env.update(env_extra, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), pythonpath) if p))
    args = [a for name in impls for a in ("--impl", name)]
    proc = subprocess.run(
        [sys.executable, "-m", "numcheck.reports.cli", "list", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return proc.stdout + proc.stderr


def _one_call(info: te.TEInfo) -> float:
    """The loss of one small fp32 call of ``info``'s Function (mean)."""
    g = torch.Generator().manual_seed(0)
    z = torch.randn(5, 11, generator=g)
    y = torch.randint(0, 11, (5,), generator=g)
    return float(
        te.te_cross_entropy(
            info, te.writes_logits(info, False), z, y, reduce_loss=True, ignore_index=-100, label_smoothing=0.0
        )
    )


@needs_te
def test_files_are_loaded_without_entering_the_import_path():
    """Loading from files leaves ``transformer_engine`` out of ``sys.modules`` and off the import path (an importable
    TE without its core breaks liger-kernel's import), and the loaded kernels are TE's own files."""
    if INFO.source.how != "files":
        pytest.skip(f"TE loaded by {INFO.source.describe()}")
    assert _one_call(INFO) > 0
    assert not [m for m in sys.modules if m == "transformer_engine" or m.startswith("transformer_engine.")]
    if INFO.source.note is None:  # no importable TE of the environment's own
        assert importlib.util.find_spec("transformer_engine") is None
    assert (
        Path(INFO.function.forward.__code__.co_filename).resolve()
        == (Path(INFO.source.folder) / te.FILES["api"]).resolve()
    )


@needs_te
def test_relative_imports_resolve_to_the_private_modules(tmp_path):
    """A release whose files import each other relatively loads the same way and computes the same loss."""
    if INFO.source.how != "files":
        pytest.skip(f"TE loaded by {INFO.source.describe()}")
    dest = _copy_release(tmp_path)
    api = dest / te.FILES["api"]
    text = api.read_text()
    assert "import transformer_engine.pytorch.triton.cross_entropy as triton_cross_entropy" in text
    api.write_text(
        text.replace(
            "import transformer_engine.pytorch.triton.cross_entropy as triton_cross_entropy",
            "from .triton import cross_entropy as triton_cross_entropy",
        )
    )
    tri = dest / te.FILES["triton"]
    if (dest / te.FILES["common"]).is_file():
        tri.write_text(
            tri.read_text().replace(
                "from transformer_engine.common.triton.cross_entropy import",
                "from ...common.triton.cross_entropy import",
            )
        )
    info = te.load_from(te.Source("files", str(dest)))
    assert not isinstance(info, str), info
    assert _one_call(info) == _one_call(INFO)


@needs_te
def test_another_te_module_is_refused_with_the_reason(tmp_path):
    """A fused CE file importing any other TE module (which needs TE's package) makes the impls unavailable, naming
    the module."""
    if INFO.source.how != "files":
        pytest.skip(f"TE loaded by {INFO.source.describe()}")
    dest = _copy_release(tmp_path)
    tri = dest / te.FILES["triton"]
    tri.write_text("import transformer_engine.pytorch.utils\n" + tri.read_text())
    why = te.load_from(te.Source("files", str(dest)))
    assert isinstance(why, str) and "imports transformer_engine.pytorch.utils" in why, why


@needs_te
def test_files_without_their_release_are_not_used(tmp_path):
    """Files with no ``.dist-info`` naming their release are unavailable: the declaration depends on the release."""
    if INFO.source.how != "files":
        pytest.skip(f"TE loaded by {INFO.source.describe()}")
    why = te.load_from(te.Source("files", str(_copy_release(tmp_path, dist_info=False))))
    assert isinstance(why, str) and "release" in why and "is unknown" in why, why


def test_missing_folder_is_unavailable_with_the_reason(tmp_path, monkeypatch):
    """``NUMCHECK_TE_DIR`` naming a folder without TE: every TE impl unavailable, the folder named; the rest load."""
    monkeypatch.setenv(te.ENV_DIR, str(tmp_path / "nothing"))
    why = te.load()
    assert isinstance(why, str) and str(tmp_path / "nothing") in why, why
    for impl in [*te.te_impls(), *te.te_dist_impls()]:
        assert impl.support.unavailable_reason() == why
        assert why in impl.description


def test_ci_installs_the_release_the_adapter_names():
    """``.ci/setup``'s TE_VERSION is the adapter's CI_RELEASE (what the install hint and the README name)."""
    setup = (ROOT / ".ci" / "setup").read_text()
    assert f'te_version="${{TE_VERSION:-{te.CI_RELEASE}}}"' in setup


@needs_te
def test_list_shows_release_and_loading_path():
    """``numcheck list`` names the release, how it was loaded and where TE writes into the logits."""
    folder = INFO.source.folder
    out = _list({te.ENV_DIR: folder}, *te.VARIANTS, *te.DIST_VARIANTS)
    for name in [*te.VARIANTS, *te.DIST_VARIANTS]:
        assert f"{name}  [" in out, out
    assert f"TransformerEngine {INFO.version} CrossEntropyFunction" in out
    assert f"loaded: files in {folder}, without running TE's package __init__" in out
    assert te.WRITES[te.writes_logits(INFO, False)] in out


@needs_te
def test_complete_te_is_imported(tmp_path):
    """Where ``import transformer_engine.pytorch`` works the Function comes from there (here a package made of the
    release's own fused CE files with empty package ``__init__`` files, standing in for TE's core-backed ones)."""
    dest = _copy_release(tmp_path)
    for pkg in (
        "transformer_engine",
        "transformer_engine/pytorch",
        "transformer_engine/pytorch/triton",
        "transformer_engine/common",
        "transformer_engine/common/triton",
    ):
        (dest / pkg).mkdir(parents=True, exist_ok=True)
        (dest / pkg / "__init__.py").write_text("")
    (dest / "transformer_engine/pytorch/jit.py").write_text(
        "import torch\n\n\ndef no_torch_dynamo(recursive=True, when=None):\n"
        "    return lambda f: torch._dynamo.disable(f, recursive=recursive)\n"
    )
    out = _list({}, "te_parallel_ce[mean]", pythonpath=str(dest))
    assert f"TransformerEngine {INFO.version} CrossEntropyFunction" in out, out
    assert f"loaded: import transformer_engine.pytorch (TE fully installed, at {dest})" in out, out


@needs_te
def test_incomplete_te_on_the_path_is_read_from_its_files(tmp_path):
    """An importable ``transformer_engine`` whose import fails (the wheel without TE's core) is loaded from its files,
    and ``numcheck list`` says why the import was not used."""
    dest = _copy_release(tmp_path, package=True)
    out = _list({}, "te_parallel_ce[mean]", pythonpath=str(dest))
    assert (
        f"loaded: files in {dest}, without running TE's package __init__; import transformer_engine.pytorch "
        f"failed" in out
    ), out
    assert "here: runs" in out, out


# --------------------------------------------------------------------------------------------- declarations


def _fake(version: str, params: tuple[str, ...], function=None) -> te.TEInfo:
    defaults = {
        "label_smoothing": 0.0,
        "reduce_loss": False,
        "dist_process_group": None,
        "ignore_idx": -100,
        "is_cg_capturable": False,
        "overwrite_input": False,
    }
    return te.TEInfo(
        version=version,
        source=te.Source("files", "/nowhere"),
        params=params,
        defaults={k: v for k, v in defaults.items() if k in params},
        function=function,
    )


#: ``CrossEntropyFunction.forward``'s parameters (after ctx) as the releases have them.
SIGNATURES = {
    "2.2.0": ("_input", "target", "label_smoothing", "reduce_loss", "dist_process_group"),
    "2.4.0": ("_input", "target", "label_smoothing", "reduce_loss", "dist_process_group", "ignore_idx"),
    "2.8.0": (
        "_input",
        "target",
        "label_smoothing",
        "reduce_loss",
        "dist_process_group",
        "ignore_idx",
        "is_cg_capturable",
    ),
    "2.17.1": (
        "inp",
        "target",
        "label_smoothing",
        "reduce_loss",
        "dist_process_group",
        "ignore_idx",
        "is_cg_capturable",
    ),
    "2.18.0": (
        "inp",
        "target",
        "label_smoothing",
        "reduce_loss",
        "dist_process_group",
        "ignore_idx",
        "is_cg_capturable",
    ),
    "2.20.2": (
        "inp",
        "target",
        "label_smoothing",
        "reduce_loss",
        "dist_process_group",
        "ignore_idx",
        "overwrite_input",
    ),
}


@pytest.mark.parametrize(
    "version, overwrite, writes",
    [
        ("2.2.0", False, "forward"),
        ("2.8.0", False, "forward"),
        ("2.17.1", False, "forward"),
        ("2.18.0", False, None),
        ("2.20.2", False, None),
        ("2.20.2", True, "backward"),
    ],
)
def test_where_each_release_writes_into_the_logits(version, overwrite, writes):
    """Up to 2.17 the gradient is stored in the logits in forward; 2.18 keeps it apart; from 2.19 only
    ``overwrite_input=True`` writes it into them, in backward."""
    assert te.writes_logits(_fake(version, SIGNATURES[version]), overwrite) == writes


def test_declarations_follow_the_signature():
    """``ignore_index`` and the all-ignored convention only where ``ignore_idx`` exists; the overwrite variants only
    where ``overwrite_input`` exists, each absence named."""
    old = te.declare(_fake("2.2.0", SIGNATURES["2.2.0"]), True)
    assert "ignore_index" not in old.support.options and old.support.all_ignored is None
    assert any(
        n.startswith("ignore_index: TE 2.2.0's CrossEntropyFunction.forward has no ignore_idx") for n in old.notes
    )
    new = te.declare(_fake("2.8.0", SIGNATURES["2.8.0"]), True)
    assert {"ignore_index", "label_smoothing", "bias"} <= new.support.options and new.support.all_ignored == "zero"
    assert new.support.reductions == {"mean"} and te.declare(
        _fake("2.8.0", SIGNATURES["2.8.0"]), False
    ).support.reductions == {"none"}
    no_ow = te.declare(_fake("2.18.0", SIGNATURES["2.18.0"]), True, overwrite_input=True)
    assert "has no overwrite_input" in (no_ow.support.unavailable_reason() or "")
    assert "writes the gradient into the logits in forward anyway" in (
        te.declare(_fake("2.8.0", SIGNATURES["2.8.0"]), True, overwrite_input=True).support.unavailable_reason()
    )


@pytest.mark.parametrize(
    "version, reduce_loss",
    [("2.8.0", False), ("2.17.1", False), ("2.8.0", True), ("2.4.0", False), ("2.18.0", False), ("2.20.2", False)],
)
def test_interpreter_artifact_is_declared_only_where_it_applies(version, reduce_loss):
    """bf16 leaves the ``none`` impls of 2.5–2.17 under an interpreter that mangles bf16-plus-constant (the probe
    says so), with that reason, and nothing else: ``mean`` and the releases outside the range keep bf16."""
    info = _fake(version, SIGNATURES[version])
    limits = te.interpreter_limits(info, reduce_loss)
    probe = te.interpreter_bf16_constant()
    affected = not reduce_loss and te.Version("2.5.0") <= info.release < te.Version("2.18.0")
    if affected and probe not in (None, 1.75):
        assert set(limits) == {"bfloat16"}
        assert "interpreter artifact, not a TE defect" in limits["bfloat16"]
        decl = te.declare(info, reduce_loss)
        if DEVICE == "cpu":
            assert torch.bfloat16 not in decl.support.dtypes
            assert any(n.startswith("bfloat16: interpreter artifact") for n in decl.notes)
    else:
        assert limits == {}


# ------------------------------------------------------------------------------------ the logits write check


class _WritesInForward(torch.autograd.Function):
    """A TE ≤ 2.17-shaped Function on fp32 logits: forward stores the gradient of the mean loss into its input,
    saves that buffer and returns it, scaled by the upstream gradient, from backward."""

    @staticmethod
    def forward(
        ctx,
        inp,
        target,
        label_smoothing=0.0,
        reduce_loss=False,
        dist_process_group=None,
        ignore_idx=-100,
        is_cg_capturable=False,
    ):
        z = inp.detach().view(-1, inp.shape[-1])
        y = target.reshape(-1)
        valid = y != ignore_idx
        n = max(int(valid.sum()), 1)
        lse = z.logsumexp(-1)
        zy = z.gather(1, torch.where(valid, y, 0)[:, None])[:, 0]
        loss = torch.where(valid, lse - zy, torch.zeros_like(lse)).sum() / n
        g = torch.softmax(z, -1)
        g[torch.arange(len(y)), torch.where(valid, y, 0)] -= 1
        z.copy_(torch.where(valid[:, None], g / n, torch.zeros_like(g)))  # the write into the logits
        ctx.save_for_backward(inp.detach())
        return loss

    @staticmethod
    def backward(ctx, grad):
        (buf,) = ctx.saved_tensors
        buf.mul_(grad)
        return buf, None, None, None, None, None, None


@pytest.mark.parametrize("version, ok", [("2.17.1", True), ("2.18.0", False)])
def test_undeclared_forward_write_fails(version, ok):
    """A Function writing into the logits in forward passes where the release declares it (≤ 2.17) and fails the
    suite's judgement with :class:`LogitsWriteMismatch` where it does not (2.18)."""
    info = _fake(version, SIGNATURES[version], _WritesInForward)
    impl = te.build_impl("te_parallel_ce[mean]", True, False, info)
    impl = dataclasses.replace(
        impl, support=dataclasses.replace(impl.support, requires=None, devices=frozenset({"cpu", "cuda"}))
    )
    p = Problem(N=6, H=8, V=13, ignored=0.3, seed=3, device=DEVICE)
    if ok:
        _run(impl, p)
        return
    with pytest.raises(
        PropertyFailure,
        match="changed .* elements of the logits it was given during forward, but its "
        "declaration says it leaves the logits it is given as they are",
    ):
        _run(impl, p)


@needs_te
def test_declared_write_that_does_not_happen_fails(monkeypatch):
    """Declaring a write TE does not make (the installed release's default call, with a forward write declared)
    fails: the gradient TE returns is not the logits' storage."""
    if te.writes_logits(INFO, False) is not None:
        pytest.skip(f"TE {INFO.version} writes into the logits by default")
    monkeypatch.setattr(te, "writes_logits", lambda info, overwrite_input: "forward")
    impl = te.build_impl("te_parallel_ce[mean]", True, False)
    with pytest.raises(PropertyFailure, match="returned the gradient of the logits in a buffer of its own"):
        _run(impl, Problem(N=6, H=8, V=13, seed=4, device=DEVICE))


@needs_te
def test_undeclared_backward_write_fails(monkeypatch):
    """``overwrite_input=True`` declared as leaving the logits alone fails: TE returns their own storage."""
    if not INFO.has("overwrite_input"):
        pytest.skip(f"TE {INFO.version} has no overwrite_input")
    monkeypatch.setattr(te, "writes_logits", lambda info, overwrite_input: None)
    impl = te.build_impl("te_parallel_ce[mean,overwrite_input]", True, True)
    with pytest.raises(PropertyFailure, match="returned the gradient of the logits in the logits' own storage"):
        _run(impl, Problem(N=6, H=8, V=13, seed=5, device=DEVICE))


# ---------------------------------------------------------------------------------------- against the oracle

CASES = [
    Problem(N=9, H=16, V=37, seed=1),
    Problem(N=9, H=16, V=37, bias=True, ignored=0.3, ignore_index=-1, seed=2),
    Problem(N=9, H=16, V=37, label_smoothing=0.1, ignored=0.2, seed=3),
    Problem(N=9, H=16, V=37, ignored=1.0, seed=4),
    Problem(N=9, H=16, V=37, regime="confident", seed=5),
    Problem(N=24, H=32, V=67, dtype="bfloat16", bias=True, label_smoothing=0.05, seed=6),
]


def _oracle_params():
    for name, (reduce_loss, _) in te.VARIANTS.items():
        for p in CASES:
            q = p if reduce_loss else p.replace(reduction="none", upstream="per_row")
            yield pytest.param(name, q.replace(device=DEVICE), id=f"{name}-{q.short()}")


@needs_te
@pytest.mark.parametrize("name, p", list(_oracle_params()))
def test_matches_oracle(name, p):
    """Each linear+CE variant is within the tolerance model of the float64 oracle on every declared case."""
    _run(_impl(name), p)


@needs_te
@pytest.mark.parametrize("name", list(te.DIST_VARIANTS))
def test_distributed_face_matches_oracle(name):
    """Each distributed variant at P = 2 (gloo) on a case with every option it declares and targets on shard edges."""
    impl = next(i for i in dist_impls() if i.name == name)
    if impl.support.unavailable_reason():
        pytest.skip(impl.support.unavailable_reason())
    p = Problem(N=7, H=8, V=16, bias=True, seed=3)
    p = p if impl.reduce_loss else p.replace(reduction="none", upstream="per_row")
    p = p.replace(label_smoothing=0.1, **({"ignored": 0.3} if "ignore_index" in impl.support.options else {}))
    case = _dist_case(p, 2, "boundary")
    why = known_divergence(impl, case)
    if why:
        pytest.skip(f"a recorded divergence of TE {INFO.version} covers the case: {why[:200]}")
    assert dist_accuracy(impl, case)["error/bound"] <= 1.0


@needs_te
def test_distributed_impl_pickles_to_its_source():
    """A rank receives the impl pickled and loads the fused CE from the same place."""
    impl = next(i for i in dist_impls() if i.name == "te_vocab_parallel[mean]")
    back = pickle.loads(pickle.dumps(impl))
    assert back.source == impl.source and back.support.unavailable_reason() is None


@needs_te
def test_uneven_shards_are_refused():
    """TE assumes equal, rank-ordered shards (declared ``uneven_vocab=False``): given others anyway, the adapter
    refuses them by name instead of computing with the wrong vocabulary offsets."""
    impl = next(i for i in dist_impls() if i.name == "te_vocab_parallel[mean]")
    if impl.support.unavailable_reason():
        pytest.skip(impl.support.unavailable_reason())
    with pytest.raises(
        RankFailure,
        match="TE needs equal, rank-ordered vocabulary shards; rank 0 of 2 got classes "
        r"0\.\.2 of 5",
    ):
        dist_accuracy(impl, _dist_case(Problem(N=3, H=4, V=5, seed=1), 2))


@needs_te
def test_report_judges_both_faces(tmp_path):
    """``numcheck report`` (the smoke grid) runs every available TE impl, both faces, and every case passes; an
    impl none of whose cases ran because each it could run is a recorded known divergence on the installed release
    (2.4-2.6, whose backward raises when ignore_idx is passed; reduce_loss=False before 2.5, whose gradient is divided by the rows) has
    them listed as not run for that reason instead."""
    from numcheck.reports import cli

    names = [n for n in [*te.VARIANTS, *te.DIST_VARIANTS] if not _impl_or_dist(n).support.unavailable_reason()]
    out = tmp_path / "report"
    args = ["report", "--grid", "smoke", "--no-progress", "--no-plots", "--out", str(out)]
    assert cli.main([*args, *(a for n in names for a in ("--impl", n))]) == 0
    report = json.loads((out / "report.json").read_text())
    judged = {c["impl"] for c in report["cases"]} | {c["impl"] for c in report.get("dist_cases", [])}
    all_known = {
        e["name"]
        for e in report["impls"]
        if any(n["reason"].startswith("known divergence:") for n in e.get("not_run") or [])
    }
    assert set(names) <= judged | (all_known - judged), f"not in the report: {set(names) - judged - all_known}"


def _impl_or_dist(name: str):
    return next(i for i in dist_impls() if i.name == name) if name in te.DIST_VARIANTS else _impl(name)


# ----------------------------------------------------------------------------- distributed known divergences

#: TE's distributed entries, each off in every output of its covered cases.
TE_KNOWN = [d for d in DIST_KNOWN if d.impls.startswith("te_vocab_parallel")]
IDS = [f"{d.impls}:{d.example.short()}" for d in TE_KNOWN]


def _entry_impl(entry):
    """The one registered distributed impl an entry names (its ``impls`` is an fnmatch pattern)."""
    (impl,) = [i for i in dist_impls() if fnmatch.fnmatchcase(i.name, entry.impls)]
    return impl


@pytest.mark.parametrize("entry", TE_KNOWN, ids=IDS)
def test_case_divergence_names_a_registered_impl(entry):
    """Every release-keyed whole-case entry names one registered distributed impl and covers its own example (whether
    it does is read from TE's own kernels: skipped with the reason where TE is unavailable)."""
    assert entry.every_output and entry.releases is not None
    _entry_impl(entry)
    covered = entry.applies(_example_case(entry))
    if not covered and isinstance(INFO, str):
        pytest.skip(f"whether the entry covers its example is TE's to say: TransformerEngine unavailable here: {INFO}")
    assert covered


@needs_te
@pytest.mark.parametrize("entry", TE_KNOWN, ids=IDS)
def test_case_divergence_holds_exactly_in_its_releases(entry):
    """Inside the entry's release range its example fails dist_accuracy (strict: a fix turns this red); outside it
    passes."""
    impl = _entry_impl(entry)
    if impl.support.unavailable_reason():
        pytest.skip(impl.support.unavailable_reason())
    case = _example_case(entry)
    if world_size_unavailable(case.world_size, case.backend):
        pytest.skip(world_size_unavailable(case.world_size, case.backend))
    if entry.releases.version() is None:
        pytest.skip(f"{impl.name}: release unknown ({entry.releases.describe()})")
    ex = entry.example
    refused = impl.support.refuses(dtype=ex.param_dtype, device=DEVICE, options=ex.features, reduction=ex.reduction)
    if refused:
        pytest.skip(f"{impl.name} does not declare the example here: {refused}")
    others = [d for d in TE_KNOWN if d is not entry and d.every_output and d.covers_case(impl.name, case)]
    if others:
        pytest.skip(
            f"{impl.name}: its example is covered on TE {INFO.version} by another entry ({others[0].reason[:120]})"
        )
    if entry.releases.hold():
        with pytest.raises((PropertyFailure, RankFailure)):  # a judgement, or a rank's exception (a backward raising)
            dist_accuracy(impl, case)
    else:
        assert dist_accuracy(impl, case)["error/bound"] <= 1.0


def _example_case(entry):
    """A case divergence's example as a DistCase on this run's default backend (gloo on the CPU, nccl on CUDA)."""
    from numcheck.properties.distributed.linear_ce.cases import DistCase
    from numcheck.properties.distributed.pool.pool import default_backend

    return DistCase(
        problem=entry.example,
        world_size=entry.example_world_size,
        placement=entry.example_placement,
        backend=default_backend(),
    )
