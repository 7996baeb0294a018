"""Memory accounting (impls/measure/memory.py, and properties/linear_ce/memory.py for impls on a Problem): exact on hand-countable callables on CPU, meta and under
FakeTensorMode; the seed's one-chunk arithmetic (3072 / 1056 / 0 MiB) on meta; O(N) bytes held across
backward by recompute against ≥ V·H·4 for the chunked impls; ``numcheck memory``.

Every expected number is derived in the test from shapes and dtype sizes. Cost: about 3 s (meta is free).
"""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from numcheck.impls.measure import capabilities, memory
from numcheck.impls.registry import builtin_impls
from numcheck.properties.linear_ce import memory as problem_memory
from numcheck.properties.linear_ce.cases import Problem

F32 = 4


def _impl(name: str):
    for e in builtin_impls():
        if e.name == name:
            return e.impl
    pytest.skip(f"built-in {name!r} not registered")


def _two_and_free_one(device: str):
    a = torch.empty(1000, dtype=torch.float32, device=device)  # 4000 B
    b = torch.empty(3000, dtype=torch.uint8, device=device)  # 3000 B
    del a
    c = torch.empty(250, dtype=torch.float16, device=device)  # 500 B
    return b, c


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_allocate_two_free_one(device: str) -> None:
    """Two live tensors make the peak (4000 + 3000 B); freeing one and allocating 500 B leaves 3500 B."""
    m = memory.measure(_two_and_free_one, device)
    assert (m.extra_peak, m.retained) == (4000 + 3000, 3000 + 500), (m.extra_peak, m.retained)


def test_fake_tensor_mode_counts_the_same() -> None:
    """Under FakeTensorMode the same callable is counted exactly as on a real device."""
    with FakeTensorMode():
        m = memory.measure(_two_and_free_one, "cpu")
    assert (m.extra_peak, m.retained) == (7000, 3500)


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_views_inplace_and_inputs_cost_nothing(device: str) -> None:
    """Views, in-place ops and out= into an existing tensor allocate nothing; the caller's inputs are not counted."""
    x = torch.ones(64, 32, device=device)
    out = torch.empty(32, 32, device=device)

    def fn() -> None:
        v = x.view(-1)[:100]
        w = x.t()[:16]
        x.mul_(2.0)
        torch.mm(x.t(), x, out=out)
        del v, w

    assert memory.extra_peak(fn) == 0


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_temporaries_overlap(device: str) -> None:
    """``(x + 1) * 2``: the temporary and the result are alive together (2 × 4·N·H), then only the result."""
    x = torch.ones(128, 16, device=device)
    m = memory.measure(lambda: (x + 1) * 2)
    assert (m.extra_peak, m.retained) == (2 * x.numel() * F32, x.numel() * F32)


def test_resize_growth_is_counted() -> None:
    """An out= tensor resized by the op (a pre-existing empty one) counts its growth."""
    out = torch.empty(0)
    a = torch.ones(10, 20)
    assert memory.extra_peak(lambda: torch.mm(a, a.t(), out=out)) == 10 * 10 * F32


def test_custom_op_insides_are_counted() -> None:
    """A torch.library.custom_op is run with tracking inside: its temporary counts, not just its output."""
    lib_fn = _custom_double_via_temp()
    x = torch.ones(100, 10)
    # temp (x*3) and out (temp - x) alive together: 2 × 4000 B.
    assert memory.extra_peak(lib_fn, x) == 2 * x.numel() * F32


_CUSTOM = {}


def _custom_double_via_temp():
    if "op" not in _CUSTOM:

        @torch.library.custom_op("numcheck_test::double_via_temp", mutates_args=())
        def double_via_temp(x: torch.Tensor) -> torch.Tensor:
            temp = x * 3
            return temp - x

        @double_via_temp.register_fake
        def _(x):
            return torch.empty_like(x)

        _CUSTOM["op"] = double_via_temp
    return _CUSTOM["op"]


class _Stash(torch.autograd.Function):
    """Saves a new tensor on ctx directly (invisible to saved-tensor hooks) and another via save_for_backward."""

    @staticmethod
    def forward(ctx, x):
        ctx.stash = x * 2  # N·H·4 bytes, held through a ctx attribute
        kept = x.sum(dim=1)  # N·4 bytes, via save_for_backward
        ctx.save_for_backward(kept, x)  # x aliases the input: not counted
        return x.sum()

    @staticmethod
    def backward(ctx, g):
        kept, x = ctx.saved_tensors
        return ctx.stash * g + kept[:, None] * 0


def test_held_across_backward_sees_ctx_and_saved(monkeypatch: pytest.MonkeyPatch) -> None:
    """Held bytes = what forward leaves alive minus its outputs: a ctx attribute and a saved tensor count,
    a saved alias of the input does not; saved-tensor hooks see only the save_for_backward part."""

    class Impl:
        name = "stash"

        def __call__(self, x, w, y, b=None, **kw):
            return _Stash.apply(x)

    p = Problem(N=6, H=5, V=7)
    m = problem_memory.impl_memory(Impl(), p, "cpu")
    assert m.error == "", m.error
    assert m.held == p.N * p.H * F32 + p.N * F32, m
    assert m.saved_hook_bytes == p.N * F32, m


@pytest.mark.torch_versions(
    reason="the addmm_out_dtype_meta probe: whether this torch traces addmm(out_dtype=) on meta"
)
def test_seed_one_chunk_on_meta() -> None:
    """One chunk at V=131072, H=4096, C=2048, bf16 operands, fp32 accumulator: fallback 6·V·H = 3072 MiB,
    fp32_operands 4·(V·C + C·H) = 1056 MiB, addmm_out_dtype 0 (measured as where supported)."""
    V, H, C = 131072, 4096, 2048
    want = {"fallback": (2 + 4) * V * H, "fp32_operands": 4 * (V * C + C * H), "addmm_out_dtype": 0}
    if not capabilities.addmm_out_dtype_meta(torch.bfloat16):
        want["addmm_out_dtype"] = want["fp32_operands"]  # runs as its fallback where meta cannot trace it
    got = {path: memory.one_chunk_extra(path, V, H, C) for path in want}
    assert got == want, {k: v / memory.MiB for k, v in got.items()}
    mib = {"fallback": 3072, "fp32_operands": 1056, "addmm_out_dtype": 0}
    assert {k: got[k] // memory.MiB for k in ("fallback", "fp32_operands")} == {"fallback": 3072, "fp32_operands": 1056}
    if capabilities.addmm_out_dtype_meta(torch.bfloat16):
        assert got["addmm_out_dtype"] // memory.MiB == mib["addmm_out_dtype"]


def test_meta_without_out_dtype_tracing_says_so() -> None:
    """Where torch cannot trace addmm(out_dtype=) on meta (torch 2.11), the out_dtype path is reported as running
    as fp32_operands with that path's bytes, not as a made-up 0."""
    V, H, C = 512, 64, 32
    with capabilities.forced(addmm_out_dtype_meta=False):
        rows = {r.path: r for r in memory.one_chunk_table(V, H, C)}
    assert rows["addmm_out_dtype"].runs_as == "fp32_operands"
    assert rows["addmm_out_dtype"].extra_bytes == 4 * (V * C + C * H)


@pytest.mark.torch_versions(reason="the addmm_out_dtype probe: the path chunked[addmm_out_dtype] takes on this torch")
def test_one_chunk_on_cpu_follows_the_probe() -> None:
    """On CPU (real allocations, small shapes) the same formulas hold; addmm_out_dtype runs as fp32_operands
    where the probe says no, and allocates nothing where it is forced on... only on meta (CPU would raise)."""
    V, H, C = 96, 40, 24
    assert memory.one_chunk_extra("fallback", V, H, C, device="cpu") == 6 * V * H
    assert memory.one_chunk_extra("fp32_operands", V, H, C, device="cpu") == 4 * (V * C + C * H)
    expect = 0 if capabilities.addmm_out_dtype("cpu", torch.bfloat16) else 4 * (V * C + C * H)
    assert memory.one_chunk_extra("addmm_out_dtype", V, H, C, device="cpu") == expect


def _held(name: str, N: int, H: int, V: int) -> int:
    return problem_memory.held_across_backward(_impl(name), Problem(N=N, H=H, V=V, dtype="bfloat16"), "meta")


def test_recompute_holds_O_N() -> None:
    """recompute holds bytes linear in N and independent of H and V (a few per token) across backward."""
    N, H, V = 4096, 1024, 32768
    h = _held("recompute", N, H, V)
    assert h == _held("recompute", N, 2 * H, 3 * V), "held bytes change with H or V"
    assert _held("recompute", 2 * N, H, V) == 2 * h, "held bytes are not linear in N"
    assert 0 < h <= 16 * N, f"recompute holds {h} B for N={N}: more than 16 B per token"


@pytest.mark.parametrize("name", ["chunked[addmm_out_dtype]", "chunked[fallback]", "chunked[fp32_operands]"])
def test_chunked_holds_fp32_grad_weight(name: str) -> None:
    """A chunked impl with an fp32 grad_weight accumulator holds at least V·H·4 bytes across backward."""
    N, H, V = 4096, 1024, 32768
    assert _held(name, N, H, V) >= V * H * 4


def test_numcheck_memory_prints_tables(capsys: pytest.CaptureFixture[str]) -> None:
    """``numcheck memory`` prints the one-chunk paths and a row per impl, recompute's held bytes O(N)."""
    from numcheck.reports.cli import main

    N, H, V, C = 256, 64, 1024, 32
    rc = main(["memory", "--shape", f"{N},{H},{V}", "--chunk", str(C), "--impl", "recompute", "--impl", "eager"])
    out = capsys.readouterr().out
    assert rc == 0
    fallback = next(line for line in out.splitlines() if line.strip().startswith("fallback"))
    assert f"{6 * V * H / memory.MiB:10.1f}" in fallback, fallback
    row = next(line for line in out.splitlines() if line.strip().startswith("recompute"))
    held_per_token = float(row.split()[3])
    assert 0 < held_per_token <= 16, row


def test_numcheck_memory_rejects_bad_shape(capsys: pytest.CaptureFixture[str]) -> None:
    """A malformed --shape is an argument error that names --shape."""
    from numcheck.reports.cli import main

    with pytest.raises(SystemExit):
        main(["memory", "--shape", "12,34"])
    assert "--shape must be N,H,V" in capsys.readouterr().err


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA for torch.cuda.max_memory_allocated")
def test_cuda_agrees_with_max_memory_allocated() -> None:
    """On CUDA the tracker's extra peak equals torch.cuda.max_memory_allocated's rise (512-byte blocks)."""
    V, H, C = 8192, 1024, 512
    gw = torch.zeros(V, H, device="cuda")
    G = torch.randn(C, V, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(C, H, device="cuda", dtype=torch.bfloat16)
    from numcheck.impls.builtin.grad_accum import PATHS

    for path in ("fallback", "fp32_operands"):
        tracked, cuda = memory.cuda_cross_check(lambda: PATHS[path](gw, G, x))
        assert tracked == cuda, (path, tracked, cuda)
