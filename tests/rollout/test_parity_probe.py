"""The run-time sampling-parity probe (`lightning_rlpt.rollout.parity`): an engine whose sync
drops a parameter is stopped before the step that would train on its samples, at the first sync
or any later one; a healthy engine logs ``sampling/parity_max`` on the probe's schedule; the tied
head that vLLM's reload left stale (the bug this probe was built after) is caught by it."""
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger

import tiny_task as task
from conftest import quiet_trainer
from lightning_rlpt import PromptDataModule, RLModule
from lightning_rlpt.model import weights as weights_module
from lightning_rlpt.rollout.engine import RolloutOutput
from lightning_rlpt.rollout.parity import ParityProbe
from resume_utils import read_rows
from test_custom_engine import CopyEngine, CopyRollout

SKIPPED = "model.layers.0.mlp.down_proj.weight"


class SkippingEngine(CopyEngine):
    """A copy engine whose syncs from optimizer step ``broken_from`` on leave one parameter out."""

    broken_from = 0

    def _load(self, weights, version):
        sent = dict(weights())
        if version >= self.broken_from:
            sent.pop(SKIPPED)
        self.model.load_state_dict(sent, strict=False)
        self.policy_version, self.copies = version, self.copies + 1


def make_module(path, **kwargs):
    return RLModule(path, reward_funcs=[task.exact_answer], group_size=4, kl_coef=0.0, lr=1e-3,
                    generation=dict(max_new_tokens=4, temperature=1.0, max_prompt_length=8), **kwargs)


@pytest.mark.parametrize("broken_from", [0, 1])
def test_a_sync_that_skips_a_parameter_stops_the_run_before_its_step(broken_from, warm_start_dir, arithmetic_rows):
    SkippingEngine.broken_from = broken_from

    class Skipping(CopyRollout):
        engine_class = SkippingEngine

    module = make_module(warm_start_dir, parity_every=1)
    trainer = quiet_trainer(max_steps=3, callbacks=[Skipping()])
    with pytest.raises(RuntimeError, match=rf"SkippingEngine does not sample from the policy .* global step {broken_from}"):
        trainer.fit(module, datamodule=PromptDataModule(arithmetic_rows, batch_size=4))
    assert module.policy_version == broken_from  # the step that would train on its samples did not run


def test_the_probe_runs_on_its_schedule_and_is_off_at_zero(warm_start_dir, arithmetic_rows, tmp_path, monkeypatch):
    measured = []
    measure = ParityProbe.measure

    def spy(self, engine, prompt, logprobs_of, version):
        gap = measure(self, engine, prompt, logprobs_of, version)
        measured.append((version, gap))
        return gap

    monkeypatch.setattr(ParityProbe, "measure", spy)
    for every in (2, 0):
        measured.clear()
        module = make_module(warm_start_dir, parity_every=every)
        logger = CSVLogger(str(tmp_path), name=f"every{every}")
        quiet_trainer(max_steps=5, logger=logger).fit(module, datamodule=PromptDataModule(arithmetic_rows, batch_size=4))
        logged = {m.get("sampling/parity_max") for m in read_rows(logger.log_dir, skip=()).values()} - {None}
        if every:  # the HF engine is the policy: generate and the loss's path agree to float noise
            assert [v for v, _ in measured] == [0, 2, 4] and max(g for _, g in measured) < 1e-5
            assert {g for _, g in measured} == logged
        else:
            assert measured == [] and logged == set()


def probed(probe: ParityProbe, versions, sync_every: int = 1) -> list[int]:
    """The versions ``probe`` measures at, as the module runs it (``measure`` records the version)."""
    out = []
    for v in versions:
        if probe.due(v, v, sync_every=sync_every):
            probe.last = v
            out.append(v)
    return out


def test_the_probes_schedule_counts_syncs_and_skips_stale_engines():
    assert probed(ParityProbe(every=3), range(10)) == [0, 3, 6, 9]
    assert probed(ParityProbe(every=3), range(0, 14, 2), sync_every=2) == [0, 6, 12]
    assert not ParityProbe(every=3).due(5, 6, sync_every=2)  # between syncs the engine is stale by design
    # A resumed fit probes its fresh engine first, then the steps an uninterrupted run probes.
    assert probed(ParityProbe(every=3), range(4, 10)) == [4, 6, 9]
    # A sync that lands past a multiple (the pipeline's lag) still probes once in that period.
    assert probed(ParityProbe(every=3), [0, 2, 4, 5, 7, 8, 10]) == [0, 4, 7, 10]


@pytest.mark.slow
def test_vllms_stale_tied_head_is_caught_by_the_probe(qwen2_dir, arithmetic_rows, monkeypatch):
    """Today's sync sends a tied head under both names; the one before sent it once, and vLLM's
    reload kept the head it started with (log-prob gaps of 0.2-0.5). Put that back: the probe stops
    the run before step 0."""
    from lightning_rlpt.callbacks import VLLMRollout

    once = weights_module.policy_weights
    monkeypatch.setattr("lightning_rlpt.rollout.vllm.engine.policy_weights", lambda p: once(p, aliases=False))
    monkeypatch.setattr("lightning_rlpt.callbacks.vllm_rollout.policy_weights", lambda p: once(p, aliases=False))
    module = make_module(qwen2_dir, parity_every=1)
    with pytest.raises(RuntimeError, match=r"VLLMEngine does not sample from the policy .* global step 0"):
        quiet_trainer(max_steps=1, callbacks=[VLLMRollout()]).fit(
            module, datamodule=PromptDataModule(arithmetic_rows, batch_size=4))
    assert module.policy_version == 0


class Served:
    """A server view that answers a greedy request with fixed tokens and log-probs."""

    return_logprobs = True

    def __init__(self, logprobs):
        self.logprobs = logprobs

    def generate(self, prompts, sampling, seed):
        return RolloutOutput(completion_ids=[[5, 6]], logprobs=[list(self.logprobs)])


class Pool:
    """An engine over several servers: the probe measures each alone and names the worst."""

    def __init__(self, **servers):
        self.servers = servers

    def parity_targets(self):
        return self.servers


def test_an_engine_over_servers_is_measured_server_by_server():
    trainer_logprobs = lambda ids, n: torch.tensor([-1.0, -2.0])  # noqa: E731
    probe = ParityProbe(every=1)  # threshold "auto"
    engine = Pool(a=Served([-1.0, -2.0]), b=Served([-1.0, -2.5]), c=Served([-1.001, -2.0]))
    assert probe.measure(engine, [1, 2], trainer_logprobs, 0) == pytest.approx(0.5) and probe.worst == "b"
    with pytest.raises(RuntimeError, match=r"Pool \(server b\) does not sample from the policy .* 0.5 > "):
        probe.check(0.5, engine, "global step 0")
    # a server that returns after a drop passes the same probe on the prompt last probed, or is refused
    probe.check_rejoined(engine.servers["c"], trainer_logprobs)
    with pytest.raises(ValueError, match="sampling-parity gap 0.5 is above parity_threshold=0.01"):
        probe.check_rejoined(engine.servers["b"], trainer_logprobs)
    # "auto": 1e-2 when both sides are fp32, 0.3 when either is bf16/fp16
    bf16ish = Served([-1.2, -2.0])
    with pytest.raises(ValueError, match="sampling-parity gap 0.2 is above parity_threshold=0.01"):
        probe.check_rejoined(bf16ish, trainer_logprobs)
    probe.check_rejoined(bf16ish, trainer_logprobs, low_precision=True)
    with pytest.raises(ValueError, match="sampling-parity gap 0.5 is above parity_threshold=0.3"):
        probe.check_rejoined(engine.servers["b"], trainer_logprobs, low_precision=True)
    assert [ParityProbe(threshold=t).limit(low) for t, low in (("auto", False), ("auto", True), (0.05, True),
                                                                (None, False))] == [1e-2, 0.3, 0.05, None]

