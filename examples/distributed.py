"""The arithmetic demo on several processes: DDP, FSDP2 (ModelParallelStrategy) or FSDP1.

    python examples/distributed.py --strategy ddp   --devices 2             # CPU, gloo
    python examples/distributed.py --strategy fsdp2 --devices 2             # CPU or GPU
    python examples/distributed.py --strategy fsdp  --devices 8 --accelerator gpu   # FSDP1, GPU only
    torchrun --nnodes 2 --nproc-per-node 8 examples/distributed.py --strategy fsdp2 --devices 8 --num-nodes 2

Lightning launches the processes itself (or adopts torchrun's/SLURM's). ``--prompts`` is per
rank; every rank rolls out whole groups of its own prompts, and the global batch holds the
same prompts whatever the number of ranks.
"""
import argparse
import os
import sys

import lightning as L
from lightning.pytorch.loggers import CSVLogger

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "arithmetic"))
import task  # noqa: E402

from lightning_rlpt import PromptDataModule, RLModule  # noqa: E402


def strategy_for(name: str, devices: int, num_nodes: int = 1):
    if name == "fsdp2":  # shard over every process of every node (Lightning checks dp x tp = world size)
        return L.pytorch.strategies.ModelParallelStrategy(data_parallel_size=devices * num_nodes,
                                                          tensor_parallel_size=1)
    if name == "fsdp":  # FSDP1: Lightning refuses it on CPU
        from transformers.models.llama.modeling_llama import LlamaDecoderLayer
        return L.pytorch.strategies.FSDPStrategy(auto_wrap_policy={LlamaDecoderLayer})
    return name


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--strategy", default="ddp", choices=["ddp", "fsdp2", "fsdp"])
    p.add_argument("--devices", type=int, default=2)
    p.add_argument("--num-nodes", type=int, default=1)
    p.add_argument("--accelerator", default="cpu")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--prompts", type=int, default=8, help="prompts per step and rank")
    args = p.parse_args()
    train, held_out = task.split_pairs()
    module = RLModule(os.path.join(HERE, "arithmetic", "warm_start"), reward_funcs=[task.exact_answer],
                      group_size=8, kl_coef=0.001, lr=3e-5, generation=dict(max_new_tokens=4, max_prompt_length=8))
    data = PromptDataModule(task.rows(train), val_data=task.rows(held_out), batch_size=args.prompts,
                            val_batch_size=150)
    trainer = L.Trainer(accelerator=args.accelerator, devices=args.devices, num_nodes=args.num_nodes,
                        strategy=strategy_for(args.strategy, args.devices, args.num_nodes), max_steps=args.steps,
                        logger=CSVLogger("runs", name=f"distributed-{args.strategy}"), log_every_n_steps=1,
                        val_check_interval=max(1, args.steps // 2), check_val_every_n_epoch=None,
                        enable_checkpointing=False)
    trainer.fit(module, datamodule=data)


if __name__ == "__main__":
    main()
