"""The linear-distill properties (:data:`PROPERTIES`), each ``fn(impl, case)`` raising ``PropertyFailure``:

- ``accuracy``: (a) every output within :mod:`~properties.linear_distill.tolerance`'s bound of the float64 oracle
  for the impl's declared conventions; (b) RMSE within k·RMSE of numcheck's evaluation of the declared path in the
  same dtype plus λ·RMS(expected-level bound) (:mod:`numcheck.properties.core.relative`).
- ``chunk_invariance``: accuracy on a problem of at least three chunks of the declared rows (the last ragged) and
  on the same problem with its rows reversed (every row in another chunk).
- ``ignored_rows_change_nothing``: changing the inputs of ignored rows leaves every output bitwise equal, and their
  grad_x rows exactly 0.
- ``beta_symmetry``: swapping student and teacher and β ↔ 1 − β leaves the loss unchanged (within both bounds):
  the generalised JSD's symmetry, which ties β = 0 to β = 1 (the two KLs).
- ``temperature_scaling``: at T = 2 the loss equals (T² or 1) × the loss at T = 1 with the temperature's side(s)
  of weights halved (exact in binary), within both bounds.
- ``declared_options_take_effect``: with each declared option used, the result is not the one without it.
- ``teacher_frozen``: the teacher's tensors get no gradient (``None`` or exact zeros).
- ``determinism``: two calls, bitwise equal outputs (where declared).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from numcheck.properties.core import records
from numcheck.properties.core.compare import Comparison, compare
from numcheck.properties.core.failures import fail
from numcheck.properties.core.relative import relative_judgement, yardstick_error
from numcheck.properties.linear_distill.cases import DistillCase, DistillTensors, build
from numcheck.properties.linear_distill.tolerance import OUTPUTS, distill_bounds
from numcheck.reference.linear_distill import DistillResult, linear_distill
from numcheck.reference.numerics.linear_distill import declared_path


@dataclass
class Run:
    """One call's outputs: ``loss``, ``grad_x``, ``grad_weight`` (``None`` where missing) and the teacher's grads."""

    outputs: dict[str, torch.Tensor | None]
    teacher_grads: tuple[torch.Tensor | None, torch.Tensor | None]


def run(fn: Callable[..., Any], case: DistillCase, t: DistillTensors | None = None) -> Run:
    """Call ``fn`` on the case's tensors (teacher tensors requiring grad, to see none reach them) and backward the
    case's upstream gradient in the loss's dtype."""
    t = t or build(case)
    sx, sw, tx, tw = (v.detach().clone().requires_grad_() for v in (t.sx, t.sw, t.tx, t.tw))
    loss = fn(sx, sw, tx, tw, t.target, beta=case.beta, temperature=case.temperature, ignore_index=case.ignore_index)
    loss.backward(torch.tensor(case.upstream, dtype=loss.dtype, device=loss.device))
    out = {"loss": loss.detach(), "grad_x": sx.grad, "grad_weight": sw.grad}
    return Run(out, (tx.grad, tw.grad))


def oracle(impl: Any, case: DistillCase, t: DistillTensors) -> DistillResult:
    """The float64 oracle under the impl's declared conventions."""
    return linear_distill(
        t.sx,
        t.sw,
        t.tx,
        t.tw,
        t.target,
        beta=case.beta,
        temperature=case.temperature,
        ignore_index=case.ignore_index,
        convention=impl.support.convention,
        upstream=case.upstream,
    )


def _exact(o: DistillResult) -> dict[str, torch.Tensor]:
    return {"loss": o.loss, "grad_x": o.grad_x, "grad_weight": o.grad_weight}


def _dtypes(r: Run, case: DistillCase) -> dict[str, torch.dtype]:
    return {k: (v.dtype if v is not None else case.torch_dtype) for k, v in r.outputs.items()}


def judge(
    impl: Any, case: DistillCase, t: DistillTensors | None = None
) -> tuple[dict[str, Comparison], Run, DistillResult, DistillTensors]:
    """Judgement (a) of each output (no raising): comparisons, the run, the oracle, the tensors."""
    t = t or build(case)
    r = run(impl, case, t)
    o = oracle(impl, case, t)
    bounds = distill_bounds(impl.support, case, t, o, _dtypes(r, case))
    exact = _exact(o)
    return {k: compare(k, r.outputs[k], exact[k], bounds[k]) for k in OUTPUTS}, r, o, t


def _fail_comparisons(impl: Any, prop: str, case: DistillCase, comps: dict[str, Comparison]) -> None:
    bad = [c for c in comps.values() if not c.ok]
    if bad:
        fail(impl, prop, case, *(c.describe() for c in bad), ratio=max(c.ratio for c in bad))


def _relative(impl: Any, case: DistillCase, r: Run, o: DistillResult, t: DistillTensors) -> dict[str, Any]:
    """Judgement (b) of each output against numcheck's evaluation of the declared path in the same dtype."""
    yard = run(declared_path(impl.support), case, t)
    expected = distill_bounds(impl.support, case, t, o, _dtypes(yard, case), level="expected")
    exact = _exact(o)
    out = {}
    for k in OUTPUTS:
        value = r.outputs[k]
        if value is None:
            continue
        out[k] = relative_judgement(
            k, value, exact[k], yardstick_error(yard.outputs[k], exact[k]), expected[k], yardstick="declared path"
        )
    return out


def accuracy(impl: Any, case: DistillCase) -> dict[str, float]:
    """(a) every output within its bound of the oracle; (b) relative to the declared path in the same dtype. Each
    judgement is recorded for the seed sweep (:mod:`numcheck.properties.core.records`), a failing one before the
    failure is raised."""
    comps, r, o, t = judge(impl, case)
    rel = _relative(impl, case, r, o, t) if all(c.ok for c in comps.values()) else {}
    records.note_judgements(impl.name, "accuracy", case.dtype, repr(case), comps, rel)
    _fail_comparisons(impl, "accuracy", case, comps)
    lines = [j.describe() for j in rel.values() if not j.ok]
    if lines:
        fail(impl, "accuracy", case, "judgement (b), relative to numcheck's evaluation of the declared path:", *lines)
    return {f"{k} error/bound": min(c.ratio, 1e6) for k, c in comps.items()}


def chunk_invariance(impl: Any, case: DistillCase) -> dict[str, float]:
    """Accuracy on a many-chunk problem and on the same rows reversed (each row in another chunk)."""
    comps, *_ = judge(impl, case)
    _fail_comparisons(impl, "chunk_invariance", case, comps)
    t = build(case)
    flip = DistillTensors(t.sx.flip(0), t.sw, t.tx.flip(0), t.tw, t.target.flip(0))
    comps_r, *_ = judge(impl, case, flip)
    comps_r = {k: _renamed(c, f"{k} (rows reversed)") for k, c in comps_r.items()}
    _fail_comparisons(impl, "chunk_invariance", case, comps_r)
    return {f"{k} error/bound": min(c.ratio, 1e6) for k, c in comps.items()}


def _renamed(c: Comparison, output: str) -> Comparison:
    import dataclasses

    return dataclasses.replace(c, output=output)


def ignored_rows_change_nothing(impl: Any, case: DistillCase) -> dict[str, float]:
    """New inputs on the ignored rows: every output bitwise equal; the ignored rows' grad_x exactly 0."""
    t = build(case)
    ign = t.target == case.ignore_index
    if not bool(ign.any()):
        return {}
    g = torch.Generator().manual_seed(case.seed + 1)
    noise = lambda v: torch.where(ign[:, None], (torch.randn(v.shape, generator=g) * 3).to(v.dtype).to(v.device), v)  # noqa: E731
    a = run(impl, case, t)
    b = run(impl, case, DistillTensors(noise(t.sx), t.sw, noise(t.tx), t.tw, t.target))
    lines = [
        f"{k}: differs when only the ignored rows' inputs change (max |Δ| "
        f"{float((a.outputs[k].double() - b.outputs[k].double()).abs().max()):.3g})"
        for k in OUTPUTS
        if a.outputs[k] is not None and b.outputs[k] is not None and not torch.equal(a.outputs[k], b.outputs[k])
    ]
    gx = a.outputs["grad_x"]
    if gx is not None and bool((gx[ign] != 0).any()):
        lines.append(f"grad_x: ignored rows {ign.nonzero().flatten().tolist()} get a non-zero gradient")
    if lines:
        fail(impl, "ignored_rows_change_nothing", case, *lines)
    return {}


def _loss_pair(
    impl: Any, case_a: DistillCase, ta: DistillTensors, case_b: DistillCase, tb: DistillTensors, factor: float
):
    """The two calls' losses, oracles and bounds, for a relation loss_a = factor·loss_b."""
    ca, ra, *_ = judge(impl, case_a, ta)
    cb, rb, *_ = judge(impl, case_b, tb)
    la, lb = ra.outputs["loss"].double(), rb.outputs["loss"].double()
    allowed = ca["loss"].bound_value + factor * cb["loss"].bound_value
    return float(la), float(lb), allowed, ca["loss"], cb["loss"]


def beta_symmetry(impl: Any, case: DistillCase) -> dict[str, float]:
    """JSD_β(student, teacher) = JSD_{1−β}(teacher, student): the loss with the heads swapped at 1 − β equals it."""
    t = build(case)
    swapped = DistillTensors(t.tx, t.tw, t.sx, t.sw, t.target)
    other = case.replace(beta=1.0 - case.beta, scale=case.teacher_scale, teacher_scale=case.scale)
    la, lb, allowed, *_ = _loss_pair(impl, case, t, other, swapped, 1.0)
    if not abs(la - lb) <= allowed:
        fail(
            impl,
            "beta_symmetry",
            case,
            f"loss {la:.9g} at beta={case.beta} but {lb:.9g} with student and teacher swapped at beta="
            f"{other.beta}: |Δ| {abs(la - lb):.3g} > {allowed:.3g} (the sum of both bounds)",
            ratio=abs(la - lb) / allowed,
        )
    return {"symmetry |Δ|/bound": abs(la - lb) / allowed}


def temperature_scaling(impl: Any, case: DistillCase) -> dict[str, float]:
    """loss(T=2; W) = (4 or 1)·loss(T=1; W/2) on the temperature's declared side(s) (halving is exact)."""
    sup = impl.support
    hot = case.replace(temperature=2.0)
    cold = case.replace(temperature=1.0)
    t = build(hot)
    Ts, Tt = sup.convention.temperatures(2.0)
    halved = DistillTensors(t.sx, t.sw / Ts, t.tx, t.tw / Tt, t.target)
    factor = sup.convention.scale(2.0)
    la, lb, allowed, *_ = _loss_pair(impl, hot, t, cold, halved, factor)
    if not abs(la - factor * lb) <= allowed:
        fail(
            impl,
            "temperature_scaling",
            hot,
            f"loss {la:.9g} at T=2, but {factor:g} x {lb:.9g} at T=1 with the weights of the side(s) the "
            f"declaration names (temperature_on={sup.temperature_on!r}) halved: |Δ| {abs(la - factor * lb):.3g} > "
            f"{allowed:.3g}; the temperature is not applied as declared",
            ratio=abs(la - factor * lb) / allowed,
        )
    return {"temperature |Δ|/bound": abs(la - factor * lb) / allowed}


def declared_options_take_effect(impl: Any, case: DistillCase) -> dict[str, float]:
    """With each option the case uses, the impl's result is not the oracle's without it (a wrapper that drops a
    declared option fails here, naming it)."""
    comps, r, o, t = judge(impl, case)
    lines = []
    for option, plain in (("ignore_index", {"ignored": 0}), ("temperature", {"temperature": 1.0})):
        if option not in case.options:
            continue
        bare = case.replace(**plain)
        tb = t if option == "temperature" else DistillTensors(t.sx, t.sw, t.tx, t.tw, build(bare).target)
        ob = oracle(impl, bare, tb)
        dropped_ok = compare(
            "loss", r.outputs["loss"], ob.loss, distill_bounds(impl.support, bare, tb, ob, _dtypes(r, case))["loss"]
        ).ok
        if dropped_ok and not comps["loss"].ok:
            lines.append(f"the loss is the one without {option} (declared in options): the option was dropped")
    if lines:
        fail(impl, "declared_options_take_effect", case, *lines, *(c.describe() for c in comps.values() if not c.ok))
    _fail_comparisons(impl, "declared_options_take_effect", case, comps)
    return {}


def teacher_frozen(impl: Any, case: DistillCase) -> dict[str, float]:
    """No gradient reaches the teacher's input or weight (``None`` or exact zeros)."""
    r = run(impl, case)
    bad = [
        f"{name}.grad is non-zero (max |g| {float(g.abs().max()):.3g}): the teacher is frozen"
        for name, g in zip(("teacher_x", "teacher_weight"), r.teacher_grads)
        if g is not None and bool((g != 0).any())
    ]
    if bad:
        fail(impl, "teacher_frozen", case, *bad)
    return {}


def determinism(impl: Any, case: DistillCase) -> dict[str, float]:
    """Two calls on one input give bitwise equal outputs."""
    a, b = run(impl, case), run(impl, case)
    bad = [k for k in OUTPUTS if a.outputs[k] is not None and not torch.equal(a.outputs[k], b.outputs[k])]
    if bad:
        fail(impl, "determinism", case, f"two calls differ in {bad}")
    return {}


PROPERTIES: dict[str, Callable[[Any, DistillCase], Any]] = {
    f.__name__: f
    for f in (
        accuracy,
        chunk_invariance,
        ignored_rows_change_nothing,
        beta_symmetry,
        temperature_scaling,
        declared_options_take_effect,
        teacher_frozen,
        determinism,
    )
}
