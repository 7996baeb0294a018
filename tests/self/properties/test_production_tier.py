"""The production-shape tier's own logic, on CPU at small shapes (the tier itself runs on CUDA, results/production/).

Covered here: the int32 boundary and the first-wrong-row naming, the int32 mutant's offset arithmetic and guard at
the production shape (without allocating it), that the mutant is correct below 2³¹ (Triton's interpreter), that a
wrong impl fails with its first wrong row named, the realistic inputs, the chunked oracle at the tier's default
blocks against float64 autograd, the crash/hang isolation of ``numcheck production`` and its JSON/Markdown.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from numcheck.impls.builtin.eager import eager_impls
from numcheck.impls.protocols.linear_ce import FunctionImpl
from numcheck.properties.core.compare import compare
from numcheck.properties.linear_ce.accuracy import AccuracyResult
from numcheck.properties.linear_ce.cases import Problem, build
from numcheck.properties.production.inputs import IGNORED_RUN, LOGIT_SCALE, logit_profile, scale_tensors
from numcheck.properties.production.tier import (
    INT32_LIMIT,
    SHAPES,
    Case,
    CaseContext,
    Shape,
    _row_lines,
    first_row_beyond,
    int32_first_row,
    judge_impl,
    parse_shapes,
)
from numcheck.reference.linear_ce import DEFAULT_ROW_CHUNK, DEFAULT_VOCAB_CHUNK
from numcheck.tests.self.helpers import production_mutants as scale_mutants
from numcheck.tests.self.reference.test_oracle import (
    assert_all_close,
    autograd_outputs,
    make_case,
    oracle_outputs,
    pair_bounds,
)

ROOT = Path(__file__).resolve().parents[3]
SMOKE = SHAPES["smoke"]


@pytest.mark.parametrize("V", [1, 2, 3, 50304, 128256, 131072, 151936, INT32_LIMIT, INT32_LIMIT + 1])
def test_int32_first_row_is_the_first_row_past_2_31(V):
    """int32_first_row(V) is the smallest row r with (r+1)·V > 2³¹ (checked against its definition)."""
    r = int32_first_row(V)
    assert (r + 1) * V > INT32_LIMIT and (r == 0 or r * V <= INT32_LIMIT)


def test_int32_first_row_of_the_issue_shapes():
    """At V=131072 the first wrapped row is 16384 (so BT ≥ 16385 crosses); at V=151936 it is 14134 (< 16384)."""
    assert int32_first_row(131072) == 16384 and int32_first_row(151936) == 14134
    assert [s.crosses_int32 for s in SHAPES["production"]] == [False, False, True]


def test_mutant_offsets_wrap_at_the_named_row_and_stay_in_the_guard():
    """The mutant's int32 offsets row·V + col (numpy int32, as the kernel forms them) first go negative in row
    int32_first_row(V), and every wrapped offset lands inside the guard in front of the logits."""
    shape = SHAPES["production"][2]
    V, N = shape.V, shape.N
    rows = np.arange(N, dtype=np.int32)
    with np.errstate(over="ignore"):
        last_col = rows * np.int32(V) + np.int32(V - 1)  # the row's largest offset, in int32 as the kernel's
        first_col = rows * np.int32(V)
    wrapped = np.nonzero(last_col < 0)[0]
    assert wrapped[0] == int32_first_row(V)
    lowest = int(first_col[first_col < 0].min()) if (first_col < 0).any() else int(last_col.min())
    assert (
        scale_mutants.GUARD + lowest >= 0 and scale_mutants.GUARD + int(last_col[wrapped].max()) < scale_mutants.GUARD
    )


def test_first_row_beyond_names_the_first_bad_row():
    """first_row_beyond returns the first row with an element beyond its bound, NaN where the oracle is finite
    included, and None for a clean tensor or a scalar."""
    o = torch.zeros(6, 3, dtype=torch.float64)
    b = torch.full_like(o, 0.1)
    a = o.clone().float()
    assert first_row_beyond(a, o, b) is None
    a[4, 1] = 0.5
    a[5, 0] = 0.2
    assert first_row_beyond(a, o, b) == 4
    a[2, 2] = math.nan
    assert first_row_beyond(a, o, b) == 2
    assert first_row_beyond(torch.tensor(1.0), torch.tensor(0.0, dtype=torch.float64), torch.tensor(0.1)) is None


def test_failure_line_names_the_int32_row():
    """A failing grad_x at an N·V > 2³¹ shape gets a line naming its first wrong row and the int32 row."""
    shape = Shape("int32", 16384, 4, 151936)
    o = torch.zeros(3, dtype=torch.float64)
    res = AccuracyResult(problem=None)  # type: ignore[arg-type]
    res.analytic["grad_x"] = compare("grad_x", torch.tensor([0.0, 1.0, 0.0]), o, torch.full_like(o, 0.1))
    line = _row_lines(res, {"grad_x": 14134}, shape)
    assert line == [
        "grad_x: first wrong row 14134 of 16384; the first row with (row+1)·V > 2^31 is 14134 (this one: int32 offsets)"
    ]


def test_parse_shapes():
    """--shapes takes the presets and NAME=NxHxV lists; anything else is a clear error."""
    assert parse_shapes("smoke") == SMOKE
    assert parse_shapes("a=8x4x10,b=5x3x7")[1] == Shape("b", 5, 3, 7, "custom")
    with pytest.raises(ValueError, match="neither a preset"):
        parse_shapes("a=8x4")


def test_realistic_inputs():
    """scale_tensors draws ignored rows in runs, a long-tailed logit spread, a few confident rows, and is
    reproducible from the seed."""
    p = Case(Shape("t", 2048, 64, 4099), "bf16", "cpu").problem
    t = scale_tensors(p)
    ign = (t.target == p.ignore_index).numpy()
    assert ign.sum() == p.n_ignored
    runs = np.count_nonzero(np.diff(ign.astype(int)) == 1) + int(ign[0])
    # Runs, not scattered rows: each drawn span adds a new run only when disjoint from the others, and then all of
    # its ≥ IGNORED_RUN[0] rows, but for the last one (cut to what is left), so runs ≤ n_ignored // 16 + 1 (13
    # here; scattered rows would give ~n_ignored).
    assert runs <= p.n_ignored // IGNORED_RUN[0] + 1
    prof = logit_profile(t, rows=2048)
    # A long upper tail: the median row's top sits above its median by more than V i.i.d. normals at the bulk's
    # scale reach on average (E max ≤ σ·√(2 ln V) = 12.2 here; measured 10.8 for such normals, 14.9 for these).
    assert prof["span"] > LOGIT_SCALE * math.sqrt(2 * math.log(p.V))
    # A few confident rows: some (i.i.d. normal logits at σ = 3 give none), and at most a tenth of the batch, the
    # stated meaning of "a few" beside the 1/64 lifted (measured 0.065 at seed 0, 0.005 at seeds 1 and 2: the
    # lift along W[target] also raises the classes the shared prior direction favours).
    assert 0 < prof["confident_rows"] <= 0.1
    assert torch.equal(scale_tensors(p).x, t.x)


def test_oracle_at_the_tiers_blocks_matches_autograd():
    """The chunked oracle with its default blocks (the tier's), N and V ragged over them, equals float64 autograd
    over the whole [N, V] within the oracle tests' derived float64 bounds."""
    c = make_case(N=DEFAULT_ROW_CHUNK + 7, H=6, V=DEFAULT_VOCAB_CHUNK + 9, bias=False, ignored="some")
    got = oracle_outputs(c)
    assert_all_close(got, autograd_outputs(c), pair_bounds(c), c, "autograd (default blocks)")


def _case(shape: Shape, precision: str = "bf16") -> CaseContext:
    return CaseContext.build(Case(shape, precision, "cpu"))


def test_mutant_passes_below_2_31():
    """The int32 mutant is a correct impl below 2³¹ elements (only the tier's int32 shape can catch it)."""
    ctx = _case(SMOKE[1])
    rec = judge_impl(scale_mutants.int32_offsets, ctx)
    assert rec["status"] == "pass", rec.get("failure")


def _rows_from(k: int):
    def impl(x, weight, target, bias=None, **options):
        x2 = x + 0
        x2.register_hook(lambda g: torch.cat([g[:k], 1.5 * g[k:]]))
        return eager_impls()[0](x2, weight, target, bias, **options)

    return impl


def test_wrong_rows_fail_with_the_first_named():
    """An impl whose grad_x is wrong from row k on fails the tier, in the suite's failure format, naming row k."""
    k = 37
    eager = eager_impls()[0]
    bad = FunctionImpl("rows_from_37", _rows_from(k), eager.support)
    rec = judge_impl(bad, _case(SMOKE[0]))
    assert rec["status"] == "fail"
    assert rec["outputs"]["grad_x"]["first_row_beyond"] == k
    text = rec["failure"]
    assert text.startswith("property 'production_accuracy' fails for impl 'rows_from_37'")
    assert f"grad_x: first wrong row {k} of 64" in text and "reproduce: " in text and "numcheck production" in text


def _scale(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "numcheck.reports.cli", "production", "--out", str(tmp_path), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=400,
        cwd=tmp_path,
    )


def test_isolated_run_survives_a_crash_and_a_hang(tmp_path):
    """With --isolate, an impl that kills its process and one that hangs past its cap are recorded (crashed,
    timeout) and every other item still runs; production.json and production.md say so; exit 1."""
    r = _scale(
        tmp_path,
        "--isolate",
        "--shapes",
        "a=16x8x40",
        "--precisions",
        "bf16",
        "--time-cap-s",
        "3",
        "--impl",
        "eager",
        "--impl",
        "numcheck.tests.self.helpers.production_bad_impls:crashes",
        "--impl",
        "numcheck.tests.self.helpers.production_bad_impls:hangs",
        "--impl",
        "chunked[fp32_operands]",
    )
    assert r.returncode == 1, r.stdout + r.stderr
    data = json.loads((tmp_path / "production.json").read_text())
    status = {rec["impl"]: rec["status"] for rec in data["records"]}
    assert status == {"eager": "pass", "crashes": "crashed", "hangs": "timeout", "chunked[fp32_operands]": "pass"}
    md = (tmp_path / "production.md").read_text()
    assert "| `crashes` | crashed" in md and "| `eager` | pass" in md


def test_bad_precision_is_a_clear_error(tmp_path):
    """An unknown --precisions value exits 2 naming it."""
    r = _scale(tmp_path, "--precisions", "fp8")
    assert r.returncode == 2 and "fp8" in r.stderr


def test_resume_reruns_only_what_did_not_finish(tmp_path):
    """A second run on the same --out keeps the finished items and runs the ones recorded not_run."""
    r = _scale(tmp_path, "--shapes", "a=16x8x40", "--precisions", "bf16", "--impl", "eager", "--budget-s", "0")
    data = json.loads((tmp_path / "production.json").read_text())
    assert [rec["status"] for rec in data["records"]] == ["not_run"], r.stdout + r.stderr
    _scale(tmp_path, "--shapes", "a=16x8x40", "--precisions", "bf16", "--impl", "eager")
    data = json.loads((tmp_path / "production.json").read_text())
    assert [rec["status"] for rec in data["records"]] == ["pass"]


def test_resume_retries_failed_and_crashed_items(tmp_path):
    """On resume, an earlier run's fail, error, timeout and crashed results are run again (with their stale
    start markers dropped) and a pass is kept, not rerun."""
    from numcheck.reports.production import command as scale

    case, code = "a/bf16", scale._code()
    old = [
        {"event": "case", "case": case, "code": code},
        *(
            {"event": "result", "case": case, "impl": i, "status": st, "code": code}
            for i, st in [("e1", "fail"), ("e2", "error"), ("e3", "timeout"), ("e4", "crashed"), ("ok", "pass")]
        ),
        {"event": "start", "case": case, "impl": "e5", "t": 0.0, "cap": 1.0},
    ]
    (tmp_path / scale.PROGRESS).write_text("".join(json.dumps(e) + "\n" for e in old))
    assert scale._retry_unsettled(tmp_path) == (4, 0)
    events = scale._events(tmp_path)
    assert scale._done(events) == {(case, "ok")} and scale._in_flight(events) is None
    assert [e["event"] for e in events] == ["case", "result"]


def test_resume_reruns_items_of_other_code_unless_keep_stale(tmp_path):
    """On resume, a pass recorded on other numcheck code (or with no code recorded) is run again, with its case's
    shared work; --keep-stale keeps it; an item of this code is kept either way."""
    from numcheck.reports.production import command as scale

    here = scale._code()
    events = [
        {"event": "case", "case": "a", "code": "other@2.6.0"},
        {"event": "result", "case": "a", "impl": "old", "status": "pass", "code": "other@2.6.0"},
        {"event": "result", "case": "a", "impl": "unknown", "status": "pass"},
        {"event": "case", "case": "b", "code": here},
        {"event": "result", "case": "b", "impl": "new", "status": "pass", "code": here},
    ]
    text = "".join(json.dumps(e) + "\n" for e in events)
    (tmp_path / scale.PROGRESS).write_text(text)
    assert scale._retry_unsettled(tmp_path, keep_stale=True) == (0, 0)
    assert len(scale._events(tmp_path)) == 5
    assert scale._retry_unsettled(tmp_path) == (0, 2)
    assert scale._done(scale._events(tmp_path)) == {("b", "new")}
    assert [e["event"] for e in scale._events(tmp_path)] == ["case", "result"]


WRONG_GRAD_X = """
from numcheck.impls.builtin.eager import eager_impls
from numcheck.impls.protocols.linear_ce import FunctionImpl


def _wrong(x, weight, target, bias=None, **options):
    x2 = x + 0
    x2.register_hook(lambda g: 1.5 * g)
    return eager_impls()[0](x2, weight, target, bias, **options)


impl = FunctionImpl("wrong_grad_x", _wrong, eager_impls()[0].support)
"""


def test_repro_line_reruns_the_one_case_afresh(tmp_path, monkeypatch):
    """The repro line of a failure names the single shape as NAME=NxHxV, its precision, device and a fresh --out
    with --force; run where that folder already holds a result for the item, it runs the item again (fail)
    rather than reassembling the old one (pass)."""
    import shlex

    from numcheck.impls.registry import discover
    from numcheck.properties.production.tier import REPRO_OUT, repro_command

    (tmp_path / "wrongmod.py").write_text(WRONG_GRAD_X)
    monkeypatch.syspath_prepend(str(tmp_path))
    case = Case(SMOKE[1], "bf16", "cpu")
    line = repro_command(discover(["wrongmod:impl"])[0].impl, case)
    assert f"--shapes ragged-small=50x24x203 --precisions bf16 --device cpu --out {REPRO_OUT} --force" in line
    out = tmp_path / REPRO_OUT
    out.mkdir()
    (out / "progress.jsonl").write_text(
        json.dumps({"event": "result", "case": case.label, "impl": "wrong_grad_x", "status": "pass"}) + "\n"
    )
    argv = shlex.split(line[line.index("numcheck production") + len("numcheck production") :])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    r = subprocess.run(
        [sys.executable, "-m", "numcheck.reports.cli", "scale", *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=400,
        cwd=tmp_path,
    )
    recs = json.loads((out / "production.json").read_text())["records"]
    assert [(x["case"], x["status"]) for x in recs] == [(case.label, "fail")], r.stdout + r.stderr
    assert r.returncode == 1


def _never_called(x, weight, target, bias=None, **options):
    raise AssertionError("an unavailable impl was called")


def test_broken_declaration_is_an_error_record_not_an_exception():
    """A support forced past validation (chunk_rows="x") raises inside the judgement; judge_impl records status
    'error' with the exception and a repro line instead of raising out of the tier."""
    eager = eager_impls()[0]
    support = dataclasses.replace(eager.support)
    object.__setattr__(support, "chunk_rows", "x")
    rec = judge_impl(FunctionImpl("bad_chunks", eager, support), _case(SMOKE[0]))
    assert rec["status"] == "error" and "TypeError" in rec["reason"], rec
    assert "fails for impl 'bad_chunks'" in rec["failure"] and "reproduce: " in rec["failure"]


def test_unavailable_impl_is_recorded_not_run():
    """An impl whose support.requires is unmet here is recorded 'unavailable' with its reason and never called."""
    eager = eager_impls()[0]
    gone = FunctionImpl("gone", _never_called, dataclasses.replace(eager.support, requires=lambda: "no such op here"))
    rec = judge_impl(gone, _case(SMOKE[0]))
    assert (rec["status"], rec["reason"]) == ("unavailable", "no such op here")


def test_known_divergence_is_decided_on_the_tiers_tensors(monkeypatch):
    """A failure covered by a data-decided known divergence is 'known' when the entry's predicate holds on the
    tier's own tensors (not build(p)'s), keeping its numbers; an entry that cannot read given tensors covers
    nothing, so the failure stays a failure."""
    from numcheck.properties.core.known import KnownDivergence
    from numcheck.properties.linear_ce import known

    ctx = _case(SMOKE[0])
    seen = []

    def on_tensors(p, t):
        seen.append(t)
        return True

    entry = KnownDivergence(
        impls="rows_from_37",
        properties=("accuracy",),
        devices=("cpu",),
        applies=lambda p: False,
        reason="a test entry",
        example=Problem(N=1, H=1, V=1),
        by_data=True,
        applies_to_tensors=on_tensors,
    )
    bad = FunctionImpl("rows_from_37", _rows_from(37), eager_impls()[0].support)
    monkeypatch.setattr(known, "KNOWN", [entry])
    rec = judge_impl(bad, ctx)
    assert rec["status"] == "known" and rec["known_divergence"] == "a test entry"
    assert seen and seen[0] is ctx.t
    assert rec["outputs"]["grad_x"]["ratio"] > 1 and "first wrong row 37" in rec["failure"]
    monkeypatch.setattr(known, "KNOWN", [dataclasses.replace(entry, applies_to_tensors=None)])
    assert judge_impl(bad, ctx)["status"] == "fail"


@pytest.mark.parametrize(
    "p",
    [
        Problem(N=16, H=32, V=256, dtype="bfloat16", regime="confident", seed=0),
        Problem(N=11, H=16, V=37, dtype="bfloat16", seed=1),
        Problem(N=40, H=48, V=67, dtype="float16", ignored=0.1, seed=5),
    ],
)
def test_cce_filtering_predicate_on_given_tensors(p, monkeypatch):
    """CCE's filtering predicate on build(p)'s tensors passed in equals its answer on p; taking the rows a few at a
    time (as at a production shape) changes nothing; other tensors give their own answer."""
    from numcheck.properties.linear_ce import known_cce

    want = known_cce.cce_filtering_may_skip(p, block_cols=128)
    assert known_cce.cce_filtering_may_skip(p, block_cols=128, t=build(p)) is want
    monkeypatch.setattr(known_cce, "FILTER_ROW_ELEMENTS", 3 * p.V)
    assert known_cce.cce_filtering_may_skip(p, block_cols=128) is want
    t = build(p)
    x = t.x.double() * 1e3  # every row confident in its own argmax: every |softmax − onehot| tiny
    top = (x @ t.weight.double().T).argmax(dim=1)
    confident = t._replace(x=x.to(t.x.dtype), target=torch.where(t.target == p.ignore_index, t.target, top))
    assert known_cce.cce_filtering_may_skip(p, block_cols=128, t=confident) is True


def test_bound_cache_shares_sweeps_within_its_budget():
    """The case's bound cache, planned for every registered impl and given room for three sweeps, returns every
    planned model's bounds bit for bit as linear_ce_bounds does, and never keeps more than three sweeps' gradient
    bounds alive, counted in bytes (siblings reachable through a kept entry's sweep included)."""
    from numcheck.impls.registry import by_kind, discover
    from numcheck.properties.linear_ce.tolerance import linear_ce_bounds
    from numcheck.properties.production.tier import BoundCache

    ctx = _case(SMOKE[1])
    p = ctx.case.problem
    impls = [e.impl for e in by_kind(discover([]), "linear-ce")]
    per = 8 * (p.N * p.H + p.V * p.H + p.V)
    cache = BoundCache(p, ctx.t, ctx.oracle, budget=3 * per)
    cache.plan(impls)
    assert len({repr(m) for _, m in cache.planned}) > 3
    for name, m in cache.planned:
        cache.start(impls[[i.name for i in impls].index(name)])
        got = cache(m)
        assert len(cache.swept) <= 3
        assert _gradient_bound_bytes(cache) <= 3 * per, (name, m)
        want = linear_ce_bounds(p, ctx.t, ctx.oracle, m)
        assert all(torch.equal(got[k], want[k]) for k in want), (name, m)


def _gradient_bound_bytes(cache) -> int:
    """Bytes of the distinct accumulated gradient bounds (grad_x, grad_W, grad_b) the cache's entries keep alive:
    each entry's own and every one reachable through its sweep."""
    accs = {}
    for r in cache.swept.values():
        for a in (r.acc, *r.sweep.accumulators.values()):
            accs[id(a)] = a
    return sum(t.numel() * t.element_size() for a in accs.values() for t in (a.gx, a.gw, a.gb))


def test_class_draw_follows_the_frequencies_and_repeats():
    """The tier's target draw (inverse CDF, no torch.multinomial) gives each class about its share of the draws
    and the same classes from the same generator seed."""
    from numcheck.properties.production.inputs import _draw_classes

    freq = torch.tensor([8.0, 4.0, 2.0, 1.0, 1.0, 0.0])
    draw = lambda: _draw_classes(freq, 20000, torch.Generator().manual_seed(3))  # noqa: E731
    got = draw()
    assert torch.equal(got, draw())
    share = torch.bincount(got, minlength=6).double() / got.numel()
    assert torch.allclose(share, freq.double() / freq.sum(), atol=0.01)
    assert share[5] == 0  # a zero-frequency class is never drawn
