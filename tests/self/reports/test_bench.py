"""The benchmark's bookkeeping on CPU: floors follow the measured matmul rate, the Markdown names the rate
measurements behind them, and without CUDA the command says so (the timings themselves need a GPU)."""

from __future__ import annotations

import json

import pytest
import torch

from numcheck.reports import bench, cli


def _res() -> dict:
    return {
        "device": "test",
        "torch": torch.__version__,
        "time": "t",
        "skipped": [],
        "bf16_matmul_tflops": 700.0,
        "bf16_matmul_tflops_samples": {"start": [690.0, 700.0], "end": [800.0]},
        "cases": [
            {
                "impl": "a",
                "shape": [8192, 4096, 131072],
                "ms": 50.0,
                "floor_ms": 0.0,
                "share_of_floor": 0.0,
                "extra_peak_mib": 1.0,
                "held_mib": 0.0,
            }
        ],
    }


def test_rescale_recomputes_every_floor_and_share():
    """rescale_to_rate sets each case's floor to 6·BT·H·V / R and its share to floor / time."""
    res = _res()
    bench.rescale_to_rate(res, 800e12)
    c = res["cases"][0]
    assert res["bf16_matmul_tflops"] == 800.0
    assert c["floor_ms"] == pytest.approx(6 * 8192 * 4096 * 131072 / 800e12 * 1e3)
    assert c["share_of_floor"] == pytest.approx(c["floor_ms"] / 50.0)


def test_markdown_names_the_rate_measurements(tmp_path):
    """bench.md states the rate used and every measurement it was the best of; bench.json round-trips."""
    res = _res()
    bench.rescale_to_rate(res, 800e12)
    bench.write_results(res, tmp_path)
    md = (tmp_path / "bench.md").read_text()
    assert "800 TFLOP/s (best of the measurements start: 690, 700; end: 800)" in md, md
    assert json.loads((tmp_path / "bench.json").read_text())["cases"][0]["share_of_floor"] == pytest.approx(
        res["cases"][0]["share_of_floor"]
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message given where CUDA is absent")
def test_bench_without_cuda_says_so(capsys):
    """numcheck bench exits 2 and names the missing CUDA device instead of timing on CPU."""
    assert cli.main(["bench"]) == 2
    assert "needs a CUDA device" in capsys.readouterr().err
