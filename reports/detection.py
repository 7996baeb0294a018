"""``numcheck detection``: which of the suite's properties catch each in-repo mutant under the ci profile, by how
much, and how soon (issue 19's detection table).

Every mutant (``tests/self/mutants.py``, ``tests/self/fp8_mutants.py``: a passing built-in with one bug of one
class, declared as the built-in is) runs through the installed suite exactly as a user's CI runs it, one mutant
per process, one after another::

    python -m pytest --pyargs numcheck.tests.suite --impl <spec> -n 0 -p no:cacheprovider \\
        --hypothesis-profile numcheck-ci -k <the properties of its class>

in a fresh empty directory (no example database to replay). The junit XML of that run gives, per mutant: the
properties that failed, the margin of each failure (the first error/bound its message states, else the kind
of failure: "differs between two identical runs", "codes differ from the oracle", ...), the seconds from the
start of the run to the end of the first failing test (what a ``-x`` CI run takes to turn red, shrinking
included) and whether it was caught at all. It prints a Markdown table and writes ``detection.json`` and
``detection.md``.

The mutants live in numcheck's own tests, which a wheel does not ship: the command needs a checkout (it names
them by spec and never imports them). ``-k`` restricts each run to the properties that matter for its class
(:data:`ROWS`); ``--all-properties`` runs the whole suite for each mutant instead (much slower).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

HELP = "run every in-repo mutant through the suite under the ci profile and tabulate which properties catch it"

_LINEAR = "numcheck.tests.self.mutants"
_FP8 = "numcheck.tests.self.fp8_mutants"

#: -k selections per bug class: the suite's properties that judge what the class breaks.
_ACCUMULATOR = "accuracy or many_chunks or long_batch or large_vocab"
_NONDETERMINISM = "determinism or chunk_invariance or ignored_rows or two_calls"
_NARROW = "accuracy or confident_rows or reduction_consistency"
_QUANTIZER = "quantizer or accuracy_against or edge_inputs"


@dataclass(frozen=True)
class Row:
    """One mutant of the table: its bug class, its ``--impl`` spec, what it changes and the ``-k`` selection."""

    bug_class: str
    spec: str
    change: str
    select: str


ROWS: tuple[Row, ...] = (
    Row("narrow accumulator", f"{_LINEAR}:gw_bf16_sum", "grad_weight's running sum across chunks in bf16", _ACCUMULATOR),
    Row("narrow accumulator", f"{_LINEAR}:gb_bf16_sum", "grad_bias's running sum across chunks in bf16", _ACCUMULATOR),
    Row("narrow accumulator", f"{_LINEAR}:gx_bf16_sum", "grad_x summed over 128-class blocks in bf16", _ACCUMULATOR),
    Row("narrow accumulator", f"{_LINEAR}:loss_bf16_sum", "the chunks' loss sums added in bf16", _ACCUMULATOR),
    Row("narrow accumulator", f"{_LINEAR}:gw_bf16_sum_bf16_only", "as gw_bf16_sum, declaring bf16 only", _ACCUMULATOR),
    Row("narrow accumulator", f"{_LINEAR}:gw_fp16_sum_fp16_only", "grad_weight's running sum in fp16, declaring fp16 only",
        _ACCUMULATOR),
    Row("narrow accumulator", f"{_LINEAR}:gx_bf16_sum_bf16_only", "as gx_bf16_sum, declaring bf16 only", _ACCUMULATOR),
    Row("narrow accumulator", f"{_LINEAR}:bf16_grad_weight_accum",
        "eager-based: grad_weight summed over 4-row chunks in bf16 (predates issue 19)", _ACCUMULATOR),
    Row("nondeterminism", f"{_LINEAR}:chunk_order_per_call", "full chunks processed in a per-call random order",
        _NONDETERMINISM),
    Row("nondeterminism", f"{_LINEAR}:row_order_per_call", "rows assigned to chunks in a per-call random order",
        _NONDETERMINISM),
    Row("narrow intermediate", f"{_LINEAR}:row_loss_bf16", "each per-row loss rounded to bf16 before the reduction",
        _NARROW),
    Row("narrow intermediate", f"{_LINEAR}:stats_bf16", "recompute's per-row (max, log-sum) kept in bf16", _NARROW),
    Row("narrow intermediate", f"{_LINEAR}:loss_bf16", "eager-based: the loss rounded through bf16 (predates issue 19)",
        _NARROW),
    Row("quantizer edge", f"{_FP8}:mx_scale_wrong_way", "E8M0 RCEIL floors, FLOOR ceils (predates issue 19)", _QUANTIZER),
    Row("quantizer edge", f"{_FP8}:mx_rceil_log2", "E8M0 RCEIL code through an fp32 log2", _QUANTIZER),
    Row("quantizer edge", f"{_FP8}:mx_rceil_nonstrict", "E8M0 RCEIL rounds exact powers of two up (>= for >)", _QUANTIZER),
    Row("quantizer edge", f"{_FP8}:pow2_scale_log2_current", "power-of-2 current scale through an fp32 log2", _QUANTIZER),
    Row("quantizer edge", f"{_FP8}:pow2_scale_log2_blockwise", "power-of-2 block scale through an fp32 log2", _QUANTIZER),
    Row("quantizer edge", f"{_FP8}:no_saturation_mxfp8", "no saturation at the format maximum (MXFP8 FLOOR)", _QUANTIZER),
    Row("quantizer edge", f"{_FP8}:no_saturation_delayed", "no saturation at the format maximum (delayed)", _QUANTIZER),
)

_RATIO = re.compile(r"error/bound (inf|nan|[0-9.]+(?:e[+-]?\d+)?)", re.IGNORECASE)
_TEST_ID = re.compile(r"^test_(?P<name>[^\[]+)(?:\[(?P<params>.*)\])?$")


@dataclass
class Catch:
    """One failing test: the property (the test's name without ``test_``, its parameter if any), the margin
    (error/bound, ``None`` when the failure states none) and the failure's first line."""

    property: str
    ratio: float | None
    kind: str


@dataclass
class Detection:
    """What the run of one mutant found."""

    mutant: str
    bug_class: str
    change: str
    spec: str
    select: str
    caught: bool
    catches: list[Catch] = field(default_factory=list)
    seconds_to_first_failure: float | None = None
    passed: list[str] = field(default_factory=list)
    skipped: int = 0
    seconds: float = 0.0
    exit_status: int = 0
    note: str = ""


def _property_of(testcase_name: str, impl: str) -> str:
    """The property a suite test id names: ``test_frozen_inputs[<impl>-weight]`` → ``frozen_inputs[weight]``,
    ``test_accuracy[<impl>]`` → ``accuracy``, ``test_pinned_cases[<impl>-Problem(...)]`` → ``pinned_cases``."""
    m = _TEST_ID.match(testcase_name)
    if not m:
        return testcase_name
    name, params = m.group("name"), m.group("params") or ""
    rest = params[len(impl):].lstrip("-") if params.startswith(impl) else params
    return name if not rest or name == "pinned_cases" else f"{name}[{rest}]"


def _failure_kind(text: str) -> str:
    """The line after ``case:`` of a suite failure message (what went wrong), else the exception's last line."""
    lines = [ln.strip() for ln in text.splitlines()]
    for i, ln in enumerate(lines):
        if ln.startswith("case:") and i + 1 < len(lines):
            return lines[i + 1][:160]
    errors = [ln for ln in lines if re.match(r"^E\s+\S", ln)]
    return (errors[0][1:].strip() if errors else (lines[-1] if lines else ""))[:160]


def _margin(text: str) -> float | None:
    """The first error/bound a failure message states (the worst output's, as the suite writes it)."""
    m = _RATIO.search(text)
    return float(m.group(1)) if m else None


def parse_junit(path: Path, impl_name: str) -> tuple[list[Catch], list[str], int, float | None]:
    """``(catches, passed properties, skipped count, seconds to the end of the first failing test)`` of one
    mutant's junit XML, tests in run order."""
    root = ET.parse(path).getroot()
    catches: list[Catch] = []
    passed: list[str] = []
    skipped, elapsed, first = 0, 0.0, None
    for tc in root.iter("testcase"):
        elapsed += float(tc.get("time", 0.0))
        name = tc.get("name", "")
        bad = tc.find("failure")
        if bad is None:
            bad = tc.find("error")
        if bad is not None:
            text = (bad.get("message") or "") + "\n" + (bad.text or "")
            catches.append(Catch(_property_of(name, impl_name), _margin(text), _failure_kind(text)))
            first = elapsed if first is None else first
        elif tc.find("skipped") is not None:
            skipped += 1
        elif impl_name in name:
            passed.append(_property_of(name, impl_name))
    return catches, passed, skipped, first


def _impl_name(xml_path: Path) -> str:
    """The mutant's name as the suite's test ids carry it: the shortest parameter of a suite test (every suite test
    is parametrized by the impl first; ``NOTSET`` marks the other kind's tests, which have no impl)."""
    root = ET.parse(xml_path).getroot()
    params = [m.group("params") for tc in root.iter("testcase")
              if (m := _TEST_ID.match(tc.get("name", ""))) and m.group("params")
              and not m.group("params").startswith("NOTSET")]
    return min(params, key=len) if params else ""


def run_mutant(row: Row, *, all_properties: bool, timeout: float) -> Detection:
    """One mutant through the installed suite under the ci profile, in a fresh directory."""
    with tempfile.TemporaryDirectory(prefix="numcheck-detection-") as tmp:
        xml = Path(tmp) / "junit.xml"
        cmd = [sys.executable, "-m", "pytest", "--pyargs", "numcheck.tests.suite", "--impl", row.spec, "-n", "0",
               "-p", "no:cacheprovider", "-q", "--hypothesis-profile", "numcheck-ci", f"--junitxml={xml}"]
        if not all_properties:
            cmd += ["-k", row.select]
        env = {k: v for k, v in os.environ.items() if k not in ("NUMCHECK_HYPOTHESIS_PROFILE", "NUMCHECK_CI_EXAMPLES")}
        t0 = time.monotonic()
        try:
            proc = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=timeout)
            status, out = proc.returncode, proc.stdout + proc.stderr
        except subprocess.TimeoutExpired:
            status, out = -1, f"timed out after {timeout:.0f} s"
        seconds = time.monotonic() - t0
        det = Detection(mutant=row.spec.rsplit(":", 1)[1], bug_class=row.bug_class, change=row.change, spec=row.spec,
                        select="(all)" if all_properties else row.select, caught=False, seconds=round(seconds, 1),
                        exit_status=status)
        if not xml.is_file():
            det.note = f"no junit XML (exit {status}): {out.strip().splitlines()[-1] if out.strip() else ''}"[:300]
            return det
        name = _impl_name(xml) or det.mutant
        det.mutant = name
        det.catches, det.passed, det.skipped, first = parse_junit(xml, name)
        det.caught = bool(det.catches)
        det.seconds_to_first_failure = round(first, 1) if first is not None else None
        if status not in (0, 1):
            det.note = f"pytest exit status {status}"
        return det


def _fmt_ratio(r: float | None) -> str:
    return "—" if r is None else (f"{r:.3g}" if r < 1e6 else f"{r:.2e}")


def to_markdown(dets: list[Detection], header: str) -> str:
    """The detection table: one row per mutant."""
    lines = [header, "",
             "| class | mutant | change | caught | caught by (margin: error/bound, or the failure) | s to first failure "
             "| passed (not caught by) |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for d in dets:
        by = "<br>".join(f"`{c.property}` {_fmt_ratio(c.ratio)}" + ("" if c.ratio is not None else f" ({c.kind})")
                         for c in d.catches) or "—"
        first = "—" if d.seconds_to_first_failure is None else f"{d.seconds_to_first_failure:.1f}"
        lines.append(f"| {d.bug_class} | `{d.mutant}` | {d.change} | {'yes' if d.caught else '**NO**'} | {by} | "
                     f"{first} | {', '.join(f'`{p}`' for p in d.passed) or '—'} |")
    missed = [d for d in dets if not d.caught]
    lines += ["", f"{len(dets) - len(missed)} of {len(dets)} mutants caught by the ci profile."]
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mutant", action="append", default=[], metavar="NAME",
                   help="only this mutant (its spec's attribute, e.g. gw_bf16_sum; repeatable)")
    p.add_argument("--all-properties", action="store_true", help="run the whole suite per mutant, not its class's -k")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per mutant's run (default 600)")
    p.add_argument("--out", type=Path, default=Path("numcheck-detection"), metavar="DIR",
                   help="where detection.json and detection.md go (default ./numcheck-detection)")


def run(args: argparse.Namespace) -> int:
    if importlib.util.find_spec(_LINEAR) is None:
        print(f"numcheck detection: {_LINEAR} is not importable: the mutants are numcheck's own tests, shipped only "
              "in a checkout (run from one, with it on PYTHONPATH)", file=sys.stderr)
        return 2
    known = {r.spec.rsplit(":", 1)[1]: r for r in ROWS}
    unknown = [m for m in args.mutant if m not in known]
    if unknown:
        print(f"numcheck detection: unknown mutant(s) {unknown}; known: {sorted(known)}", file=sys.stderr)
        return 2
    rows = [known[m] for m in args.mutant] if args.mutant else list(ROWS)
    import torch

    dets: list[Detection] = []
    for row in rows:
        d = run_mutant(row, all_properties=args.all_properties, timeout=args.timeout)
        print(f"{d.mutant}: {'caught by ' + ', '.join(c.property for c in d.catches) if d.caught else 'NOT caught'} "
              f"({d.seconds:.0f} s)", file=sys.stderr, flush=True)
        dets.append(d)
    header = (f"Detection under the ci profile (numcheck-ci, derandomized, {os.environ.get('NUMCHECK_CI_EXAMPLES', '12')} "
              f"examples), torch {torch.__version__}, {'CUDA' if os.environ.get('NUMCHECK_DEVICE') == 'cuda' else 'CPU'}; "
              "one pytest run per mutant (`numcheck detection`, reports/detection.py).")
    md = to_markdown(dets, header)
    print(md)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "detection.md").write_text(md + "\n")
    (args.out / "detection.json").write_text(json.dumps(
        {"torch": torch.__version__, "profile": "numcheck-ci", "mutants": [asdict(d) for d in dets]}, indent=1) + "\n")
    return 0 if all(d.caught for d in dets) else 1
