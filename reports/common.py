"""The floor every ``numcheck`` command stands on: how a command is run (:func:`prepare`, :func:`execute`), the
``--impl``/``--device`` options every command that runs impls takes (:func:`add_impl_arguments`), streaming a child
process's output, writing a folder atomically, and the identity of numcheck's code. Commands import this and the
layers below, never each other.
"""

from __future__ import annotations

import argparse
import codecs
import contextlib
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, TextIO

from numcheck.errors import BadInput

#: The suite modules premerge and the sweep run in a subprocess (``pytest --pyargs ...``), as a user does.
SUITE_MODULES: tuple[str, ...] = ("numcheck.tests.suite",)

__all__ = [
    "BadInput",
    "ImplSpec",
    "SUITE_MODULES",
    "add_impl_arguments",
    "check_impl_spec",
    "device_name",
    "suite_command",
    "code_hash",
    "code_identity",
    "package_files",
    "package_folders",
    "execute",
    "int_at_least",
    "prepare",
    "stream",
    "write_atomically",
]


def suite_command(junit: Path, impls: list[str], jobs: int, *options: str) -> list[str]:
    """``python -m pytest`` on the installed suite (:data:`SUITE_MODULES`) as a user runs it, quiet, no cache, JUnit
    XML to ``junit`` (without captured output), then ``options``, one ``--impl`` per spec and ``-n jobs`` above 1."""
    cmd = [sys.executable, "-m", "pytest", "--pyargs", *SUITE_MODULES, "-q", "-p", "no:cacheprovider"]
    cmd += [f"--junitxml={junit}", "-o", "junit_logging=no", *options]
    for spec in impls:
        cmd += ["--impl", spec]
    return cmd + (["-n", str(jobs)] if jobs > 1 else [])


#: What ``--impl`` takes, in every command.
IMPL_SPEC_HELP = "a built-in name or package.module:attr"


def well_formed_spec(spec: str, attr_is_name: bool = False) -> bool:
    """Whether ``spec`` reads as ``package.module[:attr]``: dotted Python names, with a ``.`` or one ``:``.
    ``attr_is_name``: the part after ``:`` may also be an impl's name (``module:vocab_parallel[nan]``, as a
    distributed failure's repro line names its impl)."""
    module, colon, attr = spec.strip().partition(":")
    if not all(n.isidentifier() for n in module.split(".")):
        return False
    if attr_is_name and colon:
        return bool(attr) and not any(c.isspace() for c in attr)
    return bool(colon or "." in module) and all(n.isidentifier() for n in (attr.split(".") if colon else []))


def check_impl_spec(
    spec: str, names: Callable[[], list[str]], named: str = "a built-in impl's name", attr_is_name: bool = False
) -> str:
    """``spec`` when it can name an impl: one of ``names()`` (read only when needed) or ``package.module[:attr]``
    (:func:`well_formed_spec`). Else :class:`BadInput` naming it, what it is not and what to give instead. (A
    well-formed spec whose module fails to import is a broken impl, reported as such where it loads.)

    >>> check_impl_spec("mypkg.flce:impl", list)
    'mypkg.flce:impl'
    >>> check_impl_spec("eager", lambda: ["eager"])
    'eager'
    """
    if not spec.strip():
        raise BadInput(f"--impl {spec!r} is empty; give a built-in name (numcheck list) or package.module:attr")
    if well_formed_spec(spec, attr_is_name):
        return spec
    known = names()
    if spec in known:
        return spec
    raise BadInput(
        f"--impl {spec!r} is neither {named} ({', '.join(known)}) nor "
        f"package.module:attr (dotted Python names around one ':')"
    )


def builtin_names() -> list[str]:
    """The names of numcheck's built-in impls, sorted: the names ``--impl`` selects (a ``module:attr`` aside)."""
    from numcheck.impls.registry import ImplEntry, builtin_impls

    return sorted(e.name for e in builtin_impls() if isinstance(e, ImplEntry))


def _builtin_named(text: str) -> bool:
    """Whether ``text`` names a built-in impl, building only the factories that make its base."""
    from numcheck.impls.registry import BUILTIN_FACTORIES, ImplEntry, base_name, builtin_impls

    if not any(base_name(text) in bases for _, bases in BUILTIN_FACTORIES):
        return False  # no factory's base: nothing to build (a module:attr spec, a typo)
    return any(isinstance(e, ImplEntry) and e.name == text for e in builtin_impls([text]))


class ImplSpec:
    """The argparse ``type`` of ``--impl``: :func:`check_impl_spec`, the impl names read once per parser.
    ``loaded`` (``numcheck repro``): a name may be any impl's numcheck loads (built-in, ``NUMCHECK_IMPLS``, entry
    points), and ``module:NAME`` names one of the module's impls; an unknown name lists the specs that failed to
    load (one may have been meant to provide it)."""

    def __init__(self, loaded: bool = False) -> None:
        self.loaded = loaded
        self.known: list[str] | None = None
        self.broken: list[str] = []

    def names(self) -> list[str]:
        if self.known is None:
            from numcheck.impls.registry import BrokenImpl, discover

            if not self.loaded:
                self.known = builtin_names()
                return self.known
            entries = discover()
            self.known = sorted(e.name for e in entries if not isinstance(e, BrokenImpl))
            self.broken = [f"{e.spec!r} ({e.origin}): {e.error}" for e in entries if isinstance(e, BrokenImpl)]
        return self.known

    def __call__(self, text: str) -> str:
        named = "the name of an impl numcheck loads" if self.loaded else "a built-in impl's name"
        if not self.loaded and self.known is None and _builtin_named(text):
            return text  # found among its own factory's impls: the others are not built (registry.builtin_factories)
        try:
            return check_impl_spec(text, self.names, named, attr_is_name=self.loaded)
        except BadInput as exc:
            failed = f"; these specs failed to load, one may be it: {'; '.join(self.broken)}" if self.broken else ""
            raise argparse.ArgumentTypeError(str(exc).removeprefix("--impl ") + failed) from None


def device_name(text: str) -> str:
    """The argparse ``type`` of ``--device``: ``text`` when torch reads it as a device (``cpu``, ``cuda``,
    ``cuda:1``, ``meta``; whether one is present here is each command's to say), else a fix-it error."""
    import torch

    try:
        torch.device(text)
    except (RuntimeError, ValueError):
        raise argparse.ArgumentTypeError(f"{text!r} is not a torch device; give cpu, cuda, cuda:N or meta") from None
    return text


def add_impl_arguments(
    p: argparse.ArgumentParser,
    *,
    impls: str = "only these impls",
    default: str = "default: all",
    repeatable: bool = True,
    required: bool = False,
    loaded: bool = False,
    device: str | None = "cpu",
    device_help: str | None = "device to run on (default cpu)",
) -> None:
    """The ``--impl`` and ``--device`` options, the same in every command: each ``--impl`` value checked as it is
    parsed (:class:`ImplSpec`; a bad one is one error naming it and what to give, exit 2, before anything runs),
    ``--device`` read as a torch device (:func:`device_name`). ``impls`` and ``default`` say what the impls are
    for and which run without ``--impl``; ``device_help=None``: no ``--device`` (the command picks its own).

    >>> p = argparse.ArgumentParser()
    >>> add_impl_arguments(p)
    >>> p.parse_args(["--impl", "mypkg.flce:impl", "--device", "cuda:1"])
    Namespace(impl=['mypkg.flce:impl'], device='cuda:1')
    """
    tail = f"{'repeatable; ' if repeatable else ''}{default}" if default else ("repeatable" if repeatable else "")
    p.add_argument(
        "--impl",
        action="append" if repeatable else "store",
        default=[] if repeatable else None,
        type=ImplSpec(loaded),
        required=required,
        metavar="SPEC",
        help=f"{impls}: {IMPL_SPEC_HELP}" + (f" ({tail})" if tail else ""),
    )
    if device_help is not None:
        p.add_argument("--device", type=device_name, default=device, help=device_help)


def prepare() -> None:
    """What every command does before it imports its module: arrange Triton's interpreter where there is no CUDA
    (:func:`numcheck.impls.interpreter.arrange`), and put the current directory at the end of ``sys.path`` so that
    an impl named ``mymod:impl`` in the user's repository imports as it does under ``python -m`` (at the end: an
    installed package of the same name wins)."""
    from numcheck.impls import interpreter

    interpreter.arrange()  # before any command can import triton
    here = os.getcwd()
    if here not in sys.path and "" not in sys.path:
        sys.path.append(here)


def execute(module: Any, args: argparse.Namespace, *, measuring: bool = False) -> int:
    """Run a command module's ``run(args)``: a judging command under numcheck's GEMM precision
    (:mod:`numcheck.properties.core.matmul_precision`), a ``measuring`` one (speed, memory) under the caller's."""
    from numcheck.properties.core import matmul_precision

    pin = contextlib.nullcontext() if measuring else matmul_precision.pinned()
    with pin:
        return int(module.run(args) or 0)


def int_at_least(least: int, message: str) -> Callable[[str], int]:
    """An argparse ``type``: an integer ``>= least``; anything else is refused as ``"{message}, got {text!r}"``."""

    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{message}, got {text!r}") from None
        if v < least:
            raise argparse.ArgumentTypeError(f"{message}, got {text!r}")
        return v

    return parse


def prepare_out_dir(out: Path | str, flag: str = "--out") -> Path:
    """The output folder ``out`` given as ``flag``, created now (with its parents) when missing, so a command refuses
    a folder it cannot create with one clear :class:`BadInput` before it runs anything, not after.

    >>> import tempfile
    >>> prepare_out_dir(Path(tempfile.mkdtemp()) / "new" / "dir").is_dir()
    True
    """
    out = Path(out).expanduser()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BadInput(
            f"{flag} {out}: cannot create that folder ({type(exc).__name__}: {exc.strerror or exc})"
        ) from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise BadInput(f"{flag} {out}: the folder is not writable")
    return out


def write_atomically(
    out: Path, files: dict[str, str | bytes], extra: Any = None, owned: frozenset[str] = frozenset()
) -> None:
    """Write ``files`` (name → text or bytes) into the directory ``out``, atomically (temp dir + rename).

    ``extra``, when given, is called with the temporary directory to add files (plots) before the rename.
    Entries of an existing ``out`` that are neither written now nor named in ``owned`` are carried over into
    the new directory, so writing a report into a folder never deletes what else the folder holds.
    """
    out = out.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        for name, data in files.items():
            (tmp / name).write_bytes(data if isinstance(data, bytes) else data.encode())
        if extra is not None:
            extra(tmp)
        if out.exists():
            for entry in out.iterdir():
                if entry.name in owned or (tmp / entry.name).exists():
                    continue
                if entry.is_dir() and not entry.is_symlink():
                    shutil.copytree(entry, tmp / entry.name, symlinks=True)
                else:
                    shutil.copy2(entry, tmp / entry.name, follow_symlinks=False)
        os.chmod(tmp, 0o755)
        old = None
        if out.exists():
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            out.rename(old)
        try:
            tmp.rename(out)
        except OSError:
            if old is not None:
                old.rename(out)
            raise
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def stream(
    cmd: list[str], *, env: dict[str, str], prefix: str = "  suite | ", sink: TextIO | None = None
) -> tuple[int, list[str]]:
    """Run ``cmd``, copying its output to ``sink`` (stderr) as it comes — pytest's progress characters included, not
    only whole lines — with ``prefix`` at the start of each line; (exit status, the output's lines)."""
    sink = sink if sink is not None else sys.stderr
    chunks: list[str] = []
    at_line_start = True
    with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT) as proc:
        assert proc.stdout is not None
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        while True:
            data = os.read(proc.stdout.fileno(), 4096)
            text = decoder.decode(data, final=not data)
            for piece in text.splitlines(keepends=True):
                sink.write((prefix if at_line_start else "") + piece)
                at_line_start = piece.endswith("\n")
            sink.flush()
            chunks.append(text)
            if not data:
                break
    if not at_line_start:
        sink.write("\n")
    return proc.returncode, "".join(chunks).splitlines()


def package_folders() -> dict[str, Path]:
    """The folder of the imported numcheck package and of each of its subpackages, by name: one tree in a wheel
    (site-packages/numcheck/impls/), the top-level folders in a checkout (impls/: setup.py's ``package_dir``)."""
    import importlib.util

    import numcheck

    folders = {"numcheck": Path(numcheck.__file__).parent}
    for sub in numcheck._SUBPACKAGES:
        spec = importlib.util.find_spec(f"numcheck.{sub}")
        if spec is None or spec.origin is None:
            raise ImportError(f"numcheck.{sub} cannot be found: reinstall numcheck (`pip install -e .` in a checkout)")
        folders[f"numcheck.{sub}"] = Path(spec.origin).parent
    return folders


def _files_under(folder: Path, suffix: str) -> dict[str, Path]:
    """Every file below ``folder`` ending in ``suffix``, by its path relative to ``folder``; ``__pycache__`` and
    hidden folders are skipped."""
    files: dict[str, Path] = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__" and not d.startswith("."))
        files.update(
            (Path(dirpath, f).relative_to(folder).as_posix(), Path(dirpath, f)) for f in filenames if f.endswith(suffix)
        )
    return files


def package_files(suffix: str = ".py") -> dict[str, Path]:
    """Every file of the imported numcheck package ending in ``suffix``, by its path inside the package as a wheel
    installs it (``__init__.py``, ``impls/registry.py``; ``tests/self/test_layers.py`` in a checkout), whichever
    folder holds it (:func:`package_folders`), in path order; ``__pycache__`` and hidden folders are skipped."""
    files: dict[str, Path] = {}
    for name, folder in package_folders().items():
        prefix = "/".join(name.split(".")[1:])
        for rel, path in _files_under(folder, suffix).items():
            files.setdefault(f"{prefix}/{rel}" if prefix else rel, path)  # a wheel's tree is walked twice
    return dict(sorted(files.items()))


def code_hash(root: Path | None = None) -> str:
    """SHA-256 over every ``.py`` file under ``root`` (default: the imported numcheck package, in whichever folders
    hold it: :func:`package_files`): each file's path relative to ``root`` (in the package) and its bytes,
    length-prefixed, in path order; ``__pycache__`` and hidden folders are skipped. Needs no git."""
    files = package_files() if root is None else _files_under(root, ".py")
    digest = hashlib.sha256()
    for rel, path in sorted(files.items()):
        data = path.read_bytes()
        digest.update(len(rel).to_bytes(8, "little") + rel.encode() + len(data).to_bytes(8, "little") + data)
    return digest.hexdigest()


def code_identity() -> dict[str, Any]:
    """What a kept seed's verdicts depend on besides its selection: numcheck's code (:func:`code_hash`) and
    torch's version. A kept seed is reused only when this matches (or under ``--keep-stale``)."""
    import torch

    return {"code": code_hash(), "torch": torch.__version__}


def find_impl(name: str) -> Any:
    """The impl named ``name``: a ``module:attr`` spec (loaded as ``--impl`` loads it, the current directory on
    the path), a built-in, or one loaded through ``NUMCHECK_IMPLS`` / entry points. ValueError saying what was
    found otherwise, including why a ``NUMCHECK_IMPLS`` spec that should have provided it failed to load."""
    from numcheck.impls.registry import BrokenImpl, discover

    if ":" in name:
        loaded = discover([name])
        good = [e for e in loaded if not isinstance(e, BrokenImpl)]
        bad = [e for e in loaded if isinstance(e, BrokenImpl)]
        if bad:
            raise ValueError(f"impl spec {name!r} could not be loaded: {bad[0].error}")
        if len(good) == 1:
            return good[0].impl
        raise ValueError(
            f"impl spec {name!r} yields {len(good)} impls ({[e.name for e in good]}); rerun with "
            f"NUMCHECK_IMPLS={name} and --impl NAME, one of them"
        )
    entries = discover()
    for e in entries:
        if e.name == name:
            if isinstance(e, BrokenImpl):
                raise ValueError(f"impl {name!r} could not be loaded ({e.origin}): {e.error}")
            return e.impl
    names = sorted(e.name for e in entries if not isinstance(e, BrokenImpl))
    broken = [f"{e.spec!r} ({e.origin}): {e.error}" for e in entries if isinstance(e, BrokenImpl)]
    hint = (
        f"; these specs failed to load, one may be it: {'; '.join(broken)}"
        if broken
        else " (an outside impl: --impl module:attr, or NUMCHECK_IMPLS=module:attr)"
    )
    raise ValueError(f"no impl named {name!r}; loaded: {names}{hint}")
