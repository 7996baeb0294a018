"""Distributed linear+CE: one case run on every rank of a :class:`~numcheck.properties.distributed.pool.pool.DistPool`,
assembled (loss from rank 0, every rank's grad_x, the shards of grad_W and grad_b concatenated) and judged
against the float64 oracle run unsharded here, under :mod:`numcheck.properties.distributed.linear_ce.tolerance`.

A case is a :class:`~numcheck.properties.distributed.linear_ce.cases.DistCase`: a single-device :class:`Problem`,
a world size, a backend and a target placement. The smoothing the oracle
sees is the impl's declared convention's (:mod:`numcheck.reference.smoothing`).

Properties (each raising :class:`~numcheck.properties.core.failures.PropertyFailure` in the house format, whose repro
line runs ``python -m numcheck.properties.distributed.linear_ce.props``): :func:`dist_accuracy` (every output within bound,
and every rank's loss bitwise equal to rank 0's), :func:`dist_world_size_invariance` (P = 1, 2, 4 pairwise within
the sum of their bounds), :func:`dist_determinism` (two calls bitwise equal where declared).
"""

from __future__ import annotations

import argparse
import importlib
import math
import shlex
import sys
from dataclasses import dataclass, replace
from typing import Any

import torch

from numcheck.errors import PropertyFailure
from numcheck.impls.protocols.dist_linear_ce import DIST_KIND, shard_bounds
from numcheck.impls.registry import DIST_RANK_MODULES, ImplEntry, load_spec, spec_of
from numcheck.properties.core import matmul_precision, poison, records
from numcheck.properties.core.compare import compare
from numcheck.properties.core.tensors import same_bits
from numcheck.properties.distributed.linear_ce.cases import DistCase
from numcheck.properties.distributed.linear_ce.known import output_divergences
from numcheck.properties.distributed.linear_ce.placement import place_targets
from numcheck.properties.distributed.linear_ce.tolerance import dist_error_model, relation_bounds
from numcheck.properties.distributed.linear_ce.yardstick import dist_relative
from numcheck.properties.distributed.pool import zygote
from numcheck.properties.distributed.pool.pool import DEFAULT_TIMEOUT_S, DistPool, FailureLatch, rank_device
from numcheck.properties.linear_ce.accuracy import AccuracyResult
from numcheck.properties.linear_ce.cases import Problem, Tensors, build
from numcheck.properties.linear_ce.harness import run_oracle
from numcheck.properties.linear_ce.tolerance import linear_ce_bounds
from numcheck.reference.smoothing import oracle_smoothing

# Warm the rank zygote with this family's rank-side modules and the vocabulary-parallel impls' modules (the
# registry names those: the judge names no impl module).
zygote.warm(__name__, "numcheck.impls.registry", *DIST_RANK_MODULES)

OUTPUT_NAMES: tuple[str, ...] = ("loss", "grad_x", "grad_weight", "grad_bias")


def oracle_tensors(impl: Any, case: DistCase) -> Tensors:
    """The case's tensors as the oracle sees them: targets placed, smoothing in PyTorch's terms for the impl's
    declared convention."""
    t = place_targets(build(case.problem), case)
    eps = oracle_smoothing(t.options.label_smoothing, case.problem.V, impl.dist.smoothing)
    return t._replace(options=t.options.replace(label_smoothing=eps)) if eps != t.options.label_smoothing else t


def rank_run(rank: int, world_size: int, group: Any, args: tuple) -> dict[str, torch.Tensor | None]:
    """A rank's forward and backward of ``impl.rank_call`` on its shard (run by the pool), with uninitialised
    memory filled where the judging process decided so (``poisoned``: :func:`numcheck.properties.core.poison.block`)."""
    import torch.distributed as dist

    impl, x, w, b, target, kwargs, upstream, start, V, poisoned = args
    device = rank_device(dist.get_backend(group), rank)  # the CPU for gloo, the rank's GPU for nccl
    x = x.to(device).clone().requires_grad_(True)
    w = w.to(device).clone().requires_grad_(True)
    b = b.to(device).clone().requires_grad_(True) if b is not None else None
    target = target.to(device)
    upstream = upstream.to(device) if upstream is not None else None
    kwargs = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    with poison.block(poisoned):
        loss = impl.rank_call(x, w, target, b, group=group, vocab_start=start, vocab_size=V, **kwargs)
        grad = torch.ones_like(loss) if upstream is None else upstream.to(loss.dtype).expand_as(loss)
        loss.backward(grad)
    return {
        "loss": loss.detach(),
        "grad_x": x.grad,
        "grad_weight": w.grad,
        "grad_bias": b.grad if b is not None else None,
    }


def rank_args(impl: Any, case: DistCase, t: Tensors, prop: str = "dist_accuracy") -> list[tuple]:
    """One :func:`rank_run` argument per rank: the full x and targets, the rank's shards, the call's options
    (smoothing as the case states it: the impl applies its own convention), and whether property ``prop`` runs
    it with memory poisoned (:func:`numcheck.properties.core.poison.enabled`, decided here, not in the rank)."""
    kwargs = build(case.problem).options.call_kwargs()
    poisoned = poison.enabled(impl.kind, prop)
    out = []
    for r in range(case.world_size):
        lo, hi = shard_bounds(case.problem.V, case.world_size, r)
        b = t.bias[lo:hi].contiguous() if t.bias is not None else None
        out.append(
            (impl, t.x, t.weight[lo:hi].contiguous(), b, t.target, kwargs, t.upstream, lo, case.problem.V, poisoned)
        )
    return out


@dataclass
class DistRun:
    """A case's per-rank results and their assembly (loss and grad_x from rank 0)."""

    ranks: list[dict[str, Any]]

    def assembled(self) -> dict[str, torch.Tensor | None]:
        """loss and grad_x of rank 0, grad_W and grad_b as the ranks' shards in rank order."""
        r0 = self.ranks[0]
        cat = lambda k: None if any(r[k] is None for r in self.ranks) else torch.cat([r[k] for r in self.ranks])  # noqa: E731
        return {
            "loss": r0["loss"],
            "grad_x": r0["grad_x"],
            "grad_weight": cat("grad_weight"),
            "grad_bias": cat("grad_bias"),
        }


def other_ranks_grad_x(run: DistRun) -> tuple[list[tuple[int, torch.Tensor | None]], str]:
    """The grad_x of each rank after rank 0 that holds other bits than rank 0's (judged on its own), and the note
    for rank 0's grad_x line naming the ranks that hold its bits (judged once with it: one cause, one line)."""
    g0 = run.ranks[0]["grad_x"]
    differ, same = [], []
    for i, r in enumerate(run.ranks[1:], 1):
        g = r["grad_x"]
        if g is not None and g0 is not None and same_bits(g, g0):
            same.append(i)
        else:
            differ.append((i, g))
    if not same:
        return differ, ""
    who = f"rank {same[0]} holds" if len(same) == 1 else f"ranks {', '.join(map(str, same))} hold"
    return differ, f" ({who} the same bits)"


def _noted(line: str, name: str, note: str) -> str:
    """``line`` (a comparison of ``name``) with ``note`` when ``name`` is rank 0's grad_x."""
    return line + note if name == "grad_x" else line


def run_case(
    impl: Any,
    case: DistCase,
    latch: FailureLatch | None = None,
    timeout_s: float | None = None,
    prop: str = "dist_accuracy",
) -> DistRun | None:
    """``case`` on every rank (through ``latch`` when given: ``None`` once it holds a failure), within
    ``timeout_s`` (default :data:`~numcheck.properties.distributed.pool.pool.DEFAULT_TIMEOUT_S`, read at call time),
    its memory poisoned as property ``prop`` judges it (:func:`rank_args`)."""
    timeout_s = timeout_s if timeout_s is not None else DEFAULT_TIMEOUT_S
    t = place_targets(build(case.problem), case)
    args = rank_args(impl, case, t, prop)
    pool = lambda: DistPool.get(case.world_size, case.backend)  # noqa: E731
    if latch is None:
        return DistRun(pool().run(rank_run, args, timeout_s))
    res = latch.run(
        pool,
        rank_run,
        args,
        timeout_s,
        note=f"case: {case!r}\n  reproduce: {repro_command(impl, prop, case)}",
    )
    return DistRun(res) if res is not None else None


def repro_command(impl: Any, prop: str, case: DistCase) -> str:
    """The one line that re-runs ``prop`` on ``case`` for ``impl`` (:func:`main`)."""
    spec = f"{getattr(impl, 'spec_module', 'numcheck.impls.registry')}:{impl.name}"
    loaded = spec_of(impl.name)  # a user's impl: the module:attr spec it was loaded by, if that names it alone
    if loaded and ":" in loaded:
        module, _, attr = loaded.partition(":")
        target: Any = sys.modules.get(module)
        for part in attr.split("."):
            target = getattr(target, part, None)
        spec = loaded if target is impl else f"{module}:{impl.name}"  # else :func:`load_impl` finds it by name
    return (
        f"python -m numcheck.properties.distributed.linear_ce.props --impl {_quote(spec)} --property {prop} "
        f"--case {_quote(repr(case))}"
    )


def _quote(text: str) -> str:
    """``text`` as one shell word: in double quotes where nothing in it is special there (a repr's single quotes
    stay readable), else :func:`shlex.quote`."""
    return f'"{text}"' if not set(text) & set('"$`\\!') else shlex.quote(text)


def fail(impl: Any, prop: str, case: DistCase, *lines: str) -> None:
    """Raise the house-format failure for a distributed case."""
    __tracebackhide__ = True
    body = "\n".join(f"  {line}" for line in lines)
    raise PropertyFailure(
        f"property {prop!r} fails for impl {impl.name!r} (world size {case.world_size}, "
        f"{case.backend})\n  case: {case!r}\n{body}\n  reproduce: {repro_command(impl, prop, case)}"
    )


def _bounds(impl: Any, case: DistCase, out: dict[str, Any]) -> tuple[Any, dict[str, torch.Tensor]]:
    t = oracle_tensors(impl, case)
    ref = run_oracle(case.problem, t, all_ignored=impl.support.all_ignored or "nan")
    dtypes = {k: v.dtype for k, v in out.items() if isinstance(v, torch.Tensor)}
    m = dist_error_model(impl, case.problem, dtypes, case.world_size)
    bounds = linear_ce_bounds(case.problem, t, ref, m)
    for d in output_divergences(impl, case):  # covered outputs: under the model of what the release computes
        known = linear_ce_bounds(case.problem, t, ref, d.model(m))
        bounds.update({k: known[k] for k in d.outputs if k in known})
    return ref, bounds


def _oracle_value(ref: Any, name: str) -> torch.Tensor | None:
    return getattr(ref, name)


def _same_loss_lines(run: DistRun) -> list[str]:
    """The failure line where some rank returns a loss that differs from rank 0's (none when all agree)."""
    losses = [r["loss"] for r in run.ranks]
    differ = [i for i, l in enumerate(losses) if not same_bits(l, losses[0])]
    sums = [float(l.double().sum()) for l in losses]
    return (
        [f"loss: ranks {differ} return a loss differing from rank 0's ({sums}); every rank must return the same loss"]
        if differ
        else []
    )


def judge(impl: Any, case: DistCase, run: DistRun, prop: str = "dist_accuracy") -> float:
    """Every assembled output and every rank's grad_x within bound ((a)) and within judgement (b) against the
    declared path (:mod:`numcheck.properties.distributed.linear_ce.yardstick`), every rank's loss bitwise rank 0's;
    the worst error/bound. Raises the house-format failure otherwise."""
    __tracebackhide__ = True
    same = _same_loss_lines(run)
    if same:
        fail(impl, prop, case, *same)
    out = run.assembled()
    ref, bounds = _bounds(impl, case, out)
    known = {k: d for d in output_divergences(impl, case) for k in d.outputs}
    lines, worst, recorded = [], 0.0, {}
    others, note = other_ranks_grad_x(run)
    pairs = [(n, out[n]) for n in OUTPUT_NAMES] + [(f"grad_x[rank {i}]", g) for i, g in others]
    for name, value in pairs:
        key = name.split("[")[0]
        oracle = _oracle_value(ref, key)
        if oracle is None and value is None:
            continue
        c = compare(name, value, oracle, bounds[key])
        worst = max(worst, c.ratio)
        if name in OUTPUT_NAMES and key not in known:  # the tightness table is the impl's own model's
            recorded[f"{name} (P={case.world_size})"] = c
        if not c.ok:
            why = f" (bound of the known divergence: {known[key].reason})" if key in known else ""
            lines.append(_noted(c.describe(), name, note) + why)
    relative = {}
    if not lines and not (case.problem.all_ignored and case.problem.reduction == "mean"):
        relative = dist_relative(
            impl,
            case.problem,
            case.world_size,
            oracle_tensors(impl, case),
            ref,
            pairs,
            {k: d.reason for k, d in known.items()},
        )
        lines += [
            _noted(f"(b) relative to the declared path: {r.describe()}", n, note)
            for n, r in relative.items()
            if not r.ok
        ]
    # For the seed sweep's tightness table: the assembled outputs, apart per world size (the sharded model's terms
    # grow with P) and from the single-device suite's outputs.
    judged_b = {f"{name} (P={case.world_size})": r for name, r in relative.items()}
    records.note(impl, prop, case.problem, AccuracyResult(problem=case.problem, analytic=recorded, relative=judged_b))
    if lines:
        fail(impl, prop, case, *lines)
    return worst


def measure(impl: Any, case: DistCase) -> tuple[dict[str, Any], list[str]]:
    """``case`` run on its ranks and every output compared with the oracle, failing nothing (for ``numcheck
    report``): the comparisons by output (``grad_x@rank1`` … for the other ranks' grad_x) and the failure lines
    (every output beyond its bound, and ranks returning a loss that differs from rank 0's)."""
    run = run_case(impl, case)
    losses = [r["loss"] for r in run.ranks]
    lines = (
        [
            f"loss: ranks {[i for i, l in enumerate(losses) if not same_bits(l, losses[0])]} return a loss differing "
            f"from rank 0's; every rank must return the same loss"
        ]
        if any(not same_bits(l, losses[0]) for l in losses)
        else []
    )
    out = run.assembled()
    ref, bounds = _bounds(impl, case, out)
    comps: dict[str, Any] = {}
    pairs = [(n, n, out[n]) for n in OUTPUT_NAMES] + [
        (f"grad_x@rank{i}", "grad_x", r["grad_x"]) for i, r in enumerate(run.ranks[1:], 1)
    ]
    others, note = other_ranks_grad_x(run)
    differ = {f"grad_x@rank{i}" for i, _ in others}
    for name, key, value in pairs:
        oracle = _oracle_value(ref, key)
        if oracle is None and value is None:
            continue
        comps[name] = c = compare(name, value, oracle, bounds[key])
        if not c.ok and (name in OUTPUT_NAMES or name in differ):  # every rank's comparison, one line per cause
            lines.append(_noted(c.describe(), name, note))
    return comps, lines


def dist_accuracy(impl: Any, case: DistCase, latch: FailureLatch | None = None) -> dict[str, float]:
    """Every output within the sharded model's bound of the float64 oracle; every rank's loss the same."""
    run = run_case(impl, case, latch)
    if run is None:
        return {}
    return {"error/bound": judge(impl, case, run)}


def invariance_cases(impl: Any, case: DistCase) -> list[DistCase]:
    """The two runs of the world-size relation: ``case`` at the smallest other world size the impl declares that
    it fits (at most V, dividing V where the impl needs it; 1 where declared), then ``case`` itself, both with the
    targets of ``case``'s own layout."""
    V, layout = case.problem.V, case.layout_world_size
    sizes = [
        w for w in impl.dist.world_sizes if w <= V and (impl.dist.uneven_vocab or V % w == 0) and w != case.world_size
    ]
    base = [replace(case, world_size=min(sizes), placement_world_size=layout)] if sizes else []
    return base + [replace(case, placement_world_size=layout)]


def relation_lines(impl: Any, runs: list[tuple[DistCase, DistRun]]) -> list[str]:
    """The world-size relation (:func:`numcheck.properties.distributed.linear_ce.tolerance.relation_bounds`) between
    the first run and the second: every assembled output and every rank's grad_x of the second against the first
    run's, element by element; the failure lines (empty when it holds)."""
    (ca, ra), (cb, rb) = runs
    va, vb = ra.assembled(), rb.assembled()
    t = oracle_tensors(impl, cb)
    ref = run_oracle(cb.problem, t, all_ignored=impl.support.all_ignored or "nan")
    dtypes = {k: v.dtype for k, v in vb.items() if isinstance(v, torch.Tensor)}
    model = None
    for d in output_divergences(impl, cb):  # covered outputs: under the model of what the release computes
        model = d.model
    bounds = relation_bounds(impl, cb.problem, t, ref, dtypes, (ca.world_size, cb.world_size), model)
    lines = []
    others, note = other_ranks_grad_x(rb)
    pairs = [(n, vb[n]) for n in OUTPUT_NAMES] + [(f"grad_x[rank {i}]", g) for i, g in others]
    for name, value in pairs:
        key = name.split("[")[0]
        if value is None or va[key] is None:
            continue
        c = compare(f"{name} (P={cb.world_size} against P={ca.world_size})", value, va[key].double(), bounds[key])
        if not c.ok:
            lines.append(
                f"world-size relation (what P may change under the declaration: "
                f"grad_x reduced in {impl.dist.grad_x_reduce_dtype}): " + _noted(c.describe(), name, note)
            )
    return lines


def dist_world_size_invariance(impl: Any, case: DistCase, latch: FailureLatch | None = None) -> dict[str, float]:
    """The case at the smallest other declared world size and at its own (:func:`invariance_cases`: the same
    targets at both): each within bound ((a) and (b), as :func:`judge`), and the second's outputs within the
    world-size relation's bound of the first's (:func:`relation_lines`)."""
    runs = []
    for c in invariance_cases(impl, case):
        run = run_case(impl, c, latch, prop="dist_world_size_invariance")
        if run is None:
            return {}
        judge(impl, c, run, "dist_world_size_invariance")
        runs.append((c, run))
    if len(runs) == 2:
        lines = relation_lines(impl, runs)
        if lines:
            fail(impl, "dist_world_size_invariance", case, *lines)
    return {}


def dist_determinism(impl: Any, case: DistCase, latch: FailureLatch | None = None) -> dict[str, float]:
    """Two calls at one world size give bitwise equal outputs (only for impls declaring ``deterministic``)."""
    first = run_case(impl, case, latch, prop="dist_determinism")  # outside poisoning (poison.OUTSIDE)
    second = run_case(impl, case, latch, prop="dist_determinism") if first is not None else None
    if second is None:
        return {}
    for n in OUTPUT_NAMES:
        a, b = first.assembled()[n], second.assembled()[n]
        if (a is None) != (b is None) or (a is not None and not same_bits(a, b)):
            fail(impl, "dist_determinism", case, f"{n}: a second call is not bitwise equal to the first")
    return {}


PROPERTIES = {f.__name__: f for f in (dist_accuracy, dist_world_size_invariance, dist_determinism)}


def load_impl(spec: str) -> Any:
    """``module:name``: the distributed impl called ``name`` among ``module``'s ``DIST_IMPLS`` (or the attribute)."""
    mod_name, _, name = spec.partition(":")
    if not name:
        raise ValueError(f"--impl {spec!r}: give module:name (e.g. numcheck.impls.registry:vocab_parallel[nan])")
    # A module:attr spec (a user's decorated function) loads as --impl loads it, so the registry knows the spec and
    # this run's own reproduce line names it again; a name among the module's dist_impls() is looked up below.
    loaded = [e.impl for e in load_spec(spec, "--impl") if isinstance(e, ImplEntry) and e.kind == DIST_KIND]
    if len(loaded) == 1:
        return loaded[0]
    try:
        mod = importlib.import_module(mod_name)
    except ImportError as exc:
        raise ValueError(f"--impl {spec!r}: cannot import {mod_name!r} ({exc})") from exc
    # its dist_impls() by name, then a distributed impl the module binds at top level by name (the repro line of
    # one outside dist_impls() names it so), then the attribute
    bound = [v for v in vars(mod).values() if getattr(v, "kind", None) == DIST_KIND and not isinstance(v, type)]
    for impl in [*getattr(mod, "dist_impls", lambda: [])(), *bound]:
        if impl.name == name:
            return impl
    obj = getattr(mod, name, None)
    if obj is None:
        raise ValueError(f"--impl {spec!r}: {mod_name} has no distributed impl called {name!r}")
    return obj


def main(argv: list[str] | None = None) -> int:
    """``python -m numcheck.properties.distributed.linear_ce.props --impl MODULE:NAME --property P --case 'DistCase(...)'``."""
    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--impl", required=True)
    ap.add_argument("--property", required=True, choices=sorted(PROPERTIES))
    ap.add_argument("--case", required=True)
    a = ap.parse_args(argv)
    try:
        impl = load_impl(a.impl)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    case = eval(a.case, {"DistCase": DistCase, "Problem": Problem, "inf": math.inf, "nan": math.nan})  # noqa: S307
    try:
        with matmul_precision.pinned():
            metrics = PROPERTIES[a.property](impl, case)
    except PropertyFailure as exc:
        print(exc)
        return 1
    print(f"property {a.property!r} holds for impl {impl.name!r} on {case!r}: {metrics}")
    return 0


if __name__ == "__main__":
    # Run the importable module's main, not this __main__ copy: the ranks unpickle rank_run by its module's name,
    # and in a rank ``__main__`` is another program.
    from numcheck.properties.distributed.linear_ce import props as dist_linear_ce

    sys.exit(dist_linear_ce.main())
