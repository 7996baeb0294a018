"""The ``report.json`` schema: environment, impl entries and one record per (impl, case), built from the
property library's own results (:class:`~properties.linear_ce.accuracy.AccuracyResult`,
:class:`~properties.fp8.props.Fp8CaseResult`) — no metric is recomputed here.

Schema ``numcheck-report/3`` (non-finite floats are written as the strings ``"inf"``, ``"-inf"``, ``"nan"``
so the file is strict JSON; :func:`load` turns them back, and reads ``/1`` reports too, whose records all judge
accuracy, and ``/1``-``/2`` reports, whose kinds and case types have their names before numcheck 0.2.0:
:func:`load` gives them today's, :func:`renamed`)::

    {"schema": "numcheck-report/3",
     "environment": {"device", "device_name", "torch", "triton", "python", "numcheck", "git_commit",
                     "git_dirty", "liger_kernel", "platform", "torch_threads", "matmul_precision",
                     "capabilities": {probe: bool}},
     "grid": {"name", "description", "seconds"},
     "impls": [{"name", "kind", "origin", "status": "ran" | "unavailable" | "broken", "reason",
                "description", "declaration", "not_declared": {reason: count},
                "not_run": [{"group", "mode", "case", "reason"}], "unreached": [declared behaviour]}],
     "cases": [{"impl", "kind", "case" (repr: valid Python), "label", "group", "mode", "property", "status":
                "pass" | "fail" | "error", "error", "verdicts": {judgement: bool}, "ratio_hard",
                "ratio_expected", "seconds", "failures": [str], "repro", "chunks" (a many-chunk case: what its
                rows make of the impl's chunks),
                "outputs": {name: {"dtype", "reduction_length", "numel", "max_abs", "max_rel", "rmse",
                                   "max_ulp", "ratio_hard", "ratio_expected", "worst_index", "impl_value",
                                   "oracle_value", "bound_at_worst", "state", "nonfinite", "verdicts": {judgement: bool},
                                   ... kind-specific fields}}}],
     "accumulation": {...} (see impls.measure.accumulation), "memory": {...},
     "known_divergences": [{"impl", "library", "release", "summary", "artifact": bool, "outputs", "reason",
                            "cases_left_out": int, "cases": [str]}] (optional: a report made before it has none)}

``known_divergences`` (:mod:`reports.report.findings`) lists every recorded known divergence that applied to an impl
that ran (its release and this device), with the grid cases it left out; ``artifact`` marks an environment artifact
("not judged here"). An impl entry of numcheck's adapter of a third-party library carries ``library``: ``{"name",
"release"}``; ``environment`` may carry ``release_notes`` (library → why its release could not be told).

``property`` (new in ``/2``) is the property a record judges, as ``numcheck repro`` names it: ``accuracy`` (every
record of ``/1``), or another property of the kind's suite (:mod:`reports.report.property_grid`; group
``suite:<test>``), recorded by :func:`property_record` as pass/fail with the property's message, its
``verdicts`` ``{property: bool}``, no ``outputs``, and ``ratio_hard`` the property's largest error/bound or NaN where it
has no bound (bitwise, held bytes, refusals, determinism).

``not_run`` names every grid case the impl's declaration excludes (``not_declared`` counts them per reason);
``unreached`` lists the behaviours it declares that no case run for it has (:mod:`reports.report.coverage`).
``max_rel`` is over the elements whose oracle value is not 0; ``max_abs_oracle_zero`` (present when not 0) is the
largest |error| where it is 0.

Judgements. linear+CE: ``analytic`` (every element within the hard first-order bound of
:mod:`properties.linear_ce.tolerance`) and ``relative`` (RMSE within k× eager's, :mod:`properties.linear_ce.accuracy`; absent
where not judged). ``ratio_hard`` / ``ratio_expected`` are max |error| / bound at the hard ceiling (γ_n)
and at the expected level (√n·u). Quantized linear: ``accumulation`` (within the bound against the
dequantized-operand reference) and ``total`` (within the bound against the original operands);
``ratio_hard`` is the larger of the two ratios, ``ratio_expected`` the error against the dequantized
reference over its expected level (√n accumulation error plus the output's rounding,
:mod:`properties.fp8.tolerance`).

Distributed records (extensions of the same schema, no new required key). Distributed linear+CE (``kind``
``dist_linear_ce``, :func:`dist_record`): ``world_size``; outputs ``loss`` … and ``grad_x@rankR``; judged
``analytic``. Tensor-parallel FP8 (``tp_quant_linear``, :func:`tp_record`): ``recipe``, ``world_size``,
``parallel``, ``sequence_parallel``, ``same_scale`` (bool) and ``scale_failures``; outputs ``y``, ``dgrad``,
``wgrad``, ``bgrad`` assembled, ``NAME@rankR`` for another rank's copy of a replicated output or a rank's partial
bias gradient, ``@stepS`` for a delayed recipe's later step, each with ``ratio_dq``, ``ratio_true`` and the worst
element of the larger (``worst_vs``: ``dequantized`` or ``original``); judged ``accumulation``, ``total`` (as the
quantized linear) and ``same_scale`` (every rank quantized with the unsharded tensor's scales);
``ratio_expected`` is NaN (no expected level is derived for the sharded reduction).

Grouped FP8 records (``grouped_quant_linear``, :func:`fp8_record` on
:func:`properties.fp8.grouped.props.measure_case`): as the quantized linear's, the case a ``GroupedCase``; outputs
``y`` and ``dgrad`` assembled over the experts' rows, ``wgrad`` ``[G, N, K]`` and ``bgrad`` ``[G, N]`` stacked, each
element under its own expert's bound; ``reduction_length`` of wgrad and bgrad is the largest expert's rows.
"""

from __future__ import annotations

import json
import math
import os
import platform
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Iterable

import torch

if sys.version_info >= (3, 11):
    from importlib.resources.abc import Traversable
else:  # Python 3.10
    from importlib.abc import Traversable

from numcheck.reports.report.grid import reduction_length

SCHEMA = "numcheck-report/3"
#: The schemas :func:`load` reads (a ``/1`` report's records are all accuracy records: :func:`load` gives each
#: ``property`` = ``"accuracy"``; a ``/1`` or ``/2`` report names kinds and case types by their names before 0.2.0:
#: :func:`renamed`), so ``--compare``/``--baseline`` read reports made before ``/3``.
READS: tuple[str, ...] = ("1", "2", "3")
#: The schemas whose kinds and case reprs have their names before numcheck 0.2.0 (:func:`renamed`).
BEFORE_RENAMES: tuple[str, ...] = ("1", "2")
#: Case types renamed in 0.2.0, old → new, as they start a case's repr (``"case"``, ``"repro"``).
CASE_TYPES_RENAMED: dict[str, str] = {"QuantCase": "Fp8Case", "TPQuantCase": "TPFp8Case"}
REPO = Path(__file__).resolve().parents[2]


# -- JSON with non-finite floats as strings -------------------------------------------------------------
def _encode(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    if isinstance(v, dict):
        return {str(k): _encode(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_encode(x) for x in v]
    return v


_NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}
_FLOAT_KEYS = {
    "max_abs",
    "max_rel",
    "max_abs_oracle_zero",
    "rmse",
    "max_ulp",
    "ratio_hard",
    "ratio_expected",
    "impl_value",
    "oracle_value",
    "bound_at_worst",
    "ratio_dq",
    "ratio_true",
    "rel_fro_dq",
    "rel_fro_true",
    "sqnr_db",
    "rmse_impl",
    "rmse_eager",
    "allowed",
    "max_abs_dq",
    "rel_fro",
    "rmse_ratio",
}


def _decode(v: Any, key: str = "") -> Any:
    if isinstance(v, dict):
        return {k: _decode(x, k) for k, x in v.items()}
    if isinstance(v, list):
        return [_decode(x, key) for x in v]
    if isinstance(v, str) and v in _NONFINITE and key in _FLOAT_KEYS:
        return _NONFINITE[v]
    return v


def _rounded(v: Any) -> Any:
    # 7 significant digits: enough for every ratio and error, and a committed report stays small.
    if isinstance(v, float) and math.isfinite(v):
        return float(f"{v:.7g}")
    if isinstance(v, dict):
        return {k: _rounded(x) for k, x in v.items() if x != "" or k in ("reason", "error")}
    if isinstance(v, list):
        return [_rounded(x) for x in v]
    return v


def dumps(report: dict) -> str:
    """Strict JSON text of a report: floats to 7 significant digits, empty strings left out, one case per line
    (so two reports diff line by line)."""
    data = _encode(_rounded(report))
    cases = data.pop("cases", [])
    head = json.dumps(data, indent=1, allow_nan=False)
    body = ",\n".join(json.dumps(c, separators=(",", ":"), allow_nan=False) for c in cases)
    return head[:-2] + ',\n "cases": [\n' + body + "\n ]\n}\n"


#: What every report (and so every baseline) must hold, per part: the keys :mod:`reports.report.compare`,
#: :mod:`reports.versions` and the premerge checklist read. A file lacking one is refused by :func:`load`, by name.
REQUIRED_IMPL_KEYS: tuple[str, ...] = ("name", "status")
REQUIRED_CASE_KEYS: tuple[str, ...] = ("impl", "case", "label", "status", "verdicts")
IMPL_STATUSES: frozenset[str] = frozenset({"ran", "unavailable", "broken"})
CASE_STATUSES: frozenset[str] = frozenset({"pass", "fail", "error"})


def _where(i: int, part: str, item: Any) -> str:
    named = item.get("name") or item.get("label") or item.get("case") if isinstance(item, dict) else None
    return f"{part}[{i}]" + (f" ({named})" if isinstance(named, str) and named else "")


def validate(data: Any, source: str) -> None:
    """Raise ValueError naming ``source`` and the first thing missing or malformed in the report ``data``.

    Checks the schema tag, the ``environment``/``impls``/``cases`` sections, and in every impl entry and case
    record the keys of :data:`REQUIRED_IMPL_KEYS` / :data:`REQUIRED_CASE_KEYS` with values of the right kind.
    """
    schema = data.get("schema") if isinstance(data, dict) else None
    if not isinstance(schema, str) or not schema.startswith("numcheck-report/"):
        raise ValueError(f"{source!r} is not a numcheck report (schema {schema!r}, expected {SCHEMA!r})")
    if schema.split("/")[1].split(".")[0] not in READS:
        known = ", ".join(f"numcheck-report/{v}" for v in READS)
        raise ValueError(f"{source!r} has schema {schema!r}; this numcheck reads {known}")
    for key, kind in (("environment", dict), ("impls", list), ("cases", list)):
        if key not in data:
            raise ValueError(f"{source!r} lacks the {key!r} section of schema {SCHEMA}")
        if not isinstance(data[key], kind):
            raise ValueError(
                f"{source!r}: {key!r} must be a JSON {'object' if kind is dict else 'array'}, "
                f"got {type(data[key]).__name__}"
            )
    for part, required, statuses in (
        ("impls", REQUIRED_IMPL_KEYS, IMPL_STATUSES),
        ("cases", REQUIRED_CASE_KEYS, CASE_STATUSES),
    ):
        for i, item in enumerate(data[part]):
            where = _where(i, part, item)
            if not isinstance(item, dict):
                raise ValueError(f"{source!r}: {where} must be a JSON object, got {type(item).__name__}")
            missing = [k for k in required if k not in item]
            if missing:
                raise ValueError(
                    f"{source!r}: {where} lacks the key(s) {', '.join(map(repr, missing))} "
                    f"(every entry of {part!r} in schema {SCHEMA} has {', '.join(required)})"
                )
            if item["status"] not in statuses:
                raise ValueError(
                    f"{source!r}: {where} has status {item['status']!r}; expected one of {sorted(statuses)}"
                )
            if part == "cases":
                if not isinstance(item["verdicts"], dict):
                    raise ValueError(f"{source!r}: {where}: 'verdicts' must be an object of judgement -> bool")
                outputs = item.get("outputs", {})
                if not isinstance(outputs, dict) or not all(
                    isinstance(o, dict) and "ratio_hard" in o for o in outputs.values()
                ):
                    raise ValueError(
                        f"{source!r}: {where}: 'outputs' must map each output to an object with 'ratio_hard'"
                    )
    _validate_known(data, source)


#: The keys of every ``known_divergences`` record.
REQUIRED_KNOWN_KEYS = ("impl", "library", "release", "summary", "artifact", "cases_left_out")


def _validate_known(data: dict, source: str) -> None:
    """ValueError naming ``source`` when the optional ``known_divergences`` section is not a list of records with
    :data:`REQUIRED_KNOWN_KEYS`."""
    known = data.get("known_divergences", [])
    if not isinstance(known, list):
        raise ValueError(f"{source!r}: 'known_divergences' must be a JSON array, got {type(known).__name__}")
    for i, item in enumerate(known):
        missing = [k for k in REQUIRED_KNOWN_KEYS if not isinstance(item, dict) or k not in item]
        if missing:
            raise ValueError(
                f"{source!r}: known_divergences[{i}] lacks the key(s) {', '.join(map(repr, missing))} "
                f"(every record has {', '.join(REQUIRED_KNOWN_KEYS)})"
            )


def load(path: str | os.PathLike | Traversable) -> dict:
    """Read a report (a path, or a packaged resource), checking it with :func:`validate`; raises ValueError naming
    the file and what is wrong when it is not a complete report."""
    p = path if isinstance(path, Traversable) and not isinstance(path, Path) else Path(path)
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise ValueError(f"report file {str(p)!r} does not exist") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"report file {str(p)!r} is not JSON: {exc}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"report file {str(p)!r} cannot be read: {exc}") from None
    validate(data, str(p))
    for case in data["cases"]:
        case.setdefault("property", "accuracy")
    if data["schema"].split("/")[1].split(".")[0] in BEFORE_RENAMES:
        renamed(data, warn=not _shipped(p))
    return _decode(data)


def _shipped(p: Path | Traversable) -> bool:
    """Whether ``p`` is one of numcheck's shipped baselines (``reports/baselines/``): made before 0.2.0 and read
    through the renames, but nothing its user could rename, so read without a warning."""
    baselines = Path(__file__).resolve().parents[1] / "baselines"
    try:
        return Path(str(p)).resolve().is_relative_to(baselines)
    except (OSError, ValueError):
        return False


def renamed(data: dict, warn: bool = True) -> None:
    """Give a report made before numcheck 0.2.0 (schema ``/1``, ``/2``) today's names, in place: each impl's and
    case's ``kind`` (:data:`impls.protocols.kinds.FORMER`; one :class:`~numcheck.errors.RenamedWarning` per old
    name and process, unless ``warn`` is false) and the case type a case's ``case`` and ``repro`` start with (:data:`CASE_TYPES_RENAMED`), so
    ``--compare``/``--baseline`` key its cases as a report made today."""
    from numcheck.impls.protocols.kinds import current_name

    old_types = re.compile(r"\b(" + "|".join(CASE_TYPES_RENAMED) + r")\(")
    for item in (*data["impls"], *data["cases"]):
        if isinstance(item.get("kind"), str):
            item["kind"] = current_name(item["kind"], warn=warn)
        for key in ("case", "repro"):
            if isinstance(item.get(key), str):
                item[key] = old_types.sub(lambda m: CASE_TYPES_RENAMED[m.group(1)] + "(", item[key])


# -- environment ----------------------------------------------------------------------------------------
def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _git(*args: str) -> str | None:
    if not (REPO / ".git").exists():
        return None
    try:
        out = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def cpu_name() -> str:
    """The CPU model (``/proc/cpuinfo``'s model name where there is one)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_name(device: str) -> str:
    """Human name of ``device``: the GPU's name on CUDA, the CPU model (and core count) on CPU."""
    dev = torch.device(device)
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    return f"{cpu_name()} ({os.cpu_count()} logical cores)"


def device_label(device: str) -> str:
    """The directory label of ``device``: ``cpu``, or ``cuda-<gpu name>`` (lower case, dashes)."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return dev.type
    name = torch.cuda.get_device_name(dev).lower()
    for prefix in ("nvidia ", "amd "):
        name = name.removeprefix(prefix)
    return "cuda-" + "".join(ch if ch.isalnum() else "-" for ch in name).strip("-")


def torch_release() -> str:
    """torch's version without the local build tag (``2.13.0+cpu`` → ``2.13.0``)."""
    return torch.__version__.split("+", 1)[0]


def environment(device: str) -> dict[str, Any]:
    """Everything that identifies where and with what a report was made."""
    from numcheck.impls.measure import capabilities
    from numcheck.properties.core import matmul_precision

    try:
        caps = capabilities.summary(device)
    except Exception as exc:  # a probe machinery failure is recorded, not fatal for the report
        caps = {"error": f"{type(exc).__name__}: {exc}"}
    commit = _git("rev-parse", "HEAD")
    dirty = _git("status", "--porcelain", "--untracked-files=no")
    return {
        "device": torch.device(device).type,
        "device_name": device_name(device),
        "torch": torch.__version__,
        "triton": _version("triton"),
        "python": platform.python_version(),
        "numcheck": _version("numcheck"),
        "git_commit": commit,
        "git_dirty": bool(dirty) if dirty is not None else None,
        "liger_kernel": _version("liger-kernel"),
        "platform": platform.platform(),
        "torch_threads": torch.get_num_threads(),
        "matmul_precision": matmul_precision.describe(),
        "capabilities": caps,
    }


# -- impl entries ---------------------------------------------------------------------------------------
def dtype_names(dtypes) -> list[str]:
    """Dtypes by their names (``float32``), sorted: how a declaration's dtypes are recorded."""
    return sorted(str(d).replace("torch.", "") for d in dtypes)


# -- case records ---------------------------------------------------------------------------------------
def _f(v: Any) -> float:
    return float(v)


def _comparison_fields(c: Any) -> dict[str, Any]:
    zero = {"max_abs_oracle_zero": _f(c.max_abs_zero)} if c.max_abs_zero else {}
    return {
        "max_abs": _f(c.max_abs),
        "max_rel": _f(c.max_rel),
        **zero,
        "rmse": _f(c.rmse),
        "max_ulp": _f(c.max_ulp),
        "worst_index": list(c.worst),
        "impl_value": _f(c.impl_value),
        "oracle_value": _f(c.oracle_value),
        "bound_at_worst": _f(c.bound_value),
        "n_beyond": int(c.n_bad),
        "numel": int(c.numel),
        "state": c.state,
        "nonfinite": c.nonfinite,
        "dtype": c.dtype.replace("torch.", ""),
    }


def linear_ce_record(impl: Any, grid_case: Any, res: Any, seconds: float) -> dict[str, Any]:
    """The record of one linear+CE case from :func:`properties.linear_ce.accuracy.check_accuracy`'s result."""
    from numcheck.properties.core.failures import repro_command

    p = grid_case.case
    outputs: dict[str, Any] = {}
    for name, c in res.analytic.items():
        e = res.expected.get(name)
        rel = res.relative.get(name)
        o = _comparison_fields(c)
        o.update(
            reduction_length=reduction_length(name, p),
            ratio_hard=_f(c.ratio),
            ratio_expected=_f(e.ratio) if e is not None else math.nan,
        )
        verdicts = {"analytic": bool(c.ok)}
        if rel is not None:
            o["relative"] = {
                "judged": rel.judged,
                "ok": bool(rel.ok),
                "rmse_impl": _f(rel.rmse_impl),
                "rmse_eager": _f(rel.rmse_eager),
                "allowed": _f(rel.allowed),
                "note": rel.note,
            }
            if rel.judged:
                verdicts["relative"] = bool(rel.ok)
        o["verdicts"] = verdicts
        outputs[name] = o
    verdicts = {"analytic": all(o["verdicts"]["analytic"] for o in outputs.values())}
    judged = [o["verdicts"]["relative"] for o in outputs.values() if "relative" in o["verdicts"]]
    if judged:
        verdicts["relative"] = all(judged)
    ok = all(verdicts.values())
    rec = _base(impl, grid_case, "pass" if ok else "fail", seconds)
    rec.update(
        verdicts=verdicts,
        outputs=outputs,
        ratio_hard=max((o["ratio_hard"] for o in outputs.values()), default=0.0),
        ratio_expected=max((o["ratio_expected"] for o in outputs.values()), default=0.0),
    )
    if not ok:
        rec["failures"] = res.failure_lines()
        rec["repro"] = repro_command(impl, "accuracy", p)
    return rec


def fp8_record(impl: Any, grid_case: Any, res: Any, seconds: float) -> dict[str, Any]:
    """The record of one quantized-linear case from :func:`properties.fp8.props.measure_case`'s result (or a grouped
    case's, from :func:`properties.fp8.grouped.props.measure_case`: the same fields)."""
    from numcheck.properties.core.failures import repro_command

    case = grid_case.case
    outputs: dict[str, Any] = {}
    for name, m in res.outputs.items():
        o = _comparison_fields(m.true)
        o.update(
            reduction_length=reduction_length(name, case),
            ratio_dq=_f(m.dq.ratio),
            ratio_true=_f(m.true.ratio),
            ratio_hard=max(_f(m.dq.ratio), _f(m.true.ratio)),
            ratio_expected=_f(m.expected_ratio_dq),
            max_abs_dq=_f(m.dq.max_abs),
            rel_fro_dq=_f(m.rel_fro_dq),
            rel_fro_true=_f(m.rel_fro_true),
            sqnr_db=_f(m.sqnr_db),
            n_unspecified=int(m.n_unspecified),
            verdicts={"accumulation": bool(m.dq.ok), "total": bool(m.true.ok)},
        )
        if not m.dq.ok:
            o["failure_dq"] = m.dq.describe()
        if not m.true.ok:
            o["failure_true"] = m.true.describe()
        outputs[name] = o
    verdicts = {
        "accumulation": all(o["verdicts"]["accumulation"] for o in outputs.values()) and not res.notes,
        "total": all(o["verdicts"]["total"] for o in outputs.values()),
    }
    ok = all(verdicts.values())
    rec = _base(impl, grid_case, "pass" if ok else "fail", seconds)
    rec.update(
        recipe=case.recipe.name,
        verdicts=verdicts,
        outputs=outputs,
        notes=list(res.notes),
        ratio_hard=max((o["ratio_hard"] for o in outputs.values()), default=0.0),
        ratio_expected=max((o["ratio_expected"] for o in outputs.values()), default=0.0),
    )
    if not ok:
        lines = list(res.notes)
        for o in outputs.values():
            lines += [f"vs dequantized-operand reference: {o['failure_dq']}"] if "failure_dq" in o else []
            lines += [f"vs original-operand reference: {o['failure_true']}"] if "failure_true" in o else []
        rec["failures"] = lines
        rec["repro"] = repro_command(impl, "accuracy", case)
    return rec


def dist_record(impl: Any, grid_case: Any, comps: dict[str, Any], lines: list[str], seconds: float) -> dict[str, Any]:
    """The record of one distributed linear+CE case from :func:`properties.distributed.linear_ce.props.measure`: every output
    (the other ranks' grad_x as ``grad_x@rankR``) with its error/bound; judged ``analytic`` only (there is no
    eager counterpart at P ranks for the relative judgement)."""
    from numcheck.properties.distributed.linear_ce.props import repro_command

    case = grid_case.case
    outputs: dict[str, Any] = {}
    for name, c in comps.items():
        o = _comparison_fields(c)
        o.update(
            reduction_length=reduction_length(name, case),
            ratio_hard=_f(c.ratio),
            ratio_expected=math.nan,
            verdicts={"analytic": bool(c.ok)},
        )
        outputs[name] = o
    ok = not lines
    rec = _base(impl, grid_case, "pass" if ok else "fail", seconds)
    rec.update(
        verdicts={"analytic": ok},
        outputs=outputs,
        world_size=case.world_size,
        ratio_hard=max((o["ratio_hard"] for o in outputs.values()), default=0.0),
        ratio_expected=math.nan,
    )
    if not ok:
        rec["failures"] = list(lines)
        rec["repro"] = repro_command(impl, "dist_accuracy", case)
    return rec


def _finite(v: float) -> float | None:
    return float(v) if math.isfinite(v) else None


def oracle_record(
    impl: Any,
    grid_case: Any,
    comps: Iterable[Any],
    verdicts_of: Callable[[Any], dict[str, bool]],
    judgements: tuple[str, ...],
    failures: list[str],
    seconds: float,
) -> dict[str, Any]:
    """The record of one case of a family that judges each output against its float64 oracle with no expected
    level (linear-distill, linear-preference): per output of ``comps`` (:class:`~properties.core.compare.Comparison`,
    keyed by its ``output``) its error/bound, ``max_abs``, ``max_ulp`` (non-finite ones as ``None``) and
    ``verdicts_of(comparison)``; the case's verdict per judgement of ``judgements`` (every output's), ``ratio_hard``
    the largest error/bound; a failing case's ``failures`` lines and repro command."""
    from numcheck.properties.core.failures import repro_command

    comps = list(comps)
    outputs = {
        c.output: {
            "ratio_hard": _finite(c.ratio),
            "ratio_expected": math.nan,
            "max_abs": _finite(c.max_abs),
            "max_ulp": _finite(c.max_ulp),
            "verdicts": verdicts_of(c),
        }
        for c in comps
    }
    verdicts = {j: all(o["verdicts"][j] for o in outputs.values()) for j in judgements}
    ok = all(verdicts.values())
    rec = _base(impl, grid_case, "pass" if ok else "fail", seconds)
    rec.update(
        verdicts=verdicts,
        outputs=outputs,
        ratio_hard=_finite(max((c.ratio for c in comps), default=0.0)),
        ratio_expected=math.nan,
    )
    if not ok:
        rec["failures"] = list(failures)
        rec["repro"] = repro_command(impl, "accuracy", grid_case.case)
    return rec


def tp_record(impl: Any, grid_case: Any, m: Any, seconds: float) -> dict[str, Any]:
    """The record of one tensor-parallel FP8 case from :func:`properties.distributed.tp_fp8.props.measure`
    (:class:`~properties.distributed.tp_fp8.props.TPMeasurement`): every output with both error/bound ratios and the worst
    element of the larger, and the case's ``same_scale``."""
    from numcheck.properties.core.failures import repro_command

    case = grid_case.case
    outputs: dict[str, Any] = {}
    for name, (cdq, ctrue) in m.outputs.items():
        worst_dq = _f(cdq.ratio) >= _f(ctrue.ratio)
        o = _comparison_fields(cdq if worst_dq else ctrue)
        o.update(
            reduction_length=reduction_length(name, case),
            ratio_dq=_f(cdq.ratio),
            ratio_true=_f(ctrue.ratio),
            ratio_hard=max(_f(cdq.ratio), _f(ctrue.ratio)),
            ratio_expected=math.nan,
            max_abs_dq=_f(cdq.max_abs),
            worst_vs="dequantized" if worst_dq else "original",
            verdicts={"accumulation": bool(cdq.ok), "total": bool(ctrue.ok)},
        )
        outputs[name] = o
    lines = m.accuracy_lines
    verdicts = {
        "accumulation": all(o["verdicts"]["accumulation"] for o in outputs.values()) and not m.rank_lines,
        "total": all(o["verdicts"]["total"] for o in outputs.values()),
        "same_scale": bool(m.same_scale),
    }
    ok = all(verdicts.values())
    rec = _base(impl, grid_case, "pass" if ok else "fail", seconds)
    rec.update(
        recipe=case.recipe.name,
        world_size=case.world,
        parallel=case.parallel,
        sequence_parallel=case.sequence_parallel,
        same_scale=bool(m.same_scale),
        scale_failures=list(m.scale_lines),
        verdicts=verdicts,
        outputs=outputs,
        ratio_hard=max((o["ratio_hard"] for o in outputs.values()), default=0.0),
        ratio_expected=math.nan,
    )
    if not ok:
        rec["failures"] = lines + list(m.scale_lines)
        rec["repro"] = repro_command(impl, "dist_accuracy" if lines else "dist_same_scale", case)
    return rec


def property_record(impl: Any, grid_case: Any, metrics: Any, failure: Any, seconds: float) -> dict[str, Any]:
    """The record of one case of a property other than accuracy (:mod:`reports.report.property_grid`), judged by the
    property library's function for it: ``pass`` with its ``metrics`` (``ratio_hard`` the largest ``error/bound``
    among them, NaN where the property has no bound: bitwise, held bytes, refusals, determinism), or, from the
    :class:`~properties.core.failures.PropertyFailure` ``failure``, ``fail`` (``error`` where the impl raised) with
    the property's message as ``failures`` and its repro line as ``repro``."""
    from numcheck.properties.core.failures import judged

    items = metrics.items() if isinstance(metrics, dict) else ()
    ratios = [float(v) for k, v in items if "error/bound" in str(k)]
    rec = _base(impl, grid_case, "pass" if failure is None else ("error" if failure.raised else "fail"), seconds)
    rec.update(
        verdicts={grid_case.prop: failure is None},
        outputs={},
        ratio_hard=max(ratios) if ratios else math.nan,
        ratio_expected=math.nan,
    )
    if failure is None and isinstance(metrics, dict) and not judged(metrics):
        rec["notes"] = ["not judged: the case's drawn values do not meet the property's condition"]
    if failure is not None:
        text = str(failure)
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        repro = [ln.removeprefix("reproduce:").strip() for ln in lines if ln.startswith("reproduce:")]
        rec["failures"] = [ln for ln in lines if not ln.startswith("reproduce:")]
        rec["repro"] = repro[-1] if repro else ""
        if failure.ratio is not None:
            rec["ratio_hard"] = float(failure.ratio)
        if failure.raised:
            rec["error"] = rec["failures"][-1] if rec["failures"] else text
    return rec


def error_record(
    impl: Any,
    grid_case: Any,
    exc: BaseException,
    seconds: float,
    judgements: tuple[str, ...],
    repro: Callable[[Any, str, Any], str],
) -> dict[str, Any]:
    """The record of a case on which the impl (or the harness on its output) raised: a failure with the error, every
    judgement of its kind (``judgements``; the property's own for a property case) failed, and its kind's repro
    command (``repro(impl, property, case)``)."""
    rec = _base(impl, grid_case, "error", seconds)
    rec.update(
        error=f"{type(exc).__name__}: {exc}".strip(),
        verdicts={j: False for j in judgements},
        outputs={},
        ratio_hard=math.inf,
        ratio_expected=math.inf,
        failures=[f"raised {type(exc).__name__}: {exc}"],
    )
    prop = getattr(grid_case, "prop", "accuracy")
    if prop != "accuracy":
        rec["verdicts"] = {prop: False}
    rec["repro"] = repro(impl, prop, grid_case.case)
    return rec


def case_text(case: Any) -> str:
    """A case as valid Python naming only the fields that differ from their defaults (``Problem(N=4, H=40, V=40,
    seed=1004)``): what the report's ``case`` field holds and what ``--compare`` matches on."""
    import dataclasses

    if not dataclasses.is_dataclass(case):
        return repr(case)
    parts = []
    for f in dataclasses.fields(case):
        v = getattr(case, f.name)
        has_default = f.default is not dataclasses.MISSING
        if has_default and v == f.default:
            continue
        parts.append(repr(v) if not has_default and not parts and f.name == "recipe" else f"{f.name}={v!r}")
    return f"{type(case).__name__}({', '.join(parts)})"


def _base(impl: Any, grid_case: Any, status: str, seconds: float) -> dict[str, Any]:
    c = grid_case.case
    rec = {
        "impl": impl.name,
        "kind": impl.kind,
        "case": case_text(c),
        "label": c.short(),
        "group": grid_case.group,
        "mode": grid_case.mode,
        "property": getattr(grid_case, "prop", "accuracy"),
        "status": status,
        "seconds": round(seconds, 3),
    }
    if getattr(grid_case, "chunks", ""):
        rec["chunks"] = grid_case.chunks
    return rec
