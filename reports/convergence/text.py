"""The Markdown of a convergence run (:meth:`numcheck.properties.convergence.run.ConvergenceResult.markdown`)."""

from __future__ import annotations

from typing import Any


def _fmt(v: float) -> str:
    """A figure to three significant digits."""
    return f"{v:.3g}"


def markdown(result: Any) -> str:
    """A paragraph saying what was run and how it was judged, then one row per run: its impl, the loss at the first
    and last step, the last step's distance from float64 per metric and, for each impl under test, the worst
    ratio r against k and the verdict."""
    c, env = result.config, result.envelope
    verdict = "every impl under test stays inside" if result.ok else "**an impl under test leaves**"
    head = (
        f"**Convergence** ({c['dtype']}, {c['steps']} steps, seed {c['seed']}, {result.seconds:.1f} s): a tiny "
        f"language model (2-token context embedding, one residual tanh MLP, the impl as the linear+CE head; "
        f"SGD with momentum on a Markov source of entropy {result.entropy:.2f} nats, {100 * c['ignored']:g}% of rows "
        f"padded) trained with each head, eager in {c['dtype']} and float64. Each run's per-step distance from "
        f"float64 (the loss; the RMSE of the master parameters) is judged Inductor-style against eager's: "
        f"r(t) = (d + ℓ)/(d_eager + ℓ) ≤ k, with ℓ one rounding of the float64 value and k = K·s: K = "
        f"{_fmt(env['params'].head)}, the per-call relative judgement's multiplier for the head's gradients, "
        f"times s, the largest spread of eager's own distance across seeds {[c['seed'], *c['envelope_seeds']]} "
        f"(k = {_fmt(env['params'].k)} for the parameters, {_fmt(env['loss'].k)} for the loss). "
        f"Verdict: {verdict} the envelope."
    )
    rows = [
        "| run | impl | loss first → last | params distance (last) | loss distance (last) | worst r/k params | "
        "worst r/k loss | verdict |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for label, r in result.runs.items():
        if r.error is not None:
            rows.append(f"| {label} | `{r.impl}` | — | — | — | | | **error**: {r.error.replace('|', '/')} |")
            continue
        v = r.verdict
        cells = (
            [
                f"{_fmt(v['params'].worst_ratio)}/{_fmt(v['params'].k)} (step {v['params'].worst_step})",
                f"{_fmt(v['loss'].worst_ratio)}/{_fmt(v['loss'].k)} (step {v['loss'].worst_step})",
                "inside" if r.inside else "**outside**",
            ]
            if v
            else ["", "", "reference"]
        )
        rows.append(
            f"| {label} | `{r.impl}` | {r.loss[0]:.4f} → {r.loss[-1]:.4f} | {_fmt(r.distance['params'][-1])} | "
            f"{_fmt(r.distance['loss'][-1])} | " + " | ".join(cells) + " |"
        )
    return head + "\n\n" + "\n".join(rows) + "\n"
