"""Dropout is off by default (TRL's ``disable_dropout``), the policy trains in train mode, and
Lightning has no eval-mode modules to warn about."""
import warnings

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import tiny_task as task
from conftest import quiet_trainer
from lightning_rlpt import PromptDataModule, RLCallback, RLModule

GEN = dict(max_new_tokens=4, max_prompt_length=8)


@pytest.fixture(scope="module")
def dropout_dir(tmp_path_factory):
    """A tiny Llama whose attention dropout is 0.5, so dropout is visible in every forward."""
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=15, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, head_dim=64, max_position_embeddings=64,
                         attention_dropout=0.5, bos_token_id=task.BOS_ID, eos_token_id=task.EOS_ID,
                         pad_token_id=task.PAD_ID, attn_implementation="eager")
    path = str(tmp_path_factory.mktemp("dropout"))
    LlamaForCausalLM(config).save_pretrained(path)
    task.build_tokenizer().save_pretrained(path)
    return path


def _logprobs(module, model):
    ids = torch.tensor([[task.BOS_ID, 4, 5, 13, 6, 7, 14, 8, 9]])
    return module._logprobs(model, _Exp(ids))[0]


class _Exp:
    def __init__(self, ids):
        self.input_ids, self.attention_mask = ids, torch.ones_like(ids)
        self.completion_ids = ids[:, -3:]


def test_fit_trains_in_train_mode_without_the_eval_mode_warning(warm_start_dir, arithmetic_rows):
    modes = []

    class Mode(RLCallback):
        def on_before_loss(self, trainer, module, minibatch):
            modes.append(module.policy.training)

    module = RLModule(warm_start_dir, reward_funcs=[task.exact_answer], group_size=2, generation=GEN, kl_coef=0.05)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet_trainer(max_steps=1, callbacks=[Mode()]).fit(module, datamodule=PromptDataModule(arithmetic_rows, batch_size=2))
    assert modes == [True]
    eval_mode = [str(w.message) for w in caught if "eval mode" in str(w.message)]
    assert not eval_mode, eval_mode


def test_disable_dropout_makes_train_mode_deterministic(dropout_dir):
    module = RLModule(dropout_dir, reward_funcs=[task.exact_answer], group_size=2, kl_coef=0.05)
    assert module.policy.training and module.policy.config.attention_dropout == 0.0
    torch.manual_seed(1)
    a = _logprobs(module, module.policy)
    b = _logprobs(module, module.policy)
    assert torch.equal(a, b)


def test_kept_dropout_is_active_in_training_but_not_in_the_reference(dropout_dir):
    module = RLModule(dropout_dir, reward_funcs=[task.exact_answer], group_size=2, kl_coef=0.05, disable_dropout=False)
    from lightning_rlpt.model.loading import reference_context
    torch.manual_seed(1)
    assert not torch.equal(_logprobs(module, module.policy), _logprobs(module, module.policy))  # dropout on
    with reference_context(module.policy, module.reference) as ref:
        r1, r2 = _logprobs(module, ref), _logprobs(module, ref)
    assert torch.equal(r1, r2)  # the reference is deterministic
    assert module.reference.training  # and back in train mode after its forward
