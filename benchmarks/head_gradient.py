"""The update's LM head, forward and backward: the head's gradient formed in the forward pass
(``head_gradient="forward"``, `kernels.head_in_forward`) against the recompute path
(``"recompute"``: `fused_logprobs` under autograd, the logits recomputed in the backward).

The shape is the reference step's update (`benchmarks/floor.py`): 16 prompts × 8 completions ×
32 new tokens = 4,096 tokens, hidden 256, vocabulary 32,000, fp32; the objective a GRPO clipped
surrogate with token-mean aggregation and an entropy term, as `objective_terms` computes it,
both sides on the same tensors. Only the head and the loss run: the decoder's share of the step
is the same on both paths. Each side runs in its own child process; children alternate between
the sides, ``--rounds`` each, ``--steps`` timed steps per child after one warm-up step; the figure
is the median of all of a side's steps. Memory: the child's peak resident set over the steps
minus its resident set before them (`quiet.reset_peak_rss`). The floor is three GEMMs of
``2·N·H·V`` at the machine's fp32 peak measured by `benchmarks/floor.py` (its JSON).

What the figures do not show: the decoder, the rollout, several threads' contention with other
work; a GPU (the Triton kernels have their own backward).

Usage::

    python benchmarks/head_gradient.py                 # writes benchmarks/results/head_gradient.json
    python benchmarks/head_gradient.py --quick         # small shape, writes nothing
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

from quiet import add_idle_args, cpu_info, read_status_kb, reset_peak_rss, run_json_child, set_idle, write_json

HERE = os.path.dirname(os.path.abspath(__file__))
SIDES = ("forward", "recompute")


def _inputs(n: int, c: int, h: int, v: int):
    g = torch.Generator().manual_seed(0)
    hidden = (torch.randn(n, c, h, generator=g) * 0.5).requires_grad_()
    weight = (torch.randn(v, h, generator=g) * 0.05).requires_grad_()
    targets = torch.randint(0, v, (n, c), generator=g)
    adv = torch.randn(n, 1, generator=g)
    mask = (torch.rand(n, c, generator=g) > 0.1).float()
    return hidden, weight, targets, adv, mask


def _objective(adv, mask, tokens):
    def share(span, logp, entropy):
        ratio = (logp - logp.detach()).exp()
        surrogate = torch.minimum(ratio * adv[span], ratio.clamp(0.8, 1.28) * adv[span])
        return ((-surrogate - 1e-3 * entropy) * mask[span]).sum() / tokens, None
    return share


def step(side: str, hidden, weight, targets, adv, mask) -> None:
    from lightning_rlpt.kernels import fused_logprobs, head_loss_in_forward, rows_per_chunk

    n, c, h = hidden.shape
    objective = _objective(adv, mask, mask.sum())
    if side == "forward":
        loss = head_loss_in_forward(hidden, weight, None, targets, 1.0, objective, rows_per_chunk(c, weight.shape[0]))[0]
    else:
        logp, ent = fused_logprobs(hidden.reshape(-1, h), weight, targets.reshape(-1), return_entropy=True)
        loss = objective(slice(0, n), logp.view(n, c), ent.view(n, c))[0]
    loss.backward()
    hidden.grad = weight.grad = None


def worker(side: str, n: int, c: int, h: int, v: int, steps: int) -> None:
    tensors = _inputs(n, c, h, v)
    step(side, *tensors)  # warm-up: thread pools, allocator
    before = read_status_kb("VmRSS")
    reset_peak_rss()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step(side, *tensors)
        times.append(time.perf_counter() - start)
    print(json.dumps(dict(times=times, extra_mb=(read_status_kb("VmHWM") - before) / 1024)))


def run_child(side: str, shape: tuple[int, ...], steps: int) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", side, *map(str, shape), "--steps", str(steps)]
    return run_json_child(cmd, side)


def floor_seconds(shape: tuple[int, ...]) -> float | None:
    """Three GEMMs of 2·N·H·V at the fp32 peak of benchmarks/results/floor.json (None without it)."""
    path = os.path.join(HERE, "results", "floor.json")
    if not os.path.exists(path):
        return None
    n, c, h, v = shape
    return 3 * 2 * n * c * h * v / json.load(open(path))["peaks"]["cpu_fp32"]["flop_per_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", nargs=5, metavar=("SIDE", "N", "C", "H", "V"))
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--results", default=None)
    add_idle_args(parser)
    args = parser.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    if args.worker:
        side, *dims = args.worker
        return worker(side, *map(int, dims), args.steps)
    set_idle(args)
    shape = (8, 16, 64, 2048) if args.quick else (128, 32, 256, 32000)
    runs = {side: [] for side in SIDES}
    for _ in range(args.rounds):
        for side in SIDES:  # alternated: a busy spell hits both sides alike
            runs[side].append(run_child(side, shape, args.steps))
            print(f"  {side:9s} {statistics.median(runs[side][-1]['times']):.3f} s", file=sys.stderr, flush=True)
    floor = floor_seconds(shape)
    rows = {}
    for side in SIDES:
        times = [t for r in runs[side] for t in r["times"]]
        rows[side] = dict(seconds=statistics.median(times), times=times,
                          extra_mb=max(r["extra_mb"] for r in runs[side]),
                          others_cores=[r["others_cores"] for r in runs[side]],
                          floor_ratio=None if floor is None else statistics.median(times) / floor)
    result = dict(date=time.strftime("%Y-%m-%dT%H:%M:%S"), machine=cpu_info(), threads=torch.get_num_threads(),
                  shape=dict(zip(("rows", "completion", "hidden", "vocab"), shape)), floor_s=floor, sides=rows,
                  speedup=rows["recompute"]["seconds"] / rows["forward"]["seconds"])
    print(json.dumps({s: (round(r["seconds"], 3), round(r["extra_mb"])) for s, r in rows.items()}), file=sys.stderr)
    write_json(args.results or (None if args.quick else os.path.join(HERE, "results", "head_gradient.json")), result)


if __name__ == "__main__":
    main()
