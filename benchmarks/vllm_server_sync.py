"""Bytes and seconds of one weight sync to `vllm serve` processes (`SnapshotTransport`, CPU).

Starts ``--servers`` local servers from the demo's warm start, sends the policy's full
(LoRA: merged) weights ``--repeats`` times and prints bytes per sync and the median seconds.

    python benchmarks/vllm_server_sync.py --servers 1 --repeats 5
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
    from lightning_rlpt.rollout.vllm.remote_engine import RemoteVLLMEngine
    from lightning_rlpt.rollout.vllm.server import VLLMServer

    ckpt = os.path.join(ROOT, "examples", "arithmetic", "warm_start")
    servers = VLLMServer.launch_many(ckpt, args.servers, log_dir=tempfile.mkdtemp(), max_model_len=64,
                                     kv_cache_memory_bytes=64 << 20)
    try:
        engine = RemoteVLLMEngine([s.url for s in servers], eos_token_id=task.EOS_ID)
        for lora in (None, dict(r=4, lora_alpha=8)):
            module = RLModule(ckpt, reward_funcs=[task.exact_answer], group_size=4, lora=lora)
            seconds = []
            for step in range(args.repeats):
                engine.load_weights(policy_weights(module.policy), step)
                seconds.append(engine.last_sync["seconds"])
            adapter = sum(p.numel() * p.element_size() for n, p in module.policy.named_parameters() if "lora_" in n)
            print(f"{'lora r=4' if lora else 'full'}: {engine.last_sync['bytes']} bytes/sync to {args.servers} "
                  f"server(s), median {statistics.median(seconds):.3f} s; adapter bytes {adapter}")
        engine.close()
    finally:
        for server in servers:
            server.stop()


if __name__ == "__main__":
    main()
