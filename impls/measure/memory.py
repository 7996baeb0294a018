"""Device-independent memory accounting: extra peak of a callable, bytes held from forward to backward.

Every tensor op goes through the dispatcher, so a :class:`~torch.utils._python_dispatch.TorchDispatchMode`
sees every allocation an op makes: an output whose storage is neither one of the op's inputs' nor already
known is a new allocation of ``storage.nbytes()`` bytes. A weak reference on the storage (PyTorch keeps one
Python object per live storage) says when it is freed. The tracker keeps the live byte count above the
starting point and its running maximum, the *extra peak*. Storages that existed before the tracker started
(the caller's inputs) are never counted, except for growth by ``resize_`` while tracked.

This works the same on CPU, CUDA and the ``meta`` device (and under ``FakeTensorMode``, whose tensors have
meta storages), so seed-scale shapes (V=131072, H=4096) are measured on ``meta`` without allocating them.
On CUDA, :func:`cuda_cross_check` compares with ``torch.cuda.max_memory_allocated`` (the caching allocator
rounds each block up to 512 bytes, which the tracker applies on CUDA).

What a dispatch mode cannot see: memory an op allocates and frees *inside* one dispatched call — a kernel's
workspace, or the intermediates of a C++ composite kernel (``logsumexp`` materializes exp(x − max) over its
whole input). On CUDA, cuBLAS workspaces are persistent and allocated at the first matmul (warm up before
cross-checking). Measured on one H200 (torch 2.11) at the seed shape (N=8192, H=4096, V=131072, bf16): the
one-chunk steps, Liger (1152 / 3136 MiB), the fp32-accumulating chunked impls, chunked_triton and recompute
agree with ``torch.cuda.max_memory_allocated`` to the MiB; eager's logsumexp adds 2048 MiB and
chunked[lowp_accum] 1024 MiB that only the CUDA column shows. Those numbers are lower bounds here.
Custom ops (``torch.library.custom_op``, e.g. PyTorch's chunked ``linear_cross_entropy``) would be one
opaque op whose outputs are all the tracker sees; the tracker therefore runs the custom op's registered
Python implementation itself, inside the tracking, so its temporaries are counted. Ops it cannot open
(C++ custom ops) are listed in :attr:`Tracker.opaque` and every report prints them.

*Held across backward*: the bytes allocated during forward that are still alive when forward has returned,
minus the returned tensors themselves: what autograd (saved tensors, and tensors a Function stashes on its
``ctx``) keeps until backward. Storages aliasing the inputs (``x.detach()`` saved for backward) are not
new allocations and are not counted. :func:`saved_tensor_bytes` gives the part visible to saved-tensor
hooks (``save_for_backward`` and autograd's own saved tensors) as a cross-check.

Seed arithmetic (``docs/accumulation-and-memory.md``): one chunk of the grad_weight accumulation
at V=131072, H=4096, C=2048 with bf16 operands into an fp32 accumulator, via the steps of
:mod:`impls.builtin.grad_accum`: ``fallback`` allocates mm's bf16 [V,H] (2·V·H bytes) and then its fp32 copy
(4·V·H) while the first is alive: 6·V·H = 3072 MiB; ``fp32_operands`` allocates the fp32 copies of Gᵀ
(4·V·C) and x (4·C·H): 1056 MiB; ``addmm_out_dtype`` writes into the accumulator: 0.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Sequence

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from numcheck.impls.measure import capabilities
from numcheck.reference.numerics.accumulation import accumulator_dtype, path_steps, resolved_path

MiB = 2**20
#: The CUDA caching allocator rounds every block up to a multiple of this many bytes.
CUDA_BLOCK = 512
#: Default shapes of ``numcheck memory``: the seed's full fwd+bwd run (BT=8192, H=4096, V=131072) and chunk.
SEED_SHAPE = (8192, 4096, 131072)
SEED_CHUNK = 2048


def _granule(device: torch.device) -> int:
    return CUDA_BLOCK if device.type == "cuda" else 1


def _rounded(nbytes: int, device: torch.device) -> int:
    g = _granule(device)
    return -(-nbytes // g) * g


def _storages(values: Iterable[Any]) -> list[torch.UntypedStorage]:
    out = []
    for v in values:
        if isinstance(v, torch.Tensor):
            try:
                out.append(v.untyped_storage())
            except (RuntimeError, NotImplementedError):  # sparse / nested / functional wrappers
                continue
    return out


@dataclass
class _Account:
    counted: int  # bytes of this storage counted in `live`
    baseline: int  # bytes it had when first seen if it pre-existed (never counted), else 0
    device: torch.device


class Tracker:
    """Live tensor-storage bytes above the start of tracking, and their peak (see the module docstring).

    Attributes:
        live: bytes allocated under tracking that are still alive (plus growth of pre-existing storages).
        peak: the highest ``live`` seen (the extra peak).
        allocations: number of new storages seen.
        opaque: names of ops whose internal allocations could not be seen.
    """

    def __init__(self) -> None:
        self.live = 0
        self.peak = 0
        self.allocations = 0
        self.opaque: set[str] = set()
        self._acct: dict[int, _Account] = {}
        self._refs: dict[int, weakref.ref] = {}
        self._lock = threading.RLock()  # re-entrant: a weakref callback (_freed) can fire inside _see

    # -- bookkeeping ---------------------------------------------------------------------------------
    def _freed(self, key: int) -> None:
        with self._lock:
            acct = self._acct.pop(key, None)
            self._refs.pop(key, None)
            if acct is not None:
                self.live -= acct.counted

    def _see(self, st: torch.UntypedStorage, *, new: bool) -> None:
        key = id(st)
        with self._lock:
            acct = self._acct.get(key)
            if acct is None:
                dev = st.device
                size = st.nbytes()
                acct = _Account(counted=0, baseline=0 if new else size, device=dev)
                self._acct[key] = acct
                self._refs[key] = weakref.ref(st, lambda _r, k=key: self._freed(k))
                if new:
                    self.allocations += 1
            grown = st.nbytes() - acct.baseline
            want = _rounded(grown, acct.device) if grown > 0 else 0
            if want != acct.counted:
                self.live += want - acct.counted
                acct.counted = want
                if self.live > self.peak:
                    self.peak = self.live

    def before_op(self, inputs: Sequence[Any]) -> None:
        """Before an op runs: storages of its inputs not seen yet pre-existed; note their size now, so that
        growth by the op (an ``out=`` tensor resized) is counted."""
        for st in _storages(inputs):
            self._see(st, new=False)

    def note_op(self, inputs: Sequence[Any], outputs: Sequence[Any]) -> None:
        """After an op: any output storage that is neither an input's nor already known is a new allocation;
        known storages may have grown (``out=`` resize)."""
        ins = _storages(inputs)
        in_ids = {id(s) for s in ins}
        for st in ins:
            self._see(st, new=False)
        for st in _storages(outputs):
            self._see(st, new=id(st) not in in_ids and id(st) not in self._acct)

    def reset_peak(self) -> None:
        """Restart the peak from the current live bytes."""
        with self._lock:
            self.peak = self.live

    def tracked_bytes(self, tensors: Iterable[Any]) -> int:
        """Bytes counted for the (distinct) storages of ``tensors``."""
        seen: dict[int, int] = {}
        with self._lock:
            for st in _storages(tensors):
                acct = self._acct.get(id(st))
                if acct is not None:
                    seen[id(st)] = acct.counted
        return sum(seen.values())


def _custom_op_impl(func: Any, device_types: set[str]) -> Callable[..., Any] | None:
    """The Python implementation of a ``torch.library.custom_op`` for these devices, or ``None``."""
    try:
        from torch._library.custom_ops import _maybe_get_opdef
    except ImportError:
        return None
    try:
        opdef = _maybe_get_opdef(func)
    except Exception:
        return None
    if opdef is None:
        return None
    fns = getattr(opdef, "_backend_fns", {}) or {}
    for dt in device_types:
        if dt in fns:
            return fns[dt]
    return fns.get(None) or getattr(opdef, "_init_fn", None)


class _Mode(TorchDispatchMode):
    """The dispatch mode feeding a :class:`Tracker`."""

    def __init__(self, tracker: Tracker) -> None:
        super().__init__()
        self.tracker = tracker

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: D105
        kwargs = kwargs or {}
        flat_in, _ = tree_flatten((args, kwargs))
        self.tracker.before_op(flat_in)
        ns = getattr(func, "namespace", "aten")
        if ns not in ("aten", "prims"):
            devs = {a.device.type for a in flat_in if isinstance(a, torch.Tensor)}
            impl = _custom_op_impl(func, devs)
            if impl is not None:
                # Run the custom op's own Python body with tracking on, so its temporaries are seen.
                with _Mode(self.tracker):
                    out = impl(*args, **kwargs)
                flat_out, _ = tree_flatten(out)
                self.tracker.note_op(flat_in, flat_out)
                return out
            self.tracker.opaque.add(str(func))
        out = func(*args, **kwargs)
        flat_out, _ = tree_flatten(out)
        self.tracker.note_op(flat_in, flat_out)
        return out


@contextlib.contextmanager
def tracking() -> Iterator[Tracker]:
    """Track allocations made inside the block: ``with tracking() as t: ...; t.peak``."""
    tracker = Tracker()
    with _Mode(tracker):
        yield tracker


@dataclass
class Measurement:
    """What :func:`measure` found: the callable's result, its extra peak and the bytes still alive after it
    (its outputs and anything it left referenced), and ops whose insides were invisible."""

    result: Any
    extra_peak: int
    retained: int
    opaque: frozenset[str] = field(default_factory=frozenset)


def measure(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Measurement:
    """Run ``fn(*args, **kwargs)`` under tracking."""
    with tracking() as t:
        result = fn(*args, **kwargs)
    return Measurement(result=result, extra_peak=t.peak, retained=t.live, opaque=frozenset(t.opaque))


def extra_peak(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> int:
    """The highest live tensor-storage bytes above the start while ``fn(*args, **kwargs)`` runs."""
    return measure(fn, *args, **kwargs).extra_peak


# -- the seed's one-chunk arithmetic ------------------------------------------------------------------------
def meta_capabilities() -> contextlib.AbstractContextManager[None]:
    """Capabilities to assume when measuring on ``meta``: ``addmm_out_dtype`` forced on where this torch can
    trace it on meta (:func:`impls.measure.capabilities.addmm_out_dtype_meta`); otherwise nothing is forced and the
    out_dtype path runs as its fp32-operand fallback there (the tables say so in "runs as")."""
    if capabilities.addmm_out_dtype_meta(torch.bfloat16):
        return capabilities.forced(addmm_out_dtype=True)
    return contextlib.nullcontext()


def _one_chunk_operands(path: str, V: int, H: int, C: int, dtype: torch.dtype, dev: torch.device):
    steps = path_steps(capabilities.addmm_out_dtype)  # the built-ins' steps (impls.builtin.grad_accum.PATHS)
    if path not in steps:
        raise ValueError(f"unknown path {path!r}; known: {sorted(steps)}")
    for name, v in (("V", V), ("H", H), ("C", C)):
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    gw = torch.zeros(V, H, dtype=accumulator_dtype(path, dtype), device=dev)
    G = torch.empty(C, V, dtype=dtype, device=dev)
    x = torch.empty(C, H, dtype=dtype, device=dev)
    return steps[path], gw, G, x


def one_chunk_extra(
    path: str, V: int, H: int, C: int, *, dtype: torch.dtype = torch.bfloat16, device: str | torch.device = "meta"
) -> int:
    """Extra peak of one grad_weight accumulation step ``PATHS[path](gw, G, x)`` with ``G`` ``[C, V]`` and
    ``x`` ``[C, H]`` in ``dtype`` and ``gw`` ``[V, H]`` in the path's accumulator dtype.

    On ``meta`` the ``addmm_out_dtype`` path is measured under :func:`meta_capabilities`: the probe checks the
    values an addmm produced, which ``meta`` does not have, so it answers "no" there; forcing it asks what the
    path allocates on a device where it is supported (CUDA), which depends on shapes and dtypes only (and is
    possible only where torch can trace the op on meta). Elsewhere the probe decides, as in the impls.
    """
    dev = torch.device(device)
    step, gw, G, x = _one_chunk_operands(path, V, H, C, dtype, dev)
    with meta_capabilities() if dev.type == "meta" else contextlib.nullcontext():
        return extra_peak(step, gw, G, x)


def one_chunk_cuda(path: str, V: int, H: int, C: int, *, dtype: torch.dtype = torch.bfloat16) -> tuple[int, int]:
    """``(tracked extra peak, torch.cuda.max_memory_allocated rise)`` of one step on CUDA (after a warm-up)."""
    step, gw, G, x = _one_chunk_operands(path, V, H, C, dtype, torch.device("cuda"))
    return cuda_cross_check(lambda: step(gw, G, x))


@dataclass(frozen=True)
class ChunkRow:
    """One row of the one-chunk table."""

    path: str
    runs_as: str
    extra_bytes: int
    formula: str
    cuda_bytes: int | None = None  # torch.cuda.max_memory_allocated rise, on CUDA


_FORMULAS = {
    "fallback": "V·H·(2+4): bf16 product, then its fp32 copy",
    "fp32_operands": "(V·C + C·H)·4: fp32 copies of Gᵀ and x",
    "addmm_out_dtype": "0: fp32 accumulation straight into gw",
    "lowp_accum": "0: addmm into the bf16 accumulator",
}


def one_chunk_table(
    V: int, H: int, C: int, *, dtype: torch.dtype = torch.bfloat16, device: str | torch.device = "meta"
) -> list[ChunkRow]:
    """Every grad_weight path's one-chunk extra peak (see :func:`one_chunk_extra`)."""
    rows = []
    dev = torch.device(device)
    for path in path_steps(capabilities.addmm_out_dtype):
        with meta_capabilities() if dev.type == "meta" else contextlib.nullcontext():
            runs_as = resolved_path(path, dev, dtype, capabilities.addmm_out_dtype)
        if dev.type == "cuda":
            tracked, cuda = one_chunk_cuda(path, V, H, C, dtype=dtype)
            rows.append(ChunkRow(path, runs_as, tracked, _FORMULAS.get(path, ""), cuda))
        else:
            rows.append(
                ChunkRow(
                    path, runs_as, one_chunk_extra(path, V, H, C, dtype=dtype, device=dev), _FORMULAS.get(path, "")
                )
            )
    return rows


# -- one impl call: held across backward, peaks -----------------------------------------------------------------------
@dataclass(frozen=True)
class Inputs:
    """The tensors of one linear+CE call (leaves needing grad where the impl gets gradients)."""

    x: torch.Tensor
    weight: torch.Tensor
    target: torch.Tensor
    bias: torch.Tensor | None
    kwargs: dict[str, Any]
    upstream: torch.Tensor | None


def _loss_of(out: Any) -> tuple[torch.Tensor, list[torch.Tensor]]:
    if isinstance(out, tuple):
        return out[0], [o for o in out if isinstance(o, torch.Tensor)]
    return out, [out]


@dataclass(frozen=True)
class ImplMemory:
    """Memory of one impl on one problem. Bytes; ``error`` set when it could not run there."""

    name: str
    forward_peak: int = 0
    held: int = 0
    backward_peak: int = 0
    saved_hook_bytes: int = 0
    opaque: frozenset[str] = frozenset()
    error: str = ""
    cuda_peak: int | None = None  # torch.cuda.max_memory_allocated rise over fwd+bwd (CUDA only)

    @property
    def total_peak(self) -> int:
        """Peak over forward and backward above the start (backward starts from what forward held)."""
        return max(self.forward_peak, self.held + self.backward_peak)


def fresh(inp: Inputs) -> Inputs:
    """New leaves over the same storages (no copy), so gradients never accumulate across impls."""

    def leaf(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t.detach().requires_grad_(True)

    return Inputs(leaf(inp.x), leaf(inp.weight), inp.target, leaf(inp.bias), dict(inp.kwargs), inp.upstream)


def call_memory(
    impl: Any, inputs: Inputs, device: str | torch.device, autocast: torch.dtype | None = None
) -> ImplMemory:
    """Forward peak, bytes held across backward and backward peak of one call of ``impl`` on ``inputs`` (used as
    given: leaves of their own, e.g. :func:`fresh` ones over shared storages), under ``torch.autocast`` to
    ``autocast`` when given. Exceptions become ``error`` (an impl that cannot run on ``meta``, e.g. one that reads values with
    ``.item()``, says so instead of a number). The caller picks the capabilities (:func:`meta_capabilities`)."""
    dev = torch.device(device)
    inp = inputs
    amp = contextlib.nullcontext()
    if autocast is not None:
        amp = torch.autocast(dev.type, dtype=autocast)
    hooks = _SavedBytes({id(s) for s in _storages([inp.x, inp.weight, inp.bias, inp.target])})
    cuda = dev.type == "cuda"
    if cuda:
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        cuda_before = torch.cuda.memory_allocated(dev)
    try:
        with tracking() as t:
            with amp, torch.autograd.graph.saved_tensors_hooks(hooks.pack, hooks.unpack):
                out = impl(inp.x, inp.weight, inp.target, inp.bias, **inp.kwargs)
            loss, outs = _loss_of(out)
            fwd_peak = t.peak
            held = t.live - t.tracked_bytes(outs)
            t.reset_peak()
            start = t.live
            grad = inp.upstream if inp.upstream is not None else torch.ones_like(loss)
            loss.backward(grad.to(loss.dtype))
            bwd_peak = t.peak - start
            opaque = frozenset(t.opaque)
            if cuda:
                torch.cuda.synchronize(dev)
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return ImplMemory(impl.name, error=f"{type(exc).__name__}: {first[:160]}")
    cuda_peak = torch.cuda.max_memory_allocated(dev) - cuda_before if cuda else None
    return ImplMemory(
        impl.name,
        forward_peak=fwd_peak,
        held=held,
        backward_peak=bwd_peak,
        saved_hook_bytes=hooks.bytes,
        opaque=opaque,
        cuda_peak=cuda_peak,
    )


class _SavedBytes:
    """Saved-tensor hooks summing the distinct storages autograd saves that are not the inputs'."""

    def __init__(self, input_storages: set[int]) -> None:
        self.inputs = input_storages
        self.seen: dict[int, int] = {}

    @property
    def bytes(self) -> int:
        return sum(self.seen.values())

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        try:
            st = t.untyped_storage()
        except (RuntimeError, NotImplementedError):
            return t
        if id(st) not in self.inputs and id(st) not in self.seen:
            self.seen[id(st)] = _rounded(st.nbytes(), st.device)  # saved tensors stay alive through forward
        return t

    @staticmethod
    def unpack(t: torch.Tensor) -> torch.Tensor:
        return t


# -- CUDA cross-check -----------------------------------------------------------------------------------------
def cuda_cross_check(fn: Callable[[], Any], *, warmup: bool = True) -> tuple[int, int]:
    """``(tracker extra peak, torch.cuda.max_memory_allocated − allocated before)`` for ``fn`` on CUDA.

    ``warmup`` runs ``fn`` once first so persistent allocations (cuBLAS workspaces) exist before measuring.
    Raises RuntimeError when CUDA is absent.
    """
    if not torch.cuda.is_available():
        raise RuntimeError("cuda_cross_check needs a CUDA device")
    if warmup:
        fn()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    with tracking() as t:
        fn()
        torch.cuda.synchronize()
    return t.peak, torch.cuda.max_memory_allocated() - before
