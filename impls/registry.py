"""Where implementations come from: built-ins, ``--impl`` specs, ``NUMCHECK_IMPLS``, entry points.

Every kind loads the same way and is checked against its own protocol (:func:`validate`), each kind of
:data:`impls.protocols.kinds.KINDS` by the validator its descriptor names.

An outside implementation is named by a spec ``package.module:attr``. ``attr`` may be an impl object,
a list/tuple of impls, or a zero-argument callable returning either. Built-in impls may be named by their
registered name instead of a spec.

Loading never raises for one bad impl: a spec that fails to import, names nothing, or yields an object that
breaks the protocol becomes a :class:`BrokenImpl` entry that carries the error, so the rest still load and
the suite reports the broken one by name.
"""

from __future__ import annotations

import importlib
import os
import sys
import traceback
from dataclasses import dataclass
from importlib import metadata
from typing import Any, Callable, Iterable, Sequence

from numcheck.errors import InvalidDeclaration
from numcheck.impls.protocols import linear_ce
from numcheck.impls.protocols.kinds import BY_NAME, FORMER, current_name

ENV_VAR = "NUMCHECK_IMPLS"
ENTRY_POINT_GROUP = "numcheck.impls"


_SPECS: dict[str, str] = {}


def spec_of(name: str) -> str | None:
    """How the impl called ``name`` was named when it was loaded in this process (a ``module:attr`` spec for
    outside impls, the name itself for built-ins), for reproduction commands."""
    return _SPECS.get(name)


@dataclass(frozen=True)
class ImplEntry:
    """One loaded implementation and where it came from (``built-in``, ``--impl``, env var, entry point)."""

    impl: Any
    origin: str

    @property
    def name(self) -> str:
        return self.impl.name

    @property
    def kind(self) -> str:
        return self.impl.kind


@dataclass(frozen=True)
class BrokenImpl:
    """A spec that could not be turned into an impl; ``error`` says why, ``origin`` where it was named."""

    spec: str
    origin: str
    error: str

    @property
    def name(self) -> str:
        return self.spec


#: Every built-in factory, ``module:function``, with the base names of the impls it makes (a name's base is the part
#: before ``[``: ``liger`` of ``liger[accum=None]``), in listing order: linear+CE impls first, then the FP8 linear
#: ones (single, then grouped), then the distributed ones (vocabulary-parallel linear+CE, tensor-parallel FP8
#: linear), then the distillation and preference ones. This table is the only place that names them; no impl module
#: imports the registry. The bases let a run that names some built-ins import only the modules that make them
#: (:func:`builtin_factories`): ``--impl eager`` imports neither Liger (torch._dynamo) nor torchao nor
#: TransformerEngine's files, seconds of every such process. tests/self/impls/test_registry.py checks that each
#: factory makes only impls of its bases.
BUILTIN_FACTORIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("numcheck.impls.builtin.eager:eager_impls", ("eager",)),
    ("numcheck.impls.adapters.liger:liger_impls", ("liger",)),
    ("numcheck.impls.adapters.cce:cce_impls", ("cce",)),
    ("numcheck.impls.adapters.transformer_engine:te_impls", ("te_parallel_ce",)),
    ("numcheck.impls.builtin.chunked:chunked_impls", ("chunked",)),
    ("numcheck.impls.builtin.chunked:recompute_impls", ("recompute",)),
    ("numcheck.impls.adapters.torch_native:torch_native_impls", ("torch_native",)),
    ("numcheck.impls.builtin.triton_ce:triton_impls", ("chunked_triton", "recompute_triton")),
    ("numcheck.impls.builtin.fp8_linear:fp8_linear_impls", ("fp8_linear",)),
    ("numcheck.impls.builtin.fp8_hopper:fp8_hopper_impls", ("fp8_linear",)),
    ("numcheck.impls.adapters.torchao:torchao_impls", ("torchao_float8",)),
    ("numcheck.impls.adapters.torchao_prototype:torchao_mx_impls", ("torchao_mxfp8",)),
    ("numcheck.impls.builtin.grouped_fp8_linear:grouped_fp8_linear_impls", ("grouped_fp8_linear",)),
    ("numcheck.impls.adapters.torchao_prototype:torchao_grouped_impls", ("torchao_grouped_fp8",)),
    (
        "numcheck.impls.registry:dist_impls",
        ("vocab_parallel", "megatron_vocab_parallel", "megatron_fused_vocab_parallel", "te_vocab_parallel"),
    ),
    ("numcheck.impls.builtin.tp_fp8_linear:tp_fp8_linear_impls", ("tp_fp8_linear",)),
    ("numcheck.impls.builtin.linear_distill:linear_distill_impls", ("linear_distill",)),
    ("numcheck.impls.adapters.liger_distill:liger_distill_impls", ("liger_jsd",)),
    (
        "numcheck.impls.builtin.linear_preference:linear_preference_impls",
        ("linear_preference_eager", "linear_preference_chunked"),
    ),
    ("numcheck.impls.adapters.liger_preference:liger_preference_impls", ("liger_preference",)),
)


def base_name(name: str) -> str:
    """An impl name's base, the part before ``[`` (``liger`` of ``liger[accum=None]``)."""
    return name.split("[", 1)[0]


def builtin_factories(names: Iterable[str] | None = None) -> Sequence[Callable[[], Iterable[Any]]]:
    """The factories of :data:`BUILTIN_FACTORIES` in listing order: every one, or with ``names`` those whose bases
    hold some name's base (every one where a name's base is no factory's, so that an error can list them all).

    Imported when first asked for, not with this module: the built-in modules import triton, which must come
    after :func:`impls.interpreter.arrange`, and the entry points import the registry before they arrange
    (the pytest plugin, for one).
    """
    wanted = None if names is None else {base_name(n) for n in names}
    if wanted is not None and not wanted <= {b for _, bases in BUILTIN_FACTORIES for b in bases}:
        wanted = None
    out = []
    for spec, bases in BUILTIN_FACTORIES:
        if wanted is None or wanted.intersection(bases):
            module, attr = spec.split(":")
            out.append(getattr(importlib.import_module(module), attr))
    return out


def dist_impls() -> list[Any]:
    """Every distributed (vocabulary-parallel) linear+CE impl numcheck knows, built-in first, then the third-party
    adapters: the distributed suite, ``numcheck list`` and the repro command read this list. Megatron's fused
    variant's bf16 gradient of fp32 logits is a known divergence of the release
    (:data:`numcheck.properties.distributed.linear_ce.known.DIST_KNOWN`)."""
    from numcheck.impls.adapters.megatron import megatron_impls
    from numcheck.impls.adapters.transformer_engine import te_dist_impls
    from numcheck.impls.builtin.vocab_parallel import vocab_parallel_impls

    return [*vocab_parallel_impls(), *megatron_impls(), *te_dist_impls()]


#: The modules the vocabulary-parallel impls of :func:`dist_impls` run on a rank: the built-in's, the Megatron
#: adapter's and the Megatron modules that adapter calls. The distributed linear+CE family's rank zygote imports them
#: before it forks (an optimisation, ``properties/distributed/linear_ce/props.py``); they are listed here, with the
#: other names of impl modules, so that the judge names none of them.
DIST_RANK_MODULES: tuple[str, ...] = (
    "numcheck.impls.builtin.vocab_parallel",
    "numcheck.impls.adapters.megatron",
    "megatron.core.tensor_parallel.cross_entropy",
    "megatron.core.tensor_parallel.mappings",
    "megatron.core.fusions.fused_cross_entropy",
)


def builtin_impls(names: Iterable[str] | None = None) -> list[ImplEntry | BrokenImpl]:
    """Every built-in impl, in the order of :func:`builtin_factories`, each factory called once; with ``names``, those
    of the factories that make impls of their bases (a superset of the named ones)."""
    out: list[ImplEntry | BrokenImpl] = []
    for factory in builtin_factories() if names is None else builtin_factories(names):
        label = f"{factory.__module__}.{factory.__name__}"
        try:
            produced = list(factory())
        except Exception as exc:
            out.append(BrokenImpl(label, "built-in", _describe(exc)))
            continue
        for impl in produced:
            out.append(_checked(impl, label, "built-in"))
    return out


def _describe(exc: BaseException) -> str:
    if isinstance(exc, InvalidDeclaration):  # its message starts at the declaring line; where it was raised is noise
        return f"{type(exc).__name__}: {exc}"
    last = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
    where = f" (at {last[0].filename}:{last[0].lineno})" if last else ""
    return f"{type(exc).__name__}: {exc}{where}"


def validate(impl: Any, origin: str) -> None:
    """Raise ``TypeError`` naming ``origin`` when ``impl`` breaks the protocol of its kind: the validator of its
    kind's descriptor (:data:`impls.protocols.kinds.BY_NAME`), else :func:`impls.protocols.linear_ce.validate_impl`
    (the error for an unknown kind, naming the kinds a plain impl may have). A hand-built impl whose ``kind`` is a
    kind's name before numcheck 0.2.0 (``"quant_linear"``: :data:`impls.protocols.kinds.FORMER`) gets today's name,
    with a :class:`~numcheck.errors.RenamedWarning` once per process."""
    kind = getattr(impl, "kind", None)
    if isinstance(kind, str) and kind in FORMER:
        kind = current_name(kind)
        try:
            object.__setattr__(impl, "kind", kind)
        except (AttributeError, TypeError):
            raise TypeError(f"{origin}: impl kind {impl.kind!r} was renamed {kind!r}; give kind = {kind!r}") from None
    found = BY_NAME.get(kind) if isinstance(kind, str) else None
    (found or linear_ce.KIND).validate(impl, origin)


def _checked(impl: Any, spec: str, origin: str) -> ImplEntry | BrokenImpl:
    try:
        validate(impl, f"{origin} {spec}")
    except TypeError as exc:
        return BrokenImpl(spec, origin, str(exc))
    _SPECS.setdefault(impl.name, impl.name if origin == "built-in" else spec)
    return ImplEntry(impl, origin)


def load_spec(spec: str, origin: str) -> list[ImplEntry | BrokenImpl]:
    """Load ``package.module:attr`` (or ``package.module`` + ``:attr``-less default ``IMPLS``)."""
    spec = spec.strip()
    if not spec:
        return [BrokenImpl(spec, origin, "empty impl spec")]
    module_name, _, attr = spec.partition(":")
    # The user's repository is where they run from: `pytest --pyargs numcheck.tests.suite --impl mypkg.flce:impl`
    # imports mypkg from the current directory as `numcheck report` does (at the end of the path: an installed
    # package of the same name wins), whether or not their package is installed.
    here = os.getcwd()
    if here not in sys.path and "" not in sys.path:
        sys.path.append(here)
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        return [BrokenImpl(spec, origin, f"cannot import module {module_name!r}: {_describe(exc)}")]
    attr = attr or "IMPLS"
    obj: Any = module
    try:
        for part in attr.split("."):
            obj = getattr(obj, part)
    except AttributeError:
        return [BrokenImpl(spec, origin, f"module {module_name!r} has no attribute {attr!r}")]
    if callable(obj) and not hasattr(obj, "kind"):
        try:
            obj = obj()
        except Exception as exc:
            return [BrokenImpl(spec, origin, f"factory {spec} raised {_describe(exc)}")]
    items = list(obj) if isinstance(obj, (list, tuple)) else [obj]
    if not items:
        return [BrokenImpl(spec, origin, f"{spec} yielded no impls")]
    return [_checked(item, spec, origin) for item in items]


def env_specs() -> list[str]:
    """The specs named in ``NUMCHECK_IMPLS`` (comma separated)."""
    return [s.strip() for s in os.environ.get(ENV_VAR, "").split(",") if s.strip()]


def entry_point_impls() -> list[ImplEntry | BrokenImpl]:
    """Impls advertised by installed distributions under the ``numcheck.impls`` entry-point group."""
    out: list[ImplEntry | BrokenImpl] = []
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        out.extend(load_spec(ep.value, f"entry point {ep.name}"))
    return out


def discover(cli_specs: Sequence[str] = ()) -> list[ImplEntry | BrokenImpl]:
    """All impls of this run.

    Without ``cli_specs``: built-ins, then ``NUMCHECK_IMPLS``, then entry points. With ``cli_specs`` (the
    ``--impl`` options): exactly those, each either a built-in name or a ``module:attr`` spec.
    Duplicate names are reported as broken entries rather than silently shadowed.
    """
    if cli_specs:
        # Built-ins only where some spec may name one (no built-in name holds ":", test_registry checks), and only
        # those of the factories that make the named bases: a run of module:attr specs, or of `eager`, skips
        # importing the adapters' libraries (torch._dynamo through Liger and torchao, TransformerEngine's files),
        # seconds of every subprocess that runs a user's impl or a few built-ins.
        named = [spec for spec in cli_specs if ":" not in spec]
        builtins = {e.name: e for e in builtin_impls(named) if isinstance(e, ImplEntry)} if named else {}
        found: list[ImplEntry | BrokenImpl] = []
        for spec in cli_specs:
            if spec in builtins:
                found.append(builtins[spec])
            elif ":" in spec or "." in spec:
                found.extend(load_spec(spec, "--impl"))
            else:
                found.append(
                    BrokenImpl(
                        spec,
                        "--impl",
                        f"no built-in impl named {spec!r} and not a module:attr spec; built-ins: {all_builtin_names()}",
                    )
                )
    else:
        found = builtin_impls()
        for spec in env_specs():
            found.extend(load_spec(spec, f"${ENV_VAR}"))
        found.extend(entry_point_impls())
    seen: dict[str, str] = {}
    out: list[ImplEntry | BrokenImpl] = []
    for entry in found:
        if isinstance(entry, ImplEntry):
            if entry.name in seen:
                out.append(
                    BrokenImpl(
                        entry.name, entry.origin, f"duplicate impl name {entry.name!r} (also from {seen[entry.name]})"
                    )
                )
                continue
            seen[entry.name] = entry.origin
        out.append(entry)
    return out


def builtin(name: str) -> Any:
    """The built-in impl registered under ``name``; LookupError naming the known ones otherwise."""
    entries = [e for e in builtin_impls([name]) if isinstance(e, ImplEntry)]
    for e in entries:
        if e.name == name:
            return e.impl
    raise LookupError(f"no built-in impl named {name!r}; built-ins: {all_builtin_names()}")


def all_builtin_names() -> list[str]:
    """Every built-in impl's name, sorted (every factory called)."""
    return sorted(e.name for e in builtin_impls() if isinstance(e, ImplEntry))


def by_kind(entries: Iterable[ImplEntry | BrokenImpl], kind: str) -> list[ImplEntry]:
    """The loaded entries of one kind (a name of :data:`impls.protocols.kinds.NAMES`)."""
    return [e for e in entries if isinstance(e, ImplEntry) and e.kind == kind]
