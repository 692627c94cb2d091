"""Per-completion cost of the code reward's sandbox: today's bubblewrap sandbox (assert-style,
two sandboxes per completion; stdin/stdout, one per case) and its local-unsafe mode, next to the
sandbox it replaced (one ``python -I`` supervisor + forked worker, commit 13e697e).

Each variant runs in its own process (a fresh interpreter, nothing cached between variants),
the variants alternate in each repeat, and each process runs the same 64 completions one after
another (``add`` with three assert tests; the stdin/stdout variant: one case). A completion's
cost is the wall-clock time of its run; a process reports the median over its completions,
and the figure is the median over the repeats. Run from the repository root:

    .venv/bin/python benchmarks/sandbox_overhead.py --repeats 5

Writes benchmarks/results/sandbox_overhead.json.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

BEFORE = "13e697e"  # the last commit with the previous sandbox (sandbox.py + sandbox_child.py)
VARIANTS = ("before", "bwrap", "local-unsafe", "bwrap-stdio")
CODE = "def add(a, b):\n    return a + b\n"
TESTS = ["assert add(1, 2) == 3", "assert add(2, 2) == 4", "assert add(-1, 1) == 0"]
PROGRAM = "a, b = map(int, input().split())\nprint(a + b)\n"


def previous_sandbox(folder: str):
    """The replaced sandbox module, loaded from git into ``folder`` (it needs only the standard library)."""
    for name in ("sandbox.py", "sandbox_child.py"):
        source = subprocess.run(["git", "show", f"{BEFORE}:lightning_rlpt/rewards/{name}"], check=True,
                                capture_output=True, text=True).stdout
        with open(os.path.join(folder, name), "w") as f:
            f.write(source)
    spec = importlib.util.spec_from_file_location("previous_sandbox", os.path.join(folder, "sandbox.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def one_run(variant: str) -> callable:
    """A function that runs one completion under ``variant`` and checks it passed."""
    if variant == "before":
        folder = tempfile.mkdtemp(prefix="rlpt-bench-")
        old = previous_sandbox(folder)
        return lambda: old.run_in_sandbox(CODE, TESTS, timeout=10).passed == (True,) * 3
    from lightning_rlpt.rewards.code.sandbox import Limits, run_program, run_tests
    if variant == "bwrap-stdio":
        return lambda: run_program(PROGRAM, "1 2\n", Limits(timeout=10)).stdout == "3\n"
    return lambda: run_tests(CODE, TESTS, Limits(timeout=10), sandbox=variant).passed == (True,) * 3


def measure(variant: str, completions: int) -> list[float]:
    run = one_run(variant)
    assert run(), f"{variant}: the warm-up completion did not pass"
    times = []
    for _ in range(completions):
        start = time.perf_counter()
        ok = run()
        times.append((time.perf_counter() - start) * 1000)
        assert ok, f"{variant}: a completion did not pass"
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--completions", type=int, default=64)
    parser.add_argument("--variant", choices=VARIANTS, help="(internal) measure one variant in this process")
    parser.add_argument("--results", default="benchmarks/results/sandbox_overhead.json")
    args = parser.parse_args()
    if args.variant:
        print(json.dumps(measure(args.variant, args.completions)))
        return
    runs = {v: [] for v in VARIANTS}
    for r in range(args.repeats):
        order = VARIANTS[r % len(VARIANTS):] + VARIANTS[:r % len(VARIANTS)]  # alternate who goes first
        for variant in order:
            out = subprocess.run([sys.executable, __file__, "--variant", variant, "--completions", str(args.completions)],
                                 check=True, capture_output=True, text=True).stdout
            times = json.loads(out.strip().splitlines()[-1])
            runs[variant].append(statistics.median(times))
            print(f"repeat {r} {variant:>13}: median {runs[variant][-1]:.1f} ms per completion", flush=True)
    result = {"what": "median wall-clock ms per completion (64 completions run one after another, each variant in its "
                      "own process, alternated); 'before' is the sandbox of commit " + BEFORE,
              "completions": args.completions, "repeats": args.repeats,
              "median_ms": {v: round(statistics.median(m), 1) for v, m in runs.items()},
              "run_medians_ms": {v: [round(x, 1) for x in m] for v, m in runs.items()},
              "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "kernel": platform.release(),
                          "load_average_at_end": [round(x, 2) for x in os.getloadavg()]}}
    os.makedirs(os.path.dirname(args.results), exist_ok=True)
    with open(args.results, "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    print(json.dumps(result["median_ms"]))


if __name__ == "__main__":
    main()
