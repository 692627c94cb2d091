"""GRPO on the arithmetic demo across hosts: the script docs/distributed.md runs on each node.

torchrun (or SLURM's srun) starts one process per device on every node and Lightning reads the
rank layout from their environment; with ``--server-urls`` rollouts come from running vLLM
servers, which reload the weights from ``--snapshot-dir`` after each optimizer step.

    # each trainer node (NODE_RANK = 0, 1; MASTER_ADDR = node 0's address)
    torchrun --nnodes 2 --nproc-per-node 1 --node-rank $NODE_RANK --master-addr $MASTER_ADDR \\
        --master-port 29500 examples/multihost.py --num-nodes 2 --devices 1 --out $OUT
    # one host, two processes started by Lightning: the same run
    python examples/multihost.py --num-nodes 1 --devices 2 --out runs/multihost

Writes ``$OUT/metrics.csv`` (CSVLogger; after a SLURM requeue ``$OUT/restart-<n>/metrics.csv``), checkpoints under ``$OUT/checkpoints`` every
``--checkpoint-every`` steps (``last.ckpt`` too) and the final ``$OUT/final.ckpt``.
``--resume CKPT`` continues from a checkpoint (``CKPT=last``: the newest in ``$OUT/checkpoints``).
``--collective-timeout`` bounds every collective (`CollectiveWatchdog`, which names a silent rank
and its host while waiting); SLURM's SIGUSR1 before the time limit saves Lightning's HPC
checkpoint and requeues the job (``--requeue``), which then resumes from it.
"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "arithmetic"))

import lightning as L  # noqa: E402
from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402
from lightning.pytorch.loggers import CSVLogger  # noqa: E402
from lightning.pytorch.plugins.environments import SLURMEnvironment  # noqa: E402

import task  # noqa: E402
from lightning_rlpt import PromptDataModule, RLModule  # noqa: E402
from lightning_rlpt.model.distributed import release_process_group  # noqa: E402
from lightning_rlpt.callbacks import CollectiveWatchdog  # noqa: E402


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--num-nodes", type=int, default=1, help="trainer nodes (torchrun --nnodes, sbatch --nodes)")
    p.add_argument("--devices", type=int, default=1, help="processes per node (--nproc-per-node, --ntasks-per-node)")
    p.add_argument("--accelerator", default="cpu")
    p.add_argument("--out", required=True, help="metrics and checkpoints (on a shared filesystem: node 0 writes)")
    p.add_argument("--model", default=os.path.join(HERE, "arithmetic", "warm_start"), help="the policy's directory")
    p.add_argument("--steps", type=int, default=int(os.environ.get("FIT_STEPS", 3)), help="default: $FIT_STEPS or 3")
    p.add_argument("--prompts", type=int, default=4, help="prompts per step over all ranks")
    p.add_argument("--server-urls", default=None, help="comma-separated running vLLM servers (default: generate)")
    p.add_argument("--snapshot-dir", default=None,
                   help="with --server-urls: where the weights are written for the servers to reload, on a "
                        "filesystem every trainer and rollout host mounts at this path (default: $TMPDIR, one host)")
    p.add_argument("--request-timeout", type=float, default=120, help="seconds a completion may take")
    p.add_argument("--collective-timeout", type=float, default=None,
                   help="seconds a collective may wait (default: 10 x the slowest step, at least 300 s)")
    p.add_argument("--checkpoint-every", type=int, default=0, help="optimizer steps between checkpoints (0: none)")
    p.add_argument("--resume", default=None, help="a checkpoint to resume from ('last': the newest of this run)")
    p.add_argument("--requeue", action="store_true", help="SLURM: on SIGUSR1, save an HPC checkpoint and requeue")
    return p.parse_args(argv)


def callbacks(args: argparse.Namespace) -> list:
    found = [CollectiveWatchdog(timeout=args.collective_timeout)]
    if args.checkpoint_every:
        found.append(ModelCheckpoint(dirpath=os.path.join(args.out, "checkpoints"), save_last=True, save_top_k=-1,
                                     every_n_train_steps=args.checkpoint_every))
    if args.server_urls:
        from lightning_rlpt.callbacks import VLLMServerRollout
        from lightning_rlpt.rollout.vllm.transport import SnapshotTransport

        transport = SnapshotTransport.under(args.snapshot_dir) if args.snapshot_dir else None
        found.append(VLLMServerRollout(urls=args.server_urls.split(","), transport=transport,
                                       request_timeout=args.request_timeout, control_timeout=120))
    return found


def log_version() -> str:
    """Metrics go to ``$OUT/metrics.csv``; a requeued SLURM job's to ``$OUT/restart-<n>/`` (Lightning's
    CSVLogger would otherwise overwrite the steps logged before the requeue)."""
    restarts = os.environ.get("SLURM_RESTART_COUNT")
    return f"restart-{restarts}" if restarts and restarts != "0" else ""


def main(argv=None) -> None:
    args = parse(argv)
    module = RLModule(args.model, reward_funcs=[task.exact_answer], group_size=4, kl_coef=0.05, lr=1e-4, seed=3,
                      seed_per_prompt=True, generation=dict(max_new_tokens=4, max_prompt_length=8))
    train, _ = task.split_pairs()
    ranks = args.devices * args.num_nodes
    if args.prompts % ranks:
        raise SystemExit(f"--prompts {args.prompts} must be a multiple of the {ranks} ranks (nodes x devices)")
    data = PromptDataModule(task.rows(train[:32]), batch_size=args.prompts // ranks, seed=1)
    plugins = [SLURMEnvironment(auto_requeue=args.requeue)] if SLURMEnvironment.detect() else None
    trainer = L.Trainer(accelerator=args.accelerator, devices=args.devices, num_nodes=args.num_nodes,
                        strategy="ddp" if ranks > 1 else "auto", max_steps=args.steps, plugins=plugins,
                        default_root_dir=args.out, logger=CSVLogger(args.out, name="", version=log_version()),
                        log_every_n_steps=1,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks(args),
                        enable_checkpointing=bool(args.checkpoint_every))
    resume = args.resume
    if resume == "last":
        last = os.path.join(args.out, "checkpoints", "last.ckpt")
        resume = last if os.path.exists(last) else None
    trainer.fit(module, datamodule=data, ckpt_path=resume)
    trainer.save_checkpoint(os.path.join(args.out, "final.ckpt"))


if __name__ == "__main__":
    main()
    release_process_group()  # before finalization, where gloo can abort an exit that succeeded
