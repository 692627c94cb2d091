"""Review finding 9: when the hooks leave one rank of two no rows, every rank skips the step
together (an empty batch skips the step, `MakeExperience._any_rank_empty`) and warns naming that
rank; before, the empty rank returned alone and the other blocked in the next collective."""
import json
import os
import time
import warnings

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
WARM_START = os.path.join(os.path.dirname(os.path.dirname(HERE)), "examples", "arithmetic", "warm_start")


def _worker(rank: int, port: int, out: str) -> None:
    """One rank of a 2-process CPU DDP fit whose hook empties rank 1's first batch."""
    import sys

    sys.path.insert(0, os.path.dirname(HERE))  # tests/: the tiny task
    import lightning as L

    import tiny_task as task
    from lightning_rlpt import PromptDataModule, RLCallback, RLModule

    class EmptyRankOneOnce(RLCallback):
        calls = 0

        def on_rewards_computed(self, trainer, module, experience):
            self.calls += 1
            return experience.select([]) if trainer.global_rank == 1 and self.calls == 1 else experience

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2", RANK=str(rank),
                      LOCAL_RANK=str(rank), NODE_RANK="0")
    module = RLModule(WARM_START, reward_funcs=[task.exact_answer], group_size=2, kl_coef=0.0, lr=1e-4, seed=3,
                      generation=dict(max_new_tokens=2, max_prompt_length=8))
    hook = EmptyRankOneOnce()
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_steps=1, logger=False, callbacks=[hook],
                        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)
    train, _ = task.split_pairs()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(module, datamodule=PromptDataModule(task.rows(train[:16]), batch_size=1, seed=7))
    messages = [str(w.message) for w in caught if "no rows" in str(w.message)]
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"policy_version": module.policy_version, "batches": hook.calls, "warnings": messages}, f)


@pytest.mark.slow
def test_one_empty_rank_makes_every_rank_skip_the_step_naming_it(tmp_path):
    import torch.multiprocessing as mp

    from lightning_rlpt.rollout.vllm.server import free_port

    context = mp.start_processes(_worker, args=(free_port(), str(tmp_path)), nprocs=2, start_method="spawn",
                                 join=False)
    deadline = time.monotonic() + 240  # a rank blocked in a collective would wait forever
    while not context.join(timeout=5):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail("the ranks did not finish: one is blocked in a collective the other never joined")
    results = [json.load(open(tmp_path / f"rank{rank}.json")) for rank in (0, 1)]
    for result in results:
        # batch 1 skipped on both ranks, batch 2 trained: one optimizer step each, in step
        assert result["batches"] == 2 and result["policy_version"] == 1, results
        assert len(result["warnings"]) == 1 and "rank(s) [1] no rows, so every rank skips" in result["warnings"][0]
