"""FP8 quantized-linear properties and the measurement library the reports use.

Library API:

* :func:`run_fp8_impl` — forward + backward of an impl on a case; outputs, and what it held for backward.
* :func:`measure_case` — one recipe case: per output (y, dgrad, wgrad, bgrad) the comparison with both
  references under the bounds of :mod:`properties.fp8.tolerance` (max error, error/bound, worst element),
  relative Frobenius errors, SQNR against the original reference, and a verdict
  (:class:`Fp8CaseResult`). Delayed scaling runs ``case.steps`` steps with one state.
* :func:`held_bytes` — bytes held across backward in each ``save_original_input`` mode, the prediction,
  and whether x is aliased.

Properties (each raises :class:`~properties.core.failures.PropertyFailure` with impl, case, output, error,
bound, worst element and a repro command; :data:`FP8_PROPERTIES` names them):

* ``accuracy`` — every output within both bounds; delayed-scaling amax records exact.
* ``save_original_input`` — True and False give bitwise identical y, dgrad, wgrad, bgrad; for delayed
  recipes, True raises ``ValueError`` naming ``save_original_input``.
* ``saved_tensors`` — True holds x itself; False does not, and holds a 1-byte tensor of M·K elements (the
  FP8 copy); held(False) − held(True) equals the predicted columnwise copy of x (data + scales).
* ``quantizer`` — the impl's ``quantize`` equals the oracle bitwise (codes, scales) for every role and
  usage, and columnwise(t) equals rowwise(tᵀ)ᵀ.
* ``unit_scale_round_trip`` — under current scaling with fp32 scales every finite value of a format quantizes
  to its own code with scale 1.
* as a layer in training (:data:`LAYER_PROPERTIES`): ``accumulate`` — micro-batches accumulate into
  ``weight.grad``; ``optimizer_step`` — a weight changed in place is seen by the next call; ``two_layers`` —
  two layers of one shape keep their own gradients; ``strided`` — non-contiguous operands (a transposed
  weight leaf) give the same outputs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from numcheck.errors import PropertyFailure, ProtocolViolation
from numcheck.impls.protocols.fp8_linear import (
    DelayedScalingState,
    HeldTensors,
    held_for_backward,
    predicted_columnwise_x_bytes,
)
from numcheck.properties.core import records
from numcheck.properties.core.compare import Comparison, compare
from numcheck.properties.core.failures import failure_message
from numcheck.properties.core.tensors import strided_copy
from numcheck.properties.fp8.cases import Fp8Case, Fp8Tensors, QuantizerCase, build_fp8
from numcheck.properties.fp8.tolerance import output_bounds
from numcheck.reference.fp8_formats import F64, all_codes, decode_fp8, same_codes
from numcheck.reference.fp8_linear import FP8_OUTPUTS, quantized_linear
from numcheck.reference.fp8_recipes import ROLES, USAGES, Fp8Recipe
from numcheck.reference.fp8_scaling import block_grid, quantize_operand


# -- failures -----------------------------------------------------------------------------------------
def fail(impl: Any, prop: str, case: Any, *lines: str, ratio: float | None = None) -> None:
    """Raise :class:`PropertyFailure` naming impl, property, case, the details and a repro command
    (:func:`properties.core.failures.failure_message`, the same text as for linear+CE); ``ratio``: the failing
    judgement's error/bound, where it has one. A case no repro command can rebuild (:class:`_AdHoc`) gets a
    repro line saying so."""
    __tracebackhide__ = True
    if isinstance(case, _AdHoc):
        message = failure_message(
            impl,
            prop,
            case,
            lines,
            reproduce="no numcheck repro case describes this test's own tensor: rerun the test that failed",
        )
    else:
        message = failure_message(impl, prop, case, lines)
    raise PropertyFailure(message, case=case, ratio=ratio)


# -- running an impl ----------------------------------------------------------------------------------
@dataclass
class Fp8RunOutputs:
    """What one forward + backward produced (detached), and what the forward held for backward."""

    y: torch.Tensor
    dgrad: torch.Tensor | None
    wgrad: torch.Tensor | None
    bgrad: torch.Tensor | None
    held: HeldTensors | None = None
    held_new_bytes: int | None = None
    x_aliased: bool | None = None

    def get(self, name: str) -> torch.Tensor | None:
        return getattr(self, name)


def run_fp8_impl(
    impl: Any,
    case: Fp8Case,
    t: Fp8Tensors | None = None,
    *,
    save_original_input: bool | None = None,
    state: DelayedScalingState | None = None,
    track_saved: bool = False,
) -> Fp8RunOutputs:
    """Forward and backward of ``impl`` on ``case`` (tensors ``t``, default ``build_fp8(case)``).

    Protocol violations (wrong shape, dtype, no autograd graph) raise :class:`PropertyFailure`.
    """
    t = t if t is not None else build_fp8(case)
    soi = case.save_original_input if save_original_input is None else save_original_input
    x = t.x.detach().clone().requires_grad_(True)
    w = t.weight.detach().clone().requires_grad_(True)
    b = t.bias.detach().clone().requires_grad_(True) if t.bias is not None else None
    if case.recipe.kind == "delayed" and state is None:
        state = DelayedScalingState(case.recipe)
    kw = dict(recipe=case.recipe, save_original_input=soi, scaling_state=state)
    held = None
    if track_saved:
        with held_for_backward() as h:
            y = impl(x, w, b, **kw)
        held = h.scan(y) if isinstance(y, torch.Tensor) else h.result
    else:
        y = impl(x, w, b, **kw)
    if not isinstance(y, torch.Tensor):
        fail(impl, "protocol", case, f"returned {type(y).__name__}, expected a tensor")
    if tuple(y.shape) != (case.M, case.N) or y.dtype != case.torch_dtype:
        fail(
            impl,
            "protocol",
            case,
            f"y has shape {tuple(y.shape)} and dtype {y.dtype}; expected ({case.M}, {case.N}) {case.torch_dtype}",
        )
    if not y.requires_grad:
        fail(impl, "protocol", case, "y is not connected to autograd (requires_grad=False)")
    new_bytes = held.new_bytes([x, w, b]) if held is not None else None
    aliased = held.holds_storage_of(x) if held is not None else None
    y.backward(t.dy)
    return Fp8RunOutputs(
        y=y.detach(),
        dgrad=x.grad,
        wgrad=w.grad,
        bgrad=b.grad if b is not None else None,
        held=held,
        held_new_bytes=new_bytes,
        x_aliased=aliased,
    )


# -- measuring ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class OutputMetrics:
    """One output against both references.

    Attributes:
        output: ``y``, ``dgrad``, ``wgrad`` or ``bgrad`` (``@stepN`` appended for later delayed steps).
        dq, true: comparisons with the dequantized and the original reference under their bounds.
        rel_fro_dq, rel_fro_true: ‖impl − ref‖_F / ‖ref‖_F over the compared elements.
        sqnr_db: 10·log10(Σ ref_true² / Σ (impl − ref_true)²) (inf when exact).
        expected_ratio_dq: max |impl − ref_dq| / (√n·u_a·Σ|â||b̂|) — how the error sits against the
            expected (probabilistic) level; reported, not enforced.
        n_unspecified: elements the non-finite contract leaves free.
    """

    output: str
    dq: Comparison
    true: Comparison
    rel_fro_dq: float
    rel_fro_true: float
    sqnr_db: float
    expected_ratio_dq: float
    n_unspecified: int

    @property
    def ok(self) -> bool:
        return self.dq.ok and self.true.ok


@dataclass
class Fp8CaseResult:
    """The measurement of one case: per-output metrics, protocol notes, and the verdict."""

    impl: str
    case: Fp8Case
    outputs: dict[str, OutputMetrics] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.notes and all(m.ok for m in self.outputs.values())

    def rows(self) -> list[dict[str, Any]]:
        """Flat rows for tables: one per output."""
        return [
            dict(
                impl=self.impl,
                recipe=self.case.recipe.name,
                case=self.case.short(),
                output=k,
                max_err_dq=m.dq.max_abs,
                ratio_dq=m.dq.ratio,
                max_err_true=m.true.max_abs,
                ratio_true=m.true.ratio,
                rel_fro_dq=m.rel_fro_dq,
                rel_fro_true=m.rel_fro_true,
                sqnr_db=m.sqnr_db,
                expected_ratio_dq=m.expected_ratio_dq,
                ok=m.ok,
            )
            for k, m in self.outputs.items()
        ]


def _masked(impl_out: torch.Tensor, ref: torch.Tensor, bound: torch.Tensor, skip: torch.Tensor):
    a = impl_out.detach().to("cpu").clone()  # keeps the impl's dtype (ULPs are reported in it)
    o, b = ref.clone(), bound.clone()
    a[skip], o[skip], b[skip] = 0.0, 0.0, 1.0
    return a, o, b


def _rel_fro(a: torch.Tensor, o: torch.Tensor) -> float:
    fin = torch.isfinite(a) & torch.isfinite(o)
    num = float((a[fin] - o[fin]).norm())
    den = float(o[fin].norm())
    return num / den if den > 0 else (0.0 if num == 0 else math.inf)


def _sqnr(a: torch.Tensor, o: torch.Tensor) -> float:
    fin = torch.isfinite(a) & torch.isfinite(o)
    noise = float((a[fin] - o[fin]).square().sum())
    sig = float(o[fin].square().sum())
    if noise == 0:
        return math.inf
    return 10 * math.log10(sig / noise) if sig > 0 else -math.inf


def _out_dtypes(case: Fp8Case) -> dict[str, torch.dtype]:
    return {k: case.torch_dtype for k in FP8_OUTPUTS}


def output_metrics(
    label: str, got: torch.Tensor | None, ref_dq: torch.Tensor, ref_true: torch.Tensor, bnd: Any
) -> OutputMetrics:
    """One output (``got``, ``None`` when missing) against both references under ``bnd`` (an
    :class:`~properties.fp8.tolerance.OutputBounds`): the comparisons and the report's metrics. Shared by the single
    and the grouped linear (:mod:`properties.fp8.grouped.props`)."""
    if got is None:
        miss = compare(label, None, ref_dq, ref_dq)
        return OutputMetrics(
            output=label,
            dq=miss,
            true=miss,
            rel_fro_dq=math.inf,
            rel_fro_true=math.inf,
            sqnr_db=-math.inf,
            expected_ratio_dq=math.inf,
            n_unspecified=0,
        )
    skip_dq = bnd.unspecified
    skip_true = bnd.unspecified | ~torch.isfinite(ref_true) | torch.isnan(ref_dq)
    cdq = compare(label, *_masked(got, ref_dq, bnd.dq, skip_dq))
    ctrue = compare(label, *_masked(got, ref_true, bnd.true, skip_true))
    a = got.detach().to("cpu", F64)
    keep_dq = ~skip_dq
    keep_t = ~skip_true
    exp_level = bnd.expected_dq[keep_dq]
    err = (a[keep_dq] - ref_dq[keep_dq]).abs()
    fin = torch.isfinite(err) & (exp_level > 0)
    exp_ratio = float((err[fin] / exp_level[fin]).max()) if bool(fin.any()) else 0.0
    return OutputMetrics(
        output=label,
        dq=cdq,
        true=ctrue,
        rel_fro_dq=_rel_fro(a[keep_dq], ref_dq[keep_dq]),
        rel_fro_true=_rel_fro(a[keep_t], ref_true[keep_t]),
        sqnr_db=_sqnr(a[keep_t], ref_true[keep_t]),
        expected_ratio_dq=exp_ratio,
        n_unspecified=int(skip_dq.sum()),
    )


def declared_bounds(impl: Any, case: Fp8Case, ref: Any, name: str, t: Fp8Tensors, out_dtype: torch.dtype) -> Any:
    """The element-wise bound of output ``name`` (:func:`properties.fp8.tolerance.output_bounds`) under what ``impl``
    declares: its accumulation on ``case``'s device and where it adds the bias."""
    u_a, chunk = impl.support.accumulation(case.device)
    return output_bounds(
        ref,
        name,
        t.x,
        t.weight,
        t.dy,
        t.bias,
        out_dtype=out_dtype,
        accum_u=u_a,
        accum_chunk=chunk,
        accum_block=impl.support.accumulation_block(case.device),
        bias_after_output_rounding=impl.support.bias_after_output_rounding,
    )


def _measure_step(
    impl: Any, case: Fp8Case, t: Fp8Tensors, out: Fp8RunOutputs, ref, suffix: str, result: Fp8CaseResult
) -> None:
    for name in FP8_OUTPUTS:
        if name not in ref.dq:
            continue
        got = out.get(name)
        label = name + suffix
        bnd = None
        if got is not None:
            bnd = declared_bounds(impl, case, ref, name, t, got.dtype)
        result.outputs[label] = output_metrics(label, got, ref.dq[name], ref.true[name], bnd)


def measure_case(impl: Any, case: Fp8Case) -> Fp8CaseResult:
    """Run ``case`` (all its delayed-scaling steps) and measure every output against both references."""
    result = Fp8CaseResult(impl=impl.name, case=case)
    state = DelayedScalingState(case.recipe) if case.recipe.kind == "delayed" else None
    for step in range(case.steps):
        t = build_fp8(case, step)
        scales = {r: state.scale(r) for r in ROLES} if state is not None else None
        out = run_fp8_impl(impl, case, t, state=state)
        ref = quantized_linear(t.x, t.weight, t.dy, t.bias, case.recipe, delayed_scales=scales)
        _measure_step(impl, case, t, out, ref, f"@step{step}" if step else "", result)
        if state is not None:
            for role in ROLES:
                got = state.pending.get(role)
                want = ref.amax[role]
                if got is None:
                    result.notes.append(f"step {step}: amax of {role!r} was not recorded (expected {want!r})")
                elif not (got == want or (math.isnan(got) and math.isnan(want))):
                    result.notes.append(f"step {step}: recorded amax of {role!r} is {got!r}, expected {want!r}")
            state.update()
    return result


def note_result(impl: Any, prop: str, case: Any, result: Fp8CaseResult) -> None:
    """Record each output's error/bound against the dequantized-operand reference (under its label) and against the
    original operands (``<label> (original operands)``) for the seed sweep's tightness tables and margins; nothing
    when not recording. Shared by the single and the grouped linear. Judgement (b) does not exist for this family on
    one device (both references are exact), so none is recorded."""
    analytic: dict[str, Comparison] = {}
    for label, m in result.outputs.items():
        analytic[label], analytic[f"{label} (original operands)"] = m.dq, m.true
    records.note_judgements(impl.name, prop, case.dtype, repr(case), analytic, {})


# -- properties ---------------------------------------------------------------------------------------
def accuracy(impl: Any, case: Fp8Case) -> Fp8CaseResult:
    """Property: every output within both bounds (and exact amax records for delayed scaling)."""
    __tracebackhide__ = True
    r = measure_case(impl, case)
    note_result(impl, "accuracy", case, r)
    if not r.ok:
        bad = [m for m in r.outputs.values() if not m.ok]
        lines = list(r.notes)
        for m in bad:
            if not m.dq.ok:
                lines.append("vs dequantized-operand reference (accumulation error): " + m.dq.describe())
            if not m.true.ok:
                lines.append("vs original-operand reference (total error): " + m.true.describe())
        worst = max((max(m.dq.ratio, m.true.ratio) for m in bad), default=None)
        fail(impl, "accuracy", case, *lines, ratio=worst)
    return r


def _bits(t: torch.Tensor | None) -> torch.Tensor | None:
    if t is None:
        return None
    t = t.detach().cpu().contiguous()
    return t.view({4: torch.int32, 2: torch.int16, 8: torch.int64}[t.element_size()])


def save_original_input(impl: Any, case: Fp8Case) -> None:
    """Property: save_original_input True and False give bitwise identical outputs; delayed + True raises."""
    __tracebackhide__ = True
    if True not in impl.support.save_original_input:
        return
    if not case.recipe.allows_save_original_input:
        delayed_rejects_save_original_input(impl, case)
        return
    t = build_fp8(case)
    a = run_fp8_impl(impl, case, t, save_original_input=False)
    b = run_fp8_impl(impl, case, t, save_original_input=True)
    for name in FP8_OUTPUTS:
        ba, bb = _bits(a.get(name)), _bits(b.get(name))
        if ba is None and bb is None:
            continue
        if ba is None or bb is None or ba.shape != bb.shape:
            fail(impl, "save_original_input", case, f"{name}: present/shape differs between modes")
        diff = ba != bb
        if bool(diff.any()):
            idx = tuple(int(i) for i in diff.nonzero()[0])
            va, vb = a.get(name), b.get(name)
            fail(
                impl,
                "save_original_input",
                case,
                f"{name} differs bitwise between save_original_input=False and True in {int(diff.sum())} / {diff.numel()} elements",
                f"first at index {list(idx)}: False gives {float(va[idx]):.9g}, True gives {float(vb[idx]):.9g} "
                f"(error {abs(float(va[idx]) - float(vb[idx])):.3g}, bound 0: the modes must quantize x from the same source)",
            )


# -- as a layer in training: accumulation, optimizer step, several layers, non-contiguous operands ----------
#: The four properties of a layer used as training uses it (each its own name in verdicts and reports).
LAYER_PROPERTIES: tuple[str, ...] = ("accumulate", "optimizer_step", "two_layers", "strided")


def _judge_sum(
    impl: Any, prop: str, case: Fp8Case, name: str, got: torch.Tensor | None, parts: list[tuple[Any, Fp8Tensors]]
) -> None:
    """``got`` (output ``name``) against the sum of ``parts``' references (one part: a single call), within the
    sum of their bounds plus one rounding of the sum in the output dtype; a failure names property ``prop``."""
    __tracebackhide__ = True
    if got is None:
        fail(impl, prop, case, f"{prop}: {name} is missing (None)")
    dq = true = bdq = btrue = None
    skip = None
    for ref, t in parts:
        bnd = declared_bounds(impl, case, ref, name, t, got.dtype)
        un = bnd.unspecified | ~torch.isfinite(ref.true[name]) | torch.isnan(ref.dq[name])
        dq = ref.dq[name] if dq is None else dq + ref.dq[name]
        true = ref.true[name] if true is None else true + ref.true[name]
        bdq = bnd.dq if bdq is None else bdq + bnd.dq
        btrue = bnd.true if btrue is None else btrue + bnd.true
        skip = un if skip is None else skip | un
    if len(parts) > 1:  # the accumulated gradient is rounded once more, in its own dtype
        u_o = float(torch.finfo(got.dtype).eps) / 2
        bdq = bdq + u_o * dq.abs().nan_to_num(0.0)
        btrue = btrue + u_o * true.abs().nan_to_num(0.0)
    label = f"{name} ({prop})"
    for which, ref, b in (("dequantized-operand", dq, bdq), ("original-operand", true, btrue)):
        c = compare(label, *_masked(got, ref, b, skip))
        if not c.ok:
            fail(impl, prop, case, f"{prop}: vs the {which} reference: " + c.describe())


def _leaf(t: torch.Tensor | None) -> torch.Tensor | None:
    """A fresh leaf tensor with ``t``'s values that requires grad (``None`` stays ``None``)."""
    return t.detach().clone().requires_grad_(True) if t is not None else None


@dataclass(frozen=True)
class _LayerSetup:
    """What the layer properties share: the call keywords, draw A, draw B and B's inputs on A's weight and bias."""

    kw: dict[str, Any]
    tA: Fp8Tensors
    tB: Fp8Tensors
    tB_on_A: Fp8Tensors

    def ref(self, t: Fp8Tensors, case: Fp8Case) -> Any:
        """The two references of one call on ``t``."""
        return quantized_linear(t.x, t.weight, t.dy, t.bias, case.recipe)


def _layer_setup(case: Fp8Case) -> _LayerSetup:
    """Draws A and B (seed + 1) of ``case`` and the keywords of a current-scaling call."""
    tA = build_fp8(case)
    tB = build_fp8(case.replace(seed=case.seed + 1))
    kw = dict(recipe=case.recipe, save_original_input=case.save_original_input, scaling_state=None)
    return _LayerSetup(kw=kw, tA=tA, tB=tB, tB_on_A=tB._replace(weight=tA.weight, bias=tA.bias))


def _two_micro_batches(impl: Any, su: _LayerSetup) -> tuple[torch.Tensor, torch.Tensor | None, list[torch.Tensor]]:
    """One weight and bias leaf (A's), two micro-batches (A's and B's inputs) with a backward after each:
    ``(weight, bias, [x_A, x_B])`` with their accumulated gradients."""
    w, b = _leaf(su.tA.weight), _leaf(su.tA.bias)
    xs = []
    for t in (su.tA, su.tB_on_A):
        x = _leaf(t.x)
        impl(x, w, b, **su.kw).backward(t.dy)
        xs.append(x)
    return w, b, xs


def accumulate(impl: Any, case: Fp8Case) -> None:
    """Property: two micro-batches on one weight and bias, a backward after each, add up in ``weight.grad`` /
    ``bias.grad`` (an impl writing the gradient instead of adding it fails); each x gets its own dgrad.
    Delayed scaling is not covered (its state is per call and the caller's to update)."""
    __tracebackhide__ = True
    if case.recipe.kind == "delayed":
        return
    su = _layer_setup(case)
    w, b, xs = _two_micro_batches(impl, su)
    parts = [(su.ref(su.tA, case), su.tA), (su.ref(su.tB_on_A, case), su.tB_on_A)]
    _judge_sum(impl, "accumulate", case, "wgrad", w.grad, parts)
    if b is not None:
        _judge_sum(impl, "accumulate", case, "bgrad", b.grad, parts)
    for x, part in zip(xs, parts):
        _judge_sum(impl, "accumulate", case, "dgrad", x.grad, [part])


def optimizer_step(impl: Any, case: Fp8Case) -> None:
    """Property: after two micro-batches, the weight and bias tensors are changed in place to another draw's
    values (an optimizer step) and the next micro-batch must see them (a quantized weight cached per tensor,
    blind to its version, fails). Delayed scaling is not covered."""
    __tracebackhide__ = True
    if case.recipe.kind == "delayed":
        return
    su = _layer_setup(case)
    w, b, _ = _two_micro_batches(impl, su)
    with torch.no_grad():
        w.copy_(su.tB.weight)
        if b is not None:
            b.copy_(su.tB.bias)
    w.grad = None
    if b is not None:
        b.grad = None
    x = _leaf(su.tB.x)
    y = impl(x, w, b, **su.kw)
    y.backward(su.tB.dy)
    part = [(su.ref(su.tB, case), su.tB)]
    _judge_sum(impl, "optimizer_step", case, "y", y.detach(), part)
    _judge_sum(impl, "optimizer_step", case, "dgrad", x.grad, part)
    _judge_sum(impl, "optimizer_step", case, "wgrad", w.grad, part)
    if b is not None:
        _judge_sum(impl, "optimizer_step", case, "bgrad", b.grad, part)


def two_layers(impl: Any, case: Fp8Case) -> None:
    """Property: two layers of one shape, forward, forward, then one backward, each get their own gradients
    (per-shape workspaces shared between calls fail). Delayed scaling is not covered."""
    __tracebackhide__ = True
    if case.recipe.kind == "delayed":
        return
    su = _layer_setup(case)
    leaves = [(_leaf(t.x), _leaf(t.weight), _leaf(t.bias)) for t in (su.tA, su.tB)]
    ys = [impl(x, w, b, **su.kw) for x, w, b in leaves]
    torch.autograd.backward(ys, [su.tA.dy, su.tB.dy])
    for (x, w, b), t in zip(leaves, (su.tA, su.tB)):
        part = [(su.ref(t, case), t)]
        for name, got in (("dgrad", x.grad), ("wgrad", w.grad), ("bgrad", b.grad if b is not None else None)):
            if name != "bgrad" or b is not None:
                _judge_sum(impl, "two_layers", case, name, got, part)


def strided(impl: Any, case: Fp8Case) -> None:
    """Property: x and dy as column slices of wider padded buffers (:data:`properties.core.tensors.PAD`), the weight
    the transpose of a contiguous [K, N] leaf (a tied or transposed weight) and the bias every other element of a
    longer buffer give the single-call outputs, the weight's gradient landing on the leaf; refusing them with an
    exception is allowed (loud, not wrong). Delayed scaling is not covered."""
    __tracebackhide__ = True
    if case.recipe.kind == "delayed":
        return
    su = _layer_setup(case)
    tA = su.tA
    w_leaf = tA.weight.detach().t().contiguous().requires_grad_(True)  # [K, N]
    x = strided_copy(tA.x, "x").requires_grad_(True)
    b = strided_copy(tA.bias, "bias").requires_grad_(True) if tA.bias is not None else None
    try:
        y = impl(x, w_leaf.t(), b, **su.kw)
        y.backward(strided_copy(tA.dy, "x"))  # a column slice, like x
    except (PropertyFailure, ProtocolViolation):  # the suite's own verdicts
        raise
    except Exception:  # noqa: BLE001 - refusing non-contiguous operands loudly is allowed, an assert included
        return
    part = [(su.ref(tA, case), tA)]
    _judge_sum(impl, "strided", case, "y", y.detach(), part)
    _judge_sum(impl, "strided", case, "dgrad", x.grad, part)
    _judge_sum(impl, "strided", case, "wgrad", w_leaf.grad.t() if w_leaf.grad is not None else None, part)
    if b is not None:
        _judge_sum(impl, "strided", case, "bgrad", b.grad, part)


def delayed_rejects_save_original_input(impl: Any, case: Fp8Case) -> None:
    """Property: a delayed recipe with save_original_input=True raises ValueError naming the option."""
    __tracebackhide__ = True
    t = build_fp8(case)
    x = t.x.detach().clone().requires_grad_(True)
    w = t.weight.detach().clone().requires_grad_(True)
    try:
        impl(x, w, None, recipe=case.recipe, save_original_input=True, scaling_state=DelayedScalingState(case.recipe))
    except ValueError as exc:
        if "save_original_input" not in str(exc):
            fail(
                impl,
                "save_original_input",
                case,
                f"ValueError raised but its message does not name save_original_input: {exc}",
            )
        return
    except Exception as exc:  # noqa: BLE001 - any other type is the failure being reported
        fail(impl, "save_original_input", case, f"raised {type(exc).__name__} ({exc}); expected ValueError")
    fail(impl, "save_original_input", case, "delayed scaling with save_original_input=True did not raise ValueError")


@dataclass(frozen=True)
class HeldBytes:
    """What an FP8 linear (single or grouped) holds across backward with ``save_original_input`` False and True
    (``None`` where that mode was not run): the bytes, whether x's own storage is among them, each mode's held
    tensors described, and the prediction of held(False) − held(True), the columnwise FP8 copy of x, as the range
    ``predicted`` (widened by ``slack`` both ways: the allocator's rounding). ``fp8_copy_false``: whether False holds
    a 1-byte tensor of M·K elements (``None``: not looked for). ``measured``: the bytes are the allocator's (not the
    held tensors' sizes); ``scales``: what scales the copy carries, as the failure says it."""

    false_bytes: int | None
    true_bytes: int | None
    predicted: tuple[int, int]
    x_aliased_false: bool | None
    x_aliased_true: bool | None
    held_false: list[str]
    held_true: list[str]
    fp8_copy_false: bool | None = None
    slack: int = 0
    measured: bool = False
    scales: str = "scales"


def held_bytes(impl: Any, case: Fp8Case) -> HeldBytes:
    """Measure what each declared (and allowed) save_original_input mode holds for backward."""
    t = build_fp8(case)
    res: dict[bool, Fp8RunOutputs] = {}
    for soi in (False, True):
        if soi in impl.support.save_original_input and (not soi or case.recipe.allows_save_original_input):
            res[soi] = run_fp8_impl(impl, case, t, save_original_input=soi, track_saved=True)
    pred = predicted_columnwise_x_bytes(case.recipe, case.M, case.K)
    f, tr = res.get(False), res.get(True)
    desc = lambda r: [d for d, _ in r.held.tensors] if r is not None and r.held is not None else []  # noqa: E731
    copy = None
    if f is not None and f.held is not None:
        copy = any(t.element_size() == 1 and t.numel() == case.M * case.K for _, t in f.held.tensors)
    return HeldBytes(
        false_bytes=f.held_new_bytes if f else None,
        true_bytes=tr.held_new_bytes if tr else None,
        predicted=(pred, pred),
        x_aliased_false=f.x_aliased if f else None,
        x_aliased_true=tr.x_aliased if tr else None,
        held_false=desc(f),
        held_true=desc(tr),
        fp8_copy_false=copy,
    )


def check_held(impl: Any, prop: str, case: Any, h: HeldBytes, fail: Callable[..., None]) -> None:
    """The held-bytes judgement of the single and grouped FP8 families (``prop``: the property, ``fail`` the family's
    failure): True holds x itself, False does not (and holds the FP8 copy, where looked for), and held(False) −
    held(True) lies in the predicted range; with False alone, it holds at least the copy."""
    __tracebackhide__ = True
    if h.x_aliased_true is False:
        fail(
            impl,
            prop,
            case,
            "save_original_input=True: x's storage is not among the tensors held for backward",
            "held: " + "; ".join(h.held_true),
        )
    if h.x_aliased_false:
        fail(
            impl,
            prop,
            case,
            "save_original_input=False holds x itself; it must hold the columnwise FP8 copy",
            "held: " + "; ".join(h.held_false),
        )
    if h.false_bytes is not None and h.fp8_copy_false is False:
        fail(
            impl,
            prop,
            case,
            f"save_original_input=False holds no 1-byte tensor of M·K = {case.M * case.K} "
            "elements (the columnwise FP8 copy of x)",
            "held: " + "; ".join(h.held_false),
        )
    lo, hi = h.predicted[0] - h.slack, h.predicted[1] + h.slack
    if h.false_bytes is not None and h.true_bytes is not None:
        diff = h.false_bytes - h.true_bytes
        if not lo <= diff <= hi:
            fail(
                impl,
                prop,
                case,
                f"held(False) − held(True) = {h.false_bytes} − {h.true_bytes} = {diff} bytes"
                + (" (measured)" if h.measured else "")
                + f"; the recipe predicts {lo}"
                + (f"…{hi}" if hi > lo else "")
                + f" (columnwise x: {case.M}·{case.K} FP8 bytes + {h.scales})",
                "held with False: " + "; ".join(h.held_false),
                "held with True: " + "; ".join(h.held_true),
            )
    elif h.false_bytes is not None and h.false_bytes < lo:
        fail(
            impl,
            prop,
            case,
            f"save_original_input=False holds {h.false_bytes} new bytes, less than the columnwise copy of x ({lo})",
            "held: " + "; ".join(h.held_false),
        )


def saved_tensors(impl: Any, case: Fp8Case) -> HeldBytes:
    """Property: True holds x itself, False does not, and held(False) − held(True) is the predicted copy
    (:func:`check_held`)."""
    __tracebackhide__ = True
    h = held_bytes(impl, case)
    check_held(impl, "saved_tensors", case, h, fail)
    return h


def _fp8_case_for(recipe: Fp8Recipe, t: torch.Tensor) -> Fp8Case:
    R, C = t.shape
    return Fp8Case(
        recipe,
        R,
        C,
        max(1, R),
        dtype={torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}[t.dtype],
        device=t.device.type,
    )


def quantizer(
    impl: Any, recipe: Fp8Recipe, t: torch.Tensor, *, delayed_scale: float = 1.0, label: str = "", case: Any = None
) -> None:
    """Property: ``impl.quantize`` equals the oracle bitwise for every role and usage ``recipe`` quantizes on ``t``
    (2-D), and columnwise(t) equals rowwise(tᵀ)ᵀ where the recipe's blocks are transposes of each other. ``case``: the printable case ``t`` was built from (a
    :class:`~numcheck.properties.fp8.cases.QuantizerCase`, or the ``Fp8Case`` whose x it is), which a failure
    names and its repro line reruns; without one a failure says that no repro case describes ``t``."""
    __tracebackhide__ = True
    if case is None:
        case = _AdHoc(_fp8_case_for(recipe, t))
    what = f"input {label or 'tensor'} {tuple(t.shape)} {t.dtype}"
    state = None
    if recipe.kind == "delayed":
        state = DelayedScalingState(recipe)
        for r in ROLES:
            state.set_scale(r, delayed_scale)
    for role in ROLES:
        for usage in recipe.usages_of(role):  # rowwise_gw_hp quantizes x and dy rowwise only
            _quantized_as_oracle(impl, recipe, t, role, usage, state, delayed_scale, what, case)
        if _columnwise_is_transposed_rowwise(recipe, role):
            _columnwise_is_rowwise_transposed(impl, recipe, t, role, state, what, case)


def _quantized_as_oracle(
    impl: Any,
    recipe: Fp8Recipe,
    t: torch.Tensor,
    role: str,
    usage: str,
    state: DelayedScalingState | None,
    delayed_scale: float,
    what: str,
    case: Any,
) -> None:
    """:func:`quantizer` for one role and usage: the data's shape and codes equal the oracle's, and its scales
    (:func:`_scales_as_oracle`)."""
    __tracebackhide__ = True
    got = impl.quantize(t, recipe=recipe, role=role, usage=usage, scaling_state=state)
    ref = quantize_operand(t.cpu(), recipe, role, usage, stored_scale=delayed_scale if state else None)
    fmt = ref.fmt
    where = f"{what}, role {role!r}, usage {usage!r}, format {fmt.name}"
    grid = block_grid(tuple(t.shape), recipe.block_of(role, usage))
    if tuple(got.data.shape) != tuple(t.shape):
        fail(
            impl,
            "quantizer",
            case,
            f"{where}: data has shape {tuple(got.data.shape)}, expected {tuple(t.shape)}",
        )
    _data_dtype_is_format(impl, case, where, got.data.dtype, fmt)
    codes = got.data.view(torch.uint8) if got.data.dtype != torch.uint8 else got.data
    ok = same_codes(codes.cpu(), ref.codes, fmt)
    if not bool(ok.all()):
        idx = tuple(int(i) for i in (~ok).nonzero()[0])
        fail(
            impl,
            "quantizer",
            case,
            f"{where}: {int((~ok).sum())} / {ok.numel()} codes differ from the oracle",
            f"first at {list(idx)}: input {float(t[idx]):.9g}, impl code 0x{int(codes[idx]):02x} "
            f"({float(decode_fp8(codes[idx].reshape(1), fmt)):.6g}), oracle code 0x{int(ref.codes[idx]):02x} "
            f"({float(decode_fp8(ref.codes[idx].reshape(1), fmt)):.6g}); block scale_inv impl/oracle "
            f"{_scale_at(got.scale_inv, idx, ref.block):.9g}/{_scale_at(ref.scale_inv, idx, ref.block):.9g}",
        )
    _scales_as_oracle(impl, case, where, got, ref, grid)


def _data_dtype_is_format(impl: Any, case: Any, where: str, dtype: torch.dtype, fmt: Any) -> None:
    """The codes come as ``uint8`` or as the role's own FP8 dtype: codes tagged with the other format (HYBRID's
    E5M2 gradient as ``float8_e4m3fn``) are read as that format by whatever consumes them (TE #3342), though every
    byte equals the oracle's."""
    __tracebackhide__ = True
    if dtype != torch.uint8 and dtype != getattr(torch, fmt.torch_dtype_name):
        fail(
            impl,
            "quantizer",
            case,
            f"{where}: data is {dtype}, expected torch.uint8 or torch.{fmt.torch_dtype_name} (the role's format): "
            f"its codes would be read as another format",
        )


def _scales_as_oracle(impl: Any, case: Any, where: str, got: Any, ref: Any, grid: tuple[int, ...]) -> None:
    """The scales of one quantization ``got`` equal the oracle's ``ref``: the scale_inv grid's shape and values and
    (MXFP8) the E8M0 scale codes."""
    __tracebackhide__ = True
    si = got.scale_inv.detach().to("cpu", F64)
    if tuple(si.shape) != grid:
        fail(impl, "quantizer", case, f"{where}: scale_inv has shape {tuple(si.shape)}, expected {grid}")
    same = (si == ref.scale_inv) | (torch.isnan(si) & torch.isnan(ref.scale_inv))
    if not bool(same.all()):
        idx = tuple(int(i) for i in (~same).nonzero()[0])
        fail(
            impl,
            "quantizer",
            case,
            f"{where}: scale_inv of block {list(idx)} is {float(si[idx]):.9g}, "
            f"oracle {float(ref.scale_inv[idx]):.9g} (block amax {float(ref.amax[idx]):.9g})",
        )
    if ref.scale_code is not None:
        if got.scale_code is None or not torch.equal(got.scale_code.cpu().to(torch.int64), ref.scale_code):
            fail(
                impl,
                "quantizer",
                case,
                f"{where}: E8M0 scale codes differ from the oracle "
                f"(impl {None if got.scale_code is None else got.scale_code.flatten()[:8].tolist()}, "
                f"oracle {ref.scale_code.flatten()[:8].tolist()})",
            )


def _columnwise_is_transposed_rowwise(recipe: Fp8Recipe, role: str) -> bool:
    """Whether ``recipe`` quantizes ``role`` both ways with transposed blocks, where columnwise(t) = rowwise(tᵀ)ᵀ
    holds by definition (every kind but ``rowwise_gw_hp``, whose W is per-row for fprop and per-tensor for dgrad)."""
    if recipe.usages_of(role) != USAGES:
        return False
    row, col = recipe.block_of(role, "rowwise"), recipe.block_of(role, "columnwise")
    return row == col or (row is not None and col == (row[1], row[0]))


def _columnwise_is_rowwise_transposed(
    impl: Any, recipe: Fp8Recipe, t: torch.Tensor, role: str, state: DelayedScalingState | None, what: str, case: Any
) -> None:
    """:func:`quantizer`'s layout identity for one role: columnwise(t) equals rowwise(tᵀ)ᵀ, codes and scales."""
    __tracebackhide__ = True
    col = impl.quantize(t, recipe=recipe, role=role, usage="columnwise", scaling_state=state)
    row_t = impl.quantize(t.t().contiguous(), recipe=recipe, role=role, usage="rowwise", scaling_state=state)
    ca = col.data.view(torch.uint8) if col.data.dtype != torch.uint8 else col.data
    rb = row_t.data.view(torch.uint8) if row_t.data.dtype != torch.uint8 else row_t.data
    if not (
        torch.equal(ca.cpu(), rb.t().cpu())
        and torch.equal(_bits(col.scale_inv.float()), _bits(row_t.scale_inv.float().t()))
    ):
        fail(impl, "quantizer", case, f"{what}, role {role!r}: columnwise(t) differs from rowwise(tᵀ)ᵀ")


def _scale_at(s: torch.Tensor, idx: tuple[int, ...], block: tuple[int, int]) -> float:
    s = s.detach().cpu().reshape(s.shape[0] if s.dim() == 2 else 1, -1)
    i, j = min(idx[0] // block[0], s.shape[0] - 1), min(idx[1] // block[1], s.shape[1] - 1)
    return float(s[i, j])


def quantizer_case(impl: Any, case: QuantizerCase) -> None:
    """:func:`quantizer` on a :class:`~numcheck.properties.fp8.cases.QuantizerCase`: its tensor, built, and its
    delayed scale; a failure names the case and its repro line rebuilds the same tensor."""
    __tracebackhide__ = True
    quantizer(
        impl, case.recipe, case.build(), delayed_scale=case.delayed_scale, label=type(case.tensor).__name__, case=case
    )


def _quantizer_of(impl: Any, case: Any) -> None:
    """The repro table's quantizer: a ``QuantizerCase`` as drawn, or a ``Fp8Case``'s x."""
    if isinstance(case, QuantizerCase):
        quantizer_case(impl, case)
    else:
        quantizer(impl, case.recipe, build_fp8(case).x, case=case)


def unit_scale_round_trip(impl: Any, case: QuantizerCase) -> None:
    """Property: under current scaling with fp32 scales (``case.recipe``; other recipes: nothing to judge), a tensor
    holding every finite value of a role's format (amax = fp8_max, scale 1) quantizes rowwise to exactly those codes
    with ``scale_inv`` 1, for x and dy (``case.tensor`` only names the case: each role's own format is built)."""
    __tracebackhide__ = True
    recipe = case.recipe
    if recipe.kind != "current" or recipe.power_of_2_scales:
        return
    for role in ("x", "dy"):
        fmt = recipe.format_of(role)
        codes = all_codes()
        v = decode_fp8(codes, fmt)
        keep = torch.isfinite(v)
        q = impl.quantize(
            v[keep].to(case.device, torch.float32).reshape(1, -1), recipe=recipe, role=role, usage="rowwise"
        )
        got = q.data.view(torch.uint8).reshape(-1).cpu()
        if not torch.equal(got, codes[keep]):
            fail(impl, "unit_scale_round_trip", case, f"{impl.name} {recipe.name} {fmt.name}: codes do not round-trip")
        if float(q.scale_inv.reshape(-1)[0]) != 1.0:
            fail(
                impl,
                "unit_scale_round_trip",
                case,
                f"{impl.name} {recipe.name} {fmt.name}: scale_inv {float(q.scale_inv.reshape(-1)[0])!r}, expected 1.0",
            )


class _AdHoc:
    """The stand-in case of a tensor no printable case describes (a test's own): shown as that shape's
    ``Fp8Case``, with a repro line that says so instead of one that would rerun a different tensor."""

    def __init__(self, shown: Fp8Case) -> None:
        self.shown = shown

    def __repr__(self) -> str:
        return f"{self.shown!r} (shape and recipe only: the tensor is the test's own)"


#: The properties a repro command can name; each takes (impl, case).
FP8_PROPERTIES: dict[str, Callable[[Any, Fp8Case], Any]] = {
    "accuracy": accuracy,
    "save_original_input": save_original_input,
    "saved_tensors": saved_tensors,
    "quantizer": _quantizer_of,
    "unit_scale_round_trip": unit_scale_round_trip,
    "accumulate": accumulate,
    "optimizer_step": optimizer_step,
    "two_layers": two_layers,
    "strided": strided,
}
