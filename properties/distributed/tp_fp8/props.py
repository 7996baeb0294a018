"""Properties of tensor/sequence-parallel FP8 linears, run on every rank of a :class:`~properties.distributed.pool.pool.DistPool`
and judged in this process against the unsharded float64 oracle.

* :func:`tp_rank` — what every rank runs: its shards through the impl, forward and backward (every step of a
  delayed case with one state per rank), returning its outputs, the scales it reported and the amaxes it recorded.
* :func:`run_case` — the ranks' results of one case (a rank's failure becomes a :class:`PropertyFailure`).
* Properties (:data:`DIST_FP8_PROPERTIES`; each takes ``(impl, case)``): ``dist_accuracy`` (assembled outputs
  within the bounds of :mod:`properties.distributed.tp_fp8.tolerance` against both references and within judgement (b)
  against the declared path, :mod:`properties.distributed.tp_fp8.yardstick`; replicated outputs equal on
  every rank, delayed amax records the group's), ``dist_same_scale`` (every rank reports the oracle's global scale
  for each per-tensor operand, the oracle's blocks for block-scaled ones), ``world_size_invariance``,
  ``dist_save_original_input`` and ``dist_determinism`` (bitwise).
* :func:`measure` — for ``numcheck report``: one run judged as ``dist_accuracy`` and ``dist_same_scale`` judge it
  (the same helpers: :func:`step_judgements`, :func:`scale_problems`), every comparison and failure line kept
  instead of raising at the first (:class:`TPMeasurement`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import torch

from numcheck.errors import PropertyFailure
from numcheck.impls.protocols.fp8_linear import DelayedScalingState
from numcheck.impls.protocols.tp_fp8_linear import ScaleLog
from numcheck.properties.core import poison, records
from numcheck.properties.core.compare import compare
from numcheck.properties.core.failures import failure_message
from numcheck.properties.distributed.pool.pool import (
    DistPool,
    FailureLatch,
    RankFailure,
    default_backend,
    rank_device,
    world_size_unavailable,
)
from numcheck.properties.distributed.tp_fp8.cases import (
    TPFp8Case,
    operand_slices,
    placement,
    reduction_parts,
    row_parts,
    shard,
    steps_tensors,
)
from numcheck.properties.distributed.tp_fp8.tolerance import partial_bias_grad_bound, sharded_reduction_bounds
from numcheck.properties.distributed.tp_fp8.yardstick import tp_relative
from numcheck.properties.fp8.props import _bits, _masked
from numcheck.properties.fp8.tolerance import output_bounds
from numcheck.reference.fp8_linear import FP8_OUTPUTS, quantized_linear
from numcheck.reference.fp8_recipes import ROLES, USAGES

#: Seconds one case may take on its ranks (the harness's default; measured cases take well under 2 s at P = 4).
CASE_TIMEOUT_S = 120.0


def fail(impl: Any, prop: str, case: TPFp8Case, *lines: str) -> None:
    """Raise :class:`PropertyFailure` naming impl, property, case, the details and the repro command."""
    __tracebackhide__ = True
    raise PropertyFailure(failure_message(impl, prop, case, lines))


# -- on every rank --------------------------------------------------------------------------------------------
def tp_rank(rank: int, world: int, group: Any, args: tuple[Any, TPFp8Case, list[Any], bool]) -> list[dict[str, Any]]:
    """Rank ``rank``: its shards of every step through ``impl``, forward then ``backward(dy_local)``, with
    uninitialised memory filled where the judging process decided so (``poisoned``:
    :func:`numcheck.properties.core.poison.block`); per step its outputs, the scales it reported and (delayed) the
    amaxes it recorded."""
    import torch.distributed as dist

    impl, case, steps, poisoned = args
    device = rank_device(dist.get_backend(group), rank)
    state = DelayedScalingState(case.recipe) if case.recipe.kind == "delayed" else None
    out = []
    for t in steps:
        leaf = lambda v: None if v is None else v.detach().to(device).clone().requires_grad_(True)  # noqa: E731
        x, w, b = leaf(t.x), leaf(t.weight), leaf(t.bias)
        log = ScaleLog()
        with poison.block(poisoned):
            y = impl(
                x,
                w,
                b,
                recipe=case.recipe,
                parallel=case.parallel,
                sequence_parallel=case.sequence_parallel,
                save_original_input=case.save_original_input,
                group=group,
                scale_log=log,
                scaling_state=state,
            )
            y.backward(t.dy.to(device))
        out.append(
            {
                "y": y.detach(),
                "dgrad": x.grad,
                "wgrad": w.grad,
                "bgrad": b.grad if b is not None else None,
                "scales": dict(log.scales),
                "amax": dict(state.pending) if state is not None else {},
            }
        )
        if state is not None:
            state.update()
    return out


def run_case(impl: Any, case: TPFp8Case, prop: str, latch: FailureLatch | None = None) -> list[list[dict]] | None:
    """Every rank's per-step results for ``case``, its memory poisoned as property ``prop`` judges it
    (:func:`numcheck.properties.core.poison.enabled`, decided here, not in the rank); ``None`` when ``latch`` holds
    a pool-killing failure."""
    __tracebackhide__ = True
    glob = steps_tensors(case)
    poisoned = poison.enabled(impl.kind, prop)
    args = [(impl, case, [shard(case, t, r) for t in glob], poisoned) for r in range(case.world)]
    try:
        if latch is not None:
            return latch.run(
                lambda: DistPool.get(case.world),
                tp_rank,
                args,
                CASE_TIMEOUT_S,
                note=f"case: {case!r} (impl {impl.name})",
            )
        return DistPool.get(case.world).run(tp_rank, args, CASE_TIMEOUT_S)
    except RankFailure as exc:
        fail(
            impl,
            prop,
            case,
            f"rank {exc.rank} of {exc.world_size} ({exc.backend}) {exc.kind}:",
            *str(exc.detail).strip().splitlines()[-6:],
        )
    return None


# -- assembling and judging ---------------------------------------------------------------------------------------
def assembly(case: TPFp8Case, ranks: list[dict], output: str) -> tuple[Any, str | None]:
    """The global ``output`` from every rank's (concatenated, or rank 0's copy of a replicated one; a list of the
    ranks' partials for ``"partial"``) and, without raising, why the ranks' values do not assemble (missing on some
    ranks, a replicated output whose copies differ), or ``None``."""
    vals = [r[output] for r in ranks]
    if any(v is None for v in vals):
        if all(v is None for v in vals):
            return None, None
        return None, f"{output}: missing on ranks {[i for i, v in enumerate(vals) if v is None]}"
    where = placement(case, output)
    if where == "partial":
        return vals, None
    if where == "same":
        for r, v in enumerate(vals[1:], start=1):
            if v.shape != vals[0].shape:
                return vals[0], (
                    f"{output} is replicated but rank {r} returns shape {tuple(v.shape)}, rank 0 "
                    f"{tuple(vals[0].shape)}: every rank must return the same reduced result"
                )
            if not torch.equal(_bits(v), _bits(vals[0])):
                return vals[0], (
                    f"{output} is replicated ({case.parallel}-parallel, SP "
                    f"{'on' if case.sequence_parallel else 'off'}) but rank {r} holds other values than "
                    f"rank 0 (max |difference| {float((v.double() - vals[0].double()).abs().max()):.3g}): "
                    f"every rank must return the same reduced result"
                )
        return vals[0], None
    return torch.cat(vals, dim=where[1]), None


def assemble(impl: Any, prop: str, case: TPFp8Case, ranks: list[dict], output: str) -> Any:
    """:func:`assembly`'s global ``output``; a house-format failure of ``prop`` where the ranks' values do not
    assemble."""
    __tracebackhide__ = True
    got, why = assembly(case, ranks, output)
    if why:
        fail(impl, prop, case, why)
    return got


def output_judgement(
    impl: Any, case: TPFp8Case, t: Any, ref: Any, name: str, got: Any, label: str | None = None
) -> list[Any]:
    """``[(rank or None, Comparison vs dq, Comparison vs true)]`` of one assembled output (bgrad partials: one per
    rank, each Comparison named for its rank; the others named ``label``, default ``name``)."""
    u_a, _ = impl.support.accumulation("cpu")
    dt = case.single().torch_dtype
    if isinstance(got, list):  # row-parallel SP partial bias gradients
        res = []
        for r, (g, rows) in enumerate(zip(got, row_parts(case))):
            p, bnd = partial_bias_grad_bound(t.dy, rows, dt)
            c = compare(f"bgrad (rank {r}'s partial)", g.cpu(), p, bnd)
            res.append((r, c, c))
        return res
    parts = reduction_parts(case, name)
    if parts is not None:
        pdt = dt if impl.support.partial_dtype == "output" else torch.float32
        b = sharded_reduction_bounds(
            ref, name, t.x, t.weight, t.dy, t.bias, parts, out_dtype=dt, partial_dtype=pdt, accum_u=u_a
        )
        bdq, btrue, unspec = b.dq, b.true, b.unspecified
    else:
        b1 = output_bounds(ref, name, t.x, t.weight, t.dy, t.bias, out_dtype=dt, accum_u=u_a)
        bdq, btrue, unspec = b1.dq, b1.true, b1.unspecified
    skip_true = unspec | ~torch.isfinite(ref.true[name]) | torch.isnan(ref.dq[name])
    cdq = compare(label or name, *_masked(got, ref.dq[name], bdq, unspec))
    ctrue = compare(label or name, *_masked(got, ref.true[name], btrue, skip_true))
    return [(None, cdq, ctrue)]


def step_judgements(
    impl: Any,
    case: TPFp8Case,
    results: list[list[dict]],
    *,
    strict: bool,
    per_rank: bool = False,
    relative: dict[str, Any] | None = None,
) -> tuple[list[tuple[str, Any, Any]], list[str]]:
    """Every step's outputs assembled and compared with both references, without raising: ``[(label, dq, true)]``
    and the lines saying where the ranks' outputs do not assemble (:func:`assembly`) or are missing on every rank.
    ``strict``: stop at the first such line (the suite fails there). ``per_rank``: label partials
    ``bgrad@rankR`` and also compare every other rank's copy of a replicated output (``y@rankR``; a copy bitwise
    equal to rank 0's has rank 0's comparison); the report's records. Later steps carry ``@stepS``. ``relative``:
    filled with judgement (b) of every assembled output (:mod:`numcheck.properties.distributed.tp_fp8.yardstick`)."""
    scales = {r: 1.0 for r in ROLES}
    out: list[tuple[str, Any, Any]] = []
    problems: list[str] = []
    for step, t in enumerate(steps_tensors(case)):
        ranks = [res[step] for res in results]
        ref = quantized_linear(
            t.x, t.weight, t.dy, t.bias, case.recipe, delayed_scales=scales if case.recipe.kind == "delayed" else None
        )
        suffix = f"@step{step}" if step else ""
        for name in FP8_OUTPUTS:
            if name not in ref.dq:
                continue
            got, why = assembly(case, ranks, name)
            if why is None and got is None:
                why = f"{name}: missing on every rank (not connected to autograd?)"
            if why is not None:
                problems.append(why)
                if strict:
                    return out, problems
            if got is None:
                continue
            for rank, cdq, ctrue in output_judgement(impl, case, t, ref, name, got):
                label = cdq.output if rank is None or not per_rank else f"{name}@rank{rank}"
                out.append((label + suffix, cdq, ctrue))
            if relative is not None:
                unspec = None if isinstance(got, list) else _unspecified(impl, case, t, ref, name)
                relative.update({k + suffix: v for k, v in tp_relative(impl, case, t, ref, name, got, unspec).items()})
            if per_rank and placement(case, name) == "same":
                first = out[-1]
                for r in range(1, case.world):
                    v = ranks[r][name]
                    if v.shape != got.shape:  # the problem line says so; no element-wise comparison
                        continue
                    same = torch.equal(_bits(v), _bits(got))
                    _, cdq, ctrue = (
                        first if same else output_judgement(impl, case, t, ref, name, v, f"{name}@rank{r}")[0]
                    )
                    out.append((f"{name}@rank{r}{suffix}", cdq, ctrue))
        if case.recipe.kind == "delayed":
            scales = _next_delayed_scales(case, ref, scales)
    return out, problems


def _unspecified(impl: Any, case: TPFp8Case, t: Any, ref: Any, name: str) -> torch.Tensor:
    """The elements of ``name`` the contract leaves free (the single-device rule)."""
    u_a, _ = impl.support.accumulation("cpu")
    return output_bounds(
        ref, name, t.x, t.weight, t.dy, t.bias, out_dtype=case.single().torch_dtype, accum_u=u_a
    ).unspecified


def judged_steps(
    impl: Any, case: TPFp8Case, results: list[list[dict]], prop: str, relative: dict[str, Any] | None = None
) -> list[tuple[str, Any, Any]]:
    """Every step's outputs assembled and compared with both references: ``[(label, dq, true)]``; a house-format
    failure of ``prop`` at the first output whose ranks' values do not assemble. ``relative``: as
    :func:`step_judgements`'."""
    __tracebackhide__ = True
    out, problems = step_judgements(impl, case, results, strict=True, relative=relative)
    if problems:
        fail(impl, prop, case, problems[0])
    return out


def beyond_bound_lines(judged: list[tuple[str, Any, Any]]) -> list[str]:
    """The failure line of every comparison of ``judged`` beyond its bound (dequantized, then original reference)."""
    lines = []
    for _, cdq, ctrue in judged:
        if not cdq.ok:
            lines.append("vs dequantized-operand reference (accumulation and sharded reduction): " + cdq.describe())
        if not ctrue.ok:
            lines.append("vs original-operand reference (total error): " + ctrue.describe())
    return lines


def _next_delayed_scales(case: TPFp8Case, ref: Any, scales: dict[str, float]) -> dict[str, float]:
    """The stored scales after one step whose global amaxes the oracle recorded (every rank's state must match)."""
    st = DelayedScalingState(case.recipe)
    for r in ROLES:
        st.set_scale(r, scales[r])
        st.record(r, ref.amax[r])
    st.update()
    return {r: st.scale(r) for r in ROLES}


def dist_accuracy(impl: Any, case: TPFp8Case, results: list[list[dict]] | None = None) -> dict[str, float]:
    """Property: the assembled outputs are within both bounds, replicated outputs agree on every rank, and a
    delayed recipe's ranks record the group's amax; the error/bound per output as metrics."""
    __tracebackhide__ = True
    results = results if results is not None else run_case(impl, case, "dist_accuracy")
    if results is None:
        return {}
    relative: dict[str, Any] = {}
    judged = judged_steps(impl, case, results, "dist_accuracy", relative)
    metrics = {f"{label} error/bound (dequantized reference)": min(cdq.ratio, 1e6) for label, cdq, _ in judged}
    # For the seed sweep's tables: each output's comparison with the dequantized reference and its judgement (b),
    # apart per world size as the vocab-parallel family's are.
    at = f" (P={case.world})"
    records.note_judgements(
        impl.name,
        "dist_accuracy",
        case.dtype,
        repr(case),
        {label + at: cdq for label, cdq, _ in judged},
        {label + at: r for label, r in relative.items()},
    )
    lines = beyond_bound_lines(judged) + _amax_notes(case, results)
    if not lines:
        lines = [f"(b) relative to the declared path: {r.describe()}" for r in relative.values() if not r.ok]
    if lines:
        fail(impl, "dist_accuracy", case, *lines)
    return metrics


def _amax_notes(case: TPFp8Case, results: list[list[dict]]) -> list[str]:
    """Delayed scaling: every rank must record the global amax of x, W and dy (the oracle's) in every step."""
    if case.recipe.kind != "delayed":
        return []
    notes = []
    for step, t in enumerate(steps_tensors(case)):
        want = quantized_linear(t.x, t.weight, t.dy, t.bias, case.recipe, delayed_scales={r: 1.0 for r in ROLES}).amax
        for rank, res in enumerate(results):
            for role in ROLES:
                got = res[step]["amax"].get(role)
                if got is None or not (got == want[role] or (math.isnan(got) and math.isnan(want[role]))):
                    notes.append(
                        f"step {step}, rank {rank}: recorded amax of {role!r} is {got!r}; the group's amax "
                        f"(the unsharded tensor's) is {want[role]!r}"
                    )
    return notes


def scale_problems(case: TPFp8Case, results: list[list[dict]], *, strict: bool) -> list[str]:
    """Without raising, one line per (step, operand) whose ranks did not quantize with the oracle's scales (the
    judgement of :func:`dist_same_scale`); ``strict``: stop at the first."""
    scales = {r: 1.0 for r in ROLES}
    problems: list[str] = []
    for step, t in enumerate(steps_tensors(case)):
        ref = quantized_linear(
            t.x, t.weight, t.dy, t.bias, case.recipe, delayed_scales=scales if case.recipe.kind == "delayed" else None
        )
        for role in ROLES:
            for usage in USAGES:
                why = _scale_problem(
                    case, step, role, usage, ref, [res[step]["scales"].get((role, usage)) for res in results]
                )
                if why is not None:
                    problems.append(why)
                    if strict:
                        return problems
        if case.recipe.kind == "delayed":
            scales = _next_delayed_scales(case, ref, scales)
    return problems


def dist_same_scale(impl: Any, case: TPFp8Case, results: list[list[dict]] | None = None) -> dict[str, float]:
    """Property: every rank reports, for every GEMM operand, the oracle's scale_inv of the unsharded tensor —
    one value, the same on every rank, for per-tensor recipes; the oracle's blocks over the rank's operand for
    block recipes."""
    __tracebackhide__ = True
    results = results if results is not None else run_case(impl, case, "dist_same_scale")
    if results is None:
        return {}
    problems = scale_problems(case, results, strict=True)
    if problems:
        fail(impl, "dist_same_scale", case, problems[0])
    return {}


def _scale_problem(case: TPFp8Case, step: int, role: str, usage: str, ref: Any, got: list[Any]) -> str | None:
    """Why the ranks' reported scales ``got`` of operand (role, usage) are not the oracle's (the first rank that
    differs), or ``None``."""
    q = ref.operand(role, usage)
    where = f"step {step}, operand ({role}, {usage})"
    missing = [r for r, g in enumerate(got) if g is None]
    if missing:
        return f"{where}: ranks {missing} reported no scale (ScaleLog.record)"
    per_tensor = q.scale_inv.numel() == 1 and case.recipe.block_of(role, usage) is None
    for r, g in enumerate(got):
        if per_tensor:
            if g.numel() != 1 or not torch.equal(g.reshape(()).double(), q.scale_inv.reshape(())):
                v = [float(s.reshape(-1)[0]) for s in got]
                return (
                    f"{where}: rank {r} quantized with scale_inv {v[r]:.9g}; the group's (unsharded) scale_inv "
                    f"is {float(q.scale_inv.reshape(())):.9g} (ranks report {v}): every rank must quantize with "
                    f"the scale of the all-reduced amax"
                )
            continue
        rows, cols = operand_slices(case, role, r)
        br, bc = q.block
        R, C = q.codes.shape
        r0, r1 = rows.start or 0, rows.stop if rows.stop is not None else R
        c0, c1 = cols.start or 0, cols.stop if cols.stop is not None else C
        want = q.scale_inv[r0 // br : -(-r1 // br), c0 // bc : -(-c1 // bc)]
        same = (g.double() == want) | (torch.isnan(g.double()) & torch.isnan(want)) if g.shape == want.shape else None
        if same is None or not bool(same.all()):
            return (
                f"{where}: rank {r}'s block scales (grid {tuple(g.shape)}) differ from the oracle's blocks over "
                f"its operand (grid {tuple(want.shape)}, rows {r0}:{r1}, cols {c0}:{c1})"
            )
    return None


@dataclass(frozen=True)
class TPMeasurement:
    """One tensor-parallel case measured without raising (for ``numcheck report``): what :func:`dist_accuracy`
    and :func:`dist_same_scale` judge, every part of it kept.

    Attributes:
        outputs: label → (Comparison against the dequantized-operand reference, against the original operands):
            ``y``, ``dgrad``, ``wgrad``, ``bgrad`` as assembled; ``NAME@rankR`` for every other rank's copy of a
            replicated output and for each rank's partial bias gradient (row-parallel SP); ``@stepS`` for a
            delayed recipe's later steps.
        rank_lines: where the ranks' outputs do not assemble (missing on some, replicated copies that differ)
            and delayed amaxes that are not the group's: dist_accuracy's failure lines beside the bounds.
        scale_lines: dist_same_scale's failure lines, one per (step, operand); empty when every rank used the
            oracle's scales.
    """

    outputs: dict[str, tuple[Any, Any]]
    rank_lines: list[str]
    scale_lines: list[str]

    @property
    def accuracy_lines(self) -> list[str]:
        """dist_accuracy's failure lines: :attr:`rank_lines`, then every comparison beyond its bound (a replicated
        copy bitwise rank 0's shares rank 0's comparison, so its line once); empty when dist_accuracy holds."""
        beyond = beyond_bound_lines([(label, cdq, ctrue) for label, (cdq, ctrue) in self.outputs.items()])
        return self.rank_lines + list(dict.fromkeys(beyond))

    @property
    def same_scale(self) -> bool:
        """Whether every rank quantized every operand with the oracle's (the unsharded tensor's) scales."""
        return not self.scale_lines


def measure(impl: Any, case: TPFp8Case) -> TPMeasurement:
    """``case`` run once on its ranks and judged as :func:`dist_accuracy` and :func:`dist_same_scale` judge it,
    without failing (:class:`TPMeasurement`); a rank that raises or times out still raises the house-format
    :class:`PropertyFailure`."""
    results = run_case(impl, case, "dist_accuracy")
    judged, problems = step_judgements(impl, case, results, strict=False, per_rank=True)
    return TPMeasurement(
        {label: (cdq, ctrue) for label, cdq, ctrue in judged},
        problems + _amax_notes(case, results),
        scale_problems(case, results, strict=False),
    )


def world_size_invariance(impl: Any, case: TPFp8Case) -> dict[str, float]:
    """Property: the assembled outputs at every declared world size dividing the case agree pairwise within the
    sum of their bounds against the dequantized reference (both are within their bound of the same o_dq)."""
    __tracebackhide__ = True
    runs = {}
    for P in impl.support.world_sizes:
        if world_size_unavailable(P, default_backend()):
            continue  # nccl with fewer GPUs than ranks: the test module skips when fewer than two sizes remain
        try:
            c = case.replace(world=P)
        except ValueError:
            continue
        res = run_case(impl, c, "world_size_invariance")
        if res is None:
            return {}
        glob = steps_tensors(c)
        outs = {}
        scales = {r: 1.0 for r in ROLES}
        for step, t in enumerate(glob):
            ref = quantized_linear(
                t.x, t.weight, t.dy, t.bias, c.recipe, delayed_scales=scales if c.recipe.kind == "delayed" else None
            )
            for name in FP8_OUTPUTS:
                if name in ref.dq and not (name == "bgrad" and placement(c, name) == "partial"):
                    got = assemble(impl, "world_size_invariance", c, [rr[step] for rr in res], name)
                    outs[(name, step)] = (got, ref, t)
            if c.recipe.kind == "delayed":
                scales = _next_delayed_scales(c, ref, scales)
        runs[P] = (c, outs)
    sizes = sorted(runs)
    for a, b in zip(sizes, sizes[1:]):
        ca, oa = runs[a]
        cb, ob = runs[b]
        for key in oa:
            if key not in ob:
                continue
            ga, ref, t = oa[key]
            gb = ob[key][0]
            ba = _output_dq_bound(impl, ca, t, ref, key[0])
            bb = _output_dq_bound(impl, cb, t, ref, key[0])
            cmp = compare(
                f"{key[0]} at P={b} vs P={a}",
                *_masked(gb, ga.double(), ba + bb, torch.zeros_like(ba, dtype=torch.bool)),
            )
            if not cmp.ok:
                fail(
                    impl,
                    "world_size_invariance",
                    case,
                    f"step {key[1]}: world size {b} against world size {a}, "
                    f"bound the sum of both dequantized-reference bounds: " + cmp.describe(),
                )
    return {}


def _output_dq_bound(impl: Any, case: TPFp8Case, t: Any, ref: Any, name: str) -> torch.Tensor:
    """The bound against the dequantized reference of one output at ``case.world``."""
    u_a, _ = impl.support.accumulation("cpu")
    dt = case.single().torch_dtype
    parts = reduction_parts(case, name)
    if parts is not None:
        pdt = dt if impl.support.partial_dtype == "output" else torch.float32
        return sharded_reduction_bounds(
            ref, name, t.x, t.weight, t.dy, t.bias, parts, out_dtype=dt, partial_dtype=pdt, accum_u=u_a
        ).dq
    return output_bounds(ref, name, t.x, t.weight, t.dy, t.bias, out_dtype=dt, accum_u=u_a).dq


def _bitwise(impl: Any, prop: str, case: TPFp8Case, a: list[list[dict]], b: list[list[dict]], what: str) -> None:
    __tracebackhide__ = True
    for step in range(len(a[0])):
        for rank in range(len(a)):
            for name in FP8_OUTPUTS:
                va, vb = a[rank][step][name], b[rank][step][name]
                if va is None and vb is None:
                    continue
                if va is None or vb is None or va.shape != vb.shape or not torch.equal(_bits(va), _bits(vb)):
                    n = (
                        int((_bits(va) != _bits(vb)).sum())
                        if va is not None and vb is not None and va.shape == vb.shape
                        else -1
                    )
                    fail(
                        impl,
                        prop,
                        case,
                        f"step {step}, rank {rank}: {name} differs bitwise between {what} ({n} elements; bound 0)",
                    )


def dist_save_original_input(impl: Any, case: TPFp8Case) -> dict[str, float]:
    """Property: save_original_input True and False give bitwise identical outputs on every rank."""
    __tracebackhide__ = True
    a = run_case(impl, case.replace(save_original_input=False), "dist_save_original_input")
    b = run_case(impl, case.replace(save_original_input=True), "dist_save_original_input")
    if a is not None and b is not None:
        _bitwise(impl, "dist_save_original_input", case, a, b, "save_original_input=False and True")
    return {}


def dist_determinism(impl: Any, case: TPFp8Case) -> dict[str, float]:
    """Property (declared ``deterministic``): two runs of one case at one world size agree bitwise on every rank."""
    __tracebackhide__ = True
    a = run_case(impl, case, "dist_determinism")
    b = run_case(impl, case, "dist_determinism")
    if a is not None and b is not None:
        _bitwise(impl, "dist_determinism", case, a, b, "two runs")
    return {}


#: The properties a repro command can name; each takes ``(impl, case)``.
DIST_FP8_PROPERTIES: dict[str, Callable[[Any, TPFp8Case], Any]] = {
    "dist_accuracy": dist_accuracy,
    "dist_same_scale": dist_same_scale,
    "world_size_invariance": world_size_invariance,
    "dist_save_original_input": dist_save_original_input,
    "dist_determinism": dist_determinism,
}
