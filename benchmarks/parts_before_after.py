"""Two parts of the step that changed after 0a48329, before and after, in one process.

`step_before_after.py` times whole steps in separate processes; on a shared 2-core VM their spread
between runs of the same code (±15 %) hides changes of a few percent. This times each changed part
alone, the two versions alternating in one process (``--rounds`` rounds, each the median of
``--reps`` calls per version), at the reference step's shapes (vocabulary 32,000, hidden 256, 128
rows × 32 tokens, fp32):

- the optimizer step of `RLModule`'s default AdamW over the 4 × 256 Llama's parameter shapes
  (torch's unfused AdamW before, ``fused=True`` after);
- the elementwise work of the update's head on one chunk of 256 tokens: the chunk's log-softmax,
  entropies and logits' gradient (two ``exp`` passes before, one after), its logits GEMM run first
  and timed apart.

The before side is the named commit's own source (``git show``), executed as a module.

    python benchmarks/parts_before_after.py --before 0a48329   # ~2 minutes on 2 CPU cores

Writes ``benchmarks/results/parts_before_after.json`` and prints a markdown table.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import types

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)
from quiet import cpu_info, median_seconds  # noqa: E402

# the 4 × 256 Llama (vocabulary 32,000, intermediate 512): embedding and head, norms, 4 layers
SHAPES = ([(32000, 256)] * 2 + [(256,)] * 9 + [(256, 256)] * 16 + [(512, 256)] * 8 + [(256, 512)] * 4)


def at_commit(commit: str, path: str, package: str) -> types.ModuleType:
    """``path`` as it was at ``commit``, executed as a module of ``package``."""
    source = subprocess.run(["git", "-C", ROOT, "show", f"{commit}:{path}"], capture_output=True, text=True,
                            check=True).stdout
    module = types.ModuleType(f"{package}.before_{os.path.basename(path)[:-3]}")
    module.__package__ = package
    exec(compile(source, f"{commit}:{path}", "exec"), module.__dict__)
    return module


def adamw(build):
    import torch
    params = [torch.nn.Parameter(torch.randn(s)) for s in SHAPES]
    for p in params:
        p.grad = torch.randn_like(p)
    optimizer = build(lr=1e-3)(params)
    optimizer.step()  # the state is created on the first step
    return optimizer.step


def head_chunk(module, new: bool):
    import torch
    g = torch.Generator().manual_seed(0)
    u, w = torch.randn(256, 256, generator=g), torch.randn(32000, 256, generator=g) * 0.05
    targets, coef, out = torch.randint(0, 32000, (256,), generator=g), torch.randn(256, generator=g), torch.empty(256, 32000)
    if new:
        return lambda: module._logits_grad_(*module._chunk_softmax(u, w, None, targets, out)[:2], coef, None)
    return lambda: module._logits_grad_(module._chunk_log_softmax(u, w, None, targets, out)[0], coef, None)


def logits_gemm():
    import torch
    u, w, out = torch.randn(256, 256), torch.randn(32000, 256), torch.empty(256, 32000)
    return lambda: torch.mm(u, w.T, out=out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", required=True)
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--out", default=os.path.join(HERE, "results", "parts_before_after.json"))
    args = p.parse_args()
    import torch

    import kernels.head_in_forward as head_now
    from lightning_rlpt.optim import build as build_now
    build_then = at_commit(args.before, "lightning_rlpt/optim/build.py", "lightning_rlpt.optim")
    head_then = at_commit(args.before, "kernels/head_in_forward.py", "kernels")
    parts = {"AdamW step (19M parameters)": (adamw(build_then.default_optimizer), adamw(build_now.default_optimizer)),
             "head chunk, elementwise + logits GEMM (256 tokens)": (head_chunk(head_then, False), head_chunk(head_now, True)),
             "logits GEMM alone (256 × 256 × 32,000)": (logits_gemm(), logits_gemm())}
    result = dict(before_commit=args.before, measured=datetime.date.today().isoformat(), cpu=cpu_info()["model"],
                  cpus=os.cpu_count(), threads=torch.get_num_threads(), rounds=args.rounds, reps=args.reps,
                  command=" ".join(["python", "benchmarks/parts_before_after.py", *sys.argv[1:]]), parts={})
    for name, (before, after) in parts.items():
        before(), after()  # warm-up
        rounds = [(median_seconds(before, args.reps), median_seconds(after, args.reps)) for _ in range(args.rounds)]
        result["parts"][name] = dict(before_s=[b for b, _ in rounds], after_s=[a for _, a in rounds])
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    print(table(result))


def table(result: dict) -> str:
    """The markdown table of a `main` result (docs/results.md renders it through headlines.py)."""
    lines = ["| part | before (ms) | after (ms) | saved (ms) | paired ratios (before / after) |",
             "|---|---:|---:|---:|---|"]
    for name, t in result["parts"].items():
        before, after = statistics.median(t["before_s"]) * 1e3, statistics.median(t["after_s"]) * 1e3
        paired = [b / a for b, a in zip(t["before_s"], t["after_s"])]
        lines.append(f"| {name} | {before:.1f} | {after:.1f} | {before - after:.1f} | "
                     f"{min(paired):.2f}–{max(paired):.2f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
