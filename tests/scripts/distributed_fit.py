"""A short GRPO fit under a data-parallel strategy on CPU, run as its own script (Lightning's
launcher re-runs it once per rank). Writes metrics.csv and, on rank 0, the final weights.

    python tests/scripts/distributed_fit.py --strategy ddp|fsdp2|single --out DIR [--resume-at N]

Under ``torchrun --nnodes 2 --nproc-per-node 1`` pass ``--num-nodes 2``: one process per node,
the same 2-rank run as ``--strategy ddp`` on one host (tests/multinode).

With ``--resume-at N`` it fits N steps, saves a checkpoint (sharded under FSDP2), and a fresh
module and Trainer resume from it up to ``--steps``; metrics of the two parts go to
``part0/`` and ``part1/``.

With ``--gradient-checkpointing`` the policy recomputes its layers' activations in backward;
every run writes ``layer_forwards_rank{r}.json``: how many times decoder layer 0 ran with grad
(once per micro-batch, twice with checkpointing).

With ``--streams`` it adds `RewardDithering` and `CurriculumSampler(dynamic_filtering=True)`
on a task where half the prompts always score 0 (so refills happen) and writes, per rank,
``streams_rank{r}.json``: the dataset rows of every rollout (sampled batch, then refills) and
the dithering noise of every training batch.

With ``--episodes`` rollouts go through `scripted_episodes` (a ``rollout_func`` whose episode
counts depend on the prompt) and each rank writes its rows' counts per rollout to
``streams_rank{r}.json`` (key ``episodes``).

With ``--reward-model DIR`` the reward is that reward model (instead of the exact answer) and
each rank writes ``reward_model_rank{r}.json``: what it holds of the reward model (device,
DTensor or full tensors, trainable or not, parameter count and sum, whether any of it is in the
module's state_dict).

With ``--engine server`` rollouts come from one vLLM server that `VLLMServerRollout(launch=...)`
starts (on rank 0; logs in ``DIR/vllm``), or from running ones (``--server-urls URL,URL``: then
the final weights are sent, checked and written to ``served_rank{r}.json``, `ServedWeights`); each rank writes ``server_rank{r}.json``: per rollout
the policy version, the model name its requests named and how many servers its engine owns.
``--lora`` trains a LoRA adapter (r = 4), synced to the server as an adapter.
"""
import json
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(HERE))  # tests/: the tiny task

import lightning as L  # noqa: E402
import torch  # noqa: E402
from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402
from lightning.pytorch.loggers import CSVLogger  # noqa: E402

import tiny_task as task  # noqa: E402
from layer_forwards import count_grad_forwards  # noqa: E402
from lightning_rlpt import PromptDataModule, RLCallback, RLModule  # noqa: E402
from lightning_rlpt.model.distributed import release_process_group  # noqa: E402
from lightning_rlpt.callbacks import CurriculumSampler, RewardDithering  # noqa: E402

RECORD: dict[str, list] = {"rollouts": [], "noise": [], "server": [], "episodes": []}


class StreamRecorder(RLCallback):
    """Listed after the streams' callbacks: sees each rollout's rows and each batch's noise."""

    def on_rollout_end(self, trainer, module, experience):
        RECORD["rollouts"].append((trainer.global_step, experience.columns["index"][::experience.group_size]))

    def on_advantages_computed(self, trainer, module, experience):
        noise = experience.rewards - module.rewards.combine(experience.rewards_per_func)
        RECORD["noise"].append((trainer.global_step, noise.tolist()))


class ServerRecorder(RLCallback):
    """What each rank's server engine did per rollout (``--engine server``)."""

    def on_rollout_end(self, trainer, module, experience):
        engine = module.rollout_engine
        RECORD["server"].append([experience.policy_version, engine.pool.model, len(engine.servers)])


class ServedWeights(RLCallback):
    """At the end of training: send the final weights, then check every server holds that version
    and (rank 0) computes the policy's log-probs; the result goes to ``served_rank{r}.json``."""

    def __init__(self, out: str):
        self.out = out

    def on_train_end(self, trainer, module):
        module.sync_engine(force=True)
        engine = module.rollout_engine
        engine.check_versions()
        worst = None
        if trainer.global_rank == 0:
            worst = module.parity.measure(engine, module.tokenizer("12+34=")["input_ids"], module._probe_logprobs,
                                          module.policy_version)
        with open(os.path.join(self.out, f"served_rank{trainer.global_rank}.json"), "w") as f:
            json.dump({"version": module.policy_version, "servers": len(engine.pool.live), "parity": worst}, f)


class EpisodeRecorder(RLCallback):
    """Each rollout's per-row episode counts on this rank (what the rank-local metrics would use)."""

    def on_rollout_end(self, trainer, module, experience):
        info = {k: v.tolist() for k, v in experience.info.items()}
        RECORD["episodes"].append({"step": trainer.global_step, **info,
                                   "model_tokens": experience.completion_mask.sum(1).tolist()})


def scripted_episodes(prompts, engine, tokenizer, sampling, seeds):
    """A ``rollout_func``: one sampled turn per row, then as many (pretend) tool calls as the
    prompt's first digit mod 3, each answered by one non-model token; every second call fails.
    Rows differ, so each rank's counts differ from the other's."""
    from lightning_rlpt.rollout.episodes import Episode

    out = engine.generate([tokenizer(p)["input_ids"] for p in prompts], sampling, seeds)
    episodes = []
    for prompt, ids in zip(prompts, out.completion_ids):
        calls = int(prompt[0]) % 3
        episodes.append(Episode(ids + [task.PAD_ID] * calls, [1] * len(ids) + [0] * calls, turns=1 + calls,
                                tool_calls=calls, tool_failures=calls // 2))
    return episodes


def half_constant(prompts, completions, kind, completion_ids, **_):
    """0 for "constant" rows (zero-variance groups, always filtered); the length parity otherwise."""
    return [0.0 if k == "constant" else float(len(ids) % 2) for k, ids in zip(kind, completion_ids)]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--strategy", default="ddp")
    p.add_argument("--num-nodes", type=int, default=1, help="> 1: one process per node, started by torchrun")
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=int(os.environ.get("FIT_STEPS", 3)), help="default: $FIT_STEPS or 3")
    p.add_argument("--prompts", type=int, default=4, help="prompts per step over all ranks")
    p.add_argument("--kl-coef", type=float, default=0.05)
    p.add_argument("--resume-at", type=int, default=None)
    p.add_argument("--engine", default="hf", choices=["hf", "vllm", "server"])
    p.add_argument("--server-urls", default=None, help="--engine server: comma-separated running servers")
    p.add_argument("--lora", action="store_true")
    p.add_argument("--streams", action="store_true")
    p.add_argument("--micro-batch-size", type=int, default=None)
    p.add_argument("--max-tokens", type=int, default=None, help="max_tokens_per_micro_batch")
    p.add_argument("--gradient-checkpointing", action="store_true")
    p.add_argument("--episodes", action="store_true", help="rollouts through scripted_episodes (a rollout_func)")
    p.add_argument("--padding-free", action="store_true")
    # FSDP2 always recomputes the head's gradient (its head is gathered inside the root's forward), so
    # runs compared with it recompute too; the forward-pass path's equality with the recompute path is
    # tests/stages/test_head_in_forward.py's, and the DDP tests run it on both sides.
    p.add_argument("--head-gradient", default="recompute", choices=["auto", "forward", "recompute"])
    p.add_argument("--top-entropy-quantile", type=float, default=1.0)
    p.add_argument("--reward-model", default=None, help="a reward model directory, scored instead of the answer")
    p.add_argument("--advantage", default=None, help="RLModule's advantage estimator (default: the preset's)")
    args = p.parse_args()
    torch.set_num_threads(1)
    if args.resume_at is None:
        trainer, module = fit(args, args.steps, version="")
    else:
        # A checkpoint taken during training, as ModelCheckpoint does (one saved after `fit`
        # returns holds no dataloader position).
        every = ModelCheckpoint(dirpath=args.out, filename="ckpt", every_n_train_steps=args.resume_at)
        fit(args, args.resume_at, version="part0", callbacks=[every])
        trainer, module = fit(args, args.steps, version="part1", ckpt_path=os.path.join(args.out, "ckpt.ckpt"))
    save_weights(trainer, module, args.out)
    with open(os.path.join(args.out, f"layer_forwards_rank{trainer.global_rank}.json"), "w") as f:
        json.dump(module.grad_forwards[0], f)  # of the last fit (after --resume-at: the resumed part)
    if args.engine == "server":
        with open(os.path.join(args.out, f"server_rank{trainer.global_rank}.json"), "w") as f:
            json.dump(RECORD["server"], f)
    if args.reward_model:
        save_reward_model_facts(trainer, module, args.out)
    if args.streams or args.episodes:
        with open(os.path.join(args.out, f"streams_rank{trainer.global_rank}.json"), "w") as f:
            json.dump(RECORD, f)


def fit(args, steps: int, version: str, ckpt_path: str | None = None, callbacks=()):
    devices = 1 if args.strategy == "single" or args.num_nodes > 1 else 2
    strategy = {"single": "auto", "ddp": "ddp",
                "fsdp2": L.pytorch.strategies.ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1)}[args.strategy]
    module = RLModule(os.path.join(ROOT, "examples", "arithmetic", "warm_start"),
                      reward_funcs=[args.reward_model or (half_constant if args.streams else task.exact_answer)], group_size=4, kl_coef=args.kl_coef, lr=1e-4, seed=3, seed_per_prompt=True,
                      generation=dict(max_new_tokens=4, max_prompt_length=8),
                      micro_batch_size=args.micro_batch_size, max_tokens_per_micro_batch=args.max_tokens,
                      gradient_checkpointing=args.gradient_checkpointing,
                      padding_free=args.padding_free, head_gradient=args.head_gradient,
                      top_entropy_quantile=args.top_entropy_quantile, advantage=args.advantage,
                      lora=dict(r=4, lora_alpha=8) if args.lora else None,
                      rollout_func=scripted_episodes if args.episodes else None)
    module.grad_forwards = count_grad_forwards(module.policy)
    train, _ = task.split_pairs()
    rows = task.rows(train[:32])
    if args.streams:
        rows = [{**r, "kind": "constant" if i % 2 else "parity"} for i, r in enumerate(rows)]
        callbacks = list(callbacks) + [RewardDithering(scale=0.1, seed=5),
                                       CurriculumSampler(None, use_as="loss", dynamic_filtering=True,
                                                         max_refill_rounds=2, seed=9),
                                       StreamRecorder()]
    if args.episodes:
        callbacks = list(callbacks) + [EpisodeRecorder()]
    data = PromptDataModule(rows, batch_size=args.prompts // (devices * args.num_nodes), seed=1)
    trainer = L.Trainer(accelerator="cpu", devices=devices, num_nodes=args.num_nodes, strategy=strategy, max_steps=steps,
                        logger=CSVLogger(args.out, name="", version=version), log_every_n_steps=1,
                        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=bool(callbacks),
                        callbacks=list(callbacks) + engine_callbacks(args.engine, args.out, args.server_urls))
    trainer.fit(module, datamodule=data, ckpt_path=ckpt_path)
    return trainer, module


def engine_callbacks(engine: str, out: str, urls: str | None = None) -> list:
    if engine == "hf":
        return []
    from lightning_rlpt.callbacks import VLLMRollout, VLLMServerRollout
    if engine == "server" and urls:
        servers = VLLMServerRollout(urls=urls.split(","), request_timeout=120, control_timeout=120)
        return [servers, ServerRecorder(), ServedWeights(out)]
    if engine == "server":
        launch = dict(num_servers=1, max_model_len=64, kv_cache_memory_bytes=64 << 20, dtype="float32",
                      log_dir=os.path.join(out, "vllm"))
        return [VLLMServerRollout(launch=launch, request_timeout=120, control_timeout=120), ServerRecorder()]
    return [VLLMRollout(max_model_len=64, dtype="float32")]


def save_weights(trainer, module, out: str) -> None:
    state = {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone()
             for k, v in module.policy.state_dict().items()}
    if trainer.global_rank == 0:
        torch.save(state, os.path.join(out, "weights.pt"))
    torch.save(state, os.path.join(out, f"weights_rank{trainer.global_rank}.pt"))


def save_reward_model_facts(trainer, module, out: str) -> None:
    params = list(module.rewards.funcs[0].model.parameters())
    facts = {"devices": sorted({str(p.device) for p in params}),
             "dtensor": any(hasattr(p, "full_tensor") for p in params),
             "trainable": any(p.requires_grad for p in params), "numel": sum(p.numel() for p in params),
             "sum": sum(float(p.double().sum()) for p in params), "module_device": str(module.device),
             "in_state_dict": any(t.data_ptr() in {p.data_ptr() for p in params}
                                  for t in module.state_dict().values() if not hasattr(t, "full_tensor"))}
    with open(os.path.join(out, f"reward_model_rank{trainer.global_rank}.json"), "w") as f:
        json.dump(facts, f)


if __name__ == "__main__":
    main()
    release_process_group()  # before finalization, where gloo can abort an exit that succeeded
