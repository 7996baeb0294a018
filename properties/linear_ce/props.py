"""The linear+CE properties, one function each: ``prop(impl, problem) -> metrics`` raising
:class:`properties.core.failures.PropertyFailure` when the property does not hold.

Each returns a dict of metrics (for ``hypothesis.target`` and the reports). :data:`PROPERTIES` maps the name
used in failure messages and ``numcheck repro --property`` to the function, and :func:`applicable` says
whether a property can say anything about an impl on a problem (the tests skip or re-draw otherwise).

"Within bounds" for two runs of an impl a and b of the same quantity means |a − b| ≤ bound_a + bound_b,
each bound being the tolerance model's bound of that run against the (shared) oracle value: the triangle
inequality through the oracle, so no new tolerance is invented for metamorphic checks.

That sum is also what may legitimately differ between the two runs here, term by term (the reasoning of the
distributed world-size relation, :mod:`numcheck.properties.distributed.linear_ce.tolerance`): the two runs of each
relation evaluate other values or in another order (logits shifted through the bias, rows permuted, an option
passed explicitly down another code path, other chunk sizes), so each rounding of one run is made on a value the
other does not hold, and a last-bit difference upstream of a low-precision store (the logits, G, a chunk's
partial) moves that store by a whole unit in one run and not the other. No term of either bound is common to both
runs, so none can be taken out; the relation is sharper only where the declaration keeps everything upstream of
the compared rounding in fp32, which no single-device relation here can rely on (a single-device impl with fp32
logits may still round their gradient to the compute dtype).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import torch

from numcheck.properties.core import records
from numcheck.properties.core.compare import compare, legitimate_overflow
from numcheck.properties.core.failures import NOT_JUDGED, fail
from numcheck.properties.core.failures import context as failure_context
from numcheck.properties.linear_ce import chunks
from numcheck.properties.linear_ce.accuracy import check_accuracy, declared_loss_dtype
from numcheck.properties.linear_ce.cases import Problem, Tensors, build, dtype_of
from numcheck.properties.linear_ce.harness import OUTPUTS, ImplOutputs, autocast_context, run_impl, run_oracle
from numcheck.properties.linear_ce.tolerance import error_model, linear_ce_bounds, range_dtypes, upstream_overflow

Metrics = dict[str, float]


def _dtypes(out: ImplOutputs) -> dict[str, torch.dtype]:
    return {k: v.dtype for k in OUTPUTS if isinstance(v := out.get(k), torch.Tensor)}


def _bounds(impl: Any, p: Problem, t: Tensors, out: ImplOutputs):
    ref = run_oracle(p, t, all_ignored=impl.support.all_ignored or "nan")
    return ref, linear_ce_bounds(p, t, ref, error_model(impl.support, p, _dtypes(out)))


def _reference(
    v: torch.Tensor, oracle: torch.Tensor | None, bound: torch.Tensor, range_dtype: torch.dtype | None
) -> torch.Tensor:
    """``v`` in float64 as the reference side of a two-run comparison, with its oracle's value wherever ``v`` is
    ±inf as a correct rounding (:func:`properties.core.compare.legitimate_overflow`): a run rounded to ±inf says
    nothing about the other run, and |a − oracle| ≤ bound_a ≤ bound_a + bound_b keeps the check sound."""
    r = v.to(torch.float64)
    if oracle is None:
        return r
    ok = legitimate_overflow(v, oracle, bound, range_dtype)
    return torch.where(ok, oracle.to(device=r.device, dtype=torch.float64), r)


def accuracy(impl: Any, p: Problem) -> Metrics:
    """Every output within the analytic bound of the oracle and within k× eager's error (both judgements)."""
    res = check_accuracy(impl, p)
    records.note(impl, "accuracy", p, res)
    if not res.ok:
        fail(impl, "accuracy", p, *res.failure_lines(), ratio=res.worst_ratio)
    return {"error/bound": res.worst_ratio}


def strided_inputs(impl: Any, p: Problem) -> Metrics:
    """Inputs passed as non-contiguous tensors of the same values (a column slice of x, a transposed weight,
    every other element of bias and target; :func:`properties.core.tensors.strided_copy`) give every output within
    the analytic bound of the oracle. Refusing them with an exception is allowed (loud, not wrong); reading
    the wrong elements is not."""
    try:
        res = check_accuracy(impl, p, relative=False, layout="strided")
    except AssertionError:  # PropertyFailure, ProtocolViolation: the suite's own verdicts
        raise
    except Exception:  # noqa: BLE001 - an impl may refuse non-contiguous inputs, loudly
        # A refusal only if the same call with contiguous inputs returns: an impl that raises on those too has
        # refused nothing (what it raises there is the failure).
        run_impl(impl, p)
        return {"refused": 1.0}
    records.note(impl, "strided_inputs", p, res)
    if not res.ok:
        fail(
            impl,
            "strided_inputs",
            p,
            "inputs passed non-contiguous: x a column slice (row stride H+3), weight "
            "transposed storage, bias and target every other element",
            *res.failure_lines(),
            ratio=res.worst_ratio,
        )
    return {"error/bound": res.worst_ratio}


def _frozen(impl: Any, p: Problem, name: str) -> Metrics:
    res = check_accuracy(impl, p, relative=False, frozen=frozenset({name}))
    if not res.ok:
        fail(
            impl,
            f"frozen_{name}",
            p,
            f"with {name} frozen (requires_grad=False)",
            *res.failure_lines(),
            ratio=res.worst_ratio,
        )
    return {"error/bound": res.worst_ratio}


def frozen_weight(impl: Any, p: Problem) -> Metrics:
    """With the weight frozen (``requires_grad=False``: a frozen lm_head, as under LoRA) grad_x and grad_bias are
    within the analytic bound: an impl must follow each input's own ``requires_grad``."""
    return _frozen(impl, p, "weight")


def frozen_x(impl: Any, p: Problem) -> Metrics:
    """With x frozen (features from a frozen backbone, as in linear probing) grad_weight and grad_bias are within
    the analytic bound: an impl must follow each input's own ``requires_grad``."""
    return _frozen(impl, p, "x")


def _two_calls_graph(impl: Any, p: Problem, t: Tensors, parts: list[slice]) -> dict[str, torch.Tensor | None]:
    """The loss and gradients of :func:`two_calls`'s graph: one call of the impl per part of the batch, sharing W
    and bias, the losses added and backpropagated once."""
    x = t.x.detach().clone().requires_grad_(True)
    w = t.weight.detach().clone().requires_grad_(True)
    b = t.bias.detach().clone().requires_grad_(True) if t.bias is not None else None
    kwargs = t.options.call_kwargs()
    with autocast_context(p):
        outs = [impl(x[s], w, t.target[s], b, **kwargs) for s in parts]
    losses = [o[0] if impl.support.returns_z_loss else o for o in outs]
    total = losses[0] + losses[1]
    total.backward(t.upstream.to(total.dtype) if t.upstream is not None else torch.ones_like(total))
    return {
        "loss": total.detach(),
        "grad_x": x.grad,
        "grad_weight": w.grad,
        "grad_bias": b.grad if b is not None else None,
    }


def _two_calls_judged(
    impl: Any, p: Problem, t: Tensors, parts: list[slice], got: dict[str, torch.Tensor | None]
) -> tuple[list[str], float]:
    """``(failure lines, worst error/bound)`` of :func:`two_calls`'s outputs ``got`` against the parts' oracles
    added (grad_x: concatenated), within the sum of their bounds plus one rounding of the accumulated gradients."""
    k = p.N // 2
    dtypes = {n: v.dtype for n, v in got.items() if v is not None}
    halves = []
    for s in parts:
        ph, th = p.replace(N=k), t._replace(x=t.x[s], target=t.target[s])
        ref = run_oracle(ph, th, all_ignored=impl.support.all_ignored or "nan")
        halves.append((ref, linear_ce_bounds(ph, th, ref, error_model(impl.support, ph, dtypes))))
    lines, worst = [], 0.0
    for name in ("loss", "grad_x", "grad_weight", "grad_bias"):
        refs = [getattr(r, name) for r, _ in halves]
        if refs[0] is None:
            continue
        bnds = [bd[name] for _, bd in halves]
        if name == "grad_x":  # each row has one contribution: no accumulation rounding
            o, bound = torch.cat(refs), torch.cat([bd.expand_as(r) for r, bd in zip(refs, bnds)])
        else:  # the two contributions are added once more, in the output's dtype
            u = torch.finfo(dtypes[name]).eps / 2
            o = refs[0] + refs[1]
            bound = bnds[0] + bnds[1] + u * (refs[0].abs() + refs[1].abs() + bnds[0] + bnds[1])
        c = compare(
            name,
            got[name],
            o,
            bound,
            range_dtype=range_dtypes(p, dtypes).get(name),
            overflow_upstream=upstream_overflow(p) if name.startswith("grad_") else "",
        )
        worst = max(worst, c.ratio)
        if not c.ok:
            lines.append(c.describe())
    return lines, worst


def two_calls(impl: Any, p: Problem) -> Metrics:
    """Two calls in one autograd graph (two heads, or micro-batches summed before one backward): the two halves
    of a batch, as two calls sharing W and bias whose losses are added, give what the halves' oracles add up to
    (under ``mean`` each half with its own normalizer), within the sum of their bounds plus one rounding of the
    accumulated gradients. An impl that keeps one call's gradients, or its token count, in state the next call
    reuses fails. Applies to ``sum`` and ``mean`` with an even N ≥ 2 (``mean``: neither half all-ignored unless
    the impl declares that convention)."""
    if p.reduction not in ("sum", "mean") or p.N < 2 or p.N % 2:
        return NOT_JUDGED
    t = build(p)
    k = p.N // 2
    parts = [slice(0, k), slice(k, p.N)]
    valid = t.target != t.options.ignore_index
    if p.reduction == "mean" and impl.support.all_ignored is None and any(not bool(valid[s].any()) for s in parts):
        return NOT_JUDGED
    got = _two_calls_graph(impl, p, t, parts)
    lines, worst = _two_calls_judged(impl, p, t, parts, got)
    if lines:
        counts = ", ".join(str(int(valid[s].sum())) for s in parts)
        fail(
            impl,
            "two_calls",
            p,
            f"two calls of {k} rows each ({counts} not ignored) in one graph (sharing W and "
            f"bias), {p.reduction} losses added",
            *lines,
            ratio=worst,
        )
    return {"error/bound": worst}


#: The AMP dtype a call under the other one is preceded by in :func:`earlier_calls`.
OTHER_AMP = {"bfloat16": "float16", "float16": "bfloat16"}


def class_rotation(t: Tensors) -> Tensors | None:
    """``t`` with its classes relabelled: weight rows, bias and class weights rotated by one class and the
    targets mapped to follow, so the new problem is the old one with its classes renamed (same loss and grad_x,
    grad_weight and grad_bias rotated) while every weight row holds another row's values. What an optimizer
    step that moves every weight does to a cache of the weight, without leaving the problem's regime or any
    condition a draw was made under (a fitting loss scale, a filtering predicate). An ``ignore_index`` that is a
    class id keeps its row (no valid target may become it); ``None`` when fewer than two classes can move."""
    V = t.weight.shape[0]
    dev = t.weight.device
    movable = torch.tensor([c for c in range(V) if c != t.options.ignore_index], dtype=torch.long, device=dev)
    if movable.numel() < 2:
        return None
    perm = torch.arange(V, device=dev)
    perm[movable] = movable.roll(-1)  # new class movable[i] holds old class movable[i + 1]
    inv = torch.argsort(perm)
    valid = t.target != t.options.ignore_index
    target = torch.where(valid, inv[t.target.clamp(0, V - 1).long()].to(t.target.dtype), t.target)
    cw = t.class_weights[perm] if t.class_weights is not None else None
    options = dataclasses.replace(t.options, class_weights=cw) if t.options.class_weights is not None else t.options
    return t._replace(
        weight=t.weight[perm],
        bias=t.bias[perm] if t.bias is not None else None,
        target=target,
        class_weights=cw,
        options=options,
    )


def earlier_calls(impl: Any, p: Problem) -> Metrics:
    """A call's outputs depend on its own inputs, not on earlier calls, with the same x, weight and bias tensors
    across calls as in training. (1) Under AMP, after a call under the other AMP dtype (where declared): a graph
    compiled, or a cast weight cached, under one autocast dtype and reused under the other fails. (2) After the
    weight and bias are changed in place, as an optimizer step changes them (their classes rotated,
    :func:`class_rotation`): a cache keyed on the tensor, its address or its shape, blind to its version, fails.
    Each judged call is within the analytic bound of the oracle for its own inputs (and, for (1), within k×
    eager's error: same tensors as eager's run)."""
    t = build(p)
    x = t.x.detach().clone()
    leaves = {"x": x, "weight": t.weight.detach().clone()}
    if t.bias is not None:
        leaves["bias"] = t.bias.detach().clone()
    worst = 0.0
    other = OTHER_AMP.get(p.autocast or "")
    if other is not None and dtype_of(other) in impl.support.autocast:
        run_impl(impl, p.replace(autocast=other), t, leaves=leaves)
        res = check_accuracy(impl, p, t=t, leaves=leaves)
        if not res.ok:
            fail(
                impl,
                "earlier_calls",
                p,
                f"after a call on the same tensors under autocast {other}",
                *res.failure_lines(),
                ratio=res.worst_ratio,
            )
        worst = res.worst_ratio
    else:
        run_impl(impl, p, t, leaves=leaves)
    t2 = class_rotation(t)
    if t2 is None:  # fewer than two classes a valid target can take: nothing to rotate
        return {"error/bound": worst}
    with torch.no_grad():
        leaves["weight"].copy_(t2.weight)
        if "bias" in leaves:
            leaves["bias"].copy_(t2.bias)
    res = check_accuracy(impl, p, t=t2, leaves=leaves, relative=False)
    if not res.ok:
        fail(
            impl,
            "earlier_calls",
            p,
            "after the weight and bias were changed in place since the previous call "
            "(classes rotated by one, targets following: properties.linear_ce.props.class_rotation)",
            *res.failure_lines(),
            ratio=res.worst_ratio,
        )
    return {"error/bound": max(worst, res.worst_ratio)}


def ignored_rows(impl: Any, p: Problem) -> Metrics:
    """Ignored rows get exactly zero grad_x, and changing x in ignored rows changes no output, bitwise."""
    t = build(p)
    ign = t.target == p.ignore_index
    if not bool(ign.any()):
        return NOT_JUDGED
    out = run_impl(impl, p, t)
    gx = out.grad_x
    if gx is None:
        fail(impl, "ignored_rows", p, "grad_x is missing")
    nz = (gx[ign] != 0).any(dim=1)
    if bool(nz.any()):
        row = int(ign.nonzero().squeeze(1)[nz.nonzero()[0, 0]])
        fail(
            impl,
            "ignored_rows",
            p,
            f"grad_x row {row} (ignored) is not exactly zero: max |value| {float(gx[row].abs().max()):.3g}",
        )
    g = torch.Generator().manual_seed(p.seed + 1)
    x2 = t.x.clone()
    x2[ign] = (torch.randn(int(ign.sum()), p.H, generator=g, dtype=torch.float64) * 2).to(x2.dtype).to(x2.device)
    out2 = run_impl(impl, p, t, x_override=x2)
    for name in OUTPUTS:
        a, b = out.get(name), out2.get(name)
        if a is None or b is None:
            continue
        if name == "grad_x":
            a, b = a[~ign], b[~ign]
        if not torch.equal(torch.nan_to_num(a, nan=1.2345), torch.nan_to_num(b, nan=1.2345)):
            diff = (a.double() - b.double()).abs().nan_to_num(math.inf)
            idx = [int(i) for i in torch.unravel_index(diff.argmax(), diff.shape)] if diff.dim() else []
            fail(
                impl,
                "ignored_rows",
                p,
                f"{name} changed when only ignored rows of x changed: "
                f"max |difference| {float(diff.max()):.3g} at {idx}",
            )
    return {}


def _pair_check(
    impl: Any,
    prop: str,
    p: Problem,
    a: ImplOutputs,
    ba: dict,
    b: ImplOutputs,
    bb: dict,
    names=OUTPUTS,
    transform: Callable[[str, torch.Tensor], torch.Tensor] | None = None,
    ref_b: Any = None,
) -> float:
    """Run ``a`` against run ``b`` (``transform`` maps b's outputs onto a's layout) within ``ba + bb`` per output;
    where ``b`` legitimately overflowed, against ``b``'s oracle ``ref_b`` there (:func:`_reference`)."""
    worst = 0.0
    ranges = range_dtypes(p, _dtypes(a))
    same = transform if transform is not None else (lambda _name, v: v)
    for name in names:
        va, vb = a.get(name), b.get(name)
        if va is None or vb is None or name not in ba or name not in bb:
            continue
        vb, bnd_b = same(name, vb), same(name, bb[name])
        ob = getattr(ref_b, name, None) if ref_b is not None else None
        ref = _reference(vb, same(name, ob) if ob is not None else None, bnd_b, ranges.get(name))
        c = compare(
            name,
            va,
            ref,
            ba[name] + bnd_b,
            range_dtype=ranges.get(name),
            overflow_upstream=upstream_overflow(p) if name.startswith("grad_") else "",
        )
        worst = max(worst, c.ratio)
        if not c.ok:
            fail(impl, prop, p, c.describe() + " (bound = sum of both runs' bounds)", ratio=c.ratio)
    return worst


def permutation(impl: Any, p: Problem) -> Metrics:
    """Permuting the tokens permutes per-row loss and grad_x rows and leaves grad_W, grad_b and a reduced loss
    unchanged, within the two runs' bounds."""
    t = build(p)
    g = torch.Generator().manual_seed(p.seed + 2)
    perm = torch.randperm(p.N, generator=g).to(t.x.device)
    tp = t._replace(
        x=t.x[perm],
        target=t.target[perm],
        upstream=t.upstream[perm] if (t.upstream is not None and t.upstream.dim()) else t.upstream,
    )
    a, b = run_impl(impl, p, t), run_impl(impl, p, tp)
    _, ba = _bounds(impl, p, t, a)
    ref_p, bp = _bounds(impl, p, tp, b)
    inv = torch.argsort(perm)

    def unpermute(name: str, v: torch.Tensor) -> torch.Tensor:
        if name == "grad_x" or (name in ("loss", "z_loss") and v.dim() == 1):
            return v[inv]
        return v

    return {"error/bound": _pair_check(impl, "permutation", p, a, ba, b, bp, transform=unpermute, ref_b=ref_p)}


def shift_invariance(impl: Any, p: Problem) -> Metrics:
    """Adding a constant to every logit through the bias (no softcap, no z-loss) changes nothing, within bounds."""
    if p.softcap is not None or not p.bias or p.z_loss_scale:
        return NOT_JUDGED  # softcap and z-loss (λ·lse²) are not shift invariant
    t = build(p)
    shift = 3.0
    # Both biases exact in the bias dtype, b and b + shift (else the two oracles differ by more than the shift):
    # b + shift rounded, and b replaced by that minus the shift, which is exact wherever b + shift lies within a
    # factor 2 of the shift (Sterbenz: |b| ≤ 1.5, every drawn bias but the largest regimes'); else not judged.
    shifted = (t.bias.double() + shift).to(t.bias.dtype)
    unshifted = (shifted.double() - shift).to(t.bias.dtype)
    if not torch.equal(unshifted.double() + shift, shifted.double()):
        return NOT_JUDGED
    t, ts = t._replace(bias=unshifted), t._replace(bias=shifted)
    a, b = run_impl(impl, p, t), run_impl(impl, p, ts)
    _, ba = _bounds(impl, p, t, a)
    ref_s, bs = _bounds(impl, p, ts, b)
    names = ("loss", "grad_x", "grad_weight", "grad_bias")
    return {"error/bound": _pair_check(impl, "shift_invariance", p, a, ba, b, bs, names=names, ref_b=ref_s)}


def option_identities(impl: Any, p: Problem) -> Metrics:
    """label_smoothing=0, all-ones class weights, z_loss_scale=0 and softcap → ∞, passed explicitly, each give
    the plain result within bounds."""
    if p.label_smoothing or p.class_weights or p.z_loss_scale or p.softcap is not None:
        return NOT_JUDGED
    t = build(p)
    base = run_impl(impl, p, t)
    ref, bb = _bounds(impl, p, t, base)
    V = p.V
    worst = 0.0
    neutral: list[tuple[str, dict]] = []
    opts = impl.support.options
    if "label_smoothing" in opts:
        neutral.append(("label_smoothing", {"label_smoothing": 0.0}))
    if "class_weights" in opts:
        neutral.append(("class_weights", {"class_weights": torch.ones(V, dtype=torch.float32, device=t.x.device)}))
    if "z_loss" in opts:
        neutral.append(("z_loss", {"z_loss_scale": 0.0}))
    if "softcap" in opts and p.compute_dtype != torch.float16:
        # "→ ∞": s·tanh(z/s) − z ≈ z³/(3s²) is far below u|z| at s = 1e8. Not in fp16: the backward multiplies
        # by s, and no s large enough to be the identity keeps that product finite in fp16.
        neutral.append(("softcap", {"softcap": 1e8}))
    for label, extra in neutral:
        impl_call = _with_kwargs(impl, extra)
        out = run_impl(impl_call, p, t)
        worst = max(
            worst,
            _pair_check(
                impl,
                f"option_identities[{label}]",
                p,
                out,
                bb,
                base,
                bb,
                names=("loss", "grad_x", "grad_weight", "grad_bias"),
                ref_b=ref,
            ),
        )
    return {"error/bound": worst}


class _with_kwargs:
    """An impl view that adds fixed keyword arguments to every call."""

    def __init__(self, impl: Any, extra: dict) -> None:
        self._impl, self._extra = impl, extra
        self.name, self.kind, self.support = impl.name, impl.kind, impl.support

    def __call__(self, *args: Any, **kw: Any):
        kw.update(self._extra)
        return self._impl(*args, **kw)


def determinism(impl: Any, p: Problem) -> Metrics:
    """Two runs on the same inputs are bitwise equal, every output."""
    t = build(p)
    a, b = run_impl(impl, p, t), run_impl(impl, p, t)
    for name in OUTPUTS:
        va, vb = a.get(name), b.get(name)
        if (va is None) != (vb is None):
            fail(impl, "determinism", p, f"{name} present in one run only")
        if va is not None and not torch.equal(torch.nan_to_num(va, nan=0.5), torch.nan_to_num(vb, nan=0.5)):
            d = (va.double() - vb.double()).abs().nan_to_num(math.inf)
            fail(
                impl,
                "determinism",
                p,
                f"{name} differs between two identical runs: max |difference| {float(d.max()):.3g}",
            )
    return {}


def chunk_invariance(impl: Any, p: Problem) -> Metrics:
    """What falls in which chunk changes no output beyond the runs' bounds. Where the impl exposes
    ``with_chunk_rows``: chunk sizes 1, 3 and N+1 on the same rows. Otherwise (its chunk size declared,
    ``chunk_rows`` or ``chunk_rule``, or not: :func:`numcheck.properties.linear_ce.chunks.declares_chunks`) the chunks
    are moved instead: the rows rotated by s (:func:`_boundary_shift`, not a multiple of the declared chunk size),
    so every row sits elsewhere relative to the boundaries, and, where ``ignore_index`` is declared, k ignored rows
    prepended, which moves every boundary by k and changes no output (the rows after them compared)."""
    if hasattr(impl, "with_chunk_rows"):
        return _chunk_sizes_agree(impl, p)
    if p.N < 2:
        return NOT_JUDGED
    t = build(p)
    a = run_impl(impl, p, t)
    _, ba = _bounds(impl, p, t, a)
    rows = chunks.rows_per_chunk(impl.support, p.N, p.H, p.V)
    s = _boundary_shift(p, rows)
    perm = (torch.arange(p.N) + s) % p.N
    worst = _moved_rows_agree(impl, p, t, a, ba, perm.to(t.x.device), f"rows rotated by {s}")
    if "ignore_index" in impl.support.options:
        k = 1 + (p.seed // 7) % (rows - 1 if rows and rows > 1 else min(p.N, chunks.RAGGED_ROWS))
        worst = max(worst, _prepended_rows_agree(impl, p, t, a, ba, k))
    return {"error/bound": worst}


def _boundary_shift(p: Problem, rows: int | None) -> int:
    """A rotation (1 ≤ s < N, from the seed) that moves rows across chunk boundaries: not a multiple of ``rows``
    (the declared rows per chunk) where it is at least 2."""
    if rows is not None and 2 <= rows:
        return 1 + p.seed % (min(rows, p.N) - 1)
    return 1 + p.seed % (p.N - 1)


def _moved_rows_agree(
    impl: Any, p: Problem, t: Tensors, a: ImplOutputs, ba: dict, perm: torch.Tensor, how: str
) -> float:
    """``impl`` on ``t``'s rows in the order ``perm`` against run ``a`` (per-row outputs put back)."""
    up = t.upstream
    tp = t._replace(x=t.x[perm], target=t.target[perm], upstream=up[perm] if (up is not None and up.dim()) else up)
    b = run_impl(impl, p, tp)
    ref_p, bp = _bounds(impl, p, tp, b)
    inv = torch.argsort(perm)

    def back(name: str, v: torch.Tensor) -> torch.Tensor:
        return v[inv] if name == "grad_x" or (name in ("loss", "z_loss") and v.dim() == 1) else v

    with failure_context(f"chunk_invariance: {how}"):
        return _pair_check(impl, "chunk_invariance", p, a, ba, b, bp, transform=back, ref_b=ref_p)


def _prepended_rows_agree(impl: Any, p: Problem, t: Tensors, a: ImplOutputs, ba: dict, k: int) -> float:
    """``impl`` on ``t`` with ``k`` ignored rows before its own (copies of its first rows, target ignore_index)
    against run ``a``: the rows after them compared."""
    up = t.upstream
    extra = torch.full((k,), p.ignore_index, dtype=t.target.dtype, device=t.target.device)
    tk = t._replace(
        x=torch.cat([t.x.repeat(-(-k // p.N), 1)[:k], t.x]),
        target=torch.cat([extra, t.target]),
        upstream=torch.cat([up[:1].expand(k), up]) if (up is not None and up.dim()) else up,
    )
    pk = p.replace(N=p.N + k)
    b = run_impl(impl, pk, tk)
    ref_k, bk = _bounds(impl, pk, tk, b)

    def after(name: str, v: torch.Tensor) -> torch.Tensor:
        return v[k:] if name == "grad_x" or (name in ("loss", "z_loss") and v.dim() == 1) else v

    with failure_context(f"chunk_invariance: {k} ignored rows prepended (every chunk boundary moved by {k})"):
        return _pair_check(impl, "chunk_invariance", p, a, ba, b, bk, transform=after, ref_b=ref_k)


def _chunk_sizes_agree(impl: Any, p: Problem) -> Metrics:
    """Chunk sizes 1, 3 and N+1 (``impl.with_chunk_rows``) give results within bounds of each other."""
    t = build(p)
    runs = []
    for c in sorted({1, 3, p.N + 1}):
        variant = impl.with_chunk_rows(c)
        out = run_impl(variant, p, t)
        runs.append((out, *_bounds(variant, p, t, out)))
    worst = 0.0
    for out, ref, b in runs[1:]:
        worst = max(worst, _pair_check(impl, "chunk_invariance", p, runs[0][0], runs[0][2], out, b, ref_b=ref))
    return {"error/bound": worst}


def grad_dtypes(impl: Any, p: Problem) -> Metrics:
    """Gradients come back in the parameters' dtypes (fp32 params under AMP), every one present."""
    t = build(p)
    out = run_impl(impl, p, t)
    want = {"grad_x": t.x.dtype, "grad_weight": t.weight.dtype}
    if t.bias is not None:
        want["grad_bias"] = t.bias.dtype
    for name, dt in want.items():
        v = out.get(name)
        if v is None:
            fail(impl, "grad_dtypes", p, f"{name} is missing (the loss is not connected to it)")
        if v.dtype != dt:
            fail(impl, "grad_dtypes", p, f"{name} has dtype {v.dtype}, the parameter is {dt}")
    return {}


def loss_dtype(impl: Any, p: Problem) -> Metrics:
    """The loss (and z-loss) come back at least as precise as declared (``LinearCESupport.loss_dtype``): the
    parameters' dtype by default, so fp32 under autocast. The accuracy bound takes the returned dtype as the
    last rounding, so a loss handed back in bf16 under AMP would pass it: this is what catches that."""
    declared = getattr(impl.support, "loss_dtype", "input")
    want = declared_loss_dtype(impl.support, p)
    out = run_impl(impl, p)
    for name in ("loss", "z_loss"):
        v = out.get(name)
        if v is None:
            continue
        if not v.dtype.is_floating_point or torch.finfo(v.dtype).eps > torch.finfo(want).eps:
            fail(
                impl,
                "loss_dtype",
                p,
                f"{name} has dtype {v.dtype}, less precise than {want} "
                f"(declared loss_dtype={declared!r}{', under autocast' if p.autocast else ''})",
            )
    return {}


#: One reduction's run in :func:`reduction_consistency`: the impl's outputs, their bounds, the oracle, the tensors.
_ReductionRun = tuple[ImplOutputs, dict, Any, Tensors]


def _reductions_agree(impl: Any, p: Problem, runs: dict[str, _ReductionRun], worst: float) -> float:
    """The ``none`` rows add up to ``sum``, and (no z-loss) ``sum`` = ``mean`` × normalizer: fails the property
    otherwise; ``worst`` raised to the comparisons' worst error/bound."""
    s_out, s_b, s_ref, _ = runs["sum"]
    n_out, n_b, _, _ = runs["none"]
    c = compare("loss", s_out.loss, n_out.loss.double().sum(), s_b["loss"] + n_b["loss"].sum())
    worst = max(worst, c.ratio)
    if not c.ok:
        fail(impl, "reduction_consistency", p, "sum of the 'none' rows vs 'sum': " + c.describe(), ratio=c.ratio)
    if not p.z_loss_scale:
        m_out, m_b, m_ref, _ = runs["mean"]
        D = m_ref.stats.normalizer
        c = compare("loss", m_out.loss.double() * D, s_out.loss.double(), m_b["loss"] * D + s_b["loss"])
        worst = max(worst, c.ratio)
        if not c.ok:
            fail(
                impl,
                "reduction_consistency",
                p,
                f"'mean' × normalizer {D:.6g} vs 'sum': " + c.describe(),
                ratio=c.ratio,
            )
    return worst


def _upstream_scales_linearly(
    impl: Any, p: Problem, base: Problem, runs: dict[str, _ReductionRun], worst: float
) -> float:
    """A scalar upstream gradient (``sum``) scales every gradient, a per-row one (``none``) each row of grad_x, as
    the unscaled runs of ``runs`` give them: fails the property otherwise; ``worst`` raised as above."""
    for red, kind in (("sum", "scalar"), ("none", "per_row")):
        q1 = base.replace(reduction=red)
        qu = q1.replace(upstream=kind)
        tu = build(qu)
        o1, b1, ref1, _ = runs[red]
        ou = run_impl(impl, qu, tu)
        _, bu = _bounds(impl, qu, tu, ou)
        u = tu.upstream.double()
        # Under AMP fp16 the scaled run's gradient GEMM overflows where |u·exact| passes 65504 (and the unscaled one
        # where |exact| does): both are judged against the format the GEMM returns, not the fp32 they come back in.
        ranges = range_dtypes(qu, _dtypes(ou))
        for name in ("grad_x", "grad_weight", "grad_bias") if kind == "scalar" else ("grad_x",):
            v1, vu = o1.get(name), ou.get(name)
            if v1 is None or vu is None:
                continue
            scale = u if kind == "scalar" else u[:, None]
            r1 = _reference(v1, getattr(ref1, name), b1[name], ranges.get(name))
            c = compare(
                name,
                vu,
                r1 * scale,
                bu[name] + b1[name] * scale.abs(),
                range_dtype=ranges.get(name),
                overflow_upstream=upstream_overflow(qu, tu),
            )
            worst = max(worst, c.ratio)
            if not c.ok:
                fail(
                    impl,
                    "reduction_consistency",
                    p,
                    f"{kind} upstream gradient with reduction={red!r} does not scale {name} linearly: " + c.describe(),
                    ratio=c.ratio,
                )
    return worst


def reduction_consistency(impl: Any, p: Problem) -> Metrics:
    """``sum`` = ``mean`` × normalizer (no z-loss), the ``none`` rows add up to ``sum``, a scalar upstream
    gradient scales every gradient linearly, and a per-row one scales grad_x rows — each within the runs' bounds."""
    need = {"mean", "sum", "none"}
    if not need <= set(impl.support.reductions) or p.all_ignored:
        return NOT_JUDGED
    base = p.replace(upstream="one")
    runs: dict[str, _ReductionRun] = {}
    for red in ("mean", "sum", "none"):
        q = base.replace(reduction=red)
        t = build(q)
        out = run_impl(impl, q, t)
        ref, b = _bounds(impl, q, t, out)
        runs[red] = (out, b, ref, t)
    worst = _reductions_agree(impl, p, runs, 0.0)
    worst = _upstream_scales_linearly(impl, p, base, runs, worst)
    return {"error/bound": worst}


def protocol_structure(impl: Any, p: Problem) -> Metrics:
    """The structure of what the impl returns, values aside (the other properties judge those): a loss of the
    reduction's shape with an autograd graph, ``(loss, z_loss)`` exactly when declared, and ``loss.backward``
    filling finite gradients of the right shapes on ``x``, ``weight`` and ``bias``, grad_x not all zero."""
    out = run_impl(impl, p)
    want = (p.N,) if p.reduction == "none" else ()
    if tuple(out.loss.shape) != want:
        fail(impl, "protocol_structure", p, f"loss shape {tuple(out.loss.shape)}, want {want}")
    if not bool(torch.isfinite(out.loss).all()):
        fail(impl, "protocol_structure", p, f"non-finite loss {out.loss}")
    if impl.support.returns_z_loss and (out.z_loss is None or tuple(out.z_loss.shape) != want):
        fail(impl, "protocol_structure", p, f"declares returns_z_loss but z_loss is {out.z_loss!r}")
    shapes = {"grad_x": (p.N, p.H), "grad_weight": (p.V, p.H)}
    if p.bias:
        shapes["grad_bias"] = (p.V,)
    for name, shape in shapes.items():
        g = out.get(name)
        if g is None:
            fail(impl, "protocol_structure", p, f"no {name} after loss.backward(): the gradient does not reach it")
        if tuple(g.shape) != shape:
            fail(impl, "protocol_structure", p, f"{name} shape {tuple(g.shape)}, want {shape}")
        if not bool(torch.isfinite(g).all()):
            fail(impl, "protocol_structure", p, f"non-finite {name}")
    if not bool((out.grad_x != 0).any()):
        fail(impl, "protocol_structure", p, "grad_x is all zero")
    return {}


PROPERTIES: dict[str, Callable[[Any, Problem], Metrics]] = {
    "reduction_consistency": reduction_consistency,
    "accuracy": accuracy,
    "strided_inputs": strided_inputs,
    "frozen_weight": frozen_weight,
    "frozen_x": frozen_x,
    "two_calls": two_calls,
    "earlier_calls": earlier_calls,
    "ignored_rows": ignored_rows,
    "permutation": permutation,
    "shift_invariance": shift_invariance,
    "option_identities": option_identities,
    "determinism": determinism,
    "chunk_invariance": chunk_invariance,
    "grad_dtypes": grad_dtypes,
    "loss_dtype": loss_dtype,
    "protocol_structure": protocol_structure,
}
