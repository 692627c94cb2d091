"""The HF engine's ``seed_per_prompt=True`` rollout, before and after per-row sampling.

Before (``--before``, a commit of this repository), the HF engine drew from one torch stream per
``generate`` call, so ``seed_per_prompt`` had to generate group by group (one call per prompt);
after (this working tree), every row samples with its own seed (`rollout.sampling.per_row`) and the
whole rollout is one call. Same settings both ways: a randomly initialised Llama (4 layers × 256
wide, head_dim 64, a 32,000-token vocabulary), 8 prompts of 32 random tokens × G = 8 completions
× 32 new tokens (EOS never sampled, so both do the same work), temperature 1, fp32, seeds from
``collect.row_seeds(..., seed_per_prompt=True)`` of each tree. Each run is its own process
(``PYTHONPATH`` pointing at that tree's ``lightning_rlpt``), the two alternate, medians of
``--reps`` (and each rep's before/after ratio, the two having run back to back, which is the
steadier figure on a shared machine); the time is one ``engine.generate`` call after a warm-up.

    python benchmarks/seed_per_prompt_rollout.py --before 13e697e --reps 3   # ~5 minutes on 2 CPU cores
    python benchmarks/seed_per_prompt_rollout.py --default-seeds --reps 5    # the default path's cost

``--default-seeds`` measures the default rollout (``seed_per_prompt=False``) instead: before, one
call sampling from one torch stream (``softmax`` + ``multinomial``); after, one call through the
per-row sampler. Both are one call, so the difference is the sampler's own cost.

``--before`` may name any commit: ``--default-seeds --before 81e7602 --out
benchmarks/results/inverse_cdf_rollout.json`` times the per-row Gumbel-max sampler against the
inverse-CDF one that replaced it (docs/results.md renders both JSONs).

Writes ``benchmarks/results/seed_per_prompt_rollout.json`` and prints a markdown table.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_BEFORE = "13e697e"  # the last commit before per-row sampling
ROOT = os.path.dirname(HERE)


def worker(prompts: int, group: int, new_tokens: int, per_prompt: bool = True) -> float:
    """Seconds of one rollout (``seed_per_prompt`` or not) with the ``lightning_rlpt`` on ``sys.path``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from lightning_rlpt.rollout import HFGenerateEngine, collect
    from lightning_rlpt.rollout.sampling import SamplingConfig

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=32_000, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=4, head_dim=64, max_position_embeddings=128,
                         bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model = LlamaForCausalLM(config).eval()
    model.generation_config.min_new_tokens = new_tokens  # EOS never sampled: full-length completions both ways
    engine = HFGenerateEngine(model, eos_token_id=2, pad_token_id=0)
    gen = torch.Generator().manual_seed(1)
    rows = [torch.randint(3, 32_000, (32,), generator=gen).tolist() for _ in range(prompts)]
    batch = {"prompt": [str(i) for i in range(prompts)], "index": list(range(prompts))}
    rep = [row for row in rows for _ in range(group)]
    sampling = SamplingConfig(max_new_tokens=new_tokens, temperature=1.0)
    seeds = collect.row_seeds(batch, group, 0, per_prompt)
    engine.generate(rep[:group], SamplingConfig(max_new_tokens=2), seeds[:group] if isinstance(seeds, list) else seeds)  # warm-up
    start = time.perf_counter()
    out = engine.generate(rep, sampling, seeds)
    seconds = time.perf_counter() - start
    assert all(len(c) == new_tokens for c in out.completion_ids)
    return seconds


def extract(commit: str, into: str) -> str:
    """``lightning_rlpt`` (and the package-mapped folders) of ``commit``, unpacked under ``into``."""
    archive = os.path.join(into, "tree.tar")
    with open(archive, "wb") as f:
        subprocess.run(["git", "-C", ROOT, "archive", commit, "lightning_rlpt", "callbacks", "kernels"], stdout=f,
                       check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    return into


def run(tree: str, args: argparse.Namespace) -> float:
    env = {**os.environ, "PYTHONPATH": tree}
    cmd = [sys.executable, __file__, "--worker", "--prompts", str(args.prompts), "--group", str(args.group),
           "--new-tokens", str(args.new_tokens)] + (["--default-seeds"] if args.default_seeds else [])
    out = subprocess.run(cmd, env=env, cwd=tree, check=True, capture_output=True, text=True).stdout
    return float(out.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", default=DEFAULT_BEFORE, help="the commit to compare with (default: the one before per-row sampling)")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--out", default=os.path.join(HERE, "results", "seed_per_prompt_rollout.json"))
    p.add_argument("--default-seeds", action="store_true", help="seed_per_prompt=False: the sampler's own cost")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.default_seeds and args.out == p.get_default("out"):
        args.out = os.path.join(HERE, "results", "hf_default_rollout.json")
    if args.worker:
        print(worker(args.prompts, args.group, args.new_tokens, per_prompt=not args.default_seeds))
        return
    times: dict[str, list[float]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory() as old:
        trees = {"before": extract(args.before, old), "after": ROOT}
        for _ in range(args.reps):  # alternate, so a slow spell of the machine hits both
            for name, tree in trees.items():
                times[name].append(run(tree, args))
    medians = {k: statistics.median(v) for k, v in times.items()}
    paired = [b / a for b, a in zip(times["before"], times["after"])]  # each rep's two runs ran back to back
    result = dict(before_commit=args.before, seed_per_prompt=not args.default_seeds, prompts=args.prompts, group=args.group, new_tokens=args.new_tokens,
                  seconds=times, median_s=medians, speedup=medians["before"] / medians["after"],
                  paired_speedups=paired, load_average_after=os.getloadavg(),
                  machine=f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
                  command=" ".join(["python", "benchmarks/seed_per_prompt_rollout.py", *sys.argv[1:]]),
                  measured=time.strftime("%Y-%m-%d", time.gmtime()))
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    calls, how = (1, "one torch stream") if args.default_seeds else (args.prompts, "group by group")
    if args.before != DEFAULT_BEFORE:  # another comparison: only the commit names the before side
        calls, how = 1, "one call"
    print(f"| HF engine, seed_per_prompt={not args.default_seeds} | generate calls | median s | runs |\n|---|---:|---:|---:|")
    print(f"| before ({args.before}): {how} | {calls} | {medians['before']:.2f} | {args.reps} |")
    print(f"| after: per-row seeds, one call | 1 | {medians['after']:.2f} | {args.reps} |")
    print(f"speed-up {result['speedup']:.2f}x (paired: {', '.join(f'{r:.2f}' for r in paired)})")


if __name__ == "__main__":
    main()
