"""Episodes refuse, before any turn, a prompt that leaves the context no room and an empty prompt
(no chat template, a tokenizer without BOS), naming its dataset index; a prompt that fits but
whose budget does not is an episode the loop caps (`run_episodes`), not an error."""
import pytest
import torch

import agent_task as at
from lightning_rlpt.rollout.episodes.agent import Agent
from lightning_rlpt.rollout.episodes.rollout import rollout_episodes
from lightning_rlpt.rollout.hf import HFGenerateEngine
from lightning_rlpt.rollout.sampling import SamplingConfig


def run(prompts, max_context, chat_template=True, max_new_tokens=8):
    tok = at.build_tokenizer()  # one token per character, no BOS outside its chat template
    engine = HFGenerateEngine(at.build_model(positions=max_context), tok.eos_token_id, tok.pad_token_id)
    sampling = SamplingConfig(max_new_tokens=max_new_tokens, temperature=0.0, chat_template=chat_template)
    batch = {"prompt": prompts, "index": [10 + i for i in range(len(prompts))]}
    return rollout_episodes(Agent(tools=[at.multiply]), engine, tok, batch, 2, sampling, 0, torch.device("cpu"),
                            max_context=max_context)[0]


def test_a_prompt_that_leaves_no_room_is_refused():
    # In the template with the tools line: "x" is 43 tokens, "1+1=" * 10 is 82 (today: "max_new_tokens must be >= 1")
    with pytest.raises(ValueError, match=r"prompt at dataset index 11 \(row 2 of the batch\) has 82 tokens; leaving "
                                         r"no room for the episode in the model's context of 60 tokens \(2 such"):
        run(["x", "1+1=" * 10], max_context=60)


def test_an_empty_prompt_is_refused():
    with pytest.raises(ValueError, match=r"prompt at dataset index 10 \(row 0 of the batch\) is '', which gives no "
                                         r"tokens.*\(2 such rows"):
        run(["", "x"], max_context=64, chat_template=False)


def test_a_prompt_that_fits_but_whose_budget_does_not_runs():
    exp = run(["x"], max_context=64, chat_template=False, max_new_tokens=100)  # the loop caps the turns
    assert len(exp) == 2 and exp.completion_ids.shape[1] <= 64 - 1
