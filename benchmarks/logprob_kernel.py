"""Naive vs fused log-probs + entropy (forward + backward): peak extra memory and time.

Each (variant, dtype, shape) runs in its own child process so that one variant's allocations
cannot hide another's. Memory method, CPU: the child builds its inputs, runs the variant
once on a tiny shape (so library and thread-pool start-up is not charged to it), reads its
resident set size (``VmRSS``), resets the kernel's peak-RSS counter (``echo 5 >
/proc/self/clear_refs`` resets ``VmHWM``), runs one forward+backward and reports
``VmHWM - VmRSS_before``: every byte the step touched beyond its inputs, including the
gradients it returns (the same for every variant). CUDA: ``torch.cuda.max_memory_allocated``
after ``reset_peak_memory_stats``, minus the memory allocated before (the larger of the
children's). Time: median over ``--rounds`` children per variant, alternating between the
variants, of ``--steps`` steps each.

Usage::

    python benchmarks/logprob_kernel.py            # N=4096, H=512, V=32768 fp32; N=1024 bf16
    python benchmarks/logprob_kernel.py --quick    # N=512, H=128, V=4096
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch

# The bf16 shape has fewer tokens: without AVX512-BF16 a CPU runs bf16 matmuls ~5x slower than
# fp32 (7.8 vs 40 GFLOP/s measured here), and the naive bf16 path at N=4096 takes minutes a step.
FULL = [(4096, 512, 32768, "float32"), (1024, 512, 32768, "bfloat16")]
QUICK = [(512, 128, 4096, "float32"), (512, 128, 4096, "bfloat16")]


def naive(hidden, weight, targets):
    """What a plain implementation does: full logits, log_softmax, gather, entropy."""
    logp_all = (hidden @ weight.T).float().log_softmax(-1)
    logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return logp, -(logp_all.exp() * logp_all).sum(-1)


def fused(hidden, weight, targets):
    from lightning_rlpt.kernels import fused_logprobs

    return fused_logprobs(hidden, weight, targets)


# name -> (function, device); on CUDA the custom op dispatches to the Triton kernels.
VARIANTS = {"naive": (naive, "cpu"), "chunked": (fused, "cpu"), "naive-cuda": (naive, "cuda"),
            "triton": (fused, "cuda")}


def step(fn, hidden, weight, targets):
    hidden.grad = weight.grad = None
    logp, ent = fn(hidden, weight, targets)
    (logp.sum() + 0.1 * ent.sum()).backward()


def make(n, h, v, dtype, device, seed=0):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, h, generator=gen).to(device=device, dtype=dtype).requires_grad_()
    weight = (torch.randn(v, h, generator=gen) * h ** -0.5).to(device=device, dtype=dtype).requires_grad_()
    return hidden, weight, torch.randint(0, v, (n,), generator=gen).to(device)


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def worker(variant: str, n: int, h: int, v: int, dtype: str, steps: int) -> dict:
    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "2")))
    (fn, device), dt = VARIANTS[variant], getattr(torch, dtype)
    step(fn, *make(8, 16, 64, dt, device))  # warm-up: libraries, thread pools, kernel compile
    inputs = make(n, h, v, dt, device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    if device == "cuda":
        sync()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    else:
        before = _status_kb("VmRSS") * 1024
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset VmHWM (peak RSS) to the current RSS
    times = []
    for i in range(steps):
        start = time.perf_counter()
        step(fn, *inputs)
        sync()
        times.append(time.perf_counter() - start)
        if i == 0:
            peak = torch.cuda.max_memory_allocated() if device == "cuda" else _status_kb("VmHWM") * 1024
    return dict(extra_mb=(peak - before) / 2 ** 20, times=times)


def run_child(variant, n, h, v, dtype, steps) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", variant, str(n), str(h), str(v), dtype,
           "--steps", str(steps)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(variants, n, h, v, dtype, rounds, steps) -> list[dict]:
    """Children alternate between variants, so a busy spell on a shared machine hits all alike."""
    runs = {name: [] for name in variants}
    for _ in range(rounds):
        for name in variants:
            runs[name].append(run_child(name, n, h, v, dtype, steps))
    rows = []
    for name in variants:
        seconds = statistics.median(t for r in runs[name] for t in r["times"])
        extra = max(r["extra_mb"] for r in runs[name])
        rows.append(dict(n=n, h=h, v=v, dtype=dtype, variant=name, seconds=seconds, extra_mb=extra))
        print(f"{name:10s} {dtype:9s} {seconds:.2f} s  {extra:.0f} MB", file=sys.stderr)
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| N × H × V | dtype | variant | fwd+bwd time (s) | × naive time | extra peak memory (MB) | × naive memory |",
             "|---|---|---|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['n']} × {r['h']} × {r['v']} | {r['dtype']} | {r['variant']} | {r['seconds']:.2f} | "
                     f"{r['time_ratio']:.2f} | {r['extra_mb']:.0f} | {r['mem_ratio']:.3f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small shapes (seconds, not minutes)")
    parser.add_argument("--rounds", type=int, default=2, help="child processes per variant (interleaved)")
    parser.add_argument("--steps", type=int, default=2, help="timed forward+backward steps per child")
    parser.add_argument("--worker", nargs=5, metavar=("VARIANT", "N", "H", "V", "DTYPE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        variant, n, h, v, dtype = args.worker
        print(json.dumps(worker(variant, int(n), int(h), int(v), dtype, args.steps)))
        return
    variants = ["naive", "chunked"] + (["naive-cuda", "triton"] if torch.cuda.is_available() else [])
    rows, load_before = [], os.getloadavg()[0]
    for n, h, v, dtype in QUICK if args.quick else FULL:
        for r in measure(variants, n, h, v, dtype, args.rounds, args.steps):
            if r["variant"].startswith("naive"):  # ratios are against the naive path on the same device
                base = r
            rows.append({**r, "time_ratio": r["seconds"] / base["seconds"], "mem_ratio": r["extra_mb"] / base["extra_mb"]})
    print(table(rows))
    print(f"\n(1-minute load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after; "
          f"{os.environ.get('BENCH_THREADS', '2')} torch threads)")


if __name__ == "__main__":
    main()
