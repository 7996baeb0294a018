"""Bad input to the oracle (and to its options) raises ValueError naming the offending argument."""

from __future__ import annotations

from typing import Any, Callable

import pytest
import torch

from numcheck.reference.linear_ce import forward_autograd, linear_ce
from numcheck.reference.options import CEOptions, options_from_kwargs

pytestmark = pytest.mark.torch_versions(
    reason="an oracle: torch ops (and what it compares them with) a torch release can change"
)

F64 = torch.float64
N, H, V = 4, 3, 5


def _good() -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)
    return dict(
        x=torch.randn(N, H, generator=g, dtype=F64),
        weight=torch.randn(V, H, generator=g, dtype=F64),
        target=torch.tensor([0, 4, -100, 2]),
        bias=torch.randn(V, generator=g, dtype=F64),
        options=CEOptions(),
        upstream=None,
    )


def _set(**changes: Any) -> Callable[[dict[str, Any]], None]:
    def apply(kw: dict[str, Any]) -> None:
        kw.update(changes)

    return apply


#: (id, mutation of the good call, word the message must contain)
BAD_CALLS: list[tuple[str, Callable[[dict[str, Any]], None], str]] = [
    ("x_1d", lambda kw: kw.update(x=kw["x"][0]), "x"),
    ("x_3d", lambda kw: kw.update(x=kw["x"][None]), "x"),
    ("weight_1d", lambda kw: kw.update(weight=kw["weight"][0]), "weight"),
    ("H_mismatch", lambda kw: kw.update(weight=torch.zeros(V, H + 1, dtype=F64)), "weight"),
    ("target_too_long", lambda kw: kw.update(target=torch.zeros(N + 1, dtype=torch.long)), "target"),
    ("target_2d", lambda kw: kw.update(target=torch.zeros(N, 1, dtype=torch.long)), "target"),
    ("target_equals_V", lambda kw: kw.update(target=torch.tensor([0, V, 1, 2])), "target[1]"),
    ("target_negative_not_ignore", lambda kw: kw.update(target=torch.tensor([0, 1, -1, 2])), "target[2]"),
    ("target_ignore_index_of_other_value", lambda kw: kw.update(options=CEOptions(ignore_index=-1)), "target[2]"),
    ("target_float", lambda kw: kw.update(target=torch.zeros(N, dtype=F64)), "target"),
    ("target_bool", lambda kw: kw.update(target=torch.zeros(N, dtype=torch.bool)), "target"),
    ("bias_wrong_length", lambda kw: kw.update(bias=torch.zeros(V + 1, dtype=F64)), "bias"),
    ("bias_not_a_tensor", lambda kw: kw.update(bias=[0.0] * V), "bias"),
    ("x_int", lambda kw: kw.update(x=torch.zeros(N, H, dtype=torch.int64)), "x"),
    ("weight_int", lambda kw: kw.update(weight=torch.zeros(V, H, dtype=torch.int32)), "weight"),
    ("bias_int", lambda kw: kw.update(bias=torch.zeros(V, dtype=torch.int64)), "bias"),
    ("x_complex", lambda kw: kw.update(x=torch.zeros(N, H, dtype=torch.complex128)), "x"),
    (
        "class_weights_wrong_length",
        lambda kw: kw.update(options=CEOptions(class_weights=torch.ones(V - 1))),
        "class_weights",
    ),
    ("upstream_vector_for_mean", lambda kw: kw.update(upstream=torch.ones(N, dtype=F64)), "upstream"),
    (
        "upstream_scalar_for_none",
        lambda kw: kw.update(options=CEOptions(reduction="none"), upstream=torch.tensor(1.0)),
        "upstream",
    ),
    (
        "upstream_wrong_length_for_none",
        lambda kw: kw.update(options=CEOptions(reduction="none"), upstream=torch.ones(N + 1)),
        "upstream",
    ),
]


@pytest.mark.parametrize("mutate,word", [(m, w) for _, m, w in BAD_CALLS], ids=[i for i, _, _ in BAD_CALLS])
def test_linear_ce_rejects_bad_input(mutate, word):
    """linear_ce raises ValueError whose message names the bad argument."""
    kw = _good()
    linear_ce(**kw)  # the unmutated call is fine
    mutate(kw)
    with pytest.raises(ValueError) as info:
        linear_ce(**kw)
    assert word in str(info.value), f"linear_ce's error should name {word!r}: {info.value}"


@pytest.mark.parametrize(
    "mutate,word",
    [(m, w) for i, m, w in BAD_CALLS if not i.startswith("upstream")],
    ids=[i for i, _, _ in BAD_CALLS if not i.startswith("upstream")],
)
def test_forward_autograd_rejects_bad_input(mutate, word):
    """forward_autograd validates exactly like linear_ce."""
    kw = _good()
    kw.pop("upstream")
    mutate(kw)
    with pytest.raises(ValueError) as info:
        forward_autograd(**kw)
    assert word in str(info.value), f"forward_autograd's error should name {word!r}: {info.value}"


@pytest.mark.parametrize(
    "kwargs,word",
    [
        (dict(all_ignored="raise"), "all_ignored"),
        (dict(row_chunk=0), "row_chunk"),
        (dict(vocab_chunk=-3), "vocab_chunk"),
    ],
    ids=["all_ignored", "row_chunk", "vocab_chunk"],
)
def test_linear_ce_rejects_bad_settings(kwargs, word):
    """The oracle's own settings (all-ignored convention, chunk sizes) are validated by name."""
    with pytest.raises(ValueError) as info:
        linear_ce(**_good(), **kwargs)
    assert word in str(info.value), f"error should name {word!r}: {info.value}"


@pytest.mark.parametrize(
    "kwargs,word",
    [
        (dict(reduction="avg"), "reduction"),
        (dict(reduction=None), "reduction"),
        (dict(label_smoothing=-0.1), "label_smoothing"),
        (dict(label_smoothing=1.5), "label_smoothing"),
        (dict(label_smoothing=float("nan")), "label_smoothing"),
        (dict(label_smoothing="0.1"), "label_smoothing"),
        (dict(softcap=0.0), "softcap"),
        (dict(softcap=-2.0), "softcap"),
        (dict(softcap=float("inf")), "softcap"),
        (dict(softcap=float("nan")), "softcap"),
        (dict(z_loss_scale=-1e-4), "z_loss_scale"),
        (dict(z_loss_scale=float("nan")), "z_loss_scale"),
        (dict(ignore_index=1.0), "ignore_index"),
        (dict(ignore_index=True), "ignore_index"),
        (dict(class_weights=torch.ones(2, 5)), "class_weights"),
        (dict(class_weights=torch.ones(5, dtype=torch.int64)), "class_weights"),
        (dict(class_weights=[1.0, 2.0]), "class_weights"),
    ],
    ids=lambda v: repr(v) if not isinstance(v, dict) else "-".join(f"{k}={v[k]!r}"[:30] for k in v),
)
def test_options_reject_bad_values(kwargs, word):
    """CEOptions refuses an invalid reduction, smoothing outside [0, 1], softcap ≤ 0, bad class weights, ...
    naming the field."""
    with pytest.raises(ValueError) as info:
        CEOptions(**kwargs)
    assert word in str(info.value), f"CEOptions error should name {word!r}: {info.value}"
    with pytest.raises(ValueError) as info:
        options_from_kwargs(**kwargs)
    assert word in str(info.value)


def test_options_from_kwargs_names_unknown_option():
    """An unknown impl-call keyword is named, not silently dropped."""
    with pytest.raises(ValueError, match="lse_square_scale"):
        options_from_kwargs(reduction="mean", lse_square_scale=0.1)


def test_options_accept_the_edges():
    """The edges of the valid ranges are accepted: ε = 0 and 1, tiny softcap, λ = 0."""
    for kw in (
        dict(label_smoothing=0.0),
        dict(label_smoothing=1.0),
        dict(label_smoothing=1),
        dict(softcap=1e-3),
        dict(z_loss_scale=0.0),
        dict(ignore_index=7),
    ):
        CEOptions(**kw)
