"""numcheck's evaluation of a declared path (properties/linear_ce/declared_path.py) is an honest implementation of the
declaration: the chunked built-in that implements a path gives its gradients bit for bit; and judgement (b) now
measures an output declared coarser than eager against it instead of leaving it unjudged."""

from __future__ import annotations

import torch

from numcheck.impls.builtin.chunked import ChunkedLinearCE
from numcheck.impls.protocols.linear_ce import LinearCESupport
from numcheck.properties.core import matmul_precision
from numcheck.properties.linear_ce.accuracy import check_accuracy
from numcheck.properties.linear_ce.cases import Problem, build
from numcheck.properties.linear_ce.declared_path import DeclaredPath, declared_path_outputs, single_device_path
from numcheck.properties.linear_ce.harness import run_impl

CASE = Problem(N=40, H=8, V=24, dtype="bfloat16", bias=True, reduction="sum", regime="post_norm", seed=3)


def _chunked(path: str, rows: int) -> ChunkedLinearCE:
    return ChunkedLinearCE(
        f"chunked[{path}]@{rows}",
        path=path,
        chunk_rows=rows,
        support=LinearCESupport(returns_z_loss=True, all_ignored="nan"),
    )


def test_path_of_each_builtin_is_the_builtin_bit_for_bit():
    """For every accumulation path, the evaluation of the declaration of ``chunked[path]`` at 7 rows per chunk gives
    that built-in's grad_weight and grad_bias bitwise (it is made of the same steps)."""
    t = build(CASE)
    with matmul_precision.pinned():
        for path in ("fallback", "lowp_accum", "fp32_operands"):
            impl = _chunked(path, 7)
            got = declared_path_outputs(single_device_path(impl.support, CASE), CASE, t)
            out = run_impl(impl, CASE, t)
            for name in ("grad_weight", "grad_bias"):
                assert got[name].dtype == out.get(name).dtype
                assert torch.equal(got[name], out.get(name)), f"{path}: {name} differs from the built-in's"


def test_declared_coarser_grad_weight_is_judged_against_its_path():
    """A grad_weight declared ``per_chunk_rounding`` is judged by (b) against the per-chunk path at the declared chunk
    rows (before, it was recorded as "not judged"); the honest built-in sits at exactly its yardstick's RMSE."""
    with matmul_precision.pinned():
        res = check_accuracy(_chunked("fallback", 7), CASE)
    for name in ("grad_weight", "grad_bias"):
        r = res.relative[name]
        assert r.judged and r.ok, r.describe()
        assert "per_chunk_rounding over 7-row chunks" in r.yardstick, r.yardstick
        assert r.rmse_impl == r.rmse_eager, r.describe()


def test_vocabulary_parallel_reduce_follows_its_dtype():
    """A vocabulary-parallel path reduced in fp32 rounds grad_x once; reduced in bf16 its two partials are each
    rounded and added in bf16: the first equals one fp32 GEMM rounded to bf16 up to the fp32 sum's order, the
    second moves off it where the partials cancel."""
    p = Problem(N=24, H=16, V=37, dtype="bfloat16", reduction="sum", seed=0)
    t = build(p)
    parts = ((0, 19), (19, 37))
    fp32 = DeclaredPath(
        logits_fp32=True, grad_accumulation="fp32", chunk_rows=1, grad_x_parts=parts, reduce_dtype=torch.float32
    )
    bf16 = DeclaredPath(
        logits_fp32=True, grad_accumulation="fp32", chunk_rows=1, grad_x_parts=parts, reduce_dtype=torch.bfloat16
    )
    whole = DeclaredPath(logits_fp32=True, grad_accumulation="fp32", chunk_rows=1)
    a, b, w = (declared_path_outputs(d, p, t)["grad_x"] for d in (fp32, bf16, whole))
    ulp = torch.finfo(torch.bfloat16).eps * w.double().abs()
    assert float(((a.double() - w.double()).abs() - ulp).max()) <= 0.0
    assert not torch.equal(b, w)


LONG = Problem(N=2049, H=8, V=24, dtype="bfloat16", bias=True, reduction="sum", seed=0)


def test_user_declared_chunk_paths_are_their_yardstick():
    """Impls declared as a user declares them (decorator only), per-chunk rounding at 7 and 64 rows: (b) measures
    their grad_weight and grad_bias against that very path (RMSE equal to the yardstick's), while the running sum
    rounded at every chunk sits 2.4–26× its declared path's RMSE (so the yardstick does see the difference; at 7
    rows (a) fails it outright, 3.9× on grad_bias)."""
    from numcheck.tests.self.helpers import chunk_declared as c

    with matmul_precision.pinned():
        for honest, defect, rows, (lo, a_fails) in (
            (c.per_chunk_7, c.running_sum_7, 7, (9.0, True)),
            (c.per_chunk_64, c.running_sum_64, 64, (2.4, False)),
        ):
            good, bad = check_accuracy(honest, LONG), check_accuracy(defect, LONG)
            assert good.ok, good.failure_lines()
            for name in ("grad_weight", "grad_bias"):
                g, b = good.relative[name], bad.relative[name]
                assert f"per_chunk_rounding over {rows}-row chunks" in g.yardstick and g.rmse_impl == g.rmse_eager
                assert b.rmse_impl >= lo * b.rmse_eager, b.describe()
            assert (not bad.analytic["grad_bias"].ok) == a_fails, bad.analytic["grad_bias"].describe()
