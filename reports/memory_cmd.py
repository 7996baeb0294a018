"""``numcheck memory``: extra peak and bytes held across backward per linear+CE impl, and the one-chunk table
of the grad_weight accumulation paths — measured by :mod:`impls.measure.memory` (the impls on a Problem
through :mod:`properties.linear_ce.memory`), on ``meta`` by default so the seed's shapes cost nothing."""

from __future__ import annotations

import argparse

import torch

from numcheck.impls.measure import capabilities, memory
from numcheck.impls.protocols.linear_ce import LINEAR_CE_KIND
from numcheck.impls.registry import BrokenImpl, by_kind, discover
from numcheck.properties.linear_ce.cases import Problem
from numcheck.properties.linear_ce.memory import memory_table
from numcheck.reports.common import add_impl_arguments, int_at_least

HELP = (
    "memory per linear+CE impl (extra peak, bytes held from forward to backward) and the one-chunk "
    "grad_weight accumulation table; default: the seed's shapes on the meta device"
)


def _shape(text: str) -> tuple[int, int, int]:
    parts = text.split(",")
    try:
        vals = tuple(int(p) for p in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shape must be N,H,V (three positive integers), got {text!r}") from None
    if len(vals) != 3 or min(vals) < 1:
        raise argparse.ArgumentTypeError(f"--shape must be N,H,V (three positive integers), got {text!r}")
    return vals  # type: ignore[return-value]


_positive = int_at_least(1, "--chunk must be a positive integer")


def add_arguments(p: argparse.ArgumentParser) -> None:
    n, h, v = memory.SEED_SHAPE
    p.add_argument(
        "--shape",
        type=_shape,
        default=memory.SEED_SHAPE,
        metavar="N,H,V",
        help=f"tokens, hidden size, vocabulary (default {n},{h},{v}: the seed's run)",
    )
    p.add_argument(
        "--chunk",
        type=_positive,
        default=memory.SEED_CHUNK,
        metavar="C",
        help=f"token chunk of the one-chunk table (default {memory.SEED_CHUNK})",
    )
    add_impl_arguments(
        p,
        default="default: every linear+CE impl",
        device="meta",
        device_help="where to measure (default meta: no memory is allocated)",
    )
    p.add_argument(
        "--dtype",
        default="bfloat16",
        choices=("float32", "bfloat16", "float16"),
        help="dtype of x and weight (default bfloat16)",
    )
    p.add_argument("--bias", action="store_true", help="pass a bias")
    p.add_argument("--reduction", default="mean", choices=("mean", "sum", "none"))


def _mib(b: int) -> str:
    return f"{b / memory.MiB:10.1f}"


def _print_chunk_table(V: int, H: int, C: int, dtype_name: str, dev: torch.device) -> None:
    """The extra memory of each grad_weight accumulation path over one chunk (:func:`memory.one_chunk_table`)."""
    dtype = getattr(torch, dtype_name)
    print(
        f"one chunk of grad_weight accumulation: V={V}, H={H}, C={C}, {dtype_name} operands, "
        f"accumulator fp32 (lowp_accum: {dtype_name}), on {dev.type}"
    )
    print(f"  {'path':18s} {'runs as':18s} {'extra MiB':>10s}  formula")
    for r in memory.one_chunk_table(V, H, C, dtype=dtype, device=dev):
        cuda = f"  (cuda max_memory_allocated: {r.cuda_bytes / memory.MiB:.1f})" if r.cuda_bytes is not None else ""
        print(f"  {r.path:18s} {r.runs_as:18s} {_mib(r.extra_bytes)}  {r.formula}{cuda}")
    if dev.type == "meta":
        if capabilities.addmm_out_dtype_meta(dtype):
            print(
                "  (meta has no values, so addmm_out_dtype is measured with its capability forced on: the "
                "allocation pattern where the device supports it)"
            )
        else:
            print(
                "  (this torch cannot trace addmm(out_dtype=) on meta, so addmm_out_dtype runs as its "
                "fp32_operands fallback here; measure it on CUDA)"
            )


def _print_impl_table(impls: list, problem: Problem, dev: torch.device) -> None:
    """One line per linear+CE impl: its forward, held and backward memory on ``problem`` (:func:`memory_table`)."""
    print(
        f"  {'impl':38s} {'fwd peak':>10s} {'held':>10s} {'held B/tok':>10s} {'bwd peak':>10s} {'total':>10s}"
        "  (MiB above the inputs)"
    )
    for m in memory_table(impls, problem, dev):
        if m.error:
            print(f"  {m.name:38s} cannot run on {dev.type}: {m.error}")
            continue
        line = (
            f"  {m.name:38s} {_mib(m.forward_peak)} {_mib(m.held)} {m.held / problem.N:10.1f} "
            f"{_mib(m.backward_peak)} {_mib(m.total_peak)}"
        )
        if m.cuda_peak is not None:
            line += f"  cuda max_memory_allocated: {m.cuda_peak / memory.MiB:.1f}"
            if m.cuda_peak > m.total_peak + memory.MiB:
                line += " (more: temporaries inside single ops, invisible to the tracker)"
        if m.opaque:
            line += f"  [opaque ops, insides not counted: {', '.join(sorted(m.opaque))}]"
        print(line)


def run(args: argparse.Namespace) -> int:
    N, H, V = args.shape
    C = args.chunk
    dev = torch.device(args.device)
    _print_chunk_table(V, H, C, args.dtype, dev)

    problem = Problem(
        N=N,
        H=H,
        V=V,
        dtype=args.dtype,
        bias=args.bias,
        reduction=args.reduction,
        upstream="per_row" if args.reduction == "none" else "one",
        device="cpu",
    )
    entries = discover(args.impl)
    broken = [e for e in entries if isinstance(e, BrokenImpl)]
    impls = [e.impl for e in by_kind(entries, LINEAR_CE_KIND)]
    vh4 = V * H * 4
    print(
        f"\nlinear+CE impls: N={N}, H={H}, V={V}, {args.dtype}, reduction={args.reduction}"
        f"{', bias' if args.bias else ''}, on {dev.type}; V·H·4 = {vh4 / memory.MiB:.1f} MiB"
    )
    _print_impl_table(impls, problem, dev)
    print(
        "  held: bytes kept from forward to backward that do not alias the inputs (O(N) for recompute; "
        "≥ V·H·4 where an fp32 grad_weight is precomputed in forward)"
    )
    if dev.type == "meta":
        print(
            "  on meta, impls that choose paths by device type see 'meta' (torch_native acc=auto resolves to "
            "its generic default there); impls that read values (.item()) cannot run"
        )
    for b in broken:
        print(f"  {b.name}: BROKEN ({b.origin}): {b.error}")
    return 1 if broken else 0
