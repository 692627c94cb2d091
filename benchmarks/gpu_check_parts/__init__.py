"""The parts of `benchmarks/gpu_check.py`: one module per concern (kernel accuracy, kernel speed,
the GRPO step beside TRL, the smoke runs), their shared context and timer (`common`), and the
report (`report`). Each part runs in its own process, started by ``gpu_check.py --worker``."""
