"""Naive vs fused log-probs + entropy (forward + backward): peak extra memory and time.

Two kinds of step, each timed for the naive and the fused path:

* ``full`` (the original rows): ``(logp.sum() + 0.1 * entropy.sum()).backward()``, gradients
  through both outputs (what an entropy bonus needs).
* ``train`` (what ``RLModule`` does, ``lightning_rlpt/logprobs.py``): gradients through the
  log-probs only (upstream gradient: fixed random per-token weights standing in for the
  policy loss's advantages), the entropy computed as a detached metric. Naive: the module's
  plain path, ``logits_logprobs(F.linear(hidden, weight), targets, 1.0, with_entropy=True)``
  (full logits, ``.float() / T``, ``log_softmax``, gather; entropy under ``no_grad``). Fused:
  ``fused_logprobs(..., return_entropy=True)`` then ``entropy.detach()``, as the module calls it.

Precision (what each path computes, bf16 inputs):

* ``naive`` — logits ``hidden @ weight.T`` in the *input* dtype (for bf16: a bf16 matmul, and
  bf16 matmuls in the backward), then fp32 log-softmax. For fp32 inputs everything is fp32.
* ``naive-f32mm`` (bf16 only) — hidden and weight cast to fp32 first, so the logits and every
  matmul are fp32: the same arithmetic as the fused path, the like-for-like baseline.
* ``chunked`` / ``fused-train`` — the fused op: bf16 tiles cast to fp32, fp32 matmuls, fp32
  log-sum-exp and gradient accumulation, gradients returned in bf16.

Ratios ("× naive") are against the like-for-like naive path of the same kind of step and shape:
``naive`` for fp32, ``naive-f32mm`` for bf16 (so a bf16 ratio does not credit the fused path
with this CPU's slow bf16 matmuls; the ``naive`` bf16 row shows what those cost).

Each (variant, shape) runs in its own child process so that one variant's allocations cannot
hide another's; children alternate between variants, ``--rounds`` per variant. Memory, CPU:
the child builds its inputs, runs the variant once on a tiny shape (library and thread-pool
start-up is not charged to it), reads its resident set size (``VmRSS``), resets the kernel's
peak-RSS counter (``echo 5 > /proc/self/clear_refs`` resets ``VmHWM``), runs one step and
reports ``VmHWM - VmRSS_before``: every byte the step touched beyond its inputs, including the
gradients it returns (the same for every variant); the largest over the children. CUDA:
``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``, minus the memory
allocated before. Time: median over all children's ``--steps`` timed steps (the first
included: page faults on fresh allocations are part of the naive path's cost). On a CPU without
bf16 instructions (AVX512-BF16, AMX) the bf16 shape has N=1024 and the naive bf16 rows (minutes
of bf16 matmuls) time ``--slow-steps`` steps per child; the note records the CPU.

Usage::

    python benchmarks/logprob_kernel.py            # N=4096, H=512, V=32768, fp32 and bf16
    python benchmarks/logprob_kernel.py --quick    # N=512, H=128, V=4096
Writes benchmarks/results/logprob_kernel.{json,md} (``--results``; ``--quick`` writes nothing
unless ``--results`` is given).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from quiet import (IDLE, add_idle_args, cpu_info, read_status_kb, repeat_if_disturbed, reset_peak_rss,
                   run_measured, set_idle)  # benchmarks/quiet.py

HERE = os.path.dirname(os.path.abspath(__file__))

QUICK = [(512, 128, 4096, "float32"), (512, 128, 4096, "bfloat16")]


def full_shapes(cuda: bool) -> list[tuple[int, int, int, str]]:
    """fp32 and bf16 at N=4096; bf16 at N=1024 on a CPU without bf16 instructions (AVX512-BF16 or
    AMX), where the naive path's bf16 matmuls take minutes a step at N=4096."""
    native = cuda or bool(cpu_info()["bf16"])
    return [(4096, 512, 32768, "float32"), (4096 if native else 1024, 512, 32768, "bfloat16")]


def naive_full(hidden, weight, targets, upcast=False):
    """A plain implementation: full logits, log_softmax, gather, entropy (all differentiable)."""
    if upcast:
        hidden, weight = hidden.float(), weight.float()
    logp_all = (hidden @ weight.T).float().log_softmax(-1)
    logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return logp, -(logp_all.exp() * logp_all).sum(-1)


def fused_full(hidden, weight, targets):
    from lightning_rlpt.kernels import fused_logprobs

    return fused_logprobs(hidden, weight, targets)


def naive_train(hidden, weight, targets, upcast=False):
    """RLModule's plain path (``logits_logprobs``) on ``lm_head(hidden)``; entropy detached."""
    from lightning_rlpt.model.logprobs import logits_logprobs

    if upcast:
        hidden, weight = hidden.float(), weight.float()
    return logits_logprobs(F.linear(hidden, weight), targets, 1.0, with_entropy=True)


def fused_train(hidden, weight, targets):
    """RLModule's fused path (``completion_logprobs``): the op with entropy, entropy detached."""
    from lightning_rlpt.model.logprobs import _fused  # the op the module calls

    logp, ent = _fused()(hidden, weight, targets, bias=None, temperature=1.0, return_entropy=True)
    return logp, ent.detach()


# name -> (kind, function, device, upcast); on CUDA the custom op dispatches to the Triton kernels.
VARIANTS = {
    "naive": ("full", naive_full, "cpu", False),
    "naive-f32mm": ("full", naive_full, "cpu", True),
    "chunked": ("full", fused_full, "cpu", None),
    "naive-train": ("train", naive_train, "cpu", False),
    "naive-train-f32mm": ("train", naive_train, "cpu", True),
    "fused-train": ("train", fused_train, "cpu", None),
    "naive-cuda": ("full", naive_full, "cuda", False),
    "triton": ("full", fused_full, "cuda", None),
    "naive-train-cuda": ("train", naive_train, "cuda", False),
    "triton-train": ("train", fused_train, "cuda", None),
}
DESCRIBE = {
    "naive": "logits in the input dtype, fp32 log-softmax",
    "naive-f32mm": "inputs cast to fp32: fp32 matmuls and log-softmax",
    "chunked": "fused op (fp32 tiles, fp32 accumulation)",
    "naive-train": "RLModule plain path: logits in the input dtype, fp32 log-softmax",
    "naive-train-f32mm": "RLModule plain path on fp32-cast inputs",
    "fused-train": "RLModule fused path (fp32 tiles, fp32 accumulation)",
    "naive-cuda": "naive on CUDA", "triton": "fused op, Triton",
    "naive-train-cuda": "RLModule plain path on CUDA", "triton-train": "RLModule fused path, Triton",
}


def call(variant, hidden, weight, targets):
    kind, fn, _, upcast = VARIANTS[variant]
    return fn(hidden, weight, targets) if upcast is None else fn(hidden, weight, targets, upcast=upcast)


def step(variant, hidden, weight, targets, coef):
    hidden.grad = weight.grad = None
    logp, ent = call(variant, hidden, weight, targets)
    if VARIANTS[variant][0] == "full":
        (logp.sum() + 0.1 * ent.sum()).backward()
    else:  # the policy loss's gradient reaches the log-probs only; the entropy is a logged metric
        assert not ent.requires_grad
        (logp * coef).sum().backward()
        float(ent.mean())


def make(n, h, v, dtype, device, seed=0):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, h, generator=gen).to(device=device, dtype=dtype).requires_grad_()
    weight = (torch.randn(v, h, generator=gen) * h ** -0.5).to(device=device, dtype=dtype).requires_grad_()
    targets = torch.randint(0, v, (n,), generator=gen).to(device)
    coef = (torch.randn(n, generator=gen) / n).to(device)  # stands in for advantage / length weights
    return hidden, weight, targets, coef


def worker(variant: str, n: int, h: int, v: int, dtype: str, steps: int) -> dict:
    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "2")))
    device, dt = VARIANTS[variant][2], getattr(torch, dtype)
    load_start = os.getloadavg()[0]
    step(variant, *make(8, 16, 64, dt, device))  # warm-up: libraries, thread pools, kernel compile
    inputs = make(n, h, v, dt, device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    if device == "cuda":
        sync()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    else:
        before = read_status_kb("VmRSS") * 1024
        reset_peak_rss(trim=False)  # VmHWM (peak RSS) := the current RSS
    times = []
    for i in range(steps):
        start = time.perf_counter()
        step(variant, *inputs)
        sync()
        times.append(time.perf_counter() - start)
        if i == 0:
            peak = torch.cuda.max_memory_allocated() if device == "cuda" else read_status_kb("VmHWM") * 1024
    return dict(extra_mb=(peak - before) / 2 ** 20, times=times, load_start=load_start, load_end=os.getloadavg()[0],
                threads=torch.get_num_threads())




def run_child(variant, n, h, v, dtype, steps) -> dict:
    """One child in its own process, repeated when other processes disturbed it (`quiet`)."""
    return repeat_if_disturbed(lambda: _run_child_once(variant, n, h, v, dtype, steps),
                               keep=("times", "extra_mb", "others_cores"), label=variant)


def _run_child_once(variant, n, h, v, dtype, steps) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", variant, str(n), str(h), str(v), dtype,
           "--steps", str(steps)]
    out, seen = run_measured(cmd)
    if out.returncode != 0:
        raise RuntimeError(f"{variant} {n}x{h}x{v} {dtype} failed:\n{out.stderr[-3000:]}")
    return {**json.loads(out.stdout.strip().splitlines()[-1]), "others_cores": seen["others_cores"],
            "waited_s": seen["waited_s"]}


def variants_for(dtype: str, cuda: bool) -> list[str]:
    names = ["naive", "chunked", "naive-train", "fused-train"]
    if dtype != "float32":
        names = ["naive", "naive-f32mm", "chunked", "naive-train", "naive-train-f32mm", "fused-train"]
    if cuda:
        names += ["naive-cuda", "triton", "naive-train-cuda", "triton-train"]
    return names


def baseline(variant: str, dtype: str) -> str:
    kind, _, device, _ = VARIANTS[variant]
    if device == "cuda":
        return "naive-cuda" if kind == "full" else "naive-train-cuda"
    name = "naive" if kind == "full" else "naive-train"
    return name + ("-f32mm" if dtype != "float32" else "")


def measure(variants, n, h, v, dtype, rounds, steps, slow_steps) -> list[dict]:
    """Children alternate between variants, so a busy spell on a shared machine hits all alike."""
    runs = {name: [] for name in variants}
    for _ in range(rounds):
        for name in variants:
            slow = name in ("naive", "naive-train") and dtype != "float32" and not cpu_info()["bf16"]
            r = run_child(name, n, h, v, dtype, slow_steps if slow else steps)
            runs[name].append(r)
            print(f"  {name:18s} {dtype:9s} {statistics.median(r['times']):7.2f} s  {r['extra_mb']:6.0f} MB  "
                  f"load {r['load_start']:.1f}->{r['load_end']:.1f}  others {r['others_cores']:.2f} cores", file=sys.stderr, flush=True)
    rows = []
    for name in variants:
        times = [t for r in runs[name] for t in r["times"]]
        rows.append(dict(n=n, h=h, v=v, dtype=dtype, variant=name, kind=VARIANTS[name][0], what=DESCRIBE[name],
                         seconds=statistics.median(times), times=times, children=len(runs[name]),
                         extra_mb=max(r["extra_mb"] for r in runs[name]),
                         load=[(r["load_start"], r["load_end"]) for r in runs[name]],
                         others_cores=[r["others_cores"] for r in runs[name]], waited_s=[r["waited_s"] for r in runs[name]],
                         discarded=[d for r in runs[name] for d in r["discarded"]]))
    by = {r["variant"]: r for r in rows}
    for r in rows:
        base = by[baseline(r["variant"], dtype)]
        r.update(baseline=base["variant"], time_ratio=r["seconds"] / base["seconds"],
                 mem_ratio=r["extra_mb"] / base["extra_mb"])
    return rows


KINDS = {"full": "grad through log-probs and entropy", "train": "training-shaped: grad through log-probs only, "
         "entropy a detached metric"}


def table(rows: list[dict]) -> str:
    lines = ["| N × H × V | dtype | step | variant | what it computes | fwd+bwd time (s) | × naive time | "
             "extra peak memory (MB) | × naive memory | ratios against |",
             "|---|---|---|---|---|---:|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r['n']} × {r['h']} × {r['v']} | {r['dtype']} | {r['kind']} | {r['variant']} | {r['what']} | "
                     f"{r['seconds']:.2f} | {r['time_ratio']:.2f} | {r['extra_mb']:.0f} | {r['mem_ratio']:.3f} | "
                     f"{r['baseline']} |")
    return "\n".join(lines)


def per_child(rows: list[dict]) -> str:
    """Each variant's timed steps and what else ran meanwhile, so the medians can be checked."""
    lines = ["| N × H × V | dtype | variant | timed steps (s) | other processes' CPU per child (cores) |",
             "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['n']} × {r['h']} × {r['v']} | {r['dtype']} | {r['variant']} | "
                     f"{', '.join(f'{t:.2f}' for t in r['times'])} | {', '.join(f'{x:.2f}' for x in r['others_cores'])} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small shapes (seconds, not minutes)")
    parser.add_argument("--rounds", type=int, default=3, help="child processes per variant (interleaved)")
    parser.add_argument("--steps", type=int, default=2, help="timed forward+backward steps per child")
    parser.add_argument("--slow-steps", type=int, default=1, help="timed steps per child of the naive bf16-matmul rows")
    parser.add_argument("--results", default=None, help="directory for logprob_kernel.{json,md} "
                        "(default: benchmarks/results, or nothing with --quick)")
    parser.add_argument("--render", action="store_true", help="only rebuild logprob_kernel.md from logprob_kernel.json")
    parser.add_argument("--worker", nargs=5, metavar=("VARIANT", "N", "H", "V", "DTYPE"), help=argparse.SUPPRESS)
    add_idle_args(parser, "child")
    args = parser.parse_args()
    set_idle(args)
    if args.worker:
        variant, n, h, v, dtype = args.worker
        print(json.dumps(worker(variant, int(n), int(h), int(v), dtype, args.steps)))
        return
    results = args.results or (None if args.quick else os.path.join(HERE, "results"))
    if args.render:  # rebuild the markdown from the JSON a full run wrote
        with open(os.path.join(results or os.path.join(HERE, "results"), "logprob_kernel.json")) as f:
            data = json.load(f)
    else:
        cuda = torch.cuda.is_available()
        rows, load_before, start = [], os.getloadavg()[0], time.perf_counter()
        for n, h, v, dtype in QUICK if args.quick else full_shapes(cuda):
            rows += measure(variants_for(dtype, cuda), n, h, v, dtype, args.rounds, args.steps, args.slow_steps)
        data = dict(rows=rows, load_before=load_before, load_after=os.getloadavg()[0], rounds=args.rounds,
                    steps=args.steps, slow_steps=args.slow_steps, threads=int(os.environ.get("BENCH_THREADS", "2")),
                    idle=dict(IDLE), torch=torch.__version__, date=time.strftime("%Y-%m-%d"), cpus=os.cpu_count(),
                    cpu=cpu_info(), cuda=torch.cuda.get_device_name() if cuda else None,
                    seconds=time.perf_counter() - start)
    text = render(data)
    print(text)
    if results:
        os.makedirs(results, exist_ok=True)
        with open(os.path.join(results, "logprob_kernel.md"), "w") as f:
            f.write("# Fused log-prob + entropy kernel (benchmarks/logprob_kernel.py)\n\n" + text)
        if not args.render:
            with open(os.path.join(results, "logprob_kernel.json"), "w") as f:
                json.dump(data, f, indent=1)


def render(d: dict) -> str:
    rows, gate, cpu = d["rows"], d["idle"], d["cpu"]
    loads = [x for r in rows for pair in r["load"] for x in pair]
    others = [x for r in rows for x in r["others_cores"]]
    slow = f" ({d['slow_steps']} for the naive bf16-matmul rows)" if not cpu["bf16"] and not d.get("cuda") else ""
    elapsed = f" {d['seconds']:.0f} s in all." if "seconds" in d else ""
    note = (f"Measured {d['date']}, {d['cpus']} CPU cores ({cpu['model']}; bf16 instructions: "
            f"{', '.join(cpu['bf16']) or 'none'}), torch {d['torch']}, {d['threads']} torch threads"
            f"{', CUDA ' + d['cuda'] if d.get('cuda') else ''}; {d['rounds']} children per variant (alternating), "
            f"{d['steps']} timed steps each{slow}; time = median over all of them; memory = the largest child's. "
            f"1-minute load average {d['load_before']:.1f} before, {d['load_after']:.1f} after "
            f"(children saw {min(loads):.1f}–{max(loads):.1f}). Each child started once other processes used "
            f"≤ {gate['max_busy']:.1f} cores (waiting ≤ {gate['max_wait']:.0f} s; longest wait "
            f"{max(x for r in rows for x in r['waited_s']):.0f} s); while the children ran, other processes used "
            f"{min(others):.2f}–{max(others):.2f} cores (median {statistics.median(others):.2f}) of the "
            f"{d['cpus']}; children during which they used more than {gate['max_others']:.1f} cores were repeated "
            f"(at most {gate['retries']} times): {sum(len(r['discarded']) for r in rows)} discarded, kept in the JSON."
            f"{elapsed}")
    legend = "; ".join(f"`{k}`: {v}" for k, v in KINDS.items())
    return (f"{table(rows)}\n\nSteps — {legend}.\n\n{note}\n\n<details><summary>every timed step</summary>\n\n"
            f"{per_child(rows)}\n\n</details>\n")


if __name__ == "__main__":
    main()
