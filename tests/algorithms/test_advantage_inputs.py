"""Advantage estimators receive one record (`AdvantageInputs`) with the fields their ``needs`` trait
names: VCPO's min-variance baseline selected through ``advantage=`` inside a fit, a user's estimator
registered outside the package (docs/objectives.md's block, run verbatim), and the refusals."""
import os
import re

import pytest
import torch

from callback_helpers import Spy, fit, make_module
from conftest import ROOT
from lightning_rlpt import ADVANTAGE_ESTIMATORS, HFGenerateEngine
from lightning_rlpt.algorithms.advantages import (AdvantageInputs, check_estimator, compute_advantages,
                                                  estimator_requests)


def by_hand_min_variance(exp, lengths_proxy=False):
    """``A = R − Σ W R / Σ W`` per group, ``W = ‖g‖²·w²``, w over the completion-mask tokens."""
    mask = exp.completion_mask.double()
    w = torch.exp(((exp.old_logprobs.double() - exp.behaviour_logprobs.double()) * mask).sum(1))
    g = mask.sum(1) if lengths_proxy else torch.ones_like(w)
    big_w, r = (g * w * w).view(-1, exp.group_size), exp.rewards.double().view(-1, exp.group_size)
    return (r - (big_w * r).sum(1, keepdim=True) / (big_w.sum(1, keepdim=True) + 1e-8)).view(-1)


@pytest.mark.parametrize("proxy", ["none", "length"])
def test_min_variance_is_selectable_through_advantage(proxy, warm_start_dir, arithmetic_rows):
    seen = []
    module = make_module(warm_start_dir, engine="off_policy", advantage="min_variance_offpolicy",
                         advantage_kwargs={"grad_norm_proxy": proxy}, rollout_correction="seq_tis")
    assert module.requests.old_logprobs and module.requests.rollout_logprobs  # asked for at construction
    fit(module, [Spy(lambda hook, t, m, exp: hook == "advantages" and seen.append(exp))], arithmetic_rows[:8], steps=2)
    assert len(seen) == 2
    for exp in seen:
        w = torch.exp(((exp.old_logprobs - exp.behaviour_logprobs) * exp.completion_mask).sum(1))
        assert (w - 1).abs().max() > 1e-3  # the engine is off-policy: the weights matter
        expected = by_hand_min_variance(exp, lengths_proxy=proxy == "length")
        assert exp.advantages.double().tolist() == pytest.approx(expected.tolist(), rel=1e-4, abs=1e-6)


def test_an_estimator_of_rewards_only_asks_for_nothing(warm_start_dir):
    assert estimator_requests("grpo") == {}
    assert estimator_requests("min_variance_offpolicy") == {"old_logprobs": True, "rollout_logprobs": True}
    module = make_module(warm_start_dir)
    assert not module.requests.old_logprobs and not module.requests.rollout_logprobs


def doc_block() -> str:
    text = open(os.path.join(ROOT, "docs", "objectives.md"), encoding="utf-8").read()
    return re.search(r"<!-- custom-estimator -->\n```python\n(.*?)```", text, re.S).group(1)


@pytest.fixture
def user_estimator():
    """docs/objectives.md's custom estimator, registered for one test and removed after it."""
    exec(compile(doc_block(), "docs/objectives.md", "exec"), {})
    yield "dr_grpo_length"
    ADVANTAGE_ESTIMATORS.unregister("dr_grpo_length")


def test_a_users_estimator_from_the_docs_runs_in_a_fit(user_estimator, warm_start_dir, arithmetic_rows):
    seen = []
    module = make_module(warm_start_dir, advantage=user_estimator, advantage_kwargs={"alpha": 0.05},
                         mask_truncated_completions=True, generation=dict(max_new_tokens=3, max_prompt_length=8))
    fit(module, [Spy(lambda hook, t, m, exp: hook == "advantages" and seen.append(exp))], arithmetic_rows[:8], steps=2)
    moved = []
    for exp in seen:
        r = exp.rewards.view(-1, 4)
        length = (exp.completion_mask * (~exp.truncated).unsqueeze(1)).sum(1).float().view(-1, 4)  # trained tokens
        expected = (r - r.mean(1, keepdim=True)) - 0.05 * (length - length.mean(1, keepdim=True))
        assert exp.advantages.tolist() == pytest.approx(expected.view(-1).tolist(), abs=1e-6)
        moved.append(bool((length != length.mean(1, keepdim=True)).any()))  # the length term moved an advantage
    # some rows truncated (the loss leaves them out: 0 tokens, not their completion's) and some not
    assert any(moved) and any(exp.truncated.any() for exp in seen) and any((~exp.truncated).any() for exp in seen)
    with pytest.raises(ValueError, match=r"advantage_kwargs\['alhpa'\].*did you mean 'alpha'"):
        make_module(warm_start_dir, advantage=user_estimator, advantage_kwargs={"alhpa": 0.05})


def test_a_bare_rewards_tensor_and_flat_fields_fill_the_record():
    r = torch.tensor([[1.0, 0.0, 0.0, 0.0]])
    assert ADVANTAGE_ESTIMATORS.get("dr_grpo")(r).tolist() == [[0.75, -0.25, -0.25, -0.25]]
    got = compute_advantages("min_variance_offpolicy", r.view(-1), 4, trained=torch.tensor([True, True, False, True]))
    assert got.tolist() == pytest.approx([2 / 3, -1 / 3, -1 / 3, -1 / 3])  # row 2 out of the baseline: 1/3
    record = AdvantageInputs.grouped(r.view(-1), 2, lengths=torch.tensor([1, 2, 3, 4]))
    assert record.rewards.shape == (2, 2) and record.lengths.tolist() == [[1, 2], [3, 4]] and record.is_weights is None


def test_needs_and_options_are_checked_at_registration():
    with pytest.raises(TypeError, match=r"needs unknown field\(s\) \['values'\]; AdvantageInputs has"):
        ADVANTAGE_ESTIMATORS.register("bad_needs", needs=("values",))
    with pytest.raises(TypeError, match=r"option\(s\) \['lengths'\] named like AdvantageInputs fields"):
        @ADVANTAGE_ESTIMATORS.register("bad_option")
        def bad_option(inputs, *, lengths=None):
            return inputs.rewards
    assert "bad_needs" not in ADVANTAGE_ESTIMATORS and "bad_option" not in ADVANTAGE_ESTIMATORS
    with pytest.raises(ValueError, match=r"grad_norm_proxy must be one of \('none', 'length'\)"):
        check_estimator("min_variance_offpolicy", 4, {"grad_norm_proxy": "norm"})


def test_an_engine_without_behaviour_logprobs_is_named(warm_start_dir, arithmetic_rows):
    module = make_module(warm_start_dir, advantage="min_variance_offpolicy")
    module.rollout_engine = HFGenerateEngine(module.policy, module.tokenizer.eos_token_id,
                                             module.tokenizer.pad_token_id, return_logprobs=False)
    with pytest.raises(ValueError, match=r"'min_variance_offpolicy' needs the rollout engine's log-probs.*"
                                         r"return_logprobs=True"):
        fit(module, [], arithmetic_rows[:4], steps=1)
