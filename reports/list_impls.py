"""``numcheck list``: every impl found, where it comes from, and what it supports on this machine."""

from __future__ import annotations

import argparse

import torch

from numcheck.impls import interpreter
from numcheck.impls.measure import capabilities
from numcheck.impls.protocols.kinds import BY_NAME, current_name
from numcheck.impls.registry import BrokenImpl, discover
from numcheck.reports.common import add_impl_arguments

HELP = "list every implementation found (built-in, NUMCHECK_IMPLS, entry points, --impl) and what it supports here"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_impl_arguments(
        p, default="default: every impl found", device_help="device to report support for (default: cpu)"
    )
    p.add_argument("--probes", action="store_true", help="also print the capability probes for the device")


def describe_support(impl, device: str) -> list[str]:
    """Lines describing an impl's declaration (its kind's :meth:`~numcheck.impls.protocols.kind.Kind.describe_impl`,
    from the kinds registry) and whether it can run on ``device``."""
    s = impl.support
    lines = []
    reason = s.unavailable_reason() if hasattr(s, "unavailable_reason") else None
    dev_type = torch.device(device).type
    if reason is None and hasattr(s, "devices") and dev_type not in s.devices:
        reason = f"device {dev_type} not declared"
    lines.append("    here: " + ("runs" if reason is None else f"unsupported — {reason}"))
    kind = BY_NAME.get(current_name(impl.kind, warn=False))
    described = kind.describe_impl(impl) if kind is not None else s.describe()
    lines.extend("    " + line for line in described.splitlines())
    return lines


#: What each Triton mode means for the kernels listed (printed first, as a ``#`` comment line).
TRITON_MODES = {
    "compiled": "Triton kernels run compiled (CUDA)",
    "interpreter": "Triton kernels run under Triton's interpreter (no CUDA here; TRITON_INTERPRET=1, set by numcheck "
    "before triton was imported unless you set it): a kernel's Python runs, compiled-only bugs need CUDA",
    "none": "Triton kernels cannot run: no CUDA here and TRITON_INTERPRET is off",
}


def print_release_notes() -> None:
    """One line per installed third-party library whose release is unknown
    (:func:`numcheck.impls.adapters.release_notes.release_notes`): its impls run, but no known divergence keyed on a
    release can apply to them, so say so rather than leave it silent."""
    from numcheck.impls.adapters.release_notes import release_notes

    for library, note in release_notes().items():
        print(f"# {library}: release unknown, so none of its known divergences can apply — {note}")


def run(args: argparse.Namespace) -> int:
    entries = discover(args.impl)
    broken = 0
    print(f"# {TRITON_MODES[interpreter.mode()]}")
    for e in entries:
        if isinstance(e, BrokenImpl):
            broken += 1
            print(f"{e.name}  [BROKEN, from {e.origin}]\n    error: {e.error}")
            continue
        desc = getattr(e.impl, "description", "")
        print(f"{e.name}  [{e.kind}, from {e.origin}]" + (f"\n    {desc}" if desc else ""))
        for line in describe_support(e.impl, args.device):
            print(line)
    print_release_notes()
    if args.probes:
        print(f"\ncapability probes on {args.device}:")
        for k, v in capabilities.summary(args.device).items():
            print(f"    {k}: {'yes' if v else 'no'}")
    return 1 if broken else 0
