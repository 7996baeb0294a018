"""Every TransformerEngine release with the fused cross-entropy, judged by numcheck: the versions table
``te_releases.txt`` beside this file is this script's output.

For each release (a folder holding ``pip install --no-deps --target FOLDER transformer-engine==X``), in fresh
processes with ``NUMCHECK_TE_DIR=FOLDER`` and this checkout first on ``PYTHONPATH``:

1. ``numcheck list`` of the TE impls: how the fused CE was loaded, the release, the version-specific declaration
   (options, dtypes, where TE writes into the logits, what is left out and why);
2. the property suite on the TE impls, both faces (``pytest --pyargs numcheck.tests.suite --impl te_...``; the
   distributed tests at world sizes 1, 2 and 4 under gloo): passed / failed / skipped and each failure's first line;
3. the strict checks of TE's recorded known divergences (the tests naming TE in
   ``tests/adapters/test_known_divergences.py`` and ``tests/adapters/test_transformer_engine.py``): each entry's
   example still fails on a release inside its range and passes on one outside;
4. with ``--report``, ``numcheck report --grid quick`` on the TE impls: its verdict line.

Releases whose fused-CE files are byte-identical (2.2.0/2.3.0, 2.5.0/2.6.0/2.6.0.post1, 2.8.0/2.9.0, 2.12.0/2.13.0,
2.14.0-2.17.1, 2.19.0/2.20.2) are the same kernels under the same declaration (every release boundary numcheck keys
on falls between such groups, and steps 1 and 3 run for each release and show it): the suite (step 2, the costly
one: ~10 minutes a release on 2 cores) runs once per distinct set of files and the others carry its verdict, marked
with the release it ran on; ``--every`` runs it for each release anyway.

Each release's results are kept as JSON in ``--work`` (default ``/tmp/numcheck-te-releases``) with the content hash
of the adapter's code (:data:`ADAPTER_CODE`: the adapter and its known-divergence modules), so a run cut short
resumes and a changed adapter reruns; the table's first line carries that hash, and a CI test
(``tests/self/test_ci_evidence.py``) fails when the committed table's differs from the checkout's. The table is printed and, with
``--out``, written.

Usage:
  python docs/evidence/te_releases.py --install DIR          # pip install --no-deps --target DIR/X for every release
  python docs/evidence/te_releases.py DIR [--only 2.8.0,2.20.2] [-n 2] [--parallel 1] [--report] [--keep-stale]
                                        [--out docs/evidence/te_releases.txt]
``--parallel K`` judges K releases at once (on a many-core machine); ``--keep-stale`` renders records kept from an
earlier run by other adapter code (the table names their code and the machine each ran on). The GPU machine's CPUs
cannot stand in for this machine's: under its Triton 3.6 interpreter every TE release's kernels fail to run
("TypeError: only 0-dimensional arrays can be converted to Python scalars", measured on all 23 releases), so the
adapter reports them unavailable there.
DIR holds one folder per release, named by its version. ``--install`` asks ``pip index versions transformer-engine``
which releases exist and installs each from 2.2.0 on (the first with the fused CE) into DIR.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
import tempfile
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

OLDEST = Version("2.2.0")
LINEAR = ("te_parallel_ce[mean]", "te_parallel_ce[none]", "te_parallel_ce[mean,overwrite_input]")
DIST = ("te_vocab_parallel[mean]", "te_vocab_parallel[none]")
IMPLS = LINEAR + DIST
KNOWN_TESTS = (
    "tests/adapters/test_known_divergences.py",
    "tests/adapters/test_transformer_engine.py",
)


#: The numcheck code a row of the table is judged by: the adapter's module, the known-divergence modules keyed on
#: TE's release, and the emulation of a kernel's store their predicates use (``kernel_store``).
#: :func:`adapter_code_hash` hashes their contents, in this order, not their paths: a move leaves it alone, an edit
#: changes it (``tests/self/test_ci_evidence.py`` then asks for this tool to be rerun).
ADAPTER_CODE = (
    "impls/adapters/transformer_engine.py",
    "properties/linear_ce/known_te.py",
    "properties/distributed/linear_ce/known.py",
    "properties/core/tensors.py",
)


def _env(folder: Path) -> dict[str, str]:
    return release_env(ROOT, NUMCHECK_TE_DIR=str(folder))


def files_hash(folder: Path) -> str:
    """SHA-256 over the fused CE's files of the release in ``folder`` (those it has)."""
    h = hashlib.sha256()
    for rel in (
        "transformer_engine/pytorch/cross_entropy.py",
        "transformer_engine/pytorch/triton/cross_entropy.py",
        "transformer_engine/common/triton/cross_entropy.py",
    ):
        if (folder / rel).is_file():
            h.update(rel.encode())
            h.update((folder / rel).read_bytes())
    return h.hexdigest()[:16]


_PYTEST = ("-m", "pytest", "-p", "no:randomly", "-p", "no:cacheprovider", "-q")


def _impl_args() -> list[str]:
    return [a for name in IMPLS for a in ("--impl", name)]


def _suite(env: dict[str, str], jobs: int, tmp: Path, release: str) -> dict[str, object]:
    """Step 2: the property suite on the TE impls, both faces."""
    xml = tmp / "suite.xml"
    cmd = [sys.executable, *_PYTEST, "-n", str(jobs), "--pyargs", "numcheck.tests.suite", *_impl_args()]
    rc, out, s = run([*cmd, f"--junitxml={xml}"], env, 5400)
    return {"rc": rc, "seconds": round(s), **junit(xml), "tail": out.strip().splitlines()[-3:], "release": release}


def _known(env: dict[str, str], tmp: Path) -> dict[str, object]:
    """Step 3: the strict checks of TE's recorded known divergences."""
    xml = tmp / "known.xml"
    keyword = "te_parallel_ce or te_vocab_parallel or transformer_engine"
    cmd = [sys.executable, *_PYTEST, "-n", "0", *KNOWN_TESTS, "-k", keyword, f"--junitxml={xml}"]
    rc, out, s = run(cmd, env, 3600)
    return {"rc": rc, "seconds": round(s), **junit(xml), "tail": out.strip().splitlines()[-3:]}


def _report(env: dict[str, str], tmp: Path) -> dict[str, object]:
    """Step 4: ``numcheck report --grid quick`` on the TE impls: its verdict lines."""
    out_dir = str(tmp / "report")
    cmd = [sys.executable, "-m", "numcheck.reports.cli", "report", "--grid", "quick", "--out", out_dir, *_impl_args()]
    rc, out, s = run(cmd, env, 5400)
    return {"rc": rc, "seconds": round(s), "tail": out.strip().splitlines()[-4:]}


def judge(folder: Path, jobs: int, report: bool, suite_of: dict[str, object] | None = None) -> dict[str, object]:
    """Steps 1-4 of the module docstring for the release in ``folder``; ``suite_of``: the suite's record of a release
    with byte-identical files, carried instead of running step 2."""
    env = _env(folder)
    rec: dict[str, object] = {"folder": str(folder), "files": files_hash(folder), "machine": machine()}
    rc, out, _ = run([sys.executable, "-m", "numcheck.reports.cli", "list", *_impl_args()], env, 600)
    rec["list"] = out.strip().splitlines()
    rec["list_rc"] = rc
    with tempfile.TemporaryDirectory() as tmp:
        rec["suite"] = suite_of if suite_of is not None else _suite(env, jobs, Path(tmp), folder.name)
        rec["known"] = _known(env, Path(tmp))
        if report:
            rec["report"] = _report(env, Path(tmp))
    return rec


def _declaration(lines: list[str]) -> dict[str, str]:
    """Per impl, the parts of its ``numcheck list`` entry the table shows."""
    out: dict[str, str] = {}
    name = None
    for ln in lines:
        m = re.match(r"^(te_\S+)\s+\[", ln)
        if m:
            name = m.group(1)
            out[name] = ""
            continue
        if name and ln.startswith("    "):
            out[name] += ln.strip() + "\n"
    return out


def render(results: dict[str, dict[str, object]], code: str) -> str:
    """The versions table and, per release, the declarations and findings."""
    machines = sorted({str(r.get("machine", "machine not recorded")) for r in results.values()})
    codes = sorted({str(r.get("code", "?")) for r in results.values()})
    stale = [c for c in codes if c != code]
    lines = [
        f"# python docs/evidence/te_releases.py DIR   (CPU, Triton interpreter; adapter code {code}: "
        f"{', '.join(ADAPTER_CODE)})",
        "",
        "Judged on: " + "; ".join(machines) + ".",
        "",
        *([f"Records judged by other adapter code (--keep-stale): {', '.join(stale)}.", ""] if stale else []),
        "| release | fused-CE files (sha256) | loaded | writes into the logits | ignore_index | overwrite_input "
        "| suite (passed/failed/skipped) | known-divergence checks | report |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    details = []
    for v in sorted(results, key=Version):
        r = results[v]
        decl = _declaration(r.get("list", []))  # type: ignore[arg-type]
        mean = decl.get("te_parallel_ce[mean]", "")
        loaded = "files" if "loaded: files" in mean else ("import" if "loaded: import" in mean else "?")
        writes = (
            "in forward"
            if "in forward" in mean
            else "no (default); in backward with overwrite_input"
            if "overwrite_input" in decl.get("te_parallel_ce[mean,overwrite_input]", "")
            and "here: runs" in decl.get("te_parallel_ce[mean,overwrite_input]", "")
            else "no"
        )
        ignore = "yes" if "ignore_index" in mean.split("options:", 1)[-1].split(";")[0] else "no"
        ow = "yes" if "here: runs" in decl.get("te_parallel_ce[mean,overwrite_input]", "") else "no"
        suite = r.get("suite", {})
        known = r.get("known", {})
        rep = r.get("report")
        rep_text = "—" if not rep else ("pass" if rep["rc"] == 0 else f"exit {rep['rc']}")  # type: ignore[index]
        ran = suite.get("release")
        carried = f", run on {ran}: the same files" if ran and ran != v else ""
        if suite.get("rc") not in (0, 1):
            carried += f", pytest exit {suite.get('rc')}"
        lines.append(
            f"| {v} | {r.get('files', '?')} | {loaded} | {writes} | {ignore} | {ow} | {suite.get('passed')}/{suite.get('failed')}/"
            f"{suite.get('skipped')} ({suite.get('seconds')} s{carried}) | {known.get('passed')} passed, "
            f"{known.get('failed')} failed, {known.get('skipped')} skipped | {rep_text} |"
        )
        details.append(f"## {v}")
        for name, text in decl.items():
            details.append(f"- {name}: " + text.strip().replace("\n", "\n  "))
        for f in suite.get("failures", []):  # type: ignore[union-attr]
            details.append(f"  - suite FAILED {f}")
        for f in known.get("failures", []):  # type: ignore[union-attr]
            details.append(f"  - known-divergence check FAILED {f}")
        if rep:
            details.append("  - report: " + " | ".join(rep["tail"]))  # type: ignore[index]
        details.append("")
    return "\n".join(lines + [""] + details)


def _kept(work: Path, v: str, code: str, args: argparse.Namespace) -> dict[str, object] | None:
    """The kept record of release ``v`` if it may be reused: judged by this code (any code with ``--keep-stale``),
    with a report if one is asked for, and its suite run on ``v`` itself when ``--every`` asks for that."""
    kept = work / f"{v}.json"
    if not kept.is_file():
        return None
    rec = json.loads(kept.read_text())
    ran_here = rec.get("suite", {}).get("release") == v or not args.every
    fresh = rec.get("code") == code or args.keep_stale
    return rec if fresh and bool(rec.get("report")) >= args.report and ran_here else None


def _judge_and_keep(
    folder: Path, args: argparse.Namespace, code: str, same: dict[str, object] | None
) -> dict[str, object]:
    v = folder.name
    print(
        f"{v}: judging" + (f" (suite carried from {same['release']}: the same files)" if same else "") + " ...",
        flush=True,
    )
    rec = judge(folder, args.jobs, args.report, suite_of=same)
    rec["code"] = code
    (args.work / f"{v}.json").write_text(json.dumps(rec, indent=1))
    suite: dict = rec["suite"]  # type: ignore[assignment]
    print(f"{v}: suite {suite['passed']}/{suite['failed']}/{suite['skipped']} in {suite['seconds']} s", flush=True)
    return rec


def judge_all(releases: list[str], args: argparse.Namespace, code: str) -> dict[str, dict[str, object]]:
    """Every release's record, kept or judged. Two phases, each ``--parallel`` releases at a time: first one release
    per distinct set of fused-CE files runs the suite, then the others carry its suite's record (unless ``--every``)
    and run steps 1, 3 and 4 only."""
    from concurrent.futures import ThreadPoolExecutor

    results: dict[str, dict[str, object]] = {}
    suites: dict[str, dict[str, object]] = {}  # files hash -> the suite's record of a release with those files
    todo: list[str] = []
    for v in sorted(releases, key=Version):
        rec = _kept(args.work, v, code, args)
        if rec is None:
            todo.append(v)
            continue
        print(f"{v}: kept ({args.work / (v + '.json')})", flush=True)
        results[v] = rec
        if rec["suite"].get("release") == v:  # type: ignore[union-attr]
            suites.setdefault(rec["files"], rec["suite"])  # type: ignore[arg-type]
    heads: dict[str, str] = {}
    for v in todo:
        h = files_hash(args.dir / v)
        if args.every or (h not in suites and h not in heads):
            heads[v if args.every else h] = v
    first = list(heads.values())
    with ThreadPoolExecutor(max_workers=max(1, args.parallel)) as pool:
        for rec in pool.map(lambda v: _judge_and_keep(args.dir / v, args, code, None), first):
            results[Path(rec["folder"]).name] = rec  # type: ignore[arg-type]
            suites.setdefault(rec["files"], rec["suite"])  # type: ignore[arg-type]
        rest = [v for v in todo if v not in first]
        carried = [suites.get(files_hash(args.dir / v)) for v in rest]
        for v, rec in zip(
            rest, pool.map(lambda vs: _judge_and_keep(args.dir / vs[0], args, code, vs[1]), zip(rest, carried))
        ):
            results[v] = rec
    return results


def main(argv: list[str]) -> int:
    ap = sweep_parser(__doc__)
    ap.add_argument("--parallel", type=int, default=1, help="releases judged at once (each with -n workers)")
    ap.add_argument("--report", action="store_true", help="also run numcheck report --grid quick")
    ap.add_argument("--every", action="store_true", help="run the suite for every release, identical files or not")
    ap.add_argument(
        "--keep-stale",
        action="store_true",
        help="reuse kept records judged by other adapter code (the table names each record's code)",
    )
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "numcheck-te-releases")
    ap.add_argument("--out", type=Path, help="write the table here too")
    args = ap.parse_args(argv)
    if args.install:
        return install(args.dir, "transformer-engine", OLDEST)
    releases = releases_in(args.dir, OLDEST, args.only)
    code = adapter_code_hash(ADAPTER_CODE)
    args.work.mkdir(parents=True, exist_ok=True)
    results = judge_all(releases, args, code)
    text = render(results, code)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    bad = any(r["suite"]["failed"] or r["known"]["failed"] for r in results.values())  # type: ignore[index]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
