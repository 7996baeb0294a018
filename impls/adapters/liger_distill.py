"""``liger_jsd[fused]`` and ``liger_jsd[chunked]``: adapters for Liger-Kernel's fused linear + generalised JSD, as
linear-distill impls, declared from the installed release.

- ``liger_jsd[fused]``: ``liger_kernel.ops.fused_linear_jsd.LigerFusedLinearJSDFunction`` (Triton's JSD kernel;
  under Triton's interpreter on CPU, so ``slow``). Read from its source (0.8.5): logits ``x @ Wᵀ`` cast to fp32
  (on CUDA sm80+ with torch ≥ 2.8 the GEMM returns fp32 itself: ``logits_dtype="compute"`` is declared, which
  bounds both), divided by T on both heads, fp32 log-softmax and divergence (``divergence_dtype="float32"``);
  β = 0 the forward KL(teacher‖student), β = 1 the reverse (``beta_zero="forward_kl"``), no T² factor; the sum
  over rows divided by the rows whose ``shift_labels`` differ from ``ignore_index`` (``"tokens"``); rows in chunks
  of min(N, next_pow2(⌈N / ⌈V/H⌉⌉)) on CPU and pre-Blackwell GPUs (``chunk_rule``); grad_weight summed across
  chunks in the weight's dtype (``accum_dtype=None``: ``"param_dtype"``). β = 0 and 1 are declared where the
  release documents them (0.5 on; 0.4 documents the open interval (0, 1) and computes the mixture formula there,
  0 at the endpoints: :func:`documents_endpoints`).
- ``liger_jsd[chunked]``: ``liger_kernel.chunked_loss.jsd_loss.LigerFusedLinearJSDFunction`` (plain PyTorch,
  ``compiled=False`` here; ``weight_hard_loss=0``, ``weight_soft_loss=1``: the JSD alone), ``chunk_size`` =
  :data:`CHUNK_SIZE` so the suite's rows make several chunks (``torch.chunk`` into max(1, N // chunk_size)
  chunks: ⌈N / max(1, N // chunk_size)⌉ rows each). Its logits, their division by T and the log-softmax and
  divergence run in the input dtype (``divergence_dtype="compute"``); each chunk's gradients come from
  ``torch.func.grad_and_value`` in that dtype and grad_weight sums them in the weight's dtype (``"param_dtype"``).
  Same conventions as the fused function (denominator: non-ignored tokens of the whole batch).

Without liger-kernel, on a release without these losses, or without CUDA and without the interpreter, both are
returned unavailable with the reason (``numcheck list`` prints it).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import math
from typing import Any, Callable

import torch

from numcheck.impls.adapters import liger
from numcheck.impls.adapters.compiled_run import compiled_call
from numcheck.impls.adapters.function_args import forward_parameters, positional_args
from numcheck.impls.adapters.unavailable import reason_of
from numcheck.impls.protocols.linear_distill import DistillFunctionImpl, LinearDistillSupport

#: Rows per chunk the chunked adapter asks for (the release's default, 1024, would make one chunk of the suite's
#: rows; the compiled default is left to the release tool and GPU runs).
CHUNK_SIZE = 8
FUSED, CHUNKED = "liger_jsd[fused]", "liger_jsd[chunked]"
#: The chunked loss as Liger runs it by default (``compiled=True``: ``torch.compile`` of each chunk's step), judged on
#: CUDA only: on a CPU the compile of every drawn shape costs minutes, and CI's CPU judges the eager path above. Each
#: call runs compiled or raises, never silently eager (:mod:`numcheck.impls.adapters.compiled_run`).
CHUNKED_COMPILED = "liger_jsd[chunked_compiled]"


def needs_cuda() -> str | None:
    """Why a compiled variant cannot run here, or ``None`` where CUDA is available."""
    if torch.cuda.is_available():
        return None
    return "compiled=True (Liger's default: torch.compile of each chunk) is judged on CUDA; this machine has none"


@functools.lru_cache(maxsize=None)
def load() -> tuple[Any, Any] | str:
    """``(fused, chunked)``: each Function of the installed release, or why it cannot be used here (a string), or
    one string when Liger itself cannot be used (0.4 has the fused function only: the chunked loss came in 0.5)."""
    if importlib.util.find_spec("liger_kernel") is None:
        return "liger-kernel not installed"
    state = liger.load()
    if isinstance(state, str):
        return state
    return (
        _imported("liger_kernel.ops.fused_linear_jsd", state.version),
        _imported("liger_kernel.chunked_loss.jsd_loss", state.version),
    )


def _imported(module: str, version: str) -> Any:
    """``module``'s ``LigerFusedLinearJSDFunction``, or the reason it cannot be imported (a string)."""
    try:
        return importlib.import_module(module).LigerFusedLinearJSDFunction
    except Exception as exc:  # noqa: BLE001 - any import failure is the reason
        return f"liger-kernel {version} has no {module}.LigerFusedLinearJSDFunction here: {type(exc).__name__}: {exc}"


def fused_chunk_rows(N: int, H: int, V: int) -> int:
    """The fused function's rows per chunk on CPU and pre-Blackwell GPUs: min(N, next_pow2(⌈N / ⌈V/H⌉⌉))."""
    per = math.ceil(N / math.ceil(V / H))
    return max(1, min(N, 1 << (per - 1).bit_length()))


def chunked_chunk_rows(N: int, H: int, V: int) -> int:
    """The chunked loss's rows per chunk: ``torch.chunk`` into max(1, N // CHUNK_SIZE) chunks."""
    return max(1, math.ceil(N / max(1, N // CHUNK_SIZE)))


def _call(fn: Any, what: str, doc: str, labels_as: str, beta_as: str, **fixed: Any) -> Callable[..., torch.Tensor]:
    """``fn.apply`` taking the distill call (its docstring ``doc``): the student's and teacher's inputs and weights by
    Liger's names, the labels as ``labels_as``, β as ``beta_as``, and ``fixed``; the release's positional order read
    from ``fn`` (``what`` names its forward in an error)."""
    params, defaults = forward_parameters(fn)

    def call(sx, sw, tx, tw, target, *, beta, temperature, ignore_index):
        given = dict(
            student_input=sx,
            student_weight=sw,
            teacher_input=tx,
            teacher_weight=tw,
            **{labels_as: target, beta_as: beta},
            ignore_index=ignore_index,
            temperature=temperature,
            **fixed,
        )
        return fn.apply(*positional_args(params, defaults, given, what))

    call.__doc__ = doc
    return call


def _fused_call(fn: Any) -> Callable[..., torch.Tensor]:
    return _call(
        fn,
        "LigerFusedLinearJSDFunction.forward",
        "LigerFusedLinearJSDFunction.apply with the labels given as shift_labels.",
        labels_as="shift_labels",
        beta_as="jsd_beta",
    )


def _chunked_call(fn: Any, compiled: bool = False) -> Callable[..., torch.Tensor]:
    call = _plain_chunked_call(fn, compiled)
    if not compiled:
        return call
    what = f"Liger's compiled chunk function of {fn.__mro__[1].__module__}.{fn.__mro__[1].__name__}.forward"

    def run_compiled(sx, sw, tx, tw, target, *, beta, temperature, ignore_index):
        def run():
            return call(sx, sw, tx, tw, target, beta=beta, temperature=temperature, ignore_index=ignore_index)

        return compiled_call(CHUNKED_COMPILED, what, fn, "distillation_loss_fn", run)

    run_compiled.__doc__ = f"{call.__doc__} Run compiled or raising (numcheck.impls.adapters.compiled_run)."
    return run_compiled


def _plain_chunked_call(fn: Any, compiled: bool) -> Callable[..., torch.Tensor]:
    return _call(
        fn,
        "chunked LigerFusedLinearJSDFunction.forward",
        "The chunked LigerFusedLinearJSDFunction.apply: soft loss only, chunk_size=8, compiled as declared.",
        labels_as="true_labels",
        beta_as="beta",
        student_bias=None,
        teacher_bias=None,
        weight_hard_loss=0.0,
        weight_soft_loss=1.0,
        compiled=compiled,
        chunk_size=CHUNK_SIZE,
    )


def _unavailable(name: str, reason: str) -> DistillFunctionImpl:
    def fn(sx, sw, tx, tw, target, *, beta, temperature, ignore_index):
        """Raise: the impl cannot run here."""
        raise RuntimeError(f"{name} unavailable: {reason}")

    support = LinearDistillSupport(options=(), requires=functools.partial(reason_of, reason))
    return DistillFunctionImpl(name, fn, support, description=f"Liger-Kernel's fused linear JSD: {reason}")


_COMMON = dict(beta_zero="forward_kl", temperature_on="both", temperature_squared=False, denominator="tokens")


def documents_endpoints(fn: Any) -> bool:
    """Whether the release's ``forward`` documents β = 0 and 1 (0.5 on: "in the interval [0, 1]. It implements
    forward/reverse KL"); 0.4 documents "the open interval (0, 1)", and its kernel has no endpoint case."""
    return "open interval (0, 1)" not in (getattr(fn.forward, "__doc__", None) or "")


def _fused_impl(fn: Any, version: str) -> DistillFunctionImpl:
    where = "Triton interpreter on CPU" if liger.interpreted() else "compiled Triton"
    support = LinearDistillSupport(
        grad_accumulation="param_dtype",
        chunk_rule=fused_chunk_rows,
        logits_dtype="compute",
        divergence_dtype="float32",
        beta_endpoints=documents_endpoints(fn),
        slow=liger.interpreted(),
        **_COMMON,
    )
    desc = f"liger-kernel {version} LigerFusedLinearJSDFunction (accum_dtype=None; {where})"
    return DistillFunctionImpl(FUSED, _fused_call(fn), support, description=desc)


def _chunked_impl(fn: Any, version: str, compiled: bool = False) -> DistillFunctionImpl:
    support = LinearDistillSupport(
        devices=("cuda",) if compiled else ("cpu", "cuda"),
        requires=needs_cuda if compiled else None,
        grad_accumulation="param_dtype",
        chunk_rule=chunked_chunk_rows,
        logits_dtype="compute",
        divergence_dtype="compute",
        beta_endpoints=documents_endpoints(fn),
        **_COMMON,
    )
    desc = (
        f"liger-kernel {version} chunked LigerFusedLinearJSDLoss's Function (compiled={compiled}, "
        f"chunk_size={CHUNK_SIZE}, weight_hard_loss=0, weight_soft_loss=1)"
    )
    name = CHUNKED_COMPILED if compiled else CHUNKED
    return DistillFunctionImpl(name, _chunked_call(fn, compiled), support, description=desc)


def liger_distill_impls() -> list[DistillFunctionImpl]:
    """The two adapters (each unavailable with the reason where it cannot run)."""
    state = load()
    if isinstance(state, str):
        return [_unavailable(FUSED, state), _unavailable(CHUNKED, state), _unavailable(CHUNKED_COMPILED, state)]
    version = liger.release() or "unknown"
    fused, chunked = state
    return [
        _unavailable(FUSED, fused) if isinstance(fused, str) else _fused_impl(fused, version),
        _unavailable(CHUNKED, chunked) if isinstance(chunked, str) else _chunked_impl(chunked, version),
        _unavailable(CHUNKED_COMPILED, chunked)
        if isinstance(chunked, str)
        else _chunked_impl(chunked, version, compiled=True),
    ]
