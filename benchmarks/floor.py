"""Floors as figures: this machine's GEMM peak, and the FLOP floor of a GRPO step.

A step time means little alone; divided by the time the step's matrix products alone would take
at the machine's peak it says how far the framework is from the hardware. This script gives both:

- the peak: achieved FLOP/s of one large ``torch.mm`` (m = n = k = ``--gemm``, 2·m·n·k FLOPs),
  fp32 and bf16, on the CPU with torch's default thread count, and with cuBLAS where CUDA is
  available; bf16 on the CPU only where it has bf16 dot-product instructions (avx512_bf16 or
  AMX), since without them torch emulates bf16 and the figure would be no peak;
- the floor: the GEMM FLOPs of a GRPO step of a given shape (`floor_flops`), split into the
  update (forward + backward of the policy, old/reference forwards) and the rollout (prefill and
  decode of every generated token), in seconds at a given peak (`floor`), and a measured step
  time's ratio to it (`ratio_to_floor`, for other benchmarks to call).

Only matrix products count (linear layers, LM head, attention scores and their weighted sums);
norms, activations, softmax, sampling, the optimizer and the embedding lookup are left out, so the
floor is a lower bound that no implementation can beat at that peak.

    python benchmarks/floor.py --measure        # peaks -> benchmarks/results/floor.json, then the reference floor
    python benchmarks/floor.py --measure --idle-wait 300   # first wait (<= 300 s) for a quiet machine
    python benchmarks/floor.py                  # the reference floor at the peaks already in floor.json
    python benchmarks/floor.py --measure --gemm 256 --out /tmp/floor.json   # a quick smoke run
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from quiet import cpu_busy_s, cpu_info, wait_for_idle  # noqa: E402  (benchmarks/quiet.py)
from vs_trl_report import GROUP, MAX_NEW, PROMPTS, SIZES  # noqa: E402  (the reference step's settings)

RESULTS = os.path.join(HERE, "results", "floor.json")
# vs_trl's prompts are "<s>ab+cd=" with 10 <= a, b <= 99 (examples/arithmetic/task.py): 7 tokens each.
VS_TRL_PROMPT_LEN = 7


@dataclass(frozen=True)
class Decoder:
    """A Llama-like decoder: attention (q, k, v, o projections, grouped-query: ``kv_heads`` <= ``heads``)
    and a gated MLP (gate, up, down) per layer, then the LM head; ``tied``: the head is the embedding."""
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool = False


@dataclass(frozen=True)
class Rollout:
    """One GRPO step's batch: ``prompts`` × ``group`` sequences of ``prompt_len`` + ``new_tokens``
    tokens (every completion runs to the budget); ``beta`` the KL coefficient (> 0: a reference
    forward), ``mu`` the updates per rollout (> 1: an old-policy forward, and ``mu`` updates)."""
    prompts: int
    group: int
    prompt_len: int
    new_tokens: int
    beta: float = 0.0
    mu: int = 1

    @property
    def sequences(self) -> int:
        return self.prompts * self.group


@dataclass(frozen=True)
class Step:
    """What `floor_flops` needs: the model and the rollout."""
    model: Decoder
    rollout: Rollout


def vs_trl_model(size: str = "vocab32k") -> Decoder:
    """The model `benchmarks/vs_trl.py` trains for throughput (its ``model_dir``): ``SIZES[size]``'s
    layers, hidden and vocabulary; intermediate 2·hidden, hidden/64 heads of 64, as many kv heads, untied."""
    s = SIZES[size]
    return Decoder(layers=s["layers"], hidden=s["hidden"], intermediate=2 * s["hidden"], heads=s["hidden"] // 64,
                   kv_heads=s["hidden"] // 64, head_dim=64, vocab=s["vocab"], tied=False)


def reference_step() -> Step:
    """The issue's reference step: vs_trl's 4 × 256 model with a 32,000 vocabulary, 16 prompts × 8
    completions × 32 new tokens, its 7-token prompts, β = 0, one update per rollout."""
    return Step(vs_trl_model("vocab32k"), Rollout(prompts=PROMPTS, group=GROUP, prompt_len=VS_TRL_PROMPT_LEN,
                                                  new_tokens=MAX_NEW, beta=0.0, mu=1))


# ---------------------------------------------------------------------------------------------
# Parameters


def layer_params(m: Decoder) -> int:
    """Weights of one layer's matrix products: q and o are hidden × heads·head_dim each, k and v
    hidden × kv_heads·head_dim each, the MLP's gate, up and down hidden × intermediate each.
    (Its two RMSNorm weights are not matrix products; `parameters` adds them.)"""
    q_and_o = 2 * m.hidden * m.heads * m.head_dim
    k_and_v = 2 * m.hidden * m.kv_heads * m.head_dim
    return q_and_o + k_and_v + 3 * m.hidden * m.intermediate


def parameters(m: Decoder) -> int:
    """Every parameter, as ``sum(p.numel() for p in model.parameters())`` counts them: the embedding
    (vocab × hidden), each layer's `layer_params` plus its 2 RMSNorm weights (hidden each), the final
    norm (hidden), and the head (vocab × hidden) only when untied: a tied head is the embedding, counted once."""
    embedding = m.vocab * m.hidden
    head = 0 if m.tied else m.vocab * m.hidden
    return embedding + m.layers * (layer_params(m) + 2 * m.hidden) + m.hidden + head


def params_per_token(m: Decoder) -> int:
    """Weights one token's forward multiplies by (Kaplan et al. 2020's non-embedding N, plus the head):
    every layer's `layer_params` and the head's vocab × hidden, tied or not (a tied head is still a
    GEMM); the embedding is a lookup, no FLOPs."""
    return m.layers * layer_params(m) + m.vocab * m.hidden


# ---------------------------------------------------------------------------------------------
# FLOPs


def attention_flops(m: Decoder, first: int, last: int) -> int:
    """Forward FLOPs of the attention scores (QKᵀ) and their weighted sum (·V) for one sequence's
    queries at positions ``first`` .. ``last`` - 1 (0-based), each attending causally to itself and
    all positions before it: a query at position i costs 2·heads·head_dim·(i + 1) for QKᵀ and as much
    for ·V, in every layer. Summed: 4·layers·heads·head_dim·Σ(i + 1), Σ(i + 1) = (last·(last + 1) -
    first·(first + 1)) / 2. Chinchilla (Hoffmann et al. 2022, app. F) counts the full square, twice
    this causal count; kv heads change only the k/v projections (`layer_params`), not these FLOPs."""
    positions = (last * (last + 1) - first * (first + 1)) // 2
    return 4 * m.layers * m.heads * m.head_dim * positions


def update_flops(s: Step) -> dict[str, int]:
    """FLOPs of the update: the policy's forward and backward over the rollout, ``mu`` times, plus the
    forwards that give the old (``mu`` > 1) and reference (``beta`` > 0) log-probs.

    With N = sequences·(prompt_len + new_tokens) tokens and C = sequences·new_tokens scored positions:
    - ``update_layers``: 6·P_layers·N (Kaplan's 6N per trained token: forward 2·P·N, backward twice
      that), P_layers = layers·`layer_params`; the decoder runs over every token of the sequences;
    - ``update_head``: 3 GEMMs of 2·C·hidden·vocab each (logits, gradient of the hidden states,
      gradient of the head weight); the head scores only the C positions that predict a completion
      token (lightning_rlpt.model.logprobs), not the prompt's;
    - ``update_attention``: 3 × `attention_flops` over every position (backward = 2 × forward);
    - ``old_ref_forward``: per extra forward (old policy when mu > 1, reference when beta > 0),
      2·P_layers·N + 2·C·hidden·vocab + `attention_flops`: forward only, no gradient.
    The first three are multiplied by ``mu`` (each update runs them again)."""
    m, r = s.model, s.rollout
    seq_len = r.prompt_len + r.new_tokens
    tokens, scored = r.sequences * seq_len, r.sequences * r.new_tokens
    layers_fwd = 2 * m.layers * layer_params(m) * tokens
    head_fwd = 2 * scored * m.hidden * m.vocab
    attention_fwd = r.sequences * attention_flops(m, 0, seq_len)
    extra_forwards = int(r.beta > 0) + int(r.mu > 1)
    return dict(update_layers=r.mu * 3 * layers_fwd, update_head=r.mu * 3 * head_fwd,
                update_attention=r.mu * 3 * attention_fwd,
                old_ref_forward=extra_forwards * (layers_fwd + head_fwd + attention_fwd))


def rollout_flops(s: Step) -> dict[str, int]:
    """FLOPs of generating the completions (a KV cache: every position's forward runs once).

    Generated token t (1 .. new_tokens) comes from the forward of the position before it, the
    prompt's last for t = 1: those G = sequences·new_tokens positions each cost 2·`params_per_token`
    (Kaplan's 2N per forward token, head included) and their attention over the context so far:
    - ``decode_layers``: 2·P_layers·G; ``decode_head``: 2·hidden·vocab·G;
    - ``decode_attention``: `attention_flops` of positions prompt_len - 1 .. prompt_len + new_tokens - 2;
    - ``prefill``: the prompt's other prompt_len - 1 positions, layers only (their logits are
      never needed): 2·P_layers·sequences·(prompt_len - 1) + `attention_flops` of positions 0 .. prompt_len - 2."""
    m, r = s.model, s.rollout
    layers = m.layers * layer_params(m)
    generated = r.sequences * r.new_tokens
    first, last = r.prompt_len - 1, r.prompt_len + r.new_tokens - 1
    prefill = 2 * layers * r.sequences * first + r.sequences * attention_flops(m, 0, first)
    return dict(decode_layers=2 * layers * generated, decode_head=2 * m.hidden * m.vocab * generated,
                decode_attention=r.sequences * attention_flops(m, first, last), prefill=prefill)


def floor_flops(s: Step) -> dict[str, int]:
    """Every part of `update_flops` and `rollout_flops`, with their sums ``update``, ``rollout`` and ``step``."""
    update, rollout = update_flops(s), rollout_flops(s)
    return {**update, **rollout, "update": sum(update.values()), "rollout": sum(rollout.values()),
            "step": sum(update.values()) + sum(rollout.values())}


def floor(s: Step, peak: float | None = None) -> dict:
    """``{"flops": floor_flops(s)}``, and with a ``peak`` (FLOP/s) ``"seconds"``: each part's FLOPs / peak."""
    flops = floor_flops(s)
    out: dict = {"flops": flops}
    if peak:
        out["peak_flop_per_s"] = peak
        out["seconds"] = {k: v / peak for k, v in flops.items()}
    return out


def ratio_to_floor(step_seconds: float, shape: Step, peak: float) -> float:
    """A measured step time over the step's floor at ``peak`` FLOP/s (>= 1 unless the peak is understated)."""
    return step_seconds / (floor_flops(shape)["step"] / peak)


# ---------------------------------------------------------------------------------------------
# The peak


def time_mm(size: int, dtype, device: str, reps: int, warmup: int) -> dict:
    """Median achieved FLOP/s of ``torch.mm`` on size × size matrices (2·size³ FLOPs each) over
    ``reps`` timed calls after ``warmup`` untimed ones (first calls pay allocation and kernel choice)."""
    import torch
    a = torch.randn(size, size, device=device).to(dtype)
    b = torch.randn(size, size, device=device).to(dtype)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for _ in range(warmup):
        torch.mm(a, b)
    sync()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        torch.mm(a, b)
        sync()
        times.append(time.perf_counter() - start)
    flop_per_s = 2 * size ** 3 / statistics.median(times)
    return dict(flop_per_s=flop_per_s, gflops=flop_per_s / 1e9, m=size, n=size, k=size, reps=reps, warmup=warmup,
                seconds=times)


def measure_peaks(size: int, reps: int, warmup: int) -> dict:
    """`time_mm` for fp32 and bf16 on the CPU (bf16 only with native bf16 instructions, else
    ``skipped`` says why), and on CUDA when available (cuBLAS, at torch's default fp32 precision)."""
    import torch
    peaks = {"cpu_fp32": time_mm(size, torch.float32, "cpu", reps, warmup)}
    flags = cpu_info()["bf16"]
    if flags:
        peaks["cpu_bf16"] = {**time_mm(size, torch.bfloat16, "cpu", reps, warmup), "cpu_flags": flags}
    else:
        peaks["cpu_bf16"] = {"skipped": "no avx512_bf16 or amx_bf16 in /proc/cpuinfo: torch would emulate bf16 "
                                        "with fp32 instructions, so its rate is no peak"}
    if torch.cuda.is_available():
        peaks["cuda_fp32"] = {**time_mm(size, torch.float32, "cuda", reps, warmup),
                              "allow_tf32": torch.backends.cuda.matmul.allow_tf32}
        peaks["cuda_bf16"] = time_mm(size, torch.bfloat16, "cuda", reps, warmup)
    return peaks


def machine() -> dict:
    import torch
    info = cpu_info()
    return dict(cpus=os.cpu_count(), cpu_model=info["model"], cpu_bf16_flags=info["bf16"],
                cpu_capability=torch.backends.cpu.get_cpu_capability(), torch=torch.__version__,
                threads=torch.get_num_threads(), python=platform.python_version(),
                cuda=torch.cuda.get_device_name() if torch.cuda.is_available() else None)


def measure(size: int, reps: int, warmup: int, idle_cores: float = 0.3, idle_wait: float = 0.0) -> dict:
    """The peaks, the machine, and what else ran meanwhile (the machine is shared): the 1-minute load
    average before and after, and the cores other processes used during the measurement. With
    ``idle_wait`` > 0, first wait (at most that many seconds) until others use <= ``idle_cores`` cores."""
    idle = None
    if idle_wait > 0:
        busy, waited = wait_for_idle(idle_cores, idle_wait)
        idle = dict(max_busy=idle_cores, max_wait=idle_wait, busy_before=busy, waited_s=waited)
    load_before, wall0, busy0, own0 = os.getloadavg()[0], time.perf_counter(), cpu_busy_s(), time.process_time()
    peaks = measure_peaks(size, reps, warmup)
    wall = time.perf_counter() - wall0
    others = max(0.0, (cpu_busy_s() - busy0) - (time.process_time() - own0)) / wall
    return dict(date=datetime.datetime.now().isoformat(timespec="seconds"), machine=machine(), peaks=peaks,
                load_1min=dict(before=load_before, after=os.getloadavg()[0]), others_cores=others,
                measure_s=wall, idle_gate=idle)


# ---------------------------------------------------------------------------------------------
# The CLI


def report(s: Step, peaks: dict) -> str:
    """The floor of ``s`` as a table: each part's GFLOPs and seconds at every measured peak."""
    names = [k for k, v in peaks.items() if "flop_per_s" in v]
    flops = floor_flops(s)
    lines = ["| part | GFLOP | " + " | ".join(f"s at {k} ({peaks[k]['gflops']:.0f} GFLOP/s)" for k in names) + " |",
             "|---|---:|" + "---:|" * len(names)]
    for part, f in flops.items():
        secs = " | ".join(f"{f / peaks[k]['flop_per_s']:.3f}" for k in names)
        lines.append(f"| {part} | {f / 1e9:,.1f} | {secs} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--measure", action="store_true", help="measure the GEMM peaks and write --out")
    p.add_argument("--gemm", type=int, default=4096, help="m = n = k of the timed torch.mm")
    p.add_argument("--reps", type=int, default=5, help="timed repetitions (their median counts)")
    p.add_argument("--warmup", type=int, default=2, help="untimed calls first")
    p.add_argument("--idle-wait", type=float, default=0.0,
                   help="first wait at most this many seconds for other processes to go (nearly) idle (0: don't)")
    p.add_argument("--idle-cores", type=float, default=0.3, help="... 'idle': they use at most this many cores")
    p.add_argument("--out", default=RESULTS, help="the JSON written by --measure and read otherwise")
    args = p.parse_args(argv)
    s = reference_step()
    if args.measure:
        result = measure(args.gemm, args.reps, args.warmup, args.idle_cores, args.idle_wait)
        result["reference"] = dict(step=asdict(s), parameters=parameters(s.model), floor_flops=floor_flops(s))
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
        print(f"wrote {args.out}")
    else:
        with open(args.out) as f:
            result = json.load(f)
    for name, peak in result["peaks"].items():
        print(f"{name}: " + (f"{peak['gflops']:.1f} GFLOP/s ({peak['m']}³, median of {peak['reps']})"
                             if "gflops" in peak else f"skipped: {peak['skipped']}"))
    print(f"threads {result['machine']['threads']}, load (1 min) {result['load_1min']['before']:.2f} → "
          f"{result['load_1min']['after']:.2f}, other processes {result['others_cores']:.2f} cores"
          + (f" (after waiting {result['idle_gate']['waited_s']:.0f} s for them to go idle)"
             if result.get("idle_gate") else ""))
    print(f"\nfloor of the reference step ({s.rollout.prompts} prompts × {s.rollout.group} × "
          f"({s.rollout.prompt_len} + {s.rollout.new_tokens}) tokens, {s.model.layers} × {s.model.hidden} Llama, "
          f"vocab {s.model.vocab:,}, {parameters(s.model):,} parameters, β {s.rollout.beta}):")
    print(report(s, result["peaks"]))


if __name__ == "__main__":
    main()
