"""Part ``kernel_speed``: forward + backward time and extra peak memory of the training-shaped
step (gradients through the log-probs, entropy detached) for every log-prob candidate.

Time: the median of 2-5 timed repeats after one warm-up step (which pays Triton compilation and
the op's first-use choice), as many as fit in a few seconds, CUDA events on a GPU. Memory: CUDA memory allocated at the step's
peak beyond what was allocated before it (inputs and their gradient buffers from an earlier
step are freed first, so the gradients the step returns are counted, the same for every
candidate). Each case emits its record at once; an out-of-memory candidate is recorded and the
next one runs.
"""
from __future__ import annotations

import torch

from .common import Context, Skipped, extra_peak_mb, median, median_times, timed, timer_name
from .kernel_ops import candidates, chosen, make_inputs, training_step

# (H, V, tokens, dtype): both LM heads at 16k tokens in bf16, and at 8k in fp32 (fp32 matmuls
# are several times slower, and 8k keeps the part inside its time bound).
CASES = [(896, 151936, 16384, torch.bfloat16), (4096, 128256, 16384, torch.bfloat16),
         (896, 151936, 8192, torch.float32), (4096, 128256, 8192, torch.float32)]
DRY_CASES = [(64, 5000, 96, torch.bfloat16), (64, 5000, 96, torch.float32)]
CASE_BUDGET_S, DRY_CASE_BUDGET_S = 2.5, 0.2  # timed repeats per candidate fit in this (2 to 5 of them)


def measure(fn, hidden, weight, targets, coef, device: str, budget_s: float) -> dict[str, float | list[float] | None]:
    step = lambda: training_step(fn, hidden, weight, targets, coef)  # noqa: E731
    first = timed(step, device)
    timed_once = []  # the first timed repeat also gives the memory (a slow candidate pays one step less)
    memory = extra_peak_mb(lambda: timed_once.append(timed(step, device)), device)
    times = timed_once + median_times(step, device, first, budget_s, most=4)
    return dict(ms=1000 * median(times), times_ms=[1000 * t for t in times], first_ms=1000 * first, extra_mb=memory)


def run(ctx: Context) -> None:
    cands = candidates(ctx.device, train=True)
    for name, fn in cands.items():
        if isinstance(fn, Skipped):
            ctx.emit(case=name, candidate=name, skipped=str(fn))
    for h, v, n, dtype in DRY_CASES if ctx.dry_run else CASES:
        hidden, weight, targets, coef = make_inputs(n, h, v, dtype, ctx.device)
        for name, fn in cands.items():
            if isinstance(fn, Skipped):
                continue
            case = dict(case=f"{name} N{n} H{h} V{v} {str(dtype)[6:]}", candidate=name, h=h, v=v, n=n,
                        dtype=str(dtype)[6:], timer=timer_name(ctx.device))
            try:
                result = measure(fn, hidden, weight, targets, coef, ctx.device,
                                 DRY_CASE_BUDGET_S if ctx.dry_run else CASE_BUDGET_S)
                if name == "fused:auto":
                    result["chosen"] = chosen(hidden, weight)
                ctx.emit(**case, **result)
            except torch.cuda.OutOfMemoryError as exc:
                ctx.emit(**case, error=f"out of memory: {str(exc)[:200]}")
            except Exception as exc:  # one candidate failing must not hide the others
                ctx.emit(**case, error=f"{type(exc).__name__}: {str(exc)[:300]}")
            hidden.grad = weight.grad = None
            if ctx.cuda:
                torch.cuda.empty_cache()
        del hidden, weight
