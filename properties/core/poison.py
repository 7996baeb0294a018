"""Poisoned memory: numcheck judges an impl with every uninitialised allocation filled, so an output the impl
allocated with ``torch.empty`` and never wrote shows as NaN instead of whatever the allocator happened to hold.

Why: the FP8/MoE defects reported in 2026 include experts that receive no token returning what ``torch.empty``
held (MSLK PR #158; pytorch #172439, #193633; transformers #48205). On a fresh allocator such memory is mostly zero —
the CPU allocator serves a large allocation from fresh pages the OS zeroes (glibc ``malloc`` maps every request
above its mmap threshold, at most 32 MiB, anew), and zero is often exactly the right answer for an empty expert's
gradient — so the bug passes a test run and shows in training, where the memory was used before.

How: torch's :data:`torch.utils.deterministic.fill_uninitialized_memory` (default ``True``) fills the result of
``torch.empty``, ``empty_like``, ``empty_strided``, ``new_empty`` and ``resize_`` — NaN for floating dtypes, the
largest value for integer ones — but only while ``torch.use_deterministic_algorithms(True)`` is set. :func:`filled`
sets both, with ``warn_only=True`` (an op without a deterministic implementation warns, it does not raise; those
warnings are silenced inside the block: they say nothing about the impl's numerics), and restores the caller's three
settings on leaving, also when the impl raised. It sets the mode through ``torch._C._set_deterministic_algorithms``,
the call ``torch.use_deterministic_algorithms`` ends in, without the rest of that function: it also imports
``torch._inductor.config`` to set inductor's ``deterministic`` option, which costs 6–8 s the first time in a
process (torch 2.13 on a loaded 2-core machine; once per xdist worker) and would change what a ``torch.compile``'d impl compiles to — not what poisoning is for.

Probed on torch 2.13.0 (CPU) with ``docs/evidence/poison_probe.py`` (its output beside it): under
:func:`filled`, ``torch.empty`` of float32, bfloat16, float8_e4m3fn (byte 0x7f, a NaN), int64, ``empty_like``,
``new_empty``, ``empty_strided``, ``resize_`` and a 64 MiB ``torch.empty`` all come back filled; without it the
small ones hold leftovers and the 64 MiB one holds zeros (fresh pages).

Where: :func:`numcheck.properties.core.runner.judge` runs every property of the suite (drawn and fixed cases, the
plugin and :func:`numcheck.check`) and every property case of ``numcheck report`` under :func:`judging`; the
report's accuracy grid, ``numcheck repro`` and the public assertions (``numcheck.assert_fp8_linear``, ...) do too. A property is the smallest unit that holds each forward *and* backward the impl
runs (its backward runs inside the property's ``loss.backward()``, not inside the impl's call), so the block spans
the property: the float64 oracles run inside it too, which is harmless (they write every element they allocate)
and is counted in the measured cost (``results/poison-cost.md``). The determinism properties (:data:`OUTSIDE`) run
outside it: deterministic algorithms change which kernels run on CUDA, which is what they measure. The distributed
suites' ranks (pool worker processes, which do not go through ``judge``) run the impl's forward and backward inside
:func:`block` (``rank_run`` of ``properties/distributed/linear_ce/props.py``, ``tp_rank`` of
``properties/distributed/tp_fp8/props.py``): the process judging the case decides with :func:`enabled` for the
impl's kind and the property, as ``judge`` does, and sends that decision with the rank's arguments (a pool's ranks
live across cases and were forked with whatever environment they started with, so they never read :data:`ENV`
themselves); the rest of the rank's call (copying its shards in, the results out) stays outside.

Which families: :data:`DEFAULT_ON` (where it costs at most 10% of the suite's time, measured per family in
``results/poison-cost.md``: every kind numcheck ships; a kind added later stays off until its cost is measured and
it joins the set); ``NUMCHECK_POISON`` (:data:`ENV`) overrides it for every family: ``on`` or ``off``
(``default``, or unset: :data:`DEFAULT_ON`). numcheck's pytest plugin sets it from ``--numcheck-poison`` /
``--no-numcheck-poison``.

Example::

    >>> import torch
    >>> with filled():
    ...     bool(torch.empty(3).isnan().all())
    True
    >>> torch.are_deterministic_algorithms_enabled()
    False
"""

from __future__ import annotations

import contextlib
import os
import warnings
from typing import Any, Iterator

import torch
import torch.utils.deterministic

from numcheck.impls.protocols.dist_linear_ce import DIST_KIND
from numcheck.impls.protocols.fp8_linear import FP8_KIND
from numcheck.impls.protocols.grouped_fp8_linear import GROUPED_KIND
from numcheck.impls.protocols.linear_ce import LINEAR_CE_KIND
from numcheck.impls.protocols.linear_distill import LINEAR_DISTILL_KIND
from numcheck.impls.protocols.linear_preference import PREFERENCE_KIND
from numcheck.impls.protocols.tp_fp8_linear import TP_KIND

#: The environment variable that turns poisoning on or off for every family (``on``, ``off``, ``default``).
ENV = "NUMCHECK_POISON"
#: Impl kinds judged with poisoned memory unless :data:`ENV` says otherwise (each measured at most 10%:
#: results/poison-cost.md).
DEFAULT_ON: frozenset[str] = frozenset(
    {LINEAR_CE_KIND, FP8_KIND, GROUPED_KIND, DIST_KIND, TP_KIND, LINEAR_DISTILL_KIND, PREFERENCE_KIND}
)
#: Properties that run outside the block: deterministic algorithms would change what they measure.
OUTSIDE: frozenset[str] = frozenset({"determinism", "dist_determinism"})
_VALUES = {"on": True, "1": True, "true": True, "off": False, "0": False, "false": False, "default": None, "": None}


def setting() -> bool | None:
    """:data:`ENV` read: ``True`` (on for every family), ``False`` (off), ``None`` (the per-family default);
    ValueError naming the variable for any other value."""
    raw = os.environ.get(ENV, "")
    try:
        return _VALUES[raw.strip().lower()]
    except KeyError:
        raise ValueError(f"{ENV} must be on, off or default (unset: default), got {raw!r}") from None


def enabled(kind: str | None, prop: str | None = None) -> bool:
    """Whether an impl of ``kind`` is judged on property ``prop`` with poisoned memory."""
    if prop in OUTSIDE:
        return False
    on = setting()
    return kind in DEFAULT_ON if on is None else on


@contextlib.contextmanager
def filled() -> Iterator[None]:
    """Every uninitialised allocation filled (NaN, or the integer maximum) inside the block; the caller's
    deterministic-algorithms mode, its warn_only and ``fill_uninitialized_memory`` restored on leaving, also on an
    exception. Nests."""
    det = torch.utils.deterministic
    saved = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    saved_fill = det.fill_uninitialized_memory
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r".*does not have a deterministic implementation")
            torch._C._set_deterministic_algorithms(True, warn_only=True)
            det.fill_uninitialized_memory = True
            yield
    finally:
        torch._C._set_deterministic_algorithms(saved[0], warn_only=saved[1])
        det.fill_uninitialized_memory = saved_fill


def block(on: bool) -> contextlib.AbstractContextManager[None]:
    """:func:`filled` when ``on`` (a decision :func:`enabled` made, sent to a distributed rank), else nothing."""
    return filled() if on else contextlib.nullcontext()


def judging(impl: Any, prop: str | None = None) -> contextlib.AbstractContextManager[None]:
    """:func:`filled` where :func:`enabled` says so for ``impl`` (its ``kind``) on ``prop``, else nothing."""
    return block(enabled(getattr(impl, "kind", None), prop))
