"""A reward that runs a completion's Python code against the row's tests in a sandbox."""
from __future__ import annotations

import os
import re
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Sequence

from .sandbox import Outcome, run_in_sandbox
from .text import completion_text, required_column

# A fenced block: its label, its body. Blocks are matched left to right, so a closing fence is
# never taken for an opening one.
FENCE = re.compile(r"```[ \t]*([^\n`]*?)[ \t]*\n(.*?)```", re.DOTALL)
PYTHON_LABELS = ("", "python", "python3", "py")


def extract_code(text: str) -> str:
    """The last fenced Python block of ``text`` (```` ```python ````, ```` ```py ```` or an
    unlabelled ```` ``` ````), or the whole text when it has none.

    Example:
        >>> extract_code("First try:\\n```python\\nx = 1\\n```\\nBetter:\\n```python\\nx = 2\\n```")
        'x = 2\\n'
        >>> extract_code("x = 3")
        'x = 3'
    """
    blocks = [body for label, body in FENCE.findall(text) if label.lower() in PYTHON_LABELS]
    return blocks[-1] if blocks else text


class SandboxLimitError(RuntimeError):
    """A completion's code was killed at a limit (timeout, memory, CPU) or by a signal."""


class CodeExecutionReward:
    """The fraction of a row's tests that the completion's code passes, run in a sandbox.

    The code is the completion's last ```` ```python ```` block (`extract_code`), or the whole
    completion when it has none. Each row's tests are Python snippets, usually assert
    statements (MBPP's ``test_list`` form), e.g. ``["assert add(1, 2) == 3", "assert add(0, 0) == 0"]``;
    a single string is one test (e.g. HumanEval's ``check(candidate)`` program). The code runs
    once; then each test runs in its namespace and passes when it raises nothing. Code that
    raises or does not compile fails every test. open-r1's ``code_reward`` (pass rate) and
    ``binary_code_reward`` (all or nothing) score the same way, on stdin/stdout cases instead;
    it scores a completion without a ```` ```python ```` block as empty code.

    Each completion runs in a fresh ``python -I`` subprocess (`lightning_rlpt.rewards.sandbox`):
    its own temporary working directory, a clean environment, a wall-clock ``timeout``, a
    ``memory_mb`` address-space limit, a CPU-time limit, a file-size limit, output discarded, and
    no network (a network namespace where the kernel allows it; the first call warns when only
    the weaker socket guard is available). Every process the code starts is killed and reaped.
    It guards against runaway code, not against code written to break out: the code runs as
    your user. Fork bombs are not limited (``RLIMIT_NPROC`` counts all of a user's processes,
    the trainer's too), though the sandbox kills whatever the code forked when it ends.

    *Killed samples.* Code stopped by the timeout, the memory limit or a signal has no score: the
    call raises `SandboxLimitError` naming the samples, and ``RLModule(reward_on_error=...)``
    decides (``"raise"`` stops the run naming the sample; ``"zero"`` scores it 0 and counts it in
    ``rewards/code/failures``). `RewardFunctions` then calls the reward sample by sample to find
    the failures; the reward keeps the outcomes of the failed batch and answers those calls from
    them, so no code runs twice.

    Args:
        tests_column: the dataset column holding each row's tests.
        timeout: wall-clock seconds for a completion's code and all its tests.
        memory_mb: address-space limit of the code's process, in MiB.
        max_workers: completions run at once; default ``min(8, os.cpu_count())``.
        binary: 1.0 only when every test passes, else 0.0, instead of the pass rate.
        network: ``"auto"`` (a network namespace if possible, else the socket guard) or
            ``"guard"`` (the socket guard only).
        max_file_mb: size limit of each file the code writes.

    Example:
        >>> reward = CodeExecutionReward(timeout=5)
        >>> tests = ["assert add(1, 2) == 3", "assert add(2, 2) == 4"]
        >>> reward(["Write add."] * 2, ["```python\\ndef add(a, b): return a + b\\n```", "def add(a, b): return 3"],
        ...        tests=[tests, tests])
        [1.0, 0.5]
    """

    __name__ = "code"  # logged as rewards/code/...

    def __init__(self, tests_column: str = "tests", *, timeout: float = 10.0, memory_mb: int = 1024,
                 max_workers: int | None = None, binary: bool = False, network: str = "auto", max_file_mb: int = 16):
        if not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds (got {timeout!r})")
        if memory_mb < 64:
            raise ValueError(f"memory_mb={memory_mb!r} is too small for a Python process; give at least 64 (MiB)")
        if max_workers is not None and max_workers < 1:
            raise ValueError(f"max_workers must be >= 1 (got {max_workers!r})")
        if network not in ("auto", "guard"):
            raise ValueError(f"network must be 'auto' or 'guard' (got {network!r})")
        self.tests_column, self.timeout, self.memory_mb, self.binary = tests_column, timeout, memory_mb, binary
        self.max_workers = max_workers or min(8, os.cpu_count() or 1)
        self.network, self.max_file_mb = network, max_file_mb
        self._kept: dict[tuple, Outcome] = {}  # the outcomes of the last batch that had killed samples
        self._lock = threading.Lock()
        self._warned_guard = False

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **columns: Any) -> list[float]:
        tests = self._tests(columns, len(completions))  # every row checked before any code runs
        keys = [(extract_code(completion_text(c)), t) for c, t in zip(completions, tests)]
        outcomes = self._outcomes(keys)
        killed = [i for i, o in enumerate(outcomes) if o.killed]
        if killed:
            raise SandboxLimitError(self._describe(killed, outcomes))
        return [self.score(o) for o in outcomes]

    def score(self, outcome: Outcome) -> float:
        passed = sum(outcome.passed)
        if self.binary:
            return float(passed == len(outcome.passed))
        return passed / len(outcome.passed)

    def _outcomes(self, keys: list[tuple]) -> list[Outcome]:
        with self._lock:
            known = {k: self._kept[k] for k in keys if k in self._kept}
        todo = list(dict.fromkeys(k for k in keys if k not in known))
        with ThreadPoolExecutor(min(self.max_workers, max(1, len(todo)))) as pool:
            ran = dict(zip(todo, pool.map(self._run, todo)))
        if ran:  # a new batch (not the sample-by-sample retry of the last one)
            with self._lock:
                self._kept = ran if any(o.killed for o in ran.values()) else {}
        return [known.get(k) or ran[k] for k in keys]

    def _run(self, key: tuple) -> Outcome:
        code, tests = key
        outcome = run_in_sandbox(code, tests, timeout=self.timeout, memory_mb=self.memory_mb,
                                 max_file_mb=self.max_file_mb, network=self.network)
        if outcome.network == "guard" and self.network == "auto" and not self._warned_guard:
            self._warned_guard = True
            warnings.warn("no network namespace is available here (needs root or unprivileged user namespaces): the "
                          "code sandbox blocks Python's sockets only, which code using ctypes can get past", stacklevel=2)
        return outcome

    def _describe(self, killed: list[int], outcomes: list[Outcome]) -> str:
        limits = {"timeout": f"ran past timeout={self.timeout}s", "memory": f"went past memory_mb={self.memory_mb}"}
        why = limits.get(outcomes[killed[0]].status, "was " + outcomes[killed[0]].status)
        what = (f"the code was killed: it {why}" if len(outcomes) == 1 else
                f"the code of {len(killed)} of {len(outcomes)} completions was killed (sample {killed[0]} {why})")
        return (f"{what}. If correct solutions need more, raise CodeExecutionReward(timeout=..., memory_mb=...); "
                "reward_on_error='zero' scores such samples 0")

    def _tests(self, columns: dict[str, Any], n: int) -> list[tuple[str, ...]]:
        rows = required_column(columns, self.tests_column, n, reward="code reward", holds="the tests",
                               example_source="test_list", option="CodeExecutionReward(tests_column='test_list')")
        out = []
        for i, row in enumerate(rows):
            tests = (row,) if isinstance(row, str) else tuple(row) if isinstance(row, (list, tuple)) else None
            if not tests or not all(isinstance(t, str) and t.strip() for t in tests):
                raise ValueError(f"row {i} of column {self.tests_column!r} is {str(row)[:80]!r}: give a non-empty list "
                                 "of Python test snippets, e.g. ['assert add(1, 2) == 3'], or one string")
            out.append(tests)
        return out

    def __getstate__(self) -> dict:  # picklable: no lock, no kept outcomes
        return {k: v for k, v in self.__dict__.items() if k not in ("_lock", "_kept")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _lock=threading.Lock(), _kept={})


code_reward = CodeExecutionReward()
"""`CodeExecutionReward` with its defaults (tests in column ``tests``), for configs to name."""
