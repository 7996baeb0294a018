"""``numcheck list`` shows every distributed impl with its backends, world sizes and declarations, and
``--impl NAME`` selects one."""

from __future__ import annotations

from numcheck.impls.registry import dist_impls
from numcheck.reports import cli


def test_list_shows_distributed_backends_and_world_sizes(capsys):
    """Each distributed impl is listed with its backends and world sizes as it declares them."""
    cli.main(["list"])
    out = capsys.readouterr().out
    for impl in dist_impls():
        assert f"{impl.name}  [dist-linear-ce, from " in out
        d = impl.dist
        assert (
            f"backends: {','.join(d.backends)}; world sizes: {','.join(map(str, d.world_sizes))}; "
            f"uneven vocab: {'yes' if d.uneven_vocab else 'no'}; smoothing convention: {d.smoothing}"
        ) in out


def test_list_one_distributed_impl_by_name(capsys):
    """``--impl`` with a distributed impl's name lists that impl alone."""
    name = dist_impls()[0].name
    assert cli.main(["list", "--impl", name]) == 0
    out = capsys.readouterr().out
    headers = [line for line in out.splitlines() if line and not line.startswith((" ", "#"))]
    assert headers == [f"{name}  [dist-linear-ce, from built-in]"]


def test_list_shows_tensor_parallel_world_sizes(capsys):
    """Each tensor-parallel FP8 impl is listed once, with its world sizes and backend."""
    from numcheck.impls.builtin.tp_fp8_linear import tp_fp8_linear_impls

    cli.main(["list"])
    out = capsys.readouterr().out
    for impl in tp_fp8_linear_impls():
        assert out.count(f"{impl.name}  [tp-fp8-linear, from built-in]") == 1
        assert f"world sizes: {','.join(map(str, impl.support.world_sizes))}; backend: torch.distributed" in out
