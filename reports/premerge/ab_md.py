"""The Markdown of ``numcheck premerge --base``: per pair the verdicts, the side-by-side worst error/bound per output,
a "Memory Benchmark" section in the shape of a pull request's (one line per torch release measured), the time
ratio, the code paths, then the claims and the convergence run."""

from __future__ import annotations

import math
from typing import Any


def _r(v: float) -> str:
    return "—" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.3g}"


def _g(v: float) -> str:
    return "∞" if v == math.inf else f"{v:.2f}×"


def accuracy_lines(p: dict[str, Any]) -> list[str]:
    """The verdicts and the per-output table of one pair."""
    a = p["accuracy"]
    n = a["n_both"]
    lines = [
        f"**Accuracy** — {n} problems both declare ({a['grid']} grid; {a['seconds']:.0f} s): "
        f"NEW {a['new_pass']}/{n} pass, BASE {a['base_pass']}/{n} pass. An output is flagged when NEW takes more "
        "than its threshold of the headroom BASE's worst error/bound leaves below the bound, (NEW − BASE)/(1 − "
        "BASE); the thresholds are 1.5× the most a correct change took (docs/premerge-ab.md).",
        "",
        "| output | BASE worst error/bound | NEW worst error/bound | growth NEW/BASE | headroom taken | threshold | |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for o in a["outputs"]:
        mark = "BASE itself fails: not judged" if o["base_fails"] else "❌ materially worse" if o["flagged"] else "✅"
        lines.append(
            f"| {o['output']} | {_r(o['base'])} | {_r(o['new'])} | {_g(o['growth'])} | {_r(o['headroom'])} | "
            f"{o['threshold']:g} | {mark} |"
        )
    lines.append("")
    for side, key in (("NEW", "new_failures"), ("BASE", "base_failures")):
        for f in a[key][:10]:
            lines.append(
                f"- {side} fails `{f['label']}`: {f['detail']}"
                + (f" — reproduce: `{f['repro']}`" if f["repro"] else "")
            )
        if len(a[key]) > 10:
            lines.append(f"- … {len(a[key]) - 10} more failures of {side}")
    for side, key in (("NEW", "only_new"), ("BASE", "only_base")):
        if a[key]:
            whys: dict[str, int] = {}
            for c in a[key]:
                whys[c["why"]] = whys.get(c["why"], 0) + 1
            lines.append(
                f"- {len(a[key])} problems only {side} declares (not compared): "
                + "; ".join(f"{k} ({v})" for k, v in whys.items())
            )
    return lines


def _mem(row: dict[str, Any]) -> str:
    if "error" in row:
        return f"cannot be measured: {row['error']}"
    return f"extra peak {row['peak_mib']:.0f} MiB, held across backward {row['held_mib']:.0f} MiB"


def memory_lines(p: dict[str, Any], runs: list[tuple[dict, dict]]) -> list[str]:
    """The "Memory Benchmark" section: one block per environment (torch release) the pair was measured in."""
    m = p["memory"]
    if "shape" not in m:
        return ["**Memory Benchmark** — the measurement failed: " + m.get("error", "?")]
    N, H, V = m["shape"]
    lines = [
        "**Memory Benchmark**",
        "",
        f"The seed's case: BT={N}, H={H}, V={V}, {m['dtype']} inputs, `{m['reduction']}`; extra peak above the "
        "inputs over forward+backward.",
        "",
        "```",
    ]
    for env, pe in runs:
        me = pe.get("memory", {})
        lines.append(f"PyTorch {env['torch']} on {me.get('where', env['device'])}:")
        if "base" not in me:
            lines.append(f"  the measurement failed: {me.get('error', '?')}")
            continue
        w = max(len(pe["base_name"]), len(pe["new_name"])) + 8
        lines.append(f"  {('BASE ' + pe['base_name'] + ':'):{w}s} {_mem(me['base'])}")
        lines.append(f"  {('NEW  ' + pe['new_name'] + ':'):{w}s} {_mem(me['new'])}")
        mt = pe.get("metrics", {})
        if "peak_change_mib" in mt:
            lines.append(
                f"  {'change:':{w}s} {mt['peak_change_mib']:+.0f} MiB peak, {mt['held_change_mib']:+.0f} MiB held"
            )
        lines += step_lines(pe.get("step", {}))
        lines.append("")
    lines[-1] = "```"
    return lines


def _step(row: dict[str, Any]) -> str:
    return f"{row['extra_mib']:.0f} MiB" if "extra_mib" in row else row.get("error", "?")


def step_lines(st: dict[str, Any]) -> list[str]:
    """The grad_weight accumulation step's extra peak of each side, one chunk at the seed's shapes."""
    if "base" not in st:
        return [f"  grad_weight step: the measurement failed: {st.get('error', '?')}"] if st else []
    head = f"  grad_weight step (one chunk, V={st['V']}, H={st['H']}, C={st['chunk']}; {st['where']}):"
    if "extra_mib" in st["base"] and "extra_mib" in st["new"]:
        return [f"{head} BASE {_step(st['base'])}, NEW {_step(st['new'])}"]
    return [head, f"    BASE: {_step(st['base'])}", f"    NEW:  {_step(st['new'])}"]


def time_lines(p: dict[str, Any]) -> list[str]:
    """The fwd+bwd time ratio, or why it was not measured."""
    t = p.get("time", {})
    if "error" in t:
        return [f"**Time** (fwd+bwd NEW/BASE): the measurement failed: {t['error']}"]
    if not t.get("measured"):
        return [f"**Time** (fwd+bwd NEW/BASE): {t.get('reason', 'not measured here')}"]
    return [
        f"**Time** (fwd+bwd NEW/BASE, seed's case): {t['ratio']:.3f} (median of {t['repeats']} interleaved "
        f"repeats; range {t['ratio_min']:.3f}–{t['ratio_max']:.3f}); NEW {t['new_median_ms']:.2f} ms, BASE "
        f"{t['base_median_ms']:.2f} ms (each repeat a median over {t['rep_ms']:.0f} ms of calls)"
    ]


def path_lines(p: dict[str, Any]) -> list[str]:
    """The gating probes and each side's matmul ops here."""
    pa = p.get("paths", {})
    if "error" in pa:
        return [f"**Code paths here**: the trace failed: {pa['error']}"]
    probes = ", ".join(f"`{k}` {'yes' if v else 'no'}" for k, v in pa["probes"].items())
    lines = [f"**Code paths here** ({pa['device']}; probes: {probes})", ""]
    for side, name in (("base", p["base_name"]), ("new", p["new_name"])):
        row = pa[side]
        ops = row.get("ops")
        desc = (
            "; ".join(f"`{k}` ×{v}" for k, v in ops.items())
            if ops
            else (row.get("ops_error") or "no matmul op dispatched (a kernel outside the dispatcher)")
        )
        extra = f"; {row['resolved']}" if "resolved" in row else ""
        lines.append(
            f"- {side.upper()} `{name}` (declares grad_weight accumulation `{row['declared']}`{extra}): {desc}"
        )
    return lines


def pair_section(p: dict[str, Any], runs: list[tuple[dict, dict]]) -> list[str]:
    """Everything of one pair; ``runs``: (environment, this pair's measurement there) for each environment."""
    head = f"### `{p['new']}` (NEW) vs `{p['base']}` (BASE)"
    if "error" in p:
        return [head, "", f"❌ cannot compare: {p['error']}", ""]
    return [head, "", *accuracy_lines(p), "", *memory_lines(p, runs), "", *time_lines(p), "", *path_lines(p), ""]


def failed_env_lines(env: dict[str, Any]) -> list[str]:
    """An environment (``--python``) whose measurement failed, with its stderr's tail."""
    tail = "\n".join(env.get("failed", "").strip().splitlines()[-12:])
    return [
        f"### ❌ `{env['python']}`: the measurement failed",
        "",
        "Nothing of this environment is compared; its claims are not verified there. The error's tail:",
        "",
        "```",
        tail,
        "```",
        "",
    ]


def claim_lines(verdicts: list[Any], source: str) -> list[str]:
    """The claims table (:class:`reports.premerge.claims.Verdict`)."""
    if not verdicts:
        return [f"**Claims**: {source}", ""]
    icon = {"true": "✅ true", "false": "❌ FALSE", "not verified": "➖ not verified here"}
    lines = [
        f"**Claims** ({source})",
        "",
        "| # | claim | metric | claimed | measured | verdict |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for v in verdicts:
        c = v.claim
        measured = "; ".join(f"{m.value:.4g} ({m.where}){'' if m.holds else ' ❌'}" for m in v.measured) or v.reason
        if v.measured and v.reason:
            measured += f"; not judged in: {v.reason}"
        lines.append(
            f"| {c.index} (line {c.line}) | {c.says} | `{c.metric}` {c.condition()} | {c.bound()} | {measured} | "
            f"{icon[v.status]} |"
        )
    return lines + [""]


def render(
    env: dict, pairs_md: list[list[str]], claims_md: list[str], convergence_md: list[str], ok: bool, failed: list[str]
) -> str:
    """The whole A/B checklist."""
    lines = [
        "## numcheck pre-merge A/B",
        "",
        f"**Result: {'✅ every comparison and claim holds' if ok else '❌ ' + '; '.join(failed)}**",
        "",
        f"- Hardware: {env['device_name']} ({env['device']}); torch {env['torch']}, Python {env['python_version']}",
        "",
    ]
    for sec in pairs_md:
        lines += sec
    lines += claims_md
    lines += convergence_md
    return "\n".join(lines) + "\n"
