"""``liger_preference[<loss>]``: adapters for Liger-Kernel's chunked preference losses
(``liger_kernel.chunked_loss``: ``LigerFusedLinear{DPO,ORPO,CPO,SimPO,KTO}Function``), for whatever release is
installed, as impls of the linear+preference kind (:mod:`impls.protocols.linear_preference`).

Each release's ``forward`` signature is read (:mod:`impls.adapters.function_args`) and every call laid out by
name; an option is declared only where its parameter exists (``alpha``, ``label_smoothing``, ``gamma``,
``average_log_prob``, ``loss_type``), so a release without one is judged without it, with the reason in the impl's
description. Semantics, read from Liger's source (``fused_linear_preference.py`` and the loss modules) and pinned
against :mod:`reference.linear_preference` by ``tests/adapters/test_liger_preference.py``:

- layout ``halves`` (the chosen completions stacked first), pair losses summed and divided by the number of pairs
  (``mean``), the NLL term summed over the chosen completions' non-ignored positions and divided by their count
  (``tokens``), weighted by ``alpha`` (ORPO has no ``alpha``: its NLL weight is 1 or 0, so it is declared without
  the NLL option);
- DPO's ``loss_type="sigmoid"`` ignores ``label_smoothing`` (declared without it); ``"robust"`` (0.8.1 on) is the
  oracle's ``dpo_robust``; no release computes IPO (0.8.1–0.8.5 raise ``NotImplementedError`` for
  ``loss_type="ipo"``, 0.6.2–0.8.0 refuse it, earlier ones have no ``loss_type``), so none is declared;
- ORPO and SimPO average the log-probabilities over each completion (no ``average_log_prob`` parameter); a release
  whose other losses have no ``average_log_prob`` either is declared with the reduction it applies
  (:func:`fixed_average`: DPO up to 0.5.8 and every loss up to 0.5.2 average, CPO 0.5.3–0.5.4 sums);
- chunks of ``chunk_size`` pairs (``torch.chunk`` into ``B // (2·chunk_size)`` pieces), grad_weight and grad_bias
  summed into buffers of the parameter's dtype (``param_dtype``); ``chunk_pairs=None`` leaves the release's default
  (1), and a release without ``chunk_size`` (up to 0.5.4) is declared without chunking;
- KTO (Liger's unpaired base, 0.5.3 on): the chosen completions are passed as desirable (``preference_labels``
  true), the rejected as undesirable, the reference point as ``kl``; its terms summed and divided by the number of
  completions; its chunks are ``chunk_size`` completions, so the adapter passes twice the protocol's
  ``chunk_pairs``;
- ``compiled=False`` (``torch.compile`` of each chunk is Liger's default; CI's CPU judges the eager path, the
  ``_compiled`` twins, CUDA-only, the default: each call of a twin runs compiled or raises, never silently eager,
  :mod:`numcheck.impls.adapters.compiled_run`).

The reference model: the protocol passes its log-probabilities, Liger takes a reference head (``ref_input``,
``ref_weight``) whose log-softmax it evaluates itself. The adapter hands the given values to Liger's own loss
function instead, chunk by chunk (:func:`_handing_reference`), so Liger's loss formula, chunking and gradients are
judged on exact reference values.

Every release with these losses is judged by ``docs/evidence/liger_preference_releases.py`` (its output
``liger_preference_releases.txt``); the divergences found are entries of
:mod:`numcheck.properties.linear_preference.known_liger`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import importlib.util
import inspect
import re
import sys
from pathlib import Path
from typing import Any

import torch

from numcheck.impls.adapters.compiled_run import compiled_call
from numcheck.impls.adapters.function_args import forward_parameters, positional_args
from numcheck.impls.adapters.releases import owning_release
from numcheck.impls.adapters.unavailable import reason_of
from numcheck.impls.protocols.linear_preference import PreferenceFunctionImpl, PreferenceSupport
from numcheck.reference.linear_preference import AVERAGED_LOSSES, LOSSES

#: Each loss and Liger's module and Function (DPO's two loss types share one).
MODULES: dict[str, tuple[str, str]] = {
    "dpo": ("dpo_loss", "LigerFusedLinearDPOFunction"),
    "dpo_robust": ("dpo_loss", "LigerFusedLinearDPOFunction"),
    "orpo": ("orpo_loss", "LigerFusedLinearORPOFunction"),
    "cpo": ("cpo_loss", "LigerFusedLinearCPOFunction"),
    "simpo": ("simpo_loss", "LigerFusedLinearSimPOFunction"),
    "kto": ("kto_loss", "LigerFusedLinearKTOFunction"),
}
_DTYPES = frozenset({torch.float32, torch.bfloat16, torch.float16})
DISTRIBUTION = "liger-kernel"


@functools.lru_cache(maxsize=None)
def load(loss: str) -> Any:
    """Liger's Function for ``loss``, or the reason it cannot be used here."""
    if importlib.util.find_spec("liger_kernel") is None:
        return "liger-kernel not installed"
    module, name = MODULES[loss]
    try:
        fn = getattr(importlib.import_module(f"liger_kernel.chunked_loss.{module}"), name)
    except (ImportError, AttributeError) as exc:
        return f"liger-kernel has no {name} in chunked_loss.{module} ({type(exc).__name__}: {exc})"
    if loss == "dpo_robust" and "robust" not in _dpo_loss_types(fn):
        return "this liger-kernel's DPO has no loss_type='robust'"
    return fn


def release() -> str | None:
    """The version of the liger-kernel distribution whose files hold the imported preference losses (DPO's
    module), or ``None`` when unknown or they cannot be imported."""
    fn = load("dpo")
    module_file = None if isinstance(fn, str) else getattr(sys.modules.get(fn.__module__), "__file__", None)
    return owning_release(DISTRIBUTION, Path(module_file)).version if module_file else None


def _dpo_loss_types(fn: Any) -> set[str]:
    module = importlib.import_module(fn.__module__)
    return set(getattr(getattr(module, "LigerFusedLinearDPOLoss", None), "_SUPPORTED_LOSS_TYPES", ()) or ())


def _reference_names(fn: Any) -> tuple[str, ...]:
    """The keywords by which the release's ``preference_loss_fn`` takes the reference log-probabilities: DPO's
    ``(ref_chosen_logps, ref_rejected_logps)``; KTO's one, ``ref_average_log_prob_chunk`` (0.5.3–0.5.4) or
    ``ref_log_prob_chunk`` (0.5.5 on)."""
    return tuple(n for n in inspect.signature(fn.preference_loss_fn).parameters if n.startswith("ref_"))


@contextlib.contextmanager
def _handing_reference(fn: Any, ref: torch.Tensor, unpaired: bool):
    """While it is open, Liger's own ``preference_loss_fn`` of ``fn`` receives the reference log-probabilities
    ``ref`` ``[B]`` of the rows of each chunk it is called on.

    Liger calls the loss function once per chunk, in the batch's order (the paired base: chosen rows ``0 … P−1``
    and rejected ``P … 2P−1`` chunk by chunk; the unpaired base: the rows in order), so each call takes the next
    values of as many rows as its chunk holds — whatever chunking the release applies. Up to 0.5.4 each loss's
    ``forward`` hands the base ``LigerFusedLinear<Loss>Function.preference_loss_fn`` by name (later ones
    ``cls.preference_loss_fn``): the attribute is replaced on Liger's class for the call and restored after."""
    original = fn.__dict__["preference_loss_fn"]
    inner = original.__func__ if isinstance(original, staticmethod) else original
    names = _reference_names(fn)
    B = ref.shape[0]
    rows = [ref] if unpaired else [ref[: B // 2], ref[B // 2 :]]
    taken = [0] * len(rows)

    def with_reference(first, second, full_target, *args, **kwargs):
        for i, (name, values) in enumerate(zip(names, rows)):
            n = first.shape[0]
            kwargs[name] = values[taken[i] : taken[i] + n].to(first.device)
            taken[i] += n
        return inner(first, second, full_target, *args, **kwargs)

    fn.preference_loss_fn = staticmethod(with_reference)
    try:
        yield
    finally:
        fn.preference_loss_fn = original


def _arguments(
    loss: str, params: tuple[str, ...], p: Any, x, weight, target, bias, compiled: bool = False
) -> dict[str, Any]:
    given: dict[str, Any] = dict(
        _input=x,
        weight=weight,
        target=target,
        bias=bias,
        ignore_index=p.ignore_index,
        beta=p.beta,
        compute_nll_loss=p.nll_weight != 0,
        compiled=compiled,
        use_ref_model=False,
    )
    if p.chunk_pairs is not None:  # else the release's default chunk_size (1: one pair, or KTO's one completion)
        given["chunk_size"] = p.chunk_pairs * (2 if loss == "kto" else 1)
    optional = dict(
        alpha=p.nll_weight,
        label_smoothing=p.label_smoothing,
        gamma=p.gamma,
        average_log_prob=p.average_log_prob,
        loss_type="robust" if loss == "dpo_robust" else "sigmoid",
    )
    if loss == "kto":
        P = x.shape[0] // 2
        optional["preference_labels"] = torch.arange(2 * P, device=x.device) < P
        optional["kl"] = p.kl
    given.update({k: v for k, v in optional.items() if k in params})
    return given


def compiled_function(fn: Any) -> str:
    """What ``compiled=True`` compiles, for an error: the chunk function of ``fn``'s base, shared by every loss on
    that base (the paired losses' one, KTO's another)."""
    base = next((k for k in fn.__mro__[1:] if "forward" in k.__dict__ and k is not torch.autograd.Function), fn)
    return f"Liger's compiled chunk function of {base.__module__}.{base.__name__}.forward, shared by its losses"


class LigerPreference:
    """One loss of the installed release, callable with the protocol's call; ``compiled``: Liger's default
    ``compiled=True``, each call run compiled or raising (:func:`numcheck.impls.adapters.compiled_run.compiled_call`)."""

    def __init__(self, loss: str, fn: Any, compiled: bool = False) -> None:
        self.loss, self.fn, self.compiled = loss, fn, compiled
        self.name = f"liger_preference[{loss}{'_compiled' if compiled else ''}]"
        self.params, self.defaults = forward_parameters(fn)

    def __call__(self, x, weight, target, bias=None, *, ref_logps=None, params):
        given = _arguments(self.loss, self.params, params, x, weight, target, bias, self.compiled)
        args = positional_args(self.params, self.defaults, given, self.fn.__name__)
        handing = (
            _handing_reference(self.fn, ref_logps, self.loss == "kto")
            if ref_logps is not None
            else contextlib.nullcontext()
        )
        with handing:  # the witness of a compiled call wraps the loss function outermost, around the reference's
            run = functools.partial(self.fn.apply, *args)
            what = compiled_function(self.fn)
            out = compiled_call(self.name, what, self.fn, "preference_loss_fn", run) if self.compiled else run()
        return out[0] if isinstance(out, tuple) else out


def fixed_average(fn: Any) -> bool:
    """Whether a release whose ``forward`` has no ``average_log_prob`` averages the per-sequence log-probability:
    the value its ``forward`` hands the base (CPO 0.5.3–0.5.4 hands ``average_log_prob=False``: summed), else the
    base's default (``True``; the bases of 0.5.0–0.5.2 have no such parameter and always average)."""
    try:
        found = re.search(r"average_log_prob\s*=\s*(True|False)\b", inspect.getsource(fn.forward))
    except (OSError, TypeError):
        found = None
    if found:
        return found.group(1) == "True"
    base = next((k for k in fn.__mro__[1:] if "forward" in k.__dict__ and k is not torch.autograd.Function), None)
    default = inspect.signature(base.forward).parameters.get("average_log_prob") if base is not None else None
    return True if default is None or default.default is inspect.Parameter.empty else bool(default.default)


def declare(loss: str, params: tuple[str, ...], fn: Any = None) -> tuple[PreferenceSupport, list[str]]:
    """The declaration of ``loss`` from the release's ``forward`` parameters (and, where it has no
    ``average_log_prob``, the fixed reduction :func:`fixed_average` reads from ``fn``), and what it leaves out and
    why."""
    has = set(params)
    notes = []
    nll = {"alpha", "compute_nll_loss"} <= has
    if not nll and loss != "kto":
        notes.append("no alpha parameter (the NLL weight is 1 or 0): declared without the NLL option")
    smoothing = "label_smoothing" in has and loss != "dpo"
    if loss == "dpo" and "label_smoothing" in has:
        notes.append("loss_type='sigmoid' ignores label_smoothing: declared without it")
    if loss == "kto":
        notes.append("no NLL term")
    if loss in AVERAGED_LOSSES or "average_log_prob" in has:
        modes = frozenset({True}) if loss in AVERAGED_LOSSES else frozenset({False, True})
    else:
        mean = fixed_average(fn) if fn is not None else True
        modes = frozenset({mean})
        notes.append(
            f"no average_log_prob parameter: log-probabilities {'averaged' if mean else 'summed'} per sequence"
        )
    support = PreferenceSupport(
        loss=loss,
        dtypes=_DTYPES,
        bias=True,
        label_smoothing=smoothing,
        margin=loss == "simpo" and "gamma" in has,
        nll=nll,
        reference_point=loss == "kto" and "kl" in has,
        average_log_prob=modes,
        chunking="chunk_size" in has,
        grad_weight_accumulation="param_dtype",
    )
    return support, notes


def liger_preference_impls() -> list[PreferenceFunctionImpl]:
    """One impl per loss: declared from the installed release, or unavailable with the reason."""
    out = []
    for loss in LOSSES:
        name = f"liger_preference[{loss}]"
        fn = load(loss)
        if isinstance(fn, str):
            support = PreferenceSupport(
                loss=loss, average_log_prob=_modes(loss), requires=functools.partial(reason_of, fn)
            )
            out.append(PreferenceFunctionImpl(name, _unavailable, support, fn))
            continue
        call = LigerPreference(loss, fn)
        support, notes = declare(loss, call.params, fn)
        desc = f"Liger-Kernel's {fn.__name__} (compiled=False)" + "".join(f"; {n}" for n in notes)
        out.append(PreferenceFunctionImpl(name, call, support, desc))
        if "compiled" in call.params:
            out.append(_compiled(loss, fn, support, notes))
    return out


def needs_cuda() -> str | None:
    """Why a compiled variant cannot run here, or ``None`` where CUDA is available."""
    if torch.cuda.is_available():
        return None
    return "compiled=True (Liger's default: torch.compile of each chunk) is judged on CUDA; this machine has none"


def _compiled(loss: str, fn: Any, support: PreferenceSupport, notes: list[str]) -> PreferenceFunctionImpl:
    """The loss as Liger runs it by default (``compiled=True``), declared as the eager path is, on CUDA only: on a
    CPU the compile of every drawn shape costs minutes, and CI's CPU judges the eager path."""
    support = dataclasses.replace(support, devices=frozenset({"cuda"}), requires=needs_cuda)
    desc = f"Liger-Kernel's {fn.__name__} (compiled=True, its default)" + "".join(f"; {n}" for n in notes)
    return PreferenceFunctionImpl(f"liger_preference[{loss}_compiled]", LigerPreference(loss, fn, True), support, desc)


def _modes(loss: str) -> frozenset[bool]:
    return frozenset({True}) if loss in AVERAGED_LOSSES else frozenset({False})


def _unavailable(x, weight, target, bias=None, *, ref_logps=None, params):
    raise RuntimeError("unavailable: see the impl's requires")
