"""``liger[accum=None]`` and ``liger[accum=fp32]``: adapters for Liger-Kernel's
``LigerFusedLinearCrossEntropyFunction``, for whatever release is installed.

Releases differ in the positional signature of ``forward`` (``ce_weight`` was inserted after ``bias``;
``return_z_loss``, ``accum_dtype``, ``use_token_scaling``, ``return_token_accuracy``, ... were appended) and in
what ``apply`` returns (a tensor, or a tuple whose first element is the loss). So the adapter reads the
installed function's signature with :mod:`inspect`, passes every argument positionally by name (``apply``
takes no keywords), declares only the options whose parameters exist, and takes ``out[0]`` / ``out[1]`` as
loss / z-loss when a tuple comes back. Every option or reduction whose parameter the release lacks is left out
of the declaration with that reason ("liger-kernel 0.5.8's forward has no ... parameter", :func:`signature_gaps`),
which ``numcheck list`` prints. The version is that of the distribution whose installed files hold the imported
FLCE module (:func:`imported_release`), not the first metadata on the path: a namespace-package wheel (0.2.1)
first on the path is shadowed by a regular package later on it. Known divergences of a release are keyed on that
version (``properties.core.known.Releases``).

Semantics, read from Liger's source (``ops/fused_linear_cross_entropy.py``, ``ops/cross_entropy.py``) and
checked against :func:`reference.linear_ce.linear_ce` by ``tests/test_liger.py``:

- CE part: PyTorch's. With class weights and label smoothing, ``mean`` divides the whole per-row loss
  (smoothing term included) by Σ w_{y_i}, like current ``F.cross_entropy`` and the oracle; the gradient is
  (1−ε)w_y(p − δ) + (ε/V)(S_w p − w), also the oracle's.
- z-loss: λ·lse² per non-ignored row, unweighted, ``mean`` divides it by |M|; it is added to the loss and
  returned separately (``return_z_loss``) reduced like the loss. No gradient flows through the returned
  z-loss (Liger documents it as "only for logging"); the harness back-propagates the loss only.
- ``mean`` over an all-ignored batch returns 0 with zero gradients (convention ``"zero"``).
- grad_weight: ``accum_dtype=None`` accumulates in the parameter dtype across token chunks
  (``"param_dtype"``). ``accum_dtype=float32`` allocates an fp32 accumulator; on CUDA (sm80+, Liger's own
  torch-version gate) it adds with ``addmm(out_dtype=float32)`` (``"fp32"``); everywhere else it takes the
  legacy ``grad_weight += mm(G.t(), x).float()`` (each chunk's product rounded to the operand dtype:
  ``"per_chunk_rounding"``). The result is cast to the parameter dtype at the end of forward.
- Chunking: rows per chunk = min(N, next_pow2(⌈N / ⌈V/(chunk_mem_const·H)⌉⌉)), shape dependent, so it is
  declared as ``chunk_rule`` (:func:`chunk_rows`, with the release's default ``chunk_mem_const``, 1 where it has
  none): the tolerance model counts the chunks the rule gives, and the suite's many-chunk draws take shapes with
  V ≫ H, where the rule gives many.

Where no GPU is present Liger's Triton kernels run on CPU under Triton's interpreter, which numcheck's entry
points ask for (:func:`impls.interpreter.arrange`) before triton is imported; the adapter reads that choice and
sets nothing. Without CUDA and without the interpreter (or with triton imported before it was asked for) both
variants register as unavailable, with the reason. Some kernel paths fail under the interpreter (Liger calls
``.to(tl.float32)`` on Python-float kernel arguments, which only compiled Triton turns into tensors: softcap
and class weights). Each option is tried once on a tiny CPU problem (cached per process); an option that
raises an interpreter error is left out of the declaration and the reason is put in the impl's
description, which ``numcheck list`` prints. Other exceptions are *not* treated as limitations: they are
bugs for the suite to report, so the option stays declared.
"""

from __future__ import annotations

import functools
import importlib.util
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from numcheck.impls import interpreter
from numcheck.impls.adapters import releases
from numcheck.impls.adapters.function_args import forward_parameters, positional_args
from numcheck.impls.adapters.unavailable import unavailable_support
from numcheck.impls.builtin.triton_ce import triton_library_elementary
from numcheck.impls.measure import capabilities
from numcheck.impls.protocols.linear_ce import FunctionImpl, LinearCESupport, make_support, unavailable_fn

DISTRIBUTION = "liger-kernel"
#: Our option name -> the Liger ``forward`` parameter that carries it.
OPTION_PARAMS: dict[str, str] = {
    "bias": "bias",
    "class_weights": "ce_weight",
    "label_smoothing": "label_smoothing",
    "softcap": "softcap",
    "z_loss": "lse_square_scale",
    "ignore_index": "ignore_index",
}
#: The two registered variants: name -> accum_dtype passed to Liger.
VARIANTS: dict[str, torch.dtype | None] = {"liger[accum=None]": None, "liger[accum=fp32]": torch.float32}

_PROBE_SHAPE = (4, 8, 16)  # N, H, V of the tiny problems the interpreter probes run


def interpreted() -> bool:
    """Whether Liger's Triton kernels run under the Triton interpreter (:func:`impls.interpreter.active`)."""
    return interpreter.active()


@dataclass(frozen=True)
class LigerInfo:
    """What the installed release offers: its version (that of the distribution whose files hold the imported
    module, :func:`imported_release`), ``forward``'s parameter names (after ``ctx``) with defaults, the Function
    itself, and a note when other liger-kernel distributions on the path make the version ambiguous."""

    version: str
    params: tuple[str, ...]
    defaults: dict[str, Any] = field(compare=False)
    function: Any = field(compare=False)
    release_note: str | None = field(default=None, compare=False)

    def has(self, param: str) -> bool:
        return param in self.params


@functools.lru_cache(maxsize=None)
def load() -> LigerInfo | str:
    """Import Liger-Kernel's FLCE Function; the :class:`LigerInfo`, or the reason it cannot be used (also when
    there is no CUDA device and Triton's interpreter was not asked for in time)."""
    if importlib.util.find_spec("liger_kernel") is None:
        return "liger-kernel not installed"
    reason = interpreter.unready_reason("Liger's")
    if reason is not None:
        return reason
    try:
        from liger_kernel.ops.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyFunction
    except Exception as exc:
        return f"liger-kernel failed to import its FLCE op: {type(exc).__name__}: {exc}"
    module_file = getattr(sys.modules.get(LigerFusedLinearCrossEntropyFunction.__module__), "__file__", None)
    version, note = imported_release(Path(module_file)) if module_file else ("unknown", "the FLCE module has no file")
    names, defaults = forward_parameters(LigerFusedLinearCrossEntropyFunction)
    return LigerInfo(
        version=version,
        params=names,
        defaults=defaults,
        function=LigerFusedLinearCrossEntropyFunction,
        release_note=note,
    )


def imported_release(module_file: Path) -> tuple[str, str | None]:
    """The version of the liger-kernel distribution whose files hold ``module_file`` (the imported FLCE module),
    and a note naming the other liger-kernel distributions on the path, if any; ``"unknown"`` with the reason
    when none own it, or owners of different releases do (:func:`numcheck.impls.adapters.releases.owning_release`:
    one ``.dist-info`` reached through two ``sys.path`` entries or a symlink is one release).

    Metadata alone can name the wrong release: ``metadata.version`` reads the first ``.dist-info`` on
    ``sys.path``, while the import system prefers a regular package anywhere on the path over an earlier
    namespace portion (liger-kernel 0.2.1's wheel has no ``liger_kernel/__init__.py``), so 0.2.1 first on the
    path reports 0.2.1 while a later 0.8.5 is imported."""
    got = releases.owning_release(DISTRIBUTION, module_file)
    return (got.version or "unknown"), got.note


def release_info() -> releases.Release | None:
    """The imported release as :mod:`numcheck.impls.adapters.releases` reads it, or ``None`` when Liger is not
    usable here (not installed, or its kernels cannot run)."""
    info = load()
    if isinstance(info, str):
        return None
    return releases.Release(None if info.version == "unknown" else info.version, info.release_note)


def release() -> str | None:
    """The imported liger-kernel release's version, or ``None`` when it is unknown or Liger is unusable here."""
    info = load()
    return None if isinstance(info, str) or info.version == "unknown" else info.version


def _positional(info: LigerInfo, given: dict[str, Any]) -> list[Any]:
    """Arguments for ``apply`` in the order of the installed signature; unknown names raise ValueError."""
    unknown = set(given) - set(info.params)
    if unknown:
        raise ValueError(f"liger-kernel {info.version} forward() has no parameter(s) {sorted(unknown)}")
    return positional_args(info.params, info.defaults, given, f"liger-kernel {info.version} forward()")


def call_liger(
    info: LigerInfo,
    accum_dtype: torch.dtype | None,
    x: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    reduction: str = "mean",
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    class_weights: torch.Tensor | None = None,
    softcap: float | None = None,
    z_loss_scale: float = 0.0,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """One Liger FLCE call with the protocol's options mapped onto the installed signature.

    Returns ``(loss, z_loss)`` when the release has ``return_z_loss``, else the loss. Raises ValueError
    naming the option when a non-default option has no parameter in this release.
    """
    given: dict[str, Any] = {"_input": x, "weight": weight, "target": target}
    wanted = {
        "bias": bias,
        "ce_weight": class_weights,
        "ignore_index": ignore_index,
        "lse_square_scale": float(z_loss_scale),
        "label_smoothing": float(label_smoothing),
        "reduction": reduction,
        "softcap": softcap,
    }
    neutral = {
        "bias": None,
        "ce_weight": None,
        "ignore_index": -100,
        "lse_square_scale": 0.0,
        "label_smoothing": 0.0,
        "reduction": "mean",
        "softcap": None,
    }
    for name, value in wanted.items():
        if info.has(name):
            given[name] = value
        elif not (value is None or value == neutral[name]):
            raise ValueError(f"liger-kernel {info.version} has no {name!r} parameter; cannot pass {name}={value!r}")
    if info.has("return_z_loss"):
        given["return_z_loss"] = True
    if info.has("accum_dtype"):
        given["accum_dtype"] = accum_dtype
    elif accum_dtype is not None:
        raise ValueError(f"liger-kernel {info.version} has no accum_dtype parameter")
    out = info.function.apply(*_positional(info, given))
    if isinstance(out, tuple):
        loss = out[0]
        if info.has("return_z_loss"):
            return loss, out[1]
        return loss
    return out


def _is_interpreter_error(exc: BaseException) -> bool:
    """An exception raised by the Triton interpreter itself (not by Liger's Python checks)."""
    try:
        from triton.runtime.errors import InterpreterError
    except Exception:  # older triton: match by name
        return type(exc).__name__ == "InterpreterError"
    return isinstance(exc, InterpreterError)


@functools.lru_cache(maxsize=None)
def interpreter_failure(feature: str) -> str | None:
    """Try ``feature`` (an option, ``"sum"``/``"none"``, a dtype name or ``"plain"``) once on a tiny CPU problem
    under the interpreter; the reason it cannot run there (an interpreter error), or ``None`` when it runs or
    raises anything else (a bug for the suite). ``accum_dtype`` only changes the torch-side grad_weight
    accumulation, never the Triton kernel, so one probe serves both variants."""
    info = load()
    if isinstance(info, str):
        return info
    N, H, V = _PROBE_SHAPE
    g = torch.Generator().manual_seed(0)
    dtype = {"float16": torch.float16, "bfloat16": torch.bfloat16}.get(feature, torch.float32)
    x = torch.randn(N, H, generator=g).to(dtype).requires_grad_(True)
    w = torch.randn(V, H, generator=g).to(dtype).requires_grad_(True)
    y = torch.randint(0, V, (N,), generator=g)
    kw: dict[str, Any] = {}
    b = None
    if feature == "bias":
        b = torch.randn(V, generator=g).requires_grad_(True)
    elif feature == "class_weights":
        kw["class_weights"] = torch.rand(V, generator=g) + 0.5
    elif feature == "label_smoothing":
        kw["label_smoothing"] = 0.1
    elif feature == "softcap":
        kw["softcap"] = 5.0
    elif feature == "z_loss":
        kw["z_loss_scale"] = 1e-3
    elif feature == "ignore_index":
        y[1] = -100
    elif feature in ("sum", "none"):
        kw["reduction"] = feature
    try:
        out = call_liger(info, None, x, w, y, b, **kw)
        loss = out[0] if isinstance(out, tuple) else out
        loss.backward(torch.ones_like(loss))
    except Exception as exc:
        if _is_interpreter_error(exc):
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            why = f"fails under TRITON_INTERPRET=1 ({type(exc).__name__}: {first[:120]})"
            if "outside of the scope of a kernel" in first:
                why += (
                    "; triton was imported before TRITON_INTERPRET=1 was set, so its own language functions "
                    "are not interpreted: set TRITON_INTERPRET=1 in the environment, or call "
                    "numcheck.impls.interpreter.arrange() before triton is imported"
                )
            return why
        return None
    return None


def chunk_rows(N: int, H: int, V: int, mem_const: int = 1) -> int:
    """Liger's rows per chunk of an ``N × H`` input and ``V`` classes (``fused_linear_cross_entropy_forward``):
    ⌈V / (mem_const·H)⌉ chunks' worth of rows, rounded up to a power of two (older releases can exceed N: one
    chunk then)."""
    inc_factor = -(-V // (mem_const * H))
    rows = -(-N // inc_factor)
    return 1 << (rows - 1).bit_length()


def chunk_rule(info: LigerInfo) -> Callable[[int, int, int], int]:
    """The installed release's :func:`chunk_rows`, with its default ``chunk_mem_const`` (1 where it has none)."""
    mem_const = info.defaults.get("chunk_mem_const", 1)
    return functools.partial(chunk_rows, mem_const=mem_const if isinstance(mem_const, int) else 1)


def _grad_accumulation(info: LigerInfo, accum_dtype: torch.dtype | None) -> str:
    """The declared grad_weight path (see the module docstring)."""
    if accum_dtype is None:
        return "param_dtype"
    if interpreted() or not torch.cuda.is_available():
        return "per_chunk_rounding"
    mod = sys.modules.get(info.function.__module__)
    gate = bool(getattr(mod, "_ADDMM_SUPPORTS_OUT_DTYPE", False))
    major = torch.cuda.get_device_capability()[0]
    if gate and major >= 8 and capabilities.addmm_out_dtype("cuda", torch.bfloat16):
        return "fp32"
    return "per_chunk_rounding"


def signature_gaps(info: LigerInfo) -> dict[str, str]:
    """Each feature the installed release's ``forward`` has no parameter for (an option, ``reduction=sum`` /
    ``reduction=none``, the separate z-loss), with the reason, e.g. ``"liger-kernel 0.5.8's forward has no
    softcap parameter"``."""

    def no(param: str) -> str:
        return f"liger-kernel {info.version}'s forward has no {param} parameter"

    gaps = {opt: no(param) for opt, param in OPTION_PARAMS.items() if not info.has(param)}
    if not info.has("reduction"):
        for red in ("sum", "none"):
            gaps[f"reduction={red}"] = no("reduction") + " (it returns the mean)"
    if info.has("lse_square_scale") and not info.has("return_z_loss"):
        gaps["z_loss returned separately"] = no("return_z_loss") + " (the z-loss is only part of the loss)"
    return gaps


def declare(
    info: LigerInfo, accum_dtype: torch.dtype | None, *, probe: bool | None = None
) -> tuple[LinearCESupport, list[str]]:
    """The support declaration for ``info``'s release and ``accum_dtype``, and the notes on what was left out
    (``"feature: reason"``, one per feature).

    Options are those whose parameters exist in the installed ``forward``; each absent one is noted with
    :func:`signature_gaps`' reason. With ``probe`` (default: when running under the Triton interpreter) each
    remaining option, reduction and low-precision dtype is tried once and left out, with the reason, if the
    interpreter cannot run it; a failing plain call makes the whole impl unavailable (``requires``).
    """
    probe = interpreted() if probe is None else probe
    options = {opt for opt, param in OPTION_PARAMS.items() if info.has(param)}
    reductions = {"mean", "sum", "none"} if info.has("reduction") else {"mean"}
    dtypes = {"float32", "bfloat16", "float16"}
    notes: list[str] = [f"{feature}: {why}" for feature, why in signature_gaps(info).items()]
    base_reason: str | None = None
    if probe:
        base_reason = interpreter_failure("plain")
        if base_reason is None:
            for opt in sorted(options):
                why = interpreter_failure(opt)
                if why:
                    options.discard(opt)
                    notes.append(f"{opt}: {why}")
            for red in ("sum", "none"):
                why = interpreter_failure(red) if red in reductions else None
                if why:
                    reductions.discard(red)
                    notes.append(f"reduction={red}: {why}")
            for dt in ("bfloat16", "float16"):
                why = interpreter_failure(dt)
                if why:
                    dtypes.discard(dt)
                    notes.append(f"{dt}: {why}")
    support = make_support(
        dtypes=dtypes,
        devices={"cpu"} if interpreted() else {"cuda"},
        options=options,
        reductions=reductions,
        autocast=("bfloat16", "float16"),
        all_ignored="zero",
        grad_accumulation=_grad_accumulation(info, accum_dtype),
        chunk_rule=chunk_rule(info),
        logits_dtype="compute",
        elementary_error=triton_library_elementary(interpreted(), softmax_divides=True),  # exp2(…)/d, tl.log, tanh
        returns_z_loss=info.has("return_z_loss"),
        requires=(lambda r=base_reason: r),
        slow=interpreted(),  # the Triton interpreter runs the kernel element by element in numpy
    )
    return support, notes


def build_impl(
    name: str, accum_dtype: torch.dtype | None, info: LigerInfo | str | None = None, *, probe: bool | None = None
) -> FunctionImpl:
    """The adapter registered as ``name``; its declaration comes from ``info`` (default: the installed
    release, :func:`load`). When Liger is unusable the impl still exists and ``support.requires`` says why."""
    info = load() if info is None else info
    if isinstance(info, str) or (accum_dtype is not None and not info.has("accum_dtype")):
        reason = (
            info if isinstance(info, str) else f"liger-kernel {info.version}'s forward has no accum_dtype parameter"
        )
        return FunctionImpl(
            name=name,
            fn=unavailable_fn("liger adapter", reason),
            support=unavailable_support(reason),
            description=f"Liger-Kernel FLCE, accum_dtype={accum_dtype} — unavailable: {reason}",
        )
    support, notes = declare(info, accum_dtype, probe=probe)
    where = "Triton interpreter on CPU" if interpreted() else "compiled Triton on CUDA"
    desc = f"Liger-Kernel {info.version} LigerFusedLinearCrossEntropyFunction, accum_dtype={accum_dtype} ({where})"
    if info.release_note:
        desc += f" [release: {info.release_note}]"
    if notes:
        desc += "; not declared here: " + "; ".join(notes)
    fn = functools.partial(call_liger, info, accum_dtype)
    return FunctionImpl(name=name, fn=fn, support=support, description=desc)


def liger_impls() -> list[FunctionImpl]:
    """``liger[accum=None]`` and ``liger[accum=fp32]`` (unavailable, with the reason, when Liger is absent)."""
    return [build_impl(name, acc) for name, acc in VARIANTS.items()]
