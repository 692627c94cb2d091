"""Peak memory of one log-prob forward+backward under FSDP2 (two gloo processes on this CPU):
the fused LM head vs full logits.

Model: Qwen2.5-0.5B's width (896), attention heads (14 query / 2 key-value, head_dim 64), MLP
size (4,864) and 151,936-token vocabulary with tied embeddings, ``--layers`` decoder layers
(default 2; Qwen2.5-0.5B has 24), random init, fp32, sharded by `shard_with_fsdp2` over two
processes. Each rank scores its own ``--rows`` rows of ``--prompt-len`` + ``--completion-len``
random tokens with `completion_logprobs` (temperature 1, entropy asked for and detached, as the
loss forward does) and backpropagates a weighted sum of the log-probs.

Arms: ``fused`` (``use_fused_kernel=True``: the fused op on the gathered head weight, inside the
root unit's forward hooks) and ``plain`` (``use_fused_kernel=False``: ``[rows, completion,
151,936]`` float32 logits, their log-softmax and its gradient).

Method. Each run is a fresh process pair (one run = one arm); arms alternate, their order flipping
every round, ``--repeats`` rounds; figures are medians over rounds. In each rank: a cheap warm-up
forward+backward (1 row, 4 + 4 tokens: FSDP2's lazy initialisation, gloo's buffers, the libraries'
first calls), gradients dropped, then `quiet.reset_peak_rss` (garbage collection, ``malloc_trim``,
peak := current RSS), the measured forward+backward, and ``VmHWM`` read. **Step memory** = that
peak minus the RSS just before the step: everything the step allocated that was resident at its
high-water mark (activations, the gathered parameters and their gradients, reduce-scatter
buffers, logits or the kernel's tiles). Both ranks are reported; the saving is plain − fused.

What the figure does not show is in `NOT_SHOWN` (written into the JSON).

    python benchmarks/fsdp2_fused_head.py --repeats 3   # 16 min on 2 busy cores (load ~10)
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # the repository's lightning_rlpt, before any installed copy

import torch  # noqa: E402

from quiet import read_status_kb, reset_peak_rss  # noqa: E402

VOCAB, WIDTH = 151_936, 896
ARMS = ("plain", "fused")
NOT_SHOWN = [
    "GPU memory: CUDA's caching allocator differs (benchmarks/gpu_check.py compares "
    "torch.cuda.max_memory_allocated on one GPU); RSS counts pages touched, not bytes allocated",
    "not all of the saving is logits: with tied embeddings the plain path also holds one more "
    "[V, H] fp32 buffer (~520 MB) when autograd sums the head's and the embedding's gradients; it "
    "shows at any token count (8 tokens per rank, 1 layer, one run: plain 2,222 MB, fused 1,698 MB)",
    "a whole GRPO step: optimizer state, old/reference log-probs, KL, generation",
    "more layers: the activations grow with depth, the head's saving does not",
    "time: wall_s is recorded, but the machine is shared and the CPU kernel is the chunked "
    "PyTorch one, not the CUDA paths",
]


def build(layers: int) -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=WIDTH, intermediate_size=4864, num_hidden_layers=layers,
                         num_attention_heads=14, num_key_value_heads=2, head_dim=64, max_position_embeddings=4096,
                         tie_word_embeddings=True, attn_implementation="sdpa")
    return Qwen2ForCausalLM(config)


def step(model, rows: int, prompt: int, completion: int, fused: bool, seed: int) -> None:
    from lightning_rlpt.model.logprobs import completion_logprobs

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (rows, prompt + completion), generator=g)
    logp, _ = completion_logprobs(model, ids, torch.ones_like(ids), completion, with_entropy=True,
                                  use_fused_kernel=fused)
    (logp * torch.randn(logp.shape, generator=g)).sum().backward()


def rank_main(rank: int, port: int, args, queue) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from lightning_rlpt.model.distributed import shard_with_fsdp2

    torch.set_num_threads(1)  # two ranks on two cores
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    model = build(args.layers)
    shard_with_fsdp2(model, init_device_mesh("cpu", (2,)))
    fused = args.arm == "fused"
    step(model, 1, 4, 4, fused, seed=rank)  # warm-up
    model.zero_grad(set_to_none=True)
    dist.barrier()
    gc.collect()
    reset_peak_rss()
    before = read_status_kb("VmRSS") / 1024
    start = time.perf_counter()
    step(model, args.rows, args.prompt_len, args.completion_len, fused, seed=10 + rank)
    wall = time.perf_counter() - start
    peak = read_status_kb("VmHWM") / 1024
    queue.put(dict(rank=rank, rss_before_mb=before, peak_mb=peak, step_mb=peak - before, wall_s=wall))
    dist.barrier()
    del model  # it holds the process group: freed at exit, gloo can abort (tests/scripts/fsdp2_fused_head.py)
    gc.collect()
    dist.destroy_process_group()


def worker(args) -> None:
    """One run: spawn the two ranks, print their figures as one JSON line."""
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    mp.start_processes(rank_main, args=(port, args, queue), nprocs=2, start_method="spawn")
    figures = sorted((queue.get() for _ in range(2)), key=lambda r: r["rank"])
    print("RESULT " + json.dumps(figures))


def run_arm(arm: str, args) -> list[dict]:
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--arm", arm, "--layers", str(args.layers),
           "--rows", str(args.rows), "--prompt-len", str(args.prompt_len), "--completion-len", str(args.completion_len)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"{arm} run failed:\n{proc.stderr[-3000:]}")
    line = next(l for l in proc.stdout.splitlines() if l.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def summarise(runs: dict[str, list[list[dict]]]) -> dict:
    out = {}
    for arm, rounds in runs.items():
        out[arm] = {f"rank{r}_{key}": statistics.median(run[r][key] for run in rounds)
                    for r in (0, 1) for key in ("step_mb", "peak_mb", "wall_s")}
    out["saving_mb"] = {f"rank{r}": out["plain"][f"rank{r}_step_mb"] - out["fused"][f"rank{r}_step_mb"] for r in (0, 1)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--rows", type=int, default=8, help="rows per rank")
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--completion-len", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=os.path.join(HERE, "results", "fsdp2_fused_head.json"))
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--arm", choices=ARMS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    runs: dict[str, list[list[dict]]] = {arm: [] for arm in ARMS}
    for i in range(args.repeats):
        for arm in (ARMS if i % 2 == 0 else ARMS[::-1]):
            runs[arm].append(run_arm(arm, args))
            r0, r1 = runs[arm][-1]
            print(f"round {i} {arm:5s} step memory rank0 {r0['step_mb']:7,.0f} MB  rank1 {r1['step_mb']:7,.0f} MB  "
                  f"({r0['wall_s']:.1f} s)", flush=True)
    logits_mb = args.rows * args.completion_len * VOCAB * 4 / 2**20
    result = dict(
        what="peak RSS of one completion_logprobs forward+backward per rank, FSDP2 over 2 gloo processes on CPU",
        model=dict(shape="Qwen2.5-0.5B head and width (H 896, V 151,936, tied), 14/2 heads, MLP 4864",
                   layers=args.layers, dtype="float32"),
        tokens_per_rank=dict(rows=args.rows, prompt=args.prompt_len, completion=args.completion_len),
        one_fp32_logits_buffer_mb=logits_mb, not_shown=NOT_SHOWN, repeats=args.repeats, median=summarise(runs), runs=runs,
        host=dict(cpus=os.cpu_count(), python=platform.python_version(), torch=torch.__version__),
        date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    m = result["median"]
    print(f"median step memory, rank 0: plain {m['plain']['rank0_step_mb']:,.0f} MB, fused {m['fused']['rank0_step_mb']:,.0f} MB"
          f" (one [N, C, V] fp32 buffer: {logits_mb:,.0f} MB); wrote {args.out}")


if __name__ == "__main__":
    main()
