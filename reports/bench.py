"""``numcheck bench``: speed and memory of the linear+CE impls on a CUDA device, as figures (never as tests).

For each registered linear+CE impl that runs on CUDA in bf16, forward+backward at each shape
(default BT=8192, H=4096, V=131072, and BT=2048, H=2048, V=32768), 10% of the rows ignored, ``mean``:
median time over CUDA events (``triton.testing.do_bench``), extra peak memory above the inputs
(``torch.cuda.max_memory_allocated``), and the time as a share of the floor 6·BT·H·V / R, R being the bf16
matmul rate measured in the same run. Then the seed's one-chunk grad_weight micro-benchmark (V=131072,
H=4096, C=2048; the three paths' time and extra peak). Results go to ``--out`` as JSON and Markdown.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

HELP = "time and measure memory of every linear+CE impl on a CUDA device (figures, not tests)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--impl", action="append", default=[], metavar="SPEC", help="only these impls (repeatable)")
    p.add_argument("--shape", action="append", default=[], metavar="BT,H,V",
                   help="shapes to time (repeatable; default 8192,4096,131072 and 2048,2048,32768)")
    p.add_argument("--out", default=None, help="directory for bench.json and bench.md (default: print only)")
    p.add_argument("--rep-ms", type=float, default=400.0, help="milliseconds of timed repetitions per case")


def _bench_ms(fn: Callable[[], Any], rep_ms: float) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=max(25.0, rep_ms / 4), rep=rep_ms, return_mode="median"))


def matmul_rate(dev: torch.device, rep_ms: float) -> float:
    """Measured bf16 matmul rate in FLOP/s (8192³, random data)."""
    n = 8192
    a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    ms = _bench_ms(lambda: a @ b, rep_ms)
    return 2 * n**3 / (ms * 1e-3)


def _case(BT: int, H: int, V: int, dev: torch.device, seed: int = 0):
    g = torch.Generator(device=dev).manual_seed(seed)
    x = torch.randn(BT, H, device=dev, dtype=torch.bfloat16, generator=g)
    w = (torch.randn(V, H, device=dev, dtype=torch.bfloat16, generator=g) * (2.0 / math.sqrt(H))).to(torch.bfloat16)
    t = torch.randint(0, V, (BT,), device=dev, generator=g)
    ign = torch.rand(BT, device=dev, generator=g) < 0.1
    t[ign] = -100
    return x, w, t


def bench_impl(impl: Any, BT: int, H: int, V: int, dev: torch.device, rep_ms: float) -> dict[str, Any]:
    """Median fwd+bwd time and extra peak of one impl at one shape."""
    x, w, t = _case(BT, H, V, dev)
    xr = x.clone().requires_grad_()
    wr = w.clone().requires_grad_()

    def step() -> None:
        xr.grad = None
        wr.grad = None
        out = impl(xr, wr, t, None, reduction="mean", ignore_index=-100)
        loss = out[0] if isinstance(out, tuple) else out
        loss.backward()

    step()  # warm-up / compile, and allocate the .grad buffers so they are not counted as extra
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats(dev)
    base = torch.cuda.memory_allocated(dev)
    step()
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated(dev) - base
    ms = _bench_ms(step, rep_ms)
    return {"ms": ms, "extra_peak_mib": extra / 2**20}


def bench_grad_weight_paths(dev: torch.device, rep_ms: float, V: int = 131072, H: int = 4096, C: int = 2048) -> list[dict]:
    """The seed's one-chunk micro-benchmark: time and extra peak of each accumulation step."""
    from impls import grad_accum

    G = torch.randn(C, V, device=dev, dtype=torch.bfloat16)
    xc = torch.randn(C, H, device=dev, dtype=torch.bfloat16)
    gw = torch.zeros(V, H, device=dev, dtype=torch.float32)
    rows = []
    for path in ("fallback", "fp32_operands", "addmm_out_dtype", "lowp_accum"):
        step = grad_accum.PATHS[path]
        acc = gw if path != "lowp_accum" else torch.zeros(V, H, device=dev, dtype=torch.bfloat16)
        step(acc, G, xc)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(dev)
        base = torch.cuda.memory_allocated(dev)
        step(acc, G, xc)
        torch.cuda.synchronize()
        extra = torch.cuda.max_memory_allocated(dev) - base
        ms = _bench_ms(lambda: step(acc, G, xc), rep_ms)
        rows.append({"path": path, "resolved": grad_accum.resolved_path(path, dev, torch.bfloat16),
                     "ms": ms, "extra_peak_mib": extra / 2**20})
    return rows


def run(args: argparse.Namespace) -> int:
    from impls.registry import BrokenImpl, by_kind, discover

    if not torch.cuda.is_available():
        print("numcheck bench needs a CUDA device; none is available here", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    shapes = [tuple(int(v) for v in s.split(",")) for s in args.shape] or [(8192, 4096, 131072), (2048, 2048, 32768)]
    for s in shapes:
        if len(s) != 3:
            raise SystemExit(f"--shape wants BT,H,V, got {s}")
    entries = discover(args.impl)
    impls = [e.impl for e in by_kind(entries, "linear_ce")]
    res: dict[str, Any] = {
        "device": torch.cuda.get_device_name(dev), "torch": torch.__version__,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "cases": [], "skipped": [],
    }
    for e in entries:
        if isinstance(e, BrokenImpl):
            res["skipped"].append({"impl": e.name, "reason": f"broken: {e.error}"})
    rate = matmul_rate(dev, args.rep_ms)
    res["bf16_matmul_tflops"] = rate / 1e12
    print(f"bf16 matmul rate: {rate / 1e12:.0f} TFLOP/s", flush=True)
    for BT, H, V in shapes:
        floor_ms = 6 * BT * H * V / rate * 1e3
        for impl in impls:
            s = impl.support
            why = s.unavailable_reason() or s.refuses(dtype=torch.bfloat16, device="cuda", options={"ignore_index"})
            if why:
                res["skipped"].append({"impl": impl.name, "shape": [BT, H, V], "reason": why})
                continue
            try:
                r = bench_impl(impl, BT, H, V, dev, args.rep_ms)
            except Exception as exc:  # recorded, not hidden: an impl that cannot run at this size
                res["skipped"].append({"impl": impl.name, "shape": [BT, H, V], "reason": f"{type(exc).__name__}: {exc}"[:300]})
                torch.cuda.empty_cache()
                continue
            r.update(impl=impl.name, shape=[BT, H, V], floor_ms=floor_ms, share_of_floor=floor_ms / r["ms"])
            res["cases"].append(r)
            print(f"{impl.name:40s} BT={BT} H={H} V={V}: {r['ms']:8.2f} ms ({r['share_of_floor']:.2f} of floor "
                  f"{floor_ms:.1f} ms), extra peak {r['extra_peak_mib']:8.0f} MiB", flush=True)
            torch.cuda.empty_cache()
    res["grad_weight_paths"] = bench_grad_weight_paths(dev, args.rep_ms)
    for row in res["grad_weight_paths"]:
        print(f"one chunk {row['path']:16s} (runs {row['resolved']}): {row['ms']:.2f} ms, extra {row['extra_peak_mib']:.0f} MiB")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "bench.json").write_text(json.dumps(res, indent=1))
        lines = [f"# numcheck bench — {res['device']}, torch {res['torch']}", "",
                 f"bf16 matmul rate measured in this run: {res['bf16_matmul_tflops']:.0f} TFLOP/s.", "",
                 "| impl | BT | H | V | median ms | share of floor | extra peak MiB |", "|---|---|---|---|---|---|---|"]
        for c in res["cases"]:
            BT, H, V = c["shape"]
            lines.append(f"| {c['impl']} | {BT} | {H} | {V} | {c['ms']:.2f} | {c['share_of_floor']:.2f} | {c['extra_peak_mib']:.0f} |")
        lines += ["", "One chunk of grad_weight accumulation (V=131072, H=4096, C=2048, bf16 operands, fp32 accumulator):", "",
                  "| path | runs | ms | extra peak MiB |", "|---|---|---|---|"]
        lines += [f"| {r['path']} | {r['resolved']} | {r['ms']:.2f} | {r['extra_peak_mib']:.0f} |" for r in res["grad_weight_paths"]]
        if res["skipped"]:
            lines += ["", "Not timed:", ""] + [f"- {s['impl']} {s.get('shape', '')}: {s['reason']}" for s in res["skipped"]]
        (out / "bench.md").write_text("\n".join(lines) + "\n")
    return 0
