"""``numcheck premerge --impl NEW --base OLD [--claims FILE] [--python OTHER ...]``: the A/B run and its exit status.

Exit 1 when a pair cannot be compared (a side fails to load), NEW fails a problem both declare, an output is
flagged as materially worse (:mod:`reports.premerge.ab`), a claim is measured false (:mod:`reports.premerge.claims`), an
environment named with ``--python`` fails to measure (recorded with its stderr tail; its claims not verified), or
NEW leaves the convergence envelope while BASE stays inside; 2 on bad input, before anything runs (pairs that do
not match up, a claims file with an unknown key or bad value, an ``--out`` that holds a result, a ``--python`` that
does not exist); else 0. Claims that cannot be measured here
are listed as not verified, with the reason, and do not fail the run.

``--out DIR`` writes ``ab.json`` (everything measured, every environment, the claim verdicts) and ``ab.md``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from numcheck.reports.common import ImplSpec
from numcheck.reports.convergence import plot as convergence_plot
from numcheck.reports.convergence import text as convergence_text
from numcheck.reports.premerge import ab
from numcheck.reports.premerge import ab_md as md
from numcheck.reports.premerge import claims as claims_mod


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The A/B options of ``numcheck premerge`` (``--impl`` and ``--out`` are premerge's own)."""
    p.add_argument(
        "--base",
        action="append",
        default=[],
        type=ImplSpec(),
        metavar="SPEC",
        help="A/B mode: the impl the --impl in the same position replaces (repeatable: several pairs)",
    )
    p.add_argument(
        "--claims",
        type=Path,
        metavar="FILE",
        help=f"A/B mode: the change's claims (TOML; default ./{claims_mod.DEFAULT_FILE} if present; "
        "docs/premerge-ab.md lists the keys)",
    )
    p.add_argument(
        "--python",
        action="append",
        default=[],
        metavar="PYTHON",
        help="A/B mode: also measure with this interpreter (another venv, e.g. another torch release) and "
        "check the claims about it there (repeatable)",
    )
    p.add_argument(
        "--headroom",
        type=float,
        default=None,
        metavar="H",
        help="A/B mode: flag an output when NEW takes more than this share of the headroom BASE's worst "
        "error/bound leaves below the bound, (NEW-BASE)/(1-BASE), for every output (default: one "
        "per output, "
        + ", ".join(f"{k} {v:g}" for k, v in ab.DEFAULT_HEADROOM.items())
        + ", from correct pairs: docs/premerge-ab.md)",
    )
    p.add_argument(
        "--growth-floor",
        type=float,
        default=ab.DEFAULT_GROWTH_FLOOR,
        help=f"A/B mode: the error_growth claim counts outputs where NEW's worst error/bound is at least this (default "
        f"{ab.DEFAULT_GROWTH_FLOOR:g})",
    )
    p.add_argument(
        "--repeats",
        type=int,
        default=ab.DEFAULT_REPEATS,
        help=f"A/B mode, CUDA: interleaved timing repeats (default {ab.DEFAULT_REPEATS})",
    )
    p.add_argument("--no-convergence", action="store_true", help="A/B mode: leave out the convergence run")


def _claims(args: argparse.Namespace) -> tuple[list[claims_mod.Claim], str]:
    path = args.claims
    if path is None:
        default = Path.cwd() / claims_mod.DEFAULT_FILE
        if not default.exists():
            return [], f"no claims file (none given, no ./{claims_mod.DEFAULT_FILE})"
        path = default
    return claims_mod.load(path), f"from {path}"


def convergence_case(new: Any, base: Any, device: str) -> tuple[dict[str, Any] | None, str]:
    """The :func:`properties.convergence.run.run` settings both sides declare — the first of its dtypes (float32,
    bfloat16, float16) both declare, with padded rows (``ignored``) where both declare ``ignore_index``, else
    ``ignored=0`` — or ``None`` and why there is none."""
    import torch

    from numcheck.properties.convergence import run as conv
    from numcheck.properties.linear_ce.cases import dtype_of

    dev = torch.device(device).type
    reasons = []
    for dt in conv.DTYPES:
        for ignored in (conv.DEFAULT_IGNORED, 0.0):
            opts = ("ignore_index",) if ignored else ()
            why = [
                f"{side} `{impl.name}`: {r}"
                for side, impl in (("NEW", new), ("BASE", base))
                if (r := impl.support.refuses(dtype=dtype_of(dt), device=dev, options=opts, reduction="mean"))
            ]
            if not why:
                return {"dtype": dt, "ignored": ignored}, ""
        reasons.append(f"{dt}: {'; '.join(why)}")
    return None, f"no dtype both sides declare for a mean-reduced run on {dev} ({' | '.join(reasons)})"


def convergence(pairs: list[ab.Pair], device: str, out: Path | None) -> tuple[list[str], dict[str, Any], bool]:
    """The convergence section: per pair ``properties.convergence.run.run({"new": NEW, "base": BASE}, ...)`` in a case
    both declare (:func:`convergence_case`; "not run" with the reason when there is none), its Markdown, JSON and
    whether it passed. NEW outside eager's envelope fails; BASE outside it is "BASE itself fails: not judged" (the
    change is not at fault), not a failure."""
    from numcheck.properties.convergence import run as conv

    lines, data, ok = ["**Convergence**", ""], {"pairs": []}, True
    for i, p in enumerate(pairs):
        entry: dict[str, Any] = {"new": p.new, "base": p.base}
        data["pairs"].append(entry)
        try:
            new, base = ab.load_one(p.new), ab.load_one(p.base)
        except ValueError as exc:
            lines.append(f"- `{p.new}` vs `{p.base}`: not run: {exc}")
            entry["status"] = f"not run: {exc}"
            continue
        settings, why = convergence_case(new, base, device)
        if settings is None:
            lines.append(f"- `{p.new}` vs `{p.base}`: not run: {why}")
            entry["status"] = f"not run: {why}"
            continue
        try:
            res = conv.run({"new": new, "base": base}, device=device, **settings)
        except Exception as exc:  # noqa: BLE001 - shown as the failure it is
            lines.append(f"- ❌ `{p.new}` vs `{p.base}`: the convergence run raised {type(exc).__name__}: {exc}")
            entry["status"] = f"raised {type(exc).__name__}: {exc}"[:300]
            ok = False
            continue
        if not res.runs["base"].inside:
            verdict = "BASE itself fails (outside eager's envelope): not judged"
        elif not res.runs["new"].inside:
            verdict, ok = "❌ NEW outside eager's envelope (BASE inside)", False
        else:
            verdict = "✅ both inside eager's envelope"
        entry.update(status=verdict, settings=settings, result=res.to_json())
        lines += [
            f"`{p.new}` (new) vs `{p.base}` (base), {settings['dtype']}, ignored {settings['ignored']:g}: {verdict}",
            "",
            convergence_text.markdown(res),
            "",
        ]
        if out is not None:
            try:
                entry["plots"] = [str(x) for x in convergence_plot.plot(res, out / f"convergence-{i}")]
            except ModuleNotFoundError as exc:
                entry["plots_error"] = str(exc)
    return lines, data, ok


def failed_run(python: str, device: str, error: str) -> dict[str, Any]:
    """The run of an environment whose measurement failed: no pairs, ``env["failed"]`` its error's tail (what
    :func:`reports.premerge.claims.judge` gives as the reason its claims are not verified there)."""
    return {
        "env": {
            "python": python,
            "device": device,
            "torch": "unknown (the measurement failed)",
            "cuda_available": False,
            "failed": error[-2000:],
        },
        "pairs": [],
    }


def _bad(msg: str) -> int:
    print(f"numcheck premerge: {msg}", file=sys.stderr)
    print("numcheck premerge: bad input (exit 2) — nothing was run", file=sys.stderr)
    return 2


def run_ab(args: argparse.Namespace) -> int:
    """The A/B mode of ``numcheck premerge`` (module docstring)."""
    t0 = time.monotonic()
    try:
        pairs, claims, source = _checked_input(args)
    except ValueError as exc:  # ClaimsError is a ValueError
        return _bad(str(exc))
    print(f"numcheck premerge: A/B of {len(pairs)} pair(s) on {args.device}…", file=sys.stderr)
    runs = _measure_everywhere(args, pairs)
    here = runs[0]
    verdicts = claims_mod.judge(claims, runs)
    conv_md, conv_json, conv_ok = (
        (["**Convergence**: left out (--no-convergence)", ""], {"status": "left out"}, True)
        if args.no_convergence
        else convergence(pairs, args.device, args.out)
    )
    sections, failed = _sections_and_failures(here, runs)
    false = [v for v in verdicts if v.status == "false"]
    if false:
        failed.append(f"{len(false)} claim(s) measured false ({', '.join(f'#{v.claim.index}' for v in false)})")
    if not conv_ok:
        failed.append("convergence")
    text = md.render(here["env"], sections, md.claim_lines(verdicts, source), conv_md, not failed, failed)
    print(text)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "ab.md").write_text(text)
        (args.out / "ab.json").write_text(
            json.dumps(
                {"runs": runs, "claims": [v.to_json() for v in verdicts], "convergence": conv_json, "failed": failed},
                indent=1,
                default=str,
            )
        )
        print(f"numcheck premerge: wrote {args.out / 'ab.md'} and {args.out / 'ab.json'}", file=sys.stderr)
    print(
        f"numcheck premerge: A/B {time.monotonic() - t0:.0f} s; "
        + (f"FAIL (exit 1): {'; '.join(failed)}" if failed else "PASS (exit 0)"),
        file=sys.stderr,
    )
    return 1 if failed else 0


def _checked_input(args: argparse.Namespace) -> tuple[list[ab.Pair], list[claims_mod.Claim], str]:
    """The pairs, the claims and where they come from; ``ValueError`` (bad input: exit 2) before anything runs."""
    pairs = ab.pairs_from(list(args.impl), list(args.base))
    claims, source = _claims(args)
    if not ((args.headroom is None or 0.0 < args.headroom <= 1.0) and args.growth_floor >= 0.0 and args.repeats >= 1):
        raise ValueError(
            f"--headroom must be in (0, 1], --growth-floor >= 0 and --repeats >= 1 (got "
            f"{args.headroom}, {args.growth_floor}, {args.repeats})"
        )
    if args.out is not None and (args.out / "ab.json").exists():
        raise ValueError(f"{args.out} already holds an A/B result ({args.out / 'ab.json'}); choose another --out")
    for py in args.python:
        if not Path(py).exists():
            raise ValueError(f"--python {py}: no such interpreter")
    return pairs, claims, source


def _measure_everywhere(args: argparse.Namespace, pairs: list[ab.Pair]) -> list[dict[str, Any]]:
    """The pairs measured here, then with every ``--python`` (a failed one as :func:`failed_run`): here first."""
    runs = [ab.measure(pairs, args.device, args.grid, args.headroom, args.growth_floor, args.repeats)]
    for py in args.python:
        print(f"numcheck premerge: measuring again with {py}…", file=sys.stderr)
        try:
            runs.append(
                ab.measure_elsewhere(py, pairs, args.device, args.grid, args.headroom, args.growth_floor, args.repeats)
            )
        except RuntimeError as exc:
            print(
                f"numcheck premerge: --python {py} failed; its claims are not verified there:\n{exc}", file=sys.stderr
            )
            runs.append(failed_run(py, args.device, str(exc)))
    return runs


def _sections_and_failures(here: dict[str, Any], runs: list[dict[str, Any]]) -> tuple[list[list[str]], list[str]]:
    """The Markdown section of each pair measured ``here`` (with every environment's run of it) and of each
    environment that failed to measure, and what failed among them: pairs that cannot be compared, NEW's accuracy,
    environments."""
    failed = []
    sections = []
    for i, p in enumerate(here["pairs"]):
        env_runs = [(r["env"], r["pairs"][i]) for r in runs if i < len(r["pairs"]) and "memory" in r["pairs"][i]]
        sections.append(md.pair_section(p, env_runs))
        if "error" in p:
            failed.append(f"`{p['new']}` vs `{p['base']}` cannot be compared")
        elif not ab.accuracy_ok(p["accuracy"]):
            failed.append(f"accuracy of `{p['new']}` against `{p['base']}`")
    for r in runs:
        if r["env"].get("failed"):
            failed.append(f"--python {r['env']['python']} could not measure")
            sections.append(md.failed_env_lines(r["env"]))
    return sections, failed
