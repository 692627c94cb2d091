"""A short GRPO fit of a LoRA policy (r = 4 on the demo's warm start) with the default
`HFGenerateEngine`, run as its own script (Lightning's launcher re-runs it once per rank):

    python tests/scripts/fsdp2_lora_fit.py --strategy single|ddp|fsdp2 --out DIR [--steps N] [--quantization nf4]

Each rank writes ``rollouts_rank{r}.json``: per rollout, its rows as ``[dataset index, row in
the group, completion token ids]``; and ``lora_rank{r}.pt``: every trainable (LoRA) parameter
after the fit, gathered whole from FSDP2's shards. Rows are seeded per prompt
(``seed_per_prompt=True``), so two ranks with 2 prompts each sample what one process with the 4
prompts samples. ``--quantization nf4`` loads the base in 4 bits (QLoRA, bitsandbytes).
"""
import argparse
import functools
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(HERE))  # tests/: the tiny task

import lightning as L  # noqa: E402
import torch  # noqa: E402

import tiny_task as task  # noqa: E402
from lightning_rlpt import PromptDataModule, RLCallback, RLModule  # noqa: E402
from lightning_rlpt.model.distributed import release_process_group  # noqa: E402

PROMPTS = 4  # per step, over all ranks
LR = 0.5  # plain SGD: the update is the gradient itself (Adam's would hide a wrongly scaled one)


class RolloutRecorder(RLCallback):
    """Every rollout's rows on this rank: dataset index, row in the group, completion ids."""

    def __init__(self):
        self.rollouts = []

    def on_rollout_end(self, trainer, module, experience):
        rows = []
        for i, (index, ids, mask) in enumerate(zip(experience.columns["index"], experience.completion_ids,
                                                    experience.completion_mask)):
            rows.append([int(index), i % experience.group_size, ids[mask.bool()].tolist()])
        self.rollouts.append(rows)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--strategy", choices=["single", "ddp", "fsdp2"], required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--quantization", choices=["nf4"], default=None)
    args = p.parse_args()
    torch.set_num_threads(1)
    devices = 1 if args.strategy == "single" else 2
    strategy = {"single": "auto", "ddp": "ddp",
                "fsdp2": L.pytorch.strategies.ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1)}
    module = RLModule(os.path.join(ROOT, "examples", "arithmetic", "warm_start"), reward_funcs=[task.exact_answer],
                      group_size=4, optimizer=functools.partial(torch.optim.SGD, lr=LR), seed=3, seed_per_prompt=True, lora=dict(r=4, lora_alpha=8),
                      quantization=args.quantization,
                      generation=dict(max_new_tokens=4, max_prompt_length=8),
                      head_gradient="recompute")  # FSDP2's path, so one process and two compute alike
    train, _ = task.split_pairs()
    recorder = RolloutRecorder()
    trainer = L.Trainer(accelerator="cpu", devices=devices, strategy=strategy[args.strategy], max_steps=args.steps,
                        logger=False, enable_progress_bar=False, enable_model_summary=False,
                        enable_checkpointing=False, callbacks=[recorder])
    trainer.fit(module, datamodule=PromptDataModule(task.rows(train[:32]), batch_size=PROMPTS // devices, seed=1))
    rank = trainer.global_rank
    lora = {name: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
            for name, p in module.policy.named_parameters() if p.requires_grad}
    torch.save(lora, os.path.join(args.out, f"lora_rank{rank}.pt"))
    with open(os.path.join(args.out, f"rollouts_rank{rank}.json"), "w") as f:
        json.dump(recorder.rollouts, f)


if __name__ == "__main__":
    main()
    release_process_group()  # before finalization, where gloo can abort an exit that succeeded
