"""Each impl's margins from a committed sweep: per impl and output, the worst error/bound of judgement (a) and the
worst ratio of judgement (b) (the impl's RMSE over its allowance) over every seed, dtype and world size of
``sweep.json``'s per-impl table — the two numbers a user reads to see how far a correct impl sits from failing.

    python tools/sweep_margins.py results/sweeps/distributed-cpu-torch2.13.0/sweep.json
"""

from __future__ import annotations

import json
import re
import sys
from collections import defaultdict
from pathlib import Path


def margins(sweep: dict) -> dict[tuple[str, str], list[float | None]]:
    """(impl, output without its world size) -> [worst (a), worst (b)] (None where not judged)."""
    out: dict[tuple[str, str], list[float | None]] = defaultdict(lambda: [None, None])
    for row in sweep["tightness_per_impl"]:
        b = row["output"].endswith(" (b)")
        name = re.sub(r" \(P=\d+\)", "", row["output"].removesuffix(" (b)"))
        slot = out[(row["impl"], name)]
        i = 1 if b else 0
        slot[i] = max(slot[i] or 0.0, row["max"])
    return out


def render(sweep: dict) -> str:
    seeds = [s["seed"] for s in sweep["seeds"]]
    lines = [
        f"Worst over seeds {seeds[0]}–{seeds[-1]} ({len(seeds)}), every dtype and world size; (b): RMSE / allowance.",
        "",
        "| impl | output | worst error/bound (a) | worst (b) ratio |",
        "| --- | --- | --- | --- |",
    ]
    for (impl, name), (a, b) in sorted(margins(sweep).items()):
        fa = "—" if a is None else f"{a:.3g}"
        fb = "—" if b is None else f"{b:.3g}"
        lines.append(f"| {impl} | {name} | {fa} | {fb} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(render(json.loads(Path(sys.argv[1]).read_text())))
