"""What the checkpoint checksums cost (`lightning_rlpt.checkpoint`) at Qwen2.5-0.5B's shape.

A random fp32 state dict with the tensor names and shapes of ``Qwen2ForCausalLM`` at Qwen2.5-0.5B's
config (24 layers × 896, vocabulary 151,936, tied embeddings: about 494M parameters, 1.98 GB) is
timed three ways, each the median of ``--repeats`` runs:

- ``checksum_s``: `tensor_checksums` (a CRC32 per tensor; the same work verifies at load);
- ``save_s``: ``torch.save`` of the same state dict to a file (what the checksum rides on; a
  Lightning checkpoint also holds the optimizer state, AdamW's two moments: about 3× this);
- ``load_s``: ``torch.load`` of that file.

Writes ``benchmarks/results/checkpoint_checksum.json``.

    python benchmarks/checkpoint_checksum.py [--repeats 5] [--dir /tmp]   # ~1-2 min on 2 cores
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from lightning_rlpt.checkpoint import tensor_checksums
from quiet import median_seconds  # benchmarks/quiet.py

HERE = os.path.dirname(os.path.abspath(__file__))
QWEN25_05B = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                  num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True)


def random_state_dict() -> dict[str, torch.Tensor]:
    """The real model's names and shapes (built on the meta device), filled with random fp32;
    tied tensors (``lm_head.weight`` is ``embed_tokens.weight``) stay one tensor, as in training."""
    with torch.device("meta"):
        model = Qwen2ForCausalLM(Qwen2Config(**QWEN25_05B))
    filled: dict[int, torch.Tensor] = {}
    return {name: filled.setdefault(id(t), torch.randn(t.shape)) for name, t in model.state_dict(keep_vars=True).items()}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--dir", default=tempfile.gettempdir(), help="where the saved file goes")
    p.add_argument("--out", default=os.path.join(HERE, "results", "checkpoint_checksum.json"))
    args = p.parse_args()
    state = random_state_dict()
    path = os.path.join(args.dir, "checkpoint_checksum_bench.pt")
    try:
        checksum = median_seconds(lambda: tensor_checksums(state), args.repeats)
        save = median_seconds(lambda: torch.save(state, path), args.repeats)
        load = median_seconds(lambda: torch.load(path, weights_only=True), args.repeats)
    finally:
        if os.path.exists(path):
            os.remove(path)
    numel = sum(t.numel() for t in {id(t): t for t in state.values()}.values())
    result = {"shape": "Qwen2.5-0.5B", "config": QWEN25_05B, "parameters": numel, "tensors": len(state),
              "bytes": numel * 4, "repeats": args.repeats, "checksum_s": round(checksum, 3),
              "save_s": round(save, 3), "load_s": round(load, 3),
              "checksum_gb_per_s": round(numel * 4 / checksum / 1e9, 2),
              "checksum_over_save": round(checksum / save, 3), "checksum_over_load": round(checksum / load, 3),
              "load_average_1min": round(os.getloadavg()[0], 2),  # other processes on the machine
              "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
                         f"torch {torch.__version__}, threads {torch.get_num_threads()}"}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
