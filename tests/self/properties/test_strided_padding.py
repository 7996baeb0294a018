"""strided_inputs judges what an impl computes from the tensor's own elements: a kernel that loads a strided row
past its end and multiplies those elements by zero (what oneDNN's bf16 GEMM does on CPUs with AMX) passes on
every machine, while one that reads the padding as data still fails."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from numcheck.errors import PropertyFailure
from numcheck.impls.protocols.linear_ce import FunctionImpl
from numcheck.properties.core.tensors import PAD, strided_copy
from numcheck.properties.linear_ce import props
from numcheck.properties.linear_ce.cases import Problem
from numcheck.tests.self.helpers.mutants import PLAIN_FP32


def _row_past_its_end(x: torch.Tensor, weight: torch.Tensor, pad_weight: float) -> torch.Tensor:
    """x·Wᵀ over each x row read ``stride`` wide (into the buffer's padding), the weight padded with
    ``pad_weight`` times a per-class factor in [-1, 1]: 0 gives the right product for finite padding, anything else
    reads the padding as data."""
    stride = x.stride(0)
    xp = torch.as_strided(x, (x.shape[0], stride), (stride, 1))
    per_class = torch.linspace(-1.0, 1.0, weight.shape[0], dtype=weight.dtype, device=weight.device)
    pad = (pad_weight * per_class)[:, None].expand(-1, stride - x.shape[1])  # a class-constant shift would cancel
    wp = torch.cat([weight, pad], dim=1)
    return xp @ wp.T


def _zero_weighted(x, weight, target, bias=None, *, reduction="mean", ignore_index=-100, **_):
    """Loads past each row's end and multiplies those elements by zero."""
    logits = _row_past_its_end(x, weight, 0.0).float()
    return F.cross_entropy(logits, target, reduction=reduction, ignore_index=ignore_index)


def _padding_as_data(x, weight, target, bias=None, *, reduction="mean", ignore_index=-100, **_):
    """Loads past each row's end and lets those elements into the logits (weights up to 1e-3 on them)."""
    logits = _row_past_its_end(x, weight, 1e-3).float()
    return F.cross_entropy(logits, target, reduction=reduction, ignore_index=ignore_index)


CASES = [Problem(N=8, H=16, V=24, seed=1), Problem(N=5, H=3, V=7, reduction="sum", ignored=0.4, seed=2)]


def test_padding_is_finite_in_every_float_format():
    """PAD is finite in every float dtype the suite draws, and fills exactly the elements outside the view."""
    for dt in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        assert math.isfinite(float(torch.tensor(PAD, dtype=dt))), dt
        t = torch.arange(6, dtype=dt).reshape(2, 3)
        s = strided_copy(t, "x")
        assert torch.equal(s, t) and s.stride(0) == 6
        assert torch.equal(torch.as_strided(s, (2, 3), (6, 1), 3), torch.full((2, 3), PAD, dtype=dt))


@pytest.mark.parametrize("p", CASES, ids=[p.short() for p in CASES])
def test_zero_weighted_reads_past_a_row_pass(p):
    """An impl that reads the padding only to multiply it by zero is within every bound (a NaN fill failed it)."""
    props.strided_inputs(FunctionImpl("zero_weighted_padding", _zero_weighted, PLAIN_FP32), p)


@pytest.mark.parametrize("p", CASES, ids=[p.short() for p in CASES])
def test_padding_read_as_data_fails(p):
    """An impl that lets the padding into its arithmetic, even at a weight of 1e-3, fails strided_inputs."""
    with pytest.raises(PropertyFailure, match="strided_inputs"):
        props.strided_inputs(FunctionImpl("padding_as_data", _padding_as_data, PLAIN_FP32), p)
