"""``numcheck bench``: speed and memory of the linear+CE impls on a CUDA device, as figures (never as tests).

For each registered linear+CE impl that runs on CUDA in bf16, forward+backward at each shape
(default BT=8192, H=4096, V=131072, and BT=2048, H=2048, V=32768), 10% of the rows ignored, ``mean``:
median time over CUDA events (``triton.testing.do_bench``), extra peak memory above the inputs
(``torch.cuda.max_memory_allocated``), and the time as a share of the floor 6·BT·H·V / R, R being the bf16
matmul rate measured in the same run (the best of three measurements before the cases and three after them:
the clock the card runs at varies between runs, and the ceiling is what it reached). Then the seed's one-chunk grad_weight micro-benchmark (V=131072,
H=4096, C=2048, and C=512; every accumulation path's time, extra peak, and bytes held beyond the gradient). Results go to ``--out`` as JSON and Markdown.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

from numcheck.errors import BadInput
from numcheck.impls.builtin import grad_accum, split_accum
from numcheck.impls.builtin.triton_ce import ce_block_triton_
from numcheck.impls.measure.timing import matmul_rates, measure_fwd_bwd, median_ms
from numcheck.impls.protocols.fp8_linear import FP8_KIND, DelayedScalingState
from numcheck.impls.protocols.linear_ce import LINEAR_CE_KIND
from numcheck.impls.registry import BrokenImpl, by_kind, discover
from numcheck.reference.numerics.ce_block import reduction_coefficients, row_weights
from numcheck.reports.common import add_impl_arguments, prepare_out_dir

HELP = "time and measure memory of every linear+CE impl on a CUDA device (figures, not tests)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_impl_arguments(p, default="default: every linear+CE impl", device_help=None)
    p.add_argument(
        "--shape",
        action="append",
        default=[],
        metavar="BT,H,V",
        help="shapes to time (repeatable; default 8192,4096,131072 and 2048,2048,32768)",
    )
    p.add_argument("--out", default=None, help="directory for bench.json and bench.md (default: print only)")
    p.add_argument("--rep-ms", type=float, default=400.0, help="milliseconds of timed repetitions per case")


def rescale_to_rate(res: dict[str, Any], rate: float) -> None:
    """Set ``res``'s matmul rate to ``rate`` (FLOP/s) and recompute every case's floor and share of it."""
    res["bf16_matmul_tflops"] = rate / 1e12
    for c in res["cases"]:
        BT, H, V = c["shape"]
        c["floor_ms"] = 6 * BT * H * V / rate * 1e3
        c["share_of_floor"] = c["floor_ms"] / c["ms"]


def _case(BT: int, H: int, V: int, dev: torch.device, seed: int = 0):
    g = torch.Generator(device=dev).manual_seed(seed)
    x = torch.randn(BT, H, device=dev, dtype=torch.bfloat16, generator=g)
    w = (torch.randn(V, H, device=dev, dtype=torch.bfloat16, generator=g) * (2.0 / math.sqrt(H))).to(torch.bfloat16)
    t = torch.randint(0, V, (BT,), device=dev, generator=g)
    ign = torch.rand(BT, device=dev, generator=g) < 0.1
    t[ign] = -100
    return x, w, t


def bench_impl(impl: Any, BT: int, H: int, V: int, dev: torch.device, rep_ms: float) -> dict[str, Any]:
    """Median fwd+bwd time, extra peak, and bytes held from forward to backward of one impl at one shape
    (:func:`measure_fwd_bwd`)."""
    x, w, t = _case(BT, H, V, dev)
    xr = x.clone().requires_grad_()
    wr = w.clone().requires_grad_()

    def forward() -> torch.Tensor:
        out = impl(xr, wr, t, None, reduction="mean", ignore_index=-100)
        return out[0] if isinstance(out, tuple) else out

    return measure_fwd_bwd([xr, wr], forward, lambda loss: loss.backward(), dev, rep_ms)


#: Bytes per [V, H] element an accumulation holds beyond the bf16 gradient it yields (fp32 buffer: 4; the
#: parameter-dtype buffer is the gradient: 0; split fp32: the int16 lower half, 2).
ACC_BYTES_BEYOND_GRAD = {"fallback": 4, "fp32_operands": 4, "addmm_out_dtype": 4, "lowp_accum": 0, "split_fp32": 2}


def bench_grad_weight_paths(
    dev: torch.device, rep_ms: float, V: int = 131072, H: int = 4096, chunks: tuple[int, ...] = (2048, 512)
) -> list[dict]:
    """The seed's one-chunk micro-benchmark (C=2048), and the same at C=512: time and extra peak of each
    accumulation step into an existing accumulator, and what the accumulator holds beyond the bf16 gradient."""
    rows = []
    for C in chunks:
        G = torch.randn(C, V, device=dev, dtype=torch.bfloat16)
        xc = torch.randn(C, H, device=dev, dtype=torch.bfloat16)
        for path in ("fallback", "fp32_operands", "addmm_out_dtype", "lowp_accum", grad_accum.SPLIT):
            acc = grad_accum.make_accumulator(path, (V, H), torch.bfloat16, dev)
            acc.add_(G, xc)  # warm-up (and, for the Triton GEMM, autotuning)
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats(dev)
            base = torch.cuda.memory_allocated(dev)
            acc.add_(G, xc)
            torch.cuda.synchronize()
            extra = torch.cuda.max_memory_allocated(dev) - base
            ms = median_ms(lambda: acc.add_(G, xc), rep_ms)  # noqa: F821 - acc is bound above; del-ed after
            resolved = path if path == grad_accum.SPLIT else grad_accum.resolved_path(path, dev, torch.bfloat16)
            rows.append(
                {
                    "path": path,
                    "resolved": resolved,
                    "C": C,
                    "ms": ms,
                    "extra_peak_mib": extra / 2**20,
                    "tflops": 2 * C * V * H / (ms * 1e-3) / 1e12,
                    "held_beyond_grad_mib": ACC_BYTES_BEYOND_GRAD[path] * V * H / 2**20,
                }
            )
            del acc
            torch.cuda.empty_cache()
    return rows


def bench_chunk_anatomy(dev: torch.device, rep_ms: float, V: int = 131072, H: int = 4096, C: int = 640) -> list[dict]:
    """Time of each step of one chunk of the chunked FLCE at the split impls' chunk size: the logits GEMM, the
    Triton CE kernel (G in place), the grad_x GEMM, and the grad_W accumulation by the split accumulator and
    by ``addmm(out_dtype=float32)`` into an fp32 buffer. Each with its FLOP rate where it is a GEMM."""
    g = torch.Generator(device=dev).manual_seed(1)
    xr = torch.randn(C, H, device=dev, dtype=torch.bfloat16, generator=g)
    w = (torch.randn(V, H, device=dev, dtype=torch.bfloat16, generator=g) * (2.0 / math.sqrt(H))).to(torch.bfloat16)
    t = torch.randint(0, V, (C,), device=dev, generator=g)
    valid, _, w_t = row_weights(t, None, -100)
    coef = reduction_coefficients(valid, w_t, "mean")
    logits = torch.mm(xr, w.t())
    gx = torch.empty(C, H, device=dev, dtype=torch.bfloat16)
    split = grad_accum.make_accumulator(grad_accum.SPLIT, (V, H), torch.bfloat16, dev)
    plain = grad_accum.make_accumulator("addmm_out_dtype", (V, H), torch.bfloat16, dev)
    flop = 2 * C * H * V
    steps: list[tuple[str, Callable[[], Any], int]] = [
        ("logits = x_c·Wᵀ (cuBLAS)", lambda: torch.mm(xr, w.t(), out=logits), flop),
        (
            "CE kernel, G in place (Triton)",
            lambda: ce_block_triton_(logits, t, coef.coef_ce, coef.coef_z, ignore_index=-100),
            0,
        ),
        ("grad_x = G·W (cuBLAS)", lambda: torch.mm(logits, w, out=gx), flop),
        ("grad_W += Gᵀ·x_c, split fp32 (Triton)", lambda: split.add_(logits, xr), flop),  # noqa: F821 - bound above
        ("grad_W += Gᵀ·x_c, addmm out_dtype fp32 (cuBLAS)", lambda: plain.add_(logits, xr), flop),  # noqa: F821 - bound above
    ]
    rows = []
    for name, fn, fl in steps:
        fn()
        ms = median_ms(fn, rep_ms)
        rows.append({"step": name, "C": C, "ms": ms, "tflops": fl / (ms * 1e-3) / 1e12 if fl else None})
    del split, plain
    torch.cuda.empty_cache()
    return rows


def bench_fp8_linear(dev: torch.device, rep_ms: float, M: int = 8192, K: int = 4096, N: int = 4096) -> list[dict]:
    """Each registered quantized linear, per declared recipe and ``save_original_input`` value, against a bf16
    ``F.linear``: median fwd+bwd time (``y.backward(dy)``), extra peak, and bytes held from forward to backward
    (allocated when forward has returned, above just before it, less ``y``)."""
    g = torch.Generator(device=dev).manual_seed(2)
    x = torch.randn(M, K, device=dev, dtype=torch.bfloat16, generator=g).requires_grad_()
    w = (torch.randn(N, K, device=dev, dtype=torch.bfloat16, generator=g) / math.sqrt(K)).requires_grad_()
    dy = torch.randn(M, N, device=dev, dtype=torch.bfloat16, generator=g)
    y_bytes = M * N * 2

    def measure(name: str, recipe: str, soi: Any, fwd: Callable[[], torch.Tensor], after: Callable[[], None]) -> dict:
        def backward(y: torch.Tensor) -> None:
            y.backward(dy)
            after()

        r = measure_fwd_bwd([x, w], fwd, backward, dev, rep_ms, returned_bytes=y_bytes)
        return {"impl": name, "recipe": recipe, "save_original_input": soi, "shape": [M, K, N], **r}

    rows = [measure("F.linear (bf16)", "-", "-", lambda: F.linear(x, w), lambda: None)]
    for impl in by_kind(discover([]), FP8_KIND):
        q = impl.impl
        s = q.support
        if s.unavailable_reason() or "cuda" not in s.devices or torch.bfloat16 not in s.dtypes:
            continue
        for recipe in s.recipes[:1]:  # the impl's first (default-parameter) recipe: one per recipe kind
            for soi in sorted(s.save_original_input):
                if soi and not recipe.allows_save_original_input:
                    continue
                state = DelayedScalingState(recipe) if recipe.kind == "delayed" else None
                try:
                    rows.append(
                        measure(
                            q.name,
                            repr(recipe),
                            soi,
                            lambda: q(x, w, None, recipe=recipe, save_original_input=soi, scaling_state=state),
                            (lambda: state.update()) if state is not None else (lambda: None),
                        )
                    )
                except Exception as exc:  # recorded, not hidden
                    rows.append(
                        {
                            "impl": q.name,
                            "recipe": repr(recipe),
                            "save_original_input": soi,
                            "error": f"{type(exc).__name__}: {exc}"[:300],
                        }
                    )
                torch.cuda.empty_cache()
    return rows


def _rate_samples(res: dict[str, Any]) -> str:
    """The rate measurements behind the floor, for the Markdown header."""
    smp = res.get("bf16_matmul_tflops_samples") or {}
    parts = [f"{k}: {', '.join(f'{v:.0f}' for v in smp[k])}" for k in ("start", "end") if smp.get(k)]
    return "best of the measurements " + "; ".join(parts) if parts else "one measurement"


def _cases_md(res: dict[str, Any]) -> list[str]:
    """The title, the matmul rate every share of the floor uses, and one row per timed linear+CE case."""
    lines = [
        f"# numcheck bench — {res['device']}, torch {res['torch']}",
        "",
        f"bf16 matmul rate measured in this run: {res['bf16_matmul_tflops']:.0f} TFLOP/s "
        f"({_rate_samples(res)}); every share of the floor uses it.",
        "",
        "| impl | BT | H | V | median ms | share of floor | extra peak MiB | held across backward MiB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in res["cases"]:
        BT, H, V = c["shape"]
        lines.append(
            f"| {c['impl']} | {BT} | {H} | {V} | {c['ms']:.2f} | {c['share_of_floor']:.2f} | "
            f"{c['extra_peak_mib']:.0f} | {c['held_mib']:.1f} |"
        )
    return lines


def _grad_weight_paths_md(res: dict[str, Any]) -> list[str]:
    """One row per grad_weight accumulation path over one chunk (none when not measured)."""
    if not res.get("grad_weight_paths"):
        return []
    lines = [
        "",
        "One chunk of grad_weight accumulation (V=131072, H=4096, bf16 operands; C=2048 is the seed's "
        "measurement): time, extra peak of the step, and what the accumulator holds beyond the bf16 gradient:",
        "",
        "| path | runs | C | ms | TFLOP/s | extra peak MiB | held beyond gradient MiB |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['path']} | {r['resolved']} | {r['C']} | {r['ms']:.2f} | {r['tflops']:.0f} | "
        f"{r['extra_peak_mib']:.0f} | {r['held_beyond_grad_mib']:.0f} |"
        for r in res["grad_weight_paths"]
    ]
    return lines


def _chunk_anatomy_md(res: dict[str, Any]) -> list[str]:
    """One row per step of one chunk of the chunked FLCE (none when not measured)."""
    if not res.get("chunk_anatomy"):
        return []
    lines = [
        "",
        f"One chunk of the chunked FLCE, step by step (V=131072, H=4096, C={res['chunk_anatomy'][0]['C']}, bf16):",
        "",
        "| step | ms | TFLOP/s |",
        "|---|---|---|",
    ]
    lines += [
        f"| {r['step']} | {r['ms']:.3f} | {r['tflops']:.0f} |"
        if r["tflops"]
        else f"| {r['step']} | {r['ms']:.3f} | — |"
        for r in res["chunk_anatomy"]
    ]
    return lines


def _fp8_linear_md(res: dict[str, Any]) -> list[str]:
    """One row per quantized linear impl, recipe and save_original_input (none when not measured)."""
    if not res.get(FP8_KIND):
        return []
    M, K, N = next((r["shape"] for r in res[FP8_KIND] if "shape" in r), ["?"] * 3)
    lines = [
        "",
        f"Quantized linear, fwd+bwd, x [{M}, {K}] and W [{N}, {K}] in bf16, against a bf16 F.linear:",
        "",
        "| impl | recipe | save_original_input | median ms | extra peak MiB | held across backward MiB |",
        "|---|---|---|---|---|---|",
    ]
    for r in res[FP8_KIND]:
        if "error" in r:
            lines.append(f"| {r['impl']} | {r['recipe']} | {r['save_original_input']} | error: {r['error']} | | |")
        else:
            lines.append(
                f"| {r['impl']} | {r['recipe']} | {r['save_original_input']} | {r['ms']:.2f} | "
                f"{r['extra_peak_mib']:.0f} | {r['held_mib']:.1f} |"
            )
    return lines


def write_results(res: dict[str, Any], out: Path) -> None:
    """``bench.json`` and ``bench.md`` from what has been measured so far (called after every section, so a
    run cut short by a time limit still leaves its figures)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(res, indent=1))
    lines = _cases_md(res) + _grad_weight_paths_md(res) + _chunk_anatomy_md(res)
    if res.get("split_gemm_configs"):
        lines += ["", f"Split-accumulator GEMM configs chosen by Triton's autotuner: {res['split_gemm_configs']}"]
    lines += _fp8_linear_md(res)
    if res["skipped"]:
        lines += ["", "Not timed:", ""] + [f"- {s['impl']} {s.get('shape', '')}: {s['reason']}" for s in res["skipped"]]
    (out / "bench.md").write_text("\n".join(lines) + "\n")


def _split_config() -> str | None:
    """The config Triton's autotuner chose for the split accumulator's GEMM (after a bench ran it)."""
    try:
        cfgs = getattr(split_accum._addmm_split_kernel, "cache", {})
        return "; ".join(f"{k}: {v}" for k, v in cfgs.items()) or None
    except Exception:  # pragma: no cover - figures only
        return None


def run(args: argparse.Namespace) -> int:
    if args.out:
        try:
            prepare_out_dir(args.out)
        except BadInput as exc:
            print(f"numcheck bench: {exc}", file=sys.stderr)
            return 2
    if not torch.cuda.is_available():
        print("numcheck bench needs a CUDA device; none is available here", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    shapes = [tuple(int(v) for v in s.split(",")) for s in args.shape] or [(8192, 4096, 131072), (2048, 2048, 32768)]
    for s in shapes:
        if len(s) != 3:
            raise SystemExit(f"--shape wants BT,H,V, got {s}")
    entries = discover(args.impl)
    impls = [e.impl for e in by_kind(entries, LINEAR_CE_KIND)]
    res: dict[str, Any] = {
        "device": torch.cuda.get_device_name(dev),
        "torch": torch.__version__,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cases": [],
        "skipped": [],
    }
    for e in entries:
        if isinstance(e, BrokenImpl):
            res["skipped"].append({"impl": e.name, "reason": f"broken: {e.error}"})
    out = Path(args.out) if args.out else None
    start = matmul_rates(dev, args.rep_ms)
    res["bf16_matmul_tflops_samples"] = {"start": [r / 1e12 for r in start], "end": []}
    rate = max(start)
    res["bf16_matmul_tflops"] = rate / 1e12
    print(
        f"bf16 matmul rate: {rate / 1e12:.0f} TFLOP/s (best of {', '.join(f'{r / 1e12:.0f}' for r in start)})",
        flush=True,
    )
    _bench_one_chunk(res, dev, args.rep_ms, out)
    _bench_quant(res, dev, args.rep_ms, out)
    for BT, H, V in shapes:
        for impl in impls:
            _bench_case(res, impl, (BT, H, V), rate, dev, args.rep_ms, out)
    end = matmul_rates(dev, args.rep_ms)
    res["bf16_matmul_tflops_samples"]["end"] = [r / 1e12 for r in end]
    if max(end) > rate:  # the card ran faster later: the floor is the faster one, every share is recomputed
        rescale_to_rate(res, max(end))
    print(
        f"bf16 matmul rate after the cases: {', '.join(f'{r / 1e12:.0f}' for r in end)} TFLOP/s; floor shares use "
        f"{res['bf16_matmul_tflops']:.0f}",
        flush=True,
    )
    if out is not None:
        write_results(res, out)
    return 0


def _bench_one_chunk(res: dict[str, Any], dev: torch.device, rep_ms: float, out: Path | None) -> None:
    """The one-chunk sections of ``res`` (grad_weight paths, the chunk's anatomy, the split GEMM's configs),
    printed, and written to ``out`` when given."""
    res["grad_weight_paths"] = bench_grad_weight_paths(dev, rep_ms)
    res["chunk_anatomy"] = bench_chunk_anatomy(dev, rep_ms)
    for row in res["chunk_anatomy"]:
        speed = f" ({row['tflops']:.0f} TFLOP/s)" if row["tflops"] else ""
        print(f"chunk anatomy C={row['C']}: {row['step']:48s} {row['ms']:.3f} ms{speed}")
    res["split_gemm_configs"] = _split_config()
    for row in res["grad_weight_paths"]:
        print(
            f"one chunk C={row['C']} {row['path']:16s} (runs {row['resolved']}): {row['ms']:.2f} ms "
            f"({row['tflops']:.0f} TFLOP/s), extra {row['extra_peak_mib']:.0f} MiB, holds "
            f"{row['held_beyond_grad_mib']:.0f} MiB beyond the gradient"
        )
    print(f"split GEMM autotuned configs: {res['split_gemm_configs']}")
    if out is not None:
        write_results(res, out)


def _bench_quant(res: dict[str, Any], dev: torch.device, rep_ms: float, out: Path | None) -> None:
    """The quantized-linear section of ``res``, printed, and written to ``out`` when given."""
    res[FP8_KIND] = bench_fp8_linear(dev, rep_ms)
    for row in res[FP8_KIND]:
        if "error" in row:
            print(f"quant {row['impl']} {row['recipe']} soi={row['save_original_input']}: {row['error']}")
        else:
            print(
                f"quant {row['impl']:24s} {row['recipe'][:40]:40s} soi={row['save_original_input']!s:5s}: "
                f"{row['ms']:.2f} ms, extra {row['extra_peak_mib']:.0f} MiB, held {row['held_mib']:.1f} MiB"
            )
    if out is not None:
        write_results(res, out)


def _bench_case(
    res: dict[str, Any],
    impl: Any,
    shape: tuple[int, int, int],
    rate: float,
    dev: torch.device,
    rep_ms: float,
    out: Path | None,
) -> None:
    """One impl at one shape, timed against the floor at ``rate`` and added to ``res`` (printed, and written to
    ``out`` when given), or recorded as skipped with the reason."""
    BT, H, V = shape
    floor_ms = 6 * BT * H * V / rate * 1e3
    s = impl.support
    why = s.unavailable_reason() or s.refuses(dtype=torch.bfloat16, device="cuda", options={"ignore_index"})
    if why:
        res["skipped"].append({"impl": impl.name, "shape": [BT, H, V], "reason": why})
        return
    try:
        r = bench_impl(impl, BT, H, V, dev, rep_ms)
    except Exception as exc:  # recorded, not hidden: an impl that cannot run at this size
        res["skipped"].append({"impl": impl.name, "shape": [BT, H, V], "reason": f"{type(exc).__name__}: {exc}"[:300]})
        torch.cuda.empty_cache()
        return
    r.update(impl=impl.name, shape=[BT, H, V], floor_ms=floor_ms, share_of_floor=floor_ms / r["ms"])
    res["cases"].append(r)
    if out is not None:
        write_results(res, out)
    print(
        f"{impl.name:40s} BT={BT} H={H} V={V}: {r['ms']:8.2f} ms ({r['share_of_floor']:.2f} of floor "
        f"{floor_ms:.1f} ms), extra peak {r['extra_peak_mib']:8.0f} MiB, held across backward "
        f"{r['held_mib']:.1f} MiB",
        flush=True,
    )
    torch.cuda.empty_cache()
