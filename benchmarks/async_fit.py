"""One short fit of the demo, timed step by step (run in its own process by `async_model.py` and
`async_costs.py`); writes ``--out`` JSON: per step its seconds, ``timing/*`` stages, rows and
tokens, the CPU cores the trainer process used outside the rollout, and the policy version
each batch was sampled with.

The demo's settings (`examples/arithmetic/run.py`): the warm start, 16 prompts × 8 completions,
≤ 4 new tokens, β 0.001 (a reference forward each step), lr 3e-5. ``--engine hf`` uses the
built-in ``transformers.generate`` engine; ``--engine servers`` `VLLMServerRollout(launch=
dict(num_servers=M))`; ``--max-staleness k`` passes ``max_staleness=k`` to whichever of
`VLLMServerRollout` and `RLModule` takes it, and exits with code 3 when neither does (the
asynchronous pipeline is not on this branch yet).

A step's seconds are the wall time between the ends of consecutive training batches (the
first: from the start of its batch), so time spent outside ``training_step`` — waiting for an
in-flight rollout, a weight sync in a callback — is counted.

    python benchmarks/async_fit.py --engine servers --servers 2 --steps 8 --out /tmp/fit.json
"""
from __future__ import annotations

import argparse
import inspect
import json
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "examples", "arithmetic"))
NO_STALENESS = 3  # exit code: no max_staleness argument on this branch


def probe_class():
    from lightning_rlpt import RLCallback

    class StepProbe(RLCallback):
        """Wall and process-CPU clocks at each batch's start, rollout end and batch end."""

        requires = ()

        def __init__(self):
            self.steps: list[dict] = []
            self._last_end = None

        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            self._start = (time.perf_counter(), time.process_time())
            self.first_start = getattr(self, "first_start", self._start[0])
            self._rollout = None

        def on_rollout_end(self, trainer, module, experience):
            if self._rollout is None:  # refills call it again; the batch's own rollout is the first
                self._rollout = (time.perf_counter(), time.process_time())
                self._batch = dict(rows=len(experience), version=int(experience.policy_version),
                                   tokens=float(experience.prompt_mask.sum() + experience.completion_mask.sum()),
                                   completion_tokens=float(experience.completion_mask.sum()),
                                   prompt_tokens=float(experience.prompt_mask.sum()),
                                   longest=int(experience.completion_mask.sum(1).max()))

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            now = (time.perf_counter(), time.process_time())
            begin = self._last_end or self._start
            after = self._rollout or self._start
            timing = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("timing/")}
            self.steps.append(dict(seconds=now[0] - begin[0], timing=timing, policy_version=module.policy_version,
                                   train_cores=(now[1] - after[1]) / max(now[0] - after[0], 1e-9), **self._batch))
            self._last_end = now

    return StepProbe()


def staleness_target(k: int) -> str | None:
    """Where ``max_staleness`` goes: the callback or the module (None: not on this branch)."""
    from lightning_rlpt import RLModule
    from lightning_rlpt.callbacks import VLLMServerRollout

    for name, cls in (("callback", VLLMServerRollout), ("module", RLModule)):
        if "max_staleness" in inspect.signature(cls.__init__).parameters:
            return name
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engine", choices=("hf", "servers"), default="servers")
    parser.add_argument("--servers", type=int, default=1)
    parser.add_argument("--max-staleness", type=int, default=0)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    started = time.perf_counter()
    import lightning as L
    import task
    from lightning_rlpt import PromptDataModule, RLModule
    from lightning_rlpt.callbacks import VLLMServerRollout

    target = staleness_target(args.max_staleness) if args.max_staleness else None
    if args.max_staleness and target is None:
        print("max_staleness is not an argument of VLLMServerRollout or RLModule on this branch", file=sys.stderr)
        sys.exit(NO_STALENESS)
    extra = {"max_staleness": args.max_staleness} if target else {}
    L.seed_everything(0, verbose=False)
    module = RLModule(os.path.join(ROOT, "examples", "arithmetic", "warm_start"), reward_funcs=[task.exact_answer],
                      objective="grpo", group_size=8, kl_coef=0.001, lr=3e-5, seed=0,
                      generation=dict(max_new_tokens=4, temperature=1.0, max_prompt_length=8),
                      **(extra if target == "module" else {}))
    data = PromptDataModule(task.rows(task.split_pairs()[0]), batch_size=args.prompts, seed=0)
    probe = probe_class()
    callbacks = [probe]
    if args.engine == "servers":
        launch = dict(num_servers=args.servers, kv_cache_memory_bytes=64 << 20, log_dir=tempfile.mkdtemp())
        callbacks.insert(0, VLLMServerRollout(launch=launch, **(extra if target == "callback" else {})))
    trainer = L.Trainer(max_steps=args.steps, callbacks=callbacks, logger=False, accelerator="cpu", devices=1, enable_checkpointing=False,
                        enable_model_summary=False, enable_progress_bar=False, num_sanity_val_steps=0,
                        limit_val_batches=0)
    trainer.fit(module, datamodule=data)
    result = dict(args=vars(args), steps=probe.steps, staleness_target=target,
                  startup_s=probe.first_start - started, wall_s=time.perf_counter() - started)
    with open(args.out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
