"""The protocol of a distributed (vocabulary-parallel) linear+CE implementation.

A distributed impl is an object with ``name``, ``kind = "dist-linear-ce"``, ``support`` (a
:class:`~numcheck.impls.protocols.linear_ce.LinearCESupport`: the numerics of one rank's part, read by the tolerance
model exactly as for a single-device impl), ``dist`` (a :class:`DistSupport`: what is sharded, the world sizes
and backends, the label-smoothing convention, determinism) and

``rank_call(x, weight_shard, target, bias_shard, *, group, vocab_start, vocab_size, **options) -> loss``
    called on every rank of ``group`` with the full ``x`` [N, H] and ``target`` [N], the rank's vocabulary
    shard ``weight_shard`` [V_r, H] (classes ``vocab_start … vocab_start + V_r − 1`` of ``vocab_size``) and its
    bias shard (or ``None``); the options are the single-device protocol's (``class_weights`` is the full [V]
    tensor). It returns the loss (the same on every rank), connected to autograd; after
    ``loss.backward(upstream.to(loss.dtype))`` on every rank (the same upstream gradient on each: 1, a scalar, or
    ``[N]`` for ``none``, in the loss's own dtype, so a bf16 loss receives a bf16-rounded upstream; the suite draws
    upstream values that bf16 and fp16 hold exactly), ``x.grad`` must be the *full* grad_x (the impl all-reduces
    it) and ``weight_shard.grad`` / ``bias_shard.grad`` the rank's shards of grad_W / grad_b.

Shard rule (:func:`shard_bounds`): rank r of P owns ⌊V/P⌋ classes, one more for r < V mod P, in rank order:
contiguous, sizes differing by at most one. An impl declaring ``uneven_vocab=False`` is only given V divisible
by P.
"""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Literal

import torch

from numcheck.impls.protocols import declaration as decl
from numcheck.impls.protocols.declaration import invalid
from numcheck.impls.protocols.kind import Kind
from numcheck.impls.protocols.linear_ce import (
    SUPPORT_FIELDS,
    LinearCESupport,
    call_refusal,
    inferred_options,
    make_support,
)
from numcheck.reference.options import CEOptions, options_from_kwargs

DIST_KIND = "dist-linear-ce"
#: The torch.distributed backends a declaration may name.
BACKENDS: tuple[str, ...] = ("gloo", "nccl")
#: The keywords every ``rank_call`` passes besides the single-device protocol's.
RANK_KEYWORDS: tuple[str, ...] = ("group", "vocab_start", "vocab_size")


def shard_bounds(V: int, world_size: int, rank: int) -> tuple[int, int]:
    """``(start, stop)`` of rank ``rank``'s classes under the shard rule of the module docstring."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside world size {world_size}")
    if V < world_size:
        raise ValueError(f"V={V} classes cannot give each of {world_size} ranks at least one")
    base, extra = divmod(V, world_size)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


@dataclass(frozen=True)
class DistSupport:
    """What a distributed impl declares beyond one rank's numerics.

    Attributes:
        sharded: what is split across ranks (``"vocab"``: the output projection's classes).
        world_sizes: the world sizes it runs at.
        backends: the torch.distributed backends it runs on (``"gloo"``, ``"nccl"``).
        uneven_vocab: whether V need not be divisible by the world size.
        smoothing: the label-smoothing convention (:mod:`numcheck.reference.smoothing`): ``"torch"`` (ε/V over
            all classes) or ``"megatron"`` (ε/(V−1) over the others); judged against the oracle with it.
        deterministic: repeated calls at one world size give bitwise equal outputs.
        grad_x_reduce_dtype: ``"input"`` when each rank's grad_x partial is rounded to x's dtype and all-reduced
            in it (the model charges P roundings: :mod:`numcheck.properties.distributed.linear_ce.tolerance`), ``"float32"`` when
            the partials are reduced in fp32 and rounded once.
    """

    sharded: Literal["vocab"] = "vocab"
    world_sizes: tuple[int, ...] = (1, 2, 4)
    backends: tuple[str, ...] = ("gloo", "nccl")
    uneven_vocab: bool = True
    smoothing: Literal["torch", "megatron"] = "torch"
    deterministic: bool = True
    grad_x_reduce_dtype: Literal["input", "float32"] = "input"

    def __post_init__(self) -> None:
        own = "DistSupport"
        if self.sharded != "vocab":
            raise invalid(
                f"{own}.sharded={self.sharded!r}: only 'vocab' is known for linear+CE",
                "Shard the output projection's classes across the ranks and declare sharded='vocab'.",
            )
        ws = decl.collection(own, "world_sizes", self.world_sizes, "(1, 2, 4)")
        if not ws or any(isinstance(w, bool) or not isinstance(w, int) or w < 1 for w in ws):
            raise invalid(
                f"{own}.world_sizes={self.world_sizes!r} must be a non-empty collection of positive ints",
                "e.g. world_sizes=(1, 2, 4).",
            )
        object.__setattr__(self, "world_sizes", tuple(ws))
        backends = decl.collection(own, "backends", self.backends, "('gloo', 'nccl')")
        bad = [b for b in backends if b not in BACKENDS]
        if bad or not backends:
            hint = decl.did_you_mean(bad[0], BACKENDS) if bad and isinstance(bad[0], str) else ""
            raise invalid(
                f"{own}.backends={self.backends!r} must be a non-empty collection of {BACKENDS}",
                f"'gloo' runs on CPU, 'nccl' on CUDA (one GPU per rank).{hint}",
            )
        object.__setattr__(self, "backends", tuple(backends))
        if self.smoothing not in ("torch", "megatron"):
            raise invalid(
                f"{own}.smoothing={self.smoothing!r} is not 'torch' or 'megatron'",
                "'torch': ε/V over all classes (F.cross_entropy); 'megatron': ε/(V−1) over the others "
                "(Megatron-LM, NeMo).",
            )
        if self.grad_x_reduce_dtype not in ("input", "float32"):
            raise invalid(
                f"{own}.grad_x_reduce_dtype={self.grad_x_reduce_dtype!r} is not 'input' or 'float32'",
                "'input': each rank's grad_x rounded to x's dtype and all-reduced in it; 'float32': "
                "reduced in fp32 and rounded once.",
            )
        decl.bools(own, self, ("uneven_vocab", "deterministic"))


def rank_call_refusal(fn: Callable[..., Any], options: frozenset[str]) -> str | None:
    """Why ``fn`` cannot take the calls a rank makes (``fn(x, weight_shard, target, bias_shard, group=...,
    vocab_start=..., vocab_size=..., reduction=..., ignore_index=..., **declared options)``), with a fix; ``None``
    when it can or its signature cannot be read."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    params = sig.parameters
    var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    missing = [
        k
        for k in RANK_KEYWORDS
        if not var_kw
        and (
            k not in params
            or params[k].kind not in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        )
    ]
    if missing:
        return (
            f"{getattr(fn, '__name__', type(fn).__name__)}{sig} takes no keyword {', '.join(missing)}, which "
            f"every rank's call passes: add {', '.join(f'{k}' for k in missing)} as keyword-only parameters."
        )
    stripped = sig.replace(parameters=[p for n, p in params.items() if n not in RANK_KEYWORDS])
    probe = lambda *a, **k: None  # noqa: E731 - a stand-in carrying the signature without the rank keywords
    probe.__signature__ = stripped  # type: ignore[attr-defined]
    probe.__name__ = getattr(fn, "__name__", type(fn).__name__)
    return call_refusal(probe, options)


class VocabShardImpl:
    """The ``rank_call`` of numcheck's vocabulary-parallel impls (the built-in, the Megatron-core and
    TransformerEngine adapters), one body: the options read (:attr:`takes`: the option keywords the loss takes,
    ``None`` for every linear+CE option; another keyword is a ``TypeError``, as for a function without it), the
    rank's logits shard ``F.linear(input_for_shard(x), weight_shard, bias_shard)`` in the inputs' dtype (the bias
    cast to the weight's), upcast to fp32 where :attr:`upcast` says so, then :meth:`shard_loss`.

    A subclass gives :meth:`input_for_shard` (x as the shard's matmul sees it: its backward all-reduces grad_x) and
    :meth:`shard_loss` (the loss from the shard's logits, the same on every rank)."""

    #: The option keywords :meth:`shard_loss` takes besides ``reduction``/``ignore_index`` (``None``: every one).
    takes: frozenset[str] | None = None
    #: Whether the logits shard is upcast to fp32 before :meth:`shard_loss` (as Megatron's GPT loss does).
    upcast: bool = True

    def input_for_shard(self, x: torch.Tensor, group: Any) -> torch.Tensor:
        """x as this rank's matmul sees it; its gradient is all-reduced across ranks."""
        raise NotImplementedError(f"{type(self).__name__} must define input_for_shard (a VocabShardImpl's part)")

    def shard_loss(
        self, logits: torch.Tensor, target: torch.Tensor, o: CEOptions, *, group: Any, vocab_start: int, vocab_size: int
    ) -> torch.Tensor:
        """The loss from this rank's logits shard [N, V_r] (classes ``vocab_start …`` of ``vocab_size``)."""
        raise NotImplementedError(f"{type(self).__name__} must define shard_loss (a VocabShardImpl's part)")

    def rank_call(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        target: torch.Tensor,
        bias: torch.Tensor | None = None,
        *,
        group: Any,
        vocab_start: int,
        vocab_size: int,
        **options: Any,
    ) -> torch.Tensor:
        """This rank's part of linear+CE (the module docstring's call): its logits shard, then the loss."""
        extra = sorted(set(options) - {"reduction", "ignore_index"} - self.takes) if self.takes is not None else []
        if extra:
            raise TypeError(f"{type(self).__name__}.rank_call() got an unexpected keyword argument {extra[0]!r}")
        o = options_from_kwargs(**options)
        xin = self.input_for_shard(x, group)
        logits = torch.nn.functional.linear(xin, weight, bias.to(weight.dtype) if bias is not None else None)
        return self.shard_loss(
            logits.float() if self.upcast else logits,
            target,
            o,
            group=group,
            vocab_start=vocab_start,
            vocab_size=vocab_size,
        )


@dataclass(frozen=True)
class DistFunctionImpl(decl.PickledByReference):
    """A distributed impl from a module-level function ``fn`` with ``rank_call``'s signature.

    Built, it has checked that ``fn`` takes every call its declaration leads to (:func:`rank_call_refusal`). The
    ranks receive it pickled: bound at module level (what :func:`dist_linear_ce_impl` gives) it pickles as that
    module-level name, else by its fields (``fn`` by reference)."""

    name: str
    fn: Callable[..., Any] = field(repr=False)
    support: LinearCESupport = field(default_factory=LinearCESupport)
    dist: DistSupport = field(default_factory=DistSupport)
    description: str = ""
    kind: str = DIST_KIND

    def __post_init__(self) -> None:
        decl.built(
            self,
            LinearCESupport,
            "Build it with numcheck.make_support(...): one rank's numerics.",
            "mymod_vocab_parallel",
            [],
            "",
        )
        if not isinstance(self.dist, DistSupport):
            raise invalid(
                f"impl {self.name!r}: dist must be a DistSupport, got {type(self.dist).__name__}",
                "Build it with DistSupport(world_sizes=..., backends=..., smoothing=...).",
            )
        decl.built(
            self, LinearCESupport, "", "", [("function", self.fn, self._refusal)], "the calls its declaration leads to"
        )

    def _refusal(self, fn: Callable[..., Any]) -> str | None:
        return rank_call_refusal(fn, self.support.options)

    def rank_call(self, *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)``: see the module docstring."""
        return self.fn(*args, **kwargs)


#: The keywords of :func:`dist_linear_ce_impl`'s distributed declaration (the rest are one rank's numerics).
DIST_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(DistSupport))


def dist_linear_ce_impl(
    *, name: str, description: str = "", **declared: Any
) -> Callable[[Callable[..., Any]], DistFunctionImpl]:
    """Decorator turning a module-level function into a distributed (vocabulary-parallel) linear+CE impl the
    distributed suite runs (``pytest --pyargs numcheck.tests.suite --impl mymod:impl``).

    Every rank calls ``fn(x, weight_shard, target, bias_shard, *, group, vocab_start, vocab_size, reduction,
    ignore_index, **options)`` (module docstring: the shard rule, what it returns, which gradients it leaves).
    Keywords: the fields of :class:`DistSupport` (``world_sizes``, ``backends``, ``uneven_vocab``, ``smoothing``,
    ``deterministic``, ``grad_x_reduce_dtype``, ``sharded``) and those of
    :class:`~numcheck.impls.protocols.linear_ce.LinearCESupport` (one rank's numerics: ``dtypes``, ``options``, ...;
    :func:`~numcheck.impls.protocols.linear_ce.make_support`). ``options`` defaults to what the signature accepts, as for
    :func:`~numcheck.impls.protocols.linear_ce.linear_ce_impl`. A bad keyword or value, or a function that cannot take the
    calls its declaration leads to, raises :class:`~numcheck.impls.protocols.declaration.InvalidDeclaration` naming
    the decorator's ``file:line``. Bind the result at module level: the ranks unpickle it by that name.

    >>> import torch
    >>> import torch.distributed as dist
    >>> @dist_linear_ce_impl(name="doc_vocab_parallel", dtypes=("float32",), options=(), autocast=(),
    ...                      world_sizes=(1, 2), backends=("gloo",))
    ... def doc_vocab_parallel(x, weight_shard, target, bias_shard=None, *, group, vocab_start, vocab_size,
    ...                        reduction="mean", ignore_index=-100):
    ...     ...
    >>> doc_vocab_parallel.kind, doc_vocab_parallel.dist.world_sizes
    ('dist-linear-ce', (1, 2))
    """
    site, owner = decl.opening(
        "dist_linear_ce_impl", name, declared, (*DIST_FIELDS, *SUPPORT_FIELDS), "mymod_vocab_parallel"
    )
    dist_kw = {k: v for k, v in declared.items() if k in DIST_FIELDS}
    support_kw = {k: v for k, v in declared.items() if k not in DIST_FIELDS}
    dist = DistSupport(**dist_kw)
    support = make_support(**support_kw)

    def wrap(fn: Callable[..., Any]) -> DistFunctionImpl:
        sup = support
        if "options" not in support_kw and callable(fn):
            sup = dataclasses.replace(support, options=inferred_options(fn))
        doc = decl.decorated(
            owner,
            site,
            fn,
            "Put the decorator on the function each rank calls.",
            [(getattr(fn, "__name__", "the function"), fn, lambda f: rank_call_refusal(f, sup.options))],
            "the calls its declaration leads to",
            description,
        )
        return DistFunctionImpl(name=name, fn=fn, support=sup, dist=dist, description=doc)

    return wrap


def describe_dist_impl(impl: Any) -> str:
    """A distributed impl's declaration in a few lines (``numcheck list``): what :class:`DistSupport` declares, then
    one rank's numerics (:meth:`LinearCESupport.describe`)."""
    d = impl.dist
    return (
        f"distributed: sharded {d.sharded}; backends: {','.join(d.backends)}; world sizes: "
        f"{','.join(map(str, d.world_sizes))}; uneven vocab: {'yes' if d.uneven_vocab else 'no'}; "
        f"smoothing convention: {d.smoothing}; deterministic: {'yes' if d.deterministic else 'no'}; "
        f"grad_x all-reduce in: {d.grad_x_reduce_dtype}\n" + impl.support.describe()
    )


def validate_dist_impl(obj: Any, origin: str) -> None:
    """Raise ``TypeError`` naming ``origin`` when ``obj`` breaks this protocol: its name, ``support``
    (:class:`LinearCESupport`), ``dist`` (:class:`DistSupport`), a ``rank_call`` that cannot take the ranks' calls,
    or an impl that does not pickle (the ranks receive it pickled)."""
    support, dist, call = (getattr(obj, a, None) for a in ("support", "dist", "rank_call"))
    decl.conformance(
        obj,
        origin,
        DIST_KIND,
        [
            (
                isinstance(support, LinearCESupport),
                f"needs 'support' of type impls.protocols.linear_ce.LinearCESupport "
                f"(one rank's numerics), got {type(support).__name__}",
            ),
            (
                isinstance(dist, DistSupport),
                f"needs 'dist' of type impls.protocols.dist_linear_ce.DistSupport, got {type(dist).__name__}",
            ),
            (callable(call), "has no callable rank_call"),
        ],
        [("", obj.fn if isinstance(obj, DistFunctionImpl) else call, lambda f: rank_call_refusal(f, support.options))],
        "the calls its declaration leads to",
        pickled=True,
        decorator="dist_linear_ce_impl",
    )


#: The vocabulary-parallel linear + cross-entropy kind, as every layer iterates it (:mod:`impls.protocols.kinds`).
KIND = Kind(
    name=DIST_KIND,
    protocol=DistFunctionImpl,
    decorator=dist_linear_ce_impl,
    validate=validate_dist_impl,
    public=("DistFunctionImpl", "DistSupport", "dist_linear_ce_impl"),
    fixture="dist_linear_ce_impl",
    former="dist_linear_ce",
    describe=describe_dist_impl,
)
