"""The tolerance model beyond first order in the logits' errors (properties/linear_ce/tolerance.py, steps 2-4).

bf16 logits of a few hundred carry an error near 1, where a bound linear in the error is not one: p moves by
e^δ. The row-statistic bounds are exact for any errors in the box |δ_j| ≤ e_j (they are attained at its
corners), reduce to the first-order terms as e → 0, and the correct built-ins pass the case that showed it.
"""

from __future__ import annotations

import pytest
import torch

from numcheck.impls.registry import builtin
from numcheck.properties.core.device import DEVICE
from numcheck.properties.linear_ce.accuracy import check_accuracy
from numcheck.properties.linear_ce.cases import Problem
from numcheck.properties.linear_ce.tolerance import _p_expm1, logp_error_bound, lse_error_bound

f64 = torch.float64


def _row(V: int, scale: float, err: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits z (one row of V, spread ``scale``) and per-logit error bounds e in [0, err]."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(V, generator=g, dtype=f64) * scale
    e = torch.rand(V, generator=g, dtype=f64) * err
    return z, e


def _bounds(z: torch.Tensor, e: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    p = torch.softmax(z, 0)
    Tp, Tm = _p_expm1(p, e).sum(), _p_expm1(p, -e).sum()
    return p, lse_error_bound(Tp, Tm), logp_error_bound(p, e, Tp, Tm)


@pytest.mark.parametrize("scale,err", [(1.0, 0.5), (5.0, 1.0), (20.0, 2.0), (3.0, 1e-3)])
def test_row_bounds_hold_and_are_attained_in_the_error_box(scale: float, err: float) -> None:
    """|δlse| and |δ log p_j| never exceed E* and L_j for errors in the box, and the box's corners reach them."""
    z, e = _row(33, scale, err, seed=int(scale * 10))
    p, E_star, L = _bounds(z, e)
    lse, logp = torch.logsumexp(z, 0), torch.log_softmax(z, 0)
    g = torch.Generator().manual_seed(1)
    for _ in range(200):
        d = (torch.rand(z.shape, generator=g, dtype=f64) * 2 - 1) * e
        assert float((torch.logsumexp(z + d, 0) - lse).abs()) <= float(E_star) * (1 + 1e-12)
        assert bool(((torch.log_softmax(z + d, 0) - logp).abs() <= L * (1 + 1e-12) + 1e-300).all())
    assert float(torch.logsumexp(z + e, 0) - lse) == pytest.approx(float(E_star), rel=1e-9)
    for j in range(z.numel()):
        sign = torch.ones_like(z)
        sign[j] = -1
        reached = (torch.log_softmax(z + sign * e, 0)[j] - logp[j]).abs()
        assert float(reached) == pytest.approx(float(L[j]), rel=1e-9), f"class {j}: the bound is not attained"


def test_row_bounds_reduce_to_first_order_for_small_errors() -> None:
    """For errors ~1e-9, E* = Σ p e and L_j = E + (1 − 2p_j) e_j (the first-order terms) to 1e-6 relative."""
    z, e = _row(65, 4.0, 1e-9, seed=3)
    p, E_star, L = _bounds(z, e)
    E = (p * e).sum()
    assert float(E_star) == pytest.approx(float(E), rel=1e-6)
    assert torch.allclose(L, E + (1 - 2 * p) * e, rtol=1e-6, atol=0)


#: The case with bf16 logits near 320 (one logit's rounding ≈ 0.94) where the first-order bound failed correct
#: impls at grad_weight error/bound 1.6 (2 of 8194 elements); with the exact terms 0.36.
LARGE_LOGITS = Problem(N=4, H=2, V=4097, dtype="bfloat16", regime="outlier_rows", seed=0, device=DEVICE)


@pytest.mark.parametrize("name", ["chunked[fp32_operands]", "recompute"])
def test_correct_impls_pass_where_logit_errors_are_order_one(name: str) -> None:
    """Correct built-ins are within the bound on the bf16 case whose logit errors are about 1."""
    res = check_accuracy(builtin(name), LARGE_LOGITS)
    assert res.ok, "\n".join(res.failure_lines())


@pytest.mark.parametrize("field,value", [("exp", -1), ("tanh", float("nan")), ("log", "2"), ("expo", 2)])
def test_bad_elementary_error_is_named(field: str, value: object) -> None:
    """An elementary_error entry that is not a number of ulps >= 0, or an unknown function, is refused by name."""
    from numcheck.errors import InvalidDeclaration
    from numcheck.impls.protocols.linear_ce import make_support

    with pytest.raises(InvalidDeclaration, match=field):
        make_support(elementary_error={field: value})


def test_declared_elementary_error_widens_only_its_terms() -> None:
    """Declaring exp/log/tanh ulps never narrows a bound and widens each output's bound of a softcap problem."""
    from numcheck.impls.protocols.linear_ce import make_support
    from numcheck.properties.linear_ce.cases import build
    from numcheck.properties.linear_ce.harness import run_oracle
    from numcheck.properties.linear_ce.tolerance import error_model, linear_ce_bounds

    plain, declared = (
        make_support(),
        make_support(elementary_error={"exp": 2, "exp_per_arg": 0.6, "log": 2, "tanh": 13}),
    )
    p = Problem(N=6, H=8, V=65, dtype="float32", softcap=2.0, seed=4, device=DEVICE)
    t = build(p)
    ref = run_oracle(p, t, all_ignored="nan")
    dts = {k: torch.float32 for k in ("loss", "grad_x", "grad_weight")}
    b0 = linear_ce_bounds(p, t, ref, error_model(plain, p, dts))
    b1 = linear_ce_bounds(p, t, ref, error_model(declared, p, dts))
    for k in ("loss", "grad_x", "grad_weight"):
        assert bool((b1[k] >= b0[k]).all()) and bool((b1[k] > b0[k]).any()), k
