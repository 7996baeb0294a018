"""``cce[...]``: adapters for Apple's Cut Cross-Entropy (PyPI ``cut-cross-entropy``), ``linear_cross_entropy``.

Three variants are registered, each a configuration of ``linear_cross_entropy(e, c, targets, ...)``:

- ``cce[filter_eps=default]``: ``impl="cce"`` with the release's default gradient filtering (what users get).
- ``cce[filter_eps=None]``: ``impl="cce"`` with filtering off, the exact configuration of the same kernels.
- ``cce[impl=torch_compile]``: the package's ``torch.compile`` path (its macOS default, and the only one that
  runs on a CPU).

The adapter reads the installed function's signature with :mod:`inspect`, passes options by keyword, and
declares only the options whose parameters exist. What follows was read from the 25.1.1 wheel's source
(file:line in ``cut_cross_entropy/``); ``tests/test_cce.py`` pins it against the installed release. That wheel
is not Apple's tree at the commit that set ``__version__ = "25.1.1"`` (apple/ml-cross-entropy 76f350d, which
adds ``use_kahan`` and ``impl="cce_exact"``): it is the 24.12.1 code (1f3ebdb) with ``filter_eps="high"`` as the
default, a frozen-classifier path and the classifier cast to the embedding dtype.

- Signature (``linear_cross_entropy.py:29-38``): ``e, c, targets, ignore_index=-100, softcap=None,
  reduction="mean", shift=False, filter_eps="high", impl=CCE``. No bias, label smoothing, class weights or
  z-loss parameter; reductions ``mean``/``sum``/``none``; ``impl`` is ``"cce"`` or ``"torch_compile"``
  (``LinearCrossEntropyImpl``, lines 14-16). Later Apple releases add ``bias`` (declared here when the
  parameter exists), ``return_lse`` and the presets ``cce_exact``/``cce_kahan*``, which are not registered.
- Ignored rows are compacted away before any kernel runs (``utils._build_flat_valids``, line 38): ``mean``
  divides by the number of valid rows (``cce.py:69``), ``none`` scatters into zeros (``utils.py:58``).
- Forward (``impl="cce"``): logits of each 256×128 block are a ``tl.dot`` accumulated in fp32 and never
  rounded (``cce_lse_forward.py:61,71``), the row lse is merged across vocabulary blocks in fp32
  (lines 98, 168): ``logits_dtype="float32"``. The target logit is a separate kernel that multiplies
  ``e * c`` *in the operand dtype* and sums the rounded products in fp32 (``indexed_dot.py:64-66``), so
  ``lse − z_y`` mixes two evaluations of z_y: a V=1 problem, whose exact loss is 0, gets
  |fp32(x·w) − Σ round(x_i·w_i)| ≤ u_c·Σ|x_i·w_i|. The tolerance model has no term for that (Apple's 76f350d
  casts to fp32 before multiplying); the suite reports it.
- Backward: the logit gradient is formed in fp32 (``cce_backward.py:153-179``: ``ce_dtype="float32"``),
  scaled by ``1/n_valid`` and the upstream gradient, then rounded once to the operand dtype (line 181).
  Each 128×128 block's products are rounded to the embedding dtype (line 44) and added under a lock to
  grad_x / grad_weight accumulators *of that dtype* (lines 54, 272, 276; ``tl_utils.py:46``): grad_weight is a
  running sum in the parameter dtype over ⌈n_valid/128⌉ row blocks (``grad_accumulation="param_dtype"``,
  ``chunk_rows`` = the backward's BLOCK_B, ``tl_autotune.py:400``, unless ``CCE_AUTOTUNE`` picks one per
  shape). grad_x is likewise a running sum in the embedding dtype over ⌈V/128⌉ vocabulary blocks (declared
  ``grad_x_accumulation="param_dtype"``, ``chunk_cols`` = BLOCK_V): at V=4097 in fp16 that is 33 roundings,
  which an H200 run showed beyond the single-matmul bound (grad_x 1.04× it).
  Lock order and fp32 atomics make results run-to-run nondeterministic once a reduction spans several blocks:
  the kernel variants declare ``deterministic=False`` (seen on an H200: grad_x of two identical calls differing by
  1.9e-06 at N=129, V=258 in fp16).
- Gradient filtering (``filter_eps``, ``utils._handle_eps`` lines 16-23): ``"high"``/``"auto"`` is
  ``finfo(dtype).eps/32`` (2⁻¹² for bf16, 2⁻¹⁵ for fp16); a backward block whose |softmax − onehot| are *all*
  below it is skipped (``cce_backward.py:168``). That is inexact by design; ``filter_eps=None`` turns it off.
- Dtypes: backward asserts bf16/fp16 embeddings (``cce_backward.py:259``), so fp32 is not declared; the
  kernels take their inputs as given, so autocast (fp32 parameters) reaches that assertion: not declared.
- All-ignored ``mean``: the forward returns NaN (mean of no rows), but backward computes ``1 / lse.numel()``
  with no valid rows (``cce.py:94``) and raises ZeroDivisionError: all-ignored batches are not declared.
- ``impl="torch_compile"`` (``torch_compile.py``): ``e[valids] @ c.T`` in the operand (or autocast) dtype, softcap,
  then ``F.cross_entropy(logits.float())`` under ``torch.compile``: compute-dtype logits, fp32 CE, one matmul
  per gradient (fp32 accumulation), NaN for an all-ignored ``mean`` with zero gradients.

On CPU the Triton kernels can only run under ``TRITON_INTERPRET=1``; with triton 3.9 they fail there
(``tl_utils.py:14,19`` call ``triton.language.extra.libdevice.tanh``/``log1p``, stubs the interpreter does not
implement, so the forward's ``tl_logaddexp`` gets None). Each ``impl="cce"`` variant tries one tiny call under the
interpreter (once per process); when it fails the variant is unavailable with that reason and declares
``devices={"cuda"}``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib.util
import inspect
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from numcheck.impls import interpreter
from numcheck.impls.adapters import releases
from numcheck.impls.adapters.unavailable import unavailable_support
from numcheck.impls.builtin.triton_ce import triton_library_elementary
from numcheck.impls.protocols.linear_ce import FunctionImpl, LinearCESupport, make_support, unavailable_fn

DISTRIBUTION = "cut-cross-entropy"
NOT_INSTALLED = "cut-cross-entropy is not installed"
#: The release whose source the declarations were read from.
SOURCE_READ = "25.1.1"
#: ``filter_eps`` value meaning "pass nothing: the release's default applies".
DEFAULT = "default"
#: Our option name -> the ``linear_cross_entropy`` parameter that carries it.
OPTION_PARAMS: dict[str, str] = {"bias": "bias", "ignore_index": "ignore_index", "softcap": "softcap"}

_PROBE_SHAPE = (4, 8, 16)  # N, H, V of the interpreter probe


@dataclass(frozen=True)
class Variant:
    """One registered configuration: the ``impl=`` value and the ``filter_eps`` passed (:data:`DEFAULT`: none)."""

    name: str
    impl: str
    filter_eps: Any = DEFAULT

    @property
    def kernels(self) -> bool:
        """Whether this variant runs CCE's Triton kernels (every impl but ``torch_compile``)."""
        return self.impl != "torch_compile"


VARIANTS: tuple[Variant, ...] = (
    Variant("cce[filter_eps=default]", "cce", DEFAULT),
    Variant("cce[filter_eps=None]", "cce", None),
    Variant("cce[impl=torch_compile]", "torch_compile", DEFAULT),
)


def interpreted() -> bool:
    """Whether Triton kernels run under the Triton interpreter here (:func:`impls.interpreter.active`)."""
    return interpreter.active()


@dataclass(frozen=True)
class CCEInfo:
    """What the installed release offers: version, ``linear_cross_entropy``'s parameters and defaults, the
    ``impl`` names it knows, the rows and vocabulary classes per backward block (``None`` when autotuned per
    shape) and the function."""

    version: str
    params: tuple[str, ...]
    defaults: dict[str, Any] = field(compare=False)
    impl_names: frozenset[str] = frozenset()
    backward_block_rows: int | None = None
    backward_block_cols: int | None = None
    function: Callable[..., Any] | None = field(default=None, compare=False)
    #: Why the release is unknown, or which other releases are on the path (:mod:`.releases`).
    release_note: str | None = field(default=None, compare=False)

    def has(self, param: str) -> bool:
        """Whether ``linear_cross_entropy`` has parameter ``param``."""
        return param in self.params


def info_from(
    function: Callable[..., Any],
    version: str,
    impl_names: frozenset[str],
    backward_block_rows: int | None,
    backward_block_cols: int | None = None,
) -> CCEInfo:
    """A :class:`CCEInfo` read from ``function``'s signature (also used by the tests with stand-ins)."""
    sig = inspect.signature(function)
    defaults = {n: p.default for n, p in sig.parameters.items() if p.default is not inspect.Parameter.empty}
    return CCEInfo(
        version=version,
        params=tuple(sig.parameters),
        defaults=defaults,
        impl_names=impl_names,
        backward_block_rows=backward_block_rows,
        backward_block_cols=backward_block_cols,
        function=function,
    )


def _backward_blocks() -> tuple[int | None, int | None]:
    """(rows, vocabulary classes) per backward block of the installed release (``None`` when ``CCE_AUTOTUNE``
    tunes them per shape or the private config cannot be read: the tolerance model then assumes one block per
    row, and per class)."""
    try:
        from cut_cross_entropy import tl_autotune

        if getattr(tl_autotune, "_AUTOTUNE", True):
            return None, None
        kw = tl_autotune._cce_backward_best_config().kwargs
        return int(kw["BLOCK_B"]), int(kw["BLOCK_V"])
    except Exception:
        return None, None


@functools.lru_cache(maxsize=None)
def load() -> CCEInfo | str:
    """Import ``cut_cross_entropy.linear_cross_entropy``; the :class:`CCEInfo`, or why it cannot be used."""
    spec = importlib.util.find_spec("cut_cross_entropy")
    if spec is None:
        return NOT_INSTALLED
    # the distribution whose record lists the package imported (a source tree without metadata: unknown)
    got = releases.owning_release(DISTRIBUTION, Path(spec.origin)) if spec.origin else releases.Release(None)
    version = got.version or "unknown"
    try:
        import cut_cross_entropy as cce
    except Exception as exc:
        return f"cut-cross-entropy {version} failed to import: {type(exc).__name__}: {exc}"
    enum = getattr(cce, "LinearCrossEntropyImpl", None)
    names = frozenset(m.name.lower() for m in enum) if enum is not None else frozenset({"cce"})
    info = info_from(cce.linear_cross_entropy, version, names, *_backward_blocks())
    return dataclasses.replace(info, release_note=got.note)


def release_info() -> releases.Release | None:
    """The imported release as :mod:`numcheck.impls.adapters.releases` reads it, or ``None`` when
    cut-cross-entropy is not installed or does not import."""
    info = load()
    if isinstance(info, str):
        return None
    return releases.Release(None if info.version == "unknown" else info.version, info.release_note)


def call_cce(
    info: CCEInfo,
    variant: Variant,
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
) -> torch.Tensor:
    """One ``linear_cross_entropy`` call with the protocol's options mapped onto the installed signature.

    Raises ValueError naming the option when a non-neutral option has no parameter in this release.
    """
    for label, value, neutral in (
        ("label_smoothing", label_smoothing, 0.0),
        ("class_weights", class_weights, None),
        ("z_loss_scale", z_loss_scale, 0.0),
    ):
        if not (value is None or value == neutral):
            raise ValueError(
                f"cut-cross-entropy {info.version} has no {label} parameter; cannot pass {label}={value!r}"
            )
    kw: dict[str, Any] = {}
    for param, value, neutral in (
        ("bias", bias, None),
        ("ignore_index", ignore_index, -100),
        ("softcap", softcap, None),
        ("reduction", reduction, "mean"),
    ):
        if info.has(param):
            kw[param] = value
        elif not (value is None or value == neutral):
            raise ValueError(
                f"cut-cross-entropy {info.version} has no {param!r} parameter; cannot pass {param}={value!r}"
            )
    if variant.filter_eps is not DEFAULT:
        if not info.has("filter_eps"):
            raise ValueError(f"cut-cross-entropy {info.version} has no filter_eps parameter")
        kw["filter_eps"] = variant.filter_eps
    if info.has("impl"):
        kw["impl"] = variant.impl
    elif variant.impl != "cce":
        raise ValueError(f"cut-cross-entropy {info.version} has no impl parameter; cannot select {variant.impl!r}")
    assert info.function is not None
    if variant.kernels:
        return info.function(x, weight, target, **kw)
    with _recompile_headroom():
        return info.function(x, weight, target, **kw)


#: Recompiles allowed per compiled function while the suite calls ``impl="torch_compile"``.
RECOMPILE_LIMIT = 256


def _recompile_headroom() -> Any:
    """A context raising dynamo's per-function recompile limit (8 by default) for one call.

    CCE compiles its torch path with ``fullgraph=True``, where hitting the limit is an error. A training run
    calls it with one dtype, reduction and softcap; the suite draws every dtype, reduction, autocast mode and
    the 0/1 sizes dynamo specializes on, so it needs more than 8 specializations. Numerics are unaffected.
    """
    try:
        import torch._dynamo.config as dynamo_config
    except Exception:  # no dynamo: nothing to raise
        return contextlib.nullcontext()
    name = "recompile_limit" if hasattr(dynamo_config, "recompile_limit") else "cache_size_limit"
    if getattr(dynamo_config, name, RECOMPILE_LIMIT) >= RECOMPILE_LIMIT:
        return contextlib.nullcontext()
    return dynamo_config.patch(**{name: RECOMPILE_LIMIT})


@functools.lru_cache(maxsize=None)
def kernel_failure() -> str | None:
    """Why CCE's Triton kernels cannot run on this machine, or ``None``.

    With CUDA they run compiled. Without it they need ``TRITON_INTERPRET=1``; then one tiny bf16 forward and
    backward is tried (once per process) and any exception is the reason.
    """
    info = load()
    if isinstance(info, str):
        return info
    if torch.cuda.is_available() and not interpreted():
        return None
    if not interpreted():
        return (
            "no CUDA device, and TRITON_INTERPRET is not 1 (CCE's Triton kernels need one or the other; numcheck's "
            "entry points set it through numcheck.impls.interpreter.arrange())"
        )
    N, H, V = _PROBE_SHAPE
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, H, generator=g).to(torch.bfloat16).requires_grad_(True)
    w = torch.randn(V, H, generator=g).to(torch.bfloat16).requires_grad_(True)
    y = torch.randint(0, V, (N,), generator=g)
    try:
        loss = call_cce(info, Variant("probe", "cce", None), x, w, y)
        loss.backward()
    except Exception as exc:
        return f"CCE's Triton kernels fail under TRITON_INTERPRET=1 on CPU ({_root_cause(exc)}); they need a CUDA GPU"
    return None


def _root_cause(exc: BaseException) -> str:
    """``Type: message`` of the innermost exception in ``exc``'s cause chain, with the deepest
    ``cut_cross_entropy`` frame of the whole chain (where CCE's code met the failure)."""
    chain = [exc]
    while chain[-1].__cause__ is not None and len(chain) < 20:
        chain.append(chain[-1].__cause__)
    root = chain[-1]
    first = (str(root).strip().splitlines() or [""])[0][:160]
    where = ""
    for e in chain:
        for frame in traceback.extract_tb(e.__traceback__):
            if "cut_cross_entropy" in frame.filename.replace("\\", "/"):
                tail = frame.filename.replace("\\", "/").split("cut_cross_entropy/")[-1]
                where = f" at cut_cross_entropy/{tail}:{frame.lineno} in {frame.name}"
    return f"{type(root).__name__}: {first}{where}"


def declare(
    info: CCEInfo, variant: Variant, *, kernel_reason: str | None = None, on_cpu: bool | None = None
) -> tuple[LinearCESupport, list[str]]:
    """The support declaration of ``variant`` for ``info``'s release, and notes on what is left out and why.

    ``kernel_reason`` is :func:`kernel_failure`'s answer (passed in so the declaration logic can be checked
    without running a kernel); ``on_cpu`` whether kernels would run on the CPU (default: interpreted here).
    """
    on_cpu = interpreted() if on_cpu is None else on_cpu
    options = {opt for opt, param in OPTION_PARAMS.items() if info.has(param)}
    reductions = {"mean", "sum", "none"} if info.has("reduction") else {"mean"}
    missing = [o for o in ("label_smoothing", "class_weights", "z_loss") if not info.has(o)]
    notes = [f"{', '.join(missing)}: no parameter"] if missing else []
    if "bias" not in options:
        notes.append("bias: no parameter")
    if not variant.kernels:
        support = make_support(
            dtypes=("float32", "bfloat16", "float16"),
            devices=("cpu", "cuda"),
            options=options,
            reductions=reductions,
            autocast=("bfloat16", "float16"),
            all_ignored="nan",
            grad_accumulation="fp32",
            logits_dtype="compute",
            ce_dtype="float32",
            slow=True,  # torch.compile: a compile per dtype, reduction and 0/1-size specialization
        )
        return support, notes
    notes += [
        "float32: backward asserts bf16/fp16 embeddings (cce_backward.py:259)",
        "autocast: the kernels ignore it, so fp32 parameters reach that assertion",
        "all-ignored batches: 'mean' is NaN but its backward divides by zero valid rows (cce.py:94, ZeroDivisionError)",
    ]
    support = make_support(
        dtypes=("bfloat16", "float16"),
        devices=("cpu",) if (on_cpu and kernel_reason is None) else ("cuda",),
        options=options,
        reductions=reductions,
        autocast=(),
        all_ignored=None,
        grad_accumulation="param_dtype",
        chunk_rows=info.backward_block_rows,
        grad_x_accumulation="param_dtype",
        chunk_cols=info.backward_block_cols,
        logits_dtype="float32",
        ce_dtype="float32",
        elementary_error=triton_library_elementary(on_cpu, softmax_divides=False),  # tl.exp, tl.log, libdevice tanh
        # indexed_dot.py:64 rounds each x·w product of the target logit to the operand dtype (the release read;
        # a later release is judged at the strict default until its source is read)
        target_logit="rounded_products" if info.version == SOURCE_READ else "logits",
        deterministic=False,  # lock-ordered block adds (tl_utils.py:42-49) and tl.atomic_add (indexed_dot.py:66)
        requires=(lambda r=kernel_reason: r),
        slow=on_cpu,
    )
    return support, notes


def _describe(info: CCEInfo, variant: Variant, notes: list[str], kernel_reason: str | None = None) -> str:
    """The one-line description ``numcheck list`` prints."""
    desc = f"cut-cross-entropy {info.version} linear_cross_entropy(impl={variant.impl!r}"
    if variant.kernels:
        if variant.filter_eps is DEFAULT:
            default = info.defaults.get("filter_eps", "?")
            desc += (
                f", filter_eps={default!r} = the release default: backward skips logit-gradient blocks whose "
                "|softmax - onehot| are all below finfo(dtype).eps/32, inexact by design"
            )
        else:
            desc += f", filter_eps={variant.filter_eps!r}: no gradient filtering"
    desc += ")"
    if variant.kernels:
        desc += (
            "; target logit summed from products rounded to the operand dtype (indexed_dot.py:64) beside fp32 "
            "lse logits"
            if info.version == SOURCE_READ
            else ""
        )
        if not interpreted():
            desc += "; compiled Triton on CUDA"
        else:
            desc += "; Triton interpreter on CPU" if kernel_reason is None else "; CUDA only (see 'here:')"
    else:
        desc += "; torch.compile"
    if info.version != SOURCE_READ:
        desc += f"; declaration read from the {SOURCE_READ} source"
    if notes:
        desc += "; not declared: " + "; ".join(notes)
    return desc


def build_impl(
    variant: Variant, info: CCEInfo | str | None = None, *, kernel_reason: str | None = None, probe: bool = True
) -> FunctionImpl:
    """The adapter for ``variant``; its declaration comes from ``info`` (default: the installed release, :func:`load`).
    When CCE is unusable, or lacks what the variant needs, the impl still exists and ``support.requires`` says why.
    With ``probe`` (default) ``kernel_reason`` is :func:`kernel_failure`'s answer for kernel variants."""
    info = load() if info is None else info
    reason: str | None = info if isinstance(info, str) else None
    if reason is None:
        assert isinstance(info, CCEInfo)
        if variant.impl not in info.impl_names:
            reason = f"cut-cross-entropy {info.version} has no impl {variant.impl!r} (it has {sorted(info.impl_names)})"
        elif variant.filter_eps is not DEFAULT and not info.has("filter_eps"):
            reason = f"cut-cross-entropy {info.version} has no filter_eps parameter"
    if reason is not None:
        return FunctionImpl(
            name=variant.name,
            fn=unavailable_fn("cce adapter", reason),
            description=f"cut-cross-entropy — unavailable: {reason}",
            support=unavailable_support(reason),
        )
    assert isinstance(info, CCEInfo)
    if variant.kernels and probe:
        kernel_reason = kernel_failure()
    support, notes = declare(info, variant, kernel_reason=kernel_reason if variant.kernels else None)
    fn = functools.partial(call_cce, info, variant)
    return FunctionImpl(
        name=variant.name, fn=fn, support=support, description=_describe(info, variant, notes, kernel_reason)
    )


def cce_impls() -> list[FunctionImpl]:
    """Every :data:`VARIANTS` entry (unavailable, with the reason, when cut-cross-entropy is absent)."""
    return [build_impl(v) for v in VARIANTS]
