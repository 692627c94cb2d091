"""Bytes and seconds of one weight sync to `vllm serve` processes (CPU): full weights, LoRA
merged (`SnapshotTransport`) and the LoRA adapter alone (`AdapterTransport`).

Starts ``--servers`` local servers from the demo's warm start with LoRA serving enabled
(``--enable-lora --max-lora-rank 16``), then for the full policy, and for LoRA r = 4 and 16
sent merged and as an adapter, syncs ``--repeats`` times (the first sync after start-up
excluded: a server's first reload is slower) and prints bytes per sync and the median seconds.

    python benchmarks/vllm_server_sync.py --servers 1 --repeats 3
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--servers", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    import tiny_task as task
    from lightning_rlpt import RLModule
    from lightning_rlpt.model.weights import policy_weights
    from lightning_rlpt.rollout.vllm.lora_transport import RUNTIME_ENV, AdapterTransport
    from lightning_rlpt.rollout.vllm.remote_engine import RemoteVLLMEngine
    from lightning_rlpt.rollout.vllm.server import VLLMServer

    ckpt = os.path.join(ROOT, "examples", "arithmetic", "warm_start")
    servers = VLLMServer.launch_many(ckpt, args.servers, log_dir=tempfile.mkdtemp(), max_model_len=64,
                                     kv_cache_memory_bytes=64 << 20, env=RUNTIME_ENV,
                                     extra_args=["--enable-lora", "--max-lora-rank", "16", "--max-loras", "1"])
    urls = [s.url for s in servers]
    try:
        warm = RemoteVLLMEngine(urls, eos_token_id=task.EOS_ID)  # a server's first reload is slower: excluded
        warm.load_weights(policy_weights(RLModule(ckpt, reward_funcs=[task.exact_answer]).policy), 0)
        warm.close()
        print(f"sync to {args.servers} server(s), median of {args.repeats}:")
        for label, lora, adapter in (("full", None, False), ("lora r=4 merged", 4, False),
                                     ("lora r=4 adapter", 4, True), ("lora r=16 merged", 16, False),
                                     ("lora r=16 adapter", 16, True)):
            module = RLModule(ckpt, reward_funcs=[task.exact_answer], group_size=4,
                              lora=dict(r=lora, lora_alpha=2 * lora) if lora else None)
            transport = AdapterTransport(None, module.policy) if adapter else None
            engine = RemoteVLLMEngine(urls, eos_token_id=task.EOS_ID, transport=transport)
            seconds = []
            for step in range(args.repeats):
                engine.load_weights(policy_weights(module.policy), step)
                seconds.append(engine.last_sync["seconds"])
            print(f"  {label:18s} {engine.last_sync['bytes']:>10,} bytes/sync  {statistics.median(seconds):.3f} s "
                  f"(min {min(seconds):.3f}, max {max(seconds):.3f})")
            engine.close()
    finally:
        for server in servers:
            server.stop()


if __name__ == "__main__":
    main()
