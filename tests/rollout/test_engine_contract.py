"""The rollout engine contract refuses bad engines when fitting starts, naming what is wrong
(`lightning_rlpt.rollout.contract`): a missing attribute or ``sync_weights`` (engines installed on
``module.rollout_engine`` directly and through an `EngineCallback`), a weight sync that never
lands, a version that runs ahead of the trainer, running ahead without ``can_run_ahead``, and a
bad ``max_staleness``. Each refusal comes before anything trains on the bad engine's rollouts."""
import pytest

import tiny_task as task
from conftest import quiet_trainer
from lightning_rlpt import HFGenerateEngine, PromptDataModule, RLModule
from lightning_rlpt.callbacks import EngineCallback
from lightning_rlpt.rollout import RolloutEngine, RolloutOutput


class Counting(HFGenerateEngine):
    """The HF engine, counting its rollouts and whether it was closed."""

    generated, closed = 0, False

    def generate(self, prompt_ids, sampling, seed):
        self.generated += 1
        return super().generate(prompt_ids, sampling, seed)

    def close(self):
        self.closed = True


class Forgetful(Counting):
    """Receives the weights but never records their version: a sync that silently did not land."""

    def sync_weights(self, weights, version, force=False):
        pass


class Ahead(Counting):
    """Holds the version it was sent but reports one past it for its rollouts (a counter off by one)."""

    held = 0
    held_version = property(lambda self: self.held)

    def sync_weights(self, weights, version, force=False):
        self.held, self.policy_version = version, version + 1


class Overcounting(Counting):
    """Records one step past the version it was sent, held weights included (the base's held_version)."""

    def sync_weights(self, weights, version, force=False):
        self.policy_version = version + 1


class Duck:
    """An engine that does not subclass RolloutEngine: what it declares is all the module can read."""

    policy_version, held_version, phase, where, return_logprobs = 0, 0, "training", "start-up", False
    overrides, max_staleness, last_sync, can_run_ahead = {}, 0, {}, False
    generated, closed = 0, False

    def generate(self, prompt_ids, sampling, seed):
        self.generated += 1
        return RolloutOutput([[task.EOS_ID] for _ in prompt_ids])

    def sync_weights(self, weights, version, force=False):
        self.policy_version = version

    def close(self):
        self.closed = True


class NoSync(Duck):
    """Declares every attribute but has no sync_weights."""

    max_model_len, sync_every, sync_weights = None, 1, None


class Installs(EngineCallback):
    """Installs ``make(module)``'s engine, as a user's engine callback does."""

    def __init__(self, make, **kwargs):
        super().__init__(**kwargs)
        self.make = make

    def setup(self, trainer, pl_module, stage):
        self.install(trainer, pl_module, self.make(pl_module))


def make_module(path):
    # parity_every=0: these tests count the engine's calls; the probe's own call is tested in test_parity_probe.py
    return RLModule(path, reward_funcs=[task.exact_answer], group_size=2, kl_coef=0.0, lr=1e-3, parity_every=0,
                    generation=dict(max_new_tokens=4, temperature=1.0, max_prompt_length=8))


def hf(cls, **attributes):
    """``module -> cls`` built on the module's policy, with ``attributes`` set."""
    def make(module):
        engine = cls(module.policy, task.EOS_ID, task.PAD_ID)
        engine.__dict__.update(attributes)
        return engine
    return make


def fit(module, rows, steps=1, engine=None, callback=None):
    """Fit with ``engine`` on ``module.rollout_engine`` directly, or installed by ``callback``."""
    if engine is not None:
        module.rollout_engine = engine
    trainer = quiet_trainer(max_steps=steps, callbacks=[callback] if callback else [])
    trainer.fit(module, datamodule=PromptDataModule(rows, batch_size=2))


@pytest.mark.parametrize("path", ["module", "callback"])
@pytest.mark.parametrize("engine, match", [
    (Duck, r"the rollout engine Duck lacks max_model_len, sync_every, which the module and callbacks read\. "
           r"Subclass lightning_rlpt\.rollout\.RolloutEngine"),
    (NoSync, r"the rollout engine NoSync defines no sync_weights\(weights, version, force=False\): it would sample "
             r"from stale weights"),
])
def test_a_duck_typed_engine_lacking_part_of_the_contract_is_refused_at_fit_start(warm_start_dir, arithmetic_rows,
                                                                                   path, engine, match):
    module, duck = make_module(warm_start_dir), engine()
    with pytest.raises(TypeError, match=match):
        if path == "module":
            fit(module, arithmetic_rows, engine=duck)
        else:
            fit(module, arithmetic_rows, callback=Installs(lambda _: duck))
    assert duck.generated == 0 and module.policy_version == 0
    if path == "callback":  # installed, refused, closed and replaced by the module's previous engine (none)
        assert duck.closed and module.rollout_engine is None


def test_a_subclass_without_sync_weights_cannot_be_built():
    class GenerateOnly(RolloutEngine):
        def generate(self, prompt_ids, sampling, seed):
            return RolloutOutput([[] for _ in prompt_ids])

    with pytest.raises(TypeError, match=r"abstract method.*\bsync_weights\b"):
        GenerateOnly()


def test_a_sync_that_never_lands_is_refused_when_the_lag_reaches_sync_every(warm_start_dir, arithmetic_rows):
    """sync_every=2: steps 0 and 1 may sample from step 0's weights; step 2 may not, and its
    rollout is refused before it is generated, so nothing trains on it."""
    module = make_module(warm_start_dir)
    engine = hf(Forgetful, sync_every=2)(module)
    with pytest.raises(RuntimeError, match=r"the rollout engine Forgetful holds step 0's weights at global step 2, "
                                           r"but the policy is at step 2 with sync_every=2: a weight sync was "
                                           r"skipped or failed"):
        fit(module, arithmetic_rows, steps=4, engine=engine)
    assert engine.generated == 2 and module.policy_version == 2


def test_a_version_running_ahead_of_the_trainer_is_refused(warm_start_dir, arithmetic_rows):
    module = make_module(warm_start_dir)
    callback = Installs(hf(Ahead))
    with pytest.raises(RuntimeError, match=r"a rollout claims step 2's weights while the policy is at step 1: the "
                                           r"engine's policy_version runs ahead of the weights it was sent"):
        fit(module, arithmetic_rows, steps=3, callback=callback)
    assert module.policy_version == 1  # the step-1 rollout was refused before its update


def test_held_weights_ahead_of_the_trainer_are_refused_before_the_rollout(warm_start_dir, arithmetic_rows):
    module = make_module(warm_start_dir)
    engine = hf(Overcounting)(module)
    with pytest.raises(RuntimeError, match=r"the rollout engine Overcounting holds step 2's weights at global step 1, "
                                           r"which the trainer \(at step 1\) has not reached: its policy_version "
                                           r"runs ahead"):
        fit(module, arithmetic_rows, steps=3, engine=engine)
    assert engine.generated == 1 and module.policy_version == 1


def test_running_ahead_needs_an_engine_that_declares_can_run_ahead(warm_start_dir, arithmetic_rows):
    module, built = make_module(warm_start_dir), []
    make = hf(Counting)
    callback = Installs(lambda m: built.append(make(m)) or built[-1], max_staleness=1)
    with pytest.raises(ValueError, match=r"max_staleness=1 needs an engine that can generate on another worker .* "
                                         r"Counting does not declare can_run_ahead .* Use max_staleness=0 with it"):
        fit(module, arithmetic_rows, callback=callback)
    (engine,) = built
    assert engine.generated == 0 and engine.closed and module.rollout_engine is None


def test_running_ahead_of_an_engine_that_syncs_every_few_steps_is_refused_at_install(warm_start_dir,
                                                                                     arithmetic_rows):
    """A user's callback does not know its engine's ``sync_every`` before it builds it: the one
    staleness check runs at install, with the engine's value, and closes the engine."""
    module, built = make_module(warm_start_dir), []
    make = hf(Counting, can_run_ahead=True, sync_every=2)
    callback = Installs(lambda m: built.append(make(m)) or built[-1], max_staleness=1)
    with pytest.raises(ValueError, match=r"max_staleness=1 with sync_every=2: both make rollouts stale"):
        fit(module, arithmetic_rows, callback=callback)
    (engine,) = built
    assert engine.generated == 0 and engine.closed and module.rollout_engine is None


@pytest.mark.parametrize("value", [-1, 1.5, True])
def test_a_bad_max_staleness_is_refused_at_construction(value):
    with pytest.raises(ValueError, match=rf"max_staleness must be an int >= 0 \(got {value}\)"):
        EngineCallback(max_staleness=value)
