"""The fixed synthetic data of the convergence run (:mod:`numcheck.properties.convergence.run`): a Markov source.

A first-order Markov chain over ``vocab`` tokens whose rows are peaked (each token is followed by a few likely
successors), sampled once into a corpus; step ``t`` trains on the ``rows`` positions ``[t·rows, (t+1)·rows)``
with the two preceding tokens as context. A model that learns the transition table lowers its loss from
``log(vocab)`` towards the source's entropy within tens of steps. Everything is drawn on CPU from a
``torch.Generator`` seeded with the seed, so a seed means the same tokens on every machine.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

#: The ``ignore_index`` of the padded rows (PyTorch's default).
IGNORE_INDEX = -100
#: Inverse temperature of the transition logits (standard normal draws): 3 makes each row's few largest entries
#: carry most of its mass, so there is structure to learn; the source entropy is printed by :meth:`entropy`.
PEAKEDNESS = 3.0


@dataclass(frozen=True)
class Batch:
    """One step's data: the two context tokens of each row and its target (``IGNORE_INDEX`` on padded rows)."""

    prev1: torch.Tensor
    prev2: torch.Tensor
    target: torch.Tensor


class MarkovSource:
    """The corpus of one seed: ``steps`` batches of ``rows`` rows, a fraction ``ignored`` of each batch's rows
    padded (target ``IGNORE_INDEX``; at least one row of each batch is kept)."""

    def __init__(self, *, vocab: int, rows: int, steps: int, ignored: float, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.transition = torch.softmax(PEAKEDNESS * torch.randn(vocab, vocab, generator=g, dtype=torch.float64), -1)
        length = steps * rows + 2
        tokens = torch.empty(length, dtype=torch.long)
        tokens[0] = int(torch.randint(vocab, (1,), generator=g))
        draws = torch.rand(length, generator=g, dtype=torch.float64)
        cdf = self.transition.cumsum(-1)
        for i in range(1, length):  # inverse-CDF sampling: one uniform per token, no library resampling order
            tokens[i] = min(int(torch.searchsorted(cdf[tokens[i - 1]], draws[i])), vocab - 1)
        self.tokens = tokens
        self.rows, self.steps = rows, steps
        n_pad = min(round(ignored * rows), rows - 1)
        self.padded = [torch.randperm(rows, generator=g)[:n_pad] for _ in range(steps)]

    def batch(self, step: int) -> Batch:
        """The data of step ``step`` (0-based)."""
        if not 0 <= step < self.steps:
            raise IndexError(f"MarkovSource.batch: step {step} outside [0, {self.steps})")
        s = step * self.rows + 2
        target = self.tokens[s : s + self.rows].clone()
        target[self.padded[step]] = IGNORE_INDEX
        return Batch(
            prev1=self.tokens[s - 1 : s - 1 + self.rows], prev2=self.tokens[s - 2 : s - 2 + self.rows], target=target
        )

    def entropy(self) -> float:
        """The source's entropy rate in nats (its stationary distribution estimated by the corpus' token counts):
        the loss a model that knew the transition table would reach."""
        counts = torch.bincount(self.tokens, minlength=self.transition.shape[0]).double()
        pi = counts / counts.sum()
        h_rows = -(self.transition * self.transition.clamp_min(1e-300).log()).sum(-1)
        return float((pi * h_rows).sum())
