"""Known divergences: real, reported differences of third-party impls that the property suite must not keep
re-finding on every run, and must notice when they go away.

Every kind of entry is one :class:`KnownDivergence`: it names the impls (fnmatch pattern), the properties it affects,
the devices it was seen on, the cases it covers (a predicate on the case), the outputs it is off in (every output,
or some, judged under the model of what the release computes), the reason, and one example; an entry about a
third-party library also names the releases it holds for (:class:`Releases`, a version range over the release the
adapter imported). An entry covers a case only on its devices and releases, so a divergence seen on CPU is still
looked for on CUDA, a divergence of 0.8.5 is still looked for on 0.5.8 (and reported there if present), and the
example runs on the suite's device (``NUMCHECK_DEVICE``). The single-device entries are :data:`KNOWN`:
tests/suite/test_properties.py leaves matching cases out of its draws; tests/adapters/test_known_divergences.py
runs every entry's example as a strict xfail, so a fix upstream turns CI red until the entry is removed, an entry
that matches no registered impl is reported, and on an installed release outside an entry's range the example must
pass (so the range is exact where it has been measured). A distributed impl's entries
(:data:`numcheck.properties.distributed.linear_ce.known.DIST_KNOWN`) are checked the same way by
tests/adapters/test_megatron_fused.py and tests/adapters/test_transformer_engine.py.
"""

from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import torch
from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from numcheck.properties.linear_ce.cases import Problem, Tensors

if TYPE_CHECKING:
    from numcheck.properties.linear_ce.tolerance import ErrorModel


@dataclass(frozen=True)
class Releases:
    """The releases of a third-party package an entry holds for: ``specifier`` (PEP 440, e.g. ``">=0.6.3"``) over
    the version ``installed()`` reads, that of the module the adapter actually imported (``None`` when unknown).
    An unknown release is in no range: the entry then covers nothing, so the draws still test those cases."""

    package: str
    specifier: str
    installed: Callable[[], str | None]

    def __post_init__(self) -> None:
        SpecifierSet(self.specifier)  # raises InvalidSpecifier naming the bad text

    def version(self) -> Version | None:
        """The installed release as a :class:`Version`, ``None`` when unknown or not a PEP 440 version."""
        text = self.installed()
        try:
            return Version(text) if text else None
        except InvalidVersion:
            return None

    def hold(self) -> bool:
        """Whether the installed release is known and inside the range."""
        v = self.version()
        return v is not None and SpecifierSet(self.specifier).contains(v, prereleases=True)

    def describe(self) -> str:
        return f"{self.package}{self.specifier} (installed: {self.installed() or 'unknown'})"


def library_release(library: str) -> str | None:
    """The installed release of distribution ``library`` (torch's own version for ``"torch"``), ``None`` when not
    installed."""
    if library == "torch":
        return torch.__version__
    if not library:
        return None
    from importlib import metadata

    try:
        return metadata.version(library)
    except metadata.PackageNotFoundError:
        return None


def liger_release() -> str | None:
    """The liger-kernel release the adapter imported (:func:`numcheck.impls.adapters.liger.release`)."""
    from numcheck.impls.adapters import liger

    return liger.release()


#: :attr:`KnownDivergence.outputs` of an entry off in every output.
EVERY_OUTPUT: tuple[str, ...] = ("*",)


@dataclass(frozen=True)
class KnownDivergence:
    """One known divergence, of any kind: of a single-device impl (``applies`` takes the :class:`Problem`) or of a
    distributed one (``applies`` takes its case, a
    :class:`~numcheck.properties.distributed.linear_ce.props.DistCase`, and :attr:`example_world_size` is set);
    off in every output (a covered case is left out of the draws) or in some (:attr:`outputs`, judged under
    :attr:`model` while the case's other outputs keep the impl's own model, so a second defect hiding behind the
    first is still caught)."""

    impls: str  # fnmatch pattern over impl names ("[[]" matches a literal "[")
    properties: tuple[str, ...]  # property names, or ("*",) for every property
    devices: tuple[str, ...]  # device types it was seen on ("cpu", "cuda")
    applies: Callable[[Any], bool]  # the cases it covers: a Problem (a DistCase for a distributed impl's entry)
    reason: str
    example: Problem
    #: ``applies`` reads the problem's data (its tensors), not only its fields: a problem carrying some fields
    #: then says nothing about every draw with those fields (see :func:`covers_every`).
    by_data: bool = False
    #: For a divergence that depends on the process's history (a compile cache), which no single example in a
    #: test worker reproduces: the committed probe (a path from the repo root) that shows it. Its strict check
    #: is skipped, naming the probe.
    history_dependent: str | None = None
    #: For a divergence of a third-party release: the releases it holds for (``None``: every release).
    releases: Releases | None = None
    #: For a ``by_data`` entry: the same predicate on given tensors (``applies`` reads those
    #: :func:`properties.linear_ce.cases.build` draws), for callers whose tensors are not ``build(p)``'s (the
    #: production-shape tier's, :mod:`properties.production.inputs`). ``None``: decidable on ``build(p)`` only.
    applies_to_tensors: Callable[[Problem, Tensors], bool] | None = None
    #: The outputs the release is off in: :data:`EVERY_OUTPUT`, or the names of some outputs.
    outputs: tuple[str, ...] = EVERY_OUTPUT
    #: For an entry of some outputs: the impl's :class:`ErrorModel` mapped to the model of what the release
    #: computes, under which those outputs are judged (``None`` for an entry of every output).
    model: Callable[[ErrorModel], ErrorModel] | None = None
    #: For a distributed impl's entry: the world size its example runs at; such an entry covers every distributed
    #: property (they judge the outputs of one run).
    example_world_size: int | None = None
    #: For a distributed impl's entry: where its example's targets lie
    #: (:attr:`~numcheck.properties.distributed.linear_ce.props.DistCase.placement`).
    example_placement: str = "as_built"
    #: The distribution whose code diverges ("torch", "liger-kernel", "transformer-engine", ...): the report names
    #: it with its installed release (:meth:`release`). Every entry of the tables gives it.
    library: str = ""
    #: What is wrong, in one line (the report's headline and last line; :attr:`reason` is the evidence).
    summary: str = ""
    #: An artifact of this environment (Triton's interpreter), not the library's divergence: the report lists it as
    #: "not judged here" and ``--strict`` does not fail on it. Such an entry holds only where its example is covered
    #: (``applies(example)``: the environment shows the artifact).
    artifact: bool = False

    def __post_init__(self) -> None:
        bad = set(self.devices) - {"cpu", "cuda"}
        if not self.devices or bad:
            raise ValueError(
                f"known divergence {self.impls!r}: devices must be a non-empty subset of "
                f"('cpu', 'cuda'), got {self.devices!r}"
            )
        if not self.outputs or ("*" in self.outputs and self.outputs != EVERY_OUTPUT):
            raise ValueError(
                f"known divergence {self.impls!r}: outputs must be {EVERY_OUTPUT!r} or the names of "
                f"some outputs, got {self.outputs!r}"
            )
        if self.every_output != (self.model is None):
            raise ValueError(
                f"known divergence {self.impls!r}: an entry of some outputs gives the model they are "
                f"judged under (model=...), one of every output none; got outputs={self.outputs!r}"
            )
        if self.example_world_size is not None and self.properties != ("*",):
            raise ValueError(
                f"known divergence {self.impls!r}: a distributed impl's entry covers every property "
                f"(properties=('*',)), got {self.properties!r}"
            )
        if "\n" in self.summary or (
            self.library and self.releases is not None and self.library != self.releases.package
        ):
            raise ValueError(
                f"known divergence {self.impls!r}: summary is one line and library names the package of its "
                f"releases; got library={self.library!r}, summary={self.summary!r}"
            )
        if self.example_world_size is None and self.example_placement != "as_built":
            raise ValueError(
                f"known divergence {self.impls!r}: example_placement is a distributed example's "
                f"(give example_world_size), got {self.example_placement!r}"
            )

    @property
    def every_output(self) -> bool:
        """Whether the release is off in every output (a covered case is left out of the draws)."""
        return self.outputs == EVERY_OUTPUT

    def _about(self, impl_name: str, prop: str, device: str) -> bool:
        """Whether the entry is about this impl and property on ``device``'s type, on the installed release."""
        props_ok = "*" in self.properties or prop in self.properties
        on_device = torch.device(device).type in self.devices
        return (
            fnmatch.fnmatchcase(impl_name, self.impls)
            and props_ok
            and on_device
            and (self.releases is None or self.releases.hold())
        )

    def release(self) -> str | None:
        """The installed release of :attr:`library` this entry is judged against (``None`` when unknown)."""
        return self.releases.installed() if self.releases is not None else library_release(self.library)

    def applies_here(self, impl_name: str, device: str, support: Any = None) -> bool:
        """Whether the entry is about impl ``impl_name`` under some property on ``device``'s type and the installed
        release, and can be reached here: its example's dtype, options and autocast declared by ``support`` (the
        impl's declaration; not checked when ``None``). An artifact's cases are out of the declaration by design:
        it applies where this environment shows it (:attr:`artifact`)."""
        return (
            fnmatch.fnmatchcase(impl_name, self.impls)
            and torch.device(device).type in self.devices
            and (self.releases is None or self.releases.hold())
            and (bool(self.applies(self.example)) if self.artifact else self.declared_by(support, device))
        )

    def declared_by(self, support: Any, device: str) -> bool:
        """Whether ``support`` (``None``: not known) declares the example's dtype, options and autocast on
        ``device``, in any reduction it declares (an entry whose examples all lie outside the declaration here, a
        dtype the impl leaves out on this device, covers nothing here)."""
        if support is None or not hasattr(support, "reductions"):  # not a linear+CE declaration: not checked
            return True
        p = self.example
        return (
            support.refuses(
                dtype=p.param_dtype,
                device=torch.device(device).type,
                options=p.features,
                reduction=p.reduction if p.reduction in support.reductions else next(iter(support.reductions)),
                autocast=p.compute_dtype if p.autocast else None,
            )
            is None
        )

    def finding(self, impl_name: str) -> dict[str, Any]:
        """The entry as a report names it for ``impl_name`` (JSON-ready): impl, library, release, summary, artifact,
        the outputs it is off in and the full reason."""
        return {
            "impl": impl_name,
            "library": self.library,
            "release": self.release() or "unknown",
            "summary": self.summary,
            "artifact": self.artifact,
            "outputs": list(self.outputs),
            "reason": self.reason,
        }

    def matches(self, impl_name: str, prop: str, p: Problem) -> bool:
        return self._about(impl_name, prop, p.device) and self.applies(p)

    def matches_tensors(self, impl_name: str, prop: str, p: Problem, t: Tensors) -> bool:
        """:meth:`matches` for a case whose tensors are ``t`` (not ``build(p)``): a ``by_data`` entry decides on
        ``t`` with :attr:`applies_to_tensors`, and covers nothing when it has none (its data cannot be read)."""
        if not self.by_data:
            return self.matches(impl_name, prop, p)
        if self.applies_to_tensors is None:
            return False
        return self._about(impl_name, prop, p.device) and self.applies_to_tensors(p, t)

    def covers_case(self, impl_name: str, case: Any) -> bool:
        """For a distributed impl's entry: whether it covers ``case`` (a DistCase) of impl ``impl_name``, under
        every property, on the installed release."""
        return self._about(impl_name, "*", case.problem.device) and self.applies(case)


def cce_filtering_may_skip(p: Problem, block_cols: int | None = None, t: Tensors | None = None) -> bool:
    """Whether cut-cross-entropy's default gradient filtering can skip a backward block of ``p``
    (``block_cols``: classes per block; default the installed release's) on tensors ``t`` (default
    ``build(p)``'s).

    The backward kernel tiles (valid rows) × classes into blocks (128 × 128 in 25.1.1; one class wide, the worst
    case, when autotuned or unknown) and skips a block only when *every* |softmax − onehot| in it is below
    filter_eps = finfo(dtype).eps/32 (padded lanes are 0). The classes of a block are not contiguous: with
    filtering on, the forward averages each class's logit over the call's rows and the backward takes the
    classes in that order (``cce.py:31,87``: ``argsort(logit_avg)``), so that low classes share blocks. Which
    rows and classes share a block therefore depends on the call (two_calls' halves, a permutation). Every
    skip needs one valid row with at least as many entries below the threshold as the smallest block has
    classes (V mod 128, else 128), and this asks exactly that, on the float64 softmax of the problem's own
    operands with a 2× margin for the kernel's fp32 evaluation: it follows the data (confident rows, V past
    ~1/filter_eps), not a regime name. The rows are taken :data:`FILTER_ROW_ELEMENTS` logits at a time
    (one block for every drawn problem of the suite; a production shape never forms [N, V] in float64), and
    the answer is the first block's that has such a row."""
    from numcheck.impls.adapters import cce
    from numcheck.properties.linear_ce.cases import build

    cols = block_cols or getattr(cce.load(), "backward_block_cols", None) or 1
    t = build(p) if t is None else t
    valid = t.target != p.ignore_index
    if not bool(valid.any()):
        return False
    x, w = t.x[valid], t.weight.double()
    y = t.target[valid].long()
    need = min(p.V % cols or cols, p.V)  # the smallest block's classes
    step = max(1, FILTER_ROW_ELEMENTS // p.V)
    for r0 in range(0, x.shape[0], step):
        z = x[r0 : r0 + step].double() @ w.T + (t.bias.double() if t.bias is not None else 0.0)
        if p.softcap is not None:
            z = p.softcap * torch.tanh(z / p.softcap)
        g = z.softmax(dim=-1)
        g[torch.arange(g.shape[0], device=g.device), y[r0 : r0 + step]] -= 1.0
        small = (g.abs() < 2 * torch.finfo(p.compute_dtype).eps / 32).sum(dim=1)
        if bool((small >= need).any()):
            return True
    return False


#: Logits (rows × V) :func:`cce_filtering_may_skip` forms in float64 at once (1 GiB).
FILTER_ROW_ELEMENTS = 2**27


def liger_z_loss_buffer(p: Problem) -> tuple[float, float]:
    """``(unbuffered, buffered)`` returned z-loss of ``p`` on the logits Liger computes (the product of the
    problem's own low-precision operands rounded to their dtype, softcap applied): the float64 sum of the rows'
    ``λ·lse²`` (divided by the non-ignored count under ``mean``), and what Liger's input-dtype buffer makes of it
    (each row rounded to the dtype, their sum taken in fp32 and rounded to the dtype, as ``torch.sum`` of an fp16
    or bf16 tensor does). The buffered value equals Liger's output bit for bit on the measured fp16 cases
    (docs/evidence/liger_fp16_z_loss.py)."""
    from numcheck.properties.linear_ce.cases import build

    t = build(p)
    low = p.compute_dtype
    valid = t.target != p.ignore_index
    n = int(valid.sum())
    z = t.x[valid].double() @ t.weight.double().T + (t.bias.double() if t.bias is not None else 0.0)
    z = z.to(low).double()
    if p.softcap is not None:
        z = p.softcap * torch.tanh(z / p.softcap)
    rows = p.z_loss_scale * z.logsumexp(dim=-1) ** 2 / (max(n, 1) if p.reduction == "mean" else 1)
    return float(rows.sum()), float(_kernel_store(rows.float(), low).float().sum().to(low))


def _kernel_store(v: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """fp32 values ``v`` as a Triton kernel's ``tl.store`` into a ``dtype`` buffer leaves them: rounded to nearest,
    except bf16 under Triton's interpreter, which truncates toward zero (measured with Triton 3.9: 526 of 1024
    uniform values differ from round-to-nearest, every one below it; fp16 stores round to nearest)."""
    from numcheck.impls import interpreter

    if dtype == torch.bfloat16 and interpreter.active():
        return (v.contiguous().view(torch.int32) & ~0xFFFF).view(torch.float32).to(torch.bfloat16)
    return v.to(dtype)


#: Unit roundoff of the dtypes Liger's z-loss buffer can have.
_BUFFER_U = {"float16": 2.0**-11, "bfloat16": 2.0**-8}


def liger_z_loss_buffer_diverges(p: Problem) -> bool:
    """Whether Liger's input-dtype z-loss buffer moves the returned z-loss of ``p`` beyond what the returned
    value's own rounding explains: the buffered value (:func:`liger_z_loss_buffer`) not finite where the
    unbuffered one is (an fp16 sum past 65504), or off it by more than its limit.

    fp16 (limit (2u + n·2⁻²⁴)·Σ, u = 2⁻¹¹): with every row normal each is rounded to within u of itself (rows are
    positive, so together within u·Σ), the fp32 sum adds at most n·2⁻²⁴·Σ and the fp16 result one more u; beyond
    that needs rows below fp16's smallest normal 2⁻¹⁴, kept to an absolute 2⁻²⁵ (the ``mean`` of many rows).
    bf16 (limit (u + n·2⁻²⁴)·Σ, u = 2⁻⁸): bf16 has fp32's range, so no row is subnormal, but the tolerance
    model allows the returned z-loss one rounding in its dtype, not a rounding of every row before the sum: a
    buffer error beyond one rounding of the result is the buffer's. Under Triton's interpreter the bf16 rows are
    truncated (:func:`_kernel_store`), so their errors add up in one direction (seen at 1.12–1.14× the bound,
    N = 37 and 64).
    Low-precision parameters only (under AMP the input, and so the buffer, stay fp32); ``none`` returns the
    rows themselves, each rounded once."""
    u = _BUFFER_U.get(p.dtype)
    if u is None or p.autocast is not None or p.z_loss_scale == 0 or p.reduction == "none":
        return False
    if p.ignored >= 1.0:
        return False
    exact, buffered = liger_z_loss_buffer(p)
    if not math.isfinite(buffered):
        return math.isfinite(exact)
    slack = 2 * u if p.dtype == "float16" else u
    return abs(buffered - exact) > (slack + p.N * 2.0**-24) * abs(exact)


def liger_unit_upstream_overflow(p: Problem, t: Tensors | None = None) -> bool:
    """Whether a gradient of ``p`` for a unit upstream gradient overflows fp16 where Liger keeps it: Liger's
    forward computes grad_x, grad_W and grad_b for an upstream of 1 and stores them in the parameters' dtype
    (``grad_weight.to(weight.dtype)`` after its fp32 accumulator, with ``accum_dtype=torch.float32`` too); its
    backward then multiplies them by the upstream u (``element_mul_kernel``). For fp16 parameters an entry whose
    exact unit-upstream value |g/u| passes fp16's overflow threshold is ±inf before the multiplication, though the
    exact u·(g/u) may fit: on the H200, ``Problem(N=2049, H=8, V=2, dtype='float16', reduction='sum',
    class_weights=True, upstream='scalar', regime='post_norm', seed=336811)`` (u = 0.648) gave grad_W −inf where
    the oracle's value is −48199 (its unit-upstream value −74335). Scalar upstream of ``mean``/``sum`` only (``none``
    has a per-row upstream Liger does not pre-multiply in the same way); fp16 parameters only (bf16 has fp32's
    range; under AMP the parameters, and so the stored gradients, are fp32)."""
    from numcheck.properties.core.compare import overflow_threshold
    from numcheck.properties.linear_ce.harness import run_oracle
    from numcheck.properties.linear_ce.cases import build

    if p.dtype != "float16" or p.autocast is not None or p.upstream == "one" or p.reduction == "none" or p.N == 0:
        return False
    t = t if t is not None else build(p)
    u = float(t.upstream.double().abs().max())
    if not (u > 0 and math.isfinite(u)):
        return False
    ref = run_oracle(p, t)
    limit = overflow_threshold(torch.float16)
    grads = [g for g in (ref.grad_x, ref.grad_weight, ref.grad_bias) if g is not None]
    return any(bool(((g.abs() / u >= limit) & (g.abs() < limit)).any()) for g in grads)  # inf where it fits


def half_all_ignored_mean(p: Problem) -> bool:
    """Whether one of the two halves :func:`properties.linear_ce.props.two_calls` splits ``p`` into (rows [0, N/2) and
    [N/2, N)) is an all-ignored ``mean`` call."""
    from numcheck.properties.linear_ce.cases import build

    if p.reduction != "mean" or p.N < 2 or p.N % 2 or p.ignored == 0:
        return False
    valid = build(p).target != p.ignore_index
    k = p.N // 2
    return not bool(valid[:k].any()) or not bool(valid[k:].any())


def te_release() -> str | None:
    """The TransformerEngine release the adapter loaded (:func:`numcheck.impls.adapters.transformer_engine.release`)."""
    from numcheck.impls.adapters import transformer_engine

    return transformer_engine.release()


def te_ignored_rows_counted(p: Problem) -> bool:
    """Whether ``p`` is a ``mean`` with some rows ignored and some not (V > 1: at V = 1 every loss and gradient is
    0, whatever the normalizer): there TransformerEngine 2.4–2.11 divides by all N rows, not the non-ignored ones."""
    if p.reduction != "mean" or p.V < 2 or p.ignored == 0 or p.ignored >= 1.0:
        return False
    from numcheck.properties.linear_ce.cases import build

    n_valid = int((build(p).target != p.ignore_index).sum())
    return 0 < n_valid < p.N


def te_per_row_upstream_dropped(p: Problem) -> bool:
    """Whether ``p`` is a ``none`` call whose per-row upstream gradient differs between rows (V > 1): TE before 2.8
    scales every row's gradient by the first row's upstream."""
    if p.reduction != "none" or p.upstream != "per_row" or p.N < 2 or p.V < 2:
        return False
    from numcheck.properties.linear_ce.cases import build

    up = build(p).upstream
    return up is not None and bool((up != up.reshape(-1)[0]).any())


def te_gradient_stored_in_logits(p: Problem, t: Tensors | None = None) -> Any:
    """The outputs TransformerEngine ≤ 2.17's fused CE gives on ``p``'s bf16 logits, emulated with exact arithmetic
    except its stores into the logits' dtype: forward stores ``(p_j − ε/V)/n`` (``mean``; ``none``: not divided)
    in the logits buffer, then adds ``−(1 − ε)/n`` to the target entry read back from it and stores that again;
    backward multiplies each stored entry by the upstream gradient and stores the product (skipped for a scalar
    upstream of exactly 1). Each store rounds as a Triton kernel's does here (:func:`_kernel_store`: to nearest,
    truncated under the interpreter). The loss is the float64 oracle's (these stores do not touch it); the GEMM's
    backward is exact and rounded once, as the model allows. ``n`` is the non-ignored count (2.12's normalizer;
    before 2.12 a case with ignored rows is :func:`te_ignored_rows_counted`'s); for ``none`` before 2.5 it is N,
    as those releases divide ``reduce_loss=False``'s gradient by the rows too (their entry in :data:`KNOWN`, which
    leaves V = 1 to this one: there the division is all that reaches the outputs, through these stores)."""
    import torch.nn.functional as F

    from numcheck.properties.linear_ce.harness import ImplOutputs, run_oracle
    from numcheck.properties.linear_ce.cases import build

    t = t if t is not None else build(p)
    low = t.weight.dtype
    b = t.bias.to(low) if t.bias is not None else None
    z = F.linear(t.x, t.weight, b).double()
    valid = t.target != p.ignore_index
    mean = p.reduction == "mean"
    n = max(int(valid.sum()), 1) if mean else (p.N if _te_divides_none_by_rows() else 1)
    eps = p.label_smoothing
    g = _kernel_store(((torch.softmax(z, dim=-1) - eps / p.V) / n).float(), low).double()
    rows = torch.arange(p.N, device=z.device)
    y = torch.where(valid, t.target, torch.zeros_like(t.target))
    g[rows, y] = _kernel_store((g[rows, y] - (1 - eps) / n).float(), low).double()
    g = torch.where(valid[:, None], g, torch.zeros_like(g))
    up = t.upstream
    if up is not None and not (up.numel() == 1 and float(up) == 1.0):
        scale = up.double().reshape(-1, 1) if not mean else up.double().reshape(1, 1)
        g = _kernel_store((g * scale).float(), low).double()
    ref = run_oracle(p, t, all_ignored="zero")
    return ImplOutputs(
        loss=ref.loss.float(),
        z_loss=None,
        grad_x=(g @ t.weight.double()).to(low),
        grad_weight=(g.T @ t.x.double()).to(low),
        grad_bias=g.sum(0).to(low).to(t.bias.dtype) if t.bias is not None else None,
    )


def _te_divides_none_by_rows() -> bool:
    """Whether the loaded TransformerEngine release divides ``reduce_loss=False``'s gradient by the row count
    (before 2.5)."""
    release = te_release()
    return release is not None and Version(release) < Version("2.5")


def te_prerounded_gradient_fails(p: Problem, t: Tensors | None = None) -> bool:
    """Whether the stores of :func:`te_gradient_stored_in_logits` alone take ``p`` past the suite's accuracy
    judgement of the TE impl (bf16 parameters without autocast; fp32 stores are the model's own roundings)."""
    if p.dtype != "bfloat16" or p.autocast is not None or p.N == 0:
        return False
    from numcheck.impls.adapters import transformer_engine
    from numcheck.properties.linear_ce.accuracy import check_accuracy

    info = transformer_engine.load()
    if isinstance(info, str):
        return False
    mean = p.reduction == "mean"
    impl = transformer_engine.build_impl("te_parallel_ce[mean]" if mean else "te_parallel_ce[none]", mean, False, info)
    from numcheck.properties.linear_ce.cases import build

    t = t if t is not None else build(p)
    return not check_accuracy(impl, p, t=t, out=te_gradient_stored_in_logits(p, t)).ok


#: The example of :func:`liger_unit_upstream_overflow` (no class weights: Liger's weighted path does not run under
#: the Triton interpreter, and the strict check runs on the CPU too).
EXAMPLE_UNIT_UPSTREAM = Problem(
    N=2049, H=8, V=2, dtype="float16", reduction="sum", upstream="scalar", regime="post_norm", seed=790
)

#: The built-ins whose CE is ``F.cross_entropy`` itself: they share its divergences.
F_CROSS_ENTROPY_IMPLS = ("eager", "torch_native[[]reference[]]")

KNOWN: list[KnownDivergence] = [
    KnownDivergence(
        impls="torch_native[[]chunked,*",
        properties=("*",),  # every property that judges gradients (strided and frozen inputs showed it too)
        devices=("cpu",),
        applies=lambda p: p.all_ignored and p.reduction == "mean",
        library="torch",
        summary="chunked F.linear_cross_entropy gives NaN gradients for an all-ignored 'mean' batch",
        reason=(
            "PyTorch's chunked F.linear_cross_entropy (2.13) gives NaN gradients for an all-ignored 'mean' "
            "batch, where its reference path and F.cross_entropy give zero gradients (NaN loss)."
        ),
        example=Problem(N=8, H=16, V=24, ignored=1.0, reduction="mean"),
    ),
    KnownDivergence(
        impls="torch_native[[]chunked,*",
        properties=("two_calls",),
        devices=("cpu",),
        applies=half_all_ignored_mean,
        library="torch",
        summary="chunked F.linear_cross_entropy's NaN gradients reach W's when one of two calls is all-ignored 'mean'",
        reason=(
            "The same NaN gradients of an all-ignored 'mean' call (PyTorch's chunked F.linear_cross_entropy, "
            "2.13) when one of two_calls' halves is all-ignored: its NaN reaches the shared W's gradient."
        ),
        example=Problem(N=2, H=1, V=1, ignored=0.25, reduction="mean", seed=0),
        by_data=True,
    ),
    KnownDivergence(
        impls="torch_native[[]chunked,*",
        properties=("accuracy",),
        devices=("cpu",),
        applies=lambda p: p.regime == "confident" and p.N >= 1024,
        library="torch",
        summary="chunked F.linear_cross_entropy loses grad_weight on confident rows over long fp32 batches",
        reason=(
            "PyTorch's chunked F.linear_cross_entropy (2.13, every acc_policy) loses grad_weight on confident "
            "rows over long batches (fp32, V=2, p_target > 0.9996): at N=2049 a 23% error, 1.6x the hard "
            "bound, where its reference path and eager sit at 0.002x. Summing softmax^T x and onehot^T x apart "
            "and subtracting reproduces it ((p - y)^T x does not), so the two parts are likely not cancelled "
            "before the sum over rows. How far past the bound depends on the CPU's fp32 GEMM summation order: "
            "on a Xeon with AMX (oneDNN) the same N=2049 case is at 0.52x and N=131073 at 0.67-1.85x by seed, "
            "eager at 0.005x; the example (N=131073, seed 0) is 1.85x there with 1 or 2 threads."
        ),
        # N=2049 seed 0 was the example until a CPU with a more accurate fp32 GEMM ran it at 0.52x (above).
        example=Problem(N=131073, H=4, V=2, regime="confident", seed=0),
    ),
    KnownDivergence(
        impls="torch_native[[]chunked,*",
        properties=("*",),
        devices=("cpu",),
        # measured worst loss error/bound at H=1, V=65 (acc=accurate, 4 seeds): N=32 0.71, N=64 1.34, N=96 1.05;
        # (acc=balanced, 8 seeds): N=32 0.55, N=64 1.13; fp16 ≤ 0.19. Seed 4 at N=64 fails every acc policy.
        applies=lambda p: p.dtype == "bfloat16" and p.autocast is None and p.N >= 32,
        library="torch",
        summary="chunked F.linear_cross_entropy's bf16 loss is up to 2.2% off (row losses summed in bf16)",
        reason=(
            "PyTorch's chunked F.linear_cross_entropy (2.13, bf16, mean and sum, every acc_policy) returns a "
            "loss up to 2.2% off: the example (N=64) gives 5.8125 for 5.9426, 1.34x a bound that allows one "
            "bf16 rounding of an fp32-accumulated sum, where its reference path and eager sit at 0.04x and its "
            "gradients are within bounds: consistent with the row losses being summed in bf16."
        ),
        example=Problem(N=64, H=1, V=65, dtype="bfloat16", seed=4),
    ),
    KnownDivergence(
        impls="liger[[]*",
        properties=("frozen_x",),
        devices=("cpu", "cuda"),
        applies=lambda p: True,
        library="liger-kernel",
        summary="with x frozen and the weight trainable, weight.grad stays None (no gradient at all)",
        reason=(
            "Liger-Kernel's fused linear cross-entropy (0.6.3 on, since its #906 'Filter out redundant "
            "ops/allocations in no_grad mode') computes every gradient only when the input requires grad "
            "(ops/fused_linear_cross_entropy.py: input_requires_grad gates the grad_weight / grad_bias "
            "buffers): with x frozen and the weight trainable (linear probing on a frozen backbone) the loss "
            "has a graph but weight.grad stays None, silently. Measured on 0.7.0, 0.8.2 and 0.8.5; 0.2.1 and "
            "0.5.8 give the right gradients."
        ),
        example=Problem(N=1, H=1, V=1),
        releases=Releases("liger-kernel", ">=0.6.3", liger_release),
    ),
    KnownDivergence(
        impls="liger[[]*",
        properties=("*",),
        devices=("cpu", "cuda"),
        applies=liger_z_loss_buffer_diverges,
        library="liger-kernel",
        summary="the returned z-loss is kept in the input dtype: fp16/bf16 rows rounded before the sum, inf under 'sum'",
        reason=(
            "Liger-Kernel (0.5.3 on, since return_z_loss was added) keeps the returned z-loss in the input "
            "dtype: each row's lse_square_scale*lse^2 (divided by the non-ignored count under 'mean') is "
            "stored in an fp16 buffer (ops/fused_linear_cross_entropy.py: z_loss_1d = torch.zeros(BT, "
            "dtype=_input.dtype)) and torch.sum of that buffer gives an fp16 result, while the loss itself "
            "is kept in fp32. Under 'mean' over many rows the per-row values are fp16 subnormals: the example "
            "(N=256, z_loss_scale=1e-4) returns 4.7565e-5 for 4.9871e-5 (4.6% off), N=2049 7.9155e-4 for "
            "7.9632e-4 (3.7x the bound), and the per-row values rounded to fp16 and summed give Liger's "
            "numbers bit for bit; under 'sum' the z-loss overflows to inf (N=2049, z_loss_scale=0.5, "
            "regime='large': exact 3.19e6, the fp32 loss finite). Measured on 0.5.8, 0.7.0, 0.8.2 and 0.8.5 "
            "(docs/evidence/liger_fp16_z_loss.py). bf16 parameters get a bf16 buffer: each row rounded at "
            "2^-8 before the sum, beyond the one rounding of the result the model allows (1.03-1.14x the "
            "bound at N=37-50 in the covering rows)."
        ),
        example=Problem(N=256, H=1, V=2, dtype="float16", z_loss_scale=1e-4, seed=0),
        by_data=True,
        releases=Releases("liger-kernel", ">=0.5.3", liger_release),
    ),
    *[
        KnownDivergence(
            impls=pattern,
            properties=("*",),
            devices=("cpu", "cuda"),
            applies=lambda p: p.dtype == "float16" and p.autocast is None and p.label_smoothing > 0,
            library="torch",
            summary="F.cross_entropy with label smoothing on fp16 logits sums the smoothing term in fp16: inf loss",
            reason=(
                "F.cross_entropy with label smoothing on fp16 logits sums the smoothing term Σ_j −log p_ij over "
                "rows and classes in fp16: once N·V·|log p| passes fp16's 65504 (N=96, V=127 with ordinary logits "
                "at H=1 does) the loss is inf where the true mean is ~6.5."
            ),
            example=Problem(N=64, H=1, V=13, dtype="float16", label_smoothing=0.1, regime="confident", seed=0),
        )
        for pattern in F_CROSS_ENTROPY_IMPLS
    ],
    *[
        KnownDivergence(
            impls=pattern,
            properties=("accuracy",),
            devices=("cpu",),
            # whether the row losses sum past 65504 depends on the draw; every fp16 'mean' over >= 1024 rows may
            applies=lambda p: p.dtype == "float16" and p.autocast is None and p.reduction == "mean" and p.N >= 1024,
            library="torch",
            summary="F.cross_entropy on CPU fp16 'mean' returns inf once the row losses sum past 65504",
            reason=(
                "F.cross_entropy on CPU fp16 logits with reduction='mean' returns inf once the sum of the row "
                "losses passes fp16's 65504, though the mean is representable: 2049 rows of loss 43 give inf "
                "(the same logits in fp32 give 43)."
            ),
            example=Problem(N=2049, H=1, V=2, dtype="float16", regime="large", seed=0),
        )
        for pattern in F_CROSS_ENTROPY_IMPLS
    ],
    KnownDivergence(
        impls="liger[[]accum=fp32[]]",
        properties=("*",),
        devices=("cpu", "cuda"),
        applies=liger_unit_upstream_overflow,
        library="liger-kernel",
        summary="unit-upstream gradients are stored in fp16 before the upstream multiply: inf where the gradient fits",
        reason=(
            "Liger-Kernel computes the gradients for an upstream gradient of 1 in its forward and stores them in "
            "the parameters' dtype, multiplying by the real upstream u only in backward: with accum_dtype=fp32 "
            "and fp16 parameters the fp32 accumulator's unit-upstream grad_W is cast to fp16 first, so an entry "
            "past 65504 is ±inf though u times it fits (seen on the H200, CUDA seed 0: grad_W −inf for an exact "
            "−48199 with u = 0.648; the example, seed 790, covered under torch 2.6 and 2.13, whose upstream "
            "draws differ, on the CPU too: −inf for −20447, u = 0.275; "
            ":func:`liger_unit_upstream_overflow`). With accum_dtype=None the fp16 accumulator is declared, and "
            "its overflowing running sum is the model's legitimate overflow."
        ),
        example=EXAMPLE_UNIT_UPSTREAM,
        by_data=True,
        applies_to_tensors=liger_unit_upstream_overflow,
        releases=Releases("liger-kernel", ">=0.8.5", liger_release),
    ),
    KnownDivergence(
        impls="cce[[]filter_eps=*",
        properties=("*",),
        devices=("cuda",),
        applies=lambda p: p.softcap is not None,
        library="cut-cross-entropy",
        summary="softcap lets the padded vocabulary lanes into the log-sum-exp: wrong loss unless V is a multiple of 128",
        reason=(
            "cut-cross-entropy 25.1.1's kernels with softcap let the padded vocabulary lanes of a 128-class "
            "block, capped at s·tanh(-inf/s) = -s, into the log-sum-exp: the example (N=H=V=1, softcap=1; "
            "exact loss 0, zero gradients) gave loss 4.57 and gradients 0.28 / -0.74 on an H200; the loss is off "
            "at every V not a multiple of 128 (4.4 at V=1, 0.22 at V=129, 0.002 at V=127) and right at V=128 "
            "and 256 (docs/evidence/cce_softcap.txt). With softcap=5 the leak is e^-5-sized and can pass the "
            "bounds."
        ),
        example=Problem(N=1, H=1, V=1, dtype="bfloat16", softcap=1.0),
    ),
    KnownDivergence(
        impls="cce[[]filter_eps=default[]]",
        properties=("*",),
        devices=("cuda",),
        applies=cce_filtering_may_skip,
        library="cut-cross-entropy",
        summary="default gradient filtering zeroes grad_x/grad_weight entries below finfo(dtype).eps/32 (inexact by design)",
        reason=(
            "cut-cross-entropy's default gradient filtering (filter_eps='high' = finfo(dtype).eps/32) skips "
            "every backward block whose |softmax - onehot| are all below it, so those grad_x / grad_weight "
            "entries come back zero: on confident rows (the example), and at V=1025 with ordinary logits for "
            "640 of 1025 grad_weight rows. Inexact by design (filter_eps=None is exact); every property "
            "compares against exact gradients, so each case with some entry below the threshold is covered."
        ),
        example=Problem(N=16, H=32, V=256, dtype="bfloat16", regime="confident", seed=0),
        by_data=True,
        applies_to_tensors=lambda p, t: cce_filtering_may_skip(p, t=t),
    ),
    KnownDivergence(
        impls="cce[[]impl=torch_compile[]]",
        # any test under AMP: which draws a worker ran earlier decides which graph a call finds compiled
        properties=("*",),
        devices=("cuda",),
        applies=lambda p: p.autocast is not None,
        library="cut-cross-entropy",
        summary="impl='torch_compile' reuses the graph compiled under the other autocast dtype",
        reason=(
            "cut-cross-entropy's impl='torch_compile' (a torch.compile'd F.linear + F.cross_entropy) reuses "
            "the graph compiled under one autocast dtype when the same process calls it under the other: on "
            "an H200 with torch 2.11 an fp16 call after a bf16 one returns bf16 eager's loss and grad_x (to "
            "1e-6), 3.4e-3 from fp16 eager's (torch 2.13 on CPU recompiles). Which graph a call finds depends "
            "on the process's compile history (a bf16 call after an fp16 one was wrong too, in a worker with "
            "other graphs compiled), so every AMP case is covered and no single example reproduces it in a "
            "test worker. docs/evidence/cce_compile_autocast.py shows it in a fresh process."
        ),
        example=Problem(N=35, H=16, V=61, dtype="float32", autocast="float16", seed=0),
        history_dependent="docs/evidence/cce_compile_autocast.py",
    ),
    KnownDivergence(
        impls="te_parallel_ce[[]*",
        properties=("*",),
        devices=("cpu", "cuda"),
        applies=lambda p: True,
        library="transformer-engine",
        summary="the backward of every call passing ignore_idx raises (5 gradients for 6 inputs)",
        reason=(
            "TransformerEngine 2.4.0-2.6.0.post1: CrossEntropyFunction.forward takes six inputs (ignore_idx was "
            "added in 2.4) but its backward still returns five gradients, so the backward of every call that "
            "passes ignore_idx raises 'function CrossEntropyFunctionBackward returned an incorrect number of "
            "gradients (expected 6, got 5)' (a call leaving it at its default passes five inputs and runs; the "
            "adapter passes it, as the declared ignore_index option needs): the documented ignore_idx cannot be "
            "trained through. 2.7 returns one per input. Measured on 2.4.0, 2.5.0, 2.6.0 and 2.6.0.post1 "
            "(docs/evidence/te_releases.txt); the same holds with TE's core installed (autograd raises it)."
        ),
        example=Problem(N=4, H=8, V=13, seed=0),
        releases=Releases("transformer-engine", ">=2.4,<2.7", te_release),
    ),
    KnownDivergence(
        impls="te_parallel_ce[[]none*",
        properties=("*",),
        devices=("cpu", "cuda"),
        applies=lambda p: p.reduction == "none" and p.N > 1 and p.V > 1,
        library="transformer-engine",
        summary="reduce_loss=False's gradient is divided by the row count (every gradient 1/N of the right one)",
        reason=(
            "TransformerEngine before 2.5 divides the gradient of reduce_loss=False (per-row losses) by the "
            "number of rows, as if the loss were their mean (cross_entropy_kernel: the softmax and the target's "
            "-(1-eps) are divided by n_non_ignore = n_rows whatever reduce_loss), while the loss it returns is "
            "the per-row one: every gradient 1/N of the right one (grad_x 3e5 times its bound at N = 7). 2.5 "
            "divides only for reduce_loss=True. Measured on 2.2.0 and 2.3.0; 2.4's code is the same but its "
            "backward raises first (the entry above)."
        ),
        example=Problem(N=7, H=8, V=13, reduction="none", seed=3),
        releases=Releases("transformer-engine", ">=2.2,<2.5", te_release),
    ),
    KnownDivergence(
        impls="te_parallel_ce[[]none*",
        properties=("*",),
        devices=("cpu", "cuda"),
        applies=te_per_row_upstream_dropped,
        library="transformer-engine",
        summary="reduce_loss=False scales every row's gradient by the first row's upstream gradient",
        reason=(
            "TransformerEngine before 2.8 scales the gradient of reduce_loss=False by the first row's upstream "
            "gradient for every row (element_mul_kernel loads grad_output_ptr without a row offset): a weighted "
            "per-token loss gets wrong gradients, and zero gradients everywhere when the first weight is 0. Fixed "
            "by TE pull request #2139 ('fix cross entropy vanishing gradients', Megatron-LM issue #1750), in 2.8. "
            "Measured on 2.2.0, 2.3.0 and 2.7.0 (grad_x 2.7e7 times its bound at N = 7); 2.4-2.6's backward "
            "raises first."
        ),
        example=Problem(N=7, H=8, V=13, reduction="none", upstream="per_row", seed=3),
        by_data=True,
        releases=Releases("transformer-engine", ">=2.2,<2.8", te_release),
    ),
    KnownDivergence(
        impls="te_parallel_ce[[]mean*",
        properties=("*",),
        devices=("cpu", "cuda"),
        applies=te_ignored_rows_counted,
        library="transformer-engine",
        summary="reduce_loss=True divides the loss and its gradient by all rows, ignored ones included",
        reason=(
            "TransformerEngine 2.4-2.11's reduce_loss=True divides the loss and its gradient by all N rows, "
            "ignored ones included (its docstring: 'averaged across the B*SQ dimension'), not by the non-ignored "
            "count as torch's mean does: with 3 of 7 rows ignored the loss is 4/7 of the mean (2.2e5 times the "
            "bound). 2.12 counts the non-ignored rows in the kernel (TE pull request #2476, 'fix ce loss "
            "calculation when some tokens are ignored'). Measured on 2.7.0, 2.8.0 and 2.11.0; 2.4-2.6's backward "
            "raises first; 2.2 and 2.3 have no ignore_idx."
        ),
        example=Problem(N=7, H=8, V=13, ignored=0.4, seed=2),
        by_data=True,
        releases=Releases("transformer-engine", ">=2.4,<2.12", te_release),
    ),
    KnownDivergence(
        impls="te_parallel_ce[[]*",
        properties=("*",),
        devices=("cpu", "cuda"),
        applies=te_prerounded_gradient_fails,
        library="transformer-engine",
        summary="the gradient is kept in the bf16 logits buffer: confident rows lose the target's gradient",
        reason=(
            "TransformerEngine before 2.18 keeps the gradient in the bf16 logits buffer from forward on: it "
            "stores p_j/n rounded to bf16, reads the target's entry back and subtracts (1-eps)/n, and backward "
            "multiplies the stored entries by the upstream gradient and rounds again. On a confident row p_y "
            "rounds to 1, so the target's gradient p_y - 1 = -(1 - p_y) is lost (grad_x and grad_W 190-200 times "
            "their bounds on the example, every row's target leading by 8 + log V). 2.18 stores the gradient in "
            "fp32 ('so it is not quantized before backward'). Covered: bf16 cases where those stores alone, "
            "emulated exactly (te_gradient_stored_in_logits), fail the judgement. Measured on 2.2.0, 2.7.0, "
            "2.8.0, 2.11.0, 2.12.0 and 2.17.1 (docs/evidence/te_releases.txt)."
        ),
        example=Problem(N=7, H=8, V=13, dtype="bfloat16", regime="confident", seed=4),
        by_data=True,
        applies_to_tensors=te_prerounded_gradient_fails,
        releases=Releases("transformer-engine", ">=2.2,<2.18", te_release),
    ),
]


def covers_every(impl_name: str, prop: str, fields: Problem) -> KnownDivergence | None:
    """The entry that covers every draw sharing the forced ``fields`` of a test (one decided by fields alone)."""
    for k in KNOWN:
        if not k.by_data and k.matches(impl_name, prop, fields):
            return k
    return None


def known(impl_name: str, prop: str, p: Problem) -> KnownDivergence | None:
    """The entry covering this impl, property and case, if any."""
    for k in KNOWN:
        if k.matches(impl_name, prop, p):
            return k
    return None


def known_on_tensors(impl_name: str, prop: str, p: Problem, t: Tensors) -> KnownDivergence | None:
    """The entry covering this impl, property and case whose tensors are ``t`` (:meth:`KnownDivergence.matches_tensors`)."""
    for k in KNOWN:
        if k.matches_tensors(impl_name, prop, p, t):
            return k
    return None


def interpreter_bf16_constant_wrong() -> bool:
    """Whether Triton's interpreter runs the kernels here and gets a bf16 value plus a Python float constant wrong
    (:func:`numcheck.impls.adapters.transformer_engine.interpreter_bf16_constant`)."""
    from numcheck.impls.adapters import transformer_engine

    got = transformer_engine.interpreter_bf16_constant()
    return got is not None and got != 1.75


#: Environment artifacts: what cannot be judged here because of the environment, not the library (the report lists
#: them as "not judged here"; ``--strict`` does not fail on them). Their cases are already out of the impl's
#: declaration here (the adapter leaves the dtype out with the reason), so the suite never draws them; these entries
#: name them beside the library's divergences.
ARTIFACTS: tuple[KnownDivergence, ...] = (
    KnownDivergence(
        impls="te_*[[]none*",
        properties=("*",),
        devices=("cpu",),
        applies=lambda p: p.dtype == "bfloat16" and interpreter_bf16_constant_wrong(),
        library="transformer-engine",
        summary="bf16 not judged: Triton's interpreter adds a float constant to a bf16 value wrongly, as this kernel does",
        reason=(
            "Interpreter artifact, not a TE defect (impls/adapters/transformer_engine.py, interpreter_limits): under "
            "Triton's interpreter a bf16 value plus a Python float constant comes back as garbage (0.25 + 1.5 gives "
            "6.4e37 with triton 3.9), and TE 2.5-2.17's reduce_loss=False kernel adds -(1 - label_smoothing) to the "
            "bf16 gradient it keeps in the logits buffer, so its bf16 gradients are ~1e37 here; compiled on an H200 "
            "the same releases are within 2e-3 of float64. The adapter leaves bf16 out of the declaration here."
        ),
        example=Problem(N=7, H=8, V=13, dtype="bfloat16", reduction="none", seed=0),
        releases=Releases("transformer-engine", ">=2.5,<2.18", te_release),
        artifact=True,
    ),
)

#: The libraries numcheck's adapters call, by impl name (fnmatch pattern): whose release a report judged.
ADAPTER_LIBRARIES: tuple[tuple[str, str, Callable[[], str | None]], ...] = (
    ("te_*", "transformer-engine", te_release),
    ("liger[[]*", "liger-kernel", liger_release),
    ("cce[[]*", "cut-cross-entropy", lambda: library_release("cut-cross-entropy")),
    ("megatron_*", "megatron-core", lambda: library_release("megatron-core")),
    ("torch_native[[]*", "torch", lambda: library_release("torch")),
    ("torchao_float8[[]*", "torchao", lambda: _torchao_release()),
)


def _torchao_release() -> str | None:
    """The torchao release the adapter imported (:func:`numcheck.impls.adapters.torchao.release`)."""
    from numcheck.impls.adapters import torchao

    return torchao.release()


def adapter_library(impl_name: str) -> tuple[str, str | None] | None:
    """``(library, installed release)`` of the third-party library numcheck's adapter ``impl_name`` calls, or
    ``None`` for an impl that is no adapter of one."""
    for pattern, library, release in ADAPTER_LIBRARIES:
        if fnmatch.fnmatchcase(impl_name, pattern):
            return library, release()
    return None
