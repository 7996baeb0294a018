"""The grouped FP8 linear's declaration (impls/protocols/grouped_fp8_linear.py): checked where it is written, with
the machinery the other protocols share (its common fields by Fp8LinearSupport's own checks), and loaded like
every other kind."""

from __future__ import annotations

import sys
import textwrap
import uuid
from typing import Any, Callable

import pytest
import torch

from numcheck import GroupedFp8Support, grouped_fp8_linear_impl
from numcheck.errors import InvalidDeclaration
from numcheck.impls.protocols.grouped_fp8_linear import (
    GROUPED_KIND,
    predicted_grouped_columnwise_x_bytes,
    validate_grouped_impl,
)
from numcheck.impls.registry import BrokenImpl, ImplEntry, load_spec
from numcheck.reference.fp8_recipes import Fp8Recipe


def _grouped(x, weights, biases=None, *, m_splits, recipe, save_original_input, scaling_state=None, main_grad=None):
    return x


def _no_main_grad(x, weights, biases=None, *, m_splits, recipe, save_original_input, scaling_state=None):
    return x


def _raise_site(excinfo: pytest.ExceptionInfo) -> str:
    entry = [e for e in excinfo.traceback if str(e.path) == __file__][-1]
    return f"{__file__}:{entry.lineno + 1}"


#: (declaration, words its message must hold). Each lambda is the user's declaring line.
BAD: dict[str, tuple[Callable[[], Any], tuple[str, ...]]] = {
    "recipe_alias": (
        lambda: grouped_fp8_linear_impl(name="g", recipes=("mx",))(_grouped),
        ("GroupedFp8Support.recipes", "Did you mean 'mxfp8'?"),
    ),
    "empty_dtypes": (
        lambda: grouped_fp8_linear_impl(name="g", dtypes=())(_grouped),
        ("GroupedFp8Support.dtypes is empty",),
    ),
    "gpu_device": (lambda: grouped_fp8_linear_impl(name="g", devices=("gpu",))(_grouped), ("Did you mean 'cuda'?",)),
    "alignment_zero": (
        lambda: grouped_fp8_linear_impl(name="g", split_alignment=0)(_grouped),
        ("split_alignment=0", "int >= 1"),
    ),
    "feature_alignment_bool": (lambda: GroupedFp8Support(feature_alignment=True), ("feature_alignment=True",)),
    "layout_typo": (
        lambda: grouped_fp8_linear_impl(name="g", weight_layouts=("stacked",))(_grouped),
        ("weight_layouts", "['stacked']", "'grouped'"),
    ),
    "main_grad_not_bool": (
        lambda: GroupedFp8Support(fused_wgrad_accumulation=("yes",)),
        ("fused_wgrad_accumulation",),
    ),
    "empty_splits_not_bool": (lambda: GroupedFp8Support(empty_splits="no"), ("empty_splits must be True or False",)),
    "max_experts": (lambda: GroupedFp8Support(max_experts=0), ("max_experts=0",)),
    "exposes_quantize": (lambda: GroupedFp8Support(exposes_quantize=True), ("exposes_quantize=True",)),
    "keyword_typo": (
        lambda: grouped_fp8_linear_impl(name="g", split_alignments=16)(_grouped),
        ("unknown keyword argument 'split_alignments'", "Did you mean 'split_alignment'?"),
    ),
    "signature": (lambda: grouped_fp8_linear_impl(name="g")(_no_main_grad), ("takes no keyword main_grad",)),
    "empty_name": (lambda: grouped_fp8_linear_impl(name=" "), ("non-empty string",)),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_grouped_declaration_is_refused_at_the_users_line(case: str) -> None:
    """A malformed grouped declaration raises InvalidDeclaration starting at the declaring file:line, with the fix."""
    declare, words = BAD[case]
    with pytest.raises(InvalidDeclaration) as excinfo:
        declare()
    msg = str(excinfo.value)
    assert msg.startswith(_raise_site(excinfo) + ": "), f"{case}: message does not start at the declaring line:\n{msg}"
    for w in words:
        assert w in msg, f"{case}: message lacks {w!r}:\n{msg}"


def test_split_rules_say_why() -> None:
    """split_refusal names the rule a split list breaks, and accepts those inside the declaration."""
    sup = GroupedFp8Support(split_alignment=16, empty_splits=False, feature_alignment=16, max_experts=4)
    assert sup.split_refusal((16, 32), 48, K=32, N=16) is None
    assert "multiples of split_alignment=16" in sup.split_refusal((17, 31), 48)
    assert "empty expert" in sup.split_refusal((0, 48), 48)
    assert "sums to 48" in sup.split_refusal((16, 32), 50)
    assert "more than max_experts=4" in sup.split_refusal((16,) * 5)
    assert "K=40" in sup.split_refusal((16,), K=40)
    assert "m_splits[1]" in sup.split_refusal((16, -16))


def test_predicted_bytes_per_expert() -> None:
    """The columnwise copy of x is every expert's data and unpadded scales; per-tensor recipes may keep one 4-byte
    scale per empty expert."""
    assert predicted_grouped_columnwise_x_bytes(Fp8Recipe("current"), (5, 0, 37), 40) == (42 * 40 + 8, 42 * 40 + 12)
    lo, hi = predicted_grouped_columnwise_x_bytes(Fp8Recipe("mxfp8"), (5, 0, 37), 40)
    assert lo == hi == 42 * 40 + 40 * (1 + 2)
    lo, hi = predicted_grouped_columnwise_x_bytes(Fp8Recipe("blockwise"), (130, 0), 8)
    assert lo == hi == 130 * 8 + 4 * 8 * 2


def test_grouped_impls_load_like_every_kind(tmp_path, monkeypatch) -> None:
    """A module-level grouped declaration loads by spec as an ImplEntry of its kind; a malformed one is a broken
    impl naming the module's line; a wrong support type is refused by the protocol check."""
    name = f"nc_grouped_{uuid.uuid4().hex[:8]}"
    path = tmp_path / f"{name}.py"
    path.write_text(
        textwrap.dedent("""\
        from numcheck import grouped_fp8_linear_impl

        @grouped_fp8_linear_impl(name="mine", recipes=("current",), dtypes=("bfloat16",), split_alignment=16)
        def good(x, weights, biases=None, *, m_splits, recipe, save_original_input, scaling_state=None,
                 main_grad=None):
            return x

        def bad():
            @grouped_fp8_linear_impl(name="bad", weight_layouts=("stacked",))
            def f(x, weights, biases=None, *, m_splits, recipe, save_original_input, scaling_state=None,
                  main_grad=None):
                return x
            return f
        """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        [good] = load_spec(f"{name}:good", "--impl")
        [bad] = load_spec(f"{name}:bad", "--impl")
    finally:
        sys.modules.pop(name, None)
    assert isinstance(good, ImplEntry) and good.kind == GROUPED_KIND and good.impl.support.split_alignment == 16
    assert isinstance(bad, BrokenImpl) and f"{path}:9: " in bad.error and "'stacked'" in bad.error, bad.error

    class WrongSupport:
        name, kind = "w", GROUPED_KIND
        support = object()

        def __call__(self, *a, **k):
            return None

    with pytest.raises(TypeError, match="GroupedFp8Support"):
        validate_grouped_impl(WrongSupport(), "origin-z")


def test_builtins_refuse_calls_outside_their_rules() -> None:
    """The built-ins check each call against their own declaration: bad splits, undeclared main_grad, a delayed
    recipe without one state per expert, each a ValueError naming it."""
    from numcheck.impls.builtin.grouped_fp8_linear import grouped_fp8_linear_impls

    loop, fused, _ = grouped_fp8_linear_impls()
    x, w = torch.randn(6, 8), torch.randn(2, 4, 8)
    kw = dict(recipe=Fp8Recipe("current"), save_original_input=False)
    with pytest.raises(ValueError, match="m_splits"):
        fused(x, w, None, m_splits=(3, 4), **kw)
    with pytest.raises(ValueError, match="main_grad"):
        loop(x, w, None, m_splits=(3, 3), main_grad=torch.zeros(2, 4, 8), **kw)
    with pytest.raises(ValueError, match="one DelayedScalingState per expert"):
        loop(x, w, None, m_splits=(3, 3), recipe=Fp8Recipe("delayed"), save_original_input=False)
    with pytest.raises(ValueError, match="save_original_input"):
        from numcheck.impls.protocols.grouped_fp8_linear import delayed_states

        fused(
            x,
            w,
            None,
            m_splits=(3, 3),
            recipe=Fp8Recipe("delayed"),
            save_original_input=True,
            scaling_state=delayed_states(Fp8Recipe("delayed"), 2),
        )
