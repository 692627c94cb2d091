"""One zoo architecture under FSDP2 (2 gloo processes, HF engine): two optimizer steps, each
training rollout's behaviour log-probs against the sharded trainer's (tests/zoo's `LogprobGap`),
written per rank to ``gaps_rank{r}.json``:

    python tests/scripts/zoo_fsdp2_fit.py --model DIR --out DIR

Lightning's launcher re-runs this script once per rank.
"""
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # tests/: the tiny task, the zoo's cell
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "zoo"))

import lightning as L  # noqa: E402
import torch  # noqa: E402

import tiny_task as task  # noqa: E402
from conformance import LogprobGap, make_module  # noqa: E402
from lightning_rlpt import PromptDataModule  # noqa: E402
from lightning_rlpt.model.distributed import release_process_group  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    torch.set_num_threads(1)
    module = make_module(args.model, "full", seed_per_prompt=True)
    gaps = LogprobGap()
    strategy = L.pytorch.strategies.ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1)
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy=strategy, max_steps=2, logger=False,
                        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                        callbacks=[gaps])
    train, _ = task.split_pairs()
    trainer.fit(module, datamodule=PromptDataModule(task.rows(train[:32]), batch_size=4, seed=1))
    with open(os.path.join(args.out, f"gaps_rank{trainer.global_rank}.json"), "w") as f:
        json.dump(gaps.rows, f)


if __name__ == "__main__":
    main()
    release_process_group()  # before finalization, where gloo can abort an exit that succeeded
