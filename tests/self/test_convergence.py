"""The tiny-model convergence run (numcheck.properties.convergence, ``numcheck converge``): correct built-in heads
stay inside the envelope eager's deviation from float64 draws, mutant heads leave it, and misuse is refused.

CI cost (2 cores, measured on the loaded 2-core dev machine, torch 2.13): the two fast-built-in runs ~3 s each,
the two interpreted-Triton runs ~10 s each (32 rows, 8 steps: Liger's kernels cost 0.4 s a step under
TRITON_INTERPRET=1), the rest ~1 s each, plus ~2–4 s once per process importing torch._dynamo (torch.optim).
"""

from __future__ import annotations

import doctest
import json

import pytest

import numcheck
from numcheck.impls.registry import ImplEntry, builtin_impls
from numcheck.properties import convergence
from numcheck.properties.convergence_model import ModelShape
from numcheck.properties.problems import dtype_of
from numcheck.tests.self import mutants

DTYPES = ("float32", "bfloat16")


def _builtins(dtype: str, slow: bool) -> dict[str, object]:
    """Every available built-in linear+CE impl but eager (the reference itself) that declares ``dtype`` with ignore_index."""
    out = {}
    for e in builtin_impls():
        if not isinstance(e, ImplEntry) or e.kind != "linear_ce" or e.name == "eager":
            continue
        s = e.impl.support
        if s.slow == slow and not s.unavailable_reason() and not s.refuses(
                dtype=dtype_of(dtype), device="cpu", options=("ignore_index",)):
            out[e.name] = e.impl
    return out


def _report(result: convergence.ConvergenceResult) -> str:
    return result.markdown() + "\n".join(l for r in result.judged for l in result.failure_lines(r.label))


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
        assert rec.verdict[metric].worst_ratio > 3 * rec.verdict[metric].k, _report(result)  # clearly, not marginally
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


@pytest.mark.parametrize("kwargs, words", [
    ({"stpes": 3}, ["unknown keyword 'stpes'", "steps"]),
    ({"dtype": "float8"}, ["dtype must be one of"]),
    ({"steps": 0}, ["steps must be an int >= 1"]),
    ({"ignored": 1.5}, ["ignored must be a fraction"]),
    ({"dtype": "float16", "impl": mutants.bf16_grad_weight_accum}, ["does not declare", "float16", "dtype=..."]),
    ({"label": "eager"}, ["label 'eager' is not allowed"]),
    ({"impl": object()}, ["needs a non-empty string attribute 'name'", "numcheck.linear_ce_impl"]),
])
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

    rc = main(["converge", "--impl", "chunked[fp32_operands]", "--steps", "3", "--envelope-seeds", "1",
               "--out", str(tmp_path)])
    assert rc == 0, capsys.readouterr().out
    assert "**Convergence** (float32" in capsys.readouterr().out
    data = json.loads((tmp_path / "convergence.json").read_text())
    assert data["float32"]["runs"]["chunked[fp32_operands]"]["inside"] is True
    assert (tmp_path / "convergence.md").read_text().startswith("**Convergence**")
    pytest.importorskip("matplotlib")
    assert {p.name for p in (tmp_path / "float32").iterdir()} == {"convergence_loss.png", "convergence_distance.png"}
    rc = main(["converge", "--impl", "numcheck.tests.self.mutants:loss_bf16", "--steps", "3", "--envelope-seeds", "1"])
    out = capsys.readouterr().out
    assert rc == 1 and "outside" in out and "reproduce: `" in out, out


def test_doc_examples_run():
    """The convergence module's >>> examples run and give what they show."""
    result = doctest.testmod(convergence, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0, result
