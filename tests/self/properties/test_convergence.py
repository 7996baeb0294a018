"""The tiny-model convergence run (numcheck.properties.convergence.run, ``numcheck converge``): correct built-in heads
stay inside the envelope eager's deviation from float64 draws, mutant heads leave it, and misuse is refused.

CI cost (2 cores, measured on the loaded 2-core dev machine, torch 2.13): the two fast-built-in runs ~3 s each,
the two interpreted-Triton runs ~10 s each (32 rows, 8 steps: Liger's kernels cost 0.4 s a step under
TRITON_INTERPRET=1), the rest ~1 s each, plus ~2–4 s once per process importing torch._dynamo (torch.optim).
"""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

import numcheck
from numcheck.impls.registry import ImplEntry, builtin_impls
from numcheck.properties.convergence import run as convergence
from numcheck.properties.convergence.model import ModelShape
from numcheck.properties.linear_ce.cases import dtype_of
from numcheck.reports.convergence import text as convergence_text
from numcheck.tests.self.helpers import mutants

DTYPES = ("float32", "bfloat16")


def _builtins(dtype: str, slow: bool) -> dict[str, object]:
    """Every available built-in linear+CE impl but eager (the reference itself) that declares ``dtype`` with ignore_index."""
    out = {}
    for e in builtin_impls():
        if not isinstance(e, ImplEntry) or e.kind != "linear-ce" or e.name == "eager":
            continue
        s = e.impl.support
        if (
            s.slow == slow
            and not s.unavailable_reason()
            and not s.refuses(dtype=dtype_of(dtype), device="cpu", options=("ignore_index",))
        ):
            out[e.name] = e.impl
    return out


def _report(result: convergence.ConvergenceResult) -> str:
    return convergence_text.markdown(result) + "\n".join(
        l for r in result.judged for l in result.failure_lines(r.label)
    )


@pytest.mark.parametrize("dtype", DTYPES)
def test_fast_builtins_stay_inside(dtype):
    """Every correct built-in head that runs natively on CPU stays inside eager's envelope for the default 30 steps."""
    impls = _builtins(dtype, slow=False)
    assert {"chunked[fp32_operands]", "recompute"} <= set(impls), sorted(impls)  # torch_native's need torch >= 2.12
    result = convergence.run(impls, dtype=dtype)
    assert result.ok, _report(result)
    assert result.runs["float64"].loss[-1] < result.runs["float64"].loss[0] - 1.0  # it trains


@pytest.mark.parametrize("dtype", DTYPES)
def test_interpreted_builtins_stay_inside(dtype):
    """Every correct built-in Triton head (Liger, numcheck's own; interpreted on CPU) stays inside, on a shorter run."""
    impls = _builtins(dtype, slow=True)
    if not impls:
        pytest.skip("no interpreted built-in is available here")
    result = convergence.run(impls, dtype=dtype, steps=8, shape=ModelShape(rows=32))
    assert result.ok, _report(result)


#: (mutant, dtype, the metric that must put it outside): a narrow accumulator, a loss rounded through bf16, a wrong
#: gradient scale (mean over all rows, ignored ones too), and the chunked twin's bf16 running sum of grad_weight.
MUTANT_HEADS = [
    (mutants.bf16_grad_weight_accum, "float32", "params"),
    (mutants.loss_bf16, "float32", "loss"),
    (mutants.MUTANTS[1], "float32", "params"),
    (mutants.gw_bf16_sum, "float32", "params"),
    (mutants.MUTANTS[1], "bfloat16", "params"),
]


@pytest.mark.parametrize("dtype", DTYPES)
def test_mutant_heads_leave(dtype):
    """Each mutant head leaves the envelope on the metric its bug moves, and the failure names step, distance, bound."""
    cases = [(m, metric) for m, d, metric in MUTANT_HEADS if d == dtype]
    result = convergence.run({m.name: m for m, _ in cases}, dtype=dtype, steps=12)
    for m, metric in cases:
        rec = result.runs[m.name]
        assert not rec.verdict[metric].inside, _report(result)
        # Clearly, not marginally: a correct head may err up to K (the head factor) times eager's distance, so
        # r > K·k keeps the mutant outside even when judged against such a head instead of eager (its r there
        # ≥ r/K). Measured r/k ≥ 7 (bf16 mutant_mean_over_N) and ≥ 230 (fp32) on seeds 0–3.
        K = result.envelope[metric].head
        assert rec.verdict[metric].worst_ratio > K * rec.verdict[metric].k, _report(result)
        line = next(l for l in result.failure_lines(m.name) if l.startswith(metric))
        assert "vs bound" in line and "step" in line, line
    assert not result.ok


def test_assert_converges_passes_and_fails():
    """assert_converges returns the result for a correct head and raises PropertyFailure naming a mutant and its rerun."""
    good = numcheck.assert_converges(_builtins("float32", slow=False)["chunked[fp32_operands]"], steps=5)
    assert good.ok and isinstance(good, numcheck.ConvergenceResult)
    with pytest.raises(numcheck.PropertyFailure) as excinfo:
        numcheck.assert_converges(mutants.loss_bf16, steps=5)
    text = str(excinfo.value)
    for word in ("mutant_loss_bf16", "outside the envelope", "loss: outside at step", "numcheck converge --impl"):
        assert word in text, text


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"stpes": 3}, ["unknown keyword 'stpes'", "steps"]),
        ({"dtype": "float8"}, ["dtype must be one of"]),
        ({"steps": 0}, ["steps must be an int >= 1"]),
        ({"ignored": 1.5}, ["ignored must be a fraction"]),
        ({"dtype": "float16", "impl": mutants.bf16_grad_weight_accum}, ["does not declare", "float16", "dtype=..."]),
        ({"label": "eager"}, ["label 'eager' is not allowed"]),
        ({"impl": object()}, ["needs a non-empty string attribute 'name'", "numcheck.linear_ce_impl"]),
    ],
)
def test_bad_arguments_are_refused_before_running(kwargs, words):
    """Each misuse raises InvalidAssertion saying what was wrong and how to fix it."""
    kwargs = dict(kwargs)
    impl = kwargs.pop("impl", mutants.loss_bf16)
    label = kwargs.pop("label", "new")
    with pytest.raises(numcheck.InvalidAssertion) as excinfo:
        convergence.run({label: impl}, **kwargs)
    for w in words:
        assert w in str(excinfo.value), f"{str(excinfo.value)!r} lacks {w!r}"


def test_run_is_deterministic_and_its_json_complete():
    """The same call gives the same curves; the JSON holds per-step distances, ratios, k and its derivation."""
    impl = _builtins("float32", slow=False)["chunked[fp32_operands]"]
    a, b = (convergence.run({"new": impl}, steps=4).to_json() for _ in range(2))
    for key in ("config", "envelope", "level"):
        assert a[key] == b[key]
    assert a["runs"]["new"]["loss"] == b["runs"]["new"]["loss"]
    v = json.loads(json.dumps(a))["runs"]["new"]["verdict"]["params"]
    assert len(v["ratio_per_step"]) == 4 and v["inside"] and v["k"] == a["envelope"]["params"]["k"]
    env = a["envelope"]["params"]
    assert env["k"] == pytest.approx(env["K_head"] * env["s"]) and env["K_head"] == 2.0 and env["s"] >= 1.0


def test_cli_writes_json_markdown_and_plots(tmp_path, capsys):
    """``numcheck converge`` prints the Markdown, writes JSON, Markdown and PNGs, and exits 1 when a head leaves."""
    from numcheck.reports.cli import main

    rc = main(
        [
            "converge",
            "--impl",
            "chunked[fp32_operands]",
            "--steps",
            "3",
            "--envelope-seeds",
            "1",
            "--out",
            str(tmp_path),
        ]
    )
    assert rc == 0, capsys.readouterr().out
    assert "**Convergence** (float32" in capsys.readouterr().out
    data = json.loads((tmp_path / "convergence.json").read_text())
    assert data["float32"]["runs"]["chunked[fp32_operands]"]["inside"] is True
    assert (tmp_path / "convergence.md").read_text().startswith("**Convergence**")
    pytest.importorskip("matplotlib")
    assert {p.name for p in (tmp_path / "float32").iterdir()} == {"convergence_loss.png", "convergence_distance.png"}
    rc = main(
        ["converge", "--impl", "numcheck.tests.self.helpers.mutants:loss_bf16", "--steps", "3", "--envelope-seeds", "1"]
    )
    out = capsys.readouterr().out
    assert rc == 1 and "outside" in out and "reproduce: `" in out, out
    assert "--envelope-seeds 1 " in out and "--shape vocab=64," in out, out


def _converge_parser():
    import argparse

    from numcheck.reports.convergence import command as converge

    p = argparse.ArgumentParser()
    converge.add_arguments(p)
    return p


def test_repro_line_carries_every_setting():
    """The printed reproduce line, parsed by numcheck converge's own options, gives back every setting of the run:
    dtype, steps, seed, the number of envelope seeds, ignored, device and the whole model shape."""
    import shlex

    shape = ModelShape(vocab=48, hidden=16, ffn=40, rows=24, lr=0.15, momentum=0.8)
    config = {
        "dtype": "bfloat16",
        "steps": 7,
        "seed": 3,
        "envelope_seeds": [4, 5],
        "ignored": 0.25,
        "device": "cpu",
        "shape": dataclasses.asdict(shape),
        "master_dtype": "float32",
    }
    line = convergence.repro_command(mutants.loss_bf16, config)
    args = _converge_parser().parse_args(
        shlex.split(line[line.index("numcheck converge") + len("numcheck converge") :])
    )
    assert (args.dtype, args.steps, args.seed, args.envelope_seeds, args.ignored, args.device, args.shape) == (
        ["bfloat16"],
        7,
        3,
        2,
        0.25,
        "cpu",
        shape,
    )
    assert set(convergence.OPTIONS) == {"dtype", "steps", "seed", "envelope_seeds", "ignored", "device", "shape"}


def test_bad_shape_option_names_the_key():
    """--shape with an unknown key or a value of the wrong type is refused naming it."""
    with pytest.raises(ValueError, match="'vocb=3'.*vocab"):
        convergence.parse_shape("vocb=3")
    with pytest.raises(ValueError, match="rows='x' is not an int"):
        convergence.parse_shape("rows=x")
    assert convergence.parse_shape("rows=16") == ModelShape(rows=16)


def _raises(x, weight, target, bias=None, **options):
    raise RuntimeError("this head is broken")


def test_a_head_that_raises_is_an_error_verdict_not_the_end(tmp_path, capsys):
    """An impl that raises while training gets an error record (outside, the exception, a reproduce line); the
    other impls are still trained and judged, and numcheck converge still writes its JSON and exits 1."""
    from numcheck.impls.builtin.eager import eager_impls
    from numcheck.impls.protocols.linear_ce import FunctionImpl

    broken = FunctionImpl("broken_head", _raises, eager_impls()[0].support)
    good = _builtins("float32", slow=False)["chunked[fp32_operands]"]
    result = convergence.run({"broken": broken, "good": good}, steps=3, envelope_seeds=1)
    assert [r.label for r in result.judged] == ["broken", "good"]
    assert result.runs["good"].inside and result.runs["broken"].inside is False and not result.ok
    assert "RuntimeError: this head is broken" in result.failure_lines("broken")[0]
    assert (
        "**error**" in convergence_text.markdown(result)
        and json.loads(json.dumps(result.to_json()))["runs"]["broken"]["error"]
    )
    with pytest.raises(numcheck.PropertyFailure, match="(?s)broken_head.*this head is broken.*reproduce: "):
        numcheck.assert_converges(broken, steps=3, envelope_seeds=1)


def test_envelope_is_undefined_when_eager_diverges():
    """A non-finite eager distance on any envelope seed makes k infinite: the envelope is undefined and no run is
    inside, a NaN one included (before: r = inf ≤ k = inf passed it), and the failure says why; with a defined
    envelope a non-finite r is outside too."""
    from numcheck.properties.convergence import envelope as env_

    level = {"params": [1.0, 1.0], "loss": [1.0, 1.0]}
    finite = {"params": [1.0, 2.0], "loss": [1.0, 1.5]}
    diverged = {"params": [1.0, math.inf], "loss": [1.0, math.nan]}
    fp32 = dtype_of("float32")
    undefined = env_.envelope([finite, diverged], (0, 1), dtype=fp32, n_eff=4096)
    assert all(math.isinf(e.k) for e in undefined.values())
    d_eager = {"params": [0.0, 1.0], "loss": [0.0, 0.5]}
    for d_run in (d_eager, {"params": [0.0, math.nan], "loss": [0.0, math.inf]}):
        verdict = env_.judge(d_run, d_eager, level, undefined)
        assert not any(v.inside or v.defined for v in verdict.values())
    defined = env_.envelope([finite, finite], (0, 1), dtype=fp32, n_eff=4096)
    nan_run = env_.judge({"params": [0.0, math.nan], "loss": [0.0, 0.5]}, d_eager, level, defined)
    assert nan_run["loss"].inside and not nan_run["params"].inside
    runs = {
        "eager": convergence.RunRecord("eager", "eager", [1.0, 1.0], d_eager),
        "new": convergence.RunRecord("new", "x", [1.0, 1.0], d_eager, env_.judge(d_eager, d_eager, level, undefined)),
    }
    result = convergence.ConvergenceResult(
        config={}, runs=runs, level=level, envelope=undefined, entropy=1.0, seconds=0.0
    )
    lines = result.failure_lines("new")
    assert not result.ok and len(lines) == 2 and all("envelope undefined" in line for line in lines)


def test_no_impl_declaring_the_dtype_is_bad_input(capsys):
    """numcheck converge with no impl declaring the requested dtype judges nothing: exit 2, saying so."""
    from numcheck.reports.cli import main

    rc = main(
        ["converge", "--impl", "numcheck.tests.self.helpers.mutants:bf16_grad_weight_accum", "--dtype", "float16"]
    )
    out = capsys.readouterr().out
    assert rc == 2 and "no impl declares any requested dtype (float16)" in out, out
