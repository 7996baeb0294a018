"""The public protocol for an implementation under test.

numcheck knows two kinds of implementation, and one registry holds both:

* ``"linear-ce"`` — linear + cross-entropy: ``loss = CE(x @ weight.T + bias, target)``.
* ``"fp8-linear"`` — an FP8-quantized linear layer (protocol in :mod:`impls.protocols.fp8_linear`).

A linear+CE implementation is any object with

``name: str``
    Unique, short, printable (``"chunked[addmm_out_dtype]"``, ``"mymod_flce"``).
``kind: str``
    ``"linear-ce"``.
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
    ``loss.backward(upstream.to(loss.dtype))``: the upstream gradient (1, a scalar, or ``[N]`` for ``none``)
    reaches the loss in the loss's own dtype, so a bf16 loss receives a bf16-rounded upstream (the suite draws
    upstream values that bf16 and fp16 hold exactly). The gradients must reach ``x``, ``weight`` and ``bias``.

The exact semantics (PyTorch's for the CE part, Liger's for z-loss) are those of the float64 oracle
:func:`reference.linear_ce.linear_ce`; ``docs/linear-ce.md`` derives the formulas.

The simplest way to write one is :func:`linear_ce_impl`::

    from numcheck.impls.protocols.linear_ce import linear_ce_impl

    @linear_ce_impl(name="mine", dtypes=("float32",), options=("bias",))
    def mine(x, weight, target, bias=None, *, reduction="mean", ignore_index=-100):
        logits = torch.nn.functional.linear(x, weight, bias).float()
        return torch.nn.functional.cross_entropy(logits, target, reduction=reduction,
                                                 ignore_index=ignore_index)
"""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Literal

import torch

from numcheck.impls.protocols import declaration as decl
from numcheck.impls.protocols.declaration import invalid
from numcheck.impls.protocols.fp8_linear import FP8_KIND, validate_fp8_linear_impl
from numcheck.impls.protocols.kind import Kind

#: The ``kind`` of a linear + cross-entropy impl (the only place that spells it).
LINEAR_CE_KIND = "linear-ce"
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


@dataclass(frozen=True)
class ElementaryError:
    """How far an impl's exp, log and tanh may be from the correctly rounded result, in ulps of the dtype they
    are evaluated in (the CE arithmetic: fp32 for ``ce_dtype="float32"``), counted as the CUDA C++ Programming
    Guide's "Mathematical Functions" appendix counts them: 0 is a correctly rounded function (the default, the
    tolerance model's assumption), 2 is CUDA's ``expf``. The model charges n ulps as a relative error 2n·u on
    top of the one rounding it already counts (an ulp of y is at most 2u·|y|).

    Attributes:
        exp: ulps of exp(x), apart from ``exp_per_arg``.
        exp_per_arg: further ulps per unit of |x|, for an exp whose error grows with its argument: exp evaluated
            as 2^(x·log2 e) with the product and the constant each rounded to fp32 adds u·|x| twice, so 1.0
            (Triton's ``tl.exp`` on CUDA); CUDA's intrinsic ``__expf`` documents 2 + floor(|1.173·x|) ulps, so
            ``exp=2, exp_per_arg=1.173``.
        log: ulps of log(x); for an implementation with an absolute error bound ε (``lg2.approx.f32``), ε in ulps
            of 1 (the model applies it to max(|log x|, 1)).
        tanh: ulps of tanh(x) as the impl evaluates it, including any division or exp inside a composite tanh.
        bf16_store: ulps beyond correct rounding of an fp32 value the impl's kernels store into a bf16 buffer
            (the logits' gradient, per-row losses): 0 for a round-to-nearest store; 0.5 under Triton's
            interpreter, which truncates toward zero (an error below one ulp where rounding leaves half of one).

    Example: a kernel calling CUDA's libdevice functions declares
    ``elementary_error={"exp": 2, "log": 1, "tanh": 2}`` (expf 2 ulp, logf 1 ulp, tanhf 2 ulp).
    """

    exp: float = 0.0
    exp_per_arg: float = 0.0
    log: float = 0.0
    tanh: float = 0.0
    bf16_store: float = 0.0

    def __post_init__(self) -> None:
        for name, value in decl.elementary_ulps("ElementaryError", vars(self), ELEMENTARY_FUNCTIONS).items():
            object.__setattr__(self, name, value)


#: The fields of :class:`ElementaryError`, the keys a declaration's ``elementary_error`` mapping may hold.
ELEMENTARY_FUNCTIONS: tuple[str, ...] = ("exp", "exp_per_arg", "log", "tanh", "bf16_store")


#: Names a user may write for an option that the declaration calls otherwise (the call's keyword, Liger's name).
OPTION_ALIASES: dict[str, str] = {
    "z_loss_scale": "z_loss",
    "lse_square_scale": "z_loss",
    "weight": "class_weights",
    "weights": "class_weights",
    "logit_softcapping": "softcap",
    "final_logit_softcapping": "softcap",
    "smoothing": "label_smoothing",
}
REDUCTION_ALIASES: dict[str, str] = {"avg": "mean", "average": "mean", "elementwise_mean": "mean", "batchmean": "mean"}

#: The keyword each option reaches the call with (``bias`` is the fourth positional argument, always passed;
#: ``reduction`` and ``ignore_index`` are always passed as keywords).
OPTION_KEYWORDS: dict[str, str] = {
    "label_smoothing": "label_smoothing",
    "class_weights": "class_weights",
    "softcap": "softcap",
    "z_loss": "z_loss_scale",
}
ALWAYS_PASSED: tuple[str, ...] = ("reduction", "ignore_index")


#: The support fields that take one of a few values, with those values.
_CHOICES: tuple[tuple[str, tuple[Any, ...]], ...] = (
    ("all_ignored", ("nan", "zero", None)),
    ("grad_accumulation", ("fp32", "per_chunk_rounding", "param_dtype")),
    ("grad_x_accumulation", ("fp32", "per_chunk_rounding", "param_dtype")),
    ("logits_dtype", ("compute", "float32")),
    ("ce_dtype", ("float32", "compute")),
    ("target_logit", ("logits", "rounded_products")),
    ("loss_dtype", ("input", "compute")),
)


def _check_choices(own: str, support: object) -> None:
    """Each field of :data:`_CHOICES` holds one of its values (a near miss of a string is named)."""
    for name, allowed in _CHOICES:
        value = getattr(support, name)
        if value not in allowed:
            raise invalid(
                f"{own}.{name}={value!r} is not one of {allowed}",
                f"See LinearCESupport's docstring for what each value means."
                f"{decl.did_you_mean(value, [a for a in allowed if a], None) if isinstance(value, str) else ''}",
            )


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
        chunk_rows: rows per chunk for a chunked impl (sets the chunk count of the grad_weight bound, and the
            length of the suite's many-chunk draws: :data:`~numcheck.properties.linear_ce.chunks.MANY_CHUNKS` chunks of
            it, whatever its size); ``None`` for one pass over all rows, or when ``chunk_rule`` gives the size.
        chunk_rule: for a chunked impl whose chunk size follows from the shapes, that rule: a function
            ``(N, H, V) -> rows per chunk`` (an int >= 1; N or more means one chunk). Liger-Kernel's is
            ``min(N, next_pow2(ceil(N / ceil(V / H))))``, so about ceil(V/H) chunks. It sets the chunk count
            as ``chunk_rows`` does, and the suite draws the shapes that give many chunks
            (:mod:`numcheck.properties.linear_ce.chunks`). Declare one of ``chunk_rows`` and ``chunk_rule``; it is
            called on a few shapes when declared, and must return an int >= 1 on each.
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
        elementary_error: how accurate the impl's exp, log and tanh are (:class:`ElementaryError`, or a mapping
            of its fields, e.g. ``{"exp": 2, "exp_per_arg": 1.0, "log": 1}``); default: correctly rounded.
        returns_z_loss: the call returns ``(loss, z_loss)`` instead of ``loss``.
        deterministic: repeated calls on the same inputs give bitwise equal outputs (the ``determinism``
            property). ``False`` for kernels whose reductions end in atomics or lock-ordered adds (their order,
            so their rounding, changes from run to run); each run is still judged against the oracle.
        loss_dtype: the least precise dtype the loss (and z-loss) may come back in. ``"input"`` (default): the
            parameters' dtype, so fp32 under autocast, as autocast's own ``cross_entropy`` gives (it runs in
            fp32); ``"compute"``: the compute dtype, bf16/fp16 under autocast too. A more precise dtype is always
            allowed; a less precise one fails ``loss_dtype``.
        slow: the impl is costly to run here (an interpreter, a large compile per shape): property tests
            give it a quarter of the profile's examples (at least 2; its covering rows run beside them, see
            :func:`numcheck.properties.core.runner.budget`), so CI stays inside its budget.
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
    chunk_rule: Callable[[int, int, int], int] | None = None
    grad_x_accumulation: GradAccumulation = "fp32"
    chunk_cols: int | None = None
    logits_dtype: Literal["compute", "float32"] = "compute"
    ce_dtype: Literal["float32", "compute"] = "float32"
    target_logit: Literal["logits", "rounded_products"] = "logits"
    elementary_error: ElementaryError = ElementaryError()
    returns_z_loss: bool = False
    deterministic: bool = True
    loss_dtype: Literal["input", "compute"] = "input"
    slow: bool = False
    requires: Callable[[], str | None] | None = field(default=None, compare=False)
    option_combinations_excluded: frozenset[frozenset[str]] = frozenset()

    def __post_init__(self) -> None:
        own = "LinearCESupport"
        set_ = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731 - a frozen dataclass
        set_("dtypes", decl.dtypes(own, "dtypes", self.dtypes, FLOAT_DTYPES, empty_ok=False))
        set_("autocast", decl.dtypes(own, "autocast", self.autocast, (torch.bfloat16, torch.float16), empty_ok=True))
        set_("devices", decl.device_types(own, self.devices))
        set_(
            "options",
            decl.known_names(
                own,
                "options",
                self.options,
                LINEAR_CE_OPTIONS,
                empty_ok=True,
                aliases=OPTION_ALIASES,
                note=" (options name features of the call; the reductions are declared with reductions=)",
            ),
        )
        set_(
            "reductions",
            decl.known_names(own, "reductions", self.reductions, REDUCTIONS, empty_ok=False, aliases=REDUCTION_ALIASES),
        )
        combos = decl.collection(
            own, "option_combinations_excluded", self.option_combinations_excluded, "[('softcap', 'z_loss')]"
        )
        set_(
            "option_combinations_excluded",
            frozenset(
                decl.known_names(
                    own, "option_combinations_excluded", c, LINEAR_CE_OPTIONS, empty_ok=False, aliases=OPTION_ALIASES
                )
                for c in combos
            ),
        )
        _check_choices(own, self)
        for name in ("chunk_rows", "chunk_cols"):
            decl.chunk_size(own, name, getattr(self, name))
        decl.chunk_rule(own, self.chunk_rule, self.chunk_rows)
        set_("elementary_error", _elementary(own, self.elementary_error))
        decl.bools(own, self, ("returns_z_loss", "slow", "deterministic"))
        decl.requirement(own, self.requires)

    def unavailable_reason(self) -> str | None:
        """Why the impl cannot run on this machine at all, or ``None``."""
        return decl.requirement_unmet(self.requires)

    def describe(self) -> str:
        """The declaration in a few lines (``numcheck list``): dtypes, options, accumulation paths, exclusions."""

        def names(dtypes: Iterable[torch.dtype]) -> str:
            return ",".join(sorted(str(d).replace("torch.", "") for d in dtypes)) or "-"

        grad_x = (
            f"; grad_x accumulation: {self.grad_x_accumulation}"
            + (f" (chunk classes {self.chunk_cols})" if self.chunk_cols else "")
            if self.grad_x_accumulation != "fp32"
            else ""
        )
        lines = [
            f"dtypes: {names(self.dtypes)}; autocast: {names(self.autocast)}; devices: {','.join(sorted(self.devices))}",
            f"options: {','.join(sorted(self.options)) or '-'}; reductions: {','.join(sorted(self.reductions))}",
            f"all-ignored mean: {self.all_ignored}; grad_weight accumulation: {self.grad_accumulation}"
            + (f" (chunk rows {self.chunk_rows})" if self.chunk_rows else "")
            + grad_x,
        ]
        if self.option_combinations_excluded:
            excluded = "; ".join("+".join(sorted(c)) for c in self.option_combinations_excluded)
            lines.append(f"excluded combinations: {excluded}")
        return "\n".join(lines)

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


def _elementary(owner: str, value: object) -> ElementaryError:
    """A declaration's ``elementary_error`` as an :class:`ElementaryError` (it may be given as a mapping)."""
    if isinstance(value, ElementaryError):
        return value
    fields = decl.elementary_mapping(f"{owner}.elementary_error", value, ELEMENTARY_FUNCTIONS)
    return ElementaryError(**fields)


def _accepts(sig: inspect.Signature, keyword: str) -> bool:
    """Whether a call with ``signature`` can take ``keyword=...``."""
    params = sig.parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return True
    p = sig.parameters.get(keyword)
    return p is not None and p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def _signature(fn: Callable[..., Any]) -> inspect.Signature | None:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin or C callable: the suite finds out by calling it
        return None


def call_refusal(fn: Callable[..., Any], options: Iterable[str]) -> str | None:
    """Why ``fn`` cannot take the calls the suite makes for ``options`` (a set of :data:`LINEAR_CE_OPTIONS`),
    with a fix, or ``None``.

    The suite calls ``fn(x, weight, target, bias, reduction=..., ignore_index=..., **declared)`` where
    ``declared`` holds the keyword of every declared option (:data:`OPTION_KEYWORDS`: ``z_loss`` is passed as
    ``z_loss_scale``). ``None`` too when the signature cannot be read (a C callable): calling it will tell."""
    sig = _signature(fn)
    if sig is None:
        return None
    declared = [o for o in LINEAR_CE_OPTIONS if o in set(options) and o in OPTION_KEYWORDS]
    keywords = [*ALWAYS_PASSED, *(OPTION_KEYWORDS[o] for o in declared)]
    try:
        sig.bind(None, None, None, None, **dict.fromkeys(keywords))
    except TypeError as exc:
        label = f"{getattr(fn, '__name__', type(fn).__name__)}{sig}"
        always = [k for k in ALWAYS_PASSED if not _accepts(sig, k)]
        missing = [o for o in declared if not _accepts(sig, OPTION_KEYWORDS[o])]
        if always:
            return (
                f"{label} takes no keyword {' or '.join(always)}, which every call passes. "
                f"Add {', '.join(f'{k}=...' for k in always)} to the signature (or **options)."
            )
        if missing:
            kws = ", ".join(f"{OPTION_KEYWORDS[o]}=..." for o in missing)
            return (
                f"{label} cannot take {kws}, which the declared option(s) {missing} pass. Add the keyword(s) "
                f"to the signature, or leave {missing} out of options= (or declare options= explicitly)."
            )
        return (
            f"{label} cannot be called as fn(x, weight, target, bias, reduction=..., ignore_index=...): {exc}. "
            f"Give it four positional parameters and keyword defaults for the rest."
        )
    return None


def inferred_options(fn: Callable[..., Any]) -> frozenset[str]:
    """The options a function declares by its signature: ``bias`` and ``ignore_index`` (always passed), and each
    option whose keyword it can take (all of them with ``**options``, or when the signature cannot be read)."""
    sig = _signature(fn)
    return frozenset(
        o for o in LINEAR_CE_OPTIONS if o not in OPTION_KEYWORDS or sig is None or _accepts(sig, OPTION_KEYWORDS[o])
    )


@dataclass(frozen=True)
class FunctionImpl:
    """A linear+CE implementation made from a plain function and a support declaration.

    Built, it has checked that ``fn`` can take every call its declared options lead to
    (:func:`call_refusal`); an :class:`~numcheck.impls.protocols.declaration.InvalidDeclaration` names the line that built it otherwise."""

    name: str
    fn: Callable[..., Any] = field(repr=False)
    support: LinearCESupport = field(default_factory=LinearCESupport)
    kind: str = LINEAR_CE_KIND
    description: str = ""

    def __post_init__(self) -> None:
        decl.built(
            self,
            LinearCESupport,
            "Build it with numcheck.make_support(...) or LinearCESupport(...).",
            "mymod_flce",
            [("function", self.fn, self._refusal)],
            "the calls its declaration leads to",
        )

    def _refusal(self, fn: Callable[..., Any]) -> str | None:
        return call_refusal(fn, self.support.options)

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


#: The keywords :func:`make_support` and :func:`linear_ce_impl` take for the declaration.
SUPPORT_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(LinearCESupport))


def make_support(**fields: Any) -> LinearCESupport:
    """Build a :class:`LinearCESupport` from its field names; omitted fields keep their defaults.

    Collections may be any iterable (tuples, lists), dtypes ``torch.dtype`` objects or their names
    (``"bfloat16"``), ``option_combinations_excluded`` an iterable of pairs. Every value is checked here and an
    :class:`~numcheck.impls.protocols.declaration.InvalidDeclaration` names the calling line, what is wrong and how to fix it (unknown keywords,
    device types, dtype or option names; empty ``dtypes``, ``devices`` or ``reductions``).

    >>> make_support(dtypes=("float32",), devices=("cpu",), options=("bias",)).options
    frozenset({'bias'})
    """
    decl.unknown_keywords("make_support()", fields, SUPPORT_FIELDS)
    return LinearCESupport(**fields)


def linear_ce_impl(*, name: str, description: str = "", **support: Any) -> Callable[[Callable[..., Any]], FunctionImpl]:
    """Decorator turning a function into a linear+CE impl the suite can load (``--impl mymod:impl``).

    ``support`` keywords are the fields of :class:`LinearCESupport` (:func:`make_support`; dtype names may be
    strings). The declaration is checked where it is written: a bad keyword, device type, dtype or option name,
    an empty ``dtypes``, or an option the function's signature cannot take raise :class:`~numcheck.impls.protocols.declaration.InvalidDeclaration`
    naming the decorator's ``file:line``.

    When ``options`` is not given it is what the signature accepts (:func:`inferred_options`): ``bias`` and
    ``ignore_index`` (always passed) plus each of ``label_smoothing``, ``class_weights``, ``softcap`` and
    ``z_loss`` whose keyword (``z_loss_scale`` for ``z_loss``) the function takes, all of them with
    ``**options``. Declared explicitly, every declared option's keyword must be accepted.

    >>> import torch.nn.functional as F
    >>> @linear_ce_impl(name="doc_plain", dtypes=("float32",), autocast=())
    ... def plain(x, weight, target, bias=None, *, reduction="mean", ignore_index=-100, label_smoothing=0.0):
    ...     logits = F.linear(x, weight, bias)
    ...     return F.cross_entropy(logits, target, reduction=reduction, ignore_index=ignore_index,
    ...                            label_smoothing=label_smoothing)
    >>> sorted(plain.support.options)
    ['bias', 'ignore_index', 'label_smoothing']
    """
    site, owner = decl.opening("linear_ce_impl", name, support, SUPPORT_FIELDS, "mymod_flce")
    declared = make_support(**support)

    def wrap(fn: Callable[..., Any]) -> FunctionImpl:
        sup = declared
        if "options" not in support and callable(fn):
            sup = dataclasses.replace(declared, options=inferred_options(fn))
        doc = decl.decorated(
            owner,
            site,
            fn,
            "Put the decorator on the function computing the loss.",
            [(getattr(fn, "__name__", "the function"), fn, lambda f: call_refusal(f, sup.options))],
            "the calls its declaration leads to",
            description,
        )
        return FunctionImpl(name=name, fn=fn, support=sup, description=doc)

    return wrap


def validate_impl(obj: Any, origin: str) -> None:
    """Raise ``TypeError`` naming ``origin`` when ``obj`` does not follow the protocol of its kind (for a linear+CE
    impl, including a call its declared options lead to that its signature cannot take: :func:`call_refusal`)."""
    kind = getattr(obj, "kind", None)
    if kind == FP8_KIND:
        validate_fp8_linear_impl(obj, origin)
        return
    name = getattr(obj, "name", None)
    if kind != LINEAR_CE_KIND and isinstance(name, str) and name:
        raise TypeError(f"{origin}: impl {name!r} has kind {kind!r}; expected {LINEAR_CE_KIND!r} or {FP8_KIND!r}")
    support = getattr(obj, "support", None)
    fn = obj.fn if isinstance(obj, FunctionImpl) else obj
    decl.conformance(
        obj,
        origin,
        LINEAR_CE_KIND,
        [
            (isinstance(support, LinearCESupport), "needs 'support' of type impls.protocols.linear_ce.LinearCESupport"),
            (callable(obj), "is not callable"),
        ],
        [("", fn, lambda f: call_refusal(f, support.options))],
        "the calls its declaration leads to",
    )


#: The linear + cross-entropy kind, as every layer iterates it (:mod:`impls.protocols.kinds`).
KIND = Kind(
    name=LINEAR_CE_KIND,
    protocol=FunctionImpl,
    decorator=linear_ce_impl,
    validate=validate_impl,
    public=("FunctionImpl", "LinearCESupport", "linear_ce_impl", "make_support"),
    fixture="linear_ce_impl",
    generic=True,
    former="linear_ce",
)
