"""Every torchao release with ``Float8LinearConfig.from_recipe_name`` (0.9.0 on; 0.8.0 and earlier have only
``recipe_name_to_linear_config`` with other recipe names), judged by numcheck on the CPU beside torch 2.13: the
versions table ``torchao_releases.txt`` beside this file is this script's output.

For each release (a folder holding ``pip install --no-deps --target FOLDER torchao==X``), in fresh processes with
this checkout and then that folder first on ``PYTHONPATH`` (ahead of any installed torchao):

1. the declaration of each ``torchao_float8[...]`` impl as registered here (emulated, CPU), and as it would be on a
   CUDA device of capability 8.9+ (the release's real path read by :func:`numcheck.impls.adapters.torchao.real_path`
   on the CPU: which input dtypes its ``_scaled_mm`` GEMMs keep), or the reason it is unavailable (a release that
   does not import beside torch 2.13 is a row with that reason);
2. every known divergence's example (:data:`numcheck.properties.fp8.known_torchao.TORCHAO_KNOWN`) run by the
   accuracy property: ``diverges`` or ``passes`` on this release, and whether the entry's release range covers it
   (the range must cover exactly the releases where it diverges: the last column says ``ok`` or what is wrong); a
   CUDA entry's example (CUDA's real path) is "not run" here;
3. the FP8 property suite on the three impls (``pytest --pyargs numcheck.tests.suite --impl torchao_float8[...]``):
   passed / failed / skipped and each failure's first line;
4. ``numcheck report --quick`` on the three impls: its verdict line.

Releases whose ``torchao/float8`` files are byte-identical (0.14.0/0.14.1, 0.16.0/0.17.0) run steps 3 and 4 once
and share the verdict (marked with the release it ran on); steps 1 and 2 run for each.

The first line printed names the numcheck code the rows are judged by: the content hash of the adapter's module and
its known-divergence module (:data:`ADAPTER_CODE`, hashed by ``_releases.py`` as every release table is). A CI test
(``tests/self/test_ci_evidence.py``) fails when the committed table's hash differs from the checkout's: rerun this
script then and commit its output.

Usage:
  python docs/evidence/torchao_releases.py --install DIR     # pip install --no-deps --target DIR/X, 0.9.0 on
  python docs/evidence/torchao_releases.py DIR [--only 0.9.0,0.18.0] [-n 2] > docs/evidence/torchao_releases.txt
DIR holds one folder per release, named by its version (about 50 MB each unpacked; the wheels are 3-7 MB).
"""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from fnmatch import fnmatch
from pathlib import Path

from packaging.version import Version

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _releases import (  # noqa: E402 - the release tables' shared mechanics (docs/evidence/ is no package)
    ROOT,
    adapter_code_hash,
    install,
    junit,
    machine,
    release_env,
    releases_in,
    run,
    sweep_parser,
)

OLDEST = Version("0.9.0")
#: The numcheck code a row is judged by: the adapter and its known-divergence module.
ADAPTER_CODE = ("impls/adapters/torchao.py", "properties/fp8/known_torchao.py")
IMPLS = ("torchao_float8[tensorwise]", "torchao_float8[rowwise]", "torchao_float8[rowwise_with_gw_hp]")
_NOISE = ("Failed to load", "register_constant", "Skipping import of cpp extensions", "is an Enum subclass")


def files_hash(folder: Path) -> str:
    """SHA-256 over ``torchao/float8``'s Python files of the release in ``folder`` (paths and contents)."""
    h = hashlib.sha256()
    for f in sorted((folder / "torchao" / "float8").rglob("*.py")):
        h.update(f.relative_to(folder).as_posix().encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def _env(folder: Path) -> dict[str, str]:
    return release_env(ROOT, folder)


def _clean(text: str) -> list[str]:
    return [ln for ln in text.strip().splitlines() if ln.strip() and not any(n in ln for n in _NOISE)]


def here() -> dict[str, object]:
    """Steps 1 and 2 in this process (the release first on the path)."""
    from numcheck.impls.adapters import torchao as tao
    from numcheck.properties.fp8.known_torchao import TORCHAO_KNOWN

    info = tao.load()
    rec: dict[str, object] = {"release": tao.release(), "reason": info if isinstance(info, str) else None}
    if not isinstance(info, str):
        import torchao

        rec["imported"] = str(Path(torchao.__file__).parent)
    decl = {}
    for name in tao.RECIPE_NAMES:
        cpu, cuda = tao.torchao_impl(name, where=("cpu", True)), tao.torchao_impl(name, where=("cuda", False))
        why = cpu.support.unavailable_reason()
        decl[name] = {"unavailable": why} if why else {"cpu": cpu.description, "cuda": cuda.description}
    rec["declared"] = decl
    known = []
    for entry in TORCHAO_KNOWN:
        known.append({"summary": entry.summary, "covered": entry.releases.hold(), **_example(entry, info)})
    rec["known"] = known
    return rec


def _example(entry, info) -> dict[str, str]:
    """Run ``entry``'s example by the accuracy property on the impl of its pattern declaring its recipe, or, where
    this release declares another recipe for that impl (0.9.0-0.11.0's rowwise_with_gw_hp: fp32 scales), on that
    impl with the example's recipe replaced by the declared one."""
    import dataclasses

    from numcheck.errors import PropertyFailure
    from numcheck.impls.adapters import torchao as tao
    from numcheck.properties.core.runner import judge
    from numcheck.properties.fp8 import props

    if isinstance(info, str):
        return {"result": "not run"}
    if "cpu" not in entry.devices:  # a CUDA entry's example needs CUDA's real path
        return {"result": f"not run (a {', '.join(entry.devices)} entry)"}
    impls = [i for i in tao.torchao_impls() if fnmatch(i.name, entry.impls) and not i.support.unavailable_reason()]
    same = [i for i in impls if entry.example.recipe in i.support.recipes]
    impl = (same or impls or [None])[0]
    if impl is None:
        return {"result": "not run"}
    case = entry.example if same else dataclasses.replace(entry.example, recipe=impl.support.recipes[0])
    note = "" if same else f" (on its recipe {case.recipe.name})"
    try:
        judge(props.accuracy, impl, case)
        return {"result": "passes" + note}
    except PropertyFailure:
        return {"result": "diverges" + note}


def _suite(env: dict[str, str], jobs: int, tmp: Path, release: str) -> dict[str, object]:
    """Steps 3 and 4."""
    impl_args = [a for name in IMPLS for a in ("--impl", name)]
    xml = tmp / "suite.xml"
    pytest = [sys.executable, "-m", "pytest", "-p", "no:randomly", "-p", "no:cacheprovider", "-q", "-n", str(jobs)]
    rc, out, s = run([*pytest, "--pyargs", "numcheck.tests.suite", *impl_args, f"--junitxml={xml}"], env, 3600)
    suite = {"rc": rc, "seconds": round(s), **junit(xml), "release": release}
    report = [sys.executable, "-m", "numcheck.reports.cli", "report", "--quick", "--no-progress", "--no-plots"]
    rc, out, s = run([*report, *impl_args, "--out", str(tmp / "report")], env, 3600)
    suite["report"] = {"rc": rc, "seconds": round(s), "last": (_clean(out) or ["(no output)"])[-1]}
    return suite


def judge_release(folder: Path, jobs: int, carried: dict[str, object] | None) -> dict[str, object]:
    env = _env(folder)
    rc, out, _ = run([sys.executable, __file__, "--here"], env, 900)
    lines = _clean(out)
    rec: dict[str, object] = {"files": files_hash(folder)}
    try:
        rec.update(json.loads(lines[-1]))
    except (IndexError, json.JSONDecodeError):
        rec["reason"] = f"--here failed (exit {rc}): " + " | ".join(lines[-3:])
    if rec.get("reason") is None:
        with tempfile.TemporaryDirectory() as tmp:
            rec["suite"] = carried if carried is not None else _suite(env, jobs, Path(tmp), folder.name)
    return rec


def _declared(rec: dict[str, object]) -> tuple[str, str]:
    """The cpu recipes (by numcheck name) and what the CUDA declaration leaves out."""
    decl: dict = rec.get("declared") or {}  # type: ignore[assignment]
    cpu, cuda = [], []
    for name, d in decl.items():
        if "unavailable" in d:
            cpu.append(f"{name}: unavailable")
            continue
        cpu.append(d["cpu"].split(": ")[1])
        left = d["cuda"].split("torch._scaled_mm on cuda")[1].split(":")[0].strip(" ()")
        cuda.append(f"{name}: {left or 'float32, bfloat16'}")
    return ", ".join(cpu), "; ".join(cuda)


def _known_cell(rec: dict[str, object]) -> str:
    cells = []
    for i, k in enumerate(rec.get("known") or []):  # type: ignore[union-attr]
        ok = k["result"].startswith("diverges") == k["covered"] or k["result"].startswith("not run")
        cells.append(f"K{i + 1} {k['result']}{'' if ok else ' (range wrong)'}")
    return ", ".join(cells) or "—"


def render(results: dict[str, dict[str, object]], code: str, argv: list[str]) -> str:
    first = next((r for r in results.values() if r.get("known")), None)
    lines = [
        f"# python docs/evidence/torchao_releases.py {' '.join(argv)}   (adapter code {code}: "
        f"{', '.join(ADAPTER_CODE)}; CPU, emulated; {machine()})",
        "",
        "Known divergences (K1..): "
        + "; ".join(f"K{i + 1} {k['summary']}" for i, k in enumerate(first["known"] if first else [])),  # type: ignore[index]
        "",
        "| release | torchao/float8 files (sha256) | declared on the CPU (emulated) | CUDA 8.9+ real path: input dtypes "
        "kept | known-divergence examples | suite (passed/failed/skipped) | report --quick |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for v in sorted(results, key=Version):
        r = results[v]
        if r.get("reason"):
            lines.append(f"| {v} | {r['files']} | unavailable: {r['reason']} | — | — | — | — |")
            continue
        cpu, cuda = _declared(r)
        suite: dict = r["suite"]  # type: ignore[assignment]
        ran = suite.get("release")
        carried = f", run on {ran}: the same files" if ran != v else ""
        rep = suite["report"]
        lines.append(
            f"| {v} | {r['files']} | {cpu} | {cuda} | {_known_cell(r)} | {suite['passed']}/{suite['failed']}/"
            f"{suite['skipped']} ({suite['seconds']} s{carried}) | exit {rep['rc']}: {rep['last']} |"
        )
        for f in suite.get("failures", []):
            lines.append(f"|   | suite FAILED {f} | | | | | |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    ap = sweep_parser(__doc__)
    args = ap.parse_args(argv)
    if args.install:
        return install(args.dir, "torchao", OLDEST)
    releases = releases_in(args.dir, OLDEST, args.only)
    code = adapter_code_hash(ADAPTER_CODE)
    suites: dict[str, dict[str, object]] = {}
    results: dict[str, dict[str, object]] = {}
    for v in releases:
        h = files_hash(args.dir / v)
        print(f"{v}: judging" + (" (suite carried: the same files)" if h in suites else ""), file=sys.stderr)
        results[v] = judge_release(args.dir / v, args.jobs, suites.get(h))
        if "suite" in results[v]:
            suites.setdefault(h, results[v]["suite"])  # type: ignore[arg-type]
    if adapter_code_hash(ADAPTER_CODE) != code:
        raise SystemExit(f"{', '.join(ADAPTER_CODE)} changed while the releases were judged: rerun")
    print(render(results, code, ["DIR", *argv[1:]]))
    bad = any(
        r.get("suite", {}).get("failed") or "range wrong" in _known_cell(r)  # type: ignore[union-attr]
        for r in results.values()
    )
    return 1 if bad else 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--here"]:
        print(json.dumps(here()))
    else:
        sys.exit(main(sys.argv[1:]))
