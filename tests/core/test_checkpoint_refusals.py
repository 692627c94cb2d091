"""Issue 23 item 12: a fit refuses to resume from the wrong checkpoint (`lightning_rlpt.checkpoint`):
one without the module's state, one trained with other settings (unless overridden by name),
and one with a corrupted tensor."""
import os
import warnings

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

import tiny_task as task
from conftest import quiet_trainer
from lightning_rlpt import PromptDataModule, RLModule, seeding
from lightning_rlpt.checkpoint import ALGORITHM_KEYS


def make_module(warm_start_dir, **overrides):
    settings = dict(reward_funcs=[task.exact_answer], group_size=4, kl_coef=0.0, lr=1e-3, seed=5,
                    generation=dict(max_new_tokens=4, max_prompt_length=8))
    return RLModule(warm_start_dir, **{**settings, **overrides})


def fit(module, rows, steps: int, ckpt_path=None, dirpath=None):
    callbacks = [ModelCheckpoint(dirpath=dirpath, filename="ckpt", every_n_train_steps=1)] if dirpath else []
    trainer = quiet_trainer(max_steps=steps, callbacks=callbacks, enable_checkpointing=bool(dirpath))
    trainer.fit(module, datamodule=PromptDataModule(rows, batch_size=2, seed=7), ckpt_path=ckpt_path)
    return trainer


@pytest.fixture(scope="module")
def checkpoint(warm_start_dir, arithmetic_rows, tmp_path_factory) -> str:
    """One step of a fit (group_size 4, grpo, seed 5), checkpointed by ModelCheckpoint."""
    out = tmp_path_factory.mktemp("ckpt")
    fit(make_module(warm_start_dir), arithmetic_rows, 1, dirpath=str(out))
    return str(out / "ckpt.ckpt")


def rewrite(checkpoint: str, path, change) -> str:
    """A copy of ``checkpoint`` edited on purpose (so without the whole-state checksums, as the
    refusal of an edited checkpoint says to do)."""
    state = torch.load(checkpoint, weights_only=False)
    state["lightning_rlpt"].pop("state_checksums")
    change(state)
    torch.save(state, path)
    return str(path)


def test_checkpoint_records_every_compared_setting(checkpoint):
    state = torch.load(checkpoint, weights_only=False)["lightning_rlpt"]
    assert sorted(state["algorithm"]) == sorted(ALGORITHM_KEYS)
    assert state["algorithm"]["group_size"] == 4 and state["rollout_draws"] == 1
    assert set(state["checksums"]) == set(torch.load(checkpoint, weights_only=False)["state_dict"])


def test_a_checkpoint_without_the_module_state_is_refused(checkpoint, warm_start_dir, arithmetic_rows, tmp_path):
    path = rewrite(checkpoint, tmp_path / "bare.ckpt", lambda s: s.pop("lightning_rlpt"))
    with pytest.raises(ValueError, match=r"has no 'lightning_rlpt' state .*policy version at 0.*load_state_dict"):
        fit(make_module(warm_start_dir), arithmetic_rows, 2, ckpt_path=path)


def test_other_settings_are_refused_naming_each_unless_overridden(checkpoint, warm_start_dir, arithmetic_rows):
    changed = dict(group_size=2, advantage="rloo")
    with pytest.raises(ValueError) as err:
        fit(make_module(warm_start_dir, **changed), arithmetic_rows, 2, ckpt_path=checkpoint)
    message = str(err.value)
    assert "advantage: saved 'grpo', now 'rloo'" in message and "group_size: saved 4, now 2" in message
    assert "resume_overrides=('advantage', 'group_size')" in message
    module = make_module(warm_start_dir, resume_overrides=("group_size", "advantage"), **changed)
    fit(module, arithmetic_rows, 2, ckpt_path=checkpoint)  # overridden on purpose: the run goes on
    assert module.policy_version == 2 and module.rollout_draws == 2


def test_unknown_resume_override_is_refused_at_construction(warm_start_dir):
    with pytest.raises(ValueError, match=r"resume_overrides names \['group_sise'\].*group_size"):
        make_module(warm_start_dir, resume_overrides=("group_sise",))


def flip_4kib_inside(checkpoint: str, path, name: str) -> str:
    """Copy ``checkpoint`` with 4 KiB of ``name``'s bytes inverted in the file itself."""
    tensor = torch.load(checkpoint, weights_only=False)["state_dict"][name]
    data, raw = open(checkpoint, "rb").read(), tensor.contiguous().view(torch.uint8).numpy().tobytes()
    assert len(raw) >= 8192 and data.count(raw[:256]) == 1, "the tensor's bytes are not where the test looks"
    start = data.index(raw[:256]) + 1024
    corrupted = data[:start] + bytes(b ^ 0xFF for b in data[start:start + 4096]) + data[start + 4096:]
    with open(path, "wb") as f:
        f.write(corrupted)
    assert not torch.equal(torch.load(path, weights_only=False)["state_dict"][name], tensor)  # it loads, silently
    return str(path)


def test_a_corrupted_tensor_is_refused_by_name(checkpoint, warm_start_dir, arithmetic_rows, tmp_path):
    name = "policy.model.layers.1.mlp.down_proj.weight"
    path = flip_4kib_inside(checkpoint, tmp_path / "corrupt.ckpt", name)
    with pytest.raises(ValueError, match=rf"corrupt.ckpt' is corrupted: .*tensor storage.*changed part\(s\): \['{name}'\]"):
        fit(make_module(warm_start_dir), arithmetic_rows, 2, ckpt_path=path)


def test_a_checkpoint_from_before_the_checks_resumes_with_a_warning(checkpoint, warm_start_dir, arithmetic_rows,
                                                                     tmp_path):
    """Written before the checks existed: its RNG state instead of the draw count, no settings, no checksums."""
    def older(state):
        ours = state["lightning_rlpt"]
        for key in ("rollout_draws", "algorithm", "checksums"):
            ours.pop(key)
        ours["rng"] = torch.Generator().get_state()

    path = rewrite(checkpoint, tmp_path / "older.ckpt", older)
    module = make_module(warm_start_dir, group_size=2)  # not compared: the checkpoint records no settings
    with pytest.warns(UserWarning, match=r"older lightning_rlpt and lacks \['rollout_draws', 'algorithm', 'checksums'\]"):
        fit(module, arithmetic_rows, 2, ckpt_path=path)
    assert module.policy_version == 2 and module.rollout_draws == 2  # the stream went on from policy_version 1


def test_a_checkpoint_from_before_the_seeding_module_resumes_warning_that_draws_change(checkpoint, warm_start_dir,
                                                                                       arithmetic_rows, tmp_path):
    """Seeds were derived four ways before `lightning_rlpt.seeding`: such a run resumes exactly but
    for its draws, and says so; a checkpoint of this version resumes without the warning."""
    assert torch.load(checkpoint, weights_only=False)["lightning_rlpt"]["seeding"] == seeding.VERSION
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit(make_module(warm_start_dir), arithmetic_rows, 2, ckpt_path=checkpoint)
    assert not [w for w in caught if "seed derivation" in str(w.message)]
    path = rewrite(checkpoint, tmp_path / "old_seeds.ckpt", lambda s: s["lightning_rlpt"].pop("seeding"))
    module = make_module(warm_start_dir)
    with pytest.warns(UserWarning, match=r"seed derivation 1, this version uses 2 .*samples other completions"):
        fit(module, arithmetic_rows, 2, ckpt_path=path)
    assert module.policy_version == 2 and module.rollout_draws == 2


def before_this_version(max_prompt_length: int):
    """A checkpoint as lightning_rlpt wrote it before ``generation_kwargs``, ``entropy_coef`` and
    ``multi_objective_aggregation`` existed (the review's finding 3): the keys absent, and
    ``max_prompt_length`` saved explicitly (512 was its default then)."""
    def change(state):
        algorithm = state["lightning_rlpt"]["algorithm"]
        algorithm.pop("entropy_coef"), algorithm.pop("multi_objective_aggregation")
        algorithm["generation"].pop("generation_kwargs")
        algorithm["generation"]["max_prompt_length"] = max_prompt_length
    return change


def test_an_older_checkpoint_resumes_under_the_settings_it_was_trained_with(checkpoint, warm_start_dir,
                                                                           arithmetic_rows, tmp_path):
    path = rewrite(checkpoint, tmp_path / "old.ckpt", before_this_version(8))
    module = make_module(warm_start_dir)  # the same settings: the missing keys are their old values
    fit(module, arithmetic_rows, 2, ckpt_path=path)
    assert module.policy_version == 2


def test_an_older_checkpoint_refuses_a_real_difference_naming_the_option(checkpoint, warm_start_dir,
                                                                        arithmetic_rows, tmp_path):
    path = rewrite(checkpoint, tmp_path / "old512.ckpt", before_this_version(512))
    module = make_module(warm_start_dir, generation=dict(max_new_tokens=4), entropy_coef=0.1)
    with pytest.raises(ValueError) as err:  # 512 was the old default, None is today's: a real change
        fit(module, arithmetic_rows, 2, ckpt_path=path)
    message = str(err.value)
    assert "generation['max_prompt_length']: saved 512, now None" in message
    assert "entropy_coef: saved 0.0, now 0.1" in message  # absent = the 0.0 it trained with
    assert "generation_kwargs" not in message and "max_new_tokens" not in message
    assert "entropy_coef=0.0, generation=dict(max_prompt_length=512)" in message
    assert "resume_overrides=('generation', 'entropy_coef')" in message or \
        "resume_overrides=('entropy_coef', 'generation')" in message
