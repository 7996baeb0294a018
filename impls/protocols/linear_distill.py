"""The protocol of a fused linear + distillation loss (generalised Jensen–Shannon between a student's and a frozen
teacher's linear+softmax heads).

A linear-distill implementation is any object with

``name: str``, ``kind: str`` = ``"linear-distill"``, ``support: LinearDistillSupport``
    As for linear+CE (:mod:`impls.protocols.linear_ce`): the suite checks everything declared, and only that.
``__call__(student_x, student_weight, teacher_x, teacher_weight, target, *, beta, temperature, ignore_index)``
    ``student_x`` ``[N, H]`` (``requires_grad``), ``student_weight`` ``[V, H]`` (``requires_grad``), ``teacher_x``
    ``[N, H]``, ``teacher_weight`` ``[V, H]`` (frozen: any gradient the impl gives them is a failure), ``target``
    ``[N]`` int64 (only compared with ``ignore_index``: rows equal to it contribute nothing), ``beta`` a float in
    [0, 1], ``temperature`` a float > 0. Returns the scalar loss connected to autograd; ``loss.backward(u)``
    fills the student's ``.grad``.

The conventions libraries differ on — which KL β = 0 gives, which logits the temperature divides, whether the loss
is multiplied by T², what the sum over rows is divided by — are declaration fields, and the float64 oracle
:func:`reference.linear_distill.linear_distill` (its docstring states the semantics) computes what the impl says
it computes, so an impl that computes another convention fails.

Write one with :func:`linear_distill_impl`::

    from numcheck import linear_distill_impl

    @linear_distill_impl(name="mine", dtypes=("float32",), beta_zero="forward_kl", denominator="tokens")
    def mine(student_x, student_weight, teacher_x, teacher_weight, target, *, beta, temperature, ignore_index):
        ...
"""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Literal

import torch

from numcheck.impls.protocols import declaration as decl
from numcheck.impls.protocols.declaration import invalid
from numcheck.impls.protocols.kind import Kind
from numcheck.reference.linear_distill import BETA_ZERO, DENOMINATORS, TEMPERATURE_ON, DistillConvention

#: The ``kind`` of a linear + distillation impl (the only place that spells it).
LINEAR_DISTILL_KIND = "linear-distill"
#: The optional features of the call: ``ignore_index`` (some rows carry it), ``temperature`` (T ≠ 1 is passed).
DISTILL_OPTIONS: tuple[str, ...] = ("ignore_index", "temperature")
#: The keywords every call passes after the five tensors.
DISTILL_CALL_KEYWORDS: tuple[str, ...] = ("beta", "temperature", "ignore_index")
FLOAT_DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16, torch.float16)
#: The grad_weight accumulation paths over row chunks (as linear+CE's ``GradAccumulation``): ``fp32``,
#: ``per_chunk_rounding`` (each chunk's product rounded to the compute dtype, then added in fp32), ``param_dtype``
#: (the running sum itself in the weight's dtype).
GRAD_ACCUMULATIONS: tuple[str, ...] = ("fp32", "per_chunk_rounding", "param_dtype")
OPTION_ALIASES: dict[str, str] = {"t": "temperature", "temp": "temperature", "shift_labels": "ignore_index"}
DENOMINATOR_ALIASES: dict[str, str] = {"mean": "tokens", "batchmean": "rows", "none": "sum"}

_CHOICES: tuple[tuple[str, tuple[Any, ...], dict[str, str]], ...] = (
    ("beta_zero", BETA_ZERO, {"forward": "forward_kl", "reverse": "reverse_kl", "kl": "forward_kl"}),
    ("temperature_on", TEMPERATURE_ON, {"all": "both", "student_only": "student", "teacher_only": "teacher"}),
    ("denominator", DENOMINATORS, DENOMINATOR_ALIASES),
    ("grad_accumulation", GRAD_ACCUMULATIONS, {"float32": "fp32"}),
    ("logits_dtype", ("compute", "float32"), {"fp32": "float32"}),
    ("divergence_dtype", ("float32", "compute"), {"fp32": "float32"}),
)


@dataclass(frozen=True)
class LinearDistillSupport:
    """What a linear-distill implementation declares.

    Attributes:
        dtypes: dtypes of the four float tensors (all the same dtype).
        devices: device types it runs on.
        options: subset of :data:`DISTILL_OPTIONS`.
        beta_endpoints: whether β = 0 and β = 1 are accepted (the two KLs); ``False`` for an impl defined on the
            open interval (0, 1) only (the suite then draws β inside it).
        beta_zero: which KL β = 0 gives, ``"forward_kl"`` (KL(teacher‖student), and A = teacher in the mixture;
            Liger-Kernel's and TRL's) or ``"reverse_kl"`` (:class:`~reference.linear_distill.DistillConvention`).
        temperature_on: the logits the temperature divides: ``"both"``, ``"student"`` or ``"teacher"``.
        temperature_squared: whether the loss is multiplied by T² (Hinton et al.'s gradient-scale correction).
        denominator: ``"tokens"`` (non-ignored rows), ``"rows"`` (all N rows: batchmean) or ``"sum"``.
        grad_accumulation: the grad_weight path over row chunks (:data:`GRAD_ACCUMULATIONS`).
        chunk_rows: rows per chunk of a chunked impl (``None``: one pass, or ``chunk_rule``).
        chunk_rule: ``(N, H, V) -> rows per chunk`` for an impl whose chunk follows from the shapes.
        logits_dtype: ``"compute"`` when the logits are materialised in the compute dtype before the softmax,
            ``"float32"`` when they are kept in fp32.
        divergence_dtype: ``"float32"`` when the log-softmax, the divergence and its gradient are evaluated in
            fp32, ``"compute"`` when in the compute dtype (``F.log_softmax`` on bf16 logits): the evaluation's
            roundings are then at the compute dtype's unit roundoff.
        deterministic: repeated calls give bitwise equal outputs.
        slow: costly here (an interpreter): a quarter of the examples.
        requires: ``None`` or a callable returning why it cannot run here (``None`` when it can).
    """

    dtypes: frozenset[torch.dtype] = frozenset(FLOAT_DTYPES)
    devices: frozenset[str] = frozenset({"cpu", "cuda"})
    options: frozenset[str] = frozenset(DISTILL_OPTIONS)
    beta_endpoints: bool = True
    beta_zero: Literal["forward_kl", "reverse_kl"] = "forward_kl"
    temperature_on: Literal["both", "student", "teacher"] = "both"
    temperature_squared: bool = False
    denominator: Literal["tokens", "rows", "sum"] = "tokens"
    grad_accumulation: Literal["fp32", "per_chunk_rounding", "param_dtype"] = "fp32"
    chunk_rows: int | None = None
    chunk_rule: Callable[[int, int, int], int] | None = field(default=None, compare=False)
    logits_dtype: Literal["compute", "float32"] = "compute"
    divergence_dtype: Literal["float32", "compute"] = "float32"
    deterministic: bool = True
    slow: bool = False
    requires: Callable[[], str | None] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        own = "LinearDistillSupport"
        set_ = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731 - a frozen dataclass
        set_("dtypes", decl.dtypes(own, "dtypes", self.dtypes, FLOAT_DTYPES, empty_ok=False))
        set_("devices", decl.device_types(own, self.devices))
        opts = decl.known_names(own, "options", self.options, DISTILL_OPTIONS, empty_ok=True, aliases=OPTION_ALIASES)
        set_("options", opts)
        for name, allowed, aliases in _CHOICES:
            value = getattr(self, name)
            if value not in allowed:
                hint = decl.did_you_mean(value, allowed, aliases) if isinstance(value, str) else ""
                raise invalid(
                    f"{own}.{name}={value!r} is not one of {allowed}",
                    f"See LinearDistillSupport's docstring for what each value means.{hint}",
                )
        decl.chunk_size(own, "chunk_rows", self.chunk_rows)
        decl.chunk_rule(own, self.chunk_rule, self.chunk_rows)
        decl.bools(own, self, ("beta_endpoints", "temperature_squared", "deterministic", "slow"))
        decl.requirement(own, self.requires)

    @property
    def convention(self) -> DistillConvention:
        """The declared conventions, as the oracle takes them."""
        return DistillConvention(self.beta_zero, self.temperature_on, self.temperature_squared, self.denominator)

    def rows_per_chunk(self, N: int, H: int, V: int) -> int:
        """Rows per chunk at this shape (N: one pass)."""
        if self.chunk_rule is not None:
            return max(1, int(self.chunk_rule(N, H, V)))
        return self.chunk_rows or max(N, 1)

    def unavailable_reason(self) -> str | None:
        """Why the impl cannot run on this machine at all, or ``None``."""
        return decl.requirement_unmet(self.requires)

    def refuses(self, *, dtype: torch.dtype, device: str, options: Iterable[str] = (), beta: float = 0.5) -> str | None:
        """Why this declaration excludes a case, or ``None``."""
        if dtype not in self.dtypes:
            return f"dtype {dtype} not declared (declares {sorted(map(str, self.dtypes))})"
        if device not in self.devices:
            return f"device {device} not declared (declares {sorted(self.devices)})"
        missing = set(options) - set(self.options)
        if missing:
            return f"options {sorted(missing)} not declared"
        if beta in (0.0, 1.0) and not self.beta_endpoints:
            return f"beta={beta} is an endpoint, which the declaration excludes (beta_endpoints=False)"
        return None

    def describe(self) -> str:
        """Its declaration, a few lines (``numcheck list``)."""
        chunk = self.chunk_rows or (getattr(self.chunk_rule, "__name__", "rule") if self.chunk_rule else "one pass")
        return (
            f"dtypes: {','.join(sorted(str(d).removeprefix('torch.') for d in self.dtypes))}; devices: "
            f"{','.join(sorted(self.devices))}; options: {','.join(sorted(self.options)) or '-'}\n"
            f"beta=0 gives {self.beta_zero}; endpoints {'accepted' if self.beta_endpoints else 'excluded'}; "
            f"temperature on {self.temperature_on}{' times T^2' if self.temperature_squared else ''}; "
            f"denominator: {self.denominator}\n"
            f"logits: {self.logits_dtype}; divergence: {self.divergence_dtype}; grad_weight accumulation: {self.grad_accumulation}; chunk rows: {chunk}"
        )


def call_refusal(fn: Callable[..., Any]) -> str | None:
    """Why ``fn`` cannot take ``fn(sx, sw, tx, tw, target, *, beta=..., temperature=..., ignore_index=...)``."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    try:
        sig.bind(None, None, None, None, None, **dict.fromkeys(DISTILL_CALL_KEYWORDS))
    except TypeError as exc:
        label = f"{getattr(fn, '__name__', type(fn).__name__)}{sig}"
        return (
            f"{label} cannot be called as fn(student_x, student_weight, teacher_x, teacher_weight, target, "
            f"beta=..., temperature=..., ignore_index=...): {exc}. Every call passes those three keywords."
        )
    return None


@dataclass(frozen=True)
class DistillFunctionImpl:
    """A linear-distill impl made from a plain function and a :class:`LinearDistillSupport`."""

    name: str
    fn: Callable[..., Any] = field(repr=False)
    support: LinearDistillSupport = field(default_factory=LinearDistillSupport)
    description: str = ""
    kind: str = LINEAR_DISTILL_KIND

    def __post_init__(self) -> None:
        decl.built(
            self,
            LinearDistillSupport,
            "Build it with LinearDistillSupport(...).",
            "mymod_distill",
            [("function", self.fn, call_refusal)],
            "the calls the suite makes",
        )

    def __call__(self, student_x, student_weight, teacher_x, teacher_weight, target, **kwargs):  # noqa: D102
        return self.fn(student_x, student_weight, teacher_x, teacher_weight, target, **kwargs)

    def with_support(self, **changes: Any) -> "DistillFunctionImpl":
        """A copy with some support fields changed."""
        return dataclasses.replace(self, support=dataclasses.replace(self.support, **changes))


#: The keywords :func:`linear_distill_impl` takes for the declaration.
DISTILL_SUPPORT_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(LinearDistillSupport))


def linear_distill_impl(
    *, name: str, description: str = "", **support: Any
) -> Callable[[Callable[..., Any]], DistillFunctionImpl]:
    """Decorator turning a function into a linear-distill impl (``--impl mymod:impl``).

    ``support`` keywords are the fields of :class:`LinearDistillSupport`. A bad keyword or value, or a function
    that cannot take the call, raises :class:`~numcheck.errors.InvalidDeclaration` naming the decorator's line.

    >>> @linear_distill_impl(name="doc_distill", dtypes=("float32",), denominator="tokens")
    ... def doc_distill(sx, sw, tx, tw, target, *, beta, temperature, ignore_index):
    ...     ...
    >>> doc_distill.kind, doc_distill.support.beta_zero
    ('linear-distill', 'forward_kl')
    """
    site, owner = decl.opening("linear_distill_impl", name, support, DISTILL_SUPPORT_FIELDS, "mymod_distill")
    declared = LinearDistillSupport(**support)

    def wrap(fn: Callable[..., Any]) -> DistillFunctionImpl:
        doc = decl.decorated(
            owner,
            site,
            fn,
            "Put the decorator on the function computing the loss.",
            [(getattr(fn, "__name__", "the function"), fn, call_refusal)],
            "the calls the suite makes",
            description,
        )
        return DistillFunctionImpl(name=name, fn=fn, support=declared, description=doc)

    return wrap


def validate_linear_distill_impl(obj: Any, origin: str) -> None:
    """Raise ``TypeError`` naming ``origin`` when ``obj`` breaks this protocol."""
    support = getattr(obj, "support", None)
    decl.conformance(
        obj,
        origin,
        LINEAR_DISTILL_KIND,
        [
            (
                isinstance(support, LinearDistillSupport),
                "needs 'support' of type impls.protocols.linear_distill.LinearDistillSupport",
            ),
            (callable(obj), "is not callable"),
        ],
        [("", obj.fn if isinstance(obj, DistillFunctionImpl) else obj, call_refusal)],
        "the calls the suite makes",
    )


#: The linear + distillation kind, as every layer iterates it (:mod:`impls.protocols.kinds`).
KIND = Kind(
    name=LINEAR_DISTILL_KIND,
    protocol=DistillFunctionImpl,
    decorator=linear_distill_impl,
    validate=validate_linear_distill_impl,
    public=("DistillFunctionImpl", "LinearDistillSupport", "linear_distill_impl"),
    fixture="linear_distill_impl",
)
