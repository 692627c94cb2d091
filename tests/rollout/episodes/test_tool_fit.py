"""A real fit in which the model calls a tool: RLModule(tools=[multiply]) on the HF engine with
`scripted_model`'s hand-set GPT-2 (it spells ``multiply(6, 7)`` for one prompt and answers
another directly). The tool really runs (its calls are counted here), its result is in the
next turn's context (out of the loss), ``tools/call_frequency`` logs the hand count, and
`CompletionSamples` shows whole episodes."""
from __future__ import annotations

import csv
import os

from lightning.pytorch.loggers import CSVLogger

from conftest import quiet_trainer
from episode_fixtures import tool_model_dir, tool_script  # noqa: F401 (fixtures)
from lightning_rlpt import PromptDataModule, RLCallback, RLModule
from lightning_rlpt.callbacks import CompletionSamples
from scripted_model import suffix_text

CALLS: list[tuple[int, int]] = []


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: the first factor.
        b: the second factor.
    """
    CALLS.append((a, b))
    return a * b


class Record(RLCallback):
    """Per rollout: the experience and the tool calls made so far."""

    def __init__(self):
        self.rollouts = []

    def on_rollout_end(self, trainer, module, experience):
        self.rollouts.append((experience, len(CALLS)))


def last_answer(prompts, completions, completion_messages, answer, **_):
    return [float(m[-1]["content"] == a) for m, a in zip(completion_messages, answer)]


def test_fit_calls_the_tool_and_logs_its_frequency(tool_model_dir, tool_script, tmp_path):
    tok, prompts, _, expected = tool_script
    CALLS.clear()
    rows = [{"prompt": prompts[0], "answer": "42"}, {"prompt": prompts[1], "answer": "4"}] * 2
    module = RLModule(tool_model_dir, reward_funcs=[last_answer], tokenizer=tok, group_size=2, kl_coef=0.0, lr=1e-6,
                      tools=[multiply], max_turns=3,
                      generation=dict(max_new_tokens=100, max_prompt_length=600, temperature=1.0))
    record, samples = Record(), CompletionSamples(every_n_steps=1, num_samples=4)
    logger = CSVLogger(str(tmp_path), name="run")
    trainer = quiet_trainer(max_steps=2, logger=logger, callbacks=[record, samples])
    trainer.fit(module, datamodule=PromptDataModule(rows, batch_size=2, seed=0))

    totals = [n for _, n in record.rollouts]
    calls_per_step = [after - before for before, after in zip([0] + totals, totals)]
    assert len(record.rollouts) == 2 and CALLS == [(6, 7)] * len(CALLS) and sum(calls_per_step) == len(CALLS) > 0
    for exp, _ in record.rollouts:  # every multiply row called once; the rest never
        asks = [m[0]["content"] == "What is 6*7?" for m in exp.prompts]
        assert exp.info["tool_calls"].tolist() == [int(a) for a in asks]
        for i in (i for i, a in enumerate(asks) if a):
            assert exp.columns["completion_messages"][i] == [
                {"role": "assistant", "content": '<tool_call>{"name": "multiply", "arguments": {"a": 6, "b": 7}}</tool_call>'},
                {"role": "tool", "name": "multiply", "content": "42"}, {"role": "assistant", "content": "42"}]
            ids, mask = exp.completion_ids[i], exp.completion_mask[i]
            assert ids[: len(expected[0][0])].tolist() == expected[0][0]  # the episode, token for token
            assert tok.decode(ids[mask == 0][: len(expected[0][0]) - sum(expected[0][1])]) == suffix_text(["42"])
    metrics = _rows(logger, "metrics.csv")
    logged = [float(r["tools/call_frequency"]) for r in metrics if r.get("tools/call_frequency")]
    assert logged == [n / 4 for n in calls_per_step]  # 4 episodes a step
    assert [float(r["reward"]) for r in metrics if r.get("reward")] == [1.0, 1.0]  # every final answer right

    shown = [r["completion"] for r in _rows(logger, "completions.csv")]
    assert len(shown) == 8 and ("assistant: " + '<tool_call>{"name": "multiply", "arguments": {"a": 6, "b": 7}}'
                                "</tool_call>\ntool: 42\nassistant: 42") in shown
    assert "assistant: 4" in shown


def _rows(logger, name):
    with open(os.path.join(logger.log_dir, name)) as f:
        return list(csv.DictReader(f))
