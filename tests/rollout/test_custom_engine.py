"""A second rollout engine, written in this file against the documented contract alone
(`lightning_rlpt.rollout.RolloutEngine`, `lightning_rlpt.callbacks.EngineCallback`), with no
package change: it keeps its own copy of the policy, so the same class serves on-policy
(``max_staleness=0``), on a slower weight schedule (``sync_every=2``) and one batch ahead of
training (``max_staleness=1``, the `RolloutPipeline`), resumes exactly, and is closed and
replaced by the module's previous engine after fit, also when fit fails. Mirrors
tests/rollout/test_async_pipeline.py (the vLLM server engine) without a server."""
import threading

import pytest
import torch
from lightning.pytorch.loggers import CSVLogger
from transformers import AutoModelForCausalLM

import tiny_task as task
from conftest import quiet_trainer
from lightning_rlpt import HFGenerateEngine, PromptDataModule, RLCallback, RLModule
from lightning_rlpt.callbacks import EngineCallback
from lightning_rlpt.model.weights import policy_weights
from lightning_rlpt.rollout import RolloutEngine, RolloutOutput, SamplingConfig
from lightning_rlpt.rollout.sampling.per_row import request_seeds
from resume_utils import assert_same_run, read_rows, straight_and_resumed

STEPS = 4


class CopyEngine(RolloutEngine):
    """Samples from its own copy of the policy (so it may run while the trainer updates the policy).

    Each row draws from a ``torch.Generator`` seeded with the row's seed (`request_seeds`): a token
    at a time, softmax at the temperature, until EOS or ``max_new_tokens`` (the rows still running
    share one forward per token). Sampling settings it does not implement are refused rather than
    ignored.

    Args:
        config: the policy's model config (the copy is built from it, then loaded).
        weights: the policy's weights now (`lightning_rlpt.model.weights.policy_weights`).
        version: the optimizer step of those weights.
        eos_token_id: where a completion stops.
        sync_every: copy the weights every this many optimizer steps.
    """

    can_run_ahead = True  # generate reads only self.model, never the policy being trained
    return_logprobs = True

    def __init__(self, config, weights, version: int, eos_token_id: int, sync_every: int = 1):
        self.model = AutoModelForCausalLM.from_config(config).eval()
        self.eos_token_id, self.sync_every = eos_token_id, sync_every
        self.copies, self.calls, self.closed = 0, [], False  # calls: (phase, version, thread) of each generate
        self._load(weights, version)

    @torch.no_grad()
    def generate(self, prompt_ids: list[list[int]], sampling: SamplingConfig, seed) -> RolloutOutput:
        unsupported = [k for k, off in (("top_p", 1.0), ("top_k", 0), ("min_p", 0.0), ("repetition_penalty", 1.0))
                       if getattr(sampling, k) != off] + (["generation_kwargs"] if sampling.generation_kwargs else [])
        if unsupported:
            raise ValueError(f"CopyEngine samples from the plain softmax; it does not implement {unsupported}")
        self.calls.append((self.phase, self.policy_version, threading.current_thread().name))
        generators = [torch.Generator().manual_seed(s) for s in request_seeds(seed, len(prompt_ids))]
        tokens, logprobs = [[] for _ in prompt_ids], [[] for _ in prompt_ids]
        for _ in range(sampling.max_new_tokens):
            live = [i for i, row in enumerate(tokens) if self.eos_token_id not in row[-1:]]
            if not live:
                break
            logits = self._next_logits([list(prompt_ids[i]) + tokens[i] for i in live])
            for i, row_logits in zip(live, logits):  # each row draws with its own generator
                if sampling.temperature > 0:
                    logp = torch.log_softmax(row_logits / sampling.temperature, -1)
                    token = int(torch.multinomial(logp.exp(), 1, generator=generators[i]))
                else:  # greedy (validation may ask for it)
                    logp, token = torch.log_softmax(row_logits, -1), int(row_logits.argmax())
                tokens[i].append(token)
                logprobs[i].append(float(logp[token]))
        return RolloutOutput(tokens, logprobs)

    def _next_logits(self, rows: list[list[int]]) -> torch.Tensor:
        """``[rows, vocab]`` logits of the next token: one forward over the left-padded rows."""
        width = max(len(r) for r in rows)
        ids = torch.tensor([[0] * (width - len(r)) + r for r in rows])  # any pad id: the mask hides it
        mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
        positions = (mask.cumsum(-1) - 1).clamp(min=0)  # each row counts from its first real token
        return self.model(input_ids=ids, attention_mask=mask, position_ids=positions).logits[:, -1].float()

    def sync_weights(self, weights, version: int, force: bool = False) -> None:
        if force or version % self.sync_every == 0:
            self._load(weights, version)

    def _load(self, weights, version: int) -> None:
        # policy_weights yields every parameter under its checkpoint name (LoRA merged in): strict
        # catches a name this model does not have, or one it lacks.
        self.model.load_state_dict(dict(weights()), strict=True)
        self.policy_version, self.copies = version, self.copies + 1

    def close(self) -> None:
        self.model, self.closed = None, True


class CopyRollout(EngineCallback):
    """Installs a `CopyEngine` (``sync_every``; ``max_staleness`` and ``async_seed`` go to
    `EngineCallback`); ``engines`` keeps each one built, for the tests to inspect."""

    requires = (*EngineCallback.requires, "policy")
    engine_class = CopyEngine

    def __init__(self, sync_every: int = 1, **kwargs):
        super().__init__(**kwargs)
        self.sync_every, self.engines = sync_every, []

    def setup(self, trainer, pl_module, stage):
        policy = pl_module.policy
        engine = self.engine_class(policy.config, lambda: policy_weights(policy), pl_module.policy_version,
                                   pl_module.tokenizer.eos_token_id, self.sync_every)
        self.engines.append(engine)
        self.install(trainer, pl_module, engine)


class Versions(RLCallback):
    """Per batch: (the trainer's version, the version the batch was sampled with, the largest
    |behaviour log-prob - policy log-prob| over the batch's tokens before its update)."""

    def __init__(self, fail_at: int | None = None):
        self.rows, self.fail_at = [], fail_at

    def on_before_loss(self, trainer, module, experience):
        if trainer.global_step == self.fail_at:
            raise RuntimeError("a failure mid-fit")
        current, _ = module.policy_logprobs(experience)
        mask = experience.completion_mask.bool()
        gap = (current.detach() - experience.behaviour_logprobs)[mask].abs().max().item()
        self.rows.append((module.policy_version, experience.policy_version, gap))


def make_module(path, **kwargs):
    # parity_every=0: these tests count the engine's calls; the probe's own call is tested in test_parity_probe.py
    return RLModule(path, reward_funcs=[task.exact_answer], group_size=4, kl_coef=0.0, lr=1e-3, parity_every=0,
                    generation=dict(max_new_tokens=4, temperature=1.0, max_prompt_length=8), **kwargs)


def fit(path, rows, val_rows, callback, tmp_path, val_every):
    """STEPS steps, validating one batch of ``val_rows`` after every ``val_every`` training batches."""
    spy, module = Versions(), make_module(path)
    trainer = quiet_trainer(max_steps=STEPS, logger=CSVLogger(str(tmp_path), name="", version=""),
                            callbacks=[callback, spy], val_check_interval=val_every, limit_val_batches=1)
    trainer.fit(module, datamodule=PromptDataModule(rows, val_data=val_rows[:4], batch_size=4))
    return module, spy.rows, read_rows(str(tmp_path))


def by_phase(engine, phase):
    return [(version, thread) for p, version, thread in engine.calls if p == phase]


def test_the_engine_samples_each_row_from_its_seed_alone(warm_start_dir):
    """A row's completion depends on its prompt and seed only (`request_seeds` with one seed per
    row), not on the other rows of the call; settings the engine does not implement are refused."""
    module = make_module(warm_start_dir)
    engine = CopyEngine(module.policy.config, lambda: policy_weights(module.policy), 0, task.EOS_ID)
    prompts = [module.tokenizer(p)["input_ids"] for p in ("12+34=", "56+78=", "90+11=")]
    sampling = SamplingConfig(max_new_tokens=4, temperature=1.0)
    both = engine.generate(prompts, sampling, [7, 8, 9])
    alone = engine.generate(prompts[1:], sampling, [8, 9])
    assert both.completion_ids[1:] == alone.completion_ids
    for a, b in zip(both.logprobs[1:], alone.logprobs):  # other padding: equal up to float rounding
        assert torch.allclose(torch.tensor(a), torch.tensor(b), atol=1e-5)
    assert engine.generate(prompts, sampling, [7, 8, 10]).completion_ids[:2] == both.completion_ids[:2]
    with pytest.raises(ValueError, match=r"does not implement \['top_k'\]"):
        engine.generate(prompts, SamplingConfig(max_new_tokens=4, top_k=5), 0)


def test_one_batch_ahead_the_versions_lag_by_one(warm_start_dir, arithmetic_rows, held_out_rows, tmp_path):
    """max_staleness=1: batch i is sampled with the weights of step i - 1, on the pipeline's worker
    thread; the behaviour log-probs are the policy's exactly when that lag is 0 (batch 0).
    Validation (after batches 1 and 3) samples now, on the trainer's thread, with the current weights."""
    callback = CopyRollout(max_staleness=1, async_seed=1)  # a seed whose batch 0 has rewards to learn from
    module, rows, metrics = fit(warm_start_dir, arithmetic_rows, held_out_rows, callback, tmp_path, val_every=2)
    assert [(v, s) for v, s, _ in rows] == [(0, 0), (1, 0), (2, 1), (3, 2)]
    assert [metrics[s]["async/staleness/max"] for s in range(STEPS)] == [0.0, 1.0, 1.0, 1.0]
    assert [metrics[s]["async/staleness/mean"] for s in range(STEPS)] == [0.0, 1.0, 1.0, 1.0]
    assert rows[0][2] < 1e-4 and min(gap for _, _, gap in rows[1:]) > 1e-3, rows
    (engine,) = callback.engines
    # Batches 0 and 1 at the start, batch j + 2 once batch j trained and synced (j + 1); 4 and 5 are not trained.
    assert by_phase(engine, "training") == [(v, "rlpt-rollout-ahead_0") for v in (0, 0, 1, 2, 3, 4)]
    assert by_phase(engine, "validation") == [(2, threading.main_thread().name), (4, threading.main_thread().name)]
    assert engine.closed and module.rollout_engine is None and callback.pipeline is None


@pytest.mark.parametrize("sync_every, sampled, copies", [(1, [0, 1, 2, 3], 5), (2, [0, 0, 2, 3], 4)])
def test_without_running_ahead_the_engine_follows_its_sync_schedule(warm_start_dir, arithmetic_rows, held_out_rows,
                                                                    tmp_path, sync_every, sampled, copies):
    """max_staleness=0: on-policy with sync_every=1 (behaviour log-probs are the policy's at every
    step); with sync_every=2, one step behind after odd steps, except that validation (after 3
    batches) first hands the engine step 3's weights, so batch 3 is on-policy too."""
    callback = CopyRollout(sync_every=sync_every)
    _, rows, metrics = fit(warm_start_dir, arithmetic_rows, held_out_rows, callback, tmp_path, val_every=3)
    assert [(v, s) for v, s, _ in rows] == list(zip(range(STEPS), sampled))
    lags = [float(v - s) for v, s in zip(range(STEPS), sampled)]
    assert [metrics[s]["async/staleness/max"] for s in range(STEPS)] == lags
    for (_, _, gap), lag in zip(rows, lags):
        assert (gap < 1e-4) if lag == 0 else (gap > 1e-3), rows
    (engine,) = callback.engines
    main = threading.main_thread().name
    assert by_phase(engine, "training") == [(s, main) for s in sampled]
    assert by_phase(engine, "validation") == [(3, main)]
    assert engine.copies == copies  # at construction, then its schedule (and validation's forced copy)


def test_a_resumed_run_with_rollouts_ahead_equals_an_uninterrupted_one(warm_start_dir, arithmetic_rows, tmp_path):
    """The checkpoint after step 3 holds batches 3 and 4's rollouts (sampled with versions 2 and 3),
    in the callback's state; the resumed engine receives version 3's weights at fit start and
    generates batch 5 (its seed keyed by the count of batches submitted, also restored)."""
    straight, resumed = straight_and_resumed(
        tmp_path, lambda: make_module(warm_start_dir, seed=1),
        lambda: PromptDataModule(arithmetic_rows[:20], batch_size=4, seed=2),  # 5 batches: the run crosses an epoch
        lambda: [CopyRollout(max_staleness=1, async_seed=7)], n=3)
    assert [straight[0][s]["async/staleness/max"] for s in range(6)] == [0.0] + [1.0] * 5
    assert_same_run(straight, resumed, atol=1e-6)


def test_the_previous_engine_is_restored_and_ours_closed_when_fit_fails(warm_start_dir, arithmetic_rows):
    """A hook raising at step 1, with a batch in flight on the pipeline's worker: the worker is
    stopped, our engine closed, and the engine the module had before fit is put back."""
    module = make_module(warm_start_dir)
    previous = module.rollout_engine = HFGenerateEngine(module.policy, task.EOS_ID, task.PAD_ID)
    callback = CopyRollout(max_staleness=1)
    trainer = quiet_trainer(max_steps=STEPS, callbacks=[callback, Versions(fail_at=1)])
    with pytest.raises(RuntimeError, match="a failure mid-fit"):
        trainer.fit(module, datamodule=PromptDataModule(arithmetic_rows, batch_size=4))
    assert callback.engines[0].closed and module.rollout_engine is previous and callback.pipeline is None
    assert not [t for t in threading.enumerate() if t.name.startswith("rlpt-rollout-ahead")]  # the worker stopped
