"""Reward models in ``reward_funcs``: scores as computed by hand and by the model's own forward,
formatting with the reward model's tokenizer and chat template, batching, freezing, placement,
checkpoints, a policy that learns what the reward model prefers, and every bad input."""
import os

import lightning as L
import pytest
import torch
from conftest import quiet_trainer
from reward_models import (PREFERENCE, VOCAB, build_prefers_seven, build_reward_model, build_reward_tokenizer,
                           save)
from resume_utils import assert_same_run, straight_and_resumed

import tiny_task as task
from lightning_rlpt import PromptDataModule, RewardFunctions, RewardModel, RLModule
from lightning_rlpt.model.export import export_checkpoint
from lightning_rlpt.rewards.model import looks_like_reward_model

PROMPTS = ["12+35=", "40+7=", "9+9=", "1+1="]
COMPLETIONS = ["47", "47", "18", ""]


@pytest.fixture(scope="module")
def random_rm(tmp_path_factory) -> str:
    return save(build_reward_model(seed=3), tmp_path_factory.mktemp("rm_random"))


@pytest.fixture(scope="module")
def seven_rm(tmp_path_factory) -> str:
    return save(build_prefers_seven(), tmp_path_factory.mktemp("prefers_seven"))


def own_forward(path: str, texts: list[str]) -> list[float]:
    """The saved model's logit 0 on each text alone (no padding), tokenized without special tokens."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model, tok = AutoModelForSequenceClassification.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    with torch.no_grad():
        return [model(**tok(t, add_special_tokens=False, return_tensors="pt")).logits[0, 0].item() for t in texts]


# ---------------------------------------------------------------- scores and formatting
def test_hand_set_model_scores_what_was_computed_by_hand(seven_rm):
    scores = RewardModel(seven_rm)(PROMPTS, ["47", "17", "18", "7"])
    assert scores == pytest.approx([PREFERENCE, PREFERENCE, 0.0, PREFERENCE], abs=1e-5)
    assert RewardModel(seven_rm)(PROMPTS, COMPLETIONS)[2:] == [0.0, 0.0]  # "…18" and "1+1=" end elsewhere


def test_scores_are_the_models_own_forward_on_prompt_plus_completion(random_rm):
    rm = RewardModel(random_rm)
    texts = [p + c for p, c in zip(PROMPTS, COMPLETIONS)]
    assert rm.texts(PROMPTS, COMPLETIONS) == texts
    assert rm(PROMPTS, COMPLETIONS) == pytest.approx(own_forward(random_rm, texts), abs=1e-5)
    assert len(set(rm(PROMPTS, COMPLETIONS))) == 4  # the random model tells every text apart


@pytest.mark.parametrize("batch_size", [1, 3])
def test_chunks_score_like_one_batch(random_rm, batch_size):
    """Rows of different lengths padded on the right: the model reads the last real token, so
    chunking (and padding) leaves every score as it is."""
    prompts, completions = PROMPTS * 3, ["47", "123", "", "4"] * 3
    one = RewardModel(random_rm, batch_size=len(prompts))(prompts, completions)
    assert RewardModel(random_rm, batch_size=batch_size)(prompts, completions) == pytest.approx(one, abs=1e-5)


def test_conversational_prompts_go_through_the_reward_tokenizers_chat_template(random_rm):
    """The reward model sees its own template's text (markers the policy's tokenizer lacks)."""
    rm = RewardModel(random_rm, batch_size=8)
    seen = []
    hook = rm.model.register_forward_pre_hook(
        lambda _, args, kwargs: seen.extend(rm.tokenizer.decode(ids[m.bool()]) for ids, m in
                                            zip(kwargs["input_ids"], kwargs["attention_mask"])), with_kwargs=True)
    prompts = [[{"role": "user", "content": "12+35="}], [{"role": "user", "content": "1+1="}]]
    scores = rm(prompts, ["47", "2"])
    hook.remove()
    expected = ["<u>1+1=<e><a>2<e>", "<u>12+35=<e><a>47<e>"]  # sorted by length into the batch
    assert seen == expected
    assert rm.texts(prompts, ["47", "2"]) == expected[::-1]
    assert scores == pytest.approx(own_forward(random_rm, expected[::-1]), abs=1e-5)
    completions = [[{"role": "assistant", "content": "47"}], [{"role": "assistant", "content": "2"}]]
    assert rm.texts(prompts, completions) == expected[::-1]  # TRL's conversational completions too


def test_max_length_keeps_the_last_tokens(random_rm):
    rm = RewardModel(random_rm, max_length=4)
    assert rm(["12+35="], ["47"]) == pytest.approx(own_forward(random_rm, ["5=47"]), abs=1e-5)


def test_label_index_picks_the_logit(tmp_path):
    path = save(build_reward_model(seed=4, num_labels=3), tmp_path)
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(path)
    ids = build_reward_tokenizer()("12+35=47", add_special_tokens=False, return_tensors="pt")
    with torch.no_grad():
        logits = model(**ids).logits[0]
    assert RewardModel(path, label_index=2)(["12+35="], ["47"]) == pytest.approx([logits[2].item()], abs=1e-5)
    assert RewardModel(path, label_index="LABEL_1")(["12+35="], ["47"]) == pytest.approx([logits[1].item()], abs=1e-5)


# ---------------------------------------------------------------- how reward_funcs takes them
def test_reward_funcs_wrap_directories_and_modules_next_to_functions(random_rm):
    module = build_reward_model(seed=3)
    rf = RewardFunctions([random_rm, RewardModel(module, tokenizer=build_reward_tokenizer()), task.exact_answer])
    assert [type(f).__name__ for f in rf.funcs] == ["RewardModel", "RewardModel", "function"]
    assert rf.names == [os.path.basename(random_rm), "LlamaForSequenceClassification", "exact_answer"]
    scores, _ = rf(PROMPTS, COMPLETIONS, {"answer": ["47", "47", "18", "2"]},
                   completion_ids=[[7, 11, 2], [7, 11, 2], [4, 11, 2], [2]])
    assert torch.allclose(scores[:, 0], scores[:, 1])  # the same weights, by path and by module
    assert scores[:, 2].tolist() == [1.0, 1.0, 1.0, 0.0]


@pytest.mark.parametrize("spec,expected", [
    ("org/reward-model", True), ("task:exact_answer", False), ("pkg.module.fn", False),
    ("path/to/file.py:fn", False), ("rewards/file.py", False), ("http://127.0.0.1:8000/score", False)])
def test_which_strings_name_reward_models(spec, expected):
    assert looks_like_reward_model(spec) is expected


def test_hub_id_goes_to_the_model_loader(monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # no network: fail fast
    with pytest.raises(OSError, match=r"cannot load reward model 'org/no-such-rm' with AutoModelForSequenceClass"):
        RewardFunctions(["org/no-such-rm"])


# ---------------------------------------------------------------- in a fit
def fit_module(policy_dir: str, reward: str, lr: float = 1e-3, group_size: int = 4) -> RLModule:
    return RLModule(policy_dir, reward_funcs=[reward], group_size=group_size, kl_coef=0.0, lr=lr, seed=0,
                    generation=dict(max_new_tokens=4, max_prompt_length=8))


class RecordRewards(L.Callback):
    def __init__(self):
        self.rewards = []

    def on_train_batch_end(self, trainer, *_):
        self.rewards.append(float(trainer.callback_metrics["reward"]))


def data(prompts_per_step: int = 4):
    train, _ = task.split_pairs()
    return PromptDataModule(task.rows(train[:256]), batch_size=prompts_per_step, seed=0)


def mean_reward_rise(policy_dir: str, reward: str, lr: float, steps: int = 12, k: int = 3) -> float:
    """Mean logged reward of the last ``k`` steps minus that of the first ``k`` (8 prompts × 8)."""
    record = RecordRewards()
    quiet_trainer(max_steps=steps, callbacks=[record]).fit(fit_module(policy_dir, reward, lr, group_size=8),
                                                           datamodule=data(8))
    r = record.rewards
    assert len(r) == steps
    return sum(r[-k:]) / k - sum(r[:k]) / k


def test_policy_learns_what_the_reward_model_prefers(llama_dir, seven_rm):
    """A random policy ends ~7% of its completions in "7"; trained against the hand-set model it
    ends most of them there (measured: 17% over the first 3 steps, 76% over the last 3). The same
    run at lr 1e-9 shows that sampling noise alone does not pass the margin (6% → 11%)."""
    assert mean_reward_rise(llama_dir, seven_rm, lr=1e-3) / PREFERENCE > 0.4
    assert abs(mean_reward_rise(llama_dir, seven_rm, lr=1e-9)) / PREFERENCE < 0.15


def test_reward_model_is_frozen_placed_and_outside_optimizer_and_checkpoint(llama_dir, seven_rm, tmp_path):
    module = fit_module(llama_dir, seven_rm)
    trainer = quiet_trainer(max_steps=2, default_root_dir=str(tmp_path), enable_checkpointing=True)
    trainer.fit(module, datamodule=data())
    rm = module.rewards.funcs[0]
    params = list(rm.model.parameters())
    assert not rm.model.training and not any(p.requires_grad for p in params)
    assert all(p.device == module.device for p in params)
    in_optimizer = {id(p) for g in trainer.optimizers[0].param_groups for p in g["params"]}
    assert not in_optimizer & {id(p) for p in params}
    assert all(k.startswith("policy.") for k in module.state_dict())  # kl_coef=0: no reference either
    ckpt_path = next(tmp_path.glob("**/*.ckpt"))
    ckpt = torch.load(ckpt_path, weights_only=False)
    assert set(ckpt["state_dict"]) == set(module.state_dict())
    out = export_checkpoint(str(ckpt_path), str(tmp_path / "export"))
    assert sorted(os.listdir(out)) == sorted(os.listdir(llama_dir))  # the policy's files, no reward model's


def test_fit_with_a_reward_model_resumes_exactly(llama_dir, seven_rm, tmp_path):
    straight, resumed = straight_and_resumed(tmp_path, lambda: fit_module(llama_dir, seven_rm), data, n=2)
    assert_same_run(straight, resumed)
    assert f"rewards/{os.path.basename(seven_rm)}/mean" in straight[0][0]


# ---------------------------------------------------------------- bad inputs, refused before any rollout
def test_more_than_one_label_without_label_index_is_refused(llama_dir, tmp_path):
    path = save(build_reward_model(num_labels=3), tmp_path)
    with pytest.raises(ValueError, match=r"has 3 labels .*RewardModel\(model, label_index=i\)"):
        fit_module(llama_dir, path)
    with pytest.raises(ValueError, match=r"label_index=3 is out of range .* pick 0..2"):
        RewardModel(path, label_index=3)
    with pytest.raises(ValueError, match=r"label_index='good' is not a label .*'LABEL_0'"):
        RewardModel(path, label_index="good")


def test_tokenizer_without_pad_token_is_refused(llama_dir, tmp_path):
    path = save(build_reward_model(), tmp_path, tokenizer=build_reward_tokenizer(pad=False))
    with pytest.raises(ValueError, match=r"tokenizer .* has no pad token.*tok.pad_token = tok.eos_token"):
        fit_module(llama_dir, path)


def test_module_without_tokenizer_is_refused():
    with pytest.raises(ValueError, match=r"given as a module without its tokenizer: pass RewardModel\(model, "
                                         r"tokenizer=tok\)"):
        RewardFunctions([build_reward_model()])


def test_causal_lm_is_refused(llama_dir):
    with pytest.raises(ValueError, match=r"has no weights for .*score.*LlamaForCausalLM.*head would be random"):
        RewardModel(llama_dir)
    with pytest.raises(TypeError, match=r"LlamaForCausalLM is not a sequence-classification model.*"
                                        r"AutoModelForSequenceClassification"):
        RewardModel(task.build_model(), tokenizer=build_reward_tokenizer())


def test_directory_without_config_is_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"has no config.json: pass the directory save_pretrained wrote"):
        RewardFunctions([str(tmp_path)])


def test_conversational_prompt_without_chat_template_names_the_fix(tmp_path):
    tok = build_reward_tokenizer()
    tok.chat_template = None
    rm = RewardModel(save(build_reward_model(), tmp_path, tokenizer=tok))
    with pytest.raises(ValueError, match=r"conversational prompt but its tokenizer has no chat template: set "
                                         r"tokenizer.chat_template"):
        rm([[{"role": "user", "content": "1+1="}]], ["2"])


def test_text_longer_than_the_model_names_max_length(random_rm):
    with pytest.raises(ValueError, match=r"text of 70 tokens, more than its max_position_embeddings=64: pass "
                                         r"RewardModel\(\.\.\., max_length=64\)"):
        RewardModel(random_rm)(["1" * 60], ["2" * 10])


def test_empty_text_is_refused(random_rm):
    with pytest.raises(ValueError, match=r"got an empty text .*no token to read a score at"):
        RewardModel(random_rm)([""], [""])



def test_command_line_config_names_reward_models_by_path_and_class_path(llama_dir, seven_rm, tmp_path):
    """A YAML ``reward_funcs`` list: a directory string and a ``class_path`` with options, beside a
    function; a 1-step fit logs each by name."""
    import json

    import yaml

    from lightning_rlpt.cli import main
    from resume_utils import read_rows

    train, _ = task.split_pairs()
    rows = tmp_path / "train.jsonl"
    rows.write_text("".join(json.dumps(r) + "\n" for r in task.rows(train[:8])))
    logger = {"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": str(tmp_path)}}
    with_options = {"class_path": "lightning_rlpt.RewardModel", "init_args": {"model": seven_rm, "batch_size": 1}}
    config = {
        "trainer": {"accelerator": "cpu", "devices": 1, "max_steps": 1, "log_every_n_steps": 1, "logger": logger,
                    "enable_progress_bar": False, "enable_checkpointing": False, "enable_model_summary": False,
                    "default_root_dir": str(tmp_path)},
        "model": {"model": llama_dir, "group_size": 2, "kl_coef": 0.0,
                  "generation": {"max_new_tokens": 4, "max_prompt_length": 8},
                  "reward_funcs": [seven_rm, with_options, "tiny_task:exact_answer"]},
        "data": {"data": str(rows), "batch_size": 2},
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    assert main(["fit", "--config", str(tmp_path / "config.yaml")]) == 0
    (metrics,) = read_rows(str(tmp_path)).values()
    name = os.path.basename(seven_rm)
    assert metrics[f"rewards/{name}/mean"] == metrics[f"rewards/{name}_1/mean"]
    assert "rewards/exact_answer/mean" in metrics
