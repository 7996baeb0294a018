"""Inputs of the production-shape tier: what a language model's head sees mid-training, at full size.

The property suite's :func:`properties.linear_ce.cases.build` draws in float64 on the CPU, and two of its regimes need
[N, V] or [V, V] work (``post_norm``'s per-row multinomial, ``confident``'s class-overlap matrix): at
N·V ≈ 2.5·10⁹ that is minutes and tens of GiB. :func:`scale_tensors` draws the same kind of values directly on
the device in float32 from a seeded device generator, in O(N·H + V·H) work, so the tensors of a case are the
same on every run on one device type (not across device types: a CUDA generator is not the CPU one).

What is drawn (each part a property of trained heads that i.i.d. normals lack):

* **Activations after the final norm** (as ``post_norm``, with its constants
  :data:`properties.linear_ce.cases.POST_NORM_OUTLIER_FRACTION` and ``POST_NORM_OUTLIER_GAIN``): noise plus a
  per-feature mean shared by every row, rows RMS-normalised, then a few outlier channels scaled by gains
  10–100. Every column of x then has one sign in most rows, so grad_weight's sums over N grow with N.
* **Logits with a trained model's spread**: a unigram prior, W's rows given a component along the shared mean
  direction of x proportional to the log of a Zipf frequency, so every row's logits have a long upper tail
  (a few hundred classes well above the bulk); and a few **confident rows** (:data:`CONFIDENT_FRACTION`), x
  pushed along W[target] until the target logit leads the row by about 8 + log V (p_target ≈ 0.9997).
* **Targets at Zipf token frequencies**, drawn apart from the logits (a head mid-training).
* **Ignored rows in runs**: prompt or padding spans of :data:`IGNORED_RUN` tokens (ragged lengths), not single
  scattered rows, up to the case's ignored fraction.
"""

from __future__ import annotations

import math

import torch

from numcheck.properties.linear_ce.cases import POST_NORM_OUTLIER_FRACTION, POST_NORM_OUTLIER_GAIN, Problem, Tensors
from numcheck.reference.options import CEOptions

#: Typical |logit| of the bulk of a row (the ``post_norm`` regime's σ).
LOGIT_SCALE = 3.0
#: Spread of the unigram prior across the vocabulary: the most frequent class sits this many logits above the
#: median one (trained LM heads: the logits of a row span about 15–25).
PRIOR_SPAN = 12.0
#: Fraction of rows made confident (a few, as in a batch of text: boilerplate, continuations of a word).
CONFIDENT_FRACTION = 1 / 64
#: Ignored spans: run lengths drawn uniformly in this range (a prompt, a padded tail).
IGNORED_RUN = (16, 512)


def _generator(device: torch.device, seed: int) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def _activations(N: int, H: int, g: torch.Generator, dev: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """x as a norm layer hands it to the head, and its shared mean direction (unit vector, [H])."""
    f32 = torch.float32
    mu = torch.randn(H, generator=g, device=dev, dtype=f32)
    h = torch.randn(N, H, generator=g, device=dev, dtype=f32) + mu
    h = h * torch.rsqrt(h.square().mean(dim=1, keepdim=True).clamp_min(1e-30))
    k = max(1, int(H * POST_NORM_OUTLIER_FRACTION))
    channels = torch.randperm(H, generator=g, device=dev)[:k]
    lo, hi = POST_NORM_OUTLIER_GAIN
    gain = torch.ones(H, device=dev, dtype=f32)
    gain[channels] = lo + (hi - lo) * torch.rand(k, generator=g, device=dev, dtype=f32)
    h.mul_(gain)
    return h, mu / mu.norm()


def _zipf(V: int, g: torch.Generator, dev: torch.device) -> torch.Tensor:
    """Token frequencies 1/rank over a random order of the classes (unnormalised, [V])."""
    return 1.0 / (torch.randperm(V, generator=g, device=dev).to(torch.float32) + 1.0)


def _draw_classes(freq: torch.Tensor, n: int, g: torch.Generator) -> torch.Tensor:
    """``n`` classes drawn with probabilities ∝ ``freq`` (int64, on ``freq``'s device), by inverting the
    cumulative distribution: uniforms from ``g``, the distribution summed on the CPU in float64. Not
    ``torch.multinomial``: with replacement on CUDA it sums the distribution with a cumsum that is not
    bit-reproducible (pytorch/pytorch#152854), so a few rows' targets changed between two H200 runs of one case
    (results/production/h200-torch2.11-run2/README.md)."""
    cdf = freq.detach().to("cpu", torch.float64).cumsum(0)
    u = torch.rand(n, generator=g, device=freq.device, dtype=torch.float64) * float(cdf[-1])
    idx = torch.searchsorted(cdf.to(freq.device), u, right=True)
    return idx.clamp_max(freq.numel() - 1)


def _ignored_runs(N: int, n_ignored: int, g: torch.Generator, dev: torch.device) -> torch.Tensor:
    """A bool mask [N] with ``n_ignored`` rows set, in runs of :data:`IGNORED_RUN` lengths at random starts."""
    mask = torch.zeros(N, dtype=torch.bool, device=dev)
    lo, hi = IGNORED_RUN
    while n_ignored > 0:
        length = min(int(torch.randint(lo, hi + 1, (1,), generator=g, device=dev)), n_ignored, N)
        start = int(torch.randint(0, N - length + 1, (1,), generator=g, device=dev))
        before = int(mask.sum())
        mask[start : start + length] = True
        n_ignored -= int(mask.sum()) - before
    return mask


def scale_tensors(p: Problem) -> Tensors:
    """The tier's tensors for ``p`` (shapes, dtypes, ignored fraction and seed from ``p``; ``p.regime`` is not
    used: the values are always those of the module docstring). Only ``mean`` without bias or class weights,
    upstream one: the production case."""
    if p.bias or p.class_weights or p.upstream != "one" or p.reduction != "mean":
        raise ValueError(
            f"scale_tensors: the tier draws plain mean CE without bias/class weights, upstream one; got {p!r}"
        )
    dev = torch.device(p.device)
    g = _generator(dev, p.seed)
    N, H, V = p.N, p.H, p.V
    x, mu_dir = _activations(N, H, g, dev)
    rms_x = float(x.square().sum(dim=1).mean().sqrt())
    w = torch.randn(V, H, generator=g, device=dev, dtype=torch.float32) * (LOGIT_SCALE / rms_x)
    freq = _zipf(V, g, dev)
    # The unigram prior: x·mu_dir is about the same on every row (the shared mean), so adding a_j·mu_dir to W_j
    # shifts class j's logit by about a_j·(x·mu_dir) everywhere.
    along = float((x @ mu_dir).mean())
    prior = freq.log()
    prior = (prior - prior.median()) * (PRIOR_SPAN / float(prior.max() - prior.median()))
    w.add_(torch.outer(prior / along, mu_dir))
    target = _draw_classes(freq, N, g)
    n_conf = max(1, int(N * CONFIDENT_FRACTION))
    rows = torch.randperm(N, generator=g, device=dev)[:n_conf]
    wy = w[target[rows]]
    lead = 8.0 + math.log(V) + LOGIT_SCALE * 4  # over the bulk (±4σ) and the prior's top
    z_y = (x[rows] * wy).sum(dim=1)
    lift = (lead + PRIOR_SPAN - z_y).clamp_min(0.0)
    x[rows] += wy * (lift / wy.square().sum(dim=1).clamp_min(1e-30))[:, None]
    n_ign = p.n_ignored
    if n_ign:
        target = torch.where(_ignored_runs(N, n_ign, g, dev), torch.full_like(target, p.ignore_index), target)
    opts = CEOptions(reduction="mean", ignore_index=p.ignore_index)
    dt = p.param_dtype
    return Tensors(
        x=x.to(dt), weight=w.to(dt), target=target, bias=None, class_weights=None, upstream=None, options=opts
    )


def logit_profile(t: Tensors, rows: int = 256) -> dict[str, float]:
    """What the drawn logits look like on the first ``rows`` rows (float64, for the report and the tests):
    the median row span max − median, the median entropy, and the fraction of rows with max p > 0.99."""
    x = t.x[:rows].double()
    z = x @ t.weight.double().T
    logp = torch.log_softmax(z, dim=1)
    p = logp.exp()
    return {
        "span": float((z.max(dim=1).values - z.median(dim=1).values).median()),
        "entropy": float((-(p * logp).sum(dim=1)).median()),
        "confident_rows": float((p.max(dim=1).values > 0.99).double().mean()),
    }
