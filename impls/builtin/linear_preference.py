"""Built-in linear+preference impls (the protocol is :mod:`impls.protocols.linear_preference`), one eager and one
chunked per loss:

* ``linear_preference_eager[<loss>]`` materialises the ``[B, T, V]`` logits in the inputs' dtype and lets
  torch.autograd differentiate :func:`reference.numerics.linear_preference.chunk_loss` over the whole batch.
* ``linear_preference_chunked[<loss>]`` never holds more than one chunk's logits: for each chunk of
  ``params.chunk_pairs`` pairs (default 1) it computes the chunk's loss and, at once, its gradients
  (``torch.autograd.grad`` on the chunk), writes the chunk's rows of grad_x and adds its grad_weight and grad_bias
  (each in the weight's dtype, as autograd returns it) into fp32 buffers (the fused-linear-head design of Liger-Kernel's chunked losses); backward scales them by the
  upstream gradient. The chunks use the whole batch's denominators, so the loss is the sum of the chunks' losses.

:class:`ChunkedPreference`'s :meth:`~ChunkedPreference.accumulate`, :meth:`~ChunkedPreference.adding`,
:meth:`~ChunkedPreference.sequence_logps` and ``__call__`` are the seams the mutants of ``tests/self/helpers/preference_mutants.py`` override.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from numcheck.impls.protocols.linear_preference import PreferenceFunctionImpl, PreferenceSupport
from numcheck.reference.linear_preference import (
    AVERAGED_LOSSES,
    LOSSES,
    MARGIN_LOSSES,
    REFERENCE_POINT_LOSSES,
    SMOOTHED_LOSSES,
    Conventions,
    PreferenceParams,
    denominators,
    pair_rows,
)
from numcheck.reference.numerics.linear_preference import chunk_loss, sequence_logps

DTYPES = frozenset({torch.float32, torch.bfloat16, torch.float16})


def _parts(x, target, ref_logps, rows):
    return x[rows], target[rows], (ref_logps[rows] if ref_logps is not None else None)


def _denominators(conv: Conventions, target: torch.Tensor, ci: torch.Tensor, params: PreferenceParams):
    return denominators(conv, len(ci), float((target[ci] != params.ignore_index).sum()))


def eager_preference(
    conv: Conventions, x, weight, target, bias=None, *, ref_logps=None, params: PreferenceParams
) -> torch.Tensor:
    """The whole batch's loss as one autograd graph (module docstring)."""
    ci, ri = pair_rows(conv.layout, x.shape[0])
    dens = _denominators(conv, target, ci, params)
    return chunk_loss(
        _parts(x, target, ref_logps, ci), _parts(x, target, ref_logps, ri), weight, bias, conv, params, dens
    )


@dataclass(frozen=True)
class ChunkedPreference:
    """The chunked loss of one convention set (module docstring); callable with the protocol's call."""

    conv: Conventions

    def chunks(self, P: int, params: PreferenceParams) -> list[torch.Tensor]:
        """The pair indices of each chunk."""
        size = params.chunk_pairs or 1
        return list(torch.arange(P).split(size))

    def sequence_logps(self, x, weight, target, bias, averaged: bool, ignore: int):
        """Each row's per-sequence log-probability and NLL sum
        (:func:`reference.numerics.linear_preference.sequence_logps`)."""
        return sequence_logps(x, weight, target, bias, averaged, ignore)

    def adding(self, total: torch.Tensor, part: torch.Tensor) -> None:
        """Add one chunk's loss into the fp32 total."""
        total += part

    def accumulate(self, buf: torch.Tensor, part: torch.Tensor) -> None:
        """Add one chunk's grad_weight (or grad_bias) into its fp32 running sum."""
        buf.add_(part.float())

    def __call__(self, x, weight, target, bias=None, *, ref_logps=None, params: PreferenceParams) -> torch.Tensor:
        return _ChunkedFunction.apply(self, x, weight, bias, target, ref_logps, params)

    def forward_backward(self, x, weight, bias, target, ref_logps, params):
        """``(loss, grad_x, grad_weight, grad_bias)`` chunk by chunk."""
        ci, ri = pair_rows(self.conv.layout, x.shape[0])
        dens = _denominators(self.conv, target, ci, params)
        gx = torch.zeros_like(x)
        gw = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        gb = torch.zeros(bias.shape, dtype=torch.float32, device=bias.device) if bias is not None else None
        loss = torch.zeros((), dtype=torch.float32, device=x.device)
        for pairs in self.chunks(len(ci), params):
            rows = torch.cat([ci[pairs], ri[pairs]])
            xs = x[rows].detach().requires_grad_()
            w = weight.detach().requires_grad_()
            b = bias.detach().requires_grad_() if bias is not None else None
            with torch.enable_grad():
                part = chunk_loss(
                    (xs[: len(pairs)], target[ci[pairs]], None if ref_logps is None else ref_logps[ci[pairs]]),
                    (xs[len(pairs) :], target[ri[pairs]], None if ref_logps is None else ref_logps[ri[pairs]]),
                    w,
                    b,
                    self.conv,
                    params,
                    dens,
                    seq=self.sequence_logps,
                )
                grads = torch.autograd.grad(part, [xs, w] + ([b] if b is not None else []))
            self.adding(loss, part.detach())
            gx[rows] = grads[0]
            self.accumulate(gw, grads[1])
            if gb is not None:
                self.accumulate(gb, grads[2])
        return loss, gx, gw.to(weight.dtype), (gb.to(bias.dtype) if gb is not None else None)


class _ChunkedFunction(torch.autograd.Function):
    """Forward computes the gradients chunk by chunk; backward scales them by the upstream gradient."""

    @staticmethod
    def forward(ctx, impl: ChunkedPreference, x, weight, bias, target, ref_logps, params):
        loss, gx, gw, gb = impl.forward_backward(x, weight, bias, target, ref_logps, params)
        ctx.save_for_backward(gx, gw, *([gb] if gb is not None else []))
        ctx.has_bias = gb is not None
        return loss

    @staticmethod
    def backward(ctx, g):
        saved = ctx.saved_tensors
        gx, gw = saved[0], saved[1]
        gb = saved[2] if ctx.has_bias else None
        scale = lambda t: None if t is None else (t * g).to(t.dtype)  # noqa: E731
        return None, scale(gx), scale(gw), scale(gb), None, None, None


def _support(loss: str, *, chunking: bool) -> PreferenceSupport:
    """The built-ins' declaration for ``loss``: every option the loss has; the chunked one's grad_weight is each
    chunk's autograd result (in the weight's dtype) summed in fp32: ``per_chunk_rounding``."""
    averaged = loss in AVERAGED_LOSSES
    return PreferenceSupport(
        loss=loss,
        dtypes=DTYPES,
        bias=True,
        label_smoothing=loss in SMOOTHED_LOSSES,
        margin=loss in MARGIN_LOSSES,
        nll=True,
        reference_point=loss in REFERENCE_POINT_LOSSES,
        average_log_prob=frozenset({True}) if averaged else frozenset({False, True}),
        chunking=chunking,
        grad_weight_accumulation="per_chunk_rounding" if chunking else "fp32",
    )


def eager_fn(loss: str) -> Any:
    """The eager built-in's function for ``loss``."""
    conv = Conventions(loss)

    def eager(x, weight, target, bias=None, *, ref_logps=None, params):
        return eager_preference(conv, x, weight, target, bias, ref_logps=ref_logps, params=params)

    return eager


def linear_preference_impls() -> list[PreferenceFunctionImpl]:
    """The built-in linear+preference impls: eager and chunked for each loss."""
    out = []
    for loss in LOSSES:
        out.append(
            PreferenceFunctionImpl(
                f"linear_preference_eager[{loss}]",
                eager_fn(loss),
                _support(loss, chunking=False),
                "whole-batch logits in the inputs' dtype, log-softmax and loss in fp32, torch.autograd",
            )
        )
        out.append(
            PreferenceFunctionImpl(
                f"linear_preference_chunked[{loss}]",
                ChunkedPreference(Conventions(loss)),
                _support(loss, chunking=True),
                "chunks of pairs, gradients formed in forward, each chunk's grad_weight rounded to the weight's dtype, summed in fp32",
            )
        )
    return out
