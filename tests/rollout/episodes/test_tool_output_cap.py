"""A tool result longer than ``tool_max_chars`` reaches the model cut in the middle, with a note it
reads, and counts in ``tools/truncation_frequency``: through `rollout_episodes` (the counts per
row) and through a real fit, where ``RLModule(tool_max_chars=...)`` sets the cap and the metric
is logged. The model is `scripted_model`'s GPT-2 that calls ``multiply(6, 7)`` on one prompt and an
unknown tool on another; here ``multiply`` answers a megabyte."""
from __future__ import annotations

import csv
import os

import torch
from lightning.pytorch.loggers import CSVLogger
from transformers import AutoModelForCausalLM

import agent_task as at
from conftest import quiet_trainer
from episode_fixtures import tool_model_dir, tool_script  # noqa: F401 (fixtures)
from lightning_rlpt import PromptDataModule, RLModule
from lightning_rlpt.rollout.episodes import Tool, ToolBox
from lightning_rlpt.rollout.episodes.agent import Agent, info_metrics
from lightning_rlpt.rollout.episodes.rollout import rollout_episodes
from lightning_rlpt.rollout.hf import HFGenerateEngine
from lightning_rlpt.rollout.sampling import SamplingConfig

MEGABYTE = "<" + "7" * (2**20 - 2) + ">"
CUT = ("<" + "7" * 29 + "\n[... 1048516 characters of the tool result cut here: it is kept to its first 30 and last 30 "
       "...]\n" + "7" * 29 + ">")


def loud_multiply() -> Tool:
    """`agent_task.multiply`'s schema (so the prompts are the script's), a megabyte for a result."""
    return Tool(lambda a, b: MEGABYTE, ToolBox([at.multiply]).schemas[0])


def test_a_long_result_is_cut_and_counted_per_row(tool_model_dir, tool_script):
    tok, prompts, _, _ = tool_script
    model = AutoModelForCausalLM.from_pretrained(tool_model_dir)
    engine = HFGenerateEngine(model, tok.eos_token_id, tok.pad_token_id)
    sampling = SamplingConfig(max_new_tokens=200, temperature=0.0, max_prompt_length=None)
    agent = Agent(tools=[loud_multiply()], max_turns=3, tool_max_chars=60)
    exp = rollout_episodes(agent, engine, tok, {"prompt": prompts}, 2, sampling, 0, torch.device("cpu"),
                           max_context=1024)[0]
    tool_messages = [[m["content"] for m in row if m["role"] == "tool"] for row in exp.columns["completion_messages"]]
    assert tool_messages[:4] == [[CUT], [CUT], [], []]
    # the unknown tool's error (57 characters) fits in 60 and is left whole
    assert tool_messages[4:] == [["error: unknown tool 'divide'; the tools are ['multiply']"]] * 2
    assert exp.info["tool_truncations"].tolist() == [1, 1, 0, 0, 0, 0]
    assert exp.info["tool_calls"].tolist() == [1, 1, 0, 0, 1, 1]
    assert (exp.completion_mask[:2] == 0).sum(1).max() < 200  # the megabyte never reached the tokenizer
    metrics = info_metrics(exp.info, exp.completion_mask.sum(1))
    assert metrics["tools/truncation_frequency"] == 2 / 4 and metrics["tools/failure_frequency"] == 2 / 4


def zero(prompts, completions, **_):
    return [0.0] * len(completions)


def test_fit_sets_the_cap_and_logs_the_truncation_frequency(tool_model_dir, tool_script, tmp_path):
    tok, prompts, _, _ = tool_script
    rows = [{"prompt": prompts[0]}, {"prompt": prompts[1]}]  # multiply, then no call
    module = RLModule(tool_model_dir, reward_funcs=[zero], tokenizer=tok, group_size=2, kl_coef=0.0, lr=1e-6,
                      tools=[loud_multiply()], max_turns=3, tool_max_chars=60,
                      generation=dict(max_new_tokens=100, max_prompt_length=600, temperature=1.0))
    assert module.agent.toolbox.max_chars == 60
    logger = CSVLogger(str(tmp_path), name="run")
    quiet_trainer(max_steps=1, logger=logger).fit(module, datamodule=PromptDataModule(rows, batch_size=2, seed=0))
    with open(os.path.join(logger.log_dir, "metrics.csv")) as f:
        logged = [r for r in csv.DictReader(f) if r.get("tools/truncation_frequency")]
    assert [(float(r["tools/call_frequency"]), float(r["tools/truncation_frequency"])) for r in logged] == [(0.5, 1.0)]
