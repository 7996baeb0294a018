"""Adapters for TransformerEngine's fused cross-entropy (``transformer_engine.pytorch.cross_entropy``:
``parallel_cross_entropy`` and the autograd Function behind it, ``CrossEntropyFunction``, whose Triton kernels are
``transformer_engine/pytorch/triton/cross_entropy.py`` and, from 2.10, ``transformer_engine/common/triton/
cross_entropy.py``), for every release from 2.2.0 on, with two faces:

- ``te_parallel_ce[mean]`` / ``te_parallel_ce[none]`` (linear+CE, :mod:`numcheck.impls.protocols.linear_ce`): the
  logits of a declared GEMM (``F.linear`` in the input dtype, bias cast to it), viewed as TE's [1, N, V], then
  TE's Function with ``reduce_loss=True`` (``mean``) or ``False`` (``none``, TE's per-row loss): TE offers those
  two reductions and no ``sum``. Loss and gradients are what TE returns; the adapter only reshapes the loss ([1] or
  [1, N]) to the protocol's () or [N]. ``te_parallel_ce[mean,overwrite_input]``: the same with
  ``overwrite_input=True`` where the release has that parameter (2.19 on; earlier releases name why not). That flag
  changes only which buffer backward stores the gradient in, the same store for both reductions, so one variant
  checks it (and its declared write) on every draw; a second would double its CI time under the interpreter.
- ``te_vocab_parallel[mean]`` / ``te_vocab_parallel[none]`` (distributed,
  :mod:`numcheck.impls.protocols.dist_linear_ce`): each rank's logits shard from the same GEMM, x entering through a
  copy whose backward all-reduces grad_x in x's dtype, then TE's Function with ``dist_process_group=group`` (gloo on
  the CPU, nccl on CUDA). TE takes the full targets on every rank and assumes equal, rank-ordered shards
  (``vocab_start = rank * V_r``): ``uneven_vocab=False``. Its label smoothing is PyTorch's (ε/V over every class):
  ``smoothing="torch"``.

**Loading** (:func:`load`, shown by ``numcheck list``). Where ``import transformer_engine.pytorch`` works (TE fully
installed, its core library included), the Function is taken from there. Otherwise the fused CE's own files are
loaded from an installed ``transformer-engine`` wheel *without running any package ``__init__``*: each of the (two
or three) modules is executed from its file under a private name, never entered in ``sys.modules``, with an import
function of its own that hands it the other privately loaded modules for the names ``transformer_engine.…``
they import (relative imports resolved the same way) and refuses any other TE module with the reason. Those files
import only torch, triton and each other (read for every release 2.2.0–2.20.2; 2.19 on also import
``transformer_engine.pytorch.jit.no_torch_dynamo``, whose module needs TE's core: it is given
:func:`torch._dynamo.disable`, what TE's decorator does outside ONNX export, and only wraps the public
``overwrite_input`` path the adapter does not call). The files are looked for in ``$NUMCHECK_TE_DIR``
(:data:`ENV_DIR`, only there when set), else in the folder of an importable but incomplete ``transformer_engine``
(the pure-Python wheel without its core), else in :func:`default_dir` (``<sys.prefix>/numcheck-te``, which
``.ci/setup`` fills with ``pip install --no-deps --target``). That folder is never put on ``sys.path``: an
importable ``transformer_engine`` without its core breaks other packages' imports (liger-kernel's, which probes
for TE). The release is the ``transformer_engine-*.dist-info`` beside the files (or the distribution owning the
imported module); files without one are not used (their release, so their declaration, is unknown).

The adapter calls ``CrossEntropyFunction.apply`` positionally in the order of the installed ``forward``'s
parameters (releases renamed ``_input`` to ``inp`` in 2.10, added ``ignore_idx`` in 2.4, ``is_cg_capturable`` in
2.7 and dropped it from the Function in 2.19, added ``overwrite_input`` in 2.19), not the public
``parallel_cross_entropy``: up to 2.9 that *is* ``CrossEntropyFunction.apply``; from 2.10 a wrapper that maps
``_input``, and from 2.19 also checks the arguments (CUDA tensors only) and routes ``overwrite_input=True`` through a
dynamo-disabled function, all around the same Function. On the CPU its kernels run under Triton's interpreter, as
Liger's do (:mod:`numcheck.impls.interpreter`).

**Declarations, per release** (:func:`declare`, read from the installed Function's signature and, where behaviour
changed without a signature change, from the release; the source they were read from is named):

- options: ``bias`` (the adapter's GEMM), ``label_smoothing`` (every release), ``ignore_index`` (where
  ``ignore_idx`` exists: 2.4 on; 2.2 and 2.3 have no ignored rows at all); no class weights, softcap or z-loss.
- dtypes: fp32 and bf16, the logits TE documents (2.19's wrapper refuses others); no autocast (the GEMM runs in the
  parameters' dtype). Loss in fp32, softmax statistics and the logits' gradient formed in fp32.
- all-ignored ``mean``: 0 with zero gradients (``zero``: TE clamps its divisor to 1 from 2.12, and divided by all
  rows before); not declared without ``ignore_idx``.
- **whether TE writes into the logits it is given** (:data:`WRITES`), checked on every call by the adapter
  (:class:`LogitsWatch`): up to 2.17 the forward kernel stores the gradient into the logits buffer (a contiguous
  one, as the GEMM's is) and the Function saves and returns that buffer (``"forward"``); 2.18 stores it in a
  separate fp32 buffer (``None``); 2.19 on copies the logits in forward unless ``overwrite_input=True``, which makes
  backward write the gradient into them (``"backward"``). A write the declaration does not state, or a declared one
  that does not happen (the gradient TE returns is not the logits' storage), raises :class:`LogitsWriteMismatch`,
  which the suite reports as a failure of the impl. ``numcheck list`` prints the declaration.
- interpreter limits: under Triton's interpreter a bf16 value plus a Python float constant comes back as garbage
  (:func:`interpreter_bf16_constant`: 0.25 + 1.5 gives 6.4e37 with triton 3.9). TE 2.5–2.17's ``reduce_loss=False``
  kernel adds ``-(1 - label_smoothing)`` (a compile-time constant) to the target entry of the gradient it keeps in
  the bf16 logits buffer (``cross_entropy_kernel``, step 6), so interpreted bf16 ``none`` gradients of ~1e37 come
  back; compiled on an H200 the same releases are within 2e-3 of float64. bf16 is then left out of the
  ``none`` impls *with that reason* (:data:`INTERPRETER_BF16_CONSTANT`), only when the interpreter runs the kernels
  and the probe shows the defect: an interpreter artifact, not TE's; ``tools/gpu/te_releases.sh`` judges it
  compiled.

What numcheck finds in the releases themselves is recorded as known divergences keyed on the release range
(:mod:`numcheck.properties.linear_ce.known_te`, :mod:`numcheck.properties.distributed.linear_ce.suite`), with the evidence in
``docs/evidence/te_releases.txt`` (``docs/evidence/te_releases.py`` judges every release).
"""

from __future__ import annotations

import builtins
import functools
import importlib
import importlib.util
import os
import sys
import types
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal

import torch
import torch.distributed as dist
import torch.nn.functional as F
from packaging.version import InvalidVersion, Version

from numcheck.impls import interpreter
from numcheck.impls.adapters import releases
from numcheck.impls.adapters.function_args import forward_parameters, positional_args
from numcheck.impls.adapters.unavailable import unavailable_support
from numcheck.impls.builtin.triton_ce import triton_library_elementary
from numcheck.impls.builtin.vocab_parallel import CopyToRanks
from numcheck.impls.protocols.dist_linear_ce import DIST_KIND, DistSupport, VocabShardImpl
from numcheck.impls.protocols.linear_ce import FunctionImpl, LinearCESupport, make_support, unavailable_fn
from numcheck.reference.options import CEOptions

DISTRIBUTION = "transformer-engine"
#: A folder holding an installed ``transformer-engine`` wheel's files (``pip install --no-deps --target DIR
#: transformer-engine==X``); when set, the fused CE is loaded from there and nowhere else.
ENV_DIR = "NUMCHECK_TE_DIR"
#: The release ``.ci/setup`` installs into :func:`default_dir` (the newest with the fused CE when it was pinned).
CI_RELEASE = "2.20.2"
#: The fused CE's files, relative to the folder holding ``transformer_engine/``; ``common`` exists from 2.10.
FILES = {
    "api": "transformer_engine/pytorch/cross_entropy.py",
    "triton": "transformer_engine/pytorch/triton/cross_entropy.py",
    "common": "transformer_engine/common/triton/cross_entropy.py",
}
#: The module name each file is imported by (inside TE's own files).
MODULE_NAMES = {
    "api": "transformer_engine.pytorch.cross_entropy",
    "triton": "transformer_engine.pytorch.triton.cross_entropy",
    "common": "transformer_engine.common.triton.cross_entropy",
}
OLDEST = Version("2.2.0")

#: Where TE writes the gradient of the logits it is given: into them in forward (``"forward"``), in backward
#: (``"backward"``), or not at all (``None``).
Writes = Literal["forward", "backward"] | None
WRITES: dict[Writes, str] = {
    "forward": (
        "writes the gradient into the logits it is given, in forward (the kernel stores it in the logits "
        "buffer; the Function saves and returns that buffer)"
    ),
    "backward": "writes the gradient into the logits it is given, in backward (overwrite_input=True)",
    None: "leaves the logits it is given as they are",
}


def default_dir() -> Path:
    """Where the fused CE's files are looked for when :data:`ENV_DIR` is unset and TE is not importable:
    ``<sys.prefix>/numcheck-te`` (the virtual environment's own folder, not on ``sys.path``)."""
    return Path(sys.prefix) / "numcheck-te"


def install_hint(folder: Path | str | None = None) -> str:
    """The command that puts the files where numcheck looks."""
    return (
        f"pip install --no-deps --target {folder or default_dir()} {DISTRIBUTION}=={CI_RELEASE} "
        f"(or set {ENV_DIR} to such a folder)"
    )


@dataclass(frozen=True)
class Source:
    """Where the fused CE comes from: ``how`` is ``"import"`` (``import transformer_engine.pytorch``) or ``"files"``
    (the modules executed from the files under ``folder``, the folder holding ``transformer_engine/``)."""

    how: Literal["import", "files"]
    folder: str
    #: Why an importable ``transformer_engine`` was not used (its import failed), shown with the source.
    note: str | None = field(default=None, compare=False)

    def describe(self) -> str:
        if self.how == "import":
            return f"import transformer_engine.pytorch (TE fully installed, at {self.folder})"
        why = f"; {self.note}" if self.note else ""
        return f"files in {self.folder}, without running TE's package __init__{why}"


@dataclass(frozen=True)
class TEInfo:
    """The loaded fused CE: its release, where it came from, ``CrossEntropyFunction.forward``'s parameter names
    (after ``ctx``) and defaults, and the Function."""

    version: str
    source: Source
    params: tuple[str, ...]
    defaults: dict[str, Any] = field(compare=False)
    function: Any = field(compare=False, repr=False)

    def has(self, param: str) -> bool:
        return param in self.params

    @property
    def release(self) -> Version:
        return Version(self.version)

    @property
    def input_param(self) -> str:
        """The logits' parameter: ``_input`` up to 2.9, ``inp`` from 2.10."""
        return self.params[0]


class LogitsWriteMismatch(RuntimeError):
    """TE wrote into the logits it was given where its declaration says it does not, or did not where it says it
    does (:class:`LogitsWatch`)."""


class TELoadError(RuntimeError):
    """A fused CE file cannot be loaded without TE's package (an import numcheck does not provide)."""


# ---------------------------------------------------------------------------------------------------- loading


def _dist_version_at(folder: Path) -> tuple[str | None, str | None]:
    """The ``transformer-engine`` release whose ``.dist-info`` in ``folder`` lists the fused CE's Triton module, and
    why not when none or several of different releases do (:func:`numcheck.impls.adapters.releases.owning_release`)."""
    module_file = folder / FILES["triton"]
    dists = releases.distributions(DISTRIBUTION, [str(folder)])
    got = releases.owning_release(DISTRIBUTION, module_file, dists)
    if got.version is not None:
        return got.version, None
    if any(releases.owns(d, module_file) for d in dists):  # owners of different releases
        return None, got.note
    return None, (
        f"no {DISTRIBUTION} .dist-info in {folder} lists {FILES['triton']}, so its release (and with it the "
        f"declaration) is unknown: {install_hint(folder)}"
    )


def _owning_version(module_file: Path) -> releases.Release:
    """The release of the installed distribution whose record lists ``module_file`` (an imported TE; its wheel may
    be ``transformer-engine`` or a ``transformer-engine-cu12``-style one)."""
    dists = releases.distributions(lambda n: n.startswith(DISTRIBUTION))
    got = releases.owning_release(DISTRIBUTION, module_file, dists)
    installed = {d.version for d in dists}
    if got.version is None and len(installed) == 1 and not any(releases.owns(d, module_file) for d in dists):
        # A build whose record does not list its files (an editable TE): the one release installed is its own.
        return releases.Release(installed.pop(), f"{module_file} is in no record; the one {DISTRIBUTION} installed")
    return got


def _private_import(owner: str, provided: dict[str, Any], package: str) -> Callable[..., Any]:
    """An ``__import__`` for one privately loaded TE file (``owner``): the names in ``provided`` (and relative
    imports resolving to them against ``package``) give those modules, any other ``transformer_engine`` module
    raises :class:`TELoadError` with the reason, everything else is the ordinary import."""
    real = builtins.__import__

    def chain(name: str, module: Any) -> Any:
        """What ``import a.b.c`` binds (``a``, whose attributes lead to the module)."""
        obj = module
        for part in reversed(name.split(".")[1:]):
            obj = types.SimpleNamespace(**{part: obj})
        return obj

    def imp(name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0) -> Any:
        full = importlib.util.resolve_name("." * level + name, package) if level else name
        if full.split(".")[0] != "transformer_engine":
            return real(name, globals, locals, fromlist, level)
        if full in provided:
            return provided[full] if fromlist else chain(full, provided[full])
        if fromlist and all(f"{full}.{item}" in provided for item in fromlist):  # from package import module
            return types.SimpleNamespace(**{item: provided[f"{full}.{item}"] for item in fromlist})
        raise TELoadError(
            f"{owner} imports {full}, which numcheck does not load without TE's package (only torch, "
            f"triton and the fused CE's own modules are): this release's fused CE needs TE installed"
        )

    return imp


def _exec_file(path: Path, role: str, tag: str, provided: dict[str, Any]) -> types.ModuleType:
    """Execute one fused CE file as a private module (named ``_numcheck_te_<tag>.<role>``, not in sys.modules)."""
    name = MODULE_NAMES[role]
    spec = importlib.util.spec_from_file_location(f"_numcheck_te_{tag}.{role}", path)
    if spec is None or spec.loader is None:
        raise TELoadError(f"cannot make a module of {path}")
    module = importlib.util.module_from_spec(spec)
    own = dict(vars(builtins))
    own["__import__"] = _private_import(str(path), provided, name.rpartition(".")[0])
    module.__dict__["__builtins__"] = own
    spec.loader.exec_module(module)
    return module


def _jit_stand_in() -> types.ModuleType:
    """``transformer_engine.pytorch.jit`` as the fused CE of 2.19 on uses it: ``no_torch_dynamo``, the decorator of
    its public ``overwrite_input`` wrapper (TE's disables dynamo except during ONNX export; its module needs TE's
    core). The adapter never calls that wrapper."""
    module = types.ModuleType("transformer_engine.pytorch.jit")

    def no_torch_dynamo(recursive: bool = True, when: Any = None) -> Callable[[Any], Any]:
        """:func:`torch._dynamo.disable` (``when``, a condition TE may pass, is not used by the fused CE)."""
        return lambda f: torch._dynamo.disable(f, recursive=recursive)

    module.no_torch_dynamo = no_torch_dynamo  # type: ignore[attr-defined]
    return module


def load_files(folder: Path) -> tuple[Any, str]:
    """``CrossEntropyFunction`` and the release, from the files under ``folder``; :class:`TELoadError` or
    ``FileNotFoundError`` naming what is missing."""
    missing = [rel for role, rel in FILES.items() if role != "common" and not (folder / rel).is_file()]
    if missing:
        raise FileNotFoundError(f"{folder} has no {', '.join(missing)}")
    version, why = _dist_version_at(folder)
    if version is None:
        raise TELoadError(why or "unknown release")
    tag = "".join(c if c.isalnum() else "_" for c in f"{version}_{zlib.crc32(str(folder.resolve()).encode()):08x}")
    provided: dict[str, Any] = {}
    if (folder / FILES["common"]).is_file():
        provided[MODULE_NAMES["common"]] = _exec_file(folder / FILES["common"], "common", tag, {})
    provided[MODULE_NAMES["triton"]] = _exec_file(folder / FILES["triton"], "triton", tag, dict(provided))
    provided["transformer_engine.pytorch.jit"] = _jit_stand_in()
    api = _exec_file(folder / FILES["api"], "api", tag, provided)
    function = getattr(api, "CrossEntropyFunction", None)
    if function is None:
        raise TELoadError(f"{folder / FILES['api']} defines no CrossEntropyFunction")
    return function, version


def _triton_ready() -> str | None:
    """Why TE's Triton kernels cannot run in this process, or ``None`` (as for Liger: CUDA, or the interpreter asked
    for before triton was imported)."""
    if importlib.util.find_spec("triton") is None:
        return "triton is not installed"
    return interpreter.unready_reason("TE's")


def locate() -> tuple[Source | None, list[str]]:
    """The source :func:`load` uses and the notes on the ones passed over (in order: ``$NUMCHECK_TE_DIR`` alone when
    set; else ``import transformer_engine.pytorch``; else the files of an importable but incomplete
    ``transformer_engine``; else :func:`default_dir`)."""
    notes: list[str] = []
    env = os.environ.get(ENV_DIR, "").strip()
    if env:
        return Source("files", str(Path(env).expanduser())), notes
    spec = importlib.util.find_spec("transformer_engine")
    if spec is not None and spec.submodule_search_locations:
        package_dir = Path(list(spec.submodule_search_locations)[0])
        try:
            importlib.import_module("transformer_engine.pytorch")
            return Source("import", str(package_dir.parent)), notes
        except Exception as exc:  # noqa: BLE001 - whatever TE raises without its core
            first = (str(exc).strip().splitlines() or [""])[0][:200]
            failed = f"import transformer_engine.pytorch failed ({type(exc).__name__}: {first})"
            if (package_dir.parent / FILES["triton"]).is_file():
                return Source("files", str(package_dir.parent), note=failed), notes
            notes.append(failed)
    if (default_dir() / FILES["triton"]).is_file():
        return Source("files", str(default_dir())), notes
    notes.append(
        f"transformer_engine is not importable, {ENV_DIR} is unset and {default_dir()} holds no "
        f"{FILES['triton']}: {install_hint()}"
    )
    return None, notes


@functools.lru_cache(maxsize=None)
def load_from(source: Source) -> TEInfo | str:
    """The fused CE from ``source``, or the reason it cannot be used (cached per process)."""
    why = _triton_ready()
    if why:
        return why
    try:
        if source.how == "import":
            from transformer_engine.pytorch.cross_entropy import CrossEntropyFunction as function

            module_file = Path(sys.modules[function.__module__].__file__ or "")
            owner = _owning_version(module_file)
            version = owner.version
            if version is None:
                return f"TransformerEngine imported from {source.folder}, but its release is unknown: {owner.note}"
        else:
            function, version = load_files(Path(source.folder))
    except Exception as exc:  # noqa: BLE001 - one reason, whatever the release raises
        return f"TransformerEngine's fused CE from {source.describe()} cannot be loaded: {type(exc).__name__}: {exc}"
    try:
        if Version(version) < OLDEST:
            return f"TransformerEngine {version} predates the fused CE numcheck knows (from {OLDEST})"
    except InvalidVersion:
        return f"TransformerEngine's release {version!r} is not a version numcheck can key a declaration on"
    names, defaults = forward_parameters(function)
    return TEInfo(version=version, source=source, params=names, defaults=defaults, function=function)


def load() -> TEInfo | str:
    """TE's fused CE as this process finds it (:func:`locate`), or the reason it is unavailable."""
    source, notes = locate()
    if source is None:
        return "; ".join(notes)
    info = load_from(source)
    if isinstance(info, str) and notes:
        return info + " (" + "; ".join(notes) + ")"
    return info


def release_info() -> releases.Release | None:
    """The release of the fused CE this process finds, as :mod:`numcheck.impls.adapters.releases` reads it:
    ``None`` when no TE files or module are found; an unknown release (with the reason) when files are there but no
    single release lists them."""
    source, _ = locate()
    if source is None:
        return None
    info = load_from(source)
    if not isinstance(info, str):
        return releases.Release(info.version)
    if source.how == "files" and (Path(source.folder) / FILES["triton"]).is_file():
        version, why = _dist_version_at(Path(source.folder))
        return releases.Release(version, why)
    return None


def release() -> str | None:
    """The loaded release, or ``None`` when TE is unavailable here (known divergences key on it)."""
    info = load()
    return None if isinstance(info, str) else info.version


# ------------------------------------------------------------------------------------- interpreter artifact


@functools.lru_cache(maxsize=None)
def interpreter_bf16_constant() -> float | str | None:
    """Under Triton's interpreter, what a one-line kernel storing ``x + 1.5`` for a bf16 ``x = 0.25`` returns (1.75
    when the interpreter is right; the error it raises, as text, when it cannot run it: triton 3.2's has no bf16
    constants at all), or ``None`` when kernels run compiled or cannot run."""
    if not interpreter.active() or _triton_ready() is not None:
        return None
    import triton
    import triton.language as tl

    @triton.jit
    def add_constant(X):  # noqa: ANN001 - a Triton kernel
        tl.store(X, tl.load(X) + 1.5)

    x = torch.tensor([0.25], dtype=torch.bfloat16)
    try:
        add_constant[(1,)](x)
    except Exception as exc:  # noqa: BLE001 - whatever the interpreter raises is the answer
        return f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:160]}"
    return float(x.item())


#: Releases whose ``reduce_loss=False`` kernel adds a Python-float constant to a bf16 value (module docstring).
INTERPRETER_BF16_CONSTANT = (Version("2.5.0"), Version("2.18.0"))


def interpreter_limits(info: TEInfo, reduce_loss: bool) -> dict[str, str]:
    """What cannot be judged under this process's interpreter for ``info``'s release (``{"bfloat16": reason}``),
    from the release's kernel and :func:`interpreter_bf16_constant`; empty when compiled."""
    lo, hi = INTERPRETER_BF16_CONSTANT
    if reduce_loss or not lo <= info.release < hi:
        return {}
    got = interpreter_bf16_constant()
    if got is None or got == 1.75:
        return {}
    import triton

    shown = f"gives 0.25 + 1.5 = {got:.3g}" if isinstance(got, float) else f"raises {got}"
    return {
        "bfloat16": (
            f"interpreter artifact, not a TE defect: under Triton {triton.__version__}'s interpreter a bf16 value plus a "
            f"Python float constant is wrong (a one-line kernel {shown}), and TE {info.version}'s reduce_loss=False "
            f"kernel adds -(1 - label_smoothing) to the bf16 gradient it keeps in the logits buffer, so that kernel's bf16 "
            f"gradients are garbage here (~1e37 with triton 3.9); compiled on CUDA the release is judged "
            f"(tools/gpu/te_releases.sh)"
        )
    }


# ---------------------------------------------------------------------------------------------- declaration


def writes_logits(info: TEInfo, overwrite_input: bool) -> Writes:
    """Where ``info``'s release writes into the logits it is given (:data:`WRITES`; module docstring)."""
    if info.has("overwrite_input"):
        return "backward" if overwrite_input else None
    return "forward" if info.release < Version("2.18.0") else None


def signature_gaps(info: TEInfo, overwrite_input: bool) -> dict[str, str]:
    """Each feature ``info``'s Function has no parameter for, with the reason."""

    def no(param: str) -> str:
        return f"TE {info.version}'s CrossEntropyFunction.forward has no {param} parameter"

    gaps: dict[str, str] = {}
    if not info.has("ignore_idx"):
        gaps["ignore_index"] = no("ignore_idx") + " (every row counts)"
    if overwrite_input and not info.has("overwrite_input"):
        gaps["overwrite_input"] = no("overwrite_input") + (
            " (it writes the gradient into the logits in forward anyway)" if writes_logits(info, False) else ""
        )
    return gaps


@dataclass(frozen=True)
class Declaration:
    """One TE impl's declaration: the protocol's (``support``), where TE writes into the logits (``writes``), and
    the notes on what is left out with the reason (shown by ``numcheck list``)."""

    support: LinearCESupport
    writes: Writes
    notes: tuple[str, ...]


def _reason(text: str | None) -> str | None:
    """``support.requires`` of a TE impl (module level, so distributed impls pickle)."""
    return text


def _te_requirement(source: Source) -> str | None:
    """Why TE's fused CE from ``source`` cannot run in this process (each rank checks again): it does not load, or
    its kernels fail under the interpreter (:func:`interpreter_failure`)."""
    info = load_from(source)
    return info if isinstance(info, str) else interpreter_failure(source)


@functools.lru_cache(maxsize=None)
def interpreter_failure(source: Source) -> str | None:
    """Under Triton's interpreter, one small fp32 call of the fused CE from ``source`` (forward and backward, once per
    process): the reason when the interpreter itself raises (a Triton feature it lacks), else ``None`` (anything
    else the kernel does is the suite's to judge)."""
    info = load_from(source)
    if isinstance(info, str) or not interpreter.active() or torch.cuda.is_available():
        return None
    z = torch.linspace(-1.0, 1.0, 15).reshape(3, 5).requires_grad_(True)
    y = torch.tensor([0, 4, 2])
    try:
        loss = te_cross_entropy(
            info, writes_logits(info, False), z * 1.0, y, reduce_loss=True, ignore_index=-100, label_smoothing=0.0
        )
        loss.backward()
    except Exception as exc:  # noqa: BLE001 - sorted below
        if type(exc).__name__ != "InterpreterError":
            return None
        import triton

        first = (str(exc).strip().splitlines() or [""])[0][:200]
        return f"TE {info.version}'s kernels fail under Triton {triton.__version__}'s interpreter ({first})"
    return None


def declare(info: TEInfo, reduce_loss: bool, overwrite_input: bool = False) -> Declaration:
    """The declaration of the impl calling ``info``'s release with ``reduce_loss`` and ``overwrite_input``."""
    gaps = signature_gaps(info, overwrite_input)
    notes = [f"{k}: {v}" for k, v in gaps.items()]
    options = {"bias", "label_smoothing"} | ({"ignore_index"} if info.has("ignore_idx") else set())
    dtypes = {"float32", "bfloat16"}
    interpreted = interpreter.active() and not torch.cuda.is_available()
    for dt, why in (interpreter_limits(info, reduce_loss) if interpreted else {}).items():
        dtypes.discard(dt)
        notes.append(f"{dt}: {why}")
    notes.append("float16: TE documents BF16 and FP32 logits only")
    unavailable = gaps.get("overwrite_input")
    support = make_support(
        dtypes=dtypes,
        devices={"cpu"} if interpreted else {"cuda"},
        options=options,
        reductions={"mean"} if reduce_loss else {"none"},
        autocast=(),
        all_ignored="zero" if info.has("ignore_idx") else None,
        grad_accumulation="fp32",
        logits_dtype="compute",
        ce_dtype="float32",
        elementary_error=triton_library_elementary(interpreted, softmax_divides=True),  # exp(x - m) / d, tl.log
        deterministic=True,
        loss_dtype="input",
        slow=interpreted,
        requires=functools.partial(_te_requirement, info.source)
        if unavailable is None
        else functools.partial(_reason, unavailable),
    )
    return Declaration(support=support, writes=writes_logits(info, overwrite_input), notes=tuple(notes))


# ------------------------------------------------------------------------------------------------ the calls


def _bits(t: torch.Tensor) -> torch.Tensor:
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    return t.detach().contiguous().view(ints[t.element_size()])


class LogitsWatch:
    """Checks one call's logits against the declaration ``writes``: after forward (a change is allowed only for
    ``"forward"``) and when their gradient arrives in backward (it must be the logits' own storage for a declared
    write, and the logits unchanged without one). Raises :class:`LogitsWriteMismatch` naming the release."""

    def __init__(self, logits: torch.Tensor, writes: Writes, label: str) -> None:
        self.logits = logits
        self.writes = writes
        self.label = label
        self.before = _bits(logits).clone() if writes != "forward" else None

    def _changed(self) -> int:
        return 0 if self.before is None else int((_bits(self.logits) != self.before).sum())

    def _mismatch(self, what: str) -> LogitsWriteMismatch:
        return LogitsWriteMismatch(f"{self.label} {what}, but its declaration says it {WRITES[self.writes]}")

    def after_forward(self) -> None:
        changed = self._changed()
        if changed and self.writes != "forward":
            raise self._mismatch(
                f"changed {changed} of {self.logits.numel()} elements of the logits it was given during forward"
            )

    def on_gradient(self, grad: torch.Tensor) -> None:
        aliased = grad.untyped_storage().data_ptr() == self.logits.untyped_storage().data_ptr()
        if self.writes is None:
            changed = self._changed()
            if aliased or changed:
                raise self._mismatch(
                    "returned the gradient of the logits in the logits' own storage"
                    if aliased
                    else f"changed {changed} of {self.logits.numel()} elements of the logits it was "
                    f"given during backward"
                )
        elif not aliased:
            raise self._mismatch("returned the gradient of the logits in a buffer of its own, leaving the logits")
        self.before = None


def te_cross_entropy(
    info: TEInfo,
    writes: Writes,
    logits: torch.Tensor,
    target: torch.Tensor,
    *,
    reduce_loss: bool,
    ignore_index: int,
    label_smoothing: float,
    group: Any = None,
    overwrite_input: bool = False,
    label: str = "TransformerEngine",
) -> torch.Tensor:
    """TE's Function on ``logits`` [N, V] (viewed as [1, N, V]) and ``target`` [N], its arguments in the release's
    order; the loss reshaped to () (``reduce_loss``) or [N]. The logits are watched (:class:`LogitsWatch`)."""
    N, V = logits.shape
    z = logits.view(1, N, V)
    watch = LogitsWatch(z, writes, f"{label} (TransformerEngine {info.version})")
    if z.requires_grad:
        z.register_hook(watch.on_gradient)
    given: dict[str, Any] = {
        info.input_param: z,
        "target": target.view(1, N),
        "label_smoothing": float(label_smoothing),
        "reduce_loss": bool(reduce_loss),
        "dist_process_group": group,
    }
    if info.has("ignore_idx"):
        given["ignore_idx"] = int(ignore_index)
    elif bool((target == ignore_index).any()):
        raise ValueError(
            f"TE {info.version}'s CrossEntropyFunction has no ignore_idx, and target holds ignore_index={ignore_index}"
        )
    if info.has("overwrite_input"):
        given["overwrite_input"] = bool(overwrite_input)
    elif overwrite_input:
        raise ValueError(f"TE {info.version}'s CrossEntropyFunction has no overwrite_input")
    args = positional_args(info.params, info.defaults, given, f"TE {info.version}'s CrossEntropyFunction.forward")
    loss = info.function.apply(*args)
    watch.after_forward()
    return loss.reshape(()) if reduce_loss else loss.reshape(N)


def _check_reduction(name: str, reduce_loss: bool, reduction: str) -> None:
    want = "mean" if reduce_loss else "none"
    if reduction != want:
        raise ValueError(f"{name} is TE's reduce_loss={reduce_loss}, reduction={want!r} only; got {reduction!r}")


def call_linear_ce(
    info: TEInfo,
    name: str,
    writes: Writes,
    reduce_loss: bool,
    overwrite_input: bool,
    x: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    reduction: str = "mean",
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
) -> torch.Tensor:
    """The linear+CE face: ``F.linear`` in the input dtype, then TE's Function (module docstring)."""
    _check_reduction(name, reduce_loss, reduction)
    logits = F.linear(x, weight, bias.to(weight.dtype) if bias is not None else None)
    return te_cross_entropy(
        info,
        writes,
        logits,
        target,
        reduce_loss=reduce_loss,
        ignore_index=ignore_index,
        label_smoothing=label_smoothing,
        overwrite_input=overwrite_input,
        label=name,
    )


#: Linear+CE variants: name -> (reduce_loss, overwrite_input).
VARIANTS: dict[str, tuple[bool, bool]] = {
    "te_parallel_ce[mean]": (True, False),
    "te_parallel_ce[none]": (False, False),
    "te_parallel_ce[mean,overwrite_input]": (True, True),
}
#: Distributed variants: name -> reduce_loss.
DIST_VARIANTS: dict[str, bool] = {"te_vocab_parallel[mean]": True, "te_vocab_parallel[none]": False}


def describe(info: TEInfo, decl: Declaration, reduce_loss: bool, overwrite_input: bool) -> str:
    """The impl's line in ``numcheck list``: release, how it was loaded, where Triton runs, what it writes, notes."""
    where = "Triton interpreter on CPU" if decl.support.devices == frozenset({"cpu"}) else "compiled Triton on CUDA"
    flags = f"reduce_loss={reduce_loss}" + (", overwrite_input=True" if overwrite_input else "")
    text = (
        f"TransformerEngine {info.version} CrossEntropyFunction({flags}) after F.linear in the input dtype; "
        f"loaded: {info.source.describe()}; {where}; declared: {WRITES[decl.writes]}"
    )
    return text + ("; not declared here: " + "; ".join(decl.notes) if decl.notes else "")


def _unavailable(name: str, reason: str) -> FunctionImpl:
    return FunctionImpl(
        name=name,
        fn=unavailable_fn(name, reason),
        support=unavailable_support(reason, ["mean" if VARIANTS[name][0] else "none"]),
        description=f"TransformerEngine fused CE — unavailable: {reason}",
    )


def build_impl(name: str, reduce_loss: bool, overwrite_input: bool, info: TEInfo | str | None = None) -> FunctionImpl:
    """The linear+CE impl ``name`` for ``info``'s release (default: :func:`load`'s); unavailable with the reason
    when TE cannot be used here or the release lacks ``overwrite_input``."""
    info = load() if info is None else info
    if isinstance(info, str):
        return _unavailable(name, info)
    decl = declare(info, reduce_loss, overwrite_input)
    fn = functools.partial(call_linear_ce, info, name, decl.writes, reduce_loss, overwrite_input)
    return FunctionImpl(
        name=name, fn=fn, support=decl.support, description=describe(info, decl, reduce_loss, overwrite_input)
    )


def te_impls() -> list[FunctionImpl]:
    """The linear+CE impls (:data:`VARIANTS`), each unavailable with the reason where it cannot run here."""
    return [build_impl(name, *flags) for name, flags in VARIANTS.items()]


# ----------------------------------------------------------------------------------------- distributed face


class TEVocabParallel(VocabShardImpl):
    """TE's fused CE with ``dist_process_group`` behind the distributed protocol (module docstring). Pickled to the
    ranks by its fields; each rank loads the fused CE from the same :class:`Source` (cached per process)."""

    kind = DIST_KIND
    takes = frozenset({"label_smoothing"})
    upcast = False

    def __init__(self, name: str, reduce_loss: bool, info: TEInfo | str | None = None) -> None:
        info = load() if info is None else info
        self.name = name
        self.reduce_loss = reduce_loss
        self.dist = DistSupport(
            uneven_vocab=False,
            smoothing="torch",
            deterministic=True,
            grad_x_reduce_dtype="input",
            world_sizes=(1, 2, 4),
            backends=("gloo", "nccl"),
        )
        if isinstance(info, str):
            self.source: Source | None = None
            self.writes: Writes = None
            self.support = unavailable_support(info, ["mean" if reduce_loss else "none"])
            self.description = f"TransformerEngine fused CE, dist_process_group — unavailable: {info}"
            return
        decl = declare(info, reduce_loss)
        self.source = info.source
        self.writes = decl.writes
        self.support = decl.support
        self.description = describe(info, decl, reduce_loss, False).replace(
            "after F.linear", "with dist_process_group, after each rank's F.linear of its vocabulary shard"
        )

    def __repr__(self) -> str:
        return f"TEVocabParallel({self.name!r})"

    def input_for_shard(self, x: torch.Tensor, group: Any) -> torch.Tensor:
        """x as the built-in's ranks take it (:class:`CopyToRanks`: grad_x all-reduced in x's dtype)."""
        return CopyToRanks.apply(x, group)

    def shard_loss(
        self, logits: torch.Tensor, target: torch.Tensor, o: CEOptions, *, group: Any, vocab_start: int, vocab_size: int
    ) -> torch.Tensor:
        """TE's Function over ``group`` on this rank's logits shard, in the inputs' dtype (the loss is every
        rank's)."""
        _check_reduction(self.name, self.reduce_loss, o.reduction)
        if self.source is None:
            raise RuntimeError(f"{self.name} unavailable: {self.support.unavailable_reason()}")
        info = load_from(self.source)
        if isinstance(info, str):
            raise RuntimeError(f"{self.name} unavailable in this rank: {info}")
        P, r, rows = dist.get_world_size(group), dist.get_rank(group), logits.shape[1]
        if rows * P != vocab_size or vocab_start != r * rows:
            raise ValueError(
                f"{self.name}: TE needs equal, rank-ordered vocabulary shards; rank {r} of {P} got "
                f"classes {vocab_start}..{vocab_start + rows - 1} of {vocab_size}"
            )
        return te_cross_entropy(
            info,
            self.writes,
            logits,
            target,
            reduce_loss=self.reduce_loss,
            ignore_index=o.ignore_index,
            label_smoothing=o.label_smoothing,
            group=group,
            label=self.name,
        )


def te_dist_impls() -> list[TEVocabParallel]:
    """The distributed impls (:data:`DIST_VARIANTS`), unavailable with the reason where TE cannot run here."""
    info = load()
    return [TEVocabParallel(name, reduce_loss, info) for name, reduce_loss in DIST_VARIANTS.items()]
