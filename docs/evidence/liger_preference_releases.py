"""Every Liger-Kernel release with the chunked preference losses judged by the linear-preference suite's properties.

Liger added ``LigerFusedLinear{DPO,ORPO,CPO,SimPO}Function`` in 0.5.0 and ``LigerFusedLinearKTOFunction`` in 0.5.3
(``liger_kernel/chunked_loss/``). Releases whose preference files are byte-identical (the two bases
``fused_linear_preference.py`` and ``fused_linear_unpaired_preference.py`` and the five loss modules, :data:`FILES`)
share a row: the newest of them (the last given) is judged, every other one is imported and its adapters'
declarations compared with the judged one's. For the judged release the script runs, in a fresh process with that release first on
``PYTHONPATH`` (after this checkout), a fixed set of (property, case) pairs of
:mod:`numcheck.properties.linear_preference.props` on every adapter of
:mod:`numcheck.impls.adapters.liger_preference` (``compiled=False``; the ``_compiled`` twins are CUDA-only) —
accuracy in fp32 (ignored positions, a bias, two chunks, every declared option set), bf16 and fp16, ignored
positions changing nothing, chunk invariance, pair permutation and the options honoured — with each declared
option set only where the release declares it, and prints each verdict with its error/bound. It also calls DPO
with ``loss_type="ipo"`` where the release has a ``loss_type`` (IPO is judged only where a release computes it).
A release the adapter cannot use here (no such loss, an import that fails) is a row with its reason.
``liger_preference_releases.txt`` beside this file is its output on CPU (torch 2.13).

Usage: python docs/evidence/liger_preference_releases.py [DIR ...]
  each DIR a folder holding one release (``pip install --no-deps --target DIR/X liger-kernel==X``), given in
  release order; the literal ``installed`` runs the release installed in this environment.

The first line printed names the numcheck code the rows are judged by: the content hash of the adapter's module
and its known divergences (:data:`ADAPTER_CODE`); ``tests/self/test_ci_evidence.py`` fails when the committed
table's hash differs from the checkout's: rerun this script then and commit its output as
``liger_preference_releases.txt``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _releases import failure_figures  # noqa: E402 - a failing row's figures, named by output
from te_releases import adapter_code_hash  # noqa: E402 - the one content hash the release tables record

#: The numcheck code a row is judged by: the adapter and its known-divergence module.
ADAPTER_CODE = ("impls/adapters/liger_preference.py", "properties/linear_preference/known_liger.py")
#: The files of a release that compute the preference losses (under liger_kernel/chunked_loss/).
FILES = (
    "fused_linear_preference.py",
    "fused_linear_unpaired_preference.py",
    "dpo_loss.py",
    "orpo_loss.py",
    "cpo_loss.py",
    "simpo_loss.py",
    "kto_loss.py",
)
#: (property, case) pairs, the cases as ``PreferenceCase`` keyword arguments; ``options=True`` sets every option the
#: release declares (γ, ε, α, κ) to a value that moves the loss.
CHECKS: tuple[tuple[str, dict], ...] = (
    ("accuracy", dict(P=4, T=5, H=8, V=12, bias=True, beta=1.5, chunk_pairs=2, ignored=0.3, seed=11, options=True)),
    ("accuracy", dict(P=3, T=5, H=8, V=12, beta=0.5, ignored=0.3, seed=10, average_log_prob=False, options=True)),
    ("accuracy", dict(P=3, T=6, H=16, V=40, dtype="bfloat16", beta=0.5, ignored=0.3, seed=12, logit_scale=4.0)),
    ("accuracy", dict(P=2, T=4, H=8, V=24, dtype="float16", beta=2.5, bias=True, seed=13, options=True)),
    ("ignored_positions", dict(P=3, T=5, H=8, V=16, ignored=0.6, seed=14, options=True)),
    ("chunk_invariance", dict(P=4, T=3, H=8, V=16, beta=1.0, seed=15)),
    ("pair_permutation", dict(P=3, T=4, H=8, V=16, beta=1.0, ignored=0.3, seed=16)),
    ("options_honoured", dict(P=2, T=4, H=8, V=16, beta=0.5, seed=17, options=True)),
)
#: The value each declared option takes in a case with ``options=True``.
OPTION_VALUES = {"margin": ("gamma", 0.7), "label_smoothing": ("label_smoothing", 0.2), "nll": ("nll_weight", 0.5)}


def release_files(folder: str) -> Path | None:
    """The release's ``liger_kernel/chunked_loss`` folder (``installed``: the installed package's), or ``None``."""
    if folder == "installed":
        spec = importlib.util.find_spec("liger_kernel")
        base = Path(spec.submodule_search_locations[0]) if spec and spec.submodule_search_locations else None
    else:
        base = Path(folder) / "liger_kernel"
    return base / "chunked_loss" if base is not None and (base / "chunked_loss").is_dir() else None


def files_hash(folder: str) -> str | None:
    """The content hash of the release's :data:`FILES` (a missing file counts as empty), ``None`` without them."""
    where = release_files(folder)
    if where is None or not (where / FILES[0]).is_file():
        return None
    h = hashlib.sha256()
    for name in FILES:
        f = where / name
        h.update(name.encode() + b"\0" + (f.read_bytes() if f.is_file() else b"") + b"\0")
    return h.hexdigest()[:12]


def _name(folder: str) -> str:
    return Path(folder).name


def _run(script: str, folder: str, mode: str) -> subprocess.CompletedProcess:
    extra = [] if folder == "installed" else [folder]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), *extra, os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, script, mode], env=env, capture_output=True, text=True, timeout=1800)


def groups(folders: list[str]) -> list[tuple[str | None, list[str]]]:
    """The folders grouped by :func:`files_hash`, in the order each group's first release comes."""
    out: dict[str | None, list[str]] = {}
    for folder in folders:
        h = files_hash(folder)
        out.setdefault(h if h is not None else f"none:{folder}", []).append(folder)
    return [(None if k.startswith("none:") else k, v) for k, v in out.items()]


def per_release(script: str, folders: list[str]) -> int:
    """One row per group of releases with identical preference files: the newest judged (``--here``), the others
    imported and their declarations compared with its (``--declared``)."""
    from importlib import metadata

    rc = 0
    print(
        f"# python docs/evidence/liger_preference_releases.py {' '.join(map(_name, folders))}   (adapter code "
        f"{adapter_code_hash(ADAPTER_CODE)}: {', '.join(ADAPTER_CODE)}; run from DIR, each release folder made by "
        f"pip install --no-deps --target DIR/X liger-kernel==X; CPU, compiled=False; 'installed' = "
        f"{metadata.version('liger-kernel')})",
        flush=True,
    )
    for digest, members in groups(folders):
        label = f"files {digest}" if digest else "no chunked preference files"
        print(f"== {', '.join(map(_name, members))}   ({label})", flush=True)
        first = _run(script, members[-1], "--here")
        print(first.stdout, end="", flush=True)
        if first.returncode:
            print(first.stderr[-3000:])
            rc = 1
        want = _declarations(first.stdout)
        for other in members[:-1]:
            proc = _run(script, other, "--declared")
            got = _declarations(proc.stdout)
            same = "same declarations, imports" if got == want and not proc.returncode else "DIFFERS"
            print(f"  {_name(other)}: identical files; {same}", flush=True)
            if same == "DIFFERS":
                print(proc.stdout + proc.stderr[-2000:])
                rc = 1
    return rc


def _declarations(out: str) -> list[str]:
    return [ln.split("declared: ", 1)[1] for ln in out.splitlines() if "declared: " in ln]


def case_for(support, fields: dict):
    """The ``PreferenceCase`` of ``fields`` inside ``support``: each option set where declared (``options``), the
    per-sequence reduction one the release takes."""
    from numcheck.properties.linear_preference.cases import PreferenceCase

    fields = dict(fields)
    if fields.pop("options", False):
        for flag, (name, value) in OPTION_VALUES.items():
            if getattr(support, flag):
                fields[name] = value
        if support.reference_point:
            fields["kl"] = 0.7
    if not support.chunking:
        fields.pop("chunk_pairs", None)
    mean = fields.pop("average_log_prob", True)
    return PreferenceCase(average_log_prob=mean if mean in support.average_log_prob else not mean, **fields)


def short(case) -> str:
    """The case's fields that differ from their defaults (a ``PreferenceCase(...)`` call, device left out)."""
    import dataclasses

    diff = [
        f"{f.name}={getattr(case, f.name)!r}"
        for f in dataclasses.fields(case)
        if f.name != "device" and getattr(case, f.name) != f.default
    ]
    return f"PreferenceCase({', '.join(diff)})"


def verdict(check, impl, case) -> str:
    """``PASS (worst error/bound r)``, ``FAIL (error/bound r of <output>: each failing output's figure)``
    (:func:`failure_figures`) or ``RAISED (...)`` of one pair."""
    from numcheck.errors import PropertyFailure

    try:
        metrics = check(impl, case) or {}
    except PropertyFailure as exc:
        lines = [ln.strip() for ln in str(exc).split("\n") if ln.strip()]
        what = next((ln for ln in lines[1:] if "beyond bound" in ln or "changed" in ln or "dropped" in ln), lines[0])
        return f"FAIL ({failure_figures(exc, exc.ratio, what)})"
    except Exception as exc:  # noqa: BLE001 - a row says what the release raised
        return f"RAISED ({type(exc).__name__}: {str(exc)[:160]})"
    worst = max(metrics.values(), default=float("nan"))
    return f"PASS (worst error/bound {worst:.3g})" if metrics else "PASS"


def _impls():
    from numcheck.impls.adapters import liger_preference

    return [i for i in liger_preference.liger_preference_impls() if not i.name.endswith("_compiled]")]


def declared() -> None:
    """Each adapter's declaration under this release (or why it is unavailable), one line each."""
    from numcheck.impls import interpreter

    interpreter.arrange()  # liger_kernel imports its Triton kernels beside the chunked losses
    from numcheck.properties.linear_preference.known_liger import liger_release

    print(f"liger-kernel {liger_release()}")
    for impl in _impls():
        why = impl.support.unavailable_reason()
        text = ("unavailable: " + why) if why else impl.support.describe().replace("\n", "; ")
        print(f"  {impl.name} declared: {text}")


def ipo_line() -> str:
    """What this release's DPO does with ``loss_type="ipo"``: raises, computes, or has no ``loss_type``."""
    import torch

    from numcheck.impls.adapters import liger_preference
    from numcheck.impls.protocols.linear_preference import PreferenceParams

    fn = liger_preference.load("dpo")
    if isinstance(fn, str):
        return f"DPO unavailable ({fn})"
    call = liger_preference.LigerPreference("dpo", fn)
    if "loss_type" not in call.params:
        return "DPO has no loss_type parameter (sigmoid only)"
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(2, 3, 4, generator=g), torch.randn(5, 4, generator=g)
    t = torch.randint(0, 5, (2, 3), generator=g)
    try:
        given = liger_preference._arguments("dpo", call.params, PreferenceParams(), x, w, t, None)
        given["loss_type"] = "ipo"
        fn.apply(*liger_preference.positional_args(call.params, call.defaults, given, fn.__name__))
    except Exception as exc:  # noqa: BLE001 - the row says what the release does
        return f"DPO loss_type='ipo': {type(exc).__name__}: {str(exc)[:150]}"
    return "DPO loss_type='ipo': computes a loss (IPO to be judged: add it to the oracle)"


def here() -> None:
    """Judge the release first on the path: the declarations, then every (property, case) pair."""
    import torch

    from numcheck.properties.linear_preference.known_liger import known
    from numcheck.properties.linear_preference.props import PROPERTIES

    torch.set_num_threads(1)
    declared()
    print(f"  {ipo_line()}")
    for impl in _impls():
        if impl.support.unavailable_reason():
            continue
        for prop, fields in CHECKS:
            case = case_for(impl.support, fields)
            if prop == "chunk_invariance" and not impl.support.chunking:
                print(f"  {impl.name} {prop}: not declared (no chunk_size parameter)", flush=True)
                continue
            line = verdict(PROPERTIES[prop], impl, case)
            entry = known(impl.name, prop, case)
            if entry is not None and not line.startswith("PASS"):
                line += f" — known divergence of {entry.releases.describe()}: {entry.summary}"
            elif entry is not None:
                line += f" — but a known divergence ({entry.releases.describe()}) covers it: the entry is too wide"
            print(f"  {impl.name} {prop} {short(case)}: {line}", flush=True)


if __name__ == "__main__":
    if sys.argv[1:] == ["--here"]:
        here()
    elif sys.argv[1:] == ["--declared"]:
        declared()
    else:
        sys.exit(per_release(__file__, sys.argv[1:] or ["installed"]))
