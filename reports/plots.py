"""PNG plots of a report (matplotlib, the optional ``plots`` extra). Each function takes the report
dictionary and a directory and returns the file name it wrote, or ``None`` when there was nothing to draw.

:func:`write_plots` degrades when matplotlib is absent: no files, and a message saying how to get them.
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Any

#: Every file name the plots below may write (a rewritten report replaces or removes exactly these).
PLOT_FILES: frozenset[str] = frozenset({"error_vs_length.png", "fp8_error_vs_length.png", "ratio_distribution.png",
                                        "accumulation.png"})

MISSING_MESSAGE = "matplotlib is not installed, so no plots were drawn (pip install 'numcheck[plots]' to get them)"


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _positive(v: float) -> float:
    # Log axes cannot show 0 (an exact result): such points are left out.
    return v if math.isfinite(v) and v > 0 else math.nan


def _colors(names: list[str]) -> dict[str, Any]:
    plt = _plt()
    cmap = plt.get_cmap("tab20")
    return {n: cmap(i % 20) for i, n in enumerate(names)}


def error_vs_length(report: dict, out_dir: Path, kind: str = "linear_ce") -> str | None:
    """error/bound against each output's reduction length, one panel per (dtype mode, output)."""
    plt = _plt()
    # Each output against the ladder of its own reduction axis (plus the shared base point).
    outputs = {"loss": "N", "grad_x": "V", "grad_weight": "N"} if kind == "linear_ce" else {"y": "K", "dgrad": "N", "wgrad": "M"}
    second = "ratio_expected" if kind == "linear_ce" else "ratio_true"
    first = "ratio_hard" if kind == "linear_ce" else "ratio_dq"
    cases = [c for c in report["cases"] if c["kind"] == kind and c.get("outputs") and c["group"].startswith("ladder")]
    if not cases:
        return None
    modes = sorted({c["mode"] for c in cases})
    impls = list(dict.fromkeys(c["impl"] for c in cases))
    color = _colors(impls)
    fig, axes = plt.subplots(len(modes), len(outputs), figsize=(4.2 * len(outputs), 3.2 * len(modes)), squeeze=False)
    for i, mode in enumerate(modes):
        for j, (out, axis) in enumerate(outputs.items()):
            ax = axes[i][j]
            pts: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
            for c in cases:
                if c["mode"] != mode or c["group"] not in (f"ladder:{axis}", "ladder:base"):
                    continue
                for name, o in c["outputs"].items():
                    if name.split("@")[0] == out:
                        pts[c["impl"]].append((o["reduction_length"], _positive(o[first]), _positive(o[second])))
            for impl, p in pts.items():
                p.sort()
                xs = [a for a, _, _ in p]
                ax.plot(xs, [b for _, b, _ in p], "o-", color=color[impl], ms=4, lw=0.8, label=impl)
                ax.plot(xs, [c for _, _, c in p], "o--", mfc="none", color=color[impl], ms=5, lw=0.6)
            ax.axhline(1.0, color="k", lw=1.2)
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_title(f"{out} — {mode}", fontsize=9)
            ax.set_xlabel(f"reduction length ({axis})", fontsize=8)
            ax.set_ylabel("error / bound", fontsize=8)
            ax.tick_params(labelsize=7)
    legend: dict[str, Any] = {}
    for row in axes:
        for ax in row:
            for h, lab in zip(*ax.get_legend_handles_labels()):
                legend.setdefault(lab, h)
    labels = [n for n in impls if n in legend]
    handles = [legend[n] for n in labels]
    fig.legend(handles, labels, loc="lower center", ncol=min(4, len(labels) or 1), fontsize=7)
    fig.tight_layout(rect=(0, 0.04 + 0.02 * math.ceil(len(labels) / 4), 1, 1))
    name = "error_vs_length.png" if kind == "linear_ce" else "fp8_error_vs_length.png"
    fig.savefig(out_dir / name, dpi=90)
    plt.close(fig)
    return name


def ratio_distribution(report: dict, out_dir: Path) -> str | None:
    """Box plot of error/bound (hard) over every case and output, per impl."""
    plt = _plt()
    data: dict[str, list[float]] = defaultdict(list)
    for c in report["cases"]:
        for o in c.get("outputs", {}).values():
            v = o.get("ratio_hard", math.nan)
            if math.isfinite(v) and v > 0:
                data[c["impl"]].append(v)
    if not data:
        return None
    names = list(data)[::-1]  # first impl on top
    fig, ax = plt.subplots(figsize=(8, 0.35 * len(names) + 1.2))
    try:
        ax.boxplot([data[n] for n in names], orientation="horizontal", whis=(0, 100))
    except TypeError:  # matplotlib < 3.10 has no `orientation`
        ax.boxplot([data[n] for n in names], vert=False, whis=(0, 100))
    ax.set_yticks(range(1, len(names) + 1))
    ax.set_yticklabels(names, fontsize=7)
    ax.axvline(1.0, color="r", lw=1.2)
    ax.set_xscale("log")
    ax.set_xlabel("error / bound (hard); red line: the bound", fontsize=8)
    fig.tight_layout()
    fig.savefig(out_dir / "ratio_distribution.png", dpi=90)
    plt.close(fig)
    return "ratio_distribution.png"


def accumulation(report: dict, out_dir: Path) -> str | None:
    """Relative Frobenius error of each grad_weight accumulation path against the number of chunks."""
    acc = report.get("accumulation")
    if not acc:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 4))
    for path, errs in acc["errors"].items():
        runs = acc["runs_as"][path]
        ax.plot(acc["chunks"], [_positive(e) for e in errs], "o-", ms=4,
                label=path + (f" (runs as {runs})" if runs != path else ""))
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(f"chunks K (C={acc['C']} rows each)")
    ax.set_ylabel("‖gw − exact‖_F / ‖exact‖_F")
    ax.set_title(f"grad_weight accumulation, {acc['dtype']} operands, V={acc['V']}, H={acc['H']}", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out_dir / "accumulation.png", dpi=90)
    plt.close(fig)
    return "accumulation.png"


def write_plots(report: dict, out_dir: Path) -> tuple[list[str], str]:
    """Every plot into ``out_dir``: (file names written, a note — empty, or why there are none)."""
    try:
        _plt()
    except ImportError:
        return [], MISSING_MESSAGE
    names = [error_vs_length(report, out_dir, "linear_ce"), error_vs_length(report, out_dir, "quant_linear"),
             ratio_distribution(report, out_dir), accumulation(report, out_dir)]
    return [n for n in names if n], ""
