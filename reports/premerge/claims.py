"""The claims file of ``numcheck premerge --base``: what a change promises, checked by measurement, not read.

A claims file (TOML, ``numcheck-claims.toml`` in the user's repository by default, or ``--claims FILE``) holds
one ``[[claim]]`` table per promise. Keys of a ``[[claim]]`` table (:data:`CLAIM_KEYS`):

``says`` (required)
    The sentence of the pull request the claim stands for, quoted in the checklist.
``metric`` (required)
    What is measured, one of :data:`METRICS`:

    * ``peak_change_mib``: NEW's forward+backward extra peak (above its inputs) minus BASE's, MiB, at the seed's
      shapes (BT=8192, H=4096, V=131072, bf16): on a CPU run measured on the ``meta`` device (the code path the
      CPU takes; nothing allocated), on CUDA by ``torch.cuda.max_memory_allocated``. Negative is a saving.
    * ``step_extra_mib``: NEW's grad_weight accumulation step's extra peak, MiB: one ``accumulation_step(gw, G,
      x)`` call at the seed's chunk (fp32 ``gw`` [131072, 4096], bf16 ``G`` [2048, 131072] and ``x`` [2048, 4096]),
      measured as the peaks are; not verified for an impl that exposes no step
      (:func:`reports.premerge.ab.step_ab`). ``step_change_mib``: NEW's step extra minus BASE's.
    * ``held_change_mib``: the same for the bytes held from forward to backward.
    * ``new_peak_mib``, ``new_held_mib``: NEW's own extra peak / bytes held, MiB (``extra peak ≤ N MiB``).
    * ``time_ratio``: NEW's forward+backward time over BASE's, the median of interleaved repeats (CUDA only).
    * ``error_growth``: the largest, over the outputs, of NEW's worst error/bound over BASE's on the problems
      both declare (``no output's error/bound worse than k×``).
``max``, ``min`` (at least one)
    The claimed bounds on the metric, inclusive (``max = 0`` and ``min = 0``: unchanged).
``device`` (optional)
    ``"cpu"`` or ``"cuda"``: the claim is about that device only (default: any device).
``torch`` (optional)
    A version specifier (``">=2.8"``, ``"<2.8"``; :mod:`packaging.specifiers`): the claim is about those torch
    releases only (default: any). Compared without local tags (``2.11.0+cu130`` is ``2.11.0``).
``pair`` (optional)
    The ``--impl`` spec (or impl name) of the NEW side the claim is about (default: every pair of the run).

A claim is judged in every environment of the run (this one, and each named with ``--python``) whose device and
torch match its ``device`` and ``torch`` and that measures its metric: false if it fails in any of them, true if it
holds in all of them (each environment's figure is reported), else "not verified here" with each environment's
reason (no CUDA device, another torch release, the metric not measured on this device, the environment's
measurement failed). A claim measured false makes premerge
exit 1. An unknown key, a missing required key or a value of the wrong type is an error naming the file, the
line and the table (:class:`ClaimsError`; premerge exits 2).
"""

from __future__ import annotations

import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from numcheck.errors import ClaimsError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 (pyproject: tomli; python_version < "3.11")
    import tomli as tomllib

#: The default claims file name, looked up in the current directory.
DEFAULT_FILE = "numcheck-claims.toml"

#: metric → (what it is, where it is measured: "any" or "cuda").
METRICS: dict[str, tuple[str, str]] = {
    "peak_change_mib": ("NEW's fwd+bwd extra peak minus BASE's at the seed's shapes, MiB", "any"),
    "step_extra_mib": ("NEW's grad_weight accumulation step's extra peak at the seed's chunk, MiB", "any"),
    "step_change_mib": ("NEW's grad_weight step extra peak minus BASE's at the seed's chunk, MiB", "any"),
    "held_change_mib": ("NEW's bytes held across backward minus BASE's at the seed's shapes, MiB", "any"),
    "new_peak_mib": ("NEW's fwd+bwd extra peak at the seed's shapes, MiB", "any"),
    "new_held_mib": ("NEW's bytes held across backward at the seed's shapes, MiB", "any"),
    "time_ratio": ("NEW's fwd+bwd time over BASE's (median of interleaved repeats)", "cuda"),
    "error_growth": ("max over outputs of NEW's worst error/bound over BASE's", "any"),
}

#: key → (required, accepted Python types).
CLAIM_KEYS: dict[str, tuple[bool, tuple[type, ...]]] = {
    "says": (True, (str,)),
    "metric": (True, (str,)),
    "max": (False, (int, float)),
    "min": (False, (int, float)),
    "device": (False, (str,)),
    "torch": (False, (str,)),
    "pair": (False, (str,)),
}

DEVICES = ("cpu", "cuda")


@dataclass(frozen=True)
class Claim:
    """One ``[[claim]]`` table, validated. ``index`` counts from 1 in file order; ``line`` is its header's."""

    index: int
    line: int
    says: str
    metric: str
    max: float | None = None
    min: float | None = None
    device: str | None = None
    torch: str | None = None
    pair: str | None = None

    def condition(self) -> str:
        """Where the claim holds, in words (``on cuda with torch >=2.8``; ``everywhere``)."""
        parts = []
        if self.device:
            parts.append(f"on {self.device}")
        if self.torch:
            parts.append(f"with torch {self.torch}")
        return " ".join(parts) if parts else "everywhere"

    def bound(self) -> str:
        """The claimed range of the metric (``≤ -1000``, ``= 0``, ``in [0.9, 1.2]``)."""
        if self.max is not None and self.min is not None:
            return f"= {self.max:g}" if self.max == self.min else f"in [{self.min:g}, {self.max:g}]"
        return f"≤ {self.max:g}" if self.max is not None else f"≥ {self.min:g}"

    def holds(self, value: float) -> bool:
        """Whether a measured value lies in the claimed range (NaN never does)."""
        if value is None or math.isnan(value):
            return False
        return (self.max is None or value <= self.max) and (self.min is None or value >= self.min)


def _claim_lines(text: str) -> list[int]:
    """Line numbers (from 1) of each ``[[claim]]`` header, in order."""
    return [i for i, line in enumerate(text.splitlines(), 1) if re.match(r"\s*\[\[\s*claim\s*\]\]", line)]


def _key_line(text: str, start: int, key: str) -> int:
    """The line of ``key = ...`` in the table whose header is on line ``start`` (the header's line if not found)."""
    lines = text.splitlines()
    pat = re.compile(r'\s*("?)' + re.escape(key) + r"\1\s*=")
    for i in range(start, len(lines)):  # lines[start] is the line after the header
        if re.match(r"\s*\[", lines[i]):
            break
        if pat.match(lines[i]):
            return i + 1
    return start


def _top_level_line(text: str, key: str) -> int:
    for i, line in enumerate(text.splitlines(), 1):
        if re.match(r"\s*\[", line):
            break
        if re.match(r'\s*"?' + re.escape(key) + r'"?\s*[=.]', line):
            return i
    for i, line in enumerate(text.splitlines(), 1):
        if re.match(r"\s*\[+\s*" + re.escape(key) + r"[\s.\]]", line):
            return i
    return 1


def parse(text: str, path: str = DEFAULT_FILE) -> list[Claim]:
    """The claims of a claims file's ``text`` (``path`` names it in errors). Raises :class:`ClaimsError`."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ClaimsError(f"{path}: not valid TOML: {exc}") from None
    for key in data:
        if key != "claim":
            raise ClaimsError(
                f"{path}:{_top_level_line(text, key)}: unknown key or table {key!r} at the top level; "
                f"a claims file holds only [[claim]] tables (keys: {', '.join(CLAIM_KEYS)})"
            )
    tables = data.get("claim", [])
    if not isinstance(tables, list):
        raise ClaimsError(f"{path}:{_top_level_line(text, 'claim')}: 'claim' must be an array of tables ([[claim]])")
    if not tables:
        raise ClaimsError(f"{path}: no [[claim]] table: nothing to check")
    heads = _claim_lines(text)
    return [_claim(t, i, heads[i - 1] if i - 1 < len(heads) else 1, text, path) for i, t in enumerate(tables, 1)]


def _claim(table: Any, index: int, line: int, text: str, path: str) -> Claim:
    """The ``index``-th ``[[claim]]`` table (header on ``line`` of ``text``) validated into a :class:`Claim`; raises
    :class:`ClaimsError` naming ``path``, the offending key's line and the table."""
    where = f"[[claim]] #{index}"
    if not isinstance(table, dict):
        raise ClaimsError(f"{path}:{line}: {where} is not a table")
    for key, value in table.items():
        if key not in CLAIM_KEYS:
            raise ClaimsError(
                f"{path}:{_key_line(text, line, key)}: unknown key {key!r} in {where}; "
                f"known keys: {', '.join(CLAIM_KEYS)}"
            )
        types = CLAIM_KEYS[key][1]
        if isinstance(value, bool) or not isinstance(value, types):
            raise ClaimsError(
                f"{path}:{_key_line(text, line, key)}: {where}: {key} = {value!r} must be "
                f"{' or '.join(t.__name__ for t in types)}"
            )
    for key, (required, _) in CLAIM_KEYS.items():
        if required and key not in table:
            raise ClaimsError(f"{path}:{line}: {where} has no {key!r} (required)")
    if table["metric"] not in METRICS:
        raise ClaimsError(
            f"{path}:{_key_line(text, line, 'metric')}: {where}: unknown metric {table['metric']!r}; "
            f"known: {', '.join(METRICS)}"
        )
    if "max" not in table and "min" not in table:
        raise ClaimsError(f"{path}:{line}: {where} states no bound: give max, min or both")
    if "max" in table and "min" in table and table["min"] > table["max"]:
        raise ClaimsError(f"{path}:{_key_line(text, line, 'min')}: {where}: min {table['min']} > max {table['max']}")
    if table.get("device") is not None and table["device"] not in DEVICES:
        raise ClaimsError(
            f"{path}:{_key_line(text, line, 'device')}: {where}: device {table['device']!r} must be "
            f"one of {', '.join(DEVICES)}"
        )
    if table.get("torch") is not None:
        try:
            SpecifierSet(table["torch"])
        except InvalidSpecifier:
            raise ClaimsError(
                f"{path}:{_key_line(text, line, 'torch')}: {where}: torch {table['torch']!r} is not a "
                f"version specifier (e.g. '>=2.8', '<2.8')"
            ) from None
    return Claim(
        index=index,
        line=line,
        says=table["says"],
        metric=table["metric"],
        max=float(table["max"]) if "max" in table else None,
        min=float(table["min"]) if "min" in table else None,
        device=table.get("device"),
        torch=table.get("torch"),
        pair=table.get("pair"),
    )


def load(path: Path) -> list[Claim]:
    """The claims of the file at ``path``. Raises :class:`ClaimsError` (unreadable, invalid TOML, bad keys)."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ClaimsError(f"{path}: cannot read the claims file: {exc}") from None
    return parse(text, str(path))


def torch_release(version: str) -> Version:
    """A torch version string without its local tag (``2.11.0+cu130`` → ``2.11.0``)."""
    try:
        return Version(Version(version).base_version)
    except InvalidVersion:
        raise ValueError(f"not a torch version: {version!r}") from None


@dataclass(frozen=True)
class Measurement:
    """A claim's metric as measured in one environment of the run: the value, where, and whether it holds."""

    where: str
    value: float
    holds: bool

    def to_json(self) -> dict[str, Any]:
        """The JSON form."""
        return {"where": self.where, "value": self.value, "holds": self.holds}


@dataclass(frozen=True)
class Verdict:
    """A claim judged on one pair: ``status`` ``true`` (it holds in every environment that measured it), ``false``
    (it fails in at least one) or ``not verified`` (none measured it); ``measured``: each environment's figure;
    ``value``/``where``: the deciding one (the first false, else the first); ``reason``: why each other environment
    could not judge it."""

    claim: Claim
    pair: str
    status: str
    value: float | None = None
    where: str = ""
    reason: str = ""
    measured: tuple[Measurement, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """The JSON form (``ab.json``'s ``claims``)."""
        c = self.claim
        return {
            "claim": c.index,
            "line": c.line,
            "says": c.says,
            "metric": c.metric,
            "max": c.max,
            "min": c.min,
            "device": c.device,
            "torch": c.torch,
            "pair": self.pair,
            "status": self.status,
            "value": self.value,
            "where": self.where,
            "reason": self.reason,
            "measured": [m.to_json() for m in self.measured],
        }


def _where(env: dict[str, Any]) -> str:
    """How an environment is named in a verdict: device, torch release, interpreter."""
    return f"{env.get('device', '?')}, torch {env.get('torch', '?')} ({env.get('python', '?')})"


def _mismatch(claim: Claim, env: dict[str, Any]) -> str:
    """Why ``env`` (``device``, ``torch``, ``cuda_available``; ``failed`` when its measurement failed) cannot verify
    ``claim``; "" when it can."""
    if env.get("failed"):
        return f"the measurement failed there: {env['failed'].strip().splitlines()[-1][:200] if env['failed'].strip() else '?'}"
    if claim.device and env["device"] != claim.device:
        if claim.device == "cuda" and not env.get("cuda_available"):
            return f"claim is about cuda; no CUDA device here (this run is on {env['device']})"
        return f"claim is about {claim.device}; this run is on {env['device']}"
    if claim.torch and torch_release(env["torch"]) not in SpecifierSet(claim.torch):
        return (
            f"claim is about torch {claim.torch}; this environment has torch {env['torch']} (point premerge at "
            f"one that has it: --python /path/to/venv/bin/python)"
        )
    if METRICS[claim.metric][1] == "cuda" and env["device"] != "cuda":
        return f"{claim.metric} is measured on CUDA only (this run is on {env['device']})"
    return ""


def judge(claims: list[Claim], runs: list[dict[str, Any]]) -> list[Verdict]:
    """Every claim on every pair it names, against the measured ``runs``.

    Each run is ``{"env": {device, torch, cuda_available, python[, failed]}, "pairs": [{"new", "base", "new_name",
    "metrics": {metric: value}}]}`` (:func:`reports.premerge.ab.measure`). A claim is judged in *every* run that
    matches its device and torch and measures its metric: false if it fails in any of them, true if it holds in all
    (each environment's figure kept), else not verified with every run's reason. Pairs are told apart by position,
    so two pairs with the same NEW spec are judged separately."""
    out: list[Verdict] = []
    first = next((r for r in runs if not r["env"].get("failed")), runs[0] if runs else {"pairs": []})
    pairs = [(i, p["new"], p.get("new_name", p["new"]), p.get("base", "")) for i, p in enumerate(first["pairs"])]
    specs = [s for _, s, _, _ in pairs]
    for c in claims:
        targets = [(i, s, b) for i, s, n, b in pairs if c.pair in (None, s, n)]
        if not targets:
            out.append(
                Verdict(
                    c,
                    c.pair or "",
                    "not verified",
                    reason=f"no pair of this run has NEW {c.pair!r} (pairs: {', '.join(specs) or 'none'})",
                )
            )
            continue
        for i, spec, base in targets:
            label = spec if specs.count(spec) == 1 else f"{spec} (vs {base})"
            out.append(_judge_one(c, i, label, runs))
    return out


def _judge_one(c: Claim, index: int, label: str, runs: list[dict[str, Any]]) -> Verdict:
    """Claim ``c`` on pair number ``index`` of each run (:func:`judge`)."""
    reasons, measured = [], []
    for r in runs:
        env = r["env"]
        where = _where(env)
        why = _mismatch(c, env)
        pair = r["pairs"][index] if not why and index < len(r["pairs"]) else None
        if not why and pair is None:
            why = "the pair was not measured in this environment"
        if not why:
            value = pair.get("metrics", {}).get(c.metric)
            if value is None or (isinstance(value, float) and math.isnan(value)):
                why = pair.get("unmeasured", {}).get(c.metric, pair.get("error") or f"{c.metric} was not measured")
            else:
                measured.append(Measurement(where, float(value), c.holds(value)))
                continue
        reasons.append(f"{where}: {why}")
    if not measured:
        return Verdict(c, label, "not verified", reason="; ".join(reasons))
    deciding = next((m for m in measured if not m.holds), measured[0])
    return Verdict(
        c,
        label,
        "true" if deciding.holds else "false",
        deciding.value,
        deciding.where,
        "; ".join(reasons),
        tuple(measured),
    )
