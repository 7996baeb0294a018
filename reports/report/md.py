"""``report.md``: the report for people — what was run, which impls are accurate, by how much, and why.

Summaries are computed from the report dictionary only (the same data as ``report.json``), so a report can
be re-rendered from its JSON: :func:`render`.
"""

from __future__ import annotations

import fnmatch
import math
import statistics
from collections import defaultdict
from typing import Any, Iterable

from numcheck.impls.measure.memory import MiB

LINEAR_OUTPUTS = ("loss", "z_loss", "grad_x", "grad_weight", "grad_bias")
QUANT_OUTPUTS = ("y", "dgrad", "wgrad", "bgrad")


def _g(v: Any, digits: int = 3) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        if math.isnan(v):
            return "—"
        if math.isinf(v):
            return "∞"
    return f"{v:.{digits}g}"


def _median(vals: Iterable[float]) -> float:
    v = [x for x in vals if isinstance(x, (int, float)) and not math.isnan(x)]
    return statistics.median(v) if v else math.nan


def _base_output(name: str) -> str:
    return name.split("@", 1)[0]


def why(info: dict) -> str:
    """What in an impl's declaration sets its error (one line)."""
    d = info.get("declaration") or {}
    if info.get("kind") == "linear_ce":
        acc = {
            "fp32": "grad_W accumulated in fp32",
            "per_chunk_rounding": "each chunk's grad_W product rounded to the compute dtype (bound + u_c)",
            "param_dtype": "grad_W running sum kept in the parameter dtype (bound + K·u_p)",
        }.get(d.get("grad_accumulation"), "")
        if d.get("grad_accumulation") == "param_dtype" and d.get("chunk_rows") is None:
            acc += ", chunk count undeclared (K = N assumed)"
        if d.get("grad_x_accumulation", "fp32") != "fp32":
            acc += f"; grad_x summed over vocabulary chunks ({d['grad_x_accumulation']}, " + (
                f"{d['chunk_cols']} classes each)" if d.get("chunk_cols") else "one per class assumed)"
            )
        logits = "logits in fp32" if d.get("logits_dtype") == "float32" else "logits in the compute dtype"
        ce = "; softmax/gradient arithmetic in the compute dtype" if d.get("ce_dtype") == "compute" else ""
        return f"{acc}; {logits}{ce}"
    if info.get("kind") == "dist_linear_ce":
        return (
            f"vocabulary sharded over world sizes {d.get('world_sizes')} on {', '.join(d.get('backends', []))}; "
            f"grad_x all-reduced in {d.get('grad_x_reduce_dtype')}; smoothing convention {d.get('smoothing')}; "
            f"logits in {'fp32' if d.get('logits_dtype') == 'float32' else 'the compute dtype'}"
        )
    if info.get("kind") in ("quant_linear", "tp_quant_linear", "grouped_quant_linear"):
        u = d.get("accum_unit_roundoff")

        def p2(v: Any) -> str:
            return f"2^{math.log2(v):.0f}" if isinstance(v, float) and v > 0 else str(v)

        us = ", ".join(f"{k}: {p2(v)}" for k, v in sorted(u.items())) if isinstance(u, dict) else p2(u)
        text = f"FP8 operands (E4M3 u = 2^-4, E5M2 u = 2^-3) per recipe; GEMM accumulation u = {us}"
        if info.get("kind") == "grouped_quant_linear":
            text = (
                f"experts' rows in multiples of {d.get('split_alignment')}"
                f"{', empty experts' if d.get('empty_splits') else ''}; every scale per expert; "
                f"{'wgrad fused into fp32 main_grad; ' if True in d.get('fused_wgrad_accumulation', []) else ''}"
                f"{text}"
            )
        if info.get("kind") == "tp_quant_linear":
            sp = (
                "with and without SP" if len(d.get("sequence_parallel", [])) > 1 else f"SP {d.get('sequence_parallel')}"
            )
            text = (
                f"{'/'.join(d.get('parallel', []))}-parallel {sp} over world sizes {d.get('world_sizes')}, "
                f"amaxes reduced over the group; partials of a sharded reduction in "
                f"{'the output dtype' if d.get('partial_dtype') == 'output' else 'fp32'}; {text}"
            )
        return text
    return ""


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
                "median_ratio": _median(c.get("ratio_hard", math.nan) for c in cases),
                "gw_vs_eager": _median(gw),
                "why": why(info),
            }
        )
    return rows


def output_summary(report: dict, kind: str) -> list[dict[str, Any]]:
    """Rows per impl × dtype mode (× recipe for FP8) × output: counts, worst/median error/bound, more."""
    groups: dict[tuple, list[tuple[dict, dict]]] = defaultdict(list)
    for c in report["cases"]:
        if c["kind"] != kind:
            continue
        # Tensor-parallel rows: the layouts of one world size and dtype together (the worst case names its layout).
        mode = f"P={c.get('world_size')} {c['mode'].split()[-1]}" if kind == "tp_quant_linear" else c["mode"]
        for name, o in c.get("outputs", {}).items():
            key = (c["impl"], c.get("recipe", ""), mode, _base_output(name))
            groups[key].append((c, o))
    order = LINEAR_OUTPUTS if kind in ("linear_ce", "dist_linear_ce") else QUANT_OUTPUTS
    rows = []
    for (impl, recipe, mode, out), items in groups.items():
        judgements = sorted({j for _, o in items for j in o["verdicts"]})
        worst_c, worst_o = max(items, key=lambda it: it[1]["ratio_hard"])
        row = {
            "impl": impl,
            "recipe": recipe,
            "mode": mode,
            "output": out,
            "n": len(items),
            # An output not judged on j (relative, where declared less accurate) is neither a pass nor a fail of j.
            "passes": {j: sum(1 for _, o in items if o["verdicts"].get(j) is True) for j in judgements},
            "judged": {j: sum(1 for _, o in items if j in o["verdicts"]) for j in judgements},
            "worst": worst_o["ratio_hard"],
            "worst_case": worst_c["label"],
            "median": _median(o["ratio_hard"] for _, o in items),
            "median_expected": _median(o["ratio_expected"] for _, o in items),
            "max_ulp": max(o["max_ulp"] for _, o in items),
        }
        if kind == "linear_ce":
            row["rmse_vs_eager"] = _median(
                o["relative"]["rmse_impl"] / o["relative"]["rmse_eager"]
                for _, o in items
                if "relative" in o and o["relative"]["rmse_eager"] > 0
            )
        if kind == "tp_quant_linear":
            cases = {id(c): c for c, _ in items}.values()
            row["same_scale"] = (sum(bool(c.get("same_scale")) for c in cases), len(cases))
        if kind in ("quant_linear", "tp_quant_linear", "grouped_quant_linear"):
            row["median_dq"] = _median(o["ratio_dq"] for _, o in items)
            row["median_true"] = _median(o["ratio_true"] for _, o in items)
        if kind in ("quant_linear", "grouped_quant_linear"):
            row["sqnr_db"] = _median(o["sqnr_db"] for _, o in items if math.isfinite(o["sqnr_db"]))
            row["rel_fro_true"] = _median(o["rel_fro_true"] for _, o in items)
        rows.append(row)
    impl_rank = {i["name"]: k for k, i in enumerate(report["impls"])}
    rows.sort(
        key=lambda r: (
            impl_rank.get(r["impl"], 0),
            r["recipe"],
            r["mode"],
            order.index(r["output"]) if r["output"] in order else 99,
        )
    )
    return rows


def all_judged_pass(row: dict[str, Any]) -> bool:
    """Whether every judged output of an :func:`output_summary` row passes every judgement made on it."""
    return all(row["passes"].get(j, 0) == n for j, n in row["judged"].items())


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
        worst = f"{_g(r['worst_ratio'])} ({r['worst_output']}, `{r['worst_case']}`)" if r["worst_case"] else "—"
        out.append(
            f"| `{r['name']}` | {r['kind']} | {mark} {r['pass']} / {r['fail']} / {r['error']} | {r['not_declared']} | "
            f"{worst} | {_g(r['median_ratio'])} | {_g(r['gw_vs_eager'])} | {r['why']} |"
        )
    return out


def _linear_ce_table(report: dict) -> list[str]:
    """The linear+CE summary: one row per impl, dtype mode and output (none without such cases)."""
    out: list[str] = []
    lin = output_summary(report, "linear_ce")
    if lin:
        out += [
            "### Linear + cross-entropy: per impl × dtype × output",
            "",
            "Pass counts are *analytic* / *relative* (relative counts only judged outputs). Error/bound at the "
            "hard level; *expected* is the median at the √n level.",
            "",
            "| impl | dtype | output | cases | analytic pass | relative pass | worst error/bound | median | median (expected) | "
            "max ULP | RMSE vs eager (median) | worst case |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for r in lin:
            a = f"{r['passes'].get('analytic', 0)}/{r['judged'].get('analytic', 0)}"
            rel = (
                f"{r['passes'].get('relative', 0)}/{r['judged'].get('relative', 0)}"
                if r["judged"].get("relative")
                else "not judged"
            )
            flag = "" if all_judged_pass(r) else " ❌"
            out.append(
                f"| `{r['impl']}` | {r['mode']} | {r['output']} | {r['n']} | {a}{flag} | {rel} | {_g(r['worst'])} | "
                f"{_g(r['median'])} | {_g(r['median_expected'])} | {_g(r['max_ulp'])} | {_g(r['rmse_vs_eager'])} | "
                f"`{r['worst_case']}` |"
            )
        out.append("")
    return out


def _dist_table(report: dict) -> list[str]:
    """The distributed linear+CE summary: one row per impl, world size and dtype, and output."""
    out: list[str] = []
    dist = output_summary(report, "dist_linear_ce")
    if dist:
        out += [
            "### Distributed linear + cross-entropy: per impl × world size × dtype × output",
            "",
            "Each case run on P gloo ranks, the assembled outputs (and every other rank's grad_x, `grad_x@rankR`) "
            "against the unsharded float64 oracle under the sharded model's bound (`properties/distributed/linear_ce/tolerance.py`); "
            "every rank's loss must also be bitwise rank 0's.",
            "",
            "| impl | world size, dtype | output | cases | analytic pass | worst error/bound | median | max ULP | "
            "worst case |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for r in dist:
            a = f"{r['passes'].get('analytic', 0)}/{r['judged'].get('analytic', 0)}"
            flag = "" if all_judged_pass(r) else " ❌"
            out.append(
                f"| `{r['impl']}` | {r['mode']} | {r['output']} | {r['n']} | {a}{flag} | {_g(r['worst'])} | "
                f"{_g(r['median'])} | {_g(r['max_ulp'])} | `{r['worst_case']}` |"
            )
        out.append("")
    return out


def _tp_table(report: dict) -> list[str]:
    """The tensor-parallel FP8 summary: one row per impl, recipe, world size and dtype, and output."""
    out: list[str] = []
    tp = output_summary(report, "tp_quant_linear")
    if tp:
        out += [
            "### Tensor-parallel FP8 linear: per impl × recipe × world size, dtype × output",
            "",
            "Each case run on P ranks, the outputs assembled (and every other rank's copy of a replicated output, "
            "`NAME@rankR`) against the unsharded float64 oracle: *accumulation* within the sharded bound against "
            "the dequantized operands (the ranks' outputs must also assemble: replicated copies bitwise equal, "
            "delayed amaxes the group's), *total* against the original operands, *same scale*: cases whose ranks "
            "all quantized with the unsharded tensor's scales (`properties/distributed/tp_fp8/props.py`). One row holds every "
            "layout (column/row-parallel, with and without SP) of a world size; *outputs judged* counts the "
            "output over cases and ranks.",
            "",
            "| impl | recipe | world size, dtype | output | outputs judged | accumulation pass | total pass | "
            "same scale | worst error/bound | median vs dequantized | median vs original | worst case |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for r in tp:
            acc = f"{r['passes'].get('accumulation', 0)}/{r['judged'].get('accumulation', 0)}"
            tot = f"{r['passes'].get('total', 0)}/{r['judged'].get('total', 0)}"
            same, n_same = r["same_scale"]
            flag = "" if all_judged_pass(r) else " ❌"
            out.append(
                f"| `{r['impl']}` | {r['recipe']} | {r['mode']} | {r['output']} | {r['n']} | {acc}{flag} | {tot} | "
                f"{same}/{n_same}{'' if same == n_same else ' ❌'} | {_g(r['worst'])} | {_g(r['median_dq'])} | "
                f"{_g(r['median_true'])} | `{r['worst_case']}` |"
            )
        out.append("")
    return out


def _summary_tables(report: dict) -> list[str]:
    out = [*_linear_ce_table(report), *_dist_table(report), *_tp_table(report)]
    out += _quant_table(report, "quant_linear", "### FP8 quantized linear: per impl × recipe × dtype × output", "")
    out += _quant_table(
        report,
        "grouped_quant_linear",
        "### Grouped FP8 linear (mixture-of-experts): per impl × recipe × dtype × output",
        "Each case split among its experts (uneven and unaligned sizes, "
        "empty experts), every element judged under its own expert's bounds "
        "(`properties/fp8/grouped/tolerance.py`); wgrad and bgrad stacked over the experts. ",
    )
    return out


def _quant_table(report: dict, kind: str, title: str, intro: str) -> list[str]:
    """The per impl × recipe × dtype × output table of the single or the grouped FP8 linear (none without rows)."""
    out: list[str] = []
    q = output_summary(report, kind)
    if q:
        out += [
            title,
            "",
            intro
            + "*accumulation*: within the bound against the dequantized operands; *total*: within the bound against "
            "the original operands. The expected column is the error against the dequantized operands over the expected "
            "level (√n accumulation error plus the output's own rounding; informative only).",
            "",
            "| impl | recipe | dtype | output | cases | accumulation pass | total pass | worst error/bound | "
            "median vs dequantized | median vs original | median (expected) | SQNR dB (median) | "
            "rel. Frobenius error (median) |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for r in q:
            acc = f"{r['passes'].get('accumulation', 0)}/{r['judged'].get('accumulation', 0)}"
            tot = f"{r['passes'].get('total', 0)}/{r['judged'].get('total', 0)}"
            flag = "" if all_judged_pass(r) else " ❌"
            out.append(
                f"| `{r['impl']}` | {r['recipe']} | {r['mode']} | {r['output']} | {r['n']} | {acc}{flag} | {tot} | "
                f"{_g(r['worst'])} | {_g(r['median_dq'])} | {_g(r['median_true'])} | {_g(r['median_expected'])} | "
                f"{_g(r['sqnr_db'])} | {_g(r['rel_fro_true'])} |"
            )
        out.append("")
    return out


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
