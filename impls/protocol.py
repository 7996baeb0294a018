"""The public protocol for an implementation under test.

numcheck knows two kinds of implementation, and one registry holds both:

* ``"linear_ce"`` — linear + cross-entropy: ``loss = CE(x @ weight.T + bias, target)``.
* ``"quant_linear"`` — an FP8-quantized linear layer (protocol in :mod:`impls.quant_protocol`).

A linear+CE implementation is any object with

``name: str``
    Unique, short, printable (``"chunked[addmm_out_dtype]"``, ``"mymod_flce"``).
``kind: str``
    ``"linear_ce"``.
``support: LinearCESupport``
    What it claims to handle. The suite only checks what is declared, and checks *all* of it:
    a declared option that is silently ignored is a bug the suite will report.
``__call__(x, weight, target, bias=None, **options) -> Tensor | tuple[Tensor, Tensor]``
    ``x`` is ``[N, H]``, ``weight`` ``[V, H]``, ``target`` ``[N]`` (int64), ``bias`` ``[V]`` or ``None``.
    Keyword options (only those the impl declares are ever passed with a non-default value; ``reduction``
    and ``ignore_index`` are always passed):

    - ``reduction``: ``"mean" | "sum" | "none"``
    - ``ignore_index``: int, rows whose target equals it contribute nothing
    - ``label_smoothing``: float in [0, 1]
    - ``class_weights``: ``[V]`` float tensor or ``None`` (``weight=`` of ``F.cross_entropy``)
    - ``softcap``: float > 0 or ``None``; logits become ``softcap * tanh(logits / softcap)``
    - ``z_loss_scale``: float λ ≥ 0; ``λ·lse²`` is added to each non-ignored row's loss

    It returns the loss as a tensor connected to autograd (a scalar for ``mean``/``sum``, ``[N]`` for
    ``none``), or ``(loss, z_loss)`` when ``support.returns_z_loss`` is set. Gradients are taken with
    ``loss.backward(upstream)``; they must reach ``x``, ``weight`` and ``bias``.

The exact semantics (PyTorch's for the CE part, Liger's for z-loss) are those of the float64 oracle
:func:`reference.linear_ce.linear_ce`; ``docs/linear-ce.md`` derives the formulas.

The simplest way to write one is :func:`linear_ce_impl`::

    from numcheck.impls.protocol import linear_ce_impl

    @linear_ce_impl(name="mine", dtypes=("float32",), options=("bias",))
    def mine(x, weight, target, bias=None, *, reduction="mean", ignore_index=-100):
        logits = torch.nn.functional.linear(x, weight, bias).float()
        return torch.nn.functional.cross_entropy(logits, target, reduction=reduction,
                                                 ignore_index=ignore_index)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Literal, Protocol, runtime_checkable

import torch

#: Every optional feature of the linear+CE call, named as the support declaration names them.
LINEAR_CE_OPTIONS: tuple[str, ...] = (
    "bias",  # a bias vector is passed
    "ignore_index",  # some rows carry ignore_index
    "label_smoothing",
    "class_weights",
    "softcap",
    "z_loss",
)
REDUCTIONS: tuple[str, ...] = ("mean", "sum", "none")
FLOAT_DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16, torch.float16)

#: How an impl accumulates grad_weight (and grad_bias) over token chunks. It sets the grad_weight bound.
#: ``"fp32"``: every chunk's product is accumulated in fp32 without intermediate rounding
#: (one matmul over all rows, ``addmm(out_dtype=fp32)``, or fp32 operands);
#: ``"per_chunk_rounding"``: each chunk's product is rounded to the compute dtype, then added in fp32
#: (``gw += mm(G.t(), x).float()``); ``"param_dtype"``: the running sum itself lives in the parameter
#: dtype (Liger's default ``accum_dtype=None``), rounded after every chunk.
GradAccumulation = Literal["fp32", "per_chunk_rounding", "param_dtype"]

#: What ``mean`` returns when every row is ignored: PyTorch's ``nan`` (0/0, zero gradients) or Liger's
#: ``zero`` (loss 0, zero gradients).
AllIgnoredConvention = Literal["nan", "zero"]


def _dtype(d: torch.dtype | str) -> torch.dtype:
    if isinstance(d, torch.dtype):
        return d
    try:
        out = getattr(torch, d)
    except AttributeError:
        raise ValueError(f"unknown dtype name {d!r}; use e.g. 'float32', 'bfloat16', 'float16'") from None
    if not isinstance(out, torch.dtype):
        raise ValueError(f"{d!r} is not a torch dtype")
    return out


@dataclass(frozen=True)
class LinearCESupport:
    """What a linear+CE implementation declares it supports.

    Attributes:
        dtypes: dtypes of ``x`` and ``weight`` it accepts (both the same dtype outside autocast).
        devices: device types it runs on (``"cpu"``, ``"cuda"``).
        options: subset of :data:`LINEAR_CE_OPTIONS`.
        reductions: subset of :data:`REDUCTIONS`.
        all_ignored: the convention for ``mean`` over an all-ignored batch, or ``None`` when an
            all-ignored batch is not supported (the suite then never draws one).
        autocast: autocast dtypes it supports with fp32 parameters (empty: no AMP).
        grad_accumulation: the grad_weight accumulation path, see :data:`GradAccumulation`.
        chunk_rows: rows per chunk for a chunked impl (sets the chunk count of the grad_weight bound);
            ``None`` for one pass over all rows.
        grad_x_accumulation: the same paths for grad_x = G·W when it is summed over vocabulary chunks
            (cut-cross-entropy's kernels add each 128-class block's product into a grad_x of the input dtype):
            ``"fp32"`` (default) when grad_x is one fp32-accumulated matmul over all V classes.
        chunk_cols: vocabulary classes per chunk of that sum (sets its chunk count ⌈V/chunk_cols⌉; ``None``
            with a non-fp32 ``grad_x_accumulation`` assumes one chunk per class, the worst case).
        logits_dtype: ``"compute"`` when logits are materialized in the compute dtype (bf16/fp16) before
            the softmax (every impl that calls a bf16 matmul), ``"float32"`` when they are kept in fp32.
        ce_dtype: ``"float32"`` when the softmax and the gradient w.r.t. the logits are formed in fp32 (from
            possibly low-precision logits), ``"compute"`` when that arithmetic itself runs in bf16/fp16 (as
            ``F.cross_entropy`` on bf16 logits does). ``"compute"`` loses the true-class gradient p_y − 1 of
            confident rows entirely; declaring it widens the bound instead of failing.
        target_logit: ``"logits"`` when the loss's target logit z_y is read from the same logits as the
            log-sum-exp; ``"rounded_products"`` when it is a separate dot product Σ_k x_k·w_{y,k} whose
            products are each rounded to the compute dtype before an fp32 sum (cut-cross-entropy 25.1.1's
            ``indexed_dot``): the loss then carries an extra u_c·Σ_k |x_k·w_{y,k}| per row, which the
            tolerance model adds; gradients are unaffected.
        returns_z_loss: the call returns ``(loss, z_loss)`` instead of ``loss``.
        loss_dtype: the least precise dtype the loss (and z-loss) may come back in. ``"input"`` (default): the
            parameters' dtype, so fp32 under autocast, as autocast's own ``cross_entropy`` gives (it runs in
            fp32); ``"compute"``: the compute dtype, bf16/fp16 under autocast too. A more precise dtype is always
            allowed; a less precise one fails ``loss_dtype``.
        slow: the impl is costly to run here (an interpreter, a large compile per shape): property tests
            give it a quarter of the profile's examples (at least 2), so CI stays inside its budget.
        requires: a callable returning ``None`` when the impl can run here, else the reason it cannot
            (missing package, missing torch feature). Checked before every use.
        option_combinations_excluded: pairs of options that are not supported together.
    """

    dtypes: frozenset[torch.dtype] = frozenset(FLOAT_DTYPES)
    devices: frozenset[str] = frozenset({"cpu", "cuda"})
    options: frozenset[str] = frozenset(LINEAR_CE_OPTIONS)
    reductions: frozenset[str] = frozenset(REDUCTIONS)
    all_ignored: AllIgnoredConvention | None = "nan"
    autocast: frozenset[torch.dtype] = frozenset({torch.bfloat16, torch.float16})
    grad_accumulation: GradAccumulation = "fp32"
    chunk_rows: int | None = None
    grad_x_accumulation: GradAccumulation = "fp32"
    chunk_cols: int | None = None
    logits_dtype: Literal["compute", "float32"] = "compute"
    ce_dtype: Literal["float32", "compute"] = "float32"
    target_logit: Literal["logits", "rounded_products"] = "logits"
    returns_z_loss: bool = False
    loss_dtype: Literal["input", "compute"] = "input"
    slow: bool = False
    requires: Callable[[], str | None] | None = field(default=None, compare=False)
    option_combinations_excluded: frozenset[frozenset[str]] = frozenset()

    def __post_init__(self) -> None:
        for name, allowed, given in (
            ("options", LINEAR_CE_OPTIONS, self.options),
            ("reductions", REDUCTIONS, self.reductions),
        ):
            bad = set(given) - set(allowed)
            if bad:
                raise ValueError(f"LinearCESupport.{name} has unknown entries {sorted(bad)}; allowed: {allowed}")
        bad_dt = {d for d in self.dtypes if d not in FLOAT_DTYPES}
        if bad_dt:
            raise ValueError(f"LinearCESupport.dtypes has unsupported dtypes {bad_dt}; allowed: {FLOAT_DTYPES}")
        if self.all_ignored not in ("nan", "zero", None):
            raise ValueError(f"LinearCESupport.all_ignored must be 'nan', 'zero' or None, got {self.all_ignored!r}")
        for name in ("grad_accumulation", "grad_x_accumulation"):
            if getattr(self, name) not in ("fp32", "per_chunk_rounding", "param_dtype"):
                raise ValueError(
                    f"LinearCESupport.{name} must be 'fp32', 'per_chunk_rounding' or 'param_dtype', "
                    f"got {getattr(self, name)!r}"
                )
        if self.logits_dtype not in ("compute", "float32") or self.ce_dtype not in ("compute", "float32"):
            raise ValueError(
                f"LinearCESupport.logits_dtype / ce_dtype must be 'compute' or 'float32', got {self.logits_dtype!r} / {self.ce_dtype!r}"
            )
        if self.loss_dtype not in ("input", "compute"):
            raise ValueError(f"LinearCESupport.loss_dtype must be 'input' or 'compute', got {self.loss_dtype!r}")
        if self.target_logit not in ("logits", "rounded_products"):
            raise ValueError(f"LinearCESupport.target_logit must be 'logits' or 'rounded_products', got {self.target_logit!r}")
        for name in ("chunk_rows", "chunk_cols"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"LinearCESupport.{name} must be an int >= 1 or None, got {value!r}")

    def unavailable_reason(self) -> str | None:
        """Why the impl cannot run on this machine at all, or ``None``."""
        if self.requires is None:
            return None
        try:
            return self.requires()
        except Exception as exc:  # a broken requirement check is itself a reason
            return f"requirement check raised {type(exc).__name__}: {exc}"

    def refuses(
        self,
        *,
        dtype: torch.dtype,
        device: str,
        options: Iterable[str] = (),
        reduction: str = "mean",
        autocast: torch.dtype | None = None,
        all_ignored: bool = False,
    ) -> str | None:
        """The reason this declaration excludes a case, or ``None`` when the case is declared supported."""
        if dtype not in self.dtypes:
            return f"dtype {dtype} not declared (declares {sorted(map(str, self.dtypes))})"
        if device not in self.devices:
            return f"device {device} not declared (declares {sorted(self.devices)})"
        if reduction not in self.reductions:
            return f"reduction {reduction!r} not declared"
        opts = set(options)
        missing = opts - set(self.options)
        if missing:
            return f"options {sorted(missing)} not declared"
        for combo in self.option_combinations_excluded:
            if combo <= opts:
                return f"option combination {sorted(combo)} excluded"
        if autocast is not None and autocast not in self.autocast:
            return f"autocast {autocast} not declared"
        if all_ignored and self.all_ignored is None:
            return "all-ignored batches not declared"
        return None


@runtime_checkable
class LinearCEImpl(Protocol):
    """Structural type of a linear+CE implementation (see the module docstring)."""

    name: str
    kind: str
    support: LinearCESupport

    def __call__(
        self, x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, bias: torch.Tensor | None = None, **options: Any
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]: ...


@dataclass(frozen=True)
class FunctionImpl:
    """A linear+CE implementation made from a plain function and a support declaration."""

    name: str
    fn: Callable[..., Any] = field(repr=False)
    support: LinearCESupport = field(default_factory=LinearCESupport)
    kind: str = "linear_ce"
    description: str = ""

    def __call__(self, x, weight, target, bias=None, **options):  # noqa: D102 - documented on the protocol
        return self.fn(x, weight, target, bias, **options)

    def with_support(self, **changes: Any) -> "FunctionImpl":
        """A copy with some support fields changed (used to derive variants)."""
        return dataclasses.replace(self, support=dataclasses.replace(self.support, **changes))


def unavailable_fn(label: str, reason: str) -> Callable[..., Any]:
    """The call of an impl that cannot run here: raises RuntimeError naming ``label`` and ``reason`` (its
    ``support.requires`` says the same, so the suite never calls it)."""

    def fn(*args: Any, **kwargs: Any) -> Any:
        """Raise: the impl cannot run here."""
        raise RuntimeError(f"{label} unavailable: {reason}")

    return fn


def make_support(
    *,
    dtypes: Iterable[torch.dtype | str] | None = None,
    devices: Iterable[str] | None = None,
    options: Iterable[str] | None = None,
    reductions: Iterable[str] | None = None,
    autocast: Iterable[torch.dtype | str] | None = None,
    **rest: Any,
) -> LinearCESupport:
    """Build a :class:`LinearCESupport`, accepting dtype names as strings; omitted fields keep defaults."""
    kw: dict[str, Any] = dict(rest)
    if dtypes is not None:
        kw["dtypes"] = frozenset(_dtype(d) for d in dtypes)
    if devices is not None:
        kw["devices"] = frozenset(devices)
    if options is not None:
        kw["options"] = frozenset(options)
    if reductions is not None:
        kw["reductions"] = frozenset(reductions)
    if autocast is not None:
        kw["autocast"] = frozenset(_dtype(d) for d in autocast)
    if "option_combinations_excluded" in kw:
        kw["option_combinations_excluded"] = frozenset(frozenset(c) for c in kw["option_combinations_excluded"])
    return LinearCESupport(**kw)


def linear_ce_impl(*, name: str, description: str = "", **support: Any) -> Callable[[Callable[..., Any]], FunctionImpl]:
    """Decorator turning a function into a registered-ready linear+CE impl.

    ``support`` keywords are those of :func:`make_support` (dtype names may be strings).
    """

    def wrap(fn: Callable[..., Any]) -> FunctionImpl:
        return FunctionImpl(name=name, fn=fn, support=make_support(**support), description=description or (fn.__doc__ or "").strip().split("\n")[0])

    return wrap


def validate_impl(obj: Any, origin: str) -> None:
    """Raise ``TypeError`` naming ``origin`` when ``obj`` does not follow the protocol of its kind."""
    kind = getattr(obj, "kind", None)
    name = getattr(obj, "name", None)
    if not isinstance(name, str) or not name:
        raise TypeError(f"{origin}: an impl needs a non-empty string attribute 'name' (got {name!r})")
    if kind == "linear_ce":
        if not isinstance(getattr(obj, "support", None), LinearCESupport):
            raise TypeError(f"{origin}: linear_ce impl {name!r} needs 'support' of type impls.protocol.LinearCESupport")
        if not callable(obj):
            raise TypeError(f"{origin}: linear_ce impl {name!r} is not callable")
    elif kind == "quant_linear":
        from numcheck.impls.quant_protocol import validate_quant_impl

        validate_quant_impl(obj, origin)
    else:
        raise TypeError(f"{origin}: impl {name!r} has kind {kind!r}; expected 'linear_ce' or 'quant_linear'")
