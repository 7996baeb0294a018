"""``numcheck converge``: the tiny-model convergence run (:mod:`numcheck.properties.convergence.run`) from the command
line — each ``--impl`` as the head of a small language model, judged against the envelope eager's deviation from
float64 draws; Markdown on stdout, and with ``--out`` the JSON, the Markdown and the PNGs.

Exit status: 0 when every impl run stays inside; 1 when one leaves the envelope (or raises while training), or an
impl spec is broken; 2 on bad input: no linear+CE impl among the specs, no impl declaring any requested dtype (so
nothing could be judged), or a setting the run refuses.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

import torch

from numcheck.errors import BadInput, InvalidAssertion
from numcheck.impls.protocols.linear_ce import LINEAR_CE_KIND
from numcheck.impls.registry import BrokenImpl, by_kind, discover
from numcheck.properties.convergence import run as convergence
from numcheck.properties.convergence.model import ModelShape
from numcheck.properties.linear_ce.cases import dtype_of
from numcheck.reports.common import add_impl_arguments, int_at_least, prepare_out_dir
from numcheck.reports.convergence import plot as convergence_plot
from numcheck.reports.convergence import text as convergence_text
from numcheck.reports.convergence.plot import MISSING

HELP = (
    "tiny language-model convergence run: each impl as the linear+CE head, its loss curve and per-step distance "
    "from float64 judged against eager's envelope; exit 1 if an impl leaves it"
)


#: argparse type: a non-negative integer.
_nonneg = int_at_least(0, "expected a non-negative integer")


def _shape(text: str) -> ModelShape:
    """argparse type: a model shape ``KEY=VALUE,...`` (:func:`numcheck.properties.convergence.run.parse_shape`)."""
    try:
        return convergence.parse_shape(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``numcheck converge``: the impls, dtypes, and every setting of the run."""
    add_impl_arguments(p, impls="impl under test", default="", required=True, device_help="device (default cpu)")
    p.add_argument(
        "--dtype",
        action="append",
        choices=convergence.DTYPES,
        metavar="DTYPE",
        help=f"head dtype, one of {', '.join(convergence.DTYPES)} (repeatable; default float32)",
    )
    p.add_argument(
        "--steps",
        type=_nonneg,
        default=convergence.DEFAULT_STEPS,
        help=f"training steps (default {convergence.DEFAULT_STEPS})",
    )
    p.add_argument("--seed", type=_nonneg, default=0, help="data and initialization seed (default 0)")
    p.add_argument(
        "--envelope-seeds",
        type=_nonneg,
        default=convergence.DEFAULT_ENVELOPE_SEEDS,
        help=f"further seeds eager is trained on to draw the envelope (default {convergence.DEFAULT_ENVELOPE_SEEDS})",
    )
    p.add_argument(
        "--ignored",
        type=float,
        default=convergence.DEFAULT_IGNORED,
        help=f"padded fraction of each batch (default {convergence.DEFAULT_IGNORED}; 0 for impls without ignore_index)",
    )
    p.add_argument(
        "--shape",
        type=_shape,
        default=ModelShape(),
        metavar="KEY=VALUE,...",
        help=f"model shape and optimizer, any of {convergence.shape_text(dataclasses.asdict(ModelShape()))} "
        f"(these are the defaults)",
    )
    p.add_argument(
        "--out", type=Path, metavar="DIR", help="write convergence.json, convergence.md and <dtype>/*.png here"
    )


def _label(name: str) -> str:
    """The run label of impl ``name`` (one named like a reference run is told apart)."""
    return f"{name} (under test)" if name in convergence.RESERVED_LABELS else name


def _declared(impls: list[Any], dtype: torch.dtype, args: argparse.Namespace) -> tuple[dict[str, Any], list[str]]:
    """The impls that declare this run's case, by label, and a line for each one left out."""
    run, left = {}, []
    opts = ("ignore_index",) if args.ignored else ()
    for impl in impls:
        why = impl.support.unavailable_reason() or impl.support.refuses(
            dtype=dtype, device=torch.device(args.device).type, options=opts, reduction="mean"
        )
        if why:
            left.append(f"- `{impl.name}` not run in {str(dtype).removeprefix('torch.')}: {why}")
        else:
            run[_label(impl.name)] = impl
    return run, left


def _write(out: Path, results: dict[str, Any], text: str) -> list[str]:
    """Write the JSON, the Markdown and each dtype's PNGs under ``out``; return a note when plots are missing."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "convergence.json").write_text(json.dumps({d: r.to_json() for d, r in results.items()}, indent=1))
    (out / "convergence.md").write_text(text)
    try:
        for d, r in results.items():
            convergence_plot.plot(r, out / d)
    except ModuleNotFoundError as exc:
        if str(exc) != MISSING:
            raise
        return [MISSING]
    return []


def _linear_ce_impls(specs: list[str]) -> tuple[list, list[BrokenImpl]]:
    """The linear-ce impls of ``specs`` (all registered when empty) and the broken ones; says which are broken and
    which are left out as another kind."""
    entries = discover(specs)
    broken = [e for e in entries if isinstance(e, BrokenImpl)]
    for b in broken:
        print(f"numcheck converge: impl {b.spec!r} ({b.origin}) is broken: {b.error}")
    impls = [e.impl for e in by_kind(entries, LINEAR_CE_KIND)]
    others = [e.name for e in entries if not isinstance(e, BrokenImpl) and e.kind != LINEAR_CE_KIND]
    if others:
        print(f"numcheck converge: not linear-ce impls, left out: {', '.join(others)}")
    return impls, broken


def _outside_parts(r: Any, name: str) -> list[str]:
    """One paragraph per impl of the run ``r`` (dtype ``name``) outside its envelope: why, and its repro line."""
    out: list[str] = []
    for rec in r.judged:
        if not rec.inside:
            out.append(
                "\n".join(
                    [
                        f"`{rec.impl}` outside ({name}):",
                        *(f"- {x}" for x in r.failure_lines(rec.label)),
                        f"- reproduce: `{convergence.repro_command(r.impls[rec.label], r.config)}`",
                    ]
                )
                + "\n"
            )
    return out


def run(args: argparse.Namespace) -> int:
    """Run the convergence run per dtype (module docstring); the exit status."""
    if args.out is not None:
        try:
            prepare_out_dir(args.out)
        except BadInput as exc:
            print(f"numcheck converge: {exc}")
            return 2
    impls, broken = _linear_ce_impls(args.impl)
    if not impls:
        print("numcheck converge: no linear-ce impl to run")
        return 2
    results, parts = {}, []
    for name in args.dtype or ["float32"]:
        chosen, left = _declared(impls, dtype_of(name), args)  # type: ignore[arg-type]
        if not chosen:
            parts.append(f"**Convergence ({name})**: no impl declares this case.\n" + "\n".join(left) + "\n")
            continue
        try:
            r = convergence.run(
                chosen,
                dtype=name,
                steps=args.steps,
                seed=args.seed,
                shape=args.shape,
                envelope_seeds=args.envelope_seeds,
                ignored=args.ignored,
                device=args.device,
            )
        except InvalidAssertion as exc:
            print(f"numcheck converge: {exc}")
            return 2
        results[name] = r
        parts.append(convergence_text.markdown(r) + ("\n" + "\n".join(left) + "\n" if left else ""))
        parts += _outside_parts(r, name)
    text = "\n".join(parts)
    print(text)
    if not results:
        print(
            f"numcheck converge: no impl declares any requested dtype ({', '.join(args.dtype or ['float32'])}): "
            f"nothing was judged (exit 2)"
        )
        return 2
    if args.out is not None:
        for note in _write(args.out, results, text):
            print(note)
        print(f"wrote {args.out}/convergence.json, convergence.md and the plots")
    ok = bool(results) and all(r.ok for r in results.values()) and not broken
    return 0 if ok else 1
