"""Step time of GRPO for N trainer GPUs × M rollout servers, synchronous vs ``max_staleness=1``:
a closed-form model from measured per-token costs, checked against real fits on this machine.

**The model** (one steady-state step; every figure in seconds; `Costs` holds the per-unit costs):

- *Generation.* The rollout's ``rows`` (prompts × G) are split evenly over the M servers; each
  runs at most ``concurrency // M`` requests at once (the engine's ``max_inflight`` over all
  servers), so its rows decode in ``waves = ceil(rows_per_server / concurrency_per_server)``
  waves, each as long as the longest completion. One server takes
  ``gen_fixed + r·gen_row + r·P·prefill_token + waves·longest·decode_step + r·C·decode_token``
  (P, C: mean prompt and completion tokens; a decode step's fixed part — weights read once per
  step on a GPU, the scheduler and Python on CPU — is paid while any sequence still runs, the
  per-token part per sequence). Servers run in parallel; a rollout ends when the slowest does.
- *Trainer side.* Rewards, the reference forward and the update of the step's tokens, split
  over N data-parallel trainers: ``train_fixed + (rows/N)·reward + (T/N)·(train_token +
  logprob_passes·logprob_token) + grad_sync`` with ``T = rows·(P + C)``; ``train_fixed`` holds
  the optimizer step and the rest of the step that no ``timing/*`` stage covers.
- *Weight sync.* ``sync_fixed + M·(sync_per_server + bytes / bandwidth)``: the transports send
  to one server after the other (`SnapshotTransport`: written once, each server reloads it;
  `NCCLTransport`: one broadcast group per server).
- *Synchronous* (``max_staleness=0``): ``generation + trainer side + sync``.
- *``max_staleness=1``*, the pipeline of issue 16: batch i+1 is generated with the weights of
  version i while the trainer trains on batch i; a batch never mixes versions; after the
  update the sync waits for the in-flight batch, sends the weights, then submits the next
  batch. So ``max(generation, trainer side) + sync``: the sync is never overlapped.
- *A shared machine* (``shared_cores`` set: this one, where servers and trainer share 2 CPU
  cores): activities that overlap cannot take less than their CPU-seconds over the cores:
  M generating servers take ``max(t, M·t·gen_cores / shared_cores)``, the trainer side beside
  M idle servers ``max(t, t·(train_cores + M·idle_server_cores) / shared_cores)``, and the
  overlapped span ``max(gen, train, (cpu_gen + cpu_train) / shared_cores)``. With
  ``shared_cores=None`` every trainer and server is its own device (a GPU cluster).

It ignores: variance between steps (a deeper queue would absorb it; k > 1 is not modelled),
prefix caching, a server's KV-cache limit, stragglers beyond the longest completion, the
network between trainer and servers except in the sync, and the cost of the first steps.

**Checked here** (``--measure``): `async_costs.py` measures the costs on this machine (one vLLM
server; HF-engine fits for the trainer side), then real fits of the demo
(`async_fit.py`, `VLLMServerRollout(launch=dict(num_servers=M))`, M = 1, 2, synchronous and —
when the argument exists — ``max_staleness=1``), each in its own process, alternated,
``--repeats`` runs each; a run's step time is the median of its steps after the first two, a
configuration's the median over runs. Results: ``benchmarks/results/async_model.{json,md}``.

    python benchmarks/async_model.py --measure --repeats 3   # costs + fits + predictions (~10-14 min idle)
    python benchmarks/async_model.py                         # predictions from the committed JSONs only
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")


@dataclass
class Costs:
    """Per-unit costs (seconds, bytes). Generation terms are one server's (see the module
    docstring); ``concurrency`` is requests in flight over all servers; ``*_cores`` are CPU
    cores an activity keeps busy, read only when ``shared_cores`` is set."""

    gen_fixed_s: float = 0.0
    gen_row_s: float = 0.0
    prefill_token_s: float = 0.0
    decode_step_s: float = 0.0
    decode_token_s: float = 0.0
    concurrency: int = 64
    train_fixed_s: float = 0.0
    train_token_s: float = 0.0
    logprob_token_s: float = 0.0
    reward_s: float = 0.0
    grad_sync_s: float = 0.0
    sync_bytes: float = 0.0
    sync_fixed_s: float = 0.0
    sync_per_server_s: float = 0.0
    sync_bandwidth: float = math.inf
    shared_cores: float | None = None
    gen_cores: float = 1.0
    train_cores: float = 1.0
    idle_server_cores: float = 0.0

    @classmethod
    def from_json(cls, data: dict, **overrides) -> "Costs":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in {**data, **overrides}.items() if k in names})


@dataclass
class Workload:
    """One step's rollout: ``rows`` completions, mean ``prompt`` and ``completion`` tokens,
    the ``longest`` completion, and the extra no-grad forwards (reference, old policy)."""

    rows: int
    prompt: float
    completion: float
    longest: int
    logprob_passes: int = 1


def server_seconds(c: Costs, rows: int, w: Workload, servers: int) -> float:
    """One server generating ``rows`` of ``w`` while ``servers`` share the concurrency."""
    if rows == 0:
        return 0.0
    waves = math.ceil(rows / max(1, c.concurrency // servers))
    return (c.gen_fixed_s + rows * c.gen_row_s + rows * w.prompt * c.prefill_token_s
            + waves * w.longest * c.decode_step_s + rows * w.completion * c.decode_token_s)


def generation_seconds(c: Costs, w: Workload, servers: int) -> tuple[float, float]:
    """(wall seconds of the rollout on ``servers`` servers, CPU-seconds it burns)."""
    t = server_seconds(c, math.ceil(w.rows / servers), w, servers)
    cpu = servers * t * c.gen_cores
    return (max(t, cpu / c.shared_cores) if c.shared_cores else t), cpu


def trainer_seconds(c: Costs, w: Workload, trainers: int, idle_servers: int = 0) -> tuple[float, float]:
    """(wall seconds of rewards + log-probs + update on ``trainers`` data-parallel trainers, CPU-seconds)."""
    tokens = w.rows * (w.prompt + w.completion) / trainers
    t = (c.train_fixed_s + w.rows / trainers * c.reward_s
         + tokens * (c.train_token_s + w.logprob_passes * c.logprob_token_s) + (c.grad_sync_s if trainers > 1 else 0.0))
    cpu = t * c.train_cores
    if c.shared_cores:
        return max(t, t * (c.train_cores + idle_servers * c.idle_server_cores) / c.shared_cores), cpu
    return t, cpu


def sync_seconds(c: Costs, servers: int) -> float:
    return c.sync_fixed_s + servers * (c.sync_per_server_s + c.sync_bytes / c.sync_bandwidth)


def step_seconds(c: Costs, w: Workload, trainers: int, servers: int, max_staleness: int) -> dict[str, float]:
    """The predicted step: ``{"generation", "trainer", "sync", "step"}`` seconds.

    Example:
        >>> c = Costs(decode_step_s=0.1, train_fixed_s=1.0, sync_fixed_s=0.5)
        >>> step_seconds(c, Workload(rows=8, prompt=4, completion=10, longest=10), 1, 1, 0)["step"]
        2.5
    """
    if trainers < 1 or servers < 1:
        raise ValueError(f"need at least one trainer and one server (got trainers={trainers}, servers={servers})")
    if max_staleness not in (0, 1):
        raise ValueError(f"the model covers max_staleness 0 (synchronous) and 1 (got {max_staleness}); a deeper "
                         "queue has the same steady state here, since the model has no step-to-step variance")
    gen, gen_cpu = generation_seconds(c, w, servers)
    train, train_cpu = trainer_seconds(c, w, trainers, idle_servers=servers if max_staleness == 0 else 0)
    sync = sync_seconds(c, servers)
    if max_staleness == 0:
        overlapped = gen + train
    else:
        overlapped = max(gen, train, (gen_cpu + train_cpu) / c.shared_cores if c.shared_cores else 0.0)
    return dict(generation=gen, trainer=train, sync=sync, step=overlapped + sync)


# ------------------------------------------------------------------ the hypothetical cluster
# Qwen2.5-7B-like policy (7.6e9 parameters, 28 layers, 4 KV heads × 128, bf16) on H100 SXM
# (989 TFLOP/s dense bf16, 3.35 TB/s HBM; NVIDIA's datasheet). Every other figure is an
# assumption, derived here so it can be changed.
PARAMS, HBM, FLOPS = 7.6e9, 3.35e12, 989e12
KV_BYTES_PER_TOKEN = 28 * 4 * 128 * 2 * 2  # layers × KV heads × head dim × (K, V) × bf16
HYPOTHETICAL_WORKLOAD = Workload(rows=128 * 8, prompt=256, completion=1024, longest=4096, logprob_passes=1)
HYPOTHETICAL = dict(
    decode_step_s=2 * PARAMS / HBM,  # each decode step reads the bf16 weights once (memory-bound)
    # per running sequence: its KV cache (mean context P + C/2) read + 2·params FLOPs at 50 % MFU
    decode_token_s=(256 + 512) * KV_BYTES_PER_TOKEN / HBM + 2 * PARAMS / (0.5 * FLOPS),
    prefill_token_s=2 * PARAMS / (0.5 * FLOPS),
    gen_fixed_s=0.05, gen_row_s=2e-4, concurrency=8 * 256,  # vLLM's max_num_seqs 256 per server
    train_token_s=6 * PARAMS / (0.4 * FLOPS),  # forward + backward at 40 % MFU (FSDP2, bf16)
    logprob_token_s=2 * PARAMS / (0.4 * FLOPS),  # the reference forward
    train_fixed_s=0.5, reward_s=1e-3, grad_sync_s=0.0,  # FSDP's collectives overlap compute (assumed)
    sync_bytes=2 * PARAMS, sync_fixed_s=0.2, sync_per_server_s=0.05,
    sync_bandwidth=25e9,  # NCCL over one 400 Gb/s InfiniBand link, ~50 % of line rate (assumed)
)


def hypothetical_rows() -> list[dict]:
    c = Costs(**HYPOTHETICAL)
    rows = []
    for trainers, servers in ((8, 8), (12, 4), (4, 12)):
        for k in (0, 1):
            rows.append(dict(trainers=trainers, servers=servers, max_staleness=k,
                             **step_seconds(c, HYPOTHETICAL_WORKLOAD, trainers, servers, k)))
    return rows


# ------------------------------------------------------------------ measured runs vs the model
def workload_of(steps: list[dict]) -> Workload:
    """The workload the fits ran (medians over their steps)."""
    med = lambda key: statistics.median(s[key] for s in steps)  # noqa: E731
    rows = int(med("rows"))
    return Workload(rows=rows, prompt=med("prompt_tokens") / rows, completion=med("completion_tokens") / rows,
                    longest=int(med("longest")), logprob_passes=1)


def compare(costs: dict, runs: list[dict], warmup: int = 2) -> list[dict]:
    """Per configuration: measured step (median over runs of each run's median step after
    ``warmup``), the stages' measured seconds, and the model's prediction for the same workload."""
    c = Costs.from_json(costs)  # async_costs.py records this machine's cores as shared_cores
    out = []
    for key in sorted({(r["servers"], r["max_staleness"]) for r in runs}):
        mine = [r for r in runs if (r["servers"], r["max_staleness"]) == key]
        done = [r for r in mine if r.get("steps")]
        if not done:
            out.append(dict(servers=key[0], max_staleness=key[1], skipped=mine[0].get("skipped", "no run")))
            continue
        steps = [s for r in done for s in r["steps"][warmup:]]
        per_run = [statistics.median(s["seconds"] for s in r["steps"][warmup:]) for r in done]
        stage = lambda k: statistics.median(s["timing"].get(k, 0.0) for s in steps)  # noqa: E731
        rest = statistics.median(s["seconds"] - s["timing"].get("timing/rollout", 0.0)
                                 - s["timing"].get("timing/weight_sync", 0.0) for s in steps)
        predicted = step_seconds(c, workload_of(steps), 1, key[0], key[1])
        measured = statistics.median(per_run)
        out.append(dict(servers=key[0], max_staleness=key[1], runs=len(done), measured=measured, per_run=per_run,
                        rollout=stage("timing/rollout"), rest=rest, sync=stage("timing/weight_sync"),
                        lag=statistics.median(s["policy_version"] - 1 - s["version"] for s in steps),
                        predicted=predicted, error=predicted["step"] / measured - 1))
    return out


def run_fit(servers: int, k: int, steps: int) -> dict:
    """One fit in its own process (`async_fit.py`), started once the machine is idle (quiet.py)."""
    import tempfile

    from quiet import repeat_if_disturbed, run_measured

    def once() -> dict:
        out = tempfile.mktemp(suffix=".json")
        cmd = [sys.executable, os.path.join(HERE, "async_fit.py"), "--servers", str(servers), "--max-staleness", str(k),
               "--steps", str(steps), "--out", out]
        proc, seen = run_measured(cmd)
        if proc.returncode == 3:  # NO_STALENESS: the argument is not on this branch
            return dict(seen, skipped=proc.stderr.strip().splitlines()[-1])
        if proc.returncode != 0:
            raise RuntimeError(f"fit (servers={servers}, max_staleness={k}) failed:\n{proc.stderr[-3000:]}")
        with open(out) as f:
            return {**seen, **json.load(f)}

    return {"servers": servers, "max_staleness": k, **repeat_if_disturbed(once, ("wall_s", "others_cores"), "fit")}


def measure(args) -> dict:
    """Costs (`async_costs.py`, its own process), then the fits, alternated configuration by configuration."""
    import subprocess

    from quiet import cpu_info, set_idle, wait_for_idle

    set_idle(args)
    start = time.perf_counter()
    if not args.reuse_costs:
        wait_for_idle(args.idle_cores, args.idle_wait)
        subprocess.run([sys.executable, os.path.join(HERE, "async_costs.py"), "--out", args.costs], check=True)
    runs, skipped = [], {}
    for rep in range(args.repeats):
        for k in (0, 1):
            for servers in (1, 2):
                if k in skipped:  # the argument is missing: say so for every configuration, run none
                    if rep == 0:
                        runs.append(dict(servers=servers, max_staleness=k, skipped=skipped[k]))
                    continue
                print(f"run {rep + 1}/{args.repeats}: servers={servers} max_staleness={k}", file=sys.stderr)
                run = run_fit(servers, k, args.steps)
                runs.append(run)
                if "skipped" in run:
                    skipped[k] = run["skipped"]
    from quiet import IDLE

    return dict(runs=runs, idle=dict(IDLE), cpu=cpu_info(), cores=os.cpu_count(), seconds=time.perf_counter() - start,
                measured=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))


def fmt(x: float) -> str:
    return f"{x:.2f}" if x < 100 else f"{x:,.0f}"


def render(costs: dict, measured: dict | None) -> str:
    lines = []
    if measured:
        lines += ["This machine (demo model, 16 prompts × 8 completions × ≤ 4 tokens, 1 trainer process, "
                  f"{measured['cores']} CPU cores shared by trainer and servers):", "",
                  "| servers | max_staleness | runs | measured step (s) | predicted step (s) | error | "
                  "measured rollout / rest / sync (s) | predicted generation / trainer / sync (s) | version lag |",
                  "|---:|---:|---:|---:|---:|---:|---|---|---:|"]
        for row in compare(costs, measured["runs"]):
            if "skipped" in row:
                lines.append(f"| {row['servers']} | {row['max_staleness']} | 0 | — | — | — | — | — | "
                             f"not run: {row['skipped']} |")
                continue
            p = row["predicted"]
            lines.append(f"| {row['servers']} | {row['max_staleness']} | {row['runs']} | {fmt(row['measured'])} | "
                         f"{fmt(p['step'])} | {row['error']:+.0%} | {fmt(row['rollout'])} / {fmt(row['rest'])} / {fmt(row['sync'])} | "
                         f"{fmt(p['generation'])} / {fmt(p['trainer'])} / {fmt(p['sync'])} | {row['lag']:.0f} |")
        from quiet import IDLE, contention_note

        lines += ["", "A step is the wall time from one training batch's end to the next's, median of steps 3.. of "
                  "a run, then over runs. \"rest\" is the step less `timing/rollout` and `timing/weight_sync`. With "
                  "`max_staleness=1`, `timing/rollout` is only the hand-over of a batch generated during the previous "
                  "step and `timing/weight_sync` includes the wait for the batch in flight; version lag = optimizer "
                  "steps between the sampling weights and the trained ones.",
                  "", f"Costs measured {costs.get('measured', '?')} by `async_costs.py` (generation fit's median "
                  f"error {costs.get('gen_fit_rel_err_median', float('nan')):.0%}); fits measured {measured['measured']} "
                  f"({measured['seconds'] / 60:.0f} min in all, CPU {measured['cpu']['model']}); "
                  + contention_note([r for r in measured["runs"] if "others_cores" in r], measured.get("idle") or IDLE,
                                    measured["cores"]), ""]
    lines += ["Hypothetical: a 7.6B policy (Qwen2.5-7B-like, bf16) on H100s, 128 prompts × 8 completions, "
              "256 prompt tokens, 1,024 completion tokens on average, longest 4,096 (costs assumed: see "
              "`HYPOTHETICAL` in `benchmarks/async_model.py`):", "",
              "| trainer GPUs | rollout servers (1 GPU each) | max_staleness | generation (s) | trainer side (s) | "
              "weight sync (s) | step (s) | × synchronous |", "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    rows = hypothetical_rows()
    for row in rows:
        base = next(r for r in rows if (r["trainers"], r["servers"], r["max_staleness"]) ==
                    (row["trainers"], row["servers"], 0))
        lines.append(f"| {row['trainers']} | {row['servers']} | {row['max_staleness']} | {fmt(row['generation'])} | "
                     f"{fmt(row['trainer'])} | {fmt(row['sync'])} | {fmt(row['step'])} | "
                     f"{base['step'] / row['step']:.2f} |")
    lines += ["", "Not shown: any GPU or second machine (the hypothetical rows are the model's arithmetic on assumed "
              "costs, not measurements); NCCL; more than one trainer process with servers; server start-up and the "
              "first two steps of each fit; variance between steps. Here trainer and servers share the same 2 cores, "
              "so overlapping generation with training can only fill the time one side leaves a core idle (the "
              "model's CPU bound); it adds no compute."]
    return "\n".join(lines) + "\n"


def main() -> None:
    from quiet import add_idle_args

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--measure", action="store_true", help="measure costs and run the fits (else: reuse JSONs)")
    parser.add_argument("--repeats", type=int, default=3, help="fits per configuration")
    parser.add_argument("--steps", type=int, default=8, help="optimizer steps per fit (the first 2 are not timed)")
    parser.add_argument("--costs", default=os.path.join(RESULTS, "async_costs.json"))
    parser.add_argument("--reuse-costs", action="store_true", help="with --measure: keep the costs JSON, run the fits")
    parser.add_argument("--results", default=os.path.join(RESULTS, "async_model.json"))
    add_idle_args(parser, "fit")
    args = parser.parse_args()
    sys.path.insert(0, HERE)
    measured = measure(args) if args.measure else None
    if measured is None and os.path.exists(args.results):
        with open(args.results) as f:
            measured = json.load(f).get("fits")
    costs = {}
    if os.path.exists(args.costs):
        with open(args.costs) as f:
            costs = json.load(f)
    table = render(costs, measured if costs else None)
    result = dict(fits=measured, comparison=compare(costs, measured["runs"]) if measured and costs else None,
                  hypothetical=dict(costs=HYPOTHETICAL, workload=dataclasses.asdict(HYPOTHETICAL_WORKLOAD),
                                    steps=hypothetical_rows()))
    if args.measure:
        with open(args.results, "w") as f:
            json.dump(result, f, indent=1)
        with open(args.results.replace(".json", ".md"), "w") as f:
            f.write(table)
    print(table)


if __name__ == "__main__":
    main()
