"""``numcheck sweep``: the property suite over several hypothesis seeds — its failures and the bounds' tightness.

For each seed of ``--seeds`` (``0-9``, ``0,3,7`` or ``5``) it runs the installed suite
(:data:`reports.common.SUITE_MODULES`, the impl-parametrized modules) in a subprocess, exactly as a user runs
it — ``python -m pytest --pyargs numcheck.tests.suite`` in the current directory — plus

- ``--hypothesis-profile numcheck-ci-seeded`` (``--profile``; a derandomized profile is refused: every seed would
  draw the same examples) and ``--hypothesis-seed=<seed>``;
- ``--numcheck-record=DIR`` (numcheck's plugin; :mod:`properties.core.records`): every accuracy and strided-inputs
  judgement's error/bound per output, one JSON-lines file per xdist worker;
- ``--junitxml``: pass, fail, error or skip per (test, impl);
- a fresh ``HYPOTHESIS_STORAGE_DIRECTORY`` per seed, so no seed replays another's failing examples from
  hypothesis' example database;
- ``--impl``, ``-k`` and ``-n`` passed through.

It prints (Markdown, stdout; pytest's progress goes to stderr, one prefixed line per seed) every failure of every
seed — test id, impl and the first line of its message, with the case, the first judgement line and the repro
command — the total failure count, and the tightness table: per output × dtype (:func:`properties.core.records.
dtype_label`) the number of judgements, how many were exact (error 0), the median, 90th percentile and maximum of
error/bound under the hard bound, across all impls and seeds (per impl too with ``--per-impl``; always in the JSON).
Non-finite ratios (a NaN or inf where the oracle has none) are failures, counted apart and left out of the
quantiles. ``--compare BASE/sweep.json`` puts a baseline's 90th percentiles beside these and flags every output ×
dtype whose 90th percentile fell by more than :data:`TIGHTNESS_FALL_LIMIT` (a model made right by
loosening it shows there).

The suite cannot know whether an impl is correct: run it on impls believed correct, and every failure is a false
alarm of the model. It writes ``sweep.json`` and ``sweep.md`` into ``--out`` (default
``./numcheck-sweep/<device>-torch<version>/``), replacing the two files of an earlier sweep there and keeping
everything else the folder holds.

Each seed is kept as it finishes, in ``--out``'s ``seeds/seed-<S>.json.gz`` (its verdicts, its judgements'
records, the code and environment it ran on): a sweep cut short (a device call's time limit, a session's
end) keeps its finished seeds, and a later run into the same folder takes those seeds from there instead of
running them again, so one sweep can be assembled from several runs (``--force`` runs every seed afresh). A kept
seed is taken only when it ran on the same code as this run — :func:`code_identity`: a hash of every ``.py`` file
of the imported numcheck package, and torch's version — otherwise it is run again, and the progress output says
why; ``--keep-stale`` takes it anyway, and ``sweep.md`` marks its row with the code it ran on. A seed kept by a
numcheck without this hash counts as stale (code unknown). A seed whose pytest exited 2 (interrupted, or a
collection error) is reported but never kept. The summary lists the code hash and commit each seed ran on.
``--assemble`` runs nothing: it writes the summary of the kept seeds of ``--seeds`` alone (stale ones marked), with
the environment the seeds recorded, so seeds run in several device calls (each with its own output folder) are
joined on another machine: copy their ``seed-<S>.json.gz`` into one ``DIR/seeds/`` and assemble there.

Exit status: 0 when no test failed on any seed (and no 90th percentile fell past the limit under ``--compare``);
1 when any test failed or errored; 2 on bad input (malformed ``--seeds``, an unknown or derandomized profile, a
kept seed of another selection, an unreadable ``--compare`` file) or when pytest ran nothing useful: exit
status 5 (no test collected: the selection is named) or an internal or usage error.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import re
import shlex
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from numcheck.errors import BadInput
from numcheck.properties.core import records
from numcheck.reports import baselines
from numcheck.reports.common import (
    SUITE_MODULES,
    add_impl_arguments,
    code_identity,
    prepare_out_dir,
    stream,
    suite_command,
    write_atomically,
)
from numcheck.reports.report import schema as report_schema

HELP = (
    "run the property suite over several hypothesis seeds (ci-seeded profile) and print every failure, the "
    "failure count and the tightness table (median and 90th percentile of error/bound per output and dtype); "
    "writes sweep.json and sweep.md; exit 1 if any test failed, 2 on bad input"
)

#: The folder under the current directory that ``numcheck sweep`` writes into by default.
DEFAULT_ROOT = "numcheck-sweep"
#: The files a sweep owns in its folder (``seeds/`` holds one file per finished seed, see :func:`save_seed`).
SWEEP_FILES: frozenset[str] = frozenset({"sweep.json", "sweep.md"})
#: The folder of ``--out`` that holds one ``seed-<S>.json.gz`` per finished seed.
SEEDS_DIR = "seeds"
SEED_SCHEMA = "numcheck-sweep-seed/1"
#: pytest's exit status for an interrupted session or a collection error: such a seed is reported, never kept.
PYTEST_INTERRUPTED = 2
#: the 90th percentile of error/bound may not fall by more than this factor from the baseline's.
TIGHTNESS_FALL_LIMIT = 2.0
#: The quantiles of the tightness table, in percent.
QUANTILES: dict[str, float] = {"median": 50.0, "p90": 90.0}
SCHEMA = "numcheck-sweep/1"


def parse_seeds(text: str) -> list[int]:
    """``"0-9"`` → 0..9, ``"0,3,7"`` → those, ``"5"`` → [5] (ranges and lists mix: ``"0-2,7"``); BadInput else."""
    seeds: list[int] = []
    for part in text.split(","):
        m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
        if not m or (m.group(2) is not None and int(m.group(2)) < int(m.group(1))):
            raise BadInput(
                f"--seeds {text!r}: {part!r} is not a seed or an increasing range A-B of non-negative "
                f"integers (e.g. 0-9, or 0,3,7)"
            )
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        seeds += [s for s in range(lo, hi + 1) if s not in seeds]
    return seeds


def profile_name(name: str) -> str:
    """The full numcheck profile for ``name``; BadInput for an unknown or derandomized one."""
    from hypothesis import settings

    from numcheck.properties.core.profiles import numcheck_name

    try:
        full = numcheck_name(name)
    except ValueError as exc:
        raise BadInput(f"--profile: {exc}") from None
    if settings.get_profile(full).derandomize:
        raise BadInput(
            f"--profile {name!r}: {full} is derandomized, so every seed would draw the same examples; "
            f"use numcheck-ci-seeded (or dev, thorough)"
        )
    return full


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--seeds", default="0-9", help="hypothesis seeds: A-B, a comma-separated list, or both (default 0-9)"
    )
    add_impl_arguments(p, device_help="device the suite draws problems on (NUMCHECK_DEVICE; default cpu)")
    p.add_argument(
        "--profile",
        default="ci-seeded",
        help="numcheck hypothesis profile, not derandomized (default ci-seeded: NUMCHECK_CI_EXAMPLES examples)",
    )
    p.add_argument("-k", dest="keyword", metavar="EXPR", help="pytest -k expression selecting tests (passed through)")
    p.add_argument(
        "-n", dest="jobs", type=int, default=1, metavar="N", help="pytest-xdist workers per seed (default 1)"
    )
    p.add_argument(
        "--out", type=Path, metavar="DIR", help=f"output directory (default ./{DEFAULT_ROOT}/<device>-torch<version>/)"
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="run every seed afresh (by default a seed kept in DIR/seeds/ from an earlier run on the same "
        "code and torch is reused)",
    )
    p.add_argument(
        "--keep-stale",
        action="store_true",
        help="also reuse kept seeds that ran on other numcheck code or another torch (sweep.md marks "
        "each with the code it ran on); by default they are run again",
    )
    p.add_argument(
        "--assemble",
        action="store_true",
        help="run nothing: summarize the kept seeds of --seeds in DIR/seeds/ (each must be there; stale ones "
        "are marked), with the environment they recorded (seeds run on another machine, e.g. a GPU)",
    )
    p.add_argument("--per-impl", action="store_true", help="also print the tightness table of each impl")
    p.add_argument(
        "--compare",
        type=Path,
        metavar="BASE.json",
        help=f"a baseline sweep.json: flag each output × dtype whose 90th percentile fell more than "
        f"{TIGHTNESS_FALL_LIMIT:g}× below the baseline's (exit 1 if any)",
    )


# -- running one seed -------------------------------------------------------------------------------------
def sweep_command(seed: int, args: argparse.Namespace, profile: str, junit: Path, record_dir: Path) -> list[str]:
    """The pytest command line of one seed: the installed suite under ``profile`` and ``seed``, recorded."""
    options = [f"--hypothesis-profile={profile}", f"--hypothesis-seed={seed}", f"--numcheck-record={record_dir}"]
    if args.keyword:
        options += ["-k", args.keyword]
    return suite_command(junit, args.impl, args.jobs, *options)


@dataclass
class SeedRun:
    """What one seed's pytest run gave: exit status, seconds, every (test, impl) verdict, every record."""

    seed: int
    exit_status: int
    seconds: float
    cases: list[dict[str, str]] = field(default_factory=list)
    records: list[dict[str, Any]] = field(default_factory=list)
    environment: dict[str, Any] = field(default_factory=dict)
    resumed: bool = False
    #: The :func:`code_identity` it ran on (``None``: kept by a numcheck that did not record it).
    code: dict[str, Any] | None = None
    #: Why a kept seed does not match this run's code (set only when ``--keep-stale`` took it anyway).
    stale: str | None = None

    def counts(self) -> dict[str, int]:
        """Number of (test, impl) cases per status."""
        out = {s: 0 for s in ("passed", "failed", "error", "skipped")}
        for c in self.cases:
            out[c["status"]] += 1
        return out

    def failures(self) -> list[dict[str, str]]:
        """The (test, impl) cases that failed or errored."""
        return [c for c in self.cases if c["status"] in ("failed", "error")]


def _message_parts(text: str) -> dict[str, str]:
    """The first line, the case, the first judgement line and the repro command of a failure message.

    A message that is an exception's repr on one line (``PropertyFailure('...\\n  case: ...')``, as JUnit
    records a failure hypothesis raised in a group) is read with its line breaks and quotes unescaped. The
    judgement line is the first ``(a)``/``(b)`` one, else the first naming a bound or a difference (two_calls,
    determinism), else the line after the case."""
    text = text.strip()
    head = re.match(r"^(\w+)\(['\"]", text)
    if head and "\n" not in text and "\\n" in text:
        text = f"{head.group(1)}: {text[head.end() :]}"
        text = text[:-2] if text.endswith(("')", '")')) else text
        text = text.replace("\\n", "\n").replace("\\'", "'").replace('\\"', '"')
    lines = [re.sub(r"^E\s+", "", ln.strip()) for ln in text.splitlines()]  # pytest's "E   " prefix
    lines = [ln for ln in lines if ln and ln != "E"]

    def first(pattern: str) -> str:
        return next((m.group(1) for ln in lines if (m := re.match(pattern, ln))), "")

    after_case = next((lines[i + 1] for i, ln in enumerate(lines[:-1]) if ln.startswith("case: ")), "")
    detail = (
        first(r"(\((?:a|b)\) .+)")
        or first(r"(.*(?:beyond bound|error/bound|differs|mismatch).*)")
        or ("" if after_case.startswith("reproduce: ") else after_case)
    )
    return {
        "message": lines[0][:400] if lines else "",
        "case": first(r"case: (.+)"),
        "detail": detail[:600],
        "reproduce": first(r"reproduce: (.+)"),
    }


def _split_name(classname: str, name: str) -> tuple[str, str]:
    """(``module::test``, impl) of a JUnit test case (``test_accuracy[chunked[fp32_operands]]`` → impl
    ``chunked[fp32_operands]``; impl ``""`` for a test without parameters)."""
    base, bracket, rest = name.partition("[")
    test = f"{classname.rsplit('.', 1)[-1]}::{base}" if classname else base
    return test, rest[:-1] if bracket and rest.endswith("]") else rest


def junit_cases(path: Path) -> list[dict[str, str]]:
    """Every test case of a JUnit XML file: test, impl, status (passed, failed, error, skipped) and, for a
    failure or error, the parts of its message (:func:`_message_parts`)."""
    cases = []
    for case in ET.parse(path).getroot().iter("testcase"):
        test, impl = _split_name(case.get("classname", ""), case.get("name", ""))
        row = {"test": test, "impl": impl, "status": "passed"}
        for tag, status in (("failure", "failed"), ("error", "error"), ("skipped", "skipped")):
            el = case.find(tag)
            if el is not None:
                row["status"] = status
                if status != "skipped":
                    row.update(_message_parts((el.get("message") or "") + "\n" + (el.text or "")))
                break
        cases.append(row)
    return cases


def _selection(args: argparse.Namespace) -> str:
    """The selection in words, for messages: the modules, the impls and the -k expression."""
    impls = ", ".join(args.impl) if args.impl else "every registered impl"
    return f"{' '.join(SUITE_MODULES)} on {impls}" + (f", -k {args.keyword!r}" if args.keyword else "")


def run_seed(seed: int, args: argparse.Namespace, profile: str) -> SeedRun:
    """Run the suite for ``seed`` and read its verdicts and records; BadInput when pytest ran nothing usable."""
    with tempfile.TemporaryDirectory(prefix=f"numcheck-sweep-{seed}-") as tmp:
        junit, record_dir = Path(tmp) / "junit.xml", Path(tmp) / "records"
        cmd = sweep_command(seed, args, profile, junit, record_dir)
        env = dict(
            os.environ,
            PYTHONUNBUFFERED="1",
            NUMCHECK_DEVICE=args.device,
            HYPOTHESIS_STORAGE_DIRECTORY=str(Path(tmp) / "hypothesis"),
        )
        print(f"numcheck sweep: seed {seed}: {shlex.join(cmd)}", file=sys.stderr)
        t0 = time.monotonic()
        rc, lines = stream(cmd, env=env, prefix=f"  seed {seed} | ")
        secs = time.monotonic() - t0
        if rc == 5:
            raise BadInput(f"seed {seed}: pytest collected no test (exit 5) for the selection {_selection(args)}")
        if rc not in (0, 1, 2) or not junit.exists():
            tail = "\n".join(f"    {t}" for t in [t for t in lines if t.strip()][-8:])
            raise BadInput(f"seed {seed}: pytest exited {rc} without results for {_selection(args)}:\n{tail}")
        rows = [r for f in sorted(record_dir.glob("records-*.jsonl")) for r in records.read(f)]
        return SeedRun(seed, rc, secs, junit_cases(junit), rows)


def seed_path(out: Path, seed: int) -> Path:
    """Where the finished ``seed`` of the sweep in ``out`` is kept."""
    return out / SEEDS_DIR / f"seed-{seed}.json.gz"


def _short_code(code: dict[str, Any] | None, environment: dict[str, Any]) -> str:
    """``code <hash12>, commit <commit9>`` of a seed (``unknown`` for what was not recorded)."""
    h = (code or {}).get("code")
    commit = environment.get("git_commit")
    dirty = " (dirty)" if environment.get("git_dirty") else ""
    return f"code {h[:12] if h else 'unknown'}, commit {commit[:9] + dirty if commit else 'unknown'}"


def stale_reason(run: SeedRun, code: dict[str, Any]) -> str | None:
    """Why the kept ``run`` did not run on this run's ``code`` (:func:`code_identity`); ``None`` when it did."""
    if run.code is None:
        return f"was kept without a code hash ({_short_code(None, run.environment)}), so its code is unknown"
    if run.code.get("code") != code["code"]:
        return (
            f"ran on other numcheck code ({_short_code(run.code, run.environment)}; this run: code {code['code'][:12]})"
        )
    if run.code.get("torch") != code["torch"]:
        return f"ran on torch {run.code.get('torch')} (this run: torch {code['torch']})"
    return None


def _selection_key(args: argparse.Namespace, profile: str) -> dict[str, Any]:
    """What a kept seed must share with this run to be taken instead of run again (its code aside: see
    :func:`stale_reason`)."""
    return {
        "modules": list(SUITE_MODULES),
        "impls": sorted(args.impl),
        "keyword": args.keyword,
        "profile": profile,
        "device": args.device,
    }


def save_seed(out: Path, run: SeedRun, key: dict[str, Any]) -> None:
    """Keep ``run`` in ``out/seeds/`` (gzipped JSON, written to a temporary name and renamed)."""
    path = seed_path(out, run.seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    if run.exit_status == PYTEST_INTERRUPTED:
        raise ValueError(
            f"seed {run.seed}: pytest exited {PYTEST_INTERRUPTED} (interrupted or a collection "
            f"error); such a seed is never kept"
        )
    data = {
        "schema": SEED_SCHEMA,
        "selection": key,
        "code": run.code,
        "seed": run.seed,
        "exit_status": run.exit_status,
        "seconds": run.seconds,
        "environment": run.environment,
        "cases": run.cases,
        "records": run.records,
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(gzip.compress(json.dumps(data).encode(), mtime=0))
    tmp.replace(path)


def load_seed(out: Path, seed: int, key: dict[str, Any]) -> SeedRun | None:
    """The kept ``seed`` of ``out`` (``None`` when there is none); BadInput when it is unreadable or was run
    on another selection (other modules, impls, -k, profile or device: it cannot join this sweep)."""
    path = seed_path(out, seed)
    if not path.exists():
        return None
    try:
        data = json.loads(gzip.decompress(path.read_bytes()))
    except (OSError, ValueError) as exc:
        raise BadInput(f"{path}: cannot read a kept seed ({exc}); delete it or pass --force") from None
    if data.get("schema") != SEED_SCHEMA or data.get("selection") != key:
        raise BadInput(
            f"{path}: seed {seed} was run on another selection ({data.get('selection')}, this run: "
            f"{key}); choose another --out or pass --force"
        )
    return SeedRun(
        seed,
        data["exit_status"],
        data["seconds"],
        data["cases"],
        data["records"],
        data.get("environment", {}),
        resumed=True,
        code=data.get("code"),
    )


# -- tightness --------------------------------------------------------------------------------------------
def _stats(ratios: list[float]) -> dict[str, Any]:
    finite = np.array([r for r in ratios if math.isfinite(r)], dtype=np.float64)
    row: dict[str, Any] = {
        "count": len(ratios),
        "exact": int((finite == 0).sum()),
        "nonfinite": len(ratios) - int(finite.size),
    }
    for name, q in QUANTILES.items():
        row[name] = float(np.percentile(finite, q)) if finite.size else None
    row["max"] = float(finite.max()) if finite.size else None
    return row


def tightness(rows: Iterable[dict[str, Any]], keys: tuple[str, ...] = ("output", "dtype")) -> list[dict[str, Any]]:
    """Per distinct value of ``keys``: count, exact (error 0), nonfinite, median, p90 and max of error/bound."""
    groups: dict[tuple, list[float]] = {}
    for r in rows:
        groups.setdefault(tuple(r[k] for k in keys), []).append(r["ratio"])
    return [dict(zip(keys, k), **_stats(v)) for k, v in sorted(groups.items())]


def compare_tightness(now: list[dict[str, Any]], base: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per output × dtype in both: the baseline's and today's p90, their ratio base/now and whether it fell by
    more than :data:`TIGHTNESS_FALL_LIMIT` (a p90 of 0 in the baseline cannot fall and is not judged)."""
    before = {(r["output"], r["dtype"]): r["p90"] for r in base}
    out = []
    for r in now:
        b = before.get((r["output"], r["dtype"]))
        if b is None or r["p90"] is None:
            continue
        fall = (b / r["p90"]) if r["p90"] > 0 else (math.inf if b > 0 else 1.0)
        out.append(
            {
                "output": r["output"],
                "dtype": r["dtype"],
                "base_p90": b,
                "p90": r["p90"],
                "fall": fall if math.isfinite(fall) else "inf",
                "too_loose": fall > TIGHTNESS_FALL_LIMIT,
            }
        )
    return out


# -- the result -------------------------------------------------------------------------------------------
def summarize(
    runs: list[SeedRun],
    args: argparse.Namespace,
    profile: str,
    env: dict[str, Any],
    base: dict[str, Any] | None,
    code: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The JSON of a sweep (``sweep.json``); ``code`` is this run's :func:`code_identity`."""
    from numcheck.properties.core.profiles import ci_examples

    all_rows = [r for run in runs for r in run.records]
    table = tightness(all_rows)
    return {
        "schema": SCHEMA,
        "environment": env,
        "code": code,
        "selection": {
            "modules": list(SUITE_MODULES),
            "impls": list(args.impl),
            "keyword": args.keyword,
            "profile": profile,
            "ci_examples": ci_examples(),
            "jobs": args.jobs,
            "device": args.device,
            "assembled": bool(getattr(args, "assemble", False)),
        },
        "seeds": [
            {
                "seed": r.seed,
                "exit_status": r.exit_status,
                "seconds": round(r.seconds, 1),
                "counts": r.counts(),
                "failures": r.failures(),
                "records": len(r.records),
                "commit": r.environment.get("git_commit"),
                "dirty": r.environment.get("git_dirty"),
                "code": (r.code or {}).get("code"),
                "torch": (r.code or {}).get("torch"),
                "resumed": r.resumed,
                "stale": r.stale,
                "tightness": tightness(r.records),
            }
            for r in runs
        ],
        "failures": sum(len(r.failures()) for r in runs),
        "tightness": table,
        "tightness_per_impl": tightness(all_rows, ("impl", "output", "dtype")),
        "compare": (
            {
                "baseline": str(args.compare),
                "limit": TIGHTNESS_FALL_LIMIT,
                "rows": compare_tightness(table, base["tightness"]),
            }
            if base is not None
            else None
        ),
    }


def _num(v: Any) -> str:
    """A table cell: ``—`` for none, three significant digits for a float."""
    return "—" if v is None else f"{v:.3g}" if isinstance(v, float) else str(v)


def _table(rows: list[dict[str, Any]], keys: tuple[str, ...]) -> list[str]:
    """The Markdown tightness table of ``rows``, keyed by ``keys``."""
    cols = keys + ("count", "exact", "median", "p90", "max", "nonfinite")
    lines = ["| " + " | ".join(cols) + " |", "|" + " --- |" * len(cols)]
    return lines + ["| " + " | ".join(_num(r[c]) for c in cols) + " |" for r in rows]


def _seeds_section(summary: dict[str, Any]) -> list[str]:
    """What was swept (selection, environment, code) and one row per seed, with its stale or mixed commits."""
    sel, env = summary["selection"], summary["environment"]
    code = (summary.get("code") or {}).get("code")
    out = [
        "## numcheck seed sweep",
        "",
        f"{sel['device']}, torch {env.get('torch')}, liger-kernel {env.get('liger_kernel') or '—'}, commit "
        f"{(env.get('git_commit') or '?')[:9]}{' (dirty)' if env.get('git_dirty') else ''}, numcheck code "
        f"{code[:12] if code else '?'}; profile "
        f"{sel['profile']} ({sel['ci_examples']} examples), impls: {', '.join(sel['impls']) or 'all registered'}"
        + (f", -k `{sel['keyword']}`" if sel["keyword"] else "")
        + f", -n {sel['jobs']}",
        "",
        "| seed | passed | failed | error | skipped | seconds | commit | code |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for s in summary["seeds"]:
        c = s["counts"]
        commit = (s.get("commit") or "?")[:9] + (" (dirty)" if s.get("dirty") else "")
        mark = f"{(s.get('code') or 'unknown')[:12]}" + (
            f" ⚠ stale, kept by {'--assemble' if summary['selection'].get('assembled') else '--keep-stale'}"
            if s.get("stale")
            else ""
        )
        out.append(
            f"| {s['seed']} | {c['passed']} | {c['failed']} | {c['error']} | {c['skipped']} | "
            f"{s['seconds']:.0f} | {commit} | {mark} |"
        )
    stale = [s for s in summary["seeds"] if s.get("stale")]
    if stale:
        out += [""] + [
            f"- ⚠ seed {s['seed']} {s['stale']}: its verdicts and tightness are that code's, not this run's"
            for s in stale
        ]
    commits = {(s.get("commit"), bool(s.get("dirty"))) for s in summary["seeds"]}
    if len(commits) > 1 and not stale:
        out += [
            "",
            f"The seeds ran on {len(commits)} different commits with the same numcheck code and torch: the "
            f"sweep is assembled from runs kept in seeds/.",
        ]
    return out


def _failures_section(summary: dict[str, Any]) -> list[str]:
    """The failure count over the seeds, then each failure with its case, detail and repro line."""
    out = [
        "",
        f"**failures: {summary['failures']}** over {len(summary['seeds'])} seed(s) (on correct impls, each "
        f"is a false alarm of the model)",
        "",
    ]
    for s in summary["seeds"]:
        for f in s["failures"]:
            out.append(f"- seed {s['seed']}: `{f['test']}[{f['impl']}]` ({f['status']}): {f.get('message', '')}")
            for part in ("case", "detail", "reproduce"):
                if f.get(part):
                    out.append(f"  - {part}: `{f[part]}`")
    return out


def _p90_section(cmp: dict[str, Any]) -> list[str]:
    """Each output and dtype's 90th percentile against the baseline sweep's (``--compare``)."""
    out = [
        "",
        f"### 90th percentile vs {cmp['baseline']} (may fall at most {cmp['limit']:g}×)",
        "",
        "| output | dtype | baseline p90 | p90 | baseline/now | |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    out += [
        f"| {r['output']} | {r['dtype']} | {_num(r['base_p90'])} | {_num(r['p90'])} | {_num(r['fall'])} | "
        f"{'❌ fell' if r['too_loose'] else '✅'} |"
        for r in cmp["rows"]
    ]
    return out


def render_md(summary: dict[str, Any], per_impl: bool) -> str:
    """``sweep.md``: the selection, per seed its counts and failures, the total, the tightness table(s)."""
    out = _seeds_section(summary) + _failures_section(summary)
    out += ["", "### Tightness: error/bound under the hard bound, every accuracy and strided-inputs judgement", ""]
    out += _table(summary["tightness"], ("output", "dtype"))
    if per_impl:
        out += ["", "### Tightness per impl", ""] + _table(summary["tightness_per_impl"], ("impl", "output", "dtype"))
    cmp = summary.get("compare")
    if cmp:
        out += _p90_section(cmp)
    return "\n".join(out) + "\n"


# -- the command ------------------------------------------------------------------------------------------
def _out_dir(args: argparse.Namespace) -> Path:
    """Where to write, created now when missing; BadInput when it is not a folder that can be created or written."""
    out = args.out if args.out is not None else Path.cwd() / DEFAULT_ROOT / baselines.report_dir_name(args.device)
    if out.exists() and not out.is_dir():
        raise BadInput(f"--out {out} exists and is not a directory")
    return prepare_out_dir(out)


def _baseline(path: Path | None) -> dict[str, Any] | None:
    """The ``--compare`` sweep.json (``None`` without one); BadInput when it is not a readable sweep.json."""
    if path is None:
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise BadInput(f"--compare {path}: cannot read a sweep.json ({exc})") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or not isinstance(data.get("tightness"), list):
        raise BadInput(f"--compare {path}: not a {SCHEMA} sweep.json (no schema or tightness table)")
    return data


def _say(seed: int, text: str) -> None:
    """One progress line about ``seed`` on stderr."""
    print(f"numcheck sweep: seed {seed}: {text}", file=sys.stderr)


def _assembled(
    seeds: list[int], out: Path, key: dict[str, Any], code: dict[str, Any]
) -> tuple[list[SeedRun], dict[str, Any]]:
    """``--assemble``: the kept runs of ``seeds`` (stale ones marked) and the environment they ran in; BadInput
    when a seed is missing or the seeds ran on different devices or torch releases (one sweep, one environment)."""
    runs = []
    for seed in seeds:
        kept = load_seed(out, seed, key)
        if kept is None:
            raise BadInput(
                f"--assemble: seed {seed} is not kept in {seed_path(out, seed)}; run it, or leave it out of --seeds"
            )
        # Assembling runs nothing: a seed is stale for other numcheck code, not for this machine's torch (the
        # seeds' own torch must agree among themselves, below).
        seeds_torch = (kept.code or {}).get("torch", code["torch"])
        kept.stale = stale_reason(kept, {**code, "torch": seeds_torch})
        runs.append(kept)
    envs = {(r.environment.get("device"), r.environment.get("torch")) for r in runs}
    if len(envs) > 1:
        raise BadInput(
            f"--assemble: the seeds ran in different environments (device, torch): {sorted(map(str, envs))}; "
            f"assemble each environment into its own folder"
        )
    return runs, dict(runs[0].environment)


def _seed(
    seed: int,
    out: Path,
    args: argparse.Namespace,
    profile: str,
    key: dict[str, Any],
    env: dict[str, Any],
    code: dict[str, Any],
) -> SeedRun:
    """``seed``'s run: the kept one when it ran on this ``code`` (or ``--keep-stale``), else a fresh run, kept
    unless pytest exited :data:`PYTEST_INTERRUPTED`."""
    kept = None if args.force else load_seed(out, seed, key)
    if kept is not None and kept.exit_status == PYTEST_INTERRUPTED:
        _say(
            seed,
            f"the kept seed's pytest exited {PYTEST_INTERRUPTED} (interrupted or a collection error): running it again",
        )
        kept = None
    why = stale_reason(kept, code) if kept is not None else None
    if why and not args.keep_stale:
        _say(seed, f"the kept seed {why}: running it again (--keep-stale would keep it)")
        kept = None
    if kept is not None:
        kept.stale = why
        if why:
            _say(seed, f"keeping the stale kept seed (--keep-stale): it {why}")
        return kept
    r = run_seed(seed, args, profile)
    r.environment, r.code = env, code
    if r.exit_status == PYTEST_INTERRUPTED:
        _say(seed, f"pytest exited {PYTEST_INTERRUPTED} (interrupted or a collection error): reported, not kept")
    else:
        save_seed(out, r, key)
    return r


def run(args: argparse.Namespace) -> int:
    """Run the sweep (module docstring); the exit status."""
    made: Path | None = None  # the output folder when this run created it (removed again if it stays empty)
    try:
        seeds = parse_seeds(args.seeds)
        profile = profile_name(args.profile)
        if args.jobs < 1:
            raise BadInput(f"-n {args.jobs}: the number of workers must be at least 1")
        missing = args.out is not None and not args.out.exists()
        out, base = _out_dir(args), _baseline(args.compare)
        made = out if missing else None
        if args.force and (args.keep_stale or args.assemble):
            raise BadInput(
                f"--force runs every seed afresh and {'--assemble runs none' if args.assemble else '--keep-stale reuses stale kept seeds'}: pass one"
            )
        code = code_identity()
        key = _selection_key(args, profile)
        runs = []
        if args.assemble:
            runs, env = _assembled(seeds, out, key, code)
        else:
            env = report_schema.environment(args.device)  # before the run: the commit and tree it ran on
        for i, seed in enumerate([] if args.assemble else seeds, 1):
            r = _seed(seed, out, args, profile, key, env, code)
            c = r.counts()
            print(
                f"numcheck sweep: seed {seed} ({i}/{len(seeds)}){' (kept from an earlier run)' if r.resumed else ''}"
                f": {c['passed']} passed, {c['failed']} failed, {c['error']} errors, {c['skipped']} skipped, "
                f"{len(r.records)} judgements recorded in {r.seconds:.0f} s",
                file=sys.stderr,
            )
            runs.append(r)
    except BadInput as exc:
        if made is not None and made.is_dir() and not any(made.iterdir()):
            made.rmdir()  # bad input writes nothing: the folder created up front goes again
        print(f"numcheck sweep: bad input (exit 2) — {exc}", file=sys.stderr)
        return 2
    summary = summarize(runs, args, profile, env, base, code)
    text = render_md(summary, args.per_impl)
    write_atomically(out, {"sweep.json": json.dumps(summary, indent=1) + "\n", "sweep.md": text}, owned=SWEEP_FILES)
    print(text)
    loose = [r for r in (summary["compare"] or {}).get("rows", []) if r["too_loose"]]
    status = 1 if summary["failures"] or loose else 0
    why = (f"{summary['failures']} failure(s)" if summary["failures"] else "no failure") + (
        f", {len(loose)} 90th percentile(s) fell more than {TIGHTNESS_FALL_LIMIT:g}×" if loose else ""
    )
    print(
        f"numcheck sweep: {'FAIL' if status else 'PASS'} (exit {status}) — {why} over {len(seeds)} seed(s); "
        f"wrote {out}",
        file=sys.stderr,
    )
    return status
