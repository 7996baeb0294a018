"""Declarations are validated where they are made: the message names the user's file:line, what is wrong and the fix."""

from __future__ import annotations

import sys
import textwrap
import uuid
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F

from numcheck import (
    Fp8LinearSupport,
    FunctionImpl,
    LinearCESupport,
    fp8_linear_impl,
    linear_ce_impl,
    make_fp8_support,
    make_support,
)
from numcheck.errors import InvalidDeclaration
from numcheck.impls.protocols.grouped_fp8_linear import GroupedFp8Support
from numcheck.impls.protocols.linear_ce import validate_impl
from numcheck.impls.registry import BrokenImpl, load_spec
from numcheck.properties.linear_ce.undrawable import undrawable_reason
from numcheck.reference.fp8_recipes import Fp8Recipe


def _ce(x, weight, target, bias=None, *, reduction="mean", ignore_index=-100):
    return F.cross_entropy(F.linear(x, weight, bias), target, reduction=reduction, ignore_index=ignore_index)


def _no_ignore_index(x, weight, target, bias=None, *, reduction="mean"):
    return F.cross_entropy(F.linear(x, weight, bias), target, reduction=reduction)


def _fp8(x, weight, bias=None, *, recipe, save_original_input):
    return F.linear(x, weight, bias)


def _raise_site(excinfo: pytest.ExceptionInfo) -> str:
    """``file:line`` of the line in this file that made the raising declaration (the innermost frame here)."""
    entry = [e for e in excinfo.traceback if str(e.path) == __file__][-1]
    return f"{__file__}:{entry.lineno + 1}"


#: (declaration, words its message must hold). Each lambda is the user's declaring line.
BAD: dict[str, tuple[Callable[[], Any], tuple[str, ...]]] = {
    "gpu_device": (
        lambda: linear_ce_impl(name="m", devices=("gpu",))(_ce),
        ("unknown device type 'gpu'", "('cpu', 'cuda')", "Did you mean 'cuda'?"),
    ),
    "device_string": (lambda: linear_ce_impl(name="m", devices="cuda")(_ce), ("one string", "devices=('cuda',)")),
    "empty_devices": (lambda: make_support(devices=()), ("devices is empty",)),
    "empty_dtypes": (lambda: linear_ce_impl(name="m", dtypes=())(_ce), ("dtypes is empty", "at least one of")),
    "dtype_alias": (lambda: linear_ce_impl(name="m", dtypes=("bf16",))(_ce), ("'bf16'", "Did you mean 'bfloat16'?")),
    "dtype_unknown": (lambda: make_support(dtypes=("float99",)), ("'float99'", "('float32', 'bfloat16', 'float16')")),
    "autocast_fp32": (
        lambda: make_support(autocast=("float32",)),
        ("autocast", "'float32'", "('bfloat16', 'float16')"),
    ),
    "option_typo": (
        lambda: linear_ce_impl(name="m", options=("bias", "zloss"))(_ce),
        ("['zloss']", "Did you mean 'z_loss'?"),
    ),
    "option_kwarg_name": (
        lambda: make_support(options=("z_loss_scale",)),
        ("['z_loss_scale']", "Did you mean 'z_loss'?"),
    ),
    "combination_typo": (
        lambda: make_support(option_combinations_excluded=[("softcap", "zloss")]),
        ("option_combinations_excluded", "'z_loss'"),
    ),
    "empty_reductions": (lambda: make_support(reductions=()), ("reductions is empty",)),
    "deterministic_not_bool": (lambda: make_support(deterministic="no"), ("deterministic", "must be True or False")),
    "reduction_alias": (lambda: make_support(reductions=("avg",)), ("['avg']", "Did you mean 'mean'?")),
    "decorator_keyword": (
        lambda: linear_ce_impl(name="m", dtype=("float32",))(_ce),
        ("unknown keyword argument 'dtype'", "Did you mean 'dtypes'?"),
    ),
    "make_support_keyword": (
        lambda: make_support(device=("cpu",)),
        ("make_support() got an unknown keyword argument 'device'", "Did you mean 'devices'?"),
    ),
    "direct_support": (lambda: LinearCESupport(devices=frozenset({"gpu"})), ("LinearCESupport.devices", "'cuda'")),
    "option_not_in_signature": (
        lambda: linear_ce_impl(name="m", options=("bias", "z_loss"))(_ce),
        ("cannot take z_loss_scale=...", "['z_loss']", "out of options="),
    ),
    "always_passed_keyword": (
        lambda: linear_ce_impl(name="m", options=())(_no_ignore_index),
        ("takes no keyword ignore_index", "every call passes"),
    ),
    "function_impl_default_support": (
        lambda: FunctionImpl(name="m", fn=_ce, support=LinearCESupport()),
        ("impl 'm'", "label_smoothing=...", "z_loss_scale=..."),
    ),
    "empty_name": (lambda: linear_ce_impl(name="", dtypes=("float32",)), ("non-empty string",)),
    "quant_empty_recipes": (lambda: fp8_linear_impl(name="q", recipes=())(_fp8), ("recipes is empty",)),
    "quant_recipe_alias": (
        lambda: fp8_linear_impl(name="q", recipes=("mx",))(_fp8),
        ("'mx'", "Did you mean 'mxfp8'?"),
    ),
    "quant_gpu_device": (
        lambda: fp8_linear_impl(name="q", devices=("gpu",))(_fp8),
        ("unknown device type 'gpu'", "Did you mean 'cuda'?"),
    ),
    "quant_dtype_alias": (lambda: make_fp8_support(dtypes=("fp16",)), ("'fp16'", "Did you mean 'float16'?")),
    "quant_empty_dtypes": (lambda: Fp8LinearSupport(dtypes=()), ("Fp8LinearSupport.dtypes is empty",)),
    "quant_keyword": (
        lambda: fp8_linear_impl(name="q", recipe=("current",))(_fp8),
        ("unknown keyword argument 'recipe'", "Did you mean 'recipes'?"),
    ),
    "quant_signature": (
        lambda: fp8_linear_impl(name="q", recipes=("current",))(_fp8),
        ("takes no keyword scaling_state",),
    ),
    "quant_dim_multiple_zero": (
        lambda: fp8_linear_impl(name="q", dim_multiple=0)(_fp8),
        ("dim_multiple=0 must be an int >= 1", "dim_multiple=16"),
    ),
    "quant_dim_multiple_lower_case": (
        lambda: make_fp8_support(dim_multiple={"k": 16}),
        ("names ['k']", "The dimensions are upper case: ['K']"),
    ),
    "quant_dim_multiple_value": (
        lambda: Fp8LinearSupport(dim_multiple={"K": 16.0}),
        ("must map each dimension to an int >= 1",),
    ),
    "grouped_dim_multiple": (
        lambda: GroupedFp8Support(dim_multiple=16),
        ("declares its shapes per expert", "split_alignment", "feature_alignment"),
    ),
    "quant_accum_block_not_int": (
        lambda: make_fp8_support(accum_block=32.0, accum_unit_roundoff=2.0**-13),
        ("accum_block must be positive ints or None", "32 for Hopper's FP8 tensor cores"),
    ),
    "quant_accum_chunk_not_multiple_of_block": (
        lambda: make_fp8_support(accum_block=32, accum_chunk=100, accum_unit_roundoff=2.0**-13),
        ("accum_chunk=100 on 'cpu' is not a multiple of accum_block=32", "accum_block=32, accum_chunk=128"),
    ),
    "quant_slow_not_bool": (lambda: make_fp8_support(slow="yes"), ("slow",)),
    "quant_exposes_without_quantize": (
        lambda: fp8_linear_impl(name="q", exposes_quantize=True)(lambda x, w, b=None, **k: x),
        ("exposes_quantize=True", "quantize="),
    ),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_declaration_is_refused_at_the_users_line(case: str) -> None:
    """A malformed declaration raises InvalidDeclaration whose message starts at the declaring file:line and says the fix."""
    declare, words = BAD[case]
    with pytest.raises(InvalidDeclaration) as excinfo:
        declare()
    msg = str(excinfo.value)
    assert msg.startswith(_raise_site(excinfo) + ": "), f"{case}: message does not start at the declaring line:\n{msg}"
    for w in words:
        assert w in msg, f"{case}: message lacks {w!r}:\n{msg}"


def test_bad_declaration_in_an_outside_module_names_its_line(tmp_path, monkeypatch) -> None:
    """Loaded by spec, a module whose declaration is malformed is a broken impl whose error names that module's line."""
    name = f"nc_decl_{uuid.uuid4().hex[:8]}"
    path = tmp_path / f"{name}.py"
    path.write_text(
        textwrap.dedent("""\
        import torch.nn.functional as F
        from numcheck import linear_ce_impl

        @linear_ce_impl(name="gpu_only", devices=("gpu",))
        def impl(x, weight, target, bias=None, *, reduction="mean", ignore_index=-100):
            return F.cross_entropy(F.linear(x, weight, bias), target, reduction=reduction, ignore_index=ignore_index)
        """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        [entry] = load_spec(f"{name}:impl", "--impl")
    finally:
        sys.modules.pop(name, None)
    assert isinstance(entry, BrokenImpl), entry
    assert f"{path}:4: " in entry.error and "Did you mean 'cuda'?" in entry.error, entry.error
    assert "impls/" not in entry.error, f"the error points into numcheck, not only at the user's line: {entry.error}"


def test_undeclared_options_follow_the_signature() -> None:
    """Without options=, an impl declares bias, ignore_index and only the options whose keyword its signature takes."""
    plain = linear_ce_impl(name="plain", dtypes=("float32",))(_ce)
    assert plain.support.options == frozenset({"bias", "ignore_index"})

    def smoothing(
        x, weight, target, bias=None, *, reduction="mean", ignore_index=-100, label_smoothing=0.0, z_loss_scale=0.0
    ):
        return _ce(x, weight, target, bias, reduction=reduction, ignore_index=ignore_index)

    assert linear_ce_impl(name="s")(smoothing).support.options == frozenset(
        {"bias", "ignore_index", "label_smoothing", "z_loss"}
    )
    everything = linear_ce_impl(name="e")(lambda x, weight, target, bias=None, **options: None)
    assert everything.support.options == LinearCESupport().options
    x, w, t = torch.randn(3, 4), torch.randn(5, 4), torch.tensor([0, 1, 4])
    assert torch.isfinite(plain(x, w, t, None, reduction="mean", ignore_index=-100))


def test_class_impl_whose_call_cannot_take_a_declared_option_is_broken() -> None:
    """A class-based impl declaring z_loss whose __call__ lacks z_loss_scale fails the protocol check, naming origin and definition."""

    class NoZLoss:
        name, kind = "no_zloss", "linear-ce"
        support = LinearCESupport(options=frozenset({"bias", "ignore_index", "z_loss"}))

        def __call__(self, x, weight, target, bias=None, *, reduction="mean", ignore_index=-100):
            return _ce(x, weight, target, bias, reduction=reduction, ignore_index=ignore_index)

    with pytest.raises(TypeError) as excinfo:
        validate_impl(NoZLoss(), "--impl mymod:impl")
    msg = str(excinfo.value)
    assert msg.startswith("--impl mymod:impl: ") and "z_loss_scale" in msg and f"{__file__}:" in msg, msg


def test_well_formed_declarations_pass() -> None:
    """Names, dtype objects, lists and a quantize function are accepted and normalized."""
    s = make_support(dtypes=[torch.float32, "half"], devices=["cpu"], reductions=["mean", "sum"], autocast=())
    assert s.dtypes == frozenset({torch.float32, torch.float16}) and s.devices == frozenset({"cpu"})

    def fp8(x, weight, bias=None, *, recipe, save_original_input, scaling_state=None):
        return F.linear(x, weight, bias)

    def quantize(t, *, recipe, role, usage, scaling_state=None):
        raise NotImplementedError

    q = fp8_linear_impl(name="q", recipes=("current", Fp8Recipe("mxfp8")), quantize=quantize)(fp8)
    assert q.support.exposes_quantize and [r.kind for r in q.support.recipes] == ["current", "mxfp8"]
    validate_impl(q, "test")


def test_dim_multiple_declares_shapes() -> None:
    """``dim_multiple`` as one int or per dimension: read back per dimension, refusing a shape off it with the
    dimension and the declaration named, shown by ``numcheck list``; the default takes every shape."""
    every = make_fp8_support(dim_multiple=16)
    some = make_fp8_support(dim_multiple={"K": 32})
    assert every.dim_multiples == {"M": 16, "K": 16, "N": 16} and some.dim_multiples == {"M": 1, "K": 32, "N": 1}
    assert every.shape_refusal(48, 64, 16) is None and some.shape_refusal(33, 64, 17) is None
    assert every.refuses(recipe=every.recipes[0], dtype=torch.float32, device="cpu", shape=(40, 64, 24)) == (
        "M=40, N=24 not a multiple of the declared dim_multiple (M, K, N multiples of 16)"
    )
    assert "shapes: K multiple of 32" in some.describe() and "shapes" not in make_fp8_support().describe()
    assert make_fp8_support().shape_refusal(1, 1, 1) is None


@pytest.mark.parametrize(
    "support,kw,words",
    [
        (dict(devices=("cuda",)), dict(device="cpu"), ("declares devices ['cuda']", "'cpu'", "NUMCHECK_DEVICE=cuda")),
        (
            dict(dtypes=("bfloat16",)),
            dict(device="cpu", force={"dtype": "float32", "autocast": None}),
            ("dtype='float32'", "dtype torch.float32 not declared"),
        ),
        (
            dict(options=("softcap", "z_loss"), option_combinations_excluded=[("softcap", "z_loss")]),
            dict(device="cpu", require=frozenset({"softcap", "z_loss", "bias"})),
            ("every declared option", "combination ['softcap', 'z_loss'] excluded"),
        ),
        (
            dict(reductions=("none",)),
            dict(device="cpu", reductions=("mean", "sum")),
            ("reductions ['mean', 'sum']", "['none']"),
        ),
    ],
    ids=["device", "forced_dtype", "excluded_combination", "reductions"],
)
def test_undrawable_case_gets_its_real_reason(support, kw, words) -> None:
    """When no case a test draws is declared, undrawable_reason says why, in the declaration's words, not 'a known divergence'."""
    why = undrawable_reason(make_support(**support), **kw)
    assert why is not None and "known divergence" not in why
    for w in words:
        assert w in why, f"{why!r} lacks {w!r}"


def test_drawable_case_has_no_reason() -> None:
    """A test whose draws include declared cases gets None: an Unsatisfiable there comes from a data-dependent filter."""
    assert undrawable_reason(make_support(), "cpu") is None
    assert (
        undrawable_reason(
            make_support(),
            "cpu",
            force={"dtype": "float32", "autocast": None},
            require=frozenset(LinearCESupport().options),
        )
        is None
    )
    assert undrawable_reason(make_support(dtypes=("bfloat16",)), "cpu", force={"reduction": "none"}) is None


def test_undeclared_device_is_skipped_with_its_reason_not_as_a_known_divergence():
    """A test that can draw no case for an impl (here: it declares only CUDA and the run draws on CPU) is skipped
    with that real reason, never reported as "every case drawn is a known divergence"."""
    import numcheck
    from numcheck.properties.core.device import DEVICE

    if DEVICE != "cpu":
        pytest.skip("the run draws on the impl's device")

    @numcheck.linear_ce_impl(name="cuda_only_doc", dtypes=("float32",), devices=("cuda",), options=())
    def impl(x, weight, target, bias=None, *, reduction="mean", ignore_index=-100):
        raise AssertionError("never called: no case is drawn on a device the impl does not declare")

    result = numcheck.check(impl, ["accuracy", "determinism"], max_examples=2)
    for verdict in result.verdicts.values():
        assert verdict.status == "skipped", verdict
        assert "declares devices ['cuda']" in verdict.message and "known divergence" not in verdict.message, verdict


def test_nondeterministic_declaration_skips_only_the_determinism_property() -> None:
    """An impl declaring deterministic=False is skipped by the determinism test with that reason, and by no other."""
    from numcheck.properties.linear_ce.suite import SUITE

    nondet = linear_ce_impl(name="nd", options=("ignore_index",), deterministic=False)(_ce)
    det = linear_ce_impl(name="d", options=("ignore_index",))(_ce)
    assert "declares deterministic=False" in (SUITE["determinism"].skip(nondet) or "")
    assert SUITE["determinism"].skip(det) is None
    assert SUITE["accuracy"].skip(nondet) is None


def test_grouped_declaration_refuses_truncating_block_steps() -> None:
    """``accum_block`` is modelled by the single linear's bound only: the grouped declaration refuses it with the fix."""
    from numcheck.impls.protocols.grouped_fp8_linear import GroupedFp8Support

    with pytest.raises(InvalidDeclaration, match="does not model truncating block steps") as excinfo:
        GroupedFp8Support(recipes=("current",), accum_unit_roundoff=2.0**-13, accum_block=32)
    assert "Leave accum_block out" in str(excinfo.value)


def test_hopper_builtins_without_mmaemu_are_unavailable_with_the_reason(monkeypatch) -> None:
    """Without mmaemu the Hopper built-ins register and say why they cannot run, and how to get it."""
    import importlib.util

    from numcheck.impls.builtin import fp8_hopper

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mmaemu" else real(name, *a))
    for impl in fp8_hopper.fp8_hopper_impls():
        reason = impl.support.unavailable_reason()
        assert reason is not None and "pip install 'numcheck[hopper]'" in reason, (impl.name, reason)
