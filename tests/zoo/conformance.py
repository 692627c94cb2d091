"""One cell of the conformance matrix: an architecture × an engine × a sync mode.

A cell is a real fit of two optimizer steps through the engine's own callback (none for the HF
engine). At each training rollout — step 0, right after the first sync, and step 1, after one
update and its sync — `LogprobGap` compares the engine's behaviour log-probs of the sampled
tokens (T = 1) with the trainer's log-probs of the same tokens through the loss's own path.
Both sides are fp32, so a healthy engine agrees to ~1e-6; a stale head or a skipped parameter
shows as 1e-2 .. 1. The run-time probe (`rollout.parity`) is turned off here so that a cell
measures the engine, not the probe.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field

import torch

import tiny_task as task
from conftest import quiet_trainer
from lightning_rlpt import PromptDataModule, RLCallback, RLModule

TOLERANCE = 1e-3  # mean |Δ log p| a cell must stay under (the bound; fp32 measures ~1e-6)
ENGINES = ("hf", "vllm", "vllm-server")
SYNCS = {
    "full": dict(lr=1e-3),
    "lora": dict(lr=1e-2, lora=dict(r=4, lora_alpha=8, target_modules="all-linear")),
    "qlora": dict(lr=1e-2, lora=dict(r=4, lora_alpha=8, target_modules="all-linear"), quantization="nf4"),
}
RESULTS = os.environ.get("RLPT_ZOO_JSON")  # where `make zoo` collects the cells (the docs' table is rendered from it)
COMMITTED = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "results", "zoo_matrix.json")


@dataclass
class Cell:
    architecture: str
    engine: str
    sync: str
    status: str = "ok"  # "ok", or "refused: <the message>"
    gaps: list[dict[str, float]] = field(default_factory=list)  # per training rollout: step, mean, max

    @property
    def key(self) -> str:
        return f"{self.architecture}/{self.engine}/{self.sync}"


class LogprobGap(RLCallback):
    """Per training rollout: the policy version and the mean / max |behaviour − trainer| log-prob."""

    def __init__(self):
        self.rows: list[dict[str, float]] = []

    def setup(self, trainer, pl_module, stage):
        super().setup(trainer, pl_module, stage)
        pl_module.request(rollout_logprobs=True)  # the HF engine reports them too

    def on_rollout_end(self, trainer, module, experience):
        with torch.no_grad():
            ours, _ = module.policy_logprobs(experience)
        mask = experience.completion_mask.bool()
        gap = (ours - experience.behaviour_logprobs).abs()[mask]
        self.rows.append(dict(step=int(module.policy_version), mean=gap.mean().item(), max=gap.max().item()))


def make_module(path: str, sync: str, **kwargs) -> RLModule:
    return RLModule(path, reward_funcs=[task.exact_answer], group_size=4, kl_coef=0.0, parity_every=0,
                    generation=dict(max_new_tokens=4, temperature=1.0, max_prompt_length=8), **SYNCS[sync], **kwargs)


def run_cell(cell: Cell, module: RLModule, callbacks: list, rows: list[dict[str, str]]) -> Cell:
    """Two steps; ``cell.gaps`` gets the two rollouts' gaps."""
    probe = LogprobGap()
    data = PromptDataModule(rows, batch_size=8)
    quiet_trainer(max_steps=2, callbacks=[*callbacks, probe]).fit(module, datamodule=data)
    cell.gaps = probe.rows
    return cell


def record(cell: Cell) -> None:
    """Add the cell to ``$RLPT_ZOO_JSON`` (one JSON object keyed by cell) when collecting."""
    if not RESULTS:
        return
    cells = json.load(open(RESULTS)) if os.path.exists(RESULTS) else {}
    cells[cell.key] = {k: v for k, v in asdict(cell).items()}
    with open(RESULTS, "w") as f:
        json.dump(dict(sorted(cells.items())), f, indent=1)
        f.write("\n")


def committed() -> dict[str, dict]:
    with open(COMMITTED) as f:
        return json.load(f)
