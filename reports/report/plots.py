"""PNG plots of a report (matplotlib, the optional ``plots`` extra). Each function takes the report
dictionary and a directory and returns the file name it wrote, or ``None`` when the report has no cases of its
kind; it raises :class:`NotDrawable` when it has some but none can be drawn (every value NaN, infinite or 0 on a
log axis). A panel without a drawable point says so inside the figure.

:func:`write_plots` degrades when matplotlib is absent (no files, and a message saying how to get them) and never
raises: a plot that cannot be drawn is left out with a note saying why (the report's data does not depend on it).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from numcheck.impls.protocols.fp8_linear import FP8_KIND
from numcheck.impls.protocols.linear_ce import LINEAR_CE_KIND
from numcheck.reports.report.families import FAMILIES
from numcheck.reports.report.grid import MODES

#: Every file name the plots below may write (a rewritten report replaces or removes exactly these).
PLOT_FILES: frozenset[str] = frozenset(
    {"error_vs_length.png", "fp8_error_vs_length.png", "ratio_distribution.png", "accumulation.png"}
)

MISSING_MESSAGE = "matplotlib is not installed, so no plots were drawn (pip install 'numcheck[plots]' to get them)"


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _positive(v: float) -> float:
    # Log axes cannot show 0 (an exact result): such points are left out.
    return v if isinstance(v, (int, float)) and math.isfinite(v) and v > 0 else math.nan


class NotDrawable(ValueError):
    """A plot whose data holds nothing it can draw; the message says why."""


#: What a panel or plot without a drawable point says.
NOTHING_FINITE = "no finite error/bound above 0 to draw (NaN, infinite or exact: see the tables)"


#: An impl family (the name before ``[``) gets one hue of tab10; its members get lighter and darker shades of it,
#: so a family reads as a group and no two impls share a colour; the member's marker tells shades apart.
FAMILY_HUES = "tab10"
#: Markers given to the members of one family, in order.
MEMBER_MARKERS: tuple[str, ...] = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "h")


def family(name: str) -> str:
    """An impl's family: its name before ``[`` (``torch_native[chunked,acc=auto]`` → ``torch_native``)."""
    return name.split("[", 1)[0]


@dataclass(frozen=True)
class Style:
    """How one impl is drawn: a colour unique to it (a shade of its family's map) and its family-member marker."""

    color: tuple[float, float, float, float]
    marker: str


def _shade(rgb: tuple[float, float, float], t: float) -> tuple[float, float, float, float]:
    """``rgb`` mixed towards white (``t`` < 0) or black (``t`` > 0) by ``|t|``."""
    target = 0.0 if t > 0 else 1.0
    return tuple(c + abs(t) * (target - c) for c in rgb) + (1.0,)


def impl_styles(names: list[str]) -> dict[str, Style]:
    """A :class:`Style` per impl name: distinct colours (one tab10 hue per family, one shade of it per member) and
    distinct markers within a family. Past ten families the hues repeat darker."""
    plt = _plt()
    hues = plt.get_cmap(FAMILY_HUES).colors
    families = list(dict.fromkeys(family(n) for n in names))
    styles: dict[str, Style] = {}
    for f_i, fam in enumerate(families):
        members = [n for n in dict.fromkeys(names) if family(n) == fam]
        base = tuple(hues[f_i % len(hues)][:3])
        # From lighter to darker around the family's hue; one member: the hue itself.
        shades = [0.0] if len(members) == 1 else [-0.45 + 0.8 * k / (len(members) - 1) for k in range(len(members))]
        for m_i, (name, t) in enumerate(zip(members, shades)):
            color = _shade(base, t if f_i < len(hues) else min(0.6, t + 0.5))
            styles[name] = Style(color, MEMBER_MARKERS[m_i % len(MEMBER_MARKERS)])
    return styles


def _where(report: dict) -> str:
    env = report.get("environment", {})
    grid = report.get("grid", {}).get("name", "?")
    return f"{env.get('device_name') or env.get('device', '?')}, torch {env.get('torch', '?')}, {grid} grid"


def _impl_legend(fig: Any, styles: dict[str, Style], names: list[str], level_handles: list[Any], *, ncol: int) -> None:
    """The figure's legend below the panels: what filled and hollow marks and the line at 1 mean, then every impl
    (families together)."""
    from matplotlib.lines import Line2D

    handles = list(level_handles)
    labels = [h.get_label() for h in level_handles]
    for fam in dict.fromkeys(family(n) for n in names):
        for n in names:
            if family(n) == fam:
                st = styles[n]
                handles.append(Line2D([], [], color=st.color, marker=st.marker, lw=1.0, ms=5))
                labels.append(n)
    fig.legend(handles, labels, loc="lower center", ncol=ncol, fontsize=7, frameon=False)


@dataclass(frozen=True)
class _LengthPlot:
    """What :func:`error_vs_length` draws for one kind: each output against the ladder of its own reduction axis
    (plus the shared base point), the two ratios (filled, hollow) and the words for them."""

    outputs: dict[str, str]
    first: str
    second: str
    filled_means: str
    hollow_means: str
    title: str
    file: str


def _length_plot(kind: str) -> _LengthPlot:
    """The :class:`_LengthPlot` of ``kind`` (``linear_ce``, or the FP8 quantized linear for any other)."""
    if kind == LINEAR_CE_KIND:
        return _LengthPlot(
            outputs={"loss": "N", "grad_x": "V", "grad_weight": "N"},
            first="ratio_hard",
            second="ratio_expected",
            filled_means="filled, solid: error / hard bound (γₙ; the verdict)",
            hollow_means="hollow, dashed: error / expected level (√n·u; informative)",
            title="Linear + cross-entropy: error / bound against reduction length",
            file="error_vs_length.png",
        )
    return _LengthPlot(
        outputs={"y": "K", "dgrad": "N", "wgrad": "M"},
        first="ratio_dq",
        second="ratio_true",
        filled_means="filled, solid: error / bound vs the dequantized operands (accumulation)",
        hollow_means="hollow, dashed: error / bound vs the original operands (total)",
        title="FP8 quantized linear: error / bound against reduction length",
        file="fp8_error_vs_length.png",
    )


def _length_panel(
    ax: Any, cases: list[dict], mode: str, out: str, axis: str, styles: dict[str, Style], plot: _LengthPlot
) -> int:
    """One panel of :func:`error_vs_length` (``out`` in ``mode`` against reduction length ``axis``); the number of
    finite points it holds."""
    pts: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
    for c in cases:
        if c["mode"] != mode or c["group"] not in (f"ladder:{axis}", "ladder:base"):
            continue
        for name, o in c["outputs"].items():
            if name.split("@")[0] == out:
                pts[c["impl"]].append(
                    (o["reduction_length"], _positive(o.get(plot.first)), _positive(o.get(plot.second)))
                )
    finite = sum(not math.isnan(v) for p in pts.values() for _, b, c in p for v in (b, c))
    for impl, p in pts.items():
        p.sort()
        st = styles[impl]
        xs = [a for a, _, _ in p]
        ax.plot(xs, [b for _, b, _ in p], "-", marker=st.marker, color=st.color, ms=4, lw=0.8)
        ax.plot(xs, [c for _, _, c in p], "--", marker=st.marker, mfc="none", color=st.color, ms=5, lw=0.6)
    ax.axhline(1.0, color="k", lw=1.2)
    ax.set_xscale("log")
    if finite:
        ax.set_yscale("log")
    else:
        ax.text(
            0.5,
            0.5,
            NOTHING_FINITE.replace(" (", "\n("),
            transform=ax.transAxes,
            ha="center",
            va="center",
            fontsize=7,
            color="0.4",
        )
    ax.set_title(f"{out} — {mode}", fontsize=9)
    ax.set_xlabel(f"reduction length ({axis})", fontsize=8)
    ax.set_ylabel("error / bound", fontsize=8)
    ax.tick_params(labelsize=7)
    return finite


def error_vs_length(report: dict, out_dir: Path, kind: str = LINEAR_CE_KIND) -> str | None:
    """error/bound against each output's reduction length, one panel per (dtype mode, output); every impl its own
    colour (shades of one map per family) and marker; filled marks: the verdict's level, hollow: the other."""
    from matplotlib.lines import Line2D

    plt = _plt()
    plot = _length_plot(kind)
    outputs = plot.outputs
    cases = [c for c in report["cases"] if c["kind"] == kind and c.get("outputs") and c["group"].startswith("ladder")]
    if not cases:
        return None
    modes = sorted({c["mode"] for c in cases}, key=_mode_rank)
    impls = list(dict.fromkeys(c["impl"] for c in cases))
    styles = impl_styles(impls)
    ncol = 3 if len(outputs) >= 3 else 2
    legend_in = 0.2 * math.ceil((3 + len(impls)) / ncol) + 0.2  # legend height below the panels, inches
    title_in = 0.7
    height = 3.4 * len(modes) + legend_in + title_in
    fig, axes = plt.subplots(len(modes), len(outputs), figsize=(4.6 * len(outputs), height), squeeze=False)
    drawn = 0
    for i, mode in enumerate(modes):
        for j, (out, axis) in enumerate(outputs.items()):
            drawn += _length_panel(axes[i][j], cases, mode, out, axis, styles, plot)
    levels = [
        Line2D([], [], color="0.3", marker="o", lw=0.8, ms=5, label=plot.filled_means),
        Line2D([], [], color="0.3", marker="o", mfc="none", ls="--", lw=0.6, ms=5, label=plot.hollow_means),
        Line2D([], [], color="k", lw=1.2, label="black line: the bound (error / bound = 1; above it fails)"),
    ]
    if not drawn:
        plt.close(fig)
        raise NotDrawable(f"its {len(cases)} ladder case(s) hold {NOTHING_FINITE}")
    _impl_legend(fig, styles, impls, levels, ncol=ncol)
    fig.suptitle(
        f"{plot.title}\n{_where(report)} — one colour per impl (shades of one colour per family), "
        f"one marker per family member",
        fontsize=10,
    )
    fig.tight_layout(rect=(0, legend_in / height, 1, 1 - title_in / height))
    fig.savefig(out_dir / plot.file, dpi=90)
    plt.close(fig)
    return plot.file


#: The facets of :func:`ratio_distribution`: per kind, its outputs in column order (its family's ``outputs``).
DISTRIBUTION_OUTPUTS: dict[str, tuple[str, ...]] = {kind: f.outputs for kind, f in FAMILIES.items()}
#: How a row of :func:`ratio_distribution` names its kind (its family's ``label``).
KIND_LABELS: dict[str, str] = {kind: f.label for kind, f in FAMILIES.items()}


def _mode_rank(mode: str) -> tuple[int, str]:
    order = list(MODES)
    return (order.index(mode) if mode in order else len(order), mode)


#: Ratios by facet of :func:`ratio_distribution`: (kind, mode) → output → impl → error/bound (hard) values.
_Facets = dict[tuple[str, str], dict[str, dict[str, list[float]]]]


def _ratios_by_facet(report: dict) -> tuple[_Facets, int]:
    """The finite positive error/bound (hard) values of every judged output of a kind with facets, by facet; and
    how many outputs were judged in all (finite or not)."""
    data: _Facets = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    judged = 0
    for c in report["cases"]:
        if c.get("kind") not in DISTRIBUTION_OUTPUTS:
            continue
        for name, o in c.get("outputs", {}).items():
            judged += 1
            v = _positive(o.get("ratio_hard", math.nan))
            if not math.isnan(v) and name.split("@", 1)[0] in DISTRIBUTION_OUTPUTS[c["kind"]]:
                data[(c["kind"], c["mode"])][name.split("@", 1)[0]][c["impl"]].append(v)
    return data, judged


def _boxes(ax: Any, per: dict[str, list[float]], names: list[str], styles: dict[str, Style], empty: str) -> None:
    """One panel's horizontal box plots, impl ``names[k-1]`` at height k (from ``per``: impl → ratios), each in its
    impl's colour; the words ``empty`` where no impl has a value."""
    present = [(k, n) for k, n in enumerate(names, start=1) if per.get(n)]
    if present:
        kw = dict(positions=[k for k, _ in present], whis=(0, 100), widths=0.6, patch_artist=True, manage_ticks=False)
        try:
            bp = ax.boxplot([per[n] for _, n in present], orientation="horizontal", **kw)
        except TypeError:  # matplotlib < 3.10 has no `orientation`
            bp = ax.boxplot([per[n] for _, n in present], vert=False, **kw)
        for box, (_, n) in zip(bp["boxes"], present):
            box.set_facecolor(styles[n].color)
            box.set_alpha(0.8)
        for med in bp["medians"]:
            med.set_color("k")
    else:
        ax.text(
            0.5,
            0.5,
            empty,
            transform=ax.transAxes,
            ha="center",
            va="center",
            fontsize=7,
            color="0.4",
        )


def ratio_distribution(report: dict, out_dir: Path) -> str | None:
    """Box plots of error/bound (hard) per impl, faceted: one row per (kind, dtype mode), one column per output."""
    plt = _plt()
    data, judged = _ratios_by_facet(report)
    if not data:
        if judged:
            raise NotDrawable(f"its {judged} judged output(s) hold {NOTHING_FINITE}")
        return None
    kinds = [k for k in DISTRIBUTION_OUTPUTS if any(key[0] == k for key in data)]
    if not kinds:  # only kinds without a facet here (distributed ones)
        return None
    rows = [(k, m) for k in kinds for m in sorted({key[1] for key in data if key[0] == k}, key=_mode_rank)]
    cols = {
        k: [o for o in DISTRIBUTION_OUTPUTS[k] if any(o in data[(k, m)] for m in {r[1] for r in rows if r[0] == k})]
        for k in kinds
    }
    ncols = max(len(v) for v in cols.values())
    order = [i["name"] for i in report["impls"]]
    styles = impl_styles([n for n in order if any(n in per for row in data.values() for per in row.values())])
    row_impls = {r: [n for n in order if any(n in per for per in data[r].values())] for r in rows}
    heights = [0.2 * len(row_impls[r]) + 0.9 for r in rows]
    fig, axes = plt.subplots(
        len(rows),
        ncols,
        figsize=(3.3 * ncols + 1.6, sum(heights) + 1.0),
        squeeze=False,
        gridspec_kw={"height_ratios": heights},
    )
    for i, r in enumerate(rows):
        kind, mode = r
        names = row_impls[r][::-1]  # first impl on top
        for j in range(ncols):
            ax = axes[i][j]
            if j >= len(cols[kind]):
                ax.set_visible(False)
                continue
            out = cols[kind][j]
            _boxes(ax, data[r].get(out, {}), names, styles, f"no {mode} case has {out}")
            ax.set_ylim(0.4, len(names) + 0.6)
            ax.set_yticks(range(1, len(names) + 1))
            ax.set_yticklabels(names if j == 0 else [], fontsize=6)
            ax.axvline(1.0, color="r", lw=1.2)
            ax.set_xscale("log")
            ax.tick_params(axis="x", labelsize=7)
            ax.set_title(f"{out} — {KIND_LABELS[kind]}{mode}", fontsize=8)
            if i == len(rows) - 1 or all(x >= len(cols[kind]) for x in range(j, ncols)):
                ax.set_xlabel("error / bound (hard)", fontsize=7)
    fig.suptitle(
        f"Distribution of error / bound (hard) over the grid's cases, per dtype (rows) and output (columns)\n"
        f"{_where(report)} — box: quartiles, black: median, whiskers: min to max; red line: the bound "
        f"(right of it fails)",
        fontsize=9,
    )
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.6 / fig.get_size_inches()[1]))
    fig.savefig(out_dir / "ratio_distribution.png", dpi=90)
    plt.close(fig)
    return "ratio_distribution.png"


def accumulation(report: dict, out_dir: Path) -> str | None:
    """Relative Frobenius error of each grad_weight accumulation path against the number of chunks."""
    acc = report.get("accumulation")
    if not acc:
        return None
    if all(math.isnan(_positive(e)) for errs in acc["errors"].values() for e in errs):
        raise NotDrawable(f"the accumulation table holds {NOTHING_FINITE}")
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 4))
    for path, errs in acc["errors"].items():
        runs = acc["runs_as"][path]
        ax.plot(
            acc["chunks"],
            [_positive(e) for e in errs],
            "o-",
            ms=4,
            label=path + (f" (runs as {runs})" if runs != path else ""),
        )
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
    """Every plot into ``out_dir``: (file names written, a note — empty, or why some or all are not drawn). Never
    raises: a plot that cannot be drawn from the data is named in the note with the reason."""
    try:
        plt = _plt()
    except ImportError:
        return [], MISSING_MESSAGE
    plots = (
        ("error_vs_length.png", lambda: error_vs_length(report, out_dir, LINEAR_CE_KIND)),
        ("fp8_error_vs_length.png", lambda: error_vs_length(report, out_dir, FP8_KIND)),
        ("ratio_distribution.png", lambda: ratio_distribution(report, out_dir)),
        ("accumulation.png", lambda: accumulation(report, out_dir)),
    )
    names, notes = [], []
    for fname, draw in plots:
        try:
            name = draw()
        except NotDrawable as exc:
            notes.append(f"{fname} is not drawn: {exc}.")
        except Exception as exc:  # noqa: BLE001 - a plot is presentation; the report's data stands without it
            notes.append(f"{fname} is not drawn: drawing it raised {type(exc).__name__}: {exc}.")
        else:
            if name:
                names.append(name)
        finally:
            plt.close("all")
    return names, " ".join(notes)
