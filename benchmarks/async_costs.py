"""Per-token costs on this machine, for the step-time model of `benchmarks/async_model.py`.

Writes ``benchmarks/results/async_costs.json`` (the model's ``Costs`` fields, plus the raw
measurements they were fitted from):

1. **Generation** — one ``vllm serve`` of the demo's warm start (`VLLMServer`, CPU). A grid of
   rollouts sent through `ServerPool` as the engine sends them (one request per row, at most
   ``max_inflight`` in flight), every completion forced to exactly C tokens (``ignore_eos``):
   rows r ∈ {16, 64, 128}, prompt length P ∈ {7, 28}, C ∈ {4, 16}. Each point's wall time is
   fitted (non-negative least squares) to the model's per-server cost
   ``fixed + r·row + r·P·prefill_token + waves·C·decode_step + r·C·decode_token`` with
   ``waves = ceil(r / concurrency)``. The CPU the server's process group and this process
   burn while generating gives ``gen_cores`` (cores a generating server keeps busy); the
   server's CPU over a few idle seconds gives ``idle_server_cores``.
2. **Weight sync** — ``write_snapshot`` alone (the transport's fixed cost: written once) and
   `RemoteVLLMEngine.load_weights` to the one server (the rest is the per-server reload).
3. **Training side** — two short fits of the demo with the built-in HF engine (no server), 8
   and 32 prompts × 8 completions, each in its own process (`async_fit.py`); the ``timing/*``
   seconds of each step are fitted against the step's tokens (update, reference log-probs),
   completions (rewards) and a constant (the rest of the step), and the CPU the process burns
   outside the rollout gives ``train_cores``.

    python benchmarks/async_costs.py            # ~2-3 min on 2 idle cores
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
WARM = os.path.join(ROOT, "examples", "arithmetic", "warm_start")
OUT = os.path.join(HERE, "results", "async_costs.json")
GRID = [(r, p, c) for r in (16, 64, 128) for p in (7, 28) for c in (4, 16)]
GEN_TERMS = ("gen_fixed_s", "gen_row_s", "prefill_token_s", "decode_step_s", "decode_token_s")


def group_cpu_s(pgid: int) -> float:
    """CPU seconds (user + system) of the live processes in process group ``pgid``."""
    total = 0.0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                rest = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(rest[2]) == pgid:  # fields after ``comm``: state, ppid, pgrp, ..., utime (12th), stime (13th)
            total += (int(rest[11]) + int(rest[12])) / os.sysconf("SC_CLK_TCK")
    return total


def zero_reward(completions, **_) -> list[float]:
    return [0.0] * len(completions)


def gen_design(rows: int, prompt: int, completion: int, concurrency: int) -> list[float]:
    """The generation model's terms for one server (see `async_model.server_seconds`)."""
    waves = math.ceil(rows / concurrency)
    return [1.0, rows, rows * prompt, waves * completion, rows * completion]


def measure_generation(pool, pgid: int, repeats: int, concurrency: int) -> list[dict]:
    rng = random.Random(0)
    points = []
    for _ in range(repeats):
        for rows, prompt, completion in GRID:
            bodies = [dict(prompt=[1] + [rng.randrange(3, 15) for _ in range(prompt - 1)], max_tokens=completion,
                           min_tokens=completion, ignore_eos=True, temperature=1.0, seed=i, logprobs=0,
                           return_token_ids=True) for i in range(rows)]
            cpu0, own0, t0 = group_cpu_s(pgid), time.process_time(), time.perf_counter()
            results = pool.complete(bodies)
            wall = time.perf_counter() - t0
            cpu = group_cpu_s(pgid) - cpu0 + time.process_time() - own0
            assert all(len(ids) == completion for ids, _ in results), "ignore_eos did not force the length"
            points.append(dict(rows=rows, prompt=prompt, completion=completion, wall_s=wall, cores=cpu / wall))
    return points


def fit_generation(points: list[dict], concurrency: int) -> dict:
    import numpy as np
    from scipy.optimize import nnls

    grid = sorted({(p["rows"], p["prompt"], p["completion"]) for p in points})
    walls = np.array([statistics.median(p["wall_s"] for p in points if (p["rows"], p["prompt"], p["completion"]) == g)
                      for g in grid])  # the median of the repeats: one disturbed pass does not bend the fit
    design = np.array([gen_design(*g, concurrency) for g in grid])
    coef, _ = nnls(design, walls)
    fitted = design @ coef
    return {**dict(zip(GEN_TERMS, map(float, coef))),
            "gen_fit_rel_err_median": float(np.median(np.abs(fitted - walls) / walls)),
            "gen_cores": float(sum(p["cores"] * p["wall_s"] for p in points) / sum(p["wall_s"] for p in points))}


def measure_server(repeats: int, concurrency: int) -> dict:
    """Generation grid, idle CPU and weight-sync seconds on one local server."""
    import torch
    from lightning_rlpt import RLModule
    from lightning_rlpt.model.weights import policy_weights
    from lightning_rlpt.rollout.servers.pool import ServerPool
    from lightning_rlpt.rollout.vllm.remote_engine import RemoteVLLMEngine
    from lightning_rlpt.rollout.vllm.server import VLLMServer
    from lightning_rlpt.rollout.vllm.transport import write_snapshot

    server = VLLMServer.launch(WARM, log_dir=tempfile.mkdtemp(prefix="async-costs-"), max_model_len=64,
                               kv_cache_memory_bytes=64 << 20)
    try:
        engine = RemoteVLLMEngine([server.url], eos_token_id=2)
        pool = ServerPool([server.url], model=engine.pool.model, max_inflight=concurrency)
        pool.complete([dict(prompt=[1, 4, 5], max_tokens=4, logprobs=0, return_token_ids=True)] * 8)  # warm-up
        points = measure_generation(pool, server.pid, repeats, concurrency)
        cpu0, t0 = group_cpu_s(server.pid), time.perf_counter()
        time.sleep(4.0)
        idle = (group_cpu_s(server.pid) - cpu0) / (time.perf_counter() - t0)
        module = RLModule(WARM, reward_funcs=[zero_reward], group_size=2)
        writes, loads = [], []
        for version in range(repeats + 1):
            t0 = time.perf_counter()
            sync_bytes = write_snapshot(tempfile.mkdtemp(), policy_weights(module.policy), tie_word_embeddings=False)
            writes.append(time.perf_counter() - t0)
            engine.load_weights(policy_weights(module.policy), version)
            loads.append(engine.last_sync["seconds"])
        engine.close()
        del torch
    finally:
        server.stop()
    write_s, load_s = statistics.median(writes[1:]), statistics.median(loads[1:])  # the first reload is slower
    return dict(points=points, idle_server_cores=idle, sync_bytes=sync_bytes, sync_fixed_s=write_s,
                sync_per_server_s=max(0.0, load_s - write_s), sync_load_s=loads, sync_write_s=writes,
                **fit_generation(points, concurrency))


def measure_training(prompts: list[int], steps: int) -> dict:
    """Two HF-engine fits (own processes); per-step stage seconds fitted against the step's size."""
    import numpy as np

    rows = []
    for n in prompts:
        out = tempfile.mktemp(suffix=".json")
        cmd = [sys.executable, os.path.join(HERE, "async_fit.py"), "--engine", "hf", "--prompts", str(n),
               "--steps", str(steps), "--out", out]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            raise RuntimeError(f"training fit failed:\n{proc.stderr[-3000:]}")
        with open(out) as f:
            rows += json.load(f)["steps"][2:]  # the first steps pay warm-up
    tokens = np.array([r["tokens"] for r in rows], dtype=float)
    completions = np.array([r["rows"] for r in rows], dtype=float)
    ones = np.ones_like(tokens)

    def slope(key: str, size: np.ndarray) -> tuple[float, float]:
        from scipy.optimize import nnls
        coef, _ = nnls(np.stack([ones, size], 1), np.array([r["timing"].get(key, 0.0) for r in rows]))
        return float(coef[0]), float(coef[1])

    upd0, upd = slope("timing/update", tokens)
    ref0, ref = slope("timing/ref_logprobs", tokens)
    rew0, rew = slope("timing/rewards", completions)
    rest = [r["seconds"] - sum(r["timing"].values()) for r in rows]
    return dict(train_fixed_s=upd0 + ref0 + rew0 + statistics.median(rest), train_token_s=upd,
                logprob_token_s=ref, reward_s=rew, train_cores=statistics.median(r["train_cores"] for r in rows),
                train_steps=rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=2, help="passes over the generation grid")
    parser.add_argument("--concurrency", type=int, default=64, help="requests in flight (the engine's max_inflight)")
    parser.add_argument("--out", default=OUT)
    args = parser.parse_args()
    start = time.perf_counter()
    server = measure_server(args.repeats, args.concurrency)
    training = measure_training([8, 32], steps=6)
    costs = dict(concurrency=args.concurrency, shared_cores=os.cpu_count(), **{k: v for k, v in server.items()},
                 **training, measured=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                 seconds=time.perf_counter() - start)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(costs, f, indent=1)
    print(json.dumps({k: v for k, v in costs.items() if not isinstance(v, list)}, indent=1))


if __name__ == "__main__":
    main()
