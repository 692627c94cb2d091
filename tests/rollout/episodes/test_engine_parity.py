"""Greedy episodes are identical between the HF engine and vLLM (issue 15's acceptance): same
tokens, tool calls, tool results, masks, turn counts, log-probs within fp32 noise.

The model is `scripted_model`'s hand-set GPT-2, whose greedy choice depends only on the
position: it calls ``multiply(6, 7)`` and answers ``42`` after the result, answers one prompt
without a call, and calls an unknown tool, answering after the error. An engine that placed a
token anywhere else (padding, a cached prefix, a tool result rendered differently) would
generate EOS where the script expects text, so the hand-laid episodes are checked too, not
only the agreement of the two engines."""
from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

import agent_task as at
from episode_fixtures import tool_model_dir, tool_script  # noqa: F401 (fixtures)
from lightning_rlpt import RLModule
from lightning_rlpt.rollout.episodes.agent import Agent
from lightning_rlpt.rollout.episodes.rollout import rollout_episodes
from lightning_rlpt.rollout.hf import HFGenerateEngine
from lightning_rlpt.rollout.sampling import SamplingConfig

GREEDY = SamplingConfig(max_new_tokens=200, temperature=0.0, max_prompt_length=None)
CONTEXT = 1024  # the model's positions: the HF engine's bound, and vLLM's max_model_len


def episodes(engine, tok, prompts, max_context=CONTEXT):
    return rollout_episodes(Agent(tools=[at.multiply], max_turns=3), engine, tok, {"prompt": prompts}, 2, GREEDY, 0,
                            torch.device("cpu"), max_context=max_context)[0]


def check_script(exp, expected):
    """Rows 2k and 2k+1 (a group) replay expected episode k, token for token and mask for mask."""
    for i in range(len(exp)):
        ids, mask = expected[i // 2]
        assert exp.completion_ids[i, : len(ids)].tolist() == ids and exp.completion_mask[i].tolist()[: len(ids)] == mask
        assert exp.completion_mask[i, len(ids):].sum() == 0
    assert exp.info["turns"].tolist() == [2, 2, 1, 1, 2, 2] and exp.info["tool_calls"].tolist() == [1, 1, 0, 0, 1, 1]
    assert exp.info["tool_failures"].tolist() == [0, 0, 0, 0, 1, 1] and not exp.truncated.any()
    assert [m[1]["content"] for m in exp.columns["completion_messages"][::2] if len(m) > 1] == [
        "42", "error: unknown tool 'divide'; the tools are ['multiply']"]


@pytest.mark.slow
def test_greedy_episodes_identical_on_hf_and_vllm(tool_model_dir, tool_script):
    from lightning_rlpt.rollout.vllm.engine import VLLMEngine

    tok, prompts, _, expected = tool_script
    model = AutoModelForCausalLM.from_pretrained(tool_model_dir)
    hf = episodes(HFGenerateEngine(model, tok.eos_token_id, tok.pad_token_id, return_logprobs=True), tok, prompts)
    check_script(hf, expected)
    # As VLLMRollout builds it: the module's prompt 560 + 100 model tokens would not hold row 3's
    # episode (539 + 136 tokens); with tools vLLM gets the model's whole context.
    module = RLModule(tool_model_dir, reward_funcs=[lambda completions, **_: [0.0] * len(completions)], tokenizer=tok,
                      tools=[at.multiply], generation=dict(max_new_tokens=100, max_prompt_length=560))
    engine = VLLMEngine.from_module(module, dtype="float32", kv_cache_memory_bytes=64 << 20, enable_prefix_caching=True)
    assert engine.max_model_len == CONTEXT
    try:
        vllm = episodes(engine, tok, prompts, max_context=engine.max_model_len)
        vllm_cut = episodes(engine, tok, prompts, max_context=600)
    finally:
        engine.close()
    # A context of 600 leaves row 3 (prompt 539 tokens) room for its call (52 tokens) but not for the
    # error message after it: the episode ends there, truncated and flagged, on both engines.
    hf_cut = episodes(HFGenerateEngine(model, tok.eos_token_id, tok.pad_token_id, return_logprobs=True), tok, prompts,
                      max_context=600)
    assert hf_cut.truncated.tolist() == vllm_cut.truncated.tolist() == [False] * 4 + [True] * 2
    first_turn = expected[2][1].index(0)
    assert int(hf_cut.prompt_mask[4].sum()) == 539
    assert first_turn == 52 and hf_cut.completion_mask[4].tolist()[:53] == [1] * 52 + [0]
    assert torch.equal(hf_cut.completion_ids, vllm_cut.completion_ids) and hf_cut.info["turns"].tolist()[4:] == [1, 1]
    assert hf_cut.columns["completion_messages"] == vllm_cut.columns["completion_messages"]
    check_script(vllm, expected)
    assert torch.equal(hf.completion_ids, vllm.completion_ids) and torch.equal(hf.completion_mask, vllm.completion_mask)
    assert hf.columns["completion_messages"] == vllm.columns["completion_messages"] and hf.completions == vllm.completions
    assert all(torch.equal(hf.info[k], vllm.info[k]) for k in hf.info) and torch.equal(hf.truncated, vllm.truncated)
    assert (hf.behaviour_logprobs - vllm.behaviour_logprobs).abs().max() < 1e-4


@pytest.mark.slow
def test_greedy_episodes_identical_on_hf_and_a_vllm_server(tool_model_dir, tool_script, tmp_path):
    """The server engine too: one launched ``vllm serve`` (stopped by pid), its context read by
    `RemoteVLLMEngine.check_model` and used to bound the episodes."""
    from lightning_rlpt.model.weights import policy_weights
    from lightning_rlpt.rollout.vllm.remote_engine import RemoteVLLMEngine
    from lightning_rlpt.rollout.vllm.server import VLLMServer

    tok, prompts, _, expected = tool_script
    model = AutoModelForCausalLM.from_pretrained(tool_model_dir)
    hf = episodes(HFGenerateEngine(model, tok.eos_token_id, tok.pad_token_id, return_logprobs=True), tok, prompts)
    server = VLLMServer.launch(tool_model_dir, log_dir=str(tmp_path), max_model_len=CONTEXT,
                               kv_cache_memory_bytes=64 << 20, startup_timeout=300)
    try:
        engine = RemoteVLLMEngine([server.url], eos_token_id=tok.eos_token_id)
        engine.check_model(model, tok, 616)
        engine.load_weights(policy_weights(model), 0)  # as VLLMServerRollout does before the first rollout
        assert engine.max_model_len == CONTEXT
        remote = episodes(engine, tok, prompts, max_context=engine.max_model_len)
    finally:
        server.stop()
    check_script(remote, expected)
    assert torch.equal(hf.completion_ids, remote.completion_ids) and torch.equal(hf.completion_mask, remote.completion_mask)
    assert hf.columns["completion_messages"] == remote.columns["completion_messages"]
    assert all(torch.equal(hf.info[k], remote.info[k]) for k in hf.info)
    assert (hf.behaviour_logprobs - remote.behaviour_logprobs).abs().max() < 1e-4
