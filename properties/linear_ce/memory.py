"""Memory of a linear+CE impl on a :class:`properties.linear_ce.cases.Problem`: the problem's tensors, and the
measurement of :mod:`impls.measure.memory` (extra peaks, bytes held from forward to backward) on them.

On ``meta`` (the default of :func:`memory_table`) the inputs are empty tensors of the problem's shapes, so
seed-scale problems (V=131072, H=4096) cost nothing; elsewhere the problem is built with real values.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterable

import torch

from numcheck.impls.measure.memory import ImplMemory, Inputs, call_memory, fresh, meta_capabilities
from numcheck.properties.linear_ce.cases import build, dtype_of


def make_inputs(problem: Any, device: str | torch.device | None = None) -> Inputs:
    """Inputs for ``problem`` (a :class:`properties.linear_ce.cases.Problem`).

    On ``meta`` (the default for ``device="meta"``) the tensors are empty (shapes and dtypes only), so any
    shape is affordable; ``ignored`` and the option values do not change what is allocated. Elsewhere the
    problem is built with :func:`properties.linear_ce.cases.build` (real values) and moved to ``device``.
    """
    dev = torch.device(device if device is not None else problem.device)
    if dev.type == "meta":
        p = problem
        dt = p.param_dtype
        bdt = dtype_of(p.bias_dtype) or dt
        x = torch.empty(p.N, p.H, dtype=dt, device=dev, requires_grad=True)
        w = torch.empty(p.V, p.H, dtype=dt, device=dev, requires_grad=True)
        y = torch.zeros(p.N, dtype=torch.long, device=dev)
        b = torch.empty(p.V, dtype=bdt, device=dev, requires_grad=True) if p.bias else None
        opts = p.options_template()
        kw = opts.call_kwargs()
        if p.class_weights:
            kw["class_weights"] = torch.empty(p.V, dtype=torch.float32, device=dev)
        up = torch.empty(p.N, dtype=torch.float32, device=dev) if p.reduction == "none" else None
        return Inputs(x, w, y, b, kw, up)
    t = build(problem)
    x = t.x.to(dev).detach().requires_grad_(True)
    w = t.weight.to(dev).detach().requires_grad_(True)
    b = t.bias.to(dev).detach().requires_grad_(True) if t.bias is not None else None
    kw = t.options.call_kwargs()
    if "class_weights" in kw:
        kw["class_weights"] = kw["class_weights"].to(dev)
    up = t.upstream.to(dev) if t.upstream is not None else None
    return Inputs(x, w, t.target.to(dev), b, kw, up)


def impl_memory(
    impl: Any, problem: Any, device: str | torch.device | None = None, inputs: Inputs | None = None
) -> ImplMemory:
    """Forward peak, bytes held across backward and backward peak of ``impl`` on ``problem``.

    Under AMP problems the call runs inside ``torch.autocast``. Exceptions become ``error`` (an impl that
    cannot run on ``meta``, e.g. one that reads values with ``.item()``, says so instead of a number).
    On ``meta`` the capabilities of :func:`impls.measure.memory.meta_capabilities` are assumed (as in
    :func:`impls.measure.memory.one_chunk_extra`):
    impls are measured as on a device that supports addmm(out_dtype) (:func:`impls.measure.memory.call_memory`).
    """
    dev = torch.device(device if device is not None else problem.device)
    support = getattr(impl, "support", None)
    reason = support.unavailable_reason() if hasattr(support, "unavailable_reason") else None
    if reason:
        return ImplMemory(impl.name, error=f"unavailable here: {reason}")
    with meta_capabilities() if dev.type == "meta" else contextlib.nullcontext():
        try:
            inp = fresh(inputs) if inputs is not None else make_inputs(problem, dev)
        except Exception as exc:
            return ImplMemory(impl.name, error=f"inputs: {type(exc).__name__}: {exc}")
        return call_memory(impl, inp, dev, problem.compute_dtype if getattr(problem, "autocast", None) else None)


def held_across_backward(impl: Any, problem: Any, device: str | torch.device | None = None) -> int:
    """Bytes ``impl`` keeps from forward to backward on ``problem`` (not aliasing its inputs, not its
    outputs). Raises RuntimeError naming the impl when it cannot run there."""
    m = impl_memory(impl, problem, device)
    if m.error:
        raise RuntimeError(f"impl {impl.name!r} could not be measured on {problem!r}: {m.error}")
    return m.held


def saved_tensor_bytes(impl: Any, problem: Any, device: str | torch.device | None = None) -> int:
    """Bytes of the distinct storages autograd's saved-tensor hooks see during ``impl``'s forward that do not
    alias its inputs (``save_for_backward`` and autograd's own saved tensors; tensors stashed on a ``ctx``
    by other means are invisible here — :func:`held_across_backward` sees those too)."""
    m = impl_memory(impl, problem, device)
    if m.error:
        raise RuntimeError(f"impl {impl.name!r} could not be measured on {problem!r}: {m.error}")
    return m.saved_hook_bytes


def memory_table(impls: Iterable[Any], problem: Any, device: str | torch.device = "meta") -> list[ImplMemory]:
    """:func:`impl_memory` for each impl (in order) on ``problem``, on ``device`` (``meta`` by default); the
    inputs are made once and shared (fresh autograd leaves over the same storages)."""
    inputs = make_inputs(problem, device)
    return [impl_memory(impl, problem, device, inputs) for impl in impls]
