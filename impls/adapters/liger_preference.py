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
- DPO's ``loss_type="sigmoid"`` ignores ``label_smoothing`` (declared without it); ``"robust"`` is the oracle's
  ``dpo_robust``; IPO raises ``NotImplementedError`` in 0.8.5 (not declared);
- ORPO and SimPO average the log-probabilities over each completion (no ``average_log_prob`` parameter);
- chunks of ``chunk_size`` pairs (``torch.chunk`` into ``B // (2·chunk_size)`` pieces), grad_weight and grad_bias
  summed into buffers of the parameter's dtype (``param_dtype``);
- KTO (Liger's unpaired base): the chosen completions are passed as desirable (``preference_labels`` true), the
  rejected as undesirable, the reference point as ``kl``; its terms summed and divided by the number of completions;
  its chunks are ``chunk_size`` completions, so the adapter passes twice the protocol's ``chunk_pairs``;
- ``compiled=False`` (``torch.compile`` of each chunk is Liger's default; CI's CPU judges the eager path).

The reference model: the protocol passes its log-probabilities, Liger takes a reference head (``ref_input``,
``ref_weight``) whose log-softmax it evaluates itself. The adapter hands the given values to Liger's own DPO loss
function chunk by chunk instead (a subclass whose ``preference_loss_fn`` adds them, in Liger's chunk order), so
Liger's loss formula, chunking and gradients are judged on exact reference values.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.util
from typing import Any

import torch

from numcheck.impls.adapters.function_args import forward_parameters, positional_args
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


def _dpo_loss_types(fn: Any) -> set[str]:
    module = importlib.import_module(fn.__module__)
    return set(getattr(getattr(module, "LigerFusedLinearDPOLoss", None), "_SUPPORTED_LOSS_TYPES", ()) or ())


def _with_reference(fn: Any, unpaired: bool) -> Any:
    """A subclass of Liger's Function whose loss function takes the reference log-probabilities from
    :attr:`queue` (per chunk, in Liger's chunk order: a ``(chosen, rejected)`` pair of tensors, or one tensor of
    the chunk's completions for the unpaired base)."""

    class WithReference(fn):
        queue: list = []

        @staticmethod
        def preference_loss_fn(first, second, full_target, beta=0.1, **kwargs):
            if unpaired:
                kwargs["ref_log_prob_chunk"] = WithReference.queue.pop(0)
            else:
                kwargs["ref_chosen_logps"], kwargs["ref_rejected_logps"] = WithReference.queue.pop(0)
            return fn.preference_loss_fn(first, second, full_target, beta=beta, **kwargs)

    return WithReference


def _reference_chunks(ref: torch.Tensor, chunk_pairs: int, unpaired: bool) -> list[Any]:
    """The reference log-probabilities split as Liger splits the batch (``fused_linear_preference.py``; the
    unpaired base chunks the whole batch in order)."""
    B = ref.shape[0]
    chunks = max(1, B // (2 * chunk_pairs))
    if unpaired:
        return list(torch.chunk(ref, chunks))
    return list(zip(torch.chunk(ref[: B // 2], chunks), torch.chunk(ref[B // 2 :], chunks)))


def _arguments(
    loss: str, params: tuple[str, ...], p: Any, x, weight, target, bias, compiled: bool = False
) -> dict[str, Any]:
    chunk = p.chunk_pairs or 1
    given: dict[str, Any] = dict(
        _input=x,
        weight=weight,
        target=target,
        bias=bias,
        ignore_index=p.ignore_index,
        beta=p.beta,
        compute_nll_loss=p.nll_weight != 0,
        compiled=compiled,
        chunk_size=chunk,
        use_ref_model=False,
    )
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
        given["chunk_size"] = 2 * chunk
    given.update({k: v for k, v in optional.items() if k in params})
    return given


class LigerPreference:
    """One loss of the installed release, callable with the protocol's call."""

    def __init__(self, loss: str, fn: Any, compiled: bool = False) -> None:
        self.loss, self.fn, self.compiled = loss, fn, compiled
        self.params, self.defaults = forward_parameters(fn)

    def __call__(self, x, weight, target, bias=None, *, ref_logps=None, params):
        given = _arguments(self.loss, self.params, params, x, weight, target, bias, self.compiled)
        fn = self.fn
        if ref_logps is not None:
            fn = _with_reference(self.fn, self.loss == "kto")
            fn.queue = _reference_chunks(ref_logps, params.chunk_pairs or 1, self.loss == "kto")
        out = fn.apply(*positional_args(self.params, self.defaults, given, self.fn.__name__))
        return out[0] if isinstance(out, tuple) else out


def declare(loss: str, params: tuple[str, ...]) -> tuple[PreferenceSupport, list[str]]:
    """The declaration of ``loss`` from the release's ``forward`` parameters, and what it leaves out and why."""
    has = set(params)
    notes = []
    nll = {"alpha", "compute_nll_loss"} <= has
    if not nll and loss != "kto":
        notes.append("no alpha parameter (the NLL weight is 1 or 0): declared without the NLL option")
    smoothing = "label_smoothing" in has and loss != "dpo"
    if loss == "dpo":
        notes.append("loss_type='sigmoid' ignores label_smoothing: declared without it")
    if loss == "kto":
        notes.append("no NLL term")
    averaged = loss in AVERAGED_LOSSES or "average_log_prob" not in has
    support = PreferenceSupport(
        loss=loss,
        dtypes=_DTYPES,
        bias=True,
        label_smoothing=smoothing,
        margin=loss == "simpo" and "gamma" in has,
        nll=nll,
        reference_point=loss == "kto" and "kl" in has,
        average_log_prob=frozenset({True}) if averaged else frozenset({False, True}),
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
        support, notes = declare(loss, call.params)
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
