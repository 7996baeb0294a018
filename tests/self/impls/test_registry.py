"""The impl protocol and registry: built-ins, ``module:attr`` specs, ``NUMCHECK_IMPLS``, entry points, ``--impl``.

One bad impl (failing import, missing attribute, protocol breach, raising factory, duplicate name) becomes a
``BrokenImpl`` whose message names it, and never stops the others from loading. The end-to-end tests run
pytest and ``numcheck list`` in a subprocess on ``examples/outside_impl.py`` copied outside the repo.
"""

from __future__ import annotations

import importlib
import itertools
import os
import shutil
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest
import torch

from numcheck.impls import registry
from numcheck.impls.protocols.linear_ce import (
    FunctionImpl,
    LinearCESupport,
    linear_ce_impl,
    make_support,
    validate_impl,
)
from numcheck.impls.registry import (
    ENTRY_POINT_GROUP,
    ENV_VAR,
    BrokenImpl,
    ImplEntry,
    builtin_impls,
    discover,
    load_spec,
)

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "examples" / "outside_impl.py"
EXAMPLE_NAME = "outside_fp32_logits"
_counter = itertools.count()

GOOD_IMPL = """
import torch.nn.functional as F
from numcheck.impls.protocols.linear_ce import linear_ce_impl

@linear_ce_impl(name={name!r}, dtypes=("float32",), options=("bias",))
def impl(x, weight, target, bias=None, *, reduction="mean", ignore_index=-100):
    return F.cross_entropy(F.linear(x, weight, bias), target, reduction=reduction, ignore_index=ignore_index)
"""


@pytest.fixture
def modules(tmp_path, monkeypatch):
    """``write(source) -> module name``: a fresh, uniquely named module on sys.path, removed afterwards."""
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv(ENV_VAR, raising=False)
    written: list[str] = []

    def write(source: str) -> str:
        name = f"nc_testmod_{uuid.uuid4().hex[:8]}_{next(_counter)}"
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
        written.append(name)
        return name

    yield write
    for name in written:
        sys.modules.pop(name, None)


def good(write, name: str | None = None) -> tuple[str, str]:
    """A module holding one valid impl; returns (module name, impl name)."""
    impl_name = name or f"good_{next(_counter)}"
    return write(GOOD_IMPL.format(name=impl_name)), impl_name


def _only(entries) -> ImplEntry | BrokenImpl:
    assert len(entries) == 1, entries
    return entries[0]


# ------------------------------------------------------------------------------------------------------
# Built-ins
# ------------------------------------------------------------------------------------------------------


def test_builtins_load():
    """Every built-in loads (no BrokenImpl), follows its protocol, has a unique name, and 'eager' is one."""
    entries = builtin_impls()
    broken = [e for e in entries if isinstance(e, BrokenImpl)]
    assert not broken, f"broken built-ins: {[(e.spec, e.error) for e in broken]}"
    names = [e.name for e in entries]
    assert "eager" in names
    assert len(names) == len(set(names)), f"duplicate built-in names: {names}"
    for e in entries:
        assert e.origin == "built-in"
        registry.validate(e.impl, f"built-in {e.name}")


#: Each third-party adapter's impl names (every kind: linear+CE and distributed) and how a test makes its library
#: missing (``monkeypatch, tmp_path``): the state of a machine with numcheck's wheel and without that library.
def _missing_liger(mp, tmp):
    from numcheck.impls.adapters import liger

    mp.setattr(liger, "load", lambda: "liger-kernel not installed")


def _missing_cce(mp, tmp):
    from numcheck.impls.adapters import cce

    mp.setattr(cce, "load", lambda: cce.NOT_INSTALLED)


def _missing_te(mp, tmp):
    from numcheck.impls.adapters import transformer_engine

    mp.setenv(transformer_engine.ENV_DIR, str(tmp))  # a folder without TE's files


def _missing_megatron(mp, tmp):
    from numcheck.impls.adapters import megatron

    mp.setattr(megatron, "_core_file", lambda: None)


MISSING = {
    "liger": (_missing_liger, ("liger[",)),
    "cce": (_missing_cce, ("cce[",)),
    "transformer_engine": (_missing_te, ("te_parallel_ce[", "te_vocab_parallel[")),
    "megatron": (_missing_megatron, ("megatron_",)),
}


@pytest.mark.parametrize("missing", [tuple(MISSING), *((name,) for name in MISSING)], ids=lambda m: "+".join(m))
def test_adapters_of_missing_libraries_are_unavailable_never_broken(missing, monkeypatch, tmp_path):
    """With every optional library missing (and with each one alone missing), every built-in still loads (no
    BrokenImpl, under every kind: te_vocab_parallel's fallback once declared options its rank_call cannot take), and
    each impl of a missing library is unavailable, its reason naming the library, on a declaration that passes no
    option (nothing guessed from the library that is not there)."""
    for name in missing:
        MISSING[name][0](monkeypatch, tmp_path)
    entries = builtin_impls()  # the distributed impls too (registry.dist_impls is a built-in factory)
    broken = [(e.spec, e.error) for e in entries if isinstance(e, BrokenImpl)]
    assert not broken, broken
    for name in missing:
        prefixes = MISSING[name][1]
        impls = [e.impl for e in entries if isinstance(e, ImplEntry) and e.name.startswith(prefixes)]
        assert impls, f"no impl of {name}"
        for impl in impls:
            why = impl.support.unavailable_reason()
            assert why and ("not installed" in why or str(tmp_path) in why), (impl.name, why)
            assert not impl.support.options, (impl.name, impl.support.options)
            assert f"unavailable: {why}" in impl.description, (impl.name, impl.description)


def test_builtin_factory_that_raises_is_broken_not_fatal(monkeypatch):
    """A raising built-in factory becomes a BrokenImpl naming the factory; the other built-ins still load."""

    def exploding_factory():
        raise RuntimeError("no such kernel")

    factories = [*registry.builtin_factories(), exploding_factory]
    monkeypatch.setattr(registry, "builtin_factories", lambda: factories)
    entries = builtin_impls()
    broken = [e for e in entries if isinstance(e, BrokenImpl)]
    assert len(broken) == 1 and "exploding_factory" in broken[0].spec and "no such kernel" in broken[0].error
    assert "eager" in [e.name for e in entries if isinstance(e, ImplEntry)]


# ------------------------------------------------------------------------------------------------------
# module:attr specs
# ------------------------------------------------------------------------------------------------------


def test_spec_loads_an_impl(modules):
    """``module:attr`` naming an impl object loads it, with the origin given."""
    mod, name = good(modules)
    e = _only(load_spec(f"{mod}:impl", "--impl"))
    assert isinstance(e, ImplEntry) and e.name == name and e.kind == "linear-ce" and e.origin == "--impl"


def test_spec_loads_a_list_a_factory_and_the_default_attr(modules):
    """``attr`` may be a list/tuple of impls, a factory returning one or a list; without ``:attr``, ``IMPLS``."""
    mod = modules("""
        import torch.nn.functional as F
        from numcheck.impls.protocols.linear_ce import FunctionImpl, LinearCESupport

        def _ce(x, w, t, b=None, **kw):
            return F.cross_entropy(F.linear(x, w, b), t, reduction=kw["reduction"], ignore_index=kw["ignore_index"])

        def _mk(name):
            return FunctionImpl(name=name, fn=_ce, support=LinearCESupport())

        LIST = [_mk("l1"), _mk("l2")]
        TUPLE = (_mk("t1"),)
        IMPLS = [_mk("default1")]
        def factory_one():
            return _mk("f1")
        def factory_many():
            return [_mk("f2"), _mk("f3")]
        class ns:
            impl = _mk("nested")
    """)
    for attr, want in (
        ("LIST", ["l1", "l2"]),
        ("TUPLE", ["t1"]),
        ("factory_one", ["f1"]),
        ("factory_many", ["f2", "f3"]),
        ("ns.impl", ["nested"]),
    ):
        entries = load_spec(f"{mod}:{attr}", "--impl")
        assert all(isinstance(e, ImplEntry) for e in entries), entries
        assert [e.name for e in entries] == want, attr
    assert [e.name for e in load_spec(mod, "--impl")] == ["default1"]


BROKEN_MODULES = {
    "import_error": ("import not_a_real_package_xyz\n", "impl", "cannot import module"),
    "raises_on_import": ("raise RuntimeError('GPU on fire')\n", "impl", "GPU on fire"),
    "syntax_error": ("def (:\n", "impl", "SyntaxError"),
    "missing_attr": ("x = 1\n", "impl", "has no attribute 'impl'"),
    "no_name": ("class I:\n    kind = 'linear-ce'\nimpl = I()\n", "impl", "'name'"),
    "wrong_kind": (
        "from numcheck.impls.protocols.linear_ce import LinearCESupport\nclass I:\n    name = 'k'\n    kind = 'softmax'\n"
        "    support = LinearCESupport()\n    def __call__(self, *a, **k): pass\nimpl = I()\n",
        "impl",
        "kind 'softmax'",
    ),
    "bad_support": (
        "class I:\n    name = 's'\n    kind = 'linear-ce'\n    support = {'dtypes': ()}\n"
        "    def __call__(self, *a, **k): pass\nimpl = I()\n",
        "impl",
        "LinearCESupport",
    ),
    "not_callable": (
        "from numcheck.impls.protocols.linear_ce import LinearCESupport\nclass I:\n    name = 'c'\n    kind = 'linear-ce'\n"
        "    support = LinearCESupport()\nimpl = I()\n",
        "impl",
        "not callable",
    ),
    "factory_raises": ("def impl():\n    raise ValueError('needs CUDA 12.9')\n", "impl", "needs CUDA 12.9"),
    "empty_list": ("impl = []\n", "impl", "yielded no impls"),
    "quant_without_support": (
        "class Q:\n    name = 'q'\n    kind = 'fp8-linear'\n    def __call__(self, *a, **k): pass\nimpl = Q()\n",
        "impl",
        "q",
    ),
}


@pytest.mark.parametrize("case", list(BROKEN_MODULES))
def test_broken_spec_is_reported_by_name(modules, case):
    """A spec that cannot become a valid impl becomes a BrokenImpl whose error says why and names it."""
    source, attr, why = BROKEN_MODULES[case]
    mod = modules(source)
    spec = f"{mod}:{attr}"
    e = _only(load_spec(spec, "--impl"))
    assert isinstance(e, BrokenImpl), f"{case}: loaded {e!r}"
    assert e.spec == spec and e.origin == "--impl" and e.name == spec
    assert why in e.error, f"{case}: error {e.error!r} should say {why!r}"
    assert mod in e.error or mod in e.spec


def test_missing_module_and_empty_spec_are_broken():
    """A module that does not exist, and an empty spec, are BrokenImpls."""
    e = _only(load_spec("no_such_module_nc:impl", "--impl"))
    assert isinstance(e, BrokenImpl) and "no_such_module_nc" in e.error
    e = _only(load_spec("  ", "--impl"))
    assert isinstance(e, BrokenImpl) and "empty" in e.error


def test_one_bad_item_in_a_list_keeps_the_good_ones(modules):
    """In a list, a protocol-breaking item is broken and the valid items still load."""
    mod = modules("""
        from numcheck.impls.protocols.linear_ce import FunctionImpl
        IMPLS = [FunctionImpl(name="ok", fn=lambda *a, **k: None), object()]
    """)
    entries = load_spec(mod, "$NUMCHECK_IMPLS")
    assert [type(e).__name__ for e in entries] == ["ImplEntry", "BrokenImpl"]
    assert entries[0].name == "ok" and "name" in entries[1].error


# ------------------------------------------------------------------------------------------------------
# discover(): env var, entry points, --impl, duplicates
# ------------------------------------------------------------------------------------------------------


def _write_dist(root: Path, entry_points: dict[str, str]) -> None:
    dist = root / f"nc_ep_dist_{uuid.uuid4().hex[:6]}-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist.name.split('-')[0]}\nVersion: 0.1\n")
    lines = "".join(f"{k} = {v}\n" for k, v in entry_points.items())
    (dist / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\n{lines}")


def test_env_var_adds_impls_after_builtins(modules, monkeypatch):
    """NUMCHECK_IMPLS (comma separated, spaces allowed) adds impls to the built-ins; a broken one is named."""
    m1, n1 = good(modules)
    m2, n2 = good(modules)
    monkeypatch.setenv(ENV_VAR, f" {m1}:impl , {m2}:impl,no_such_mod_nc:impl ")
    entries = discover()
    by_name = {e.name: e for e in entries}
    assert by_name[n1].origin == by_name[n2].origin == f"${ENV_VAR}"
    assert isinstance(by_name["no_such_mod_nc:impl"], BrokenImpl)
    assert "eager" in by_name and by_name["eager"].origin == "built-in"


def test_entry_points_are_discovered(modules, tmp_path):
    """A distribution advertising ``numcheck.impls`` entry points is loaded, broken ones named, origin given."""
    mod, name = good(modules)
    _write_dist(tmp_path, {"mine": f"{mod}:impl", "gone": "no_such_mod_nc:impl"})
    by_name = {e.name: e for e in discover()}
    assert isinstance(by_name[name], ImplEntry) and by_name[name].origin == "entry point mine"
    assert isinstance(by_name["no_such_mod_nc:impl"], BrokenImpl)
    assert by_name["no_such_mod_nc:impl"].origin == "entry point gone"


def test_cli_specs_restrict_the_run(modules, monkeypatch, tmp_path):
    """With --impl specs, exactly those impls load: no other built-ins, env-var or entry-point impls."""
    m1, n1 = good(modules)
    m2, n2 = good(modules)
    m3, n3 = good(modules)
    monkeypatch.setenv(ENV_VAR, f"{m2}:impl")
    _write_dist(tmp_path, {"other": f"{m3}:impl"})
    assert {n2, n3, "eager"} <= {e.name for e in discover()}
    assert [e.name for e in discover([f"{m1}:impl"])] == [n1]
    assert [e.name for e in discover(["eager", f"{m1}:impl"])] == ["eager", n1]
    e = _only(discover(["no_such_builtin"]))
    assert isinstance(e, BrokenImpl) and "no built-in impl named 'no_such_builtin'" in e.error and "eager" in e.error


def test_module_specs_alone_load_no_builtin(modules, monkeypatch):
    """--impl given only module:attr specs builds no built-in (no adapter's library is imported for a user's own
    impl): exact, since no built-in name holds ':' and such a spec can name no built-in."""
    m1, n1 = good(modules)
    assert not [e.name for e in builtin_impls() if ":" in e.name]
    built: list[int] = []
    real = registry.builtin_impls
    monkeypatch.setattr(registry, "builtin_impls", lambda *names: built.append(1) or real(*names))
    assert [e.name for e in discover([f"{m1}:impl"])] == [n1] and not built
    assert [e.name for e in discover(["eager", f"{m1}:impl"])] == ["eager", n1] and built


def test_each_factory_makes_only_impls_of_its_declared_bases():
    """BUILTIN_FACTORIES' bases are what each factory makes (every base made, no other), so a run naming a built-in
    builds exactly the factories that can make it."""
    for spec, bases in registry.BUILTIN_FACTORIES:
        module, attr = spec.split(":")
        made = {registry.base_name(i.name) for i in getattr(importlib.import_module(module), attr)()}
        assert made == set(bases), (spec, sorted(made), bases)
    names = [e.name for e in builtin_impls() if isinstance(e, ImplEntry)]
    assert all(n in {e.name for e in builtin_impls([n])} for n in names)


def test_a_named_builtin_imports_no_other_adapter():
    """`--impl eager` (and a numcheck command given it) imports neither Liger-Kernel nor torchao: only the factories
    of the named bases are built; an unknown name still lists every built-in."""
    code = (
        "import sys; from numcheck.impls.registry import discover, BrokenImpl; from numcheck.reports.common import "
        "ImplSpec; assert [e.name for e in discover(['eager'])] == ['eager']; assert ImplSpec()('eager') == 'eager'; "
        "print(sorted(m for m in ('liger_kernel', 'torchao') if m in sys.modules)); "
        "e = discover(['eager[nope]'])[0]; assert isinstance(e, BrokenImpl) and 'liger[accum=None]' in e.error, e"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr


def test_duplicate_names_are_broken_not_shadowed(modules, monkeypatch):
    """A second impl with a name already taken (built-in or outside) is a BrokenImpl saying 'duplicate'."""
    m1, _ = good(modules, name="eager")
    m2, n2 = good(modules)
    m3, _ = good(modules, name=n2)
    monkeypatch.setenv(ENV_VAR, f"{m1}:impl,{m2}:impl,{m3}:impl")
    entries = discover()
    dups = [e for e in entries if isinstance(e, BrokenImpl) and "duplicate" in e.error]
    assert sorted(e.name for e in dups) == sorted(["eager", n2]), dups
    assert [e.origin for e in entries if isinstance(e, ImplEntry) and e.name == "eager"] == ["built-in"]
    assert [e.name for e in discover([f"{m2}:impl", f"{m3}:impl"]) if isinstance(e, BrokenImpl)] == [n2]


# ------------------------------------------------------------------------------------------------------
# The protocol's declarations
# ------------------------------------------------------------------------------------------------------


def test_linear_ce_impl_decorator_builds_a_function_impl():
    """linear_ce_impl turns a function into a FunctionImpl: dtype names resolved, description from the docstring."""

    @linear_ce_impl(
        name="dec",
        dtypes=("float32", "bfloat16"),
        options=("bias", "softcap"),
        autocast=("bfloat16",),
        reductions=("mean",),
        option_combinations_excluded=[("bias", "softcap")],
    )
    def f(x, weight, target, bias=None, **kw):
        """First line.

        More."""
        return kw

    assert isinstance(f, FunctionImpl) and f.kind == "linear-ce" and f.name == "dec"
    assert f.support.dtypes == frozenset({torch.float32, torch.bfloat16})
    assert f.support.autocast == frozenset({torch.bfloat16})
    assert f.description == "First line."
    assert f(1, 2, 3, reduction="mean") == {"reduction": "mean"}
    validate_impl(f, "test")
    assert f.with_support(chunk_rows=4).support.chunk_rows == 4 and f.support.chunk_rows is None


@pytest.mark.parametrize(
    "kwargs,word",
    [
        (dict(options=("bias", "temperature")), "temperature"),
        (dict(reductions=("avg",)), "avg"),
        (dict(dtypes=("float64",)), "dtypes"),
        (dict(dtypes=("float99",)), "float99"),
        (dict(dtypes=("Tensor",)), "Tensor"),
        (dict(all_ignored="raise"), "all_ignored"),
        (dict(grad_accumulation="bf16"), "grad_accumulation"),
        (dict(chunk_rows=0), "chunk_rows"),
    ],
    ids=lambda v: "-".join(map(str, v)) if isinstance(v, dict) else str(v),
)
def test_support_declaration_rejects_unknown_values(kwargs, word):
    """A support declaration with an unknown option, reduction, dtype or setting raises naming it."""
    with pytest.raises(ValueError, match=word):
        make_support(**kwargs)


def test_support_refuses_says_why():
    """refuses() names the first undeclared aspect of a case, and is None for a declared one."""
    s = make_support(
        dtypes=("float32",),
        devices=("cpu",),
        options=("bias", "softcap", "z_loss"),
        reductions=("mean",),
        autocast=(),
        all_ignored=None,
        option_combinations_excluded=[("softcap", "z_loss")],
    )
    assert s.refuses(dtype=torch.float32, device="cpu", options={"bias"}) is None
    assert "dtype" in s.refuses(dtype=torch.bfloat16, device="cpu")
    assert "device" in s.refuses(dtype=torch.float32, device="cuda")
    assert "reduction" in s.refuses(dtype=torch.float32, device="cpu", reduction="sum")
    assert "label_smoothing" in s.refuses(dtype=torch.float32, device="cpu", options={"label_smoothing"})
    assert "combination" in s.refuses(dtype=torch.float32, device="cpu", options={"softcap", "z_loss"})
    assert "autocast" in s.refuses(dtype=torch.float32, device="cpu", autocast=torch.bfloat16)
    assert "all-ignored" in s.refuses(dtype=torch.float32, device="cpu", all_ignored=True)


def test_unavailable_reason_reports_requirements():
    """A requirement check's reason is reported; a raising check becomes a reason, never an exception."""
    assert LinearCESupport().unavailable_reason() is None
    assert LinearCESupport(requires=lambda: "needs triton").unavailable_reason() == "needs triton"
    reason = LinearCESupport(requires=lambda: 1 / 0).unavailable_reason()
    assert "ZeroDivisionError" in reason


# ------------------------------------------------------------------------------------------------------
# End to end: the README's outside module under pytest and numcheck list, in subprocesses
# ------------------------------------------------------------------------------------------------------

BAD_SUM_FOR_NONE = """
import torch.nn.functional as F
from numcheck.impls.protocols.linear_ce import linear_ce_impl

@linear_ce_impl(name="bad_sum_for_none", dtypes=("float32",), options=("bias", "ignore_index"), autocast=())
def impl(x, weight, target, bias=None, *, reduction="mean", ignore_index=-100):
    # the Liger bug: reduction='none' returns a summed scalar
    loss = F.cross_entropy(F.linear(x, weight, bias), target, reduction=reduction, ignore_index=ignore_index)
    return loss.sum() if reduction == "none" else loss
"""


def _run(
    args: list[str], tmp_path: Path, env_impls: str | None = None, timeout: float = 300
) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", ENV_VAR))}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(REPO)])
    if env_impls is not None:
        env[ENV_VAR] = env_impls
    return subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def outside_dir(tmp_path) -> Path:
    """examples/outside_impl.py as ``mymod``, a protocol-breaking ``mybad`` and an unimportable ``mybroken``."""
    shutil.copy(EXAMPLE, tmp_path / "mymod.py")
    (tmp_path / "mybad.py").write_text(BAD_SUM_FOR_NONE)
    (tmp_path / "mybroken.py").write_text("import not_a_real_package_xyz\n")
    return tmp_path


CONFORMANCE = "tests/suite/test_protocol_conformance.py"


def test_outside_module_runs_under_pytest_impl(outside_dir):
    """``pytest --impl mymod:impl`` runs the suite on the outside impl only, and it passes."""
    r = _run(["-m", "pytest", CONFORMANCE, "--impl", "mymod:impl", "-q", "-rA", "-p", "no:cacheprovider"], outside_dir)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert f"PASSED {CONFORMANCE}::test_protocol_structure[{EXAMPLE_NAME}]" in out, out
    assert "[eager]" not in out, "--impl must restrict the run to the named impl"


def test_outside_modules_under_env_var_good_bad_and_broken(outside_dir):
    """With NUMCHECK_IMPLS, the outside impl and the built-ins pass, a protocol breach fails by name, and an
    unimportable module is one error naming it and the import error — without breaking the others."""
    r = _run(
        ["-m", "pytest", CONFORMANCE, "-q", "-rA", "-p", "no:cacheprovider"],
        outside_dir,
        env_impls="mymod:impl,mybad:impl,mybroken:impl",
    )
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert f"PASSED {CONFORMANCE}::test_protocol_structure[{EXAMPLE_NAME}]" in out, out
    assert f"PASSED {CONFORMANCE}::test_protocol_structure[eager]" in out, out
    # a broken impl is one error under its spec (not a pass or skip), and no test is parametrized with it
    assert out.count("ERROR numcheck::load[mybroken:impl]") == 1, out
    assert "test_protocol_structure[mybroken:impl]" not in out, out
    assert f"FAILED {CONFORMANCE}::test_protocol_structure[bad_sum_for_none]" in out, out
    assert "returned loss of shape () for reduction='none'" in out, out
    assert "could not be loaded" in out and "not_a_real_package_xyz" in out, out


def test_outside_module_appears_in_numcheck_list(outside_dir, monkeypatch, capsys):
    """``numcheck list`` with NUMCHECK_IMPLS shows the outside impl, its origin and that it runs here. (The command
    runs in this process, as test_cli_list's do: a python start and torch import less.)"""
    from numcheck.reports import cli

    monkeypatch.syspath_prepend(str(outside_dir))
    monkeypatch.delitem(sys.modules, "mymod", raising=False)
    monkeypatch.setenv(ENV_VAR, "mymod:impl")
    code = cli.main(["list"])
    captured = capsys.readouterr()
    out = captured.out + captured.err
    assert code == 0, out
    assert f"{EXAMPLE_NAME}  [linear-ce, from ${ENV_VAR}]" in out, out
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"{EXAMPLE_NAME}  ["))
    block = list(itertools.takewhile(lambda line: line.startswith(" "), lines[start + 1 :]))
    assert "    here: runs" in block, block
    assert "eager  [linear-ce, from built-in]" in out
