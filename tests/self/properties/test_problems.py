"""``properties.linear_ce.cases``: a Problem is validated, printable as Python, and builds the tensors it describes,
deterministically, in the value regime it names."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import find, settings

from numcheck.properties.linear_ce.cases import REGIMES, Problem, build, dtype_of
from numcheck.properties.linear_ce.strategies import problems

F64 = torch.float64


@pytest.mark.parametrize(
    "kwargs,word",
    [
        (dict(N=0), "Problem.N"),
        (dict(H=-1), "Problem.H"),
        (dict(V=2.0), "Problem.V"),
        (dict(dtype="fp8"), "fp8"),
        (dict(autocast="bfloat16", dtype="bfloat16"), "autocast"),
        (dict(bias_dtype="int8"), "int8"),
        (dict(ignored=1.5), "ignored"),
        (dict(ignored=-0.1), "ignored"),
        (dict(regime="huge"), "regime"),
        (dict(upstream="vector"), "upstream"),
        (dict(upstream="per_row", reduction="mean"), "per_row"),
        (dict(upstream="scalar", reduction="none"), "scalar"),
        (dict(V=1, ignore_index=0), "ignore_index"),
        (dict(label_smoothing=1.5), "label_smoothing"),
        (dict(softcap=0.0), "softcap"),
        (dict(reduction="avg"), "reduction"),
    ],
    ids=lambda v: "-".join(f"{k}={v[k]}" for k in v) if isinstance(v, dict) else str(v),
)
def test_invalid_problem_names_the_field(kwargs, word):
    """An invalid Problem raises ValueError naming the field (also through replace())."""
    base = dict(N=4, H=3, V=10)
    with pytest.raises(ValueError, match=word):
        Problem(**{**base, **kwargs})
    with pytest.raises(ValueError, match=word):
        Problem(**base).replace(**kwargs)


def test_dtype_of():
    """dtype names map to torch dtypes; None stays None; an unknown name is named in the error."""
    assert dtype_of("bfloat16") is torch.bfloat16 and dtype_of(None) is None
    with pytest.raises(ValueError, match="'half'"):
        dtype_of("half")


SAMPLE = [
    Problem(N=5, H=4, V=7),
    Problem(
        N=9,
        H=3,
        V=11,
        dtype="bfloat16",
        bias=True,
        bias_dtype="float32",
        ignored=0.3,
        reduction="none",
        label_smoothing=0.1,
        class_weights=True,
        softcap=3.0,
        z_loss_scale=1e-3,
        upstream="per_row",
        regime="outlier_rows",
        seed=4,
    ),
    Problem(
        N=3,
        H=2,
        V=5,
        autocast="float16",
        ignored=1.0,
        reduction="sum",
        upstream="scalar",
        regime="confident",
        ignore_index=-1,
        seed=9,
    ),
]


@pytest.mark.parametrize("p", SAMPLE, ids=lambda p: p.short())
def test_repr_round_trips_and_build_is_deterministic(p):
    """eval(repr(p)) == p, and building twice (or from the round-tripped repr) gives identical tensors."""
    q = eval(repr(p), {"Problem": Problem})  # noqa: S307 - the repr is the repro format
    assert q == p and hash(q) == hash(p)
    a, b = build(p), build(q)
    for name in ("x", "weight", "target", "bias", "class_weights", "upstream"):
        ta, tb = getattr(a, name), getattr(b, name)
        assert (ta is None and tb is None) or torch.equal(ta, tb), f"{name} differs between two builds of {p!r}"
    assert a.options == b.options
    c = build(p.replace(seed=p.seed + 1))
    assert not torch.equal(a.x, c.x), "a different seed must give different tensors"


@pytest.mark.parametrize("p", SAMPLE, ids=lambda p: p.short())
def test_build_honours_every_field(p):
    """Dtypes, shapes, targets, ignored rows, class weights, options and upstream are as the Problem says."""
    t = build(p)
    assert t.x.shape == (p.N, p.H) and t.weight.shape == (p.V, p.H)
    assert t.x.dtype == t.weight.dtype == dtype_of(p.dtype)
    if p.bias:
        assert t.bias is not None and t.bias.shape == (p.V,) and t.bias.dtype == dtype_of(p.bias_dtype or p.dtype)
    else:
        assert t.bias is None
    ignored = t.target == p.ignore_index
    assert int(ignored.sum()) == p.n_ignored
    assert bool(((t.target[~ignored] >= 0) & (t.target[~ignored] < p.V)).all())
    if p.class_weights:
        cw = t.class_weights
        assert cw is not None and cw.shape == (p.V,) and bool(((cw >= 0.25) & (cw <= 1.75)).all())
        assert t.options.class_weights is cw
    else:
        assert t.class_weights is None
    o = t.options
    assert (o.reduction, o.ignore_index, o.label_smoothing, o.softcap, o.z_loss_scale) == (
        p.reduction,
        p.ignore_index,
        p.label_smoothing,
        p.softcap,
        p.z_loss_scale,
    )
    want_up = {"one": None, "scalar": (), "per_row": (p.N,)}[p.upstream]
    assert (t.upstream is None) if want_up is None else (tuple(t.upstream.shape) == want_up)
    if t.upstream is not None:
        for low in (torch.bfloat16, torch.float16):
            assert torch.equal(t.upstream.to(low).to(t.upstream.dtype), t.upstream), f"upstream not exact in {low}"
    assert p.features == ({"bias"} if p.bias else set()) | ({"ignore_index"} if p.n_ignored else set()) | o.features | (
        {"class_weights"} if p.class_weights else set()
    )
    assert p.dtype in p.short() and p.reduction in p.short()


@pytest.mark.parametrize(
    "N,ignored,want",
    [
        (10, 0.0, 0),
        (10, 0.01, 1),
        (10, 0.5, 5),
        (10, 0.999, 9),
        (10, 1.0, 10),
        (1, 0.5, 0),
        (1, 1.0, 1),
        (7, 0.5, 4),
    ],
)
def test_n_ignored(N, ignored, want):
    """ignored > 0 ignores at least one row, ignored < 1 keeps at least one, 1 ignores all, else rounds."""
    p = Problem(N=N, H=2, V=3, ignored=ignored)  # (N=1, 0.5): "keep one" wins over "ignore one"
    assert p.n_ignored == want and p.all_ignored == (want == N)


def _logits(p: Problem) -> torch.Tensor:
    t = build(p)
    z = t.x.to(F64) @ t.weight.to(F64).T
    return z + t.bias.to(F64) if t.bias is not None else z


@pytest.mark.parametrize("regime,sigma", [("ordinary", 2.0), ("large", 40.0), ("tiny", 1e-3)])
def test_regime_sets_the_logit_scale(regime, sigma):
    """ordinary/large/tiny logits have standard deviation σ = 2 / 40 / 1e-3 (x ~ N(0,1), W ~ N(0, σ²/H)):
    over 32·64 logits the sample std is within 15% of σ (its relative spread is ≈ 1/√(2·2048) ≈ 1.6%, so 15%
    is ~9 standard errors yet catches any wrong scale factor)."""
    for seed in range(3):
        z = _logits(Problem(N=32, H=16, V=64, regime=regime, seed=seed))
        assert abs(float(z.std()) / sigma - 1) < 0.15, f"{regime}: logit std {float(z.std()):.4g}, want ≈ {sigma}"


@pytest.mark.parametrize("H", [1, 2, 3, 16, 64])
@pytest.mark.parametrize("V", [2, 5, 37, 160])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_confident_regime_is_confident(H, V, dtype):
    """Every non-ignored row of a confident problem has p_target > 0.9996 (margin 8 + log V), whatever H and V,
    with or without bias, also after rounding x and W to bf16."""
    for seed in range(2):
        for bias in (False, True):
            p = Problem(N=24, H=H, V=V, dtype=dtype, bias=bias, regime="confident", seed=seed, ignored=0.25)
            t = build(p)
            z = _logits(p)
            keep = t.target != p.ignore_index
            p_t = torch.softmax(z[keep], dim=1).gather(1, t.target[keep][:, None]).squeeze(1)
            worst = float(p_t.min())
            assert worst > 1 - (V - 1) * math.exp(-(8 + math.log(V))) - 1e-4, (
                f"confident regime not confident: min p_target {worst:.6f} on {p!r}"
            )


def test_outlier_rows_are_outliers():
    """outlier_rows scales N/8 rows of x by 64: the largest row norm is ≈ 64× the median."""
    t = build(Problem(N=32, H=16, V=8, regime="outlier_rows", seed=1))
    norms = t.x.norm(dim=1)
    ratio = float(norms.max() / norms.median())
    assert 30 < ratio < 130, f"row-norm ratio {ratio:.1f}, want ≈ 64"
    assert int((norms > 16 * norms.median()).sum()) == 32 // 8


def test_post_norm_rows_carry_offsets_and_outlier_channels():
    """post_norm: columns of x have a common sign (|column mean| comparable to its RMS in most columns), a few
    outlier channels 10–100× the median column RMS, logits of typical size ≈ 3, targets at Zipf frequencies."""
    p = Problem(N=256, H=64, V=40, regime="post_norm", seed=2)
    t = build(p)
    x = t.x.double()
    rms = x.pow(2).mean(dim=0).sqrt()
    mean = x.mean(dim=0).abs()
    assert float((mean > 0.3 * rms).double().mean()) > 0.5, "columns of post_norm x are zero-mean"
    ratio = rms / rms.median()
    assert int((ratio > 8).sum()) == max(1, 64 // 32) and float(ratio.max()) < 150
    z = x @ t.weight.double().T
    assert 1.5 < float(z.std()) < 6
    counts = torch.bincount(t.target, minlength=40).sort(descending=True).values
    assert int(counts[0]) > 4 * int(counts[20]), "targets not Zipf-distributed"


def test_post_norm_grad_weight_partial_sums_add_up():
    """post_norm's Σ_i G_ij·x_ik (grad_weight under 'sum') cancels less than ordinary's at N = 2048: the median
    of |Σ_i G_ij·x_ik| / Σ_i |G_ij·x_ik| is larger (measured 0.16–0.26 against 0.11–0.13), so an accumulator's
    rounding is judged against larger partial sums relative to the result."""

    def coherence(regime: str, seed: int) -> float:
        t = build(Problem(N=2048, H=32, V=16, regime=regime, reduction="sum", seed=seed))
        x, w = t.x.double(), t.weight.double()
        G = torch.softmax(x @ w.T, dim=1) - torch.nn.functional.one_hot(t.target, 16).double()
        return float(((G.T @ x).abs() / (G.abs().T @ x.abs())).median())

    for seed in (5, 6):
        assert coherence("post_norm", seed) > 1.2 * coherence("ordinary", seed)


def test_post_norm_never_targets_a_pad_class():
    """post_norm with a class id as ignore_index: only ignored rows carry it."""
    p = Problem(N=64, H=8, V=3, regime="post_norm", ignore_index=0, ignored=0.25, seed=1)
    t = build(p)
    assert int((t.target == 0).sum()) == p.n_ignored


@pytest.mark.parametrize("regime", REGIMES)
def test_every_regime_builds_finite_tensors_in_low_precision(regime):
    """Every regime builds finite bf16 and fp16 tensors (no overflow in the rounding)."""
    for dtype in ("bfloat16", "float16"):
        t = build(Problem(N=8, H=5, V=9, dtype=dtype, regime=regime, bias=True))
        for name in ("x", "weight", "bias"):
            assert bool(torch.isfinite(getattr(t, name)).all()), f"{name} not finite for {regime} in {dtype}"


def test_cuda_device_matches_cpu():
    """A problem on CUDA holds the same tensors as on CPU (drawn on CPU, then moved)."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device here")
    p = SAMPLE[1]
    a, b = build(p), build(p.replace(device="cuda"))
    assert torch.equal(a.x, b.x.cpu()) and torch.equal(a.target, b.target.cpu())


@pytest.mark.parametrize("regime", ["ordinary", "confident"])
def test_pad_class_as_ignore_index(regime):
    """ignore_index may be a class id (a pad token): exactly the drawn rows are ignored and no other row
    targets that class, in every regime."""
    for seed in range(5):
        p = Problem(N=40, H=6, V=5, ignored=0.25, ignore_index=0, regime=regime, seed=seed)
        t = build(p)
        assert int((t.target == 0).sum()) == p.n_ignored, (p, t.target.tolist())
        assert bool(((t.target >= 0) & (t.target < p.V)).all())


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"force": {"z_loss": 0.0}}, ["force", "'z_loss'", "did you mean 'z_loss_scale'"]),
        ({"force": {"dtpye": "float32"}}, ["force", "'dtpye'", "did you mean 'dtype'"]),
        ({"require": frozenset({"softcaps"})}, ["require", "'softcaps'", "did you mean 'softcap'"]),
    ],
)
def test_problems_rejects_unknown_force_and_require_keys(kwargs, words):
    """problems() refuses a force/require key it does not know, naming it and the closest known name."""
    with pytest.raises(ValueError) as info:
        find(problems(**kwargs), lambda p: True, settings=settings(database=None, derandomize=True))
    for word in words:
        assert word in str(info.value)


def test_problems_honours_forced_fields():
    """Every field problems() is forced to take comes back as forced, z_loss_scale by its field name."""
    force = {
        "N": 3,
        "H": 5,
        "V": 7,
        "dtype": "bfloat16",
        "reduction": "sum",
        "z_loss_scale": 0.25,
        "softcap": None,
        "label_smoothing": 0.0,
        "class_weights": False,
        "bias": True,
        "bias_dtype": None,
        "ignored": 0.0,
        "upstream": "one",
        "regime": "tiny",
        "seed": 11,
    }
    p = find(problems(force=force), lambda p: True, settings=settings(database=None, derandomize=True))
    assert {k: getattr(p, k) for k in force} == force
