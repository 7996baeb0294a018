"""The protocol of a fused linear head + preference loss (DPO, robust DPO, ORPO, CPO, SimPO, KTO).

A linear+preference implementation is any object with

``name: str``, ``kind: str`` = ``"linear-preference"``, ``support: PreferenceSupport``
    Its name, kind and declaration (:class:`PreferenceSupport`: the loss and its conventions, the dtypes, the
    options it honours, chunking and the grad_weight accumulation path).
``__call__(x, weight, target, bias=None, *, ref_logps, params)``
    ``x`` ``[B, T, H]`` (``B = 2P`` completions, chosen and rejected laid out as ``support.layout`` says),
    ``weight`` ``[V, H]``, ``target`` ``[B, T]`` int64 (``params.ignore_index`` marks ignored positions),
    ``bias`` ``[V]`` or ``None``; ``ref_logps`` ``[B]`` fp32, the reference model's per-sequence log-probabilities
    (the losses with a reference model; ``None`` otherwise); ``params`` a
    :class:`~reference.linear_preference.PreferenceParams` (β, γ, ε, α, ``average_log_prob``, ``ignore_index``,
    ``chunk_pairs``). Returns the scalar loss connected to autograd; ``loss.backward()`` fills ``x.grad``,
    ``weight.grad`` (and ``bias.grad``) in their own dtypes. Semantics are those of the float64 oracle
    :func:`reference.linear_preference.linear_preference`, whose docstring states them.

Write one with :func:`linear_preference_impl`; its declaration is checked where it is written
(:class:`~numcheck.impls.protocols.declaration.InvalidDeclaration`)::

    from numcheck import linear_preference_impl

    @linear_preference_impl(name="my_dpo", loss="dpo", dtypes=("bfloat16", "float32"), nll=True)
    def my_dpo(x, weight, target, bias=None, *, ref_logps, params):
        ...
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from numcheck.impls.protocols import declaration as decl
from numcheck.impls.protocols.declaration import invalid
from numcheck.impls.protocols.fp8_linear import call_refusal
from numcheck.impls.protocols.kind import Kind
from numcheck.reference.linear_preference import (
    AVERAGED_LOSSES,
    LAYOUTS,
    LOSSES,
    MARGIN_LOSSES,
    NLL_REDUCTIONS,
    REDUCTIONS,
    REFERENCE_LOSSES,
    REFERENCE_POINT_LOSSES,
    SMOOTHED_LOSSES,
    Conventions,
    PreferenceParams,
)

PREFERENCE_KIND = "linear-preference"
#: The keywords every call passes after ``x, weight, target, bias``.
PREFERENCE_CALL_KEYWORDS: tuple[str, ...] = ("ref_logps", "params")
#: The dtypes an impl may declare (x and weight share one).
PREFERENCE_DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16, torch.float16)
#: How grad_weight is summed over chunks: in fp32 (``"fp32"``), each chunk's partial product rounded once to the
#: weight's dtype then summed in fp32 (``"per_chunk_rounding"``), or the running sum kept in the weight's dtype
#: (``"param_dtype"``): docs/accumulation-and-memory.md.
ACCUMULATION_PATHS: tuple[str, ...] = ("fp32", "per_chunk_rounding", "param_dtype")
LOSS_ALIASES: dict[str, str] = {"sigmoid": "dpo", "robust": "dpo_robust", "cdpo": "dpo", "odds_ratio": "orpo"}


@dataclass(frozen=True)
class PreferenceSupport:
    """What a linear+preference impl declares.

    Attributes:
        loss: which loss it computes (:data:`reference.linear_preference.LOSSES`).
        layout: where the chosen and rejected completions are (``"halves"``: first half chosen; ``"interleaved"``).
        reduction: the pair losses' sum divided by the number of pairs (``"mean"``) or not (``"sum"``).
        nll_reduction: the NLL term divided by the chosen completions' non-ignored positions (``"tokens"``) or by
            the number of pairs (``"sequences"``).
        dtypes: the dtypes of x and weight it takes.
        devices: the device types it runs on.
        bias: whether it takes a bias.
        label_smoothing: whether it honours ε ≠ 0 (losses of ``SMOOTHED_LOSSES``).
        margin: whether it honours γ ≠ 0 (SimPO).
        nll: whether it honours α ≠ 0 (adds the chosen completions' NLL).
        reference_point: whether it honours KTO's reference point κ ≠ 0 (``params.kl``).
        average_log_prob: the per-sequence reductions it takes: ``False`` (sum) and/or ``True`` (mean); ORPO and
            SimPO are defined on the mean, so they declare ``(True,)``.
        chunking: whether it honours ``params.chunk_pairs`` (the suite then checks chunk invariance).
        grad_weight_accumulation: how grad_weight (and grad_bias) sum over chunks (:data:`ACCUMULATION_PATHS`).
        requires: ``None`` or a zero-argument callable returning why the impl cannot run here.
    """

    loss: str = "dpo"
    layout: str = "halves"
    reduction: str = "mean"
    nll_reduction: str = "tokens"
    dtypes: frozenset[torch.dtype] = frozenset({torch.float32})
    devices: frozenset[str] = frozenset({"cpu", "cuda"})
    bias: bool = True
    label_smoothing: bool = False
    margin: bool = False
    nll: bool = False
    reference_point: bool = False
    average_log_prob: frozenset[bool] = frozenset({False})
    chunking: bool = False
    grad_weight_accumulation: str = "fp32"
    requires: Callable[[], str | None] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        own = type(self).__name__
        set_ = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731 - a frozen dataclass
        for name, known, aliases in (
            ("loss", LOSSES, LOSS_ALIASES),
            ("layout", LAYOUTS, {"stacked": "halves", "alternating": "interleaved"}),
            ("reduction", REDUCTIONS, {"pairs": "mean", "batchmean": "mean"}),
            ("nll_reduction", NLL_REDUCTIONS, {"mean": "tokens", "pairs": "sequences"}),
            ("grad_weight_accumulation", ACCUMULATION_PATHS, {"float32": "fp32", "bf16": "param_dtype"}),
        ):
            _one_of(own, name, getattr(self, name), known, aliases)
        set_("dtypes", decl.dtypes(own, "dtypes", self.dtypes, PREFERENCE_DTYPES, empty_ok=False))
        set_("devices", decl.device_types(own, self.devices))
        decl.bools(own, self, ("bias", "label_smoothing", "margin", "nll", "reference_point", "chunking"))
        decl.requirement(own, self.requires)
        set_("average_log_prob", _modes(own, self.average_log_prob, self.loss))
        _options_fit(own, self)

    @property
    def conventions(self) -> Conventions:
        """The oracle's :class:`~reference.linear_preference.Conventions` of this declaration."""
        return Conventions(self.loss, self.layout, self.reduction, self.nll_reduction)

    @property
    def needs_reference(self) -> bool:
        """Whether its calls pass the reference model's log-probabilities."""
        return self.loss in REFERENCE_LOSSES

    def unavailable_reason(self) -> str | None:
        """Why the impl cannot run on this machine at all, or ``None``."""
        return decl.requirement_unmet(self.requires)

    def refuses(self, *, dtype: torch.dtype, device: str, params: PreferenceParams, bias: bool) -> str | None:
        """Why this declaration excludes a call, or ``None``."""
        if dtype not in self.dtypes:
            return f"dtype {dtype} not declared (declares {sorted(map(str, self.dtypes))})"
        if device not in self.devices:
            return f"device {device} not declared (declares {sorted(self.devices)})"
        checks = (
            (bias and not self.bias, "a bias"),
            (params.label_smoothing != 0 and not self.label_smoothing, "label smoothing ε ≠ 0"),
            (params.gamma != 0 and not self.margin, "a margin γ ≠ 0"),
            (params.nll_weight != 0 and not self.nll, "an NLL term α ≠ 0"),
            (params.kl != 0 and not self.reference_point, "a reference point κ ≠ 0"),
            (params.average_log_prob not in self.average_log_prob, f"average_log_prob={params.average_log_prob}"),
            (params.chunk_pairs is not None and not self.chunking, "chunk_pairs"),
        )
        return next((f"{what} not declared" for bad, what in checks if bad), None)

    def describe(self) -> str:
        """Multi-line description for ``numcheck list``."""
        opts = [
            n for n in ("bias", "label_smoothing", "margin", "nll", "reference_point", "chunking") if getattr(self, n)
        ]
        modes = ",".join("mean" if m else "sum" for m in sorted(self.average_log_prob))
        return (
            f"loss: {self.loss}; layout: {self.layout}; reduction: {self.reduction}; NLL ÷ {self.nll_reduction}; "
            f"per-sequence log-prob: {modes}\n"
            f"dtypes: {','.join(sorted(str(d).removeprefix('torch.') for d in self.dtypes))}; devices: "
            f"{','.join(sorted(self.devices))}; options: {','.join(opts) or 'none'}; grad_weight accumulation: "
            f"{self.grad_weight_accumulation}"
        )


def _one_of(owner: str, name: str, value: object, known: tuple[str, ...], aliases: dict[str, str]) -> None:
    if value not in known:
        hint = decl.did_you_mean(value, known, aliases) if isinstance(value, str) else ""
        raise invalid(f"{owner}.{name}={value!r} is not one of {known}", f"Declare {name}= one of {known}.{hint}")


def _modes(owner: str, value: object, loss: str) -> frozenset[bool]:
    modes = decl.collection(owner, "average_log_prob", value, "(False,)")
    if not modes or any(not isinstance(m, bool) for m in modes):
        raise invalid(
            f"{owner}.average_log_prob={value!r} must be a non-empty collection of False and/or True",
            "e.g. average_log_prob=(False,) (summed log-probabilities) or (False, True).",
        )
    if loss in AVERAGED_LOSSES and set(modes) != {True}:
        raise invalid(
            f"{owner}.average_log_prob={tuple(modes)!r}: {loss} is defined on length-normalised log-probabilities",
            "Declare average_log_prob=(True,) (the mean over each completion's non-ignored positions).",
        )
    return frozenset(modes)


def _options_fit(owner: str, s: PreferenceSupport) -> None:
    """An option declared for a loss that has no such parameter is refused (it would never be drawn)."""
    if s.label_smoothing and s.loss not in SMOOTHED_LOSSES:
        raise invalid(
            f"{owner}.label_smoothing=True: {s.loss} has no label smoothing",
            f"Leave it out; the losses with ε are {SMOOTHED_LOSSES}.",
        )
    if s.reference_point and s.loss not in REFERENCE_POINT_LOSSES:
        raise invalid(
            f"{owner}.reference_point=True: {s.loss} has no reference point κ",
            f"Leave it out; the losses with κ are {REFERENCE_POINT_LOSSES}.",
        )
    if s.margin and s.loss not in MARGIN_LOSSES:
        raise invalid(
            f"{owner}.margin=True: {s.loss} has no margin γ", f"Leave it out; the losses with γ are {MARGIN_LOSSES}."
        )


@dataclass(frozen=True)
class PreferenceFunctionImpl(decl.PickledByReference):
    """A linear+preference impl made from a plain function with the call's signature (module docstring)."""

    name: str
    fn: Callable[..., torch.Tensor] = field(repr=False)
    support: PreferenceSupport = field(default_factory=PreferenceSupport)
    description: str = ""
    kind: str = PREFERENCE_KIND

    def __post_init__(self) -> None:
        decl.built(
            self,
            PreferenceSupport,
            "Build it with PreferenceSupport(loss=..., dtypes=...).",
            "mymod_dpo",
            [("function", self.fn, _refusal)],
            "the calls the suite makes",
        )

    def __call__(self, x, weight, target, bias=None, **kwargs):  # noqa: D102 - the call of the module docstring
        return self.fn(x, weight, target, bias, **kwargs)


#: The keywords :func:`linear_preference_impl` takes for the declaration.
PREFERENCE_SUPPORT_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(PreferenceSupport))


def linear_preference_impl(
    *, name: str, description: str = "", **support: Any
) -> Callable[[Callable[..., torch.Tensor]], PreferenceFunctionImpl]:
    """Decorator turning a function into a linear+preference impl the suite runs
    (``pytest --pyargs numcheck.tests.suite --impl mymod:impl``).

    The function is called ``fn(x, weight, target, bias, *, ref_logps, params)`` (module docstring); ``support``
    keywords are the fields of :class:`PreferenceSupport`. A bad keyword or value, or a function that cannot take
    the calls, raises :class:`~numcheck.impls.protocols.declaration.InvalidDeclaration` naming the decorator's
    ``file:line``.

    >>> @linear_preference_impl(name="doc_cpo", loss="cpo", dtypes=("bfloat16",), nll=True)
    ... def doc_cpo(x, weight, target, bias=None, *, ref_logps, params):
    ...     ...
    >>> doc_cpo.kind, doc_cpo.support.loss
    ('linear-preference', 'cpo')
    """
    site, owner = decl.opening("linear_preference_impl", name, support, PREFERENCE_SUPPORT_FIELDS, "mymod_dpo")
    declared = PreferenceSupport(**support)

    def wrap(fn: Callable[..., torch.Tensor]) -> PreferenceFunctionImpl:
        doc = decl.decorated(
            owner,
            site,
            fn,
            "Put the decorator on the function computing the loss from x, weight, target, bias.",
            [(getattr(fn, "__name__", "the function"), fn, _refusal)],
            "the calls the suite makes",
            description,
        )
        return PreferenceFunctionImpl(name=name, fn=fn, support=declared, description=doc)

    return wrap


def _refusal(fn: Callable[..., Any]) -> str | None:
    """Why ``fn`` cannot take ``fn(x, weight, target, bias, *,`` :data:`PREFERENCE_CALL_KEYWORDS` ``)``."""
    return call_refusal(fn, 4, PREFERENCE_CALL_KEYWORDS)


def validate_preference_impl(obj: Any, origin: str) -> None:
    """Raise ``TypeError`` naming ``origin`` when ``obj`` breaks this protocol."""
    support = getattr(obj, "support", None)
    decl.conformance(
        obj,
        origin,
        PREFERENCE_KIND,
        [
            (
                isinstance(support, PreferenceSupport),
                f"needs 'support' of type impls.protocols.linear_preference.PreferenceSupport, got "
                f"{type(support).__name__}",
            ),
            (callable(obj), "is not callable"),
        ],
        [("", obj.fn if isinstance(obj, PreferenceFunctionImpl) else obj, _refusal)],
        "the calls the suite makes",
    )


#: The linear+preference kind, as every layer iterates it (:mod:`impls.protocols.kinds`).
KIND = Kind(
    name=PREFERENCE_KIND,
    protocol=PreferenceFunctionImpl,
    decorator=linear_preference_impl,
    validate=validate_preference_impl,
    public=("PreferenceFunctionImpl", "PreferenceSupport", "PreferenceParams", "linear_preference_impl"),
    fixture="linear_preference_impl",
)
