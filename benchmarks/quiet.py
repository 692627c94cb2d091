"""Measuring on a shared machine: wait until other processes are (nearly) idle before a run, and
count the CPU they took during it, so a benchmark can repeat a disturbed run (the policy in
`IDLE`, set from each script's ``--idle-*`` flags). Shared by every script in benchmarks/."""
from __future__ import annotations

import os
import resource
import statistics
import time

# Start a run once others use <= max_busy cores (waiting at most max_wait s); repeat it, at most
# `retries` times, when they took more than max_others cores while it ran.
IDLE = dict(max_busy=0.3, max_wait=300.0, max_others=0.5, retries=2)


def cpu_busy_s() -> float:
    """Seconds of non-idle CPU time, all cores, since boot (from /proc/stat)."""
    with open("/proc/stat") as f:
        vals = [int(x) for x in f.readline().split()[1:]]
    return (sum(vals[:8]) - vals[3] - vals[4]) / os.sysconf("SC_CLK_TCK")


def children_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def wait_for_idle(max_busy: float, max_wait: float) -> tuple[float, float]:
    """Wait until other processes use <= ``max_busy`` cores (2-s samples), at most ``max_wait`` s.

    Returns (cores busy in the last sample, seconds waited). A run that starts beside someone
    else's test suite measures the contention, not the code.
    """
    start = time.perf_counter()
    while True:
        t0, b0 = time.perf_counter(), cpu_busy_s()
        time.sleep(2.0)
        busy = (cpu_busy_s() - b0) / (time.perf_counter() - t0)
        if busy <= max_busy or time.perf_counter() - start >= max_wait:
            return busy, time.perf_counter() - start
        time.sleep(3.0)


def cpu_info() -> dict:
    """CPU model and its bf16 instructions (hosts differ between sessions; bf16 timings depend on them)."""
    model, flags = "unknown", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and model == "unknown":
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return dict(model=model, bf16=sorted(flags & {"avx512_bf16", "amx_bf16"}))


def read_status_kb(field: str) -> int:
    """A ``/proc/self/status`` figure in kB (``VmRSS``: resident now; ``VmHWM``: its peak)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def reset_peak_rss(trim: bool = True) -> None:
    """Reset this process's peak RSS (``VmHWM``) to its current RSS, so the next ``VmHWM`` read is
    the peak of what runs in between. ``trim`` first hands the heap's free pages back to the OS
    (glibc ``malloc_trim``), so memory freed earlier but kept by the allocator is not counted as
    resident before that work and then silently reused by it."""
    if trim:
        import ctypes
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except OSError:  # not glibc: nothing to trim
            pass
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def add_idle_args(parser, what: str = "run") -> None:
    """The ``--idle-*`` flags every benchmark takes (see `IDLE`); apply them with `set_idle`."""
    parser.add_argument("--idle-cores", type=float, default=IDLE["max_busy"],
                        help=f"before each {what}, wait until other processes use at most this many cores")
    parser.add_argument("--idle-wait", type=float, default=IDLE["max_wait"], help="... for at most this many seconds")
    parser.add_argument("--max-others", type=float, default=IDLE["max_others"],
                        help=f"repeat a {what} during which other processes used more than this many cores (mean)")
    parser.add_argument("--retries", type=int, default=IDLE["retries"], help=f"... at most this many times per {what}")


def set_idle(args) -> None:
    IDLE.update(max_busy=args.idle_cores, max_wait=args.idle_wait, max_others=args.max_others, retries=args.retries)


def contention_note(runs: list[dict], gate: dict, cpus: int) -> str:
    """One sentence on what other processes did around ``runs`` (each with ``run_measured``'s
    ``others_cores`` and ``waited_s``, and `repeat_if_disturbed`'s ``discarded``)."""
    others = [r["others_cores"] for r in runs if "others_cores" in r]
    if not others:
        return ""
    return (f"each run started once other processes used ≤ {gate['max_busy']:.1f} cores (waiting ≤ "
            f"{gate['max_wait']:.0f} s; the longest wait was {max(r['waited_s'] for r in runs):.0f} s); "
            f"during the runs other processes used {min(others):.2f}–{max(others):.2f} cores "
            f"(median {statistics.median(others):.2f}) of the {cpus}; runs during which they used more than "
            f"{gate.get('max_others', float('nan')):.1f} cores were repeated (at most {gate.get('retries', 0)} times): "
            f"{sum(len(r.get('discarded', [])) for r in runs)} discarded attempt(s), kept in the JSON.")


def run_measured(cmd: list[str], env: dict | None = None):
    """Wait for an idle machine, then run ``cmd``. Returns the finished process and what the run
    saw: ``wall_s``, ``waited_s``, ``busy_before`` and ``others_cores`` (the CPU other processes
    used meanwhile, in cores: the machine's total minus this run's own)."""
    import subprocess

    busy_before, waited = wait_for_idle(IDLE["max_busy"], IDLE["max_wait"])
    start, cpu0, child0 = time.perf_counter(), cpu_busy_s(), children_cpu_s()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    others = max(0.0, (cpu_busy_s() - cpu0) - (children_cpu_s() - child0)) / wall
    return proc, dict(wall_s=wall, waited_s=waited, busy_before=busy_before, others_cores=others)


def repeat_if_disturbed(run_once, keep: tuple[str, ...], label: str) -> dict:
    """``run_once()`` again (at most ``IDLE["retries"]`` times) while other processes took more than
    ``IDLE["max_others"]`` cores during it; the discarded attempts' ``keep`` fields stay in the result."""
    import sys

    discarded = []
    while True:
        result = run_once()
        if result.get("others_cores", 0.0) <= IDLE["max_others"] or len(discarded) >= IDLE["retries"]:
            return {**result, "discarded": discarded}
        discarded.append({k: result.get(k) for k in keep})
        print(f"  (discarded {label}: other processes used {result['others_cores']:.2f} cores; repeating)",
              file=sys.stderr)


def run_json_child(cmd: list[str], label: str, env: dict | None = None) -> dict:
    """`run_measured` of a child that prints its result as JSON on its last stdout line, merged with
    what the run saw, repeated while disturbed (`repeat_if_disturbed`, keeping ``times``)."""
    import json

    def once():
        out, seen = run_measured(cmd, env)
        if out.returncode != 0:
            raise RuntimeError(f"{label} failed:\n{out.stderr[-3000:]}")
        return {**json.loads(out.stdout.strip().splitlines()[-1]), **seen}
    return repeat_if_disturbed(once, keep=("times", "others_cores"), label=label)


def median_seconds(fn, repeats: int) -> float:
    """The median wall time of ``repeats`` calls of ``fn``."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def write_json(path: str | None, result: dict) -> None:
    """``result`` to ``path`` (indented, newline-terminated), unless ``path`` is None (a quick run)."""
    import json

    if path:
        with open(path, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
