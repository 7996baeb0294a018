"""The linear+preference declaration (impls/protocols/linear_preference.py): checked where it is written, each
mistake one error naming the field, the user's file:line and a fix; the decorator builds an impl the registry
loads like any other kind's."""

from __future__ import annotations

import pytest

from numcheck import PreferenceParams, PreferenceSupport, linear_preference_impl
from numcheck.errors import InvalidDeclaration
from numcheck.impls.protocols.linear_preference import PREFERENCE_KIND, validate_preference_impl


def _fn(x, weight, target, bias=None, *, ref_logps, params):
    return x.sum()


def _no_params(x, weight, target, bias=None, *, ref_logps):
    return x.sum()


#: (declaration keywords, words its message must hold).
BAD = {
    "unknown loss": (dict(loss="sigmoid_dpo"), ("loss='sigmoid_dpo'", "Did you mean")),
    "loss alias": (dict(loss="robust"), ("Did you mean 'dpo_robust'",)),
    "layout": (dict(layout="stacked"), ("layout='stacked'", "Did you mean 'halves'")),
    "reduction": (dict(reduction="batchmean"), ("reduction='batchmean'", "Did you mean 'mean'")),
    "accumulation": (dict(grad_weight_accumulation="bf16"), ("grad_weight_accumulation", "param_dtype")),
    "dtype": (dict(dtypes=("fp8",)), ("dtypes", "fp8")),
    "dtypes one string": (dict(dtypes="bfloat16"), ("one string", "dtypes=('bfloat16',)")),
    "orpo summed": (dict(loss="orpo", average_log_prob=(False,)), ("length-normalised", "(True,)")),
    "smoothing on orpo": (dict(loss="orpo", average_log_prob=(True,), label_smoothing=True), ("no label smoothing",)),
    "margin on dpo": (dict(loss="dpo", margin=True), ("no margin",)),
    "not a bool": (dict(nll="yes"), ("nll", "True or False")),
    "unknown keyword": (dict(beta=0.1), ("unknown keyword argument 'beta'",)),
}


@pytest.mark.parametrize("name", BAD)
def test_bad_declaration_names_field_and_site(name):
    """Each mistake: InvalidDeclaration at the decorator's line, naming what was wrong and how to fix it."""
    kwargs, words = BAD[name]
    with pytest.raises(InvalidDeclaration) as exc:
        linear_preference_impl(name="bad", **kwargs)
    msg = str(exc.value)
    assert msg.startswith(f"{__file__}:"), msg
    for w in words:
        assert w in msg, (w, msg)


def test_function_that_cannot_take_the_call():
    """A function without the ``params`` keyword is refused where it is decorated."""
    with pytest.raises(InvalidDeclaration, match="params"):
        linear_preference_impl(name="bad", loss="cpo")(_no_params)


def test_decorated_impl_and_refusals():
    """The decorator's impl is of the kind, passes the protocol check, and its declaration refuses what it leaves
    out by name."""
    impl = linear_preference_impl(name="mine", loss="simpo", average_log_prob=(True,), margin=True, bias=False)(_fn)
    assert impl.kind == PREFERENCE_KIND and isinstance(impl.support, PreferenceSupport)
    validate_preference_impl(impl, "test")
    s = impl.support
    import torch

    ok = PreferenceParams(beta=1.0, gamma=0.5, average_log_prob=True)
    assert s.refuses(dtype=torch.float32, device="cpu", params=ok, bias=False) is None
    assert "bias" in s.refuses(dtype=torch.float32, device="cpu", params=ok, bias=True)
    assert "NLL" in s.refuses(
        dtype=torch.float32, device="cpu", params=PreferenceParams(nll_weight=1.0, average_log_prob=True), bias=False
    )
    assert "bfloat16" in s.refuses(dtype=torch.bfloat16, device="cpu", params=ok, bias=False)
    assert "loss: simpo" in s.describe()


def test_registry_loads_a_user_impl():
    """A module-level decorated impl loads through the registry's spec path as its kind."""
    from numcheck.impls.registry import ImplEntry, load_spec

    entries = load_spec("numcheck.tests.self.helpers.preference_mutants:pref_beta_dropped", "--impl")
    assert len(entries) == 1 and isinstance(entries[0], ImplEntry) and entries[0].kind == PREFERENCE_KIND
