"""Where a rollout's time goes, per engine, at the reference step's shape ([floor] item 3).

The shape is `benchmarks/floor.py`'s reference step: vs_trl's 4 × 256 Llama with a 32,000
vocabulary (random init, so EOS is ~never sampled and every completion runs to 32 tokens), 16
prompts × 8 completions, one seed per row as `RLModule` sends, fp32, temperature 1. Both engines
as the module runs them: the HF engine (`HFGenerateEngine`, no behaviour log-probs, the module's
default) and `VLLMEngine` (in-process, ``processed_logprobs``, a 256 MiB KV cache).

Each engine runs in its own child process; children alternate between the engines,
``--rounds`` each. A child warms up with one call, times ``--calls`` calls (the figure is the
median of all of an engine's calls), then profiles one more under cProfile and splits it by the
cumulative time of the functions that own each part (`PARTS`); "other" is the call's total
minus the named parts. The profiled call is slower than an unprofiled one (cProfile's own cost
falls on Python-heavy parts), so the split is given as shares of the profiled call.

What the figures do not show: a GPU, bf16, other batch shapes (the sampler's share grows with
the vocabulary and rows, the model's with layers), vLLM served over HTTP.

Usage::

    python benchmarks/rollout_profile.py            # writes benchmarks/results/rollout_profile.json
    python benchmarks/rollout_profile.py --quick    # the demo's small model, writes nothing
"""
from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "examples", "arithmetic"))
from quiet import add_idle_args, cpu_info, run_json_child, set_idle, write_json  # noqa: E402

ENGINES = ("hf", "vllm")
# part -> (file suffix, function name) whose cumulative time is that part; the first match
# with the largest cumulative time is taken, so nested calls of the same function count once.
PARTS = {
    "hf": {"model forward": ("modeling_llama.py", "forward"),
           "sampler (RowSampler: inverse CDF over the processed softmax)": ("per_row.py", "__call__"),
           "generate() loop": ("generation/utils.py", "_sample"),
           "engine call (ours, around generate)": ("rollout/hf.py", "generate")},
    "vllm": {"model forward": ("model_executor/models/llama.py", "forward"),
             "logits (LM head)": ("model_executor/models/llama.py", "compute_logits"),
             "sampler (vLLM's, processed log-probs)": ("v1/sample/sampler.py", "forward"),
             "scheduler": ("v1/core/sched/scheduler.py", "schedule"),
             "output processing (detokenizer, log-probs)": ("v1/engine/output_processor.py", "process_outputs"),
             "LLM.generate": ("entrypoints/llm.py", "generate"),
             "engine call (ours, around LLM.generate)": ("rollout/vllm/engine.py", "generate")},
}
# Parts that contain others: shown as their own time less what they contain.
NESTED = {"hf": {"generate() loop": ["model forward", "sampler (RowSampler: inverse CDF over the processed softmax)"],
                 "engine call (ours, around generate)": ["generate() loop"]},
          "vllm": {"LLM.generate": ["model forward", "logits (LM head)", "sampler (vLLM's, processed log-probs)",
                                    "scheduler", "output processing (detokenizer, log-probs)"],
                   "engine call (ours, around LLM.generate)": ["LLM.generate"]}}


def build(engine: str, size: str):
    """The engine, its prompts (one per row) and the sampling settings of the reference step."""
    import torch
    import vs_trl
    from lightning_rlpt import SamplingConfig

    import task
    tmp = tempfile.mkdtemp(prefix="rlpt-profile-")
    path = vs_trl.model_dir("throughput", size, tmp)
    tokenizer = vs_trl.padded_tokenizer(vs_trl.SIZES[size]["vocab"])
    prompts = [tokenizer(r["prompt"])["input_ids"] for r in vs_trl.train_rows()[:vs_trl.PROMPTS]
               for _ in range(vs_trl.GROUP)]
    sampling = SamplingConfig(max_new_tokens=vs_trl.MAX_NEW, temperature=1.0, max_prompt_length=8)
    if engine == "hf":
        from transformers import AutoModelForCausalLM

        from lightning_rlpt.rollout import HFGenerateEngine
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        return HFGenerateEngine(model, task.EOS_ID, task.PAD_ID), prompts, sampling
    from lightning_rlpt.rollout.vllm.engine import VLLMEngine
    return VLLMEngine(path, eos_token_id=task.EOS_ID, max_model_len=64, dtype="float32",
                      kv_cache_memory_bytes=256 << 20), prompts, sampling


def split(stats: pstats.Stats, engine: str) -> dict[str, float]:
    """Each part's seconds in the profiled call (`PARTS`, less what `NESTED` says it contains)."""
    found = {}
    for part, (suffix, name) in PARTS[engine].items():
        matches = [ct for (file, _, func), (_, _, _, ct, _) in stats.stats.items()
                   if func == name and file.endswith(suffix)]
        found[part] = max(matches, default=0.0)
    own = dict(found)
    for outer, inner in NESTED[engine].items():
        own[outer] = max(0.0, found[outer] - sum(found[i] for i in inner))
    return own


def worker(engine: str, size: str, calls: int) -> None:
    import torch
    torch.manual_seed(0)
    eng, prompts, sampling = build(engine, size)
    seeds = list(range(len(prompts)))
    eng.generate(prompts, sampling, seeds)  # warm-up: thread pools, allocator, vLLM's compile
    times, tokens = [], 0
    for i in range(calls):
        start = time.perf_counter()
        out = eng.generate(prompts, sampling, [s + 1000 * (i + 1) for s in seeds])
        times.append(time.perf_counter() - start)
        tokens = sum(map(len, out.completion_ids))
    profile = cProfile.Profile()
    start = time.perf_counter()
    profile.runcall(eng.generate, prompts, sampling, seeds)
    profiled = time.perf_counter() - start
    parts = split(pstats.Stats(profile), engine)
    parts["other"] = max(0.0, profiled - sum(parts.values()))
    print(json.dumps(dict(times=times, tokens=tokens, profiled_s=profiled, parts=parts)))


def run_child(engine: str, size: str, calls: int) -> dict:
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", engine, "--size", size, "--calls", str(calls)]
    return run_json_child(cmd, engine, env)


def rollout_floor(size: str) -> float | None:
    """The rollout's FLOP floor at the fp32 peak of benchmarks/results/floor.json (None without it)."""
    import floor
    path = os.path.join(HERE, "results", "floor.json")
    if size != "vocab32k" or not os.path.exists(path):
        return None
    peak = json.load(open(path))["peaks"]["cpu_fp32"]["flop_per_s"]
    return floor.floor(floor.reference_step(), peak)["seconds"]["rollout"]


def summarise(runs: list[dict], floor_s: float | None) -> dict:
    times = [t for r in runs for t in r["times"]]
    profiled = [r for r in runs if "parts" in r]
    shares = {part: statistics.median(r["parts"][part] / r["profiled_s"] for r in profiled)
              for part in profiled[0]["parts"]}
    seconds = statistics.median(times)
    return dict(seconds=seconds, times=times, tokens=runs[0]["tokens"], shares=shares,
                floor_ratio=None if floor_s is None else seconds / floor_s,
                others_cores=[r["others_cores"] for r in runs], discarded=sum(len(r["discarded"]) for r in runs))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", choices=ENGINES)
    parser.add_argument("--size", default="vocab32k")
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--results", default=None)
    add_idle_args(parser)
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker, args.size, args.calls)
    set_idle(args)
    size = "small" if args.quick else args.size
    runs = {engine: [] for engine in ENGINES}
    for _ in range(1 if args.quick else args.rounds):
        for engine in ENGINES:  # alternated: a busy spell hits both engines alike
            runs[engine].append(run_child(engine, size, 1 if args.quick else args.calls))
            print(f"  {engine:5s} {statistics.median(runs[engine][-1]['times']):.3f} s", file=sys.stderr, flush=True)
    floor_s = rollout_floor(size)
    result = dict(date=time.strftime("%Y-%m-%dT%H:%M:%S"), machine=cpu_info(), size=size, rollout_floor_s=floor_s,
                  engines={engine: summarise(rs, floor_s) for engine, rs in runs.items()})
    print(json.dumps({e: round(r["seconds"], 3) for e, r in result["engines"].items()}), file=sys.stderr)
    write_json(args.results or (None if args.quick else os.path.join(HERE, "results", "rollout_profile.json")), result)


if __name__ == "__main__":
    main()
