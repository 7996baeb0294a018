"""The production-shape tier: every linear+CE impl at the shapes users train at, judged against the float64 oracle.

The property suite draws small problems; bugs of scale are never drawn there: int32 offsets that wrap once
N·V passes 2³¹, chunk and block tails at vocabularies that are not powers of two, an allocator blow-up at real
sizes. This module runs one impl on one production-shape case and judges it with the suite's own accuracy
property (:func:`properties.linear_ce.accuracy.check_accuracy`: judgements (a) and (b), the same bounds of
:mod:`properties.linear_ce.tolerance`, the same :class:`properties.core.compare.Comparison` lines), on realistic inputs
(:mod:`properties.production.inputs`). What it adds is what a size makes necessary:

* work shared between the impls of one case (:class:`CaseContext`): the inputs, the float64 oracle (chunked over
  rows and vocabulary, :mod:`reference.linear_ce`: no [N, V] float64 tensor exists), eager's errors (judgement
  (b)'s yardstick) and the bounds of each distinct error model (:class:`BoundCache`; impls of one declaration
  share them);
* the time of the impl, of the oracle and of the bounds, and the impl's extra peak memory
  (``torch.cuda.max_memory_allocated`` over forward + backward, less what was allocated before), beside each
  verdict;
* for grad_x (its first index is the token; the tier's cases reduce the loss to a scalar), the first row beyond
  its bound, beside the first row an int32 element offset reaches 2³¹ (:func:`int32_first_row`): a kernel that
  forms offsets in int32 fails exactly from there.

Cost, in float64 GEMMs of 2·N·H·V flops (8.8e12 at the first shape, 0.16 s at the H200's measured 56 TFLOP/s):
the oracle 4 per case (pass 1 recomputes the logits; pass 2 the logits, grad_x and grad_W); eager's errors
reuse it. The bounds (:class:`BoundCache`) are swept for many error models at once
(:func:`properties.linear_ce.tolerance.sweep_bounds`): 7 per sweep (pass 1, the logits of two walks, |x||W|ᵀ in each,
|G||W| and |G|ᵀ|x|) plus 2 per gradient key (|δG||W|, |δG|ᵀ|x|), where one model alone costs 14. A sweep holds
each model's float64 grad_x and grad_W bounds, so a case's models are swept in groups that fit
:data:`BOUND_MEMORY_FRACTION` of the device: 3–4 groups a case at the production shapes instead of one sweep
per model (28 at the first shape on the H200: 68 s of its 75 s in the first run).

A case's reproduction is ``numcheck production`` restricted to it (:func:`repro_command`: its one shape, precision and
impl, into a folder of its own started afresh): its tensors are drawn on the device, not by
:func:`properties.linear_ce.cases.build`, so ``numcheck repro`` does not rebuild them.
"""

from __future__ import annotations

import shlex
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

import torch

from numcheck.errors import BadInput, both_names, warn_renamed
from numcheck.properties.core.failures import exception_lines, impl_invocation
from numcheck.properties.linear_ce.accuracy import AccuracyResult, EagerErrors, check_accuracy, eager_errors
from numcheck.properties.linear_ce.cases import Problem, Tensors
from numcheck.properties.linear_ce.harness import ImplOutputs, run_impl, run_oracle
from numcheck.properties.linear_ce.known import known_on_tensors
from numcheck.properties.linear_ce.strategies import refusal
from numcheck.properties.linear_ce.tolerance import (
    ErrorModel,
    SweepResult,
    error_model,
    finish_bounds,
    sweep_bounds,
    sweep_key,
)
from numcheck.properties.production.inputs import scale_tensors
from numcheck.reference.linear_ce import LinearCEResult

#: Elements an int32 offset can address: an element offset row·V + col wraps from 2³¹ on.
INT32_LIMIT = 2**31
#: The property name the tier's verdicts carry (its judgement is the suite's ``accuracy``).
PROPERTY = "production_accuracy"
#: Fraction of ignored rows in every case (in runs, :func:`properties.production.inputs._ignored_runs`).
IGNORED = 0.1


@dataclass(frozen=True)
class Shape:
    """One production shape: ``N`` tokens (batch × sequence), hidden size ``H``, vocabulary ``V``."""

    name: str
    N: int
    H: int
    V: int
    note: str = ""

    @property
    def crosses_int32(self) -> bool:
        """Whether the [N, V] logits have more elements than an int32 offset addresses."""
        return self.N * self.V > INT32_LIMIT


#: Shape presets. ``production``: the seeds' shape (000_1e3efc084b4da987: V=131072, H=4096, BT=8192), Llama 3's
#: vocabulary (128256 = 15·8192 + 5376: a ragged last block for every power-of-two vocabulary block up to 8192, and
#: for the oracle's), and Qwen3-1.7B's head at 16384 tokens (V=151936, ragged too, N·V = 2.49e9 > 2³¹; H=2048 keeps
#: the float64 work at 1.16× the first shape's). ``smoke``: the same roles at sizes a CPU and Triton's interpreter run
#: in seconds (the int32 boundary is not reached there).
SHAPES: dict[str, tuple[Shape, ...]] = {
    "production": (
        Shape("seed-131072", 8192, 4096, 131072, "the seeds' shape (BT=8192, H=4096, V=131072)"),
        Shape("ragged-128256", 8192, 4096, 128256, "Llama 3's vocabulary: ragged last vocabulary block"),
        Shape("int32-151936", 16384, 2048, 151936, "N·V = 2.49e9 > 2^31 (Qwen3-1.7B's head, 16384 tokens)"),
    ),
    "smoke": (
        Shape("seed-small", 64, 32, 256, "smoke: power-of-two vocabulary"),
        Shape("ragged-small", 50, 24, 203, "smoke: ragged vocabulary and rows"),
        Shape("int32-small", 40, 16, 333, "smoke: the int32 shape's role, far below 2^31"),
    ),
}

#: The precisions of the tier: bf16 parameters, and fp32 parameters under bf16 autocast (AMP).
DTYPES: dict[str, dict[str, Any]] = {
    "bf16": {"dtype": "bfloat16", "autocast": None},
    "amp": {"dtype": "float32", "autocast": "bfloat16"},
}


#: The environment variable that picks the tier's shapes in the suite (``numcheck.tests.suite.test_production``), and
#: its name before numcheck 0.2.0 (still read, with a warning, until 0.3.0).
SHAPES_ENV, FORMER_SHAPES_ENV = "NUMCHECK_PRODUCTION_SHAPES", "NUMCHECK_SCALE_SHAPES"


def env_shapes(environ: Mapping[str, str]) -> str:
    """The shapes :data:`SHAPES_ENV` names (``"production"`` without it); :data:`FORMER_SHAPES_ENV` alone is read
    with a :class:`~numcheck.errors.RenamedWarning`, both set is one :class:`~numcheck.errors.BadInput` naming both."""
    new, old = environ.get(SHAPES_ENV), environ.get(FORMER_SHAPES_ENV)
    if old is not None:
        if new is not None:
            raise BadInput(both_names("environment variable", FORMER_SHAPES_ENV, SHAPES_ENV))
        warn_renamed("environment variable", FORMER_SHAPES_ENV, SHAPES_ENV)
        return old
    return new if new is not None else "production"


def parse_shapes(text: str) -> tuple[Shape, ...]:
    """``"production"``/``"smoke"``, or a comma-separated list of ``NAME=NxHxV`` (e.g. ``a=8x4x10,b=5x3x7``)."""
    if text in SHAPES:
        return SHAPES[text]
    out = []
    for item in (s.strip() for s in text.split(",") if s.strip()):
        name, _, dims = item.partition("=")
        try:
            N, H, V = (int(d) for d in dims.lower().split("x"))
        except ValueError:
            raise ValueError(f"--shapes: {item!r} is neither a preset ({sorted(SHAPES)}) nor NAME=NxHxV") from None
        if min(N, H, V) < 1:
            raise ValueError(f"--shapes: {item!r}: N, H and V must be positive")
        out.append(Shape(name or dims, N, H, V, "custom"))
    if not out:
        raise ValueError(f"--shapes: nothing given (presets: {sorted(SHAPES)})")
    return tuple(out)


@dataclass(frozen=True)
class Case:
    """One shape at one precision on one device."""

    shape: Shape
    precision: str
    device: str
    seed: int = 0

    @property
    def label(self) -> str:
        """``shape/precision``: the case's name in records, progress events and tables."""
        return f"{self.shape.name}/{self.precision}"

    @property
    def problem(self) -> Problem:
        """The :class:`Problem` the judgements read (shapes, dtypes, options; the tensors are
        :func:`properties.production.inputs.scale_tensors`')."""
        d = DTYPES[self.precision]
        return Problem(
            N=self.shape.N,
            H=self.shape.H,
            V=self.shape.V,
            dtype=d["dtype"],
            autocast=d["autocast"],
            ignored=IGNORED,
            regime="post_norm",
            seed=self.seed,
            device=self.device,
        )


def int32_first_row(V: int) -> int:
    """The first row of a row-major [N, V] tensor with an element at offset ≥ 2³¹: the first with (row+1)·V > 2³¹,
    i.e. row + 1 > 2³¹/V, whose smallest solution is ⌊2³¹/V⌋."""
    return INT32_LIMIT // V


def first_row_beyond(impl: torch.Tensor | None, oracle: torch.Tensor, bound: torch.Tensor) -> int | None:
    """The first index along dim 0 where some element of ``impl`` is beyond ``bound`` of ``oracle`` (a non-finite
    value where the oracle is finite counts), or ``None``; ``None`` too for a scalar or a missing output."""
    if impl is None or oracle.dim() == 0 or tuple(impl.shape) != tuple(oracle.shape):
        return None
    a = impl.detach().to(device=oracle.device, dtype=torch.float64)
    bad = ~((a - oracle).abs() <= bound.to(oracle.device, torch.float64).expand_as(oracle))
    bad &= torch.isfinite(oracle) | ~(torch.isnan(a) & torch.isnan(oracle))
    rows = bad.reshape(bad.shape[0], -1).any(dim=1).nonzero()
    return int(rows[0, 0]) if rows.numel() else None


def _sync(device: str) -> None:
    """Wait for ``device``'s queued kernels (CUDA), so that a time taken after it covers them."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


#: Fraction of the device's memory the bound sweeps of one case may hold at once on CUDA (a sweep holds grad_x's
#: and grad_W's bounds in float64: 4.6 GB at 8192×4096×131072); impls still run beside it (eager's extra peak
#: reaches 41 GB at the int32 shape under AMP).
BOUND_MEMORY_FRACTION = 0.3
#: The same budget in bytes off CUDA.
BOUND_MEMORY_CPU = 2**31


def _bound_budget(device: str) -> int:
    """Bytes the bound sweeps of one case may hold on ``device`` (:data:`BOUND_MEMORY_FRACTION`, or
    :data:`BOUND_MEMORY_CPU` off CUDA)."""
    if torch.device(device).type == "cuda":
        return int(BOUND_MEMORY_FRACTION * torch.cuda.get_device_properties(torch.device(device)).total_memory)
    return BOUND_MEMORY_CPU


class BoundCache:
    """Bounds per error model on one case. What costs is the block sweep (:func:`properties.linear_ce.tolerance.sweep_bounds`):
    given the case's plan (:meth:`plan`: the models each impl's judgement will ask for, in run order), a miss sweeps
    the missing model together with the next planned ones that fit in ``budget`` bytes, sharing each block's
    products between them, and drops sweeps no later impl needs; a model's bounds are then finished from its sweep
    (:func:`properties.linear_ce.tolerance.finish_bounds`: cheap). The bounds are those of
    :func:`properties.linear_ce.tolerance.linear_ce_bounds`, bit for bit. ``spent`` is the time spent on bounds since
    :meth:`start` (an impl whose miss sweeps a group carries the group's time); ``hits`` the calls whose sweep
    was there."""

    def __init__(self, p: Problem, t: Tensors, oracle: LinearCEResult, budget: int | None = None) -> None:
        self.p, self.t, self.oracle = p, t, oracle
        self.budget = budget if budget is not None else _bound_budget(p.device)
        self.swept: dict[str, SweepResult] = {}
        self.planned: list[tuple[str, ErrorModel]] = []  # (impl name, model) in run order
        self.position = 0
        self.spent = 0.0
        self.hits = 0

    def plan(self, impls: list[Any]) -> None:
        """The models the judgement of each of ``impls`` (in run order) asks for: its declaration at the hard and
        the expected level (the returned dtypes do not change a sweep, :func:`properties.linear_ce.tolerance.sweep_key`)."""
        p = self.p
        self.planned = []
        for impl in impls:
            try:
                if impl.support.unavailable_reason() is None and refusal(impl.support, p) is None:
                    self.planned += [(impl.name, error_model(impl.support, p, {}, lv)) for lv in ("hard", "expected")]
            except Exception:  # a declaration that cannot be read is the impl's own error, when it is judged
                continue

    def start(self, impl: Any = None) -> None:
        """Begin judging ``impl`` (its place in the plan decides what is still needed)."""
        self.spent, self.hits = 0.0, 0
        names = [n for n, _ in self.planned]
        if impl is not None and impl.name in names:
            self.position = names.index(impl.name)

    def _needed_later(self) -> set[str]:
        """The sweep keys the models of the plan from the current impl on ask for."""
        return {repr(sweep_key(m)) for _, m in self.planned[self.position :]}

    def _sweep_for(self, model: ErrorModel) -> None:
        """Sweep ``model`` together with the next planned models that fit the budget, first dropping sweeps no
        later impl needs and then the oldest until there is room (each :class:`SweepResult` holds only its own
        gradient bounds, so dropping one frees them)."""
        per = 8 * (self.p.N * self.p.H + self.p.V * self.p.H + self.p.V)  # one sweep's float64 gradient bounds
        if self.planned:
            needed = self._needed_later()
            for key in [k for k in self.swept if k not in needed]:
                del self.swept[key]
        while self.swept and per * (len(self.swept) + 1) > self.budget:
            del self.swept[next(iter(self.swept))]  # the oldest
        room = max(self.budget - per * len(self.swept), per)
        group: dict[str, ErrorModel] = {repr(sweep_key(model)): model}
        for _, m in self.planned[self.position :]:
            key = repr(sweep_key(m))
            if per * (len(group) + 1) > room:
                break
            if key not in self.swept:
                group.setdefault(key, m)
        self.swept.update(sweep_bounds(self.p, self.t, self.oracle, list(group.values())))
        _release(self.p)

    def __call__(self, model: ErrorModel) -> dict[str, torch.Tensor]:
        """The bounds of ``model`` (:func:`properties.linear_ce.tolerance.linear_ce_bounds`'), from its sweep (swept now on a
        miss); its time is added to ``spent``."""
        t0 = time.perf_counter()
        key = repr(sweep_key(model))
        if key in self.swept:
            self.hits += 1
        else:
            self._sweep_for(model)
        b = finish_bounds(self.p, self.t, self.oracle, model, self.swept[key])
        _sync(self.p.device)
        self.spent += time.perf_counter() - t0
        return b


@dataclass
class CaseContext:
    """What every impl of one case shares: tensors, oracle, eager's errors, the bound cache, and their times."""

    case: Case
    t: Tensors
    oracle: LinearCEResult
    eager: EagerErrors | None
    bounds: BoundCache
    times: dict[str, float] = field(default_factory=dict)
    #: Why eager could not run on the case (then judgement (b), which needs its errors, is not made).
    eager_failure: str = ""

    @staticmethod
    def build(case: Case) -> "CaseContext":
        """Draw the tensors, run the oracle and eager (timed: ``inputs_s``, ``oracle_s``, ``eager_s``)."""
        p = case.problem
        times = {}
        t0 = time.perf_counter()
        t = scale_tensors(p)
        _sync(p.device)
        times["inputs_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        ref = run_oracle(p, t, all_ignored="nan")
        _sync(p.device)
        times["oracle_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        eager: EagerErrors | None = None
        failure = ""
        try:
            eager = eager_errors(p, t, ref)
        except Exception as exc:  # eager itself breaks at this size: judge (a) alone, and say why
            failure = " ".join(exception_lines(exc))
            _release(p)
        _sync(p.device)
        times["eager_s"] = time.perf_counter() - t0
        return CaseContext(case, t, ref, eager, BoundCache(p, t, ref), times, failure)


#: The folder :func:`repro_command`'s line writes into (started afresh by its ``--force``).
REPRO_OUT = "numcheck-production-repro"


def repro_command(impl: Any, case: Case) -> str:
    """The ``numcheck production`` line that reruns exactly this impl on exactly this case, afresh: the one shape as
    ``NAME=NxHxV``, the one precision, the device, and its own ``--out`` (:data:`REPRO_OUT`) with ``--force``, so
    that no progress an earlier run left there is reassembled instead of running."""
    env, name = impl_invocation(impl)
    s = case.shape
    return (
        f"{env}numcheck production --impl {shlex.quote(name)} --shapes {shlex.quote(f'{s.name}={s.N}x{s.H}x{s.V}')} "
        f"--precisions {case.precision} --device {torch.device(case.device).type} --out {REPRO_OUT} --force"
    )


def failure_text(impl: Any, case: Case, lines: list[str]) -> str:
    """The suite's failure format (:func:`properties.core.failures.failure_message`) with the tier's repro line."""
    body = "\n".join(f"  {line}" for line in lines)
    return (
        f"property {PROPERTY!r} fails for impl {impl.name!r}\n  case: {case.label}: {case.problem!r} "
        f"(tensors: properties.production.inputs.scale_tensors)\n{body}\n  reproduce: {repro_command(impl, case)}"
    )


def _measured_run(impl: Any, p: Problem, t: Tensors) -> tuple[ImplOutputs, float, int | None]:
    """``(outputs, seconds, extra peak bytes)`` of forward + backward (the peak on CUDA only)."""
    cuda = torch.device(p.device).type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    t0 = time.perf_counter()
    out = run_impl(impl, p, t)
    _sync(p.device)
    seconds = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated() - before if cuda else None
    return out, seconds, peak


def _output_record(res: AccuracyResult, name: str, first_row: int | None) -> dict[str, Any]:
    """The JSON figures of output ``name``: judgement (a)'s verdict, ratio, worst element and error sizes,
    judgement (b)'s where it was made, and the first row beyond the bound where one was found."""
    c = res.analytic[name]
    rec: dict[str, Any] = {
        "ok": c.ok,
        "ratio": c.ratio,
        "n_bad": c.n_bad,
        "numel": c.numel,
        "worst": list(c.worst),
        "max_abs": c.max_abs,
        "rmse": c.rmse,
        "dtype": c.dtype,
        "state": c.state,
    }
    if name in res.relative:
        r = res.relative[name]
        rec["relative"] = {
            "ok": r.ok,
            "judged": r.judged,
            "rmse": r.rmse_impl,
            "eager_rmse": r.rmse_eager,
            "allowed": r.allowed,
            "note": r.note,
        }
    if first_row is not None:
        rec["first_row_beyond"] = first_row
    return rec


def _row_lines(res: AccuracyResult, rows: dict[str, int], shape: Shape) -> list[str]:
    """One line per row-indexed output beyond its bound: its first such row, against the int32 boundary."""
    lines = []
    for name, r in rows.items():
        if res.analytic[name].ok:
            continue
        edge = int32_first_row(shape.V)
        where = (
            (f"; the first row with (row+1)·V > 2^31 is {edge}" + (" (this one: int32 offsets)" if r == edge else ""))
            if shape.crosses_int32
            else ""
        )
        lines.append(f"{name}: first wrong row {r} of {shape.N}{where}")
    return lines


def judge_impl(impl: Any, ctx: CaseContext) -> dict[str, Any]:
    """Run and judge ``impl`` on the context's case; a record (JSON-ready) with verdict, per-output figures, times
    and extra peak memory. An impl that raises (an OOM included), or whose judgement raises (a declaration the
    bounds cannot read), gets status ``error`` with the suite's description of the exception; nothing propagates
    but :class:`KeyboardInterrupt`-like exits."""
    case, p = ctx.case, ctx.case.problem
    rec: dict[str, Any] = {
        "case": case.label,
        "shape": case.shape.name,
        "precision": case.precision,
        "impl": impl.name,
        "problem": repr(p),
        **{k: round(v, 4) for k, v in ctx.times.items()},
    }
    try:
        unavailable = impl.support.unavailable_reason()  # as the suite decides it (strategies.why_not_run)
        if unavailable:
            return {**rec, "status": "unavailable", "reason": unavailable}
        why = refusal(impl.support, p)
        if why is not None:
            return {**rec, "status": "unsupported", "reason": why}
        out, seconds, peak = _measured_run(impl, p, ctx.t)
        rec.update(impl_s=round(seconds, 4), extra_peak_bytes=peak)
        return _judge(impl, ctx, out, rec)
    except Exception as exc:  # an impl's failure is a verdict on it, never the end of the tier
        _release(p)
        lines = exception_lines(exc)
        return {**rec, "status": "error", "reason": lines[0], "failure": failure_text(impl, case, lines)}


def _judge(impl: Any, ctx: CaseContext, out: ImplOutputs, rec: dict[str, Any]) -> dict[str, Any]:
    """``rec`` completed with the judgement of ``out``: the accuracy property's verdict, each output's figures,
    grad_x's first row beyond its bound, the bound times; ``known`` where a known divergence covers a failure."""
    case, p = ctx.case, ctx.case.problem
    ctx.bounds.start(impl)
    t0 = time.perf_counter()
    res = check_accuracy(
        impl,
        p,
        t=ctx.t,
        out=out,
        oracle=ctx.oracle,
        eager_err=ctx.eager,
        bounds=ctx.bounds,
        relative=ctx.eager is not None,
    )
    if ctx.eager is None:
        rec["note"] = f"judgement (b) not made: eager failed on this case ({ctx.eager_failure})"
    _sync(p.device)
    rec.update(
        judge_s=round(time.perf_counter() - t0, 4), bound_s=round(ctx.bounds.spent, 4), bound_hits=ctx.bounds.hits
    )
    rows = {}
    if "grad_x" in res.analytic:
        r = first_row_beyond(out.get("grad_x"), ctx.oracle.grad_x, ctx.bounds(_hard_model(impl, p, out))["grad_x"])
        if r is not None:
            rows["grad_x"] = r
    rec["outputs"] = {n: _output_record(res, n, rows.get(n)) for n in res.analytic}
    if case.shape.crosses_int32:
        rec["int32_first_row"] = int32_first_row(case.shape.V)
    if res.ok:
        return {**rec, "status": "pass"}
    lines = res.failure_lines() + _row_lines(res, rows, case.shape)
    known = known_on_tensors(impl.name, "accuracy", p, ctx.t)  # a data predicate decides on the tier's tensors
    rec.update(status="known" if known else "fail", failure=failure_text(impl, case, lines))
    if known:
        rec["known_divergence"] = known.reason
    return rec


def _hard_model(impl: Any, p: Problem, out: ImplOutputs) -> ErrorModel:
    """The hard-level error model check_accuracy judged ``out`` under (a cache hit in :class:`BoundCache`)."""
    dtypes = {
        k: v.dtype
        for k in ("loss", "z_loss", "grad_x", "grad_weight", "grad_bias")
        if isinstance(v := out.get(k), torch.Tensor)
    }
    return error_model(impl.support, p, dtypes, "hard")


def _release(p: Problem) -> None:
    """Give cached allocator blocks back after a failed impl (an OOM leaves its partial allocations cached)."""
    if torch.device(p.device).type == "cuda":
        torch.cuda.empty_cache()
