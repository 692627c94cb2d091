"""The demo's one-line result, printed by run.py and rendered from its JSON into the docs
(benchmarks/headlines.py): one function, so the two cannot drift."""


HELD_OUT = 300  # the demo's held-out sums (task.HELD_OUT; this module imports nothing heavy)


def summary(result: dict) -> str:
    before, after = result["before"], result["after"]
    return (f"held-out accuracy (greedy, {HELD_OUT} sums): before {before:.1%}  after {after:.1%}  "
            f"gain {100 * (after - before):+.1f} points  ({result['steps']} GRPO steps in {result['seconds']:.0f} s)")
