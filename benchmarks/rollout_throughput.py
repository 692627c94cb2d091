"""Generated tokens per second: vLLM (`VLLMEngine`) vs ``transformers.generate`` (`HFGenerateEngine`).

Both engines sample the same rollout shape as a GRPO step (16 prompts × 8 completions × 32 new
tokens, fp32, temperature 1) from the same randomly initialised Llama (4 layers × 256 wide,
head_dim 64), once with the arithmetic demo's 15-symbol vocabulary and once padded to 32,000
entries, since the LM head dominates at realistic vocabularies (docs/results.md's profile of a
GRPO step shows it). Completions end at EOS or ``--new-tokens``: with 15 symbols a
random model stops early (EOS has p ≈ 1/15 per token), with 32,000 almost never; the rate
counts the tokens actually generated (``transformers.generate`` keeps stepping finished rows
until the longest one ends, which is part of what is measured).

    python benchmarks/rollout_throughput.py            # ~2-3 minutes on 2 CPU cores
    python benchmarks/rollout_throughput.py --reps 5 --vocabs 15
    python benchmarks/rollout_throughput.py --json benchmarks/results/rollout_throughput.json  # docs/results.md's

Prints a markdown table (`rollout_throughput_report.table`); ``--json`` also writes the figures.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples", "arithmetic"))

import torch  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

import task  # noqa: E402
from rollout_throughput_report import table  # noqa: E402
from lightning_rlpt.rollout import HFGenerateEngine  # noqa: E402
from lightning_rlpt.rollout.sampling import SamplingConfig  # noqa: E402


def build_model(vocab: int, path: str) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=vocab, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=4, head_dim=64, max_position_embeddings=128,
                         bos_token_id=task.BOS_ID, eos_token_id=task.EOS_ID, pad_token_id=task.PAD_ID)
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(path)
    task.build_tokenizer().save_pretrained(path)
    return model


def timed(engine, prompts: list[list[int]], sampling: SamplingConfig, reps: int) -> tuple[float, int]:
    """Seconds per rollout (median of ``reps`` after one warm-up) and tokens generated per rollout."""
    engine.generate(prompts, sampling, seed=0)
    times, tokens = [], 0
    for rep in range(reps):
        start = time.perf_counter()
        out = engine.generate(prompts, sampling, seed=rep + 1)
        times.append(time.perf_counter() - start)
        tokens = sum(len(c) for c in out.completion_ids)
    return sorted(times)[len(times) // 2], tokens


def measure(vocab: int, args: argparse.Namespace) -> list[tuple[str, float, int]]:
    from lightning_rlpt.rollout.vllm.engine import VLLMEngine

    path = tempfile.mkdtemp(prefix=f"rlpt-bench-{vocab}-")
    model = build_model(vocab, path)
    pairs = task.split_pairs()[0][: args.prompts]
    prompt_ids = task.build_tokenizer()([r["prompt"] for r in task.rows(pairs)])["input_ids"]
    prompts = [p for p in prompt_ids for _ in range(args.group_size)]
    sampling = SamplingConfig(max_new_tokens=args.new_tokens, temperature=1.0)
    hf = timed(HFGenerateEngine(model, task.EOS_ID, task.PAD_ID), prompts, sampling, args.reps)
    engine = VLLMEngine(path, eos_token_id=task.EOS_ID, max_model_len=64, dtype=torch.float32,
                        kv_cache_memory_bytes=256 << 20)
    try:
        vllm = timed(engine, prompts, sampling, args.reps)
    finally:
        engine.close()
    return [("transformers.generate", *hf), ("vLLM (VLLMEngine)", *vllm)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vocabs", type=int, nargs="+", default=[15, 32000])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--json", default=None, help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    rows = [dict(vocab=vocab, engine=name, seconds=seconds, tokens=tokens)
            for vocab in args.vocabs for name, seconds, tokens in measure(vocab, args)]
    data = dict(rows=rows, prompts=args.prompts, group_size=args.group_size, new_tokens=args.new_tokens,
                reps=args.reps, threads=torch.get_num_threads(), date=datetime.date.today().isoformat(),
                cpus=os.cpu_count(), torch=torch.__version__, load_after=os.getloadavg()[0])
    print("\n" + table(data))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(data, f, indent=1)


if __name__ == "__main__":
    main()
