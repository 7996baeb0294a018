"""``numcheck premerge --impl NEW --base OLD``: the A/B comparison, its memory and code paths, and the claims file.

The end-to-end test runs the installed entry point on ``examples/accumulation_change.py`` in a temporary directory
(about 30 s on 2 cores, 60 s with the other torch venv); the others call the library on the quick grid (a few
seconds each)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from numcheck.errors import ClaimsError
from numcheck.reports.premerge import ab as premerge_ab
from numcheck.reports.premerge import claims
from numcheck.tests.self.helpers import mutants

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "examples" / "accumulation_change.py"
CLAIMS = REPO / "examples" / "numcheck-claims.toml"
MiB = 2**20


# -- claims file ------------------------------------------------------------------------------------------
GOOD = """
[[claim]]
says = "saves memory"
metric = "peak_change_mib"
max = -10

[[claim]]
says = "fast"
metric = "time_ratio"
max = 1.0
speed = "high"
"""


def test_unknown_claim_key_names_file_line_and_table():
    """An unknown key is an error naming the file, the key's line and which [[claim]] table holds it."""
    with pytest.raises(ClaimsError) as exc:
        claims.parse(GOOD, "repo/numcheck-claims.toml")
    msg = str(exc.value)
    assert msg.startswith("repo/numcheck-claims.toml:11:"), msg
    assert "'speed'" in msg and "[[claim]] #2" in msg and "known keys" in msg, msg


@pytest.mark.parametrize(
    "text, words",
    [
        ('[[claim]]\nsays = "x"\nmetric = "speed"\nmax = 1\n', ("unknown metric 'speed'", ":3:")),
        ('[[claim]]\nsays = "x"\nmetric = "time_ratio"\n', ("states no bound",)),
        (
            '[[claim]]\nsays = "x"\nmetric = "time_ratio"\nmax = 1\ntorch = "two point eight"\n',
            ("not a version specifier", ":5:"),
        ),
        ('[[claim]]\nsays = "x"\nmetric = "time_ratio"\nmax = "1"\n', ("max = '1' must be int or float", ":4:")),
        ('[[claim]]\nmetric = "time_ratio"\nmax = 1\n', ("no 'says' (required)",)),
        ('[[claim]]\nsays = "x"\nmetric = "time_ratio"\nmax = 1\ndevice = "tpu"\n', ("device 'tpu'",)),
        ('[claims]\nsays = "x"\n', ("unknown key or table 'claims'", ":1:")),
    ],
)
def test_bad_claims_are_errors_that_say_what_and_where(text, words):
    """Each malformed claim (bad metric, no bound, bad specifier, wrong type, missing key, bad device, bad table) is
    refused with a message naming it and its line."""
    with pytest.raises(ClaimsError) as exc:
        claims.parse(text, "c.toml")
    for w in words:
        assert w in str(exc.value), str(exc.value)


def _run(device: str, torch_v: str, **metrics: float) -> dict:
    return {
        "env": {"device": device, "torch": torch_v, "cuda_available": device == "cuda", "python": "py"},
        "pairs": [{"new": "m:new", "new_name": "new", "metrics": metrics, "unmeasured": {}}],
    }


def test_claims_are_verified_only_where_they_can_be_measured():
    """A claim is judged in an environment matching its device and torch; elsewhere it is not verified, saying why
    (no CUDA device, another torch release and how to point premerge at one); a measured value outside the claimed
    range is false."""
    cs = claims.parse("""
[[claim]]
says = "a"
metric = "peak_change_mib"
max = -1000
[[claim]]
says = "b"
metric = "peak_change_mib"
min = 0
max = 0
torch = "<2.8"
[[claim]]
says = "c"
metric = "time_ratio"
max = 1.0
device = "cuda"
""")
    here = _run("cpu", "2.13.0+cpu", peak_change_mib=0.0)
    v = claims.judge(cs, [here])
    assert [x.status for x in v] == ["false", "not verified", "not verified"]
    assert "torch <2.8" in v[1].reason and "--python" in v[1].reason
    assert "no CUDA device" in v[2].reason
    v = claims.judge(cs, [here, _run("cpu", "2.6.0+cu124", peak_change_mib=0.0)])
    assert v[1].status == "true" and v[1].where.startswith("cpu, torch 2.6.0")
    v = claims.judge(cs, [_run("cuda", "2.11.0+cu130", peak_change_mib=-2048.0, time_ratio=0.8)])
    assert [x.status for x in v] == ["true", "not verified", "true"]


def test_claim_without_condition_is_judged_in_every_environment():
    """A claim stated for everywhere is judged in each environment that measures it: true in one and false in
    another is false, and both figures are reported (the torch 2.6 run is not skipped because 2.11 came first)."""
    cs = claims.parse('[[claim]]\nsays = "3072 MiB -> 0 MiB"\nmetric = "step_extra_mib"\nmax = 0\n')
    runs = [_run("cuda", "2.11.0+cu130", step_extra_mib=0.0), _run("cuda", "2.6.0+cu124", step_extra_mib=3072.0)]
    (v,) = claims.judge(cs, runs)
    assert v.status == "false" and v.value == 3072.0 and "2.6.0" in v.where, v
    assert [(m.value, m.holds) for m in v.measured] == [(0.0, True), (3072.0, False)], v.measured
    (v,) = claims.judge(cs, runs[:1])
    assert v.status == "true" and len(v.measured) == 1, v


def test_pairs_with_the_same_new_are_judged_apart():
    """Two pairs sharing a NEW spec (against two BASEs) get a verdict each, named by their BASE."""
    cs = claims.parse('[[claim]]\nsays = "a"\nmetric = "peak_change_mib"\nmax = 0\n')
    run = _run("cpu", "2.13.0", peak_change_mib=-5.0)
    run["pairs"].append(
        {"new": "m:new", "base": "m:other", "new_name": "new", "metrics": {"peak_change_mib": 7.0}, "unmeasured": {}}
    )
    run["pairs"][0]["base"] = "m:old"
    v = claims.judge(cs, [run])
    assert [(x.pair, x.status) for x in v] == [("m:new (vs m:old)", "true"), ("m:new (vs m:other)", "false")], v


def test_failed_environment_leaves_its_claims_not_verified():
    """An environment whose measurement failed judges nothing: a claim only it could verify is not verified, with
    the failure's last line as the reason."""
    from numcheck.reports.premerge.ab_run import failed_run

    cs = claims.parse('[[claim]]\nsays = "b"\nmetric = "peak_change_mib"\nmax = 0\ntorch = "<2.8"\n')
    bad = failed_run("/venv/bin/python", "cpu", "Traceback ...\nModuleNotFoundError: No module named 'numcheck'")
    (v,) = claims.judge(cs, [_run("cpu", "2.13.0", peak_change_mib=0.0), bad])
    assert v.status == "not verified", v
    assert "measurement failed there: ModuleNotFoundError: No module named 'numcheck'" in v.reason, v.reason


# -- accuracy ---------------------------------------------------------------------------------------------
def test_mutant_new_fails_the_accuracy_comparison():
    """NEW = the built-in chunked[fp32_operands] with grad_weight's running sum in bf16 (a twin of tests/self/mutants)
    against the built-in: NEW fails problems BASE passes and grad_weight is flagged as materially worse."""
    base = premerge_ab.load_one("chunked[fp32_operands]")
    a = premerge_ab.accuracy_ab(mutants.gw_bf16_sum, base, "quick", "cpu", None, premerge_ab.DEFAULT_GROWTH_FLOOR)
    assert a["base_pass"] == a["n_both"] > 0 and a["new_failures"], a
    flagged = {o["output"] for o in a["outputs"] if o["flagged"]}
    assert flagged == {"grad_weight"}, a["outputs"]
    assert not premerge_ab.accuracy_ok(a)


def test_headroom_is_flagged_while_both_pass():
    """The bf16-running-sum twin declaring bf16 only (the suite's ci profile misses it, docs/detection.md), in 4-row
    chunks: it passes every problem both declare, yet takes nearly all the headroom grad_weight had below its bound
    (past its threshold, 0.63) and the comparison fails; the unmutated twin in the same chunks is not flagged."""
    base = premerge_ab.load_one("chunked[fp32_operands]")
    floor = premerge_ab.DEFAULT_GROWTH_FLOOR
    a = premerge_ab.accuracy_ab(mutants.gw_bf16_sum_bf16_only.with_chunk_rows(4), base, "quick", "cpu", None, floor)
    assert a["new_pass"] == a["n_both"] > 0, a["new_failures"]
    gw = next(o for o in a["outputs"] if o["output"] == "grad_weight")
    assert gw["flagged"] and gw["headroom"] > premerge_ab.DEFAULT_HEADROOM["grad_weight"], gw
    assert [o["output"] for o in a["outputs"] if o["flagged"]] == ["grad_weight"], a["outputs"]
    assert not premerge_ab.accuracy_ok(a)
    same = premerge_ab.accuracy_ab(base.with_chunk_rows(4), base, "quick", "cpu", None, floor)
    assert premerge_ab.accuracy_ok(same), same["outputs"]


@pytest.mark.parametrize(
    "new, base",
    [
        (n, b)
        for c in ("chunked[fallback]", "chunked[fp32_operands]", "chunked[lowp_accum]")
        for n, b in (("eager", c), (c, "eager"))
    ],
)
def test_correct_refactor_is_not_flagged(new, base):
    """eager and each chunked path, either way round, are a correct change: nothing is flagged although their worst
    error/bounds differ up to 3.4× (the ratio the old growth factors failed on)."""
    a = premerge_ab.accuracy_ab(
        premerge_ab.load_one(new), premerge_ab.load_one(base), "quick", "cpu", None, premerge_ab.DEFAULT_GROWTH_FLOOR
    )
    assert premerge_ab.accuracy_ok(a), [(o["output"], o["new"], o["base"], o["headroom"]) for o in a["outputs"]]


def test_headroom_taken():
    """(NEW − BASE)/(1 − BASE): 0 when no worse, 1 at NEW's bound, small far inside the bound, NaN when BASE fails."""
    h = premerge_ab.headroom_taken
    assert h(0.4, 0.4) == 0.0 and h(1.0, 0.2) == 1.0 and h(0.2, 0.6) < 0
    assert h(0.03, 0.01) == pytest.approx(0.02 / 0.99)
    assert math.isnan(h(1.5, 1.0))


def test_cases_only_one_side_declares_are_listed():
    """Problems only one side declares are listed with the other side's reason, not compared and not dropped."""
    base = premerge_ab.load_one("chunked[fp32_operands]")
    a = premerge_ab.accuracy_ab(mutants.gw_bf16_sum_bf16_only, base, "smoke", "cpu", None, 0.05)
    assert a["only_base"] and not a["only_new"]
    assert all(c["why"].startswith("NEW: ") for c in a["only_base"])


# -- memory and paths -------------------------------------------------------------------------------------
@pytest.mark.torch_versions(reason="the addmm_out_dtype probe: the path chunked[addmm_out_dtype] takes on this torch")
def test_meta_memory_takes_the_path_of_this_device():
    """On CPU, chunked[addmm_out_dtype] runs as its fp32-operand fallback, so at the seed's shapes on meta its peak is
    the fallback's step difference below chunked[fallback]'s: V·H·(2+4) − (V·C + C·H)·4 bytes = 3072 − 1056 MiB."""
    from numcheck.impls.measure import capabilities

    if capabilities.addmm_out_dtype("cpu", torch.bfloat16):
        pytest.skip("addmm(out_dtype=) is live on this CPU build")
    m = premerge_ab.memory_ab(
        premerge_ab.load_one("chunked[addmm_out_dtype]"), premerge_ab.load_one("chunked[fallback]"), "cpu"
    )
    V, H, C = 131072, 4096, 2048
    expected = ((V * C + C * H) * 4 - V * H * 6) / MiB
    assert m["new"]["peak_mib"] - m["base"]["peak_mib"] == pytest.approx(expected, abs=1e-6), m


def test_code_paths_show_the_matmul_each_side_dispatches():
    """The trace shows chunked[fallback]'s bf16 mm and chunked[fp32_operands]'s fp32 addmm on this device, and the
    probe that gates addmm(out_dtype=) here."""
    p = premerge_ab.paths_ab(
        premerge_ab.load_one("chunked[fallback]"), premerge_ab.load_one("chunked[fp32_operands]"), "cpu"
    )
    assert "aten.mm(bfloat16, bfloat16) -> bfloat16" in p["new"]["ops"], p
    assert any(k.startswith("aten.addmm(float32, float32, float32)") for k in p["base"]["ops"]), p
    assert "addmm_out_dtype[bfloat16]" in p["probes"]
    assert "fp32_operands" in p["base"]["resolved"]


def _example() -> Any:
    spec = importlib.util.spec_from_file_location("accumulation_change_under_test", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _step_claim_verdict(new: Any, base: Any) -> claims.Verdict:
    """Claim #1 of the example's claims file judged on the step measured here (CPU: meta, probes pinned)."""
    pair = {"new": "n:new", "new_name": new.name, "step": premerge_ab.step_ab(new, base, "cpu")}
    pair["metrics"], pair["unmeasured"] = premerge_ab.metrics_of(pair)
    env = {"device": "cpu", "torch": torch.__version__, "cuda_available": False, "python": "py"}
    return claims.judge([claims.load(CLAIMS)[0]], [{"env": env, "pairs": [pair]}])[0]


def test_step_claim_is_false_on_the_fallback_path():
    """On CPU the example's NEW step takes mm(...).float(): V·H·(2+4) bytes = 3072 MiB extra, as OLD's, so the claim
    step_extra_mib ≤ 0 is measured false."""
    ex = _example()
    v = _step_claim_verdict(ex.new, ex.old)
    assert v.claim.metric == "step_extra_mib" and v.status == "false", v
    assert v.value == 131072 * 4096 * 6 / MiB == 3072.0, v


@pytest.mark.torch_versions(
    reason="the addmm_out_dtype_meta probe: whether this torch traces addmm(out_dtype=) on meta"
)
def test_step_claim_is_true_with_the_probe_live():
    """With addmm(out_dtype=) forced live (as on CUDA with torch ≥ 2.8), the example's NEW step writes into gw:
    0 MiB extra, and the claim is true; OLD's step is still 3072 MiB (step_change_mib -3072)."""
    from numcheck.impls.measure import capabilities

    if not capabilities.addmm_out_dtype_meta(torch.bfloat16):
        pytest.skip("this torch cannot trace addmm(out_dtype=) on meta")
    ex = _example()
    with capabilities.forced(addmm_out_dtype=True):
        v = _step_claim_verdict(ex.new, ex.old)
        st = premerge_ab.step_ab(ex.new, ex.old, "cpu")
    assert v.status == "true" and v.value == 0.0, v
    assert premerge_ab.metrics_of({"step": st})[0]["step_change_mib"] == -3072.0, st


def test_step_claim_is_not_verified_for_an_impl_without_a_step():
    """A NEW that exposes no accumulation_step: its step is 'not measurable for this impl' and the claim is not
    verified, naming the reason; nothing crashes."""
    ex = _example()
    v = _step_claim_verdict(premerge_ab.load_one("chunked[fallback]"), ex.old)
    assert v.status == "not verified", v
    assert "not measurable for this impl" in v.reason and "accumulation_step" in v.reason, v.reason


def test_time_is_not_measured_on_cpu():
    """Without CUDA the time ratio is 'not measured here', never a number."""
    t = premerge_ab.time_ab(None, None, "cpu", 3)
    assert t == {"measured": False, "reason": "not measured here (cpu: time is measured on CUDA)"}


def test_pairs_must_match_up():
    """--impl and --base pair up by position; unequal counts are bad input naming both lists."""
    with pytest.raises(ValueError, match="2 --impl .* 1 --base"):
        premerge_ab.pairs_from(["a:x", "b:y"], ["c:z"])


# -- end to end: the example pair --------------------------------------------------------------------------
def _other_venv() -> Path | None:
    name = ".venv" if torch.__version__.startswith("2.6") else ".venv-torch2.6.0"
    py = REPO / name / "bin" / "python"
    return py if py.exists() else None


def test_example_pair_claim_is_measured_false_on_the_fallback_path(tmp_path, monkeypatch, capfd):
    """The example's "extra peak 3072 MiB → 0 MiB" claim, stated for every device, is measured false here: on CPU
    NEW's grad_weight step takes mm(...).float() as OLD's does (3072 MiB each), and the whole call's peak changes
    by 0 MiB; the CUDA time claim is not verified here;
    the older-torch claim is verified in a torch < 2.8 environment (this one or --python the other venv);
    exit 1; ab.json holds it all."""
    shutil.copy(EXAMPLE, tmp_path / "accumulation_change.py")
    shutil.copy(CLAIMS, tmp_path / "numcheck-claims.toml")
    from numcheck.reports import cli

    monkeypatch.chdir(tmp_path)  # premerge reads ./numcheck-claims.toml
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.delitem(sys.modules, "accumulation_change", raising=False)
    cmd = ["premerge", "--impl", "accumulation_change:new", "--base", "accumulation_change:old"]
    cmd += ["--out", str(tmp_path / "ab")]
    other = _other_venv()
    if other is not None:
        cmd += ["--python", str(other)]
    capfd.readouterr()
    code = cli.main(cmd)  # in this process; another --python's measurement is a process it starts
    out, err = capfd.readouterr()
    proc = subprocess.CompletedProcess(cmd, code, out, err)
    out = proc.stdout
    assert proc.returncode == 1, f"exit {proc.returncode}\n{out}\n{proc.stderr[-3000:]}"
    assert "**Memory Benchmark**" in out and "change:" in out and "+0 MiB peak" in out, out
    assert "BASE 3072 MiB, NEW 3072 MiB" in out, out
    data = json.loads((tmp_path / "ab" / "ab.json").read_text())
    verdicts = {c["claim"]: c for c in data["claims"]}
    assert verdicts[1]["status"] == "false" and verdicts[1]["value"] == 3072.0, verdicts[1]
    step = data["runs"][0]["pairs"][0]["step"]
    assert step["new"] == step["base"] == {"extra_mib": 3072.0}, step
    assert verdicts[3]["status"] == "not verified" and "no CUDA device" in verdicts[3]["reason"]
    old_torch_here = claims.torch_release(torch.__version__) < claims.torch_release("2.8")
    assert verdicts[2]["status"] == ("true" if (old_torch_here or other is not None) else "not verified"), verdicts[2]
    assert verdicts[4]["status"] == "true", verdicts[4]
    assert "1 claim(s) measured false (#1)" in out


def test_claims_file_error_is_bad_input(tmp_path, capsys):
    """premerge with a claims file holding an unknown key exits 2 before measuring anything, naming file and line.
    (Run in this process, as test_premerge's bad-input tests are: a python start and torch import for an exit 2.)"""
    from numcheck.reports import cli

    bad = tmp_path / "c.toml"
    bad.write_text(GOOD)
    code = cli.main(
        ["premerge", "--impl", "chunked[fallback]", "--base", "chunked[fp32_operands]", "--claims", str(bad)]
    )
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"{bad}:11: unknown key 'speed'" in err, err


def test_failed_python_is_recorded_not_bad_input(tmp_path, capsys, monkeypatch):
    """A --python interpreter that fails after the local measurement ran: the run goes on, ab.json records that
    environment as failed with its stderr's tail, the claim only it could judge is not verified, exit 1 (not 2).
    (The command runs in this process; the interpreter it starts is the failing one.)"""
    from numcheck.reports import cli

    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho \"ModuleNotFoundError: No module named 'numcheck'\" >&2\nexit 1\n")
    fake.chmod(0o755)
    (tmp_path / "c.toml").write_text('[[claim]]\nsays = "b"\nmetric = "peak_change_mib"\nmax = 0\ntorch = "<2.0"\n')
    monkeypatch.chdir(tmp_path)
    code = cli.main(
        [
            "premerge",
            "--impl",
            "chunked[fallback]",
            "--base",
            "chunked[fp32_operands]",
            "--grid",
            "smoke",
            "--no-convergence",
            "--claims",
            str(tmp_path / "c.toml"),
            "--python",
            str(fake),
            "--out",
            str(tmp_path / "ab"),
        ]
    )
    out, err = capsys.readouterr()
    assert code == 1, err[-3000:]
    assert "could not measure" in out and "No module named 'numcheck'" in out, out
    data = json.loads((tmp_path / "ab" / "ab.json").read_text())
    assert "No module named 'numcheck'" in data["runs"][1]["env"]["failed"], data["runs"][1]
    assert data["runs"][0]["pairs"][0]["accuracy"]["n_both"] > 0
    (v,) = data["claims"]
    assert v["status"] == "not verified" and "measurement failed there" in v["reason"], v


# -- convergence ------------------------------------------------------------------------------------------
def _declaring(name: str, **support: Any) -> Any:
    """A plain F.linear + F.cross_entropy impl declaring ``support`` (only what the convergence case reads)."""
    import torch.nn.functional as F

    from numcheck.impls.protocols.linear_ce import linear_ce_impl

    @linear_ce_impl(name=name, autocast=(), **support)
    def impl(x, weight, target, bias=None, *, reduction="mean", ignore_index=-100):
        return F.cross_entropy(
            F.linear(x, weight, bias).float(), target, reduction=reduction, ignore_index=ignore_index
        )

    return impl


def test_convergence_runs_in_a_case_both_declare():
    """The A/B convergence run takes a dtype both sides declare and no padding when one lacks ignore_index
    (cce[impl=torch_compile]'s case: bf16/fp16, no options); with no dtype in common it is 'not run', saying why."""
    from numcheck.reports.premerge.ab_run import convergence_case

    eager = premerge_ab.load_one("eager")
    lowp = _declaring("lowp_no_options", dtypes=("bfloat16", "float16"), options=())
    assert convergence_case(lowp, eager, "cpu") == ({"dtype": "bfloat16", "ignored": 0.0}, "")
    assert convergence_case(eager, eager, "cpu") == ({"dtype": "float32", "ignored": 0.125}, "")
    settings, why = convergence_case(
        _declaring("fp16_only", dtypes=("float16",)), _declaring("fp32_only", dtypes=("float32",)), "cpu"
    )
    assert settings is None and "no dtype both sides declare" in why and "fp32_only" in why, why


def test_base_outside_the_envelope_is_not_judged():
    """A BASE that itself leaves the convergence envelope does not fail the change ("BASE itself fails: not
    judged"); the same mutant as NEW against eager fails."""
    from numcheck.reports.premerge.ab_run import convergence

    mut = "numcheck.tests.self.helpers.mutants:loss_bf16"
    _, data, ok = convergence([premerge_ab.Pair("eager", mut)], "cpu", None)
    assert ok and data["pairs"][0]["status"].startswith("BASE itself fails"), data["pairs"][0]["status"]
    _, data, ok = convergence([premerge_ab.Pair(mut, "eager")], "cpu", None)
    assert not ok and "NEW outside" in data["pairs"][0]["status"], data["pairs"][0]["status"]


def test_spread_refuses_a_mistyped_impl():
    """tools/premerge_spread.py does not skip a spec that does not load: it is bad input naming the spec (exit 2)."""
    spec = importlib.util.spec_from_file_location("premerge_spread", REPO / "tools" / "premerge_spread.py")
    premerge_spread = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(premerge_spread)

    with pytest.raises(ValueError, match="no_such_impl"):
        premerge_spread.load_impls(("eager", "no_such_impl"))
    assert premerge_spread.main(["--impl", "no_such_impl", "--seeds", "1"]) == 2
