"""The PNGs of a convergence run (matplotlib with the Agg backend; the optional ``plots`` extra)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

#: The files :func:`plot` writes.
PLOT_FILES: tuple[str, ...] = ("convergence_loss.png", "convergence_distance.png")
MISSING = "matplotlib is not installed, so no convergence plots were drawn (pip install 'numcheck[plots]' to get them)"


def _plt() -> Any:
    try:
        import matplotlib
    except ModuleNotFoundError:
        raise ModuleNotFoundError(MISSING) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _positive(v: float) -> float:
    return v if math.isfinite(v) and v > 0 else math.nan  # a log axis cannot show 0 or inf


def _style(label: str) -> dict[str, Any]:
    if label == "float64":
        return {"color": "black", "linewidth": 2.5, "alpha": 0.5}
    if label == "eager":
        return {"color": "gray", "linestyle": "--"}
    return {"marker": ".", "markersize": 4}


def plot(result: Any, directory: Path) -> list[Path]:
    """Write :data:`PLOT_FILES` into ``directory`` (created): every run's loss per step; every run's distance
    from float64 per step and metric, with eager's envelope k·d_eager + (k − 1)·ℓ shaded."""
    plt = _plt()
    directory.mkdir(parents=True, exist_ok=True)
    c = result.config
    title = f"{c['dtype']}, seed {c['seed']}"
    runs = {label: r for label, r in result.runs.items() if r.error is None}  # a run that raised has no curve
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, r in runs.items():
        ax.plot(range(len(r.loss)), r.loss, label=f"{label} ({r.impl})" if label != r.impl else label, **_style(label))
    ax.set(xlabel="step", ylabel="training loss (nats)", title=f"Tiny LM loss curves ({title})")
    ax.axhline(result.entropy, color="green", linewidth=0.8, linestyle=":", label="source entropy")
    ax.legend(fontsize=7)
    fig.tight_layout()
    paths = [directory / PLOT_FILES[0]]
    fig.savefig(paths[0], dpi=110)
    plt.close(fig)
    metrics = list(result.envelope)
    fig, axes = plt.subplots(1, len(metrics), figsize=(6 * len(metrics), 4))
    eager = result.runs["eager"]
    for ax, m in zip(axes, metrics):
        k, lvl = result.envelope[m].k, result.level[m]
        bound = [k * d + (k - 1) * l for d, l in zip(eager.distance[m], lvl)]
        steps = range(len(bound))
        shown = [v for r in runs.values() for v in r.distance[m] + lvl if _positive(v) == v]
        low = 0.5 * min(shown) if shown else 1e-30  # a log axis has no 0: shade from below every point drawn
        ax.fill_between(
            steps,
            [low] * len(bound),
            [_positive(b) for b in bound],
            color="gray",
            alpha=0.2,
            label=f"inside: ≤ k·d_eager + (k−1)·ℓ, k={k:.3g}",
        )
        for label, r in runs.items():
            if label != "float64":
                ax.plot(steps, [_positive(v) for v in r.distance[m]], label=label, **_style(label))
        ax.plot(steps, lvl, color="green", linewidth=0.8, linestyle=":", label="rounding level ℓ")
        ax.set_yscale("log")
        what = "RMSE of master parameters" if m == "params" else "|loss − loss_float64|"
        ax.set(xlabel="step", ylabel=what, title=f"Distance from float64: {m} ({title})")
        ax.legend(fontsize=7)
    fig.tight_layout()
    paths.append(directory / PLOT_FILES[1])
    fig.savefig(paths[1], dpi=110)
    plt.close(fig)
    return paths
