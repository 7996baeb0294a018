"""Known divergences of Liger-Kernel's chunked preference losses (``liger_preference[...]``,
:mod:`numcheck.impls.adapters.liger_preference`), consulted by the family's suite
(:class:`numcheck.properties.linear_preference.suite.PreferenceProperty`); the machinery is
:mod:`numcheck.properties.core.known`. Evidence: ``docs/evidence/liger_preference_releases.txt`` (every release from
0.5.0, the first with these losses, to 0.8.5).

- liger-kernel 0.5.0–0.5.2, DPO: the loss is negated. The base forms ``alpha·NLL − preference_loss`` and DPO's loss
  function returns ``−log σ(u)`` (CPO and SimPO return ``log σ(u)``, ORPO ``β·log σ(v)``, which that sign expects):
  the loss is ``+Σ log σ(u)/P`` and its gradients point the other way — training with it raises the rejected
  completions' likelihood over the chosen ones'. Every accuracy case fails (loss ``−3.319`` for ``3.319``); the
  base was changed to ``+ preference_loss`` and the other losses' signs flipped with it in 0.5.3.
- liger-kernel 0.5.5–0.8.2, KTO with ``chunk_size`` above 1: the unpaired base's metrics multiply the chunk's
  ``[n, T, V]`` logits by ``preference_labels.unsqueeze(1)`` (``[n, 1]``), which broadcasts only when ``n`` is 1 or
  the sequence length ``T``, or ``T`` is 1; otherwise the call raises ``RuntimeError`` (the size of tensor a (T) must match the size
  of tensor b (n)). Liger's default ``chunk_size=1`` (one completion a chunk) runs; 0.8.3 reshapes the labels to
  ``[n, 1, 1]``. The adapter passes ``chunk_size = 2·chunk_pairs`` where a case sets ``chunk_pairs`` (the cases
  without it run at the default and are judged)."""

from __future__ import annotations

from numcheck.properties.core.known import KnownDivergence, Releases
from numcheck.properties.linear_preference.cases import PreferenceCase


def liger_release() -> str | None:
    """The liger-kernel release whose preference losses the adapter imported
    (:func:`numcheck.impls.adapters.liger_preference.release`)."""
    from numcheck.impls.adapters import liger_preference

    return liger_preference.release()


#: The library the family's Liger adapters call (:data:`numcheck.properties.libraries.ADAPTER_LIBRARIES`).
LIBRARIES = (("liger_preference[[]*", "liger-kernel", liger_release),)


def kto_chunks_raise(P: int, T: int, chunk_pairs: int | None) -> bool:
    """Whether Liger 0.5.5–0.8.2's KTO raises on ``P`` pairs of ``T`` positions at the adapter's ``chunk_pairs``:
    some chunk of ``torch.chunk(2P rows, max(1, 2P // chunk_size))`` holds ``n`` completions with ``n`` neither 1
    nor ``T``, and ``T`` is not 1 (only then does ``[n, T, V]`` times ``[n, 1]`` fail to broadcast)."""
    if chunk_pairs is None:
        return False
    B = 2 * P
    sizes = {len(c) for c in _chunk_sizes(B, max(1, B // (2 * chunk_pairs)))}
    return T != 1 and any(n not in (1, T) for n in sizes)


def _chunk_sizes(n: int, chunks: int) -> list[range]:
    """The pieces ``torch.chunk`` makes of ``n`` rows asked for ``chunks`` pieces (each ``ceil(n / chunks)``)."""
    size = -(-n // chunks)
    return [range(i, min(i + size, n)) for i in range(0, n, size)]


_DPO_SIGN = dict(
    impls="liger_preference[[]dpo]",
    devices=("cpu", "cuda"),
    reason=(
        "liger-kernel 0.5.0-0.5.2's DPO loss is negated: the base forms alpha*NLL - preference_loss and DPO's loss "
        "function returns -log sigmoid(u), so the loss is +sum log sigmoid(u)/P and its gradients point the other "
        "way (docs/evidence/liger_preference_releases.txt; fixed in 0.5.3)"
    ),
    example=PreferenceCase(P=2, T=3, H=4, V=8, average_log_prob=True, seed=1),
    releases=Releases("liger-kernel", ">=0.5.0,<0.5.3", liger_release),
    library="liger-kernel",
    summary="DPO loss negated (the base subtracts the loss DPO returns): gradients ascend",
)
_KTO_CHUNKS = dict(
    impls="liger_preference[[]kto]",
    devices=("cpu", "cuda"),
    reason=(
        "liger-kernel 0.5.5-0.8.2's KTO raises RuntimeError when a chunk holds n completions, n neither 1 nor the "
        "sequence length: the unpaired base multiplies [n, T, V] logits by preference_labels.unsqueeze(1) "
        "(docs/evidence/liger_preference_releases.txt; fixed in 0.8.3)"
    ),
    example=PreferenceCase(P=2, T=3, H=4, V=8, chunk_pairs=1, seed=2),
    releases=Releases("liger-kernel", ">=0.5.5,<0.8.3", liger_release),
    library="liger-kernel",
    summary="KTO with chunk_size > 1 raises (labels broadcast against [n, T, V] logits)",
)

KNOWN: tuple[KnownDivergence, ...] = (
    # every property that judges the loss against the oracle (ignored positions and the pairs' permutation compare
    # the impl with itself: a negated loss passes them)
    KnownDivergence(
        properties=("accuracy", "chunk_invariance", "options_honoured"), applies=lambda case: True, **_DPO_SIGN
    ),
    KnownDivergence(
        properties=("accuracy", "ignored_positions", "pair_permutation", "options_honoured"),
        applies=lambda case: kto_chunks_raise(case.P, case.T, case.chunk_pairs),
        **_KTO_CHUNKS,
    ),
    # chunk invariance runs one pair a chunk and every pair in one chunk, whatever the case's chunk_pairs
    KnownDivergence(
        properties=("chunk_invariance",),
        applies=lambda case: kto_chunks_raise(case.P, case.T, 1) or kto_chunks_raise(case.P, case.T, case.P),
        **_KTO_CHUNKS,
    ),
)


def known(impl_name: str, prop: str, case: PreferenceCase) -> KnownDivergence | None:
    """The entry covering ``case`` of ``impl_name`` under ``prop`` on the installed release, or ``None``."""
    return next((k for k in KNOWN if k.matches(impl_name, prop, case)), None)
