"""Log-probs and gradients of a tiny model sharded with FSDP2 over two gloo processes, beside an
unsharded copy on the plain path. Run as its own script (it spawns the two ranks itself):

    python tests/scripts/fsdp2_fused_head.py --out DIR [--model llama|qwen2] [--padding-free]
           [--plain] [--lora]

Each rank scores its own rows: first under ``torch.no_grad()`` (as the old and reference
log-probs are), then with gradients of a weighted sum of log-probs. The reference is the same
weights unsharded, full logits (``use_fused_kernel=False``), on the same rows, its gradients
averaged over the ranks as FSDP2's reduce-scatter averages them. Rank 0 writes ``DIR/result.pt``:
per rank the log-probs of both arms, whether the fused op is in the sharded log-probs' graph, and
every trainable parameter's full gradient of both arms. ``--plain`` runs the sharded arm on full
logits too; ``--lora`` trains a peft LoRA (r = 4, random A and B) on the attention and the LM head,
the base frozen (the fused op then runs on ``W + s·B·A``).
"""
import argparse
import copy
import gc
import os
import socket

import torch
import torch.distributed as dist

from lightning_rlpt.model.distributed import shard_with_fsdp2
from lightning_rlpt.model.logprobs import completion_logprobs

VOCAB = 97  # odd: FSDP2 pads the head's shards unevenly
PROMPT, COMPLETION, ROWS = 6, 5, 4


def build(kind: str) -> torch.nn.Module:
    """Two layers × 128, head_dim 64: an untied Llama or a tied Qwen2."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    common = dict(vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                  num_attention_heads=2, head_dim=64, max_position_embeddings=64, attn_implementation="sdpa")
    if kind == "llama":
        return LlamaForCausalLM(LlamaConfig(num_key_value_heads=2, tie_word_embeddings=False, **common))
    return Qwen2ForCausalLM(Qwen2Config(num_key_value_heads=1, tie_word_embeddings=True, **common))


def rows(rank: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-padded prompts and right-padded completions of varied lengths, and loss weights."""
    g = torch.Generator().manual_seed(100 + rank)
    ids = torch.randint(0, VOCAB, (ROWS, PROMPT + COMPLETION), generator=g)
    mask = torch.ones_like(ids)
    for r in range(ROWS):
        mask[r, : r % 3] = 0  # left padding
        mask[r, PROMPT + COMPLETION - r % 2:] = 0  # right padding
    weights = torch.randn(ROWS, COMPLETION, generator=g) * mask[:, PROMPT:]
    return ids, mask, weights


def contains_fused_op(t: torch.Tensor) -> bool:
    """Whether the fused kernel's autograd node is in ``t``'s graph."""
    seen, todo = set(), [t.grad_fn]
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if "fused_logprobs" in node.name():
            return True
        todo += [n for n, _ in node.next_functions]
    return False


def score(model, ids, mask, weights, fused: bool, padding_free: bool):
    kw = dict(use_fused_kernel=fused, padding_free=padding_free, temperature=0.7, with_entropy=True)
    with torch.no_grad():
        no_grad, _ = completion_logprobs(model, ids, mask, COMPLETION, **kw)
    logp, entropy = completion_logprobs(model, ids, mask, COMPLETION, **kw)
    (logp * weights).sum().backward()
    return no_grad, logp.detach(), entropy, contains_fused_op(logp)


def worker(rank: int, port: int, args) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    compare(rank, args)
    # The sharded model holds the process group through its DTensors, in reference cycles. Left
    # to the interpreter's exit, the group's last reference went at finalization, where torch
    # 2.13's gloo aborted the process ("terminate called without an active exception") about
    # one exit in twelve, after every result was written. Collect it here, while all is alive.
    gc.collect()
    dist.destroy_process_group()


def compare(rank: int, args) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    model = build(args.model)
    if args.lora:
        from peft import LoraConfig, get_peft_model

        torch.manual_seed(1)
        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, init_lora_weights=False,
                                                 target_modules=["q_proj", "v_proj", "lm_head"]))
    reference = copy.deepcopy(model)
    shard_with_fsdp2(model, init_device_mesh("cpu", (2,)))
    ids, mask, weights = rows(rank)
    ref = score(reference, ids, mask, weights, fused=False, padding_free=args.padding_free)
    out = score(model, ids, mask, weights, fused=not args.plain, padding_free=args.padding_free)
    grads, ref_grads = {}, {}
    for (name, p), (ref_name, q) in zip(model.named_parameters(), reference.named_parameters()):
        assert name == ref_name, (name, ref_name)
        if not p.requires_grad:
            continue
        grads[name] = None if p.grad is None else p.grad.full_tensor()  # None: the test names it
        dist.all_reduce(q.grad)  # FSDP2 averages the ranks' gradients
        ref_grads[name] = q.grad / 2
    per_rank = [None, None]
    dist.all_gather_object(per_rank, dict(sharded=out, reference=ref))
    if rank == 0:
        torch.save(dict(ranks=per_rank, grads=grads, ref_grads=ref_grads), os.path.join(args.out, "result.pt"))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--model", choices=["llama", "qwen2"], default="llama")
    parser.add_argument("--padding-free", action="store_true")
    parser.add_argument("--plain", action="store_true")
    parser.add_argument("--lora", action="store_true")
    args = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.multiprocessing.spawn(worker, args=(port, args), nprocs=2)


if __name__ == "__main__":
    main()
