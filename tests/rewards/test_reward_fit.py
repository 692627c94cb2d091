"""A short real fit whose rewards are an ``async def`` function, an `HTTPReward` served by a real
HTTP server on 127.0.0.1 and a multi-task function returning None: all score every rollout, see
the trainer's state, and are logged (None as an empty cell of `CompletionSamples`' table)."""
import csv

import pytest
from reward_server import fetch_log, running_server

import tiny_task as task
from conftest import quiet_trainer
from lightning_rlpt import HTTPReward, PromptDataModule, RLModule
from lightning_rlpt.callbacks import CompletionSamples

GEN = dict(max_new_tokens=4, max_prompt_length=8)


def test_fit_with_async_http_and_none_rewards(llama_dir, arithmetic_rows, tmp_path):
    steps_seen, indices = [], []

    def even_only(prompts, completions, index, **_):
        """Applies to even dataset rows only (None elsewhere): a multi-task reward."""
        indices.append(index)
        return [1.0 if i % 2 == 0 else None for i in index]

    async def async_exact(prompts, completions, answer, completion_ids, trainer_state, **_):
        steps_seen.append(trainer_state.global_step)
        return task.exact_answer(prompts, completions, answer, completion_ids)

    with running_server() as (url, _):
        remote = HTTPReward(url + "/length", batch_size=3, name="length", timeout=10)
        module = RLModule(llama_dir, reward_funcs=[async_exact, remote, even_only], group_size=2, generation=GEN,
                          kl_coef=0.0, reward_timeout=60)
        samples = CompletionSamples(every_n_steps=1, num_samples=4, filename=str(tmp_path / "samples.csv"))
        trainer = quiet_trainer(max_steps=2, callbacks=[samples])
        trainer.fit(module, datamodule=PromptDataModule(arithmetic_rows[:8], batch_size=2))
        log = fetch_log(url)

    assert trainer.global_step == 2 and steps_seen == [0, 1]
    assert [e["n"] for e in log if e["trainer_state"]["global_step"] == 0] in ([3, 1], [1, 3])  # 2 prompts × G=2
    assert sorted({e["trainer_state"]["global_step"] for e in log}) == [0, 1]
    assert all(e["keys"] == ["answer", "completion_ids", "completions", "index", "prompts", "trainer_state"] for e in log)
    last = [r for e in log if e["trainer_state"]["global_step"] == 1 for r in e["rewards"]]
    metrics = trainer.logged_metrics
    assert float(metrics["rewards/length/mean"]) == pytest.approx(sum(last) / len(last))
    assert float(metrics["rewards/length/none_frac"]) == 0.0 and float(metrics["rewards/length/failures"]) == 0.0
    assert "rewards/async_exact/mean" in metrics
    odd = [[i % 2 for i in index] for index in indices]
    assert float(metrics["rewards/even_only/none_frac"]) == sum(odd[-1]) / 4
    assert 0 < sum(map(sum, odd)) < 8  # some rows of each kind over the two steps
    with open(tmp_path / "samples.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["reward/even_only"] for r in rows] == ["" if o else "1.0" for step in odd for o in step]
