"""Observed error/bound of the accuracy judgements, written out for the seed sweep (``numcheck sweep``).

Off unless :func:`start` was called (numcheck's pytest plugin does, under ``--numcheck-record=DIR``): then every
call of :func:`note` appends one JSON line per judged output of an analytic comparison — the test running
(:func:`set_test`), the impl, the property, the problem's dtype label (:func:`dtype_label`), the output, its
dtype, error/bound under the hard bound, whether it was within it, and the problem. Every example hypothesis runs
is recorded, passing or failing (a failing one is noted before the property raises), so the sweep's tightness
table sees the whole distribution the suite drew, not only the worst case of each test. A z-loss output of a
problem without z-loss (identically zero) is not recorded. Judgement (b) is recorded beside (a): one row per output
it judged, named ``<output> (b)``, its ratio the impl's RMSE over the allowance (k·yardstick RMSE + slack), so the
tables give both margins a user can read.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, TextIO

#: The fields of one record, in order (the sweep reads these).
FIELDS: tuple[str, ...] = (
    "nodeid",
    "test",
    "impl",
    "property",
    "dtype",
    "output",
    "output_dtype",
    "ratio",
    "ok",
    "state",
    "problem",
)

_path: Path | None = None
_sink: TextIO | None = None
_test: dict[str, str] = {"nodeid": "", "test": ""}


def start(path: Path) -> None:
    """Record into ``path`` (a JSON-lines file, created on the first record, appended to after). Its folder is
    created now when missing; ``ValueError`` naming it when that cannot be done (before any test runs)."""
    global _path
    stop()
    _path = Path(path)
    try:
        _path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        _path = None
        raise ValueError(
            f"--numcheck-record {path.parent}: cannot create that folder for the records "
            f"({type(exc).__name__}: {exc.strerror or exc}); give a folder"
        ) from None


def stop() -> None:
    """Stop recording and close the file."""
    global _path, _sink
    if _sink is not None:
        _sink.close()
    _path, _sink = None, None


def recording() -> bool:
    """Whether :func:`note` writes anything."""
    return _path is not None


def set_test(nodeid: str = "", test: str = "") -> None:
    """The pytest test the following records belong to (node id and test function name; empty outside a test)."""
    _test.update(nodeid=nodeid, test=test)


def dtype_label(p: Any) -> str:
    """The dtype a problem (any case with ``dtype`` and ``autocast``, a linear+CE ``Problem``)'s tightness is grouped under: its dtype, with the autocast dtype where there is one
    (``float32+autocast_float16``): an AMP run's bounds are those of its compute dtype, not of its parameters'."""
    return f"{p.dtype}+autocast_{p.autocast}" if p.autocast else p.dtype


def _ratio(value: float) -> float | str:
    """error/bound as JSON takes it: a finite number, or ``"inf"`` / ``"nan"`` (strict JSON has neither)."""
    return value if math.isfinite(value) else str(value)


def note(impl: Any, prop: str, p: Any, result: Any) -> None:
    """Record every analytic comparison of ``result`` (an :class:`properties.linear_ce.accuracy.AccuracyResult`) of
    ``impl`` under property ``prop`` on ``p``, and its judgements (b); nothing when not recording."""

    # A z-loss output of a problem without z-loss is identically zero: it says nothing about a bound's tightness.
    def kept(judgements: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in judgements.items() if not (k == "z_loss" and not p.z_loss_scale)}

    note_judgements(impl.name, prop, dtype_label(p), repr(p), kept(result.analytic), kept(result.relative))


def note_judgements(
    impl_name: str, prop: str, label: str, case: str, analytic: dict[str, Any], relative: dict[str, Any]
) -> None:
    """Record one case's judgements: each analytic comparison (``output -> Comparison``) and each judgement (b)
    (``output -> RelativeJudgement``, as ``<output> (b)``) under the dtype ``label``, for any kind of case
    (``case``: its repr); nothing when not recording."""
    global _sink
    if _path is None:
        return
    if _sink is None:
        _path.parent.mkdir(parents=True, exist_ok=True)
        _sink = _path.open("a", encoding="utf-8")
    common = dict(_test, impl=impl_name, property=prop, dtype=label, problem=case)
    for output, c in analytic.items():
        row = dict(common, output=output, output_dtype=c.dtype, ratio=_ratio(c.ratio), ok=c.ok, state=c.state)
        _sink.write(json.dumps({k: row[k] for k in FIELDS}) + "\n")
    for output, r in relative.items():
        if not r.judged or not r.allowed > 0:
            continue  # not judged by (b) (too few elements, a known divergence): no ratio to record
        row = dict(
            common,
            output=f"{output} (b)",
            output_dtype=analytic[output].dtype if output in analytic else "",
            ratio=_ratio(r.rmse_impl / r.allowed),
            ok=r.ok,
            state=f"(b) relative to {r.yardstick}",
        )
        _sink.write(json.dumps({k: row[k] for k in FIELDS}) + "\n")
    _sink.flush()


def read(path: Path) -> list[dict[str, Any]]:
    """The records of one file, each checked for every field; ValueError naming the file and line otherwise."""
    rows = []
    with Path(path).open(encoding="utf-8") as fh:
        for i, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{i}: not a JSON record ({exc})") from None
            missing = [k for k in FIELDS if k not in row] if isinstance(row, dict) else list(FIELDS)
            if missing:
                raise ValueError(f"{path}:{i}: record lacks {', '.join(missing)}")
            row["ratio"] = float(row["ratio"])
            rows.append(row)
    return rows
