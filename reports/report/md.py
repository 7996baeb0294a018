"""``report.md``: the report for people — what was run, which impls are accurate, by how much, and why.

Summaries are computed from the report dictionary only (the same data as ``report.json``), so a report can
be re-rendered from its JSON: :func:`render`.
"""

from __future__ import annotations

import fnmatch
import math
from collections import defaultdict
from typing import Any

from numcheck.impls.measure.memory import MiB
from numcheck.reports.report.families import FAMILIES
from numcheck.reports.report.md_rows import fmt, median


def why(info: dict) -> str:
    """What in an impl's declaration sets its error (one line): its family's sentence, none for a broken impl."""
    family = FAMILIES.get(info.get("kind"))
    return family.why(info.get("declaration") or {}) if family else ""


def impl_overview(report: dict) -> list[dict[str, Any]]:
    """One row per impl: status, case counts, worst and median error/bound, RMSE against eager, why."""
    by_impl: dict[str, list[dict]] = defaultdict(list)
    for c in report["cases"]:
        by_impl[c["impl"]].append(c)
    rows = []
    for info in report["impls"]:
        cases = by_impl.get(info["name"], [])
        # The worst judged case: one the impl raised on has no error/bound (its inf is no output's), it is counted
        # under "error".
        judged = [c for c in cases if c["status"] != "error" and not math.isnan(c.get("ratio_hard", 0.0))]
        worst = max(judged, key=lambda c: c.get("ratio_hard", 0.0), default=None)
        worst_out = ""
        if worst is not None and worst.get("outputs"):
            worst_out = max(worst["outputs"].items(), key=lambda kv: kv[1].get("ratio_hard", 0.0))[0]
        gw = [
            o["relative"]["rmse_impl"] / o["relative"]["rmse_eager"]
            for c in cases
            for n, o in c.get("outputs", {}).items()
            if n == "grad_weight" and "relative" in o and o["relative"]["rmse_eager"] > 0 and c["mode"] != "float32"
        ]
        rows.append(
            {
                "name": info["name"],
                "kind": info.get("kind") or "?",
                "status": info["status"],
                "reason": info.get("reason", ""),
                "n": len(cases),
                "pass": sum(c["status"] == "pass" for c in cases),
                "fail": sum(c["status"] == "fail" for c in cases),
                "error": sum(c["status"] == "error" for c in cases),
                "not_declared": sum((info.get("not_declared") or {}).values()),
                "worst_ratio": worst.get("ratio_hard") if worst else math.nan,
                "worst_case": worst["label"] if worst else "",
                "worst_output": worst_out,
                "median_ratio": median(c.get("ratio_hard", math.nan) for c in cases),
                "gw_vs_eager": median(gw),
                "why": why(info),
            }
        )
    return rows


def output_summary(report: dict, kind: str) -> list[dict[str, Any]]:
    """Rows per impl × dtype mode (× recipe for FP8) × output: counts, worst/median error/bound, more (its family's
    :attr:`~reports.report.families.family.ReportFamily.summary`)."""
    return FAMILIES[kind].summary(report)


def _library_of(info: dict) -> tuple[str, str] | None:
    """``(library, release)`` of an impl entry that is numcheck's adapter of a third-party library: as recorded in
    the report (``library``), or, in a report that predates that key, from the impl's name with the release not
    recorded."""
    from numcheck.properties.libraries import ADAPTER_LIBRARIES

    lib = info.get("library")
    if lib:
        return lib["name"], lib.get("release") or "unknown"
    name = next((n for pattern, n, _ in ADAPTER_LIBRARIES if fnmatch.fnmatchcase(info["name"], pattern)), None)
    return (name, "(release not recorded in this report)") if name else None


def builtins_only_note(report: dict) -> str:
    """When no impl of the user's was judged: which third-party libraries and releases numcheck's adapters judged,
    and that numcheck's own built-ins are no impl of the user's; ``""`` when an impl of the user's was judged."""
    impls = report.get("impls") or []
    if not impls or any(i.get("origin") != "built-in" for i in impls):
        return ""
    libs: dict[tuple[str, str], list[str]] = defaultdict(list)
    plain = []
    for i in impls:
        lib = _library_of(i)
        if lib:
            libs[lib].append(f"`{i['name']}`")
        else:
            plain.append(i)
    parts = [
        f"Judged: {lib} {release} (a third-party library, through numcheck's adapter(s) {', '.join(names)}): "
        f"that release's code, not code of yours"
        for (lib, release), names in libs.items()
    ]
    if plain:
        how = (
            "the --impl names given are numcheck's built-ins"
            if (report.get("grid") or {}).get("impl_specs")
            else "none was named with --impl, NUMCHECK_IMPLS or a numcheck.impls entry point"
        )
        parts.append(f"No impl of yours was judged ({how}): only numcheck's built-in impls ran")
    return ". ".join(parts) + ". Name yours with `--impl mypkg.module:impl`."


def known_divergence_lines(report: dict) -> list[str]:
    """The headline's list of the known divergences that applied (findings, not passes) and of what was not judged
    here (environment artifacts); none when none applied."""
    from numcheck.reports.report.verdict import describe, divergences

    defects, artifacts = divergences(report)
    out: list[str] = []
    if defects:
        out += [f"**Known divergences that apply here — findings, not passes ({len(defects)}):**", ""]
        out += [f"- ⚠️ {describe(d)}" for d in defects] + [""]
    if artifacts:
        out += ["**Not judged here (environment artifacts, not the library's divergence):**", ""]
        out += [f"- {describe(d)}" for d in artifacts] + [""]
    return out


def failures(report: dict) -> list[dict]:
    """Every failing or raising case."""
    return [c for c in report["cases"] if c["status"] != "pass"]


HOW_TO_READ = """\
**How to read this.** Every output of every impl is compared element by element with a float64 oracle fed
the very operands the impl's matmuls see. For each element numcheck derives how far a correct
implementation may be off — a first-order floating-point error bound built from the unit roundoff of every
dtype involved, the length of each reduction, and what the impl *declares* (its grad_weight accumulation
path, the dtype it keeps logits in). The derivation is in `properties/linear_ce/tolerance.py` (linear+CE) and
`properties/fp8/tolerance.py` (FP8).

* **error/bound** is the largest |impl − oracle| / bound over an output's elements. ≤ 1 everywhere is the
  *analytic* verdict. Two bound levels are reported: the **hard** ceiling (worst case, γₙ = n·u/(1−n·u),
  the verdict) and the **expected** level (√n·u, what random rounding typically reaches; informative only).
  A correct fp32 kernel usually sits at a few % of the hard bound and below 1 at the expected level; a
  value near or above 1 at the expected level means the kernel is as inaccurate as rounding theory allows.
* The **relative** verdict (linear+CE, after PyTorch Inductor's practice) asks that the impl's RMSE be at
  most k·eager PyTorch's on the same problem plus λ·RMS of the expected-level bound, with k (at least 2× for fp32,
  3× for bf16/fp16) and λ chosen for a false-alarm rate of 10⁻⁶ per output (docs/error-analysis.md). *RMSE vs
  eager* below 1 means more
  accurate than eager PyTorch, above 1 less; outputs an impl declares less accurately accumulated are
  shown but not judged.
* An impl that declares a less accurate path (say a bf16 grad_weight accumulator) gets a wider bound and
  passes; the price shows in its *RMSE vs eager* and in the accumulation table. Lying about it fails.
* FP8 outputs are judged twice: against the **dequantized** operands (only accumulation error is allowed:
  "accumulation") and against the **original** operands (FP8 rounding of both operands included: "total").
  SQNR is 10·log10(signal/noise) against the original operands. With bf16 outputs the FP8 ratio against
  the dequantized operands sits near 1 by construction: the fp32 accumulation error is negligible, so the
  bound is essentially the output's own rounding (u·|value|), and some element always rounds by nearly
  that much. What is informative there is the ratio against the original operands (how much of the FP8
  budget is used) and the SQNR.
* Tensor-parallel FP8 cases run on P ranks (gloo on CPU) and are judged against the same float64 oracle run on
  the unsharded tensors, with the sharded reduction's partial sums in the bound (`properties/distributed/tp_fp8/tolerance.py`):
  *accumulation* and *total* as above, per output (another rank's copy of a replicated output and a rank's partial
  bias gradient as `NAME@rankR`), and *same scale*: every rank quantized every operand with the scale of the
  unsharded tensor (the all-reduced amax), or with its blocks.
* Compare numbers only within one dtype row: bf16 errors are ~65,000× fp32's by construction.
"""


def _overview_table(rows: list[dict]) -> list[str]:
    out = [
        "| impl | kind | cases pass / fail / error | not declared | worst error/bound (output, case) | "
        "median error/bound | grad_weight RMSE vs eager (low precision, median) | what sets its error |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        if r["status"] != "ran":
            out.append(
                f"| `{r['name']}` | {r['kind']} | **{r['status']}** | — | {r['reason'].replace('|', '/')[:160]} | — | — | — |"
            )
            continue
        mark = "✅" if r["fail"] == r["error"] == 0 else "❌"
        worst = f"{fmt(r['worst_ratio'])} ({r['worst_output']}, `{r['worst_case']}`)" if r["worst_case"] else "—"
        out.append(
            f"| `{r['name']}` | {r['kind']} | {mark} {r['pass']} / {r['fail']} / {r['error']} | {r['not_declared']} | "
            f"{worst} | {fmt(r['median_ratio'])} | {fmt(r['gw_vs_eager'])} | {r['why']} |"
        )
    return out


def _summary_tables(report: dict) -> list[str]:
    """Each family's table (:data:`reports.report.families.FAMILIES`, in its order)."""
    return [line for family in FAMILIES.values() for line in family.table(report)]


def _accumulation_section(acc: dict | None) -> list[str]:
    if not acc:
        return []
    ks = acc["chunks"]
    out = [
        "## grad_weight accumulation: the four chunked paths against float64",
        "",
        f"K chunks of C={acc['C']} rows, {acc['dtype']} operands G_k [C, V={acc['V']}] and x_k [C, H={acc['H']}] drawn "
        "N(0,1), accumulated by each path's own step (`impls/builtin/grad_accum.py`) on "
        f"{acc['device']}; exact = float64 Σ G_kᵀx_k of the same values. Relative Frobenius error "
        "‖gw − exact‖_F / ‖exact‖_F after K chunks:",
        "",
        "| path | runs as here | " + " | ".join(f"K={k}" for k in ks) + " |",
        "| --- | --- | " + " | ".join("---" for _ in ks) + " |",
    ]
    for path, errs in acc["errors"].items():
        out.append(f"| `{path}` | `{acc['runs_as'][path]}` | " + " | ".join(f"{e:.2e}" for e in errs) + " |")
    out += [
        "",
        "fp32 accumulation stays at fp32 rounding level; `fallback` rounds each chunk's product to the operand "
        "dtype once (a flat error of a fraction of u_c = 2⁻⁸ for bf16, whatever K); `lowp_accum` (Liger's "
        "default `accum_dtype=None`) rounds the running sum after every chunk, so its error grows like √K. "
        "For comparison, `docs/accumulation-and-memory.md` records after 64 chunks on an H200 "
        "(V=4096, H=1024, C=256): fallback 1.7e-3, fp32 operands 1.8e-7, out_dtype 2.7e-7, bf16 accumulation "
        "9.8e-3.",
        "",
    ]
    return out


def _memory_section(mem: dict | None) -> list[str]:
    if not mem:
        return []
    if mem.get("error"):
        return ["## Memory", "", f"Memory measurement failed: {mem['error']}", ""]
    V, H, C = mem["one_chunk_shape"]
    out = [
        "## Memory (measured by `properties/linear_ce/memory.py` on the `meta` device: no allocation, exact byte counts)",
        "",
        f"One chunk of grad_weight accumulation, V={V}, H={H}, C={C}, {mem['dtype']} operands:",
        "",
        "| path | runs as | extra peak MiB | formula |",
        "| --- | --- | --- | --- |",
    ]
    for r in mem["one_chunk"]:
        out.append(f"| `{r['path']}` | `{r['runs_as']}` | {r['extra_bytes'] / MiB:.1f} | {r['formula']} |")
    N, H2, V2 = mem["impl_shape"]
    out += [
        "",
        f"Full forward + backward per linear+CE impl, N={N}, H={H2}, V={V2}, {mem['dtype']} (MiB above the inputs; "
        "*held* = kept from forward to backward):",
        "",
        "| impl | forward peak | held | held bytes/token | backward peak | total peak | note |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in mem["impls"]:
        if r.get("error"):
            out.append(f"| `{r['name']}` | — | — | — | — | — | cannot run on meta: {r['error'][:120]} |")
            continue
        note = f"opaque ops (insides not counted): {', '.join(r['opaque'])}" if r.get("opaque") else ""
        out.append(
            f"| `{r['name']}` | {r['forward_peak'] / MiB:.1f} | {r['held'] / MiB:.1f} | {r['held'] / N:.1f} | "
            f"{r['backward_peak'] / MiB:.1f} | {r['total_peak'] / MiB:.1f} | {note} |"
        )
    out.append("")
    return out


def render(report: dict, *, plots: list[str] | None = None, plot_note: str = "", comparison_md: str = "") -> str:
    """The whole ``report.md``."""
    env = report["environment"]
    grid = report.get("grid", {})
    rows = impl_overview(report)
    fails = failures(report)
    ran = [r for r in rows if r["status"] == "ran"]
    n_cases = sum(r["n"] for r in ran)
    n_pass = sum(r["pass"] for r in ran)
    lines = [
        f"# numcheck tolerance report — {env['device']}, torch {env['torch']} ({grid.get('name', '?')} grid)",
        "",
        f"{n_cases} (impl, case) runs over {len(ran)} impls: **{n_pass} pass both verdicts, "
        f"{n_cases - n_pass} do not**."
        + (
            f" {len(rows) - len(ran)} impl(s) did not run here (listed below with the reason)."
            if len(rows) > len(ran)
            else ""
        ),
        "",
    ]
    note = builtins_only_note(report)
    lines += [f"**{note}**", ""] if note else []
    lines += _section("known divergences", known_divergence_lines, report)
    lines += ["| environment | |", "| --- | --- |"]
    for k in (
        "device_name",
        "torch",
        "triton",
        "python",
        "numcheck",
        "git_commit",
        "liger_kernel",
        "platform",
        "matmul_precision",
    ):
        v = env.get(k)
        if k == "git_commit" and v and env.get("git_dirty"):
            v = f"{v} (with uncommitted changes)"
        lines.append(f"| {k.replace('_', ' ')} | {v if v is not None else '—'} |")
    caps = env.get("capabilities") or {}
    if caps:
        yes = [k for k, v in caps.items() if v is True]
        no = [k for k, v in caps.items() if v is not True]
        lines.append(f"| capabilities here | yes: {', '.join(yes) or '—'}; no: {', '.join(no) or '—'} |")
    for lib, text in (env.get("release_notes") or {}).items():
        lines.append(f"| release of {lib} | {text} |")
    lines.append(f"| grid | {grid.get('description', '')} ({grid.get('seconds', 0):.0f} s) |")
    lines += ["", HOW_TO_READ, "## Verdict per impl", ""] + _section("verdict table", _overview_table, rows) + [""]
    lines += _section("failures", _failures_section, fails)
    if comparison_md:
        lines += [comparison_md, ""]
    lines += ["## Details", ""] + _section("details", _summary_tables, report)
    lines += _section("accumulation", _accumulation_section, report.get("accumulation"))
    lines += _section("memory", _memory_section, report.get("memory"))
    lines += _plots_section(plots or [], plot_note)
    lines += _section("coverage", _not_run_section, report)
    return "\n".join(lines).rstrip() + "\n"


def _section(name: str, build: Any, *args: Any) -> list[str]:
    """The lines ``build(*args)`` gives, or a note saying why the section could not be drawn from the data (the
    data itself is in report.json)."""
    try:
        return build(*args)
    except Exception as exc:  # noqa: BLE001 - one section that cannot be drawn never costs the rest of the report
        return [
            f"*The {name} section could not be drawn from this report's data ({type(exc).__name__}: {exc}); "
            f"the data is in report.json.*",
            "",
        ]


def _failures_section(fails: list[dict]) -> list[str]:
    if not fails:
        return []
    lines = ["## Failures", "", "Each line is one failing (impl, case), with the command that reproduces it.", ""]
    for c in fails:
        detail = c.get("error") or "; ".join(c.get("failures", [])[:2])
        prop = "" if c.get("property", "accuracy") == "accuracy" else f" [property {c['property']}]"
        lines.append(f"- ❌ `{c['impl']}` on `{c['label']}`{prop} ({c['status']}): {detail[:400]}")
        if c.get("chunks"):
            lines.append(f"  - chunks: {c['chunks']}")
        if c.get("repro"):
            lines.append(f"  - reproduce: `{c['repro']}`")
    return lines + [""]


PLOT_CAPTIONS: dict[str, str] = {
    "error_vs_length.png": "Linear+CE error/bound against each output's reduction length (grad_x: V; "
    "grad_weight, reduced loss: N), one panel per output and dtype. Each impl has its own "
    "colour (shades of one colour per family, e.g. every `chunked[...]` green) and marker. "
    "Filled marks on solid lines: the hard bound (the verdict); hollow marks on dashed "
    "lines: the expected level. The black line at 1 is the bound.",
    "fp8_error_vs_length.png": "FP8 error/bound against each output's reduction length (y: K, dgrad: N, "
    "wgrad: M). Filled, solid: against the dequantized operands; hollow, dashed: "
    "against the originals.",
    "ratio_distribution.png": "Distribution of error/bound (hard) per impl over the grid's cases, one panel per "
    "dtype (rows) and output (columns); box: quartiles, whiskers: min to max, red "
    "line: the bound.",
    "accumulation.png": "Relative Frobenius error of the grad_weight accumulation paths against the number of chunks.",
}


def _plots_section(plots: list[str], note: str) -> list[str]:
    """The plots with their captions, then ``note`` (why any plot is missing), or "No plots."."""
    lines = ["## Plots", ""]
    for p in plots:
        lines += [f"![{p}]({p})", "", PLOT_CAPTIONS.get(p, ""), ""]
    if note or not plots:
        lines += [note or "No plots.", ""]
    return lines


#: How many not-run cases of one impl and reason report.md names (report.json's ``not_run`` names them all).
NAMED_NOT_RUN = 8


def _named(cases: list[dict]) -> str:
    """Some not-run cases as ``group`` (mode, label), at most :data:`NAMED_NOT_RUN` of them and how many more."""
    text = ", ".join(f"`{c['group']}` ({c.get('mode', '')}, `{c['case']}`)" for c in cases[:NAMED_NOT_RUN])
    more = len(cases) - NAMED_NOT_RUN
    return text + (f" and {more} more (all named in report.json's `not_run`)" if more > 0 else "")


def _not_run_section(report: dict) -> list[str]:
    out = ["## Coverage: what did not run, and why", ""]
    any_line = False
    for info in report["impls"]:
        if info["status"] != "ran":
            out.append(f"- `{info['name']}`: **{info['status']}** — {info['reason']}")
            any_line = True
        named: dict[str, list[dict]] = defaultdict(list)
        for c in info.get("not_run") or []:
            named[c["reason"]].append(c)
        for reason, n in sorted((info.get("not_declared") or {}).items(), key=lambda kv: -kv[1]):
            cases = f": {_named(named[reason])}" if named.get(reason) else ""
            out.append(f"- `{info['name']}`: {n} case(s) not run — {reason}{cases}")
            any_line = True
        if info.get("unreached"):
            out.append(
                f"- `{info['name']}`: declared but reached by no case of this grid (the suite draws them): "
                f"{', '.join(info['unreached'])}"
            )
            any_line = True
    if not any_line:
        out.append("Every impl ran every case of the grid, and the grid reached every behaviour each declares.")
    out += ["", "Impl descriptions (declarations in `report.json`):", ""]
    for info in report["impls"]:
        if info.get("description"):
            out.append(f"- `{info['name']}`: {info['description']}")
    return out + [""]
