"""vLLM after a weight sync samples what the trained policy would: greedy tokens and their
log-probs equal the HF policy's (fp32, |Δ log p| < 1e-4) at step 0 and after optimizer steps,
for full fine-tuning, LoRA and QLoRA; with ``sync_every=k`` the behaviour log-probs lag the
policy between syncs and the mismatch correction engages."""
import pytest
import torch

import tiny_task as task
from conftest import quiet_trainer
from correction_probe import correction_in_loss
from lightning_rlpt import PromptDataModule, RLCallback, RLModule, SamplingConfig
from lightning_rlpt.callbacks import VLLMRollout
from lightning_rlpt.rollout.collect import rollout
from lightning_rlpt.model.logprobs import position_ids_for
from lightning_rlpt.rollout import HFGenerateEngine
from lightning_rlpt.rollout.vllm.engine import VLLMEngine
from lightning_rlpt.model.weights import policy_weights

ATOL = 1e-4  # fp32 on both sides; observed differences are ~1e-6 (kernel summation order)
GREEDY = SamplingConfig(max_new_tokens=4, temperature=0.0, max_prompt_length=8)
MODES = {
    "full": dict(lr=1e-3),
    "lora": dict(lr=1e-2, lora=dict(r=4, lora_alpha=8)),
    "qlora": dict(lr=1e-2, lora=dict(r=4, lora_alpha=8), quantization="nf4"),
}


def make_module(path, temperature=1.0, **kwargs):
    return RLModule(path, reward_funcs=[task.exact_answer], group_size=4, kl_coef=0.0,
                    generation=dict(max_new_tokens=4, temperature=temperature, max_prompt_length=8), **kwargs)


@pytest.fixture(scope="module")
def engine(warm_start_dir):
    eng = VLLMEngine.from_module(make_module(warm_start_dir))
    yield eng
    eng.close()


def greedy_parity(engine, module, prompts):
    """vLLM's greedy completions vs the policy's argmax and log-probs on the same tokens."""
    exp, _ = rollout(engine, module.tokenizer, {"prompt": prompts}, 1, GREEDY, 0, torch.device("cpu"))
    module.policy.train()  # QLoRA: bitsandbytes' fp32 path (eval + no-grad switches to a bf16 kernel)
    with torch.no_grad():
        logits = module.policy(input_ids=exp.input_ids, attention_mask=exp.attention_mask,
                               position_ids=position_ids_for(exp.attention_mask)).logits.float()
    width = exp.completion_ids.shape[1]
    logits = logits[:, -width - 1:-1]
    mask = exp.completion_mask.bool()
    assert torch.equal(logits.argmax(-1)[mask], exp.completion_ids[mask])  # greedy, token by token
    hf = logits.log_softmax(-1).gather(-1, exp.completion_ids.unsqueeze(-1)).squeeze(-1)
    assert (hf - exp.behaviour_logprobs)[mask].abs().max().item() < ATOL
    return exp


@pytest.mark.parametrize("mode", list(MODES))
def test_greedy_tokens_and_logprobs_match_after_syncs(mode, engine, warm_start_dir, arithmetic_rows):
    module = make_module(warm_start_dir, **MODES[mode])
    prompts = [row["prompt"] for row in arithmetic_rows[:32]]
    engine.load_weights(policy_weights(module.policy), 0)
    before = greedy_parity(engine, module, prompts)  # step 0
    ids = module.tokenizer(prompts)["input_ids"]
    hf = HFGenerateEngine(module.policy, task.EOS_ID, task.PAD_ID).generate(ids, GREEDY, 0)
    assert hf.completion_ids == engine.generate(ids, GREEDY, 0).completion_ids
    data = PromptDataModule(arithmetic_rows, batch_size=4)
    quiet_trainer(max_steps=3, callbacks=[VLLMRollout(engine=engine)]).fit(module, datamodule=data)
    assert module.policy_version == engine.policy_version == 3
    after = greedy_parity(engine, module, prompts)  # after three optimizer steps and syncs
    assert not torch.allclose(before.behaviour_logprobs, after.behaviour_logprobs, atol=1e-3)  # weights moved


class MismatchProbe(RLCallback):
    """Per rollout: (policy step, engine step, max |old - behaviour|, the largest change the
    module's correction makes to a row's loss: `correction_in_loss`)."""

    def __init__(self):
        self.rows = []

    def setup(self, trainer, pl_module, stage):
        super().setup(trainer, pl_module, stage)
        pl_module.request(old_logprobs=True)  # read before the loss: ask the module to recompute them

    def on_before_loss(self, trainer, module, exp):
        mask = module.loss_mask(exp)
        diff = ((exp.old_logprobs - exp.behaviour_logprobs).abs() * mask).max().item()
        self.rows.append((module.policy_version, exp.policy_version, diff, correction_in_loss(module, exp)))


def _fit_with_probe(engine, module, rows, sync_every, steps):
    probe = MismatchProbe()
    trainer = quiet_trainer(max_steps=steps, callbacks=[VLLMRollout(engine=engine, sync_every=sync_every), probe])
    trainer.fit(module, datamodule=PromptDataModule(rows, batch_size=8))
    return probe.rows, trainer.callback_metrics


def test_sync_every_k_lags_and_the_correction_engages(engine, warm_start_dir, arithmetic_rows):
    module = make_module(warm_start_dir, lr=1e-3)
    rows, metrics = _fit_with_probe(engine, module, arithmetic_rows, sync_every=3, steps=6)
    assert [(r[0], r[1]) for r in rows] == [(0, 0), (1, 0), (2, 0), (3, 3), (4, 3), (5, 3)]
    for policy_step, engine_step, diff, weight_dev in rows:
        if policy_step == engine_step:
            assert diff < ATOL and weight_dev < ATOL
        else:  # stale behaviour log-probs: IS ratio != 1 and the token-TIS weights change the loss
            assert diff > 1e-3 and weight_dev > 1e-4
    assert abs(metrics["sampling/importance_sampling_ratio/max"].item() - 1) > 1e-3
    assert metrics["sampling/logp_diff/max"].item() > 1e-3


def test_sync_every_1_keeps_the_ratio_at_one(engine, warm_start_dir, arithmetic_rows):
    module = make_module(warm_start_dir, temperature=0.7, lr=1e-3)  # processed log-probs include T
    rows, metrics = _fit_with_probe(engine, module, arithmetic_rows, sync_every=1, steps=4)
    assert [(r[0], r[1]) for r in rows] == [(0, 0), (1, 1), (2, 2), (3, 3)]
    assert all(diff < ATOL for _, _, diff, _ in rows)
    assert abs(metrics["sampling/importance_sampling_ratio/min"].item() - 1) < ATOL
    assert abs(metrics["sampling/importance_sampling_ratio/max"].item() - 1) < ATOL


@pytest.mark.parametrize("sync_every", [1, 3])
def test_single_pass_measures_the_mismatch_in_the_loss_without_an_extra_forward(engine, warm_start_dir,
                                                                                 arithmetic_rows, sync_every):
    module = make_module(warm_start_dir, temperature=0.7, lr=1e-3)
    grad_enabled = []  # per decoder forward: both head paths (gradient in the forward pass, recompute) run one per loss
    module.policy.get_decoder().register_forward_hook(lambda *_: grad_enabled.append(torch.is_grad_enabled()))
    trainer = quiet_trainer(max_steps=3, callbacks=[VLLMRollout(engine=engine, sync_every=sync_every)])
    trainer.fit(module, datamodule=PromptDataModule(arithmetic_rows, batch_size=8))
    # One policy forward per step, the loss's own; the one without gradients is the parity probe's
    # greedy prompt at the fit's start: no π_old forward.
    assert grad_enabled == [False, True, True, True] and not module.use_reference
    deviation = abs(trainer.callback_metrics["sampling/importance_sampling_ratio/max"].item() - 1)
    # sync_every=3: the last step's rollout came from the step-0 weights, two updates behind
    assert deviation < ATOL if sync_every == 1 else deviation > 1e-3


def test_repetition_penalty_and_min_p_match_the_hf_engine(engine, warm_start_dir, arithmetic_rows):
    """Both engines apply CTRL's penalty to prompt and completion tokens before the temperature
    (the HF engine skips its left padding, which vLLM never sees) and min-p after it; greedy
    tokens and behaviour log-probs (vLLM's processed ones, generate's processed scores) agree.
    ``min_p=1`` at T = 1 keeps the argmax alone: greedy tokens, log-probs 0."""
    module = make_module(warm_start_dir)
    engine.load_weights(policy_weights(module.policy), 0)
    prompts = [row["prompt"] for row in arithmetic_rows[:24]] + ["7=", "5+6=", "1+1=", "99+9="]
    ids = module.tokenizer(prompts)["input_ids"]
    hf = HFGenerateEngine(module.policy, task.EOS_ID, task.PAD_ID, return_logprobs=True)
    penalised = SamplingConfig(max_new_tokens=4, temperature=0.0, max_prompt_length=8, repetition_penalty=3.0)
    only_max = SamplingConfig(max_new_tokens=4, temperature=1.0, max_prompt_length=8, min_p=1.0)
    for config in (penalised, only_max):
        a, b = hf.generate(ids, config, 0), engine.generate(ids, config, 0)
        assert a.completion_ids == b.completion_ids
        for x, y in zip(a.logprobs, b.logprobs):
            assert max(abs(u - v) for u, v in zip(x, y)) < ATOL
    plain = engine.generate(ids, GREEDY, 0).completion_ids
    assert engine.generate(ids, penalised, 0).completion_ids != plain  # the penalty changed some answers
    only = engine.generate(ids, only_max, 0)
    assert only.completion_ids == plain and all(lp == 0.0 for row in only.logprobs for lp in row)
