"""What every part of `benchmarks/gpu_check.py` shares: its run context (device, dry run, where
records go), the step timer (CUDA events on a GPU, ``perf_counter`` on CPU), the extra-peak-memory
probe, and the `Skipped` signal for a part whose optional peer is missing."""
from __future__ import annotations

import importlib.util
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable

HERE = os.path.dirname(os.path.abspath(__file__))
BENCHMARKS = os.path.dirname(HERE)
ROOT = os.path.dirname(BENCHMARKS)
ARITHMETIC = os.path.join(ROOT, "examples", "arithmetic")
WARM_START = os.path.join(ARITHMETIC, "warm_start")
for _path in (BENCHMARKS, ARITHMETIC):  # vs_trl, logprob_kernel, quiet; the demo's task, run, warm_start
    if _path not in sys.path:
        sys.path.insert(0, _path)


class Skipped(Exception):
    """The part cannot run here (an optional peer is not installed, or it needs CUDA); the
    message says why and how to enable it. Reported as ``skipped``, not as a failure."""


@dataclass
class Context:
    """One part's run: ``dry_run`` (tiny shapes on CPU), ``device`` ("cuda" or "cpu"), ``workdir``
    (shared by the parts of one check, e.g. for the model directory two parts use), and
    ``records`` (a JSON-lines file: each `emit` appends one line at once, so the cases finished
    before a timeout are kept)."""

    dry_run: bool
    device: str
    workdir: str
    records: str

    def emit(self, **record: Any) -> None:
        """Append one result (a flat JSON object) and say it on stderr (the part's log)."""
        with open(self.records, "a") as f:
            f.write(json.dumps(record) + "\n")
        print("record:", json.dumps(record), file=sys.stderr, flush=True)

    @property
    def cuda(self) -> bool:
        return self.device == "cuda"


def require(module: str, install: str) -> None:
    """Raise `Skipped` unless ``module`` is importable (``install``: the command that adds it)."""
    if importlib.util.find_spec(module) is None:
        raise Skipped(f"{module} not installed ({install}); a benchmark peer, never a dependency")


def sync(device: str) -> None:
    if device == "cuda":
        import torch
        torch.cuda.synchronize()


def timed(fn: Callable[[], Any], device: str) -> float:
    """Seconds ``fn`` takes: CUDA events around it on a GPU (device time of the queued work),
    ``time.perf_counter`` on CPU (the timer fallback, stated in every CPU report)."""
    if device == "cuda":
        import torch
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1000.0
    start_s = time.perf_counter()
    fn()
    return time.perf_counter() - start_s


def timer_name(device: str) -> str:
    return "CUDA events" if device == "cuda" else "perf_counter (CPU fallback: no CUDA events)"


def extra_peak_mb(fn: Callable[[], Any], device: str) -> float | None:
    """MiB allocated at the peak of ``fn`` beyond what was allocated before it (CUDA caching
    allocator). None on CPU: one process's RSS peak cannot be reset per case reliably here;
    benchmarks/logprob_kernel.py measures CPU memory with a child per case."""
    if device != "cuda":
        fn()
        return None
    import torch
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 2 ** 20


def median_times(fn: Callable[[], Any], device: str, first_s: float, budget_s: float, most: int = 5) -> list[float]:
    """Timed repeats of ``fn`` after a warm-up that took ``first_s``: as many as fit in
    ``budget_s`` (at least 1, at most ``most``), so a slow candidate cannot eat the part's time."""
    repeats = max(1, min(most, int(budget_s / max(first_s, 1e-6))))
    return [timed(fn, device) for _ in range(repeats)]


def median(values: list[float]) -> float:
    return statistics.median(values)


def peak_gpu_mb(device: str) -> float | None:
    """Peak CUDA memory of this process so far (MiB), None on CPU."""
    if device != "cuda":
        return None
    import torch
    return torch.cuda.max_memory_allocated() / 2 ** 20
