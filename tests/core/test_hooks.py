"""The RL hook protocol: order, what each hook sees, and that edits reach the loss."""
import pytest
import torch

import tiny_task as task
from conftest import quiet_trainer
from lightning_rlpt import Experience, PromptDataModule, RLCallback, RLModule

GEN = dict(max_new_tokens=4, max_prompt_length=8)


class Recorder(RLCallback):
    """Records (name, hook, what was set) at each RL moment."""

    def __init__(self, name, log):
        self.name, self.events = name, log

    def on_rollout_end(self, trainer, module, experience):
        self.events.append((self.name, "on_rollout_end", experience.rewards is None))

    def on_rewards_computed(self, trainer, module, experience):
        self.events.append((self.name, "on_rewards_computed", experience.advantages is None))

    def on_advantages_computed(self, trainer, module, experience):
        self.events.append((self.name, "on_advantages_computed", experience.advantages is not None))

    def on_before_loss(self, trainer, module, minibatch):
        self.events.append((self.name, "on_before_loss", len(minibatch)))


def _fit(module, callbacks, rows, steps=1, batch_size=2):
    quiet_trainer(max_steps=steps, callbacks=callbacks).fit(module, datamodule=PromptDataModule(rows, batch_size=batch_size))


def test_hooks_run_in_documented_order_for_each_callback_in_trainer_order(warm_start_dir, arithmetic_rows):
    log = []
    module = RLModule(warm_start_dir, reward_funcs=[task.exact_answer], group_size=2, generation=GEN,
                      updates_per_rollout=2, minibatch_size=2)
    _fit(module, [Recorder("b", log), Recorder("a", log)], arithmetic_rows, steps=4)
    hooks = [(n, h) for n, h, _ in log]
    assert hooks == [("b", "on_rollout_end"), ("a", "on_rollout_end"),
                     ("b", "on_rewards_computed"), ("a", "on_rewards_computed"),
                     ("b", "on_advantages_computed"), ("a", "on_advantages_computed")] + \
                    [(n, "on_before_loss") for _ in range(4) for n in ("b", "a")]
    assert all(flag for n, h, flag in log if h != "on_before_loss")
    assert [flag for n, h, flag in log if h == "on_before_loss"] == [2] * 8  # 4 rows / mini-batches of 2


class ZeroWeights(RLCallback):
    def on_advantages_computed(self, trainer, module, experience):
        experience.sample_weights = torch.zeros(len(experience))


class Filter(RLCallback):
    """Keeps only the first group, as a dynamic filter would."""

    def on_rewards_computed(self, trainer, module, experience):
        return experience.select_groups([0])


def token_sum(prompts, completions, completion_ids, **_):
    """A reward that differs within almost every group (so advantages are not all zero)."""
    return [float(sum(ids)) for ids in completion_ids]


def _spread_reward_module(warm_start_dir):
    return RLModule(warm_start_dir, reward_funcs=[token_sum],
                    group_size=4, generation=GEN, lr=1e-2, kl_coef=0.0)


def test_sample_weights_reach_the_loss(warm_start_dir, arithmetic_rows):
    moved = []
    for callbacks in ([], [ZeroWeights()]):  # the control run proves the step would move the weights
        module = _spread_reward_module(warm_start_dir)
        before = {k: v.clone() for k, v in module.policy.state_dict().items()}
        _fit(module, callbacks, arithmetic_rows, steps=2)
        moved.append(any(not torch.equal(before[k], v) for k, v in module.policy.state_dict().items()))
    assert moved == [True, False]  # zero sample weights: no update at all


def test_returned_experience_replaces_the_input(warm_start_dir, arithmetic_rows):
    sizes = []

    class Size(RLCallback):
        def on_advantages_computed(self, trainer, module, experience):
            sizes.append((len(experience), experience.group_ids.tolist()))

    module = RLModule(warm_start_dir, reward_funcs=[task.exact_answer], group_size=2, generation=GEN)
    _fit(module, [Filter(), Size()], arithmetic_rows, steps=1, batch_size=3)
    assert sizes == [(2, [0, 0])]


class SetKL(RLCallback):
    def on_before_loss(self, trainer, module, minibatch):
        module.knobs.kl_coef = 0.5


def test_knobs_moved_in_on_before_loss_are_used(warm_start_dir, arithmetic_rows):
    """A KL coefficient set in on_before_loss trains exactly like the same coefficient given to the
    constructor, and unlike the constructor's own value (so the knob reached the loss)."""
    def weights(kl_coef, callbacks):
        torch.manual_seed(0)
        # A token-id-sum reward has spread in every group, so step 1 moves the policy off the
        # reference and the KL term (zero gradient while they are equal) shapes step 2.
        module = RLModule(warm_start_dir, reward_funcs=[token_sum],
                          group_size=4, generation=GEN, lr=1e-2, kl_coef=kl_coef, reference=True, seed=1)
        _fit(module, callbacks, arithmetic_rows, steps=2)
        return module.policy.state_dict()

    moved, built, plain = weights(0.0, [SetKL()]), weights(0.5, []), weights(0.0, [])
    assert all(torch.equal(moved[k], built[k]) for k in moved)
    assert any(not torch.equal(moved[k], plain[k]) for k in moved)


def test_a_hook_returning_something_else_is_an_error(warm_start_dir, arithmetic_rows):
    class Bad(RLCallback):
        def on_rollout_end(self, trainer, module, experience):
            return {"rewards": 1}

    module = RLModule(warm_start_dir, reward_funcs=[task.exact_answer], group_size=2, generation=GEN)
    with pytest.raises(TypeError, match="Bad.on_rollout_end returned dict; return an Experience or None"):
        _fit(module, [Bad()], arithmetic_rows)


def test_select_groups_keeps_whole_groups():
    n, g = 6, 2
    exp = Experience(prompt_ids=torch.arange(n)[:, None], prompt_mask=torch.ones(n, 1), completion_ids=torch.arange(n)[:, None],
                     completion_mask=torch.ones(n, 1), group_ids=torch.arange(3).repeat_interleave(2), group_size=g,
                     prompts=list("aabbcc"), completions=list("uvwxyz"), columns={"answer": list("112233")},
                     rewards=torch.arange(n).float())
    out = exp.select_groups([2, 0])
    assert out.prompts == list("ccaa") and out.completions == list("yzuv") and out.columns["answer"] == list("3311")
    assert out.rewards.tolist() == [4, 5, 0, 1] and out.group_ids.tolist() == [0, 0, 1, 1]
