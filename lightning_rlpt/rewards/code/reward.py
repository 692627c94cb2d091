"""A reward that runs a completion's Python code against the row's tests in a sandbox (``sandbox.py``)."""
from __future__ import annotations

import os
import re
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Sequence

from .formats import COMPARE, StdioCases, check_code_prefix, code_prefixes, parse_row, refuse_idle_tests, same_output
from .sandbox import Limits, Outcome, run_program, run_tests
from .sandbox_launch import MODES, check_mode
from ..text import completion_text, required_column

# A fenced block: its label, its body. Blocks are matched left to right, so a closing fence is
# never taken for an opening one.
FENCE = re.compile(r"```[ \t]*([^\n`]*?)[ \t]*\n(.*?)```", re.DOTALL)
PYTHON_LABELS = ("", "python", "python3", "py")


def extract_code(text: str) -> str:
    """The last fenced Python block of ``text`` (```` ```python ````, ```` ```py ```` or an
    unlabelled ```` ``` ````), or the whole text when it has none.

    Examples:
        >>> extract_code("First try:\\n```python\\nx = 1\\n```\\nBetter:\\n```python\\nx = 2\\n```")
        'x = 2\\n'
        >>> extract_code("x = 3")
        'x = 3'
    """
    blocks = [body for label, body in FENCE.findall(text) if label.lower() in PYTHON_LABELS]
    return blocks[-1] if blocks else text


class SandboxLimitError(RuntimeError):
    """A completion's code has no score: it was killed at a limit (time, memory, CPU) or by a
    signal, or its verdict could not be trusted (the checker died, or its report was malformed)."""


class CodeExecutionReward:
    """The fraction of a row's tests that the completion's code passes, run in a sandbox.

    The code is the completion's last ```` ```python ```` block (`extract_code`), or the whole
    completion when it has none. A row's tests come in two formats (``code_tests.py``):

    - *assert-style*: Python snippets (MBPP's ``test_list``), e.g. ``["assert add(1, 2) == 3"]``,
      or one string (HumanEval's ``check(candidate)`` program). The code is loaded once in a
      sandboxed process; the tests run in a second, clean interpreter where the code's functions
      and classes are proxies, so only plain return values cross back (``sandbox.py``): code
      that patches builtins, walks the stack or returns an always-equal object passes nothing.
      A test passes when it raises nothing; code that raises or does not compile fails all.
    - *stdin/stdout*: ``{"inputs": [...], "outputs": [...]}`` (or a list of ``{"input", "output"}``
      dicts). The code runs as a program once per input, in a fresh sandbox each time; its
      output is compared in the trainer (``compare``). A case passes when the program exits 0
      and its output matches.

    The sandbox is bubblewrap (``sandbox="bwrap"``): its own user, PID, network, IPC and UTS
    namespaces, no capabilities, a read-only view of only the interpreter, a private ``/tmp``,
    a cleared environment, rlimits, capped output. Where ``bwrap`` is missing the first call
    raises `SandboxUnavailable` naming the package, before any code runs, unless you opt into
    ``sandbox="local-unsafe"`` (rlimits only: code written to escape gets out; it warns).
    docs/rewards.md says what the sandbox guarantees and costs.

    *Benchmark formats.* HumanEval's completions continue the prompt (a function body), and its
    prompts hold the imports and helpers the function needs. ``code_prefix="prompt"`` runs
    prompt + completion, as HumanEval's own harness does (``code_prefix="<column>"`` takes the
    prefix from a dataset column instead, e.g. for chat prompts); a completion that repeats the
    whole function then simply redefines it. Code that does not load scores 0, and the reason is
    kept: `load_errors` holds it per completion of the last call, their number is logged as
    ``rewards/<name>/load_errors``, and a batch where no completion's code loaded warns with the first reason (an import missing from every sandbox,
    a body without its prompt), so a broken set-up does not pass for a model that is wrong.

    *Killed samples.* Code stopped by the timeout, the memory limit or a signal, or whose
    verdict cannot be trusted, has no score: the call raises `SandboxLimitError` naming the
    samples, and ``RLModule(reward_on_error=...)`` decides (``"raise"`` stops the run naming the
    sample; ``"zero"`` scores it 0 and counts it in ``rewards/code/failures``), never a pass.
    `RewardFunctions` then calls the reward sample by sample to find the failures; the reward
    keeps the outcomes of the failed batch and answers those calls from them, so no code runs twice.

    Args:
        tests_column: the dataset column holding each row's tests.
        timeout: wall-clock seconds for a completion's code and all its assert tests, or for one
            stdin/stdout case.
        memory_mb: address-space limit of each sandboxed process, in MiB.
        max_workers: completions run at once; default ``max(8, os.cpu_count())``: a sandbox's
            start-up is mostly waiting, so on 2 cores 8 workers ran HumanEval's 164 solutions
            1.27x faster than 2 (``benchmarks/code_reward_workers.py``; 16 gained nothing more).
        binary: 1.0 only when every test passes, else 0.0, instead of the pass rate.
        sandbox: ``"bwrap"`` or ``"local-unsafe"``.
        compare: stdin/stdout outputs: ``"lines"`` (trailing whitespace and blank lines ignored)
            or ``"exact"``.
        max_file_mb: all bytes the code may keep written (per file with ``"local-unsafe"``).
        max_processes: processes and threads the code may run at once.
        max_output_mb: standard output read back per stdin/stdout case.
        code_prefix: ``None`` (the completion's code alone), ``"prompt"`` (the prompt, a string,
            then the completion: HumanEval's format) or the name of a column holding each row's prefix.

    Examples:
        >>> reward = CodeExecutionReward(timeout=5)
        >>> tests = ["assert add(1, 2) == 3", "assert add(2, 2) == 4"]
        >>> reward(["Write add."] * 2, ["```python\\ndef add(a, b): return a + b\\n```", "def add(a, b): return 3"],
        ...        tests=[tests, tests])
        [1.0, 0.5]
    """

    __name__ = "code"  # logged as rewards/code/...

    def __init__(self, tests_column: str = "tests", *, timeout: float = 10.0, memory_mb: int = 1024,
                 max_workers: int | None = None, binary: bool = False, sandbox: str = "bwrap", compare: str = "lines",
                 max_file_mb: int = 16, max_processes: int = 32, max_output_mb: float = 1.0,
                 code_prefix: str | None = None):
        if max_workers is not None and max_workers < 1:
            raise ValueError(f"max_workers must be >= 1 (got {max_workers!r})")
        if sandbox not in MODES:
            raise ValueError(f"sandbox must be one of {MODES} (got {sandbox!r})")
        if compare not in COMPARE:
            raise ValueError(f"compare must be one of {COMPARE} (got {compare!r})")
        self.limits = Limits(timeout, memory_mb, max_file_mb, max_processes, max_output_mb)
        self.tests_column, self.binary, self.sandbox, self.compare = tests_column, binary, sandbox, compare
        self.code_prefix = check_code_prefix(code_prefix)
        self.load_errors: list[str] = []  # why each completion's code of the last call did not load ("" if it did)
        self.counts = {"load_errors": 0}  # logged as rewards/<name>/load_errors (RewardFunctions.call_counts)
        self.max_workers = max_workers or max(8, os.cpu_count() or 1)
        self._kept: dict[tuple, Outcome] = {}  # the outcomes of the last batch that had killed samples
        self._lock = threading.Lock()
        if sandbox == "local-unsafe":
            warnings.warn("CodeExecutionReward(sandbox='local-unsafe') runs completions with rlimits only, as your user: "
                          "code written to escape can read your files and environment and reach the network. "
                          "Install bubblewrap (apt-get install -y bubblewrap) and use sandbox='bwrap'", stacklevel=2)

    @property
    def timeout(self) -> float:
        return self.limits.timeout

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **columns: Any) -> list[float]:
        check_mode(self.sandbox)  # bwrap missing: refuse before any code runs
        tests = self._tests(columns, len(completions))  # every row checked before any code runs
        prefixes = code_prefixes(self.code_prefix, prompts, columns, len(completions), "CodeExecutionReward")
        keys = [(p + extract_code(completion_text(c)), t) for p, c, t in zip(prefixes, completions, tests)]
        outcomes = self._outcomes(keys)
        self._note_load_errors(outcomes)
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
        if not isinstance(tests, StdioCases):
            return run_tests(code, tests, self.limits, sandbox=self.sandbox)
        passed = []
        for stdin, expected in zip(tests.inputs, tests.outputs):
            result = run_program(code, stdin, self.limits, sandbox=self.sandbox)
            if result.killed:  # no score for the sample: the later cases need not run
                return Outcome((False,) * len(tests.inputs), result.status)
            passed.append(result.status == "ok" and same_output(result.stdout, expected, self.compare))
        return Outcome(tuple(passed), "ok")

    def _describe(self, killed: list[int], outcomes: list[Outcome]) -> str:
        limits = {"timeout": f"ran past timeout={self.timeout}s", "memory": f"went past memory_mb={self.limits.memory_mb}"}
        status = outcomes[killed[0]].status
        why = limits.get(status, ("gave a verdict that cannot be trusted (" + status.split(": ", 1)[-1] + ")")
                         if status.startswith("untrusted") else "was " + status)
        what = (f"the code was killed: it {why}" if len(outcomes) == 1 else
                f"the code of {len(killed)} of {len(outcomes)} completions was killed (sample {killed[0]} {why})")
        return (f"{what}. If correct solutions need more, raise CodeExecutionReward(timeout=..., memory_mb=...); "
                "reward_on_error='zero' scores such samples 0")

    def _note_load_errors(self, outcomes: list[Outcome]) -> None:
        self.load_errors = [o.error for o in outcomes]
        self.counts = {"load_errors": sum(map(bool, self.load_errors))}
        if len(outcomes) > 1 and all(self.load_errors):
            hint = "" if self.code_prefix else (" If the completions continue the prompt (HumanEval's format) or need its "
                                                "imports, pass CodeExecutionReward(code_prefix='prompt')")
            warnings.warn(f"the code of none of the {len(outcomes)} completions loaded, so all scored 0; the first "
                          f"reason: {self.load_errors[0][:300]}.{hint}", stacklevel=3)

    def _tests(self, columns: dict[str, Any], n: int) -> list:
        rows = required_column(columns, self.tests_column, n, reward="code reward", holds="the tests",
                               example_source="test_list", option="CodeExecutionReward(tests_column='test_list')")
        out = []
        for i, row in enumerate(rows):
            tests = parse_row(row)
            if tests is None:
                raise ValueError(f"row {i} of column {self.tests_column!r} is {str(row)[:80]!r}: give a non-empty list "
                                 "of Python test snippets, e.g. ['assert add(1, 2) == 3'], or one string, or stdin/stdout "
                                 "cases {'inputs': ['1 2\\n'], 'outputs': ['3\\n']} (strings, as many inputs as outputs)")
            if not isinstance(tests, StdioCases):
                refuse_idle_tests(tests, f"row {i} of column {self.tests_column!r}")
            out.append(tests)
        return out

    def __getstate__(self) -> dict:  # picklable: no lock, no kept outcomes
        return {k: v for k, v in self.__dict__.items() if k not in ("_lock", "_kept")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _lock=threading.Lock(), _kept={})


code_reward = CodeExecutionReward()
"""`CodeExecutionReward` with its defaults (tests in column ``tests``, bubblewrap), for configs to name."""
