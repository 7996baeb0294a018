"""The detection table: which of the suite's properties catch each in-repo mutant under the ci profile, by how
much, and how soon. A tool of numcheck's checkout (the mutants are numcheck's own tests, never shipped):
``python tools/detection.py [--mutant NAME ...] [--out DIR]``.

Every mutant (``tests/self/helpers/mutants.py``, ``tests/self/helpers/fp8_mutants.py``: a passing built-in with one bug of one
class, declared as the built-in is) is loaded by its spec, as ``--impl`` loads it, and each property of its
class (:data:`ROWS`) runs through the suite's own runner (:mod:`numcheck.properties.core.runner`, what both the pytest
suite and :func:`numcheck.check` run) under the ci profile, with ``numcheck.check``'s draws (same example
budget, same derandomized seed per property and impl), one fresh process per mutant. The shrink phase is left
out: the verdict is decided by the first failing draw, and shrinking it (which took minutes per property here)
would change neither the verdict nor how soon CI turns red. Per mutant it records the properties that failed,
the margin of each (the first error/bound of the failing draw's message, else the kind of failure: "differs
between two identical runs", "codes differ from the oracle", ...), the seconds from the start of its run to the
end of the first failing property, and whether it was caught at all; it prints a Markdown table and writes
``detection.json`` and ``detection.md``.

The mutants are numcheck's own tests, which a wheel does not ship: the command needs a checkout (it names them
by spec and never imports them itself). ``--all-properties`` runs every drawn property of the suite per mutant
instead of its class's (much slower).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

HELP = "run every in-repo mutant through the suite under the ci profile and tabulate which properties catch it"

_LINEAR = "numcheck.tests.self.helpers.mutants"
_FP8 = "numcheck.tests.self.helpers.fp8_mutants"

#: The suite properties (names of numcheck.check) that judge what each bug class breaks.
#: (Kept to the two or three that matter per class: the whole run stays near 20 minutes on a loaded 2-core machine.)
_ACCUMULATOR = ("accuracy_fp32_sharp", "many_chunks")
_LOWP_ONLY = ("accuracy", "many_chunks", "large_vocab")
_NONDETERMINISM = ("determinism", "ignored_rows", "chunk_invariance")
_NARROW = ("accuracy", "accuracy_fp32_sharp")
_QUANTIZER = ("quantizer_bitwise_on_random_tensors", "accuracy_against_both_references")


@dataclass(frozen=True)
class Row:
    """One mutant of the table: its bug class, its ``--impl`` spec, what it changes and the properties run."""

    bug_class: str
    spec: str
    change: str
    select: tuple[str, ...]


ROWS: tuple[Row, ...] = (
    Row(
        "narrow accumulator", f"{_LINEAR}:gw_bf16_sum", "grad_weight's running sum across chunks in bf16", _ACCUMULATOR
    ),
    Row("narrow accumulator", f"{_LINEAR}:gb_bf16_sum", "grad_bias's running sum across chunks in bf16", _ACCUMULATOR),
    Row("narrow accumulator", f"{_LINEAR}:gx_bf16_sum", "grad_x summed over 128-class blocks in bf16", _ACCUMULATOR),
    Row("narrow accumulator", f"{_LINEAR}:loss_bf16_sum", "the chunks' loss sums added in bf16", _ACCUMULATOR),
    Row("narrow accumulator", f"{_LINEAR}:gw_bf16_sum_bf16_only", "as gw_bf16_sum, declaring bf16 only", _LOWP_ONLY),
    Row(
        "narrow accumulator",
        f"{_LINEAR}:gw_fp16_sum_fp16_only",
        "grad_weight's running sum in fp16, declaring fp16 only",
        _LOWP_ONLY,
    ),
    Row("narrow accumulator", f"{_LINEAR}:gx_bf16_sum_bf16_only", "as gx_bf16_sum, declaring bf16 only", _LOWP_ONLY),
    Row(
        "narrow accumulator",
        f"{_LINEAR}:bf16_grad_weight_accum",
        "eager-based: grad_weight summed over 4-row chunks in bf16 (an older mutant)",
        _ACCUMULATOR,
    ),
    Row(
        "nondeterminism",
        f"{_LINEAR}:chunk_order_per_call",
        "full chunks processed in a per-call random order",
        _NONDETERMINISM,
    ),
    Row(
        "nondeterminism",
        f"{_LINEAR}:row_order_per_call",
        "rows assigned to chunks in a per-call random order",
        _NONDETERMINISM,
    ),
    Row(
        "narrow intermediate",
        f"{_LINEAR}:row_loss_bf16",
        "each per-row loss rounded to bf16 before the reduction",
        _NARROW,
    ),
    Row("narrow intermediate", f"{_LINEAR}:stats_bf16", "recompute's per-row (max, log-sum) kept in bf16", _NARROW),
    Row(
        "narrow intermediate",
        f"{_LINEAR}:loss_bf16",
        "eager-based: the loss rounded through bf16 (an older mutant)",
        _NARROW,
    ),
    Row("quantizer edge", f"{_FP8}:mx_scale_wrong_way", "E8M0 RCEIL floors, FLOOR ceils (an older mutant)", _QUANTIZER),
    Row("quantizer edge", f"{_FP8}:mx_rceil_log2", "E8M0 RCEIL code through an fp32 log2", _QUANTIZER),
    Row(
        "quantizer edge",
        f"{_FP8}:mx_rceil_nonstrict",
        "E8M0 RCEIL rounds exact powers of two up (>= for >)",
        _QUANTIZER,
    ),
    Row(
        "quantizer edge", f"{_FP8}:pow2_scale_log2_current", "power-of-2 current scale through an fp32 log2", _QUANTIZER
    ),
    Row(
        "quantizer edge", f"{_FP8}:pow2_scale_log2_blockwise", "power-of-2 block scale through an fp32 log2", _QUANTIZER
    ),
    Row(
        "quantizer edge", f"{_FP8}:no_saturation_mxfp8", "no saturation at the format maximum (MXFP8 FLOOR)", _QUANTIZER
    ),
    Row("quantizer edge", f"{_FP8}:no_saturation_delayed", "no saturation at the format maximum (delayed)", _QUANTIZER),
)

_RATIO = re.compile(r"error/bound (inf|nan|[0-9.]+(?:e[+-]?\d+)?)", re.IGNORECASE)


@dataclass
class Catch:
    """One failing property: its name, the margin (error/bound, ``None`` when the failure states none) and the
    failure's first line after the case."""

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
    select: list[str]
    caught: bool
    catches: list[Catch] = field(default_factory=list)
    seconds_to_first_failure: float | None = None
    passed: list[str] = field(default_factory=list)
    skipped: int = 0
    seconds: float = 0.0
    note: str = ""


def _cell(text: str) -> str:
    """``text`` safe inside a Markdown table cell."""
    return text.replace("|", "\\|")


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


def detect_in_process(spec: str, properties: tuple[str, ...] | None) -> dict[str, Any]:
    """Run ``properties`` (all of the impl's kind when ``None``) on the one impl ``spec`` loads, under the ci
    profile without shrinking; the raw findings as a dict (``name``, per property status, message, seconds)."""
    from hypothesis import Phase, settings

    from numcheck.properties.check import _TABLES, _load, _run_drawn

    impl = _load(spec)
    table = _TABLES[impl.kind]
    names = list(properties) if properties is not None else list(table)
    base = settings(settings.get_profile("numcheck-ci"), phases=[p for p in Phase if p is not Phase.shrink])
    out = []
    for name in names:
        t0 = time.monotonic()
        v = _run_drawn(table[name], impl, base)
        out.append(
            {"property": name, "status": v.status, "message": v.message, "seconds": round(time.monotonic() - t0, 2)}
        )
    return {"name": impl.name, "results": out}


def _detection(row: Row, raw: dict[str, Any], seconds: float, select: list[str]) -> Detection:
    """The table row of one mutant from :func:`detect_in_process`'s findings."""
    det = Detection(
        mutant=raw["name"],
        bug_class=row.bug_class,
        change=row.change,
        spec=row.spec,
        select=select,
        caught=False,
        seconds=round(seconds, 1),
    )
    elapsed = 0.0
    for r in raw["results"]:
        elapsed += r["seconds"]
        if r["status"] == "failed":
            det.catches.append(Catch(r["property"], _margin(r["message"]), _failure_kind(r["message"])))
            if det.seconds_to_first_failure is None:
                det.seconds_to_first_failure = round(elapsed, 1)
        elif r["status"] == "passed":
            det.passed.append(r["property"])
        else:
            det.skipped += 1
    det.caught = bool(det.catches)
    return det


def run_mutant(row: Row, *, all_properties: bool, timeout: float) -> Detection:
    """One mutant in a fresh process (``python tools/detection.py --one SPEC [PROPERTY ...]``)."""
    select = [] if all_properties else list(row.select)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--one", row.spec, *select]
    env = {k: v for k, v in os.environ.items() if k not in ("NUMCHECK_HYPOTHESIS_PROFILE", "NUMCHECK_CI_EXAMPLES")}
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return Detection(
            row.spec.rsplit(":", 1)[1],
            row.bug_class,
            row.change,
            row.spec,
            select,
            caught=False,
            seconds=round(time.monotonic() - t0, 1),
            note=f"timed out after {timeout:.0f} s",
        )
    seconds = time.monotonic() - t0
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or [""])[-1]
        return Detection(
            row.spec.rsplit(":", 1)[1],
            row.bug_class,
            row.change,
            row.spec,
            select,
            caught=False,
            seconds=round(seconds, 1),
            note=f"exit {proc.returncode}: {tail}"[:300],
        )
    return _detection(row, json.loads(lines[-1]), seconds, select or ["(all)"])


def _fmt_ratio(r: float | None) -> str:
    return "—" if r is None else (f"{r:.3g}" if r < 1e6 else f"{r:.2e}")


def to_markdown(dets: list[Detection], header: str) -> str:
    """The detection table: one row per mutant."""
    lines = [
        header,
        "",
        "| class | mutant | change | caught | caught by (margin: error/bound of the first failing draw, or the "
        "failure) | s to first failure | passed (ran, did not catch it) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for d in dets:
        by = (
            "<br>".join(
                f"`{c.property}` {_fmt_ratio(c.ratio)}" + ("" if c.ratio is not None else f" ({_cell(c.kind)})")
                for c in d.catches
            )
            or "—"
        )
        first = "—" if d.seconds_to_first_failure is None else f"{d.seconds_to_first_failure:.1f}"
        lines.append(
            f"| {d.bug_class} | `{d.mutant}` | {d.change} | {'yes' if d.caught else '**NO**'} | {by} | "
            f"{first} | {', '.join(f'`{p}`' for p in d.passed) or '—'} |"
        )
    missed = [d for d in dets if not d.caught]
    lines += ["", f"{len(dets) - len(missed)} of {len(dets)} mutants caught by the ci profile."]
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--mutant",
        action="append",
        default=[],
        metavar="NAME",
        help="only this mutant (its spec's attribute, e.g. gw_bf16_sum; repeatable)",
    )
    p.add_argument(
        "--all-properties",
        action="store_true",
        help="run every drawn property of the suite per mutant, not only its class's",
    )
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per mutant's run (default 600)")
    p.add_argument(
        "--out",
        type=Path,
        default=Path("numcheck-detection"),
        metavar="DIR",
        help="where detection.json and detection.md go (default ./numcheck-detection)",
    )


def run(args: argparse.Namespace) -> int:
    if importlib.util.find_spec(_LINEAR) is None:
        print(
            f"detection: {_LINEAR} is not importable: the mutants are numcheck's own tests, shipped only "
            "in a checkout (run from one, with it on PYTHONPATH)",
            file=sys.stderr,
        )
        return 2
    known = {r.spec.rsplit(":", 1)[1]: r for r in ROWS}
    unknown = [m for m in args.mutant if m not in known]
    if unknown:
        print(f"detection: unknown mutant(s) {unknown}; known: {sorted(known)}", file=sys.stderr)
        return 2
    rows = [known[m] for m in args.mutant] if args.mutant else list(ROWS)
    import torch

    dets: list[Detection] = []
    for row in rows:
        d = run_mutant(row, all_properties=args.all_properties, timeout=args.timeout)
        print(
            f"{d.mutant}: {'caught by ' + ', '.join(c.property for c in d.catches) if d.caught else 'NOT caught'} "
            f"({d.seconds:.0f} s)",
            file=sys.stderr,
            flush=True,
        )
        dets.append(d)
    header = (
        f"Detection under the ci profile (numcheck-ci: derandomized, 12 examples, numcheck.check's draws; the "
        f"shrink phase left out), torch {torch.__version__}, "
        f"{'CUDA' if os.environ.get('NUMCHECK_DEVICE') == 'cuda' else 'CPU'}; one process per mutant, each "
        "running the properties of its class (`python tools/detection.py`)."
    )
    md = to_markdown(dets, header)
    print(md)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "detection.md").write_text(md + "\n")
    (args.out / "detection.json").write_text(
        json.dumps(
            {"torch": torch.__version__, "profile": "numcheck-ci", "mutants": [asdict(d) for d in dets]}, indent=1
        )
        + "\n"
    )
    return 0 if all(d.caught for d in dets) else 1


def main(argv: list[str]) -> int:
    """``--one SPEC [PROPERTY ...]``: one mutant, in the process :func:`run_mutant` starts (its findings as one JSON
    line); otherwise the table (:func:`add_arguments`)."""
    from numcheck.impls import interpreter

    interpreter.arrange()
    if argv[:1] == ["--one"]:
        print(json.dumps(detect_in_process(argv[1], tuple(argv[2:]) or None)))
        return 0
    p = argparse.ArgumentParser(prog="python tools/detection.py", description=__doc__.split("\n")[0])
    add_arguments(p)
    from numcheck.properties.core import matmul_precision

    with matmul_precision.pinned():
        return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
