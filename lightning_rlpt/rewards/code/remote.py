"""`RemoteCodeReward`: code rewards computed on a remote code-execution service that speaks
SandboxFusion's ``run_code`` API (the one verl supports), with the verdict decided in the trainer.

What reaches the service, and so what candidate code can act on: the candidate's code, and for
each run either one stdin input (stdin/stdout tests) or one call's arguments (assert-style
tests). The test code and the expected outputs never leave the trainer.

*Assert-style tests* (``assert add(1, 2) == 3``, HumanEval's ``check(candidate)``) run in the
trainer, in a fresh namespace, where each name the test calls and the candidate defines is a
proxy: a call runs the candidate's code on the service, calls its function there on the
arguments, and brings back only the return value, or the name of the exception it raised,
through a strict codec of plain values (`remote_code_harness`). The test's ``assert`` is
evaluated in the trainer, on builtin values, so a candidate cannot patch the test's builtins,
reach its frames, or return an object whose ``__eq__`` always answers True; a process exit
(``os._exit(0)`` before anything runs), a forged exit code or a line printed to look like an
answer shape only the candidate's own answer to that call, which the trainer then checks. A
call that gets no readable answer (a timeout, a crash, an early exit, too much output) fails
its test, even if the test code catches the exception. The test code is the dataset's and runs
in the trainer's own interpreter, as a local evaluation harness would run it: trust the dataset
as you trust your training script. *Stdin/stdout tests* run the program once per input; its
stdout is compared with the expected output in the trainer.

What a malicious completion can still do, and why it does not score: it runs with whatever
the service's sandbox allows (its network, files and other runs are the service's to isolate,
e.g. SandboxFusion's network namespace and overlay file system), for at most ``run_timeout``
seconds and ``memory_mb`` per run; it can make its own calls fail; it can special-case inputs
it can see in the prompt (a dataset that shows its tests invites that); and a candidate that
makes the service fail (``SandboxError``, a dropped connection) after every retry makes the
whole call `RewardUnavailable`, which ``reward_on_error`` handles: a lost batch, never a pass.
"""
from __future__ import annotations

import asyncio
import builtins
import warnings
from typing import Any, Sequence

from . import remote_harness as harness
from ..calling import RewardError, in_thread
from .reward import extract_code
from .remote_client import RunAnswer, RunCodeClient
from .formats import COMPARE, check_code_prefix, code_prefixes, same_output
from .remote_rows import block_for, read_tests
from .sandbox_codec import ENDS_ITERATION, CannotCross
from .sandbox_names import asked_names
from ..text import completion_text

class CallUnanswered(Exception):
    """A call of the candidate's function got no readable answer from the service: its test fails."""


class CandidateRaised(Exception):
    """The candidate's function raised an exception that is not a builtin type (named in the message)."""


class RemoteFunction:
    """Stands, in the trainer's test code, for the candidate's function ``name``."""

    def __init__(self, name: str, calls: "_Calls"):
        self.__name__, self._calls = name, calls

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._calls(self.__name__, args, kwargs)

    def __repr__(self) -> str:
        return f"<remote function {self.__name__}>"


class RemoteCodeReward:
    """The fraction of a row's tests that the completion's code passes, run by a remote
    code-execution service (SandboxFusion's ``run_code`` API); the verdict is decided in the
    trainer (see the module docstring for what a malicious completion can and cannot do).

    A row's tests are either assert-style Python snippets (a list of strings, or one string such
    as HumanEval's ``check`` program followed by ``check(entry_point)``), or stdin/stdout cases:
    ``{"inputs": [...], "outputs": [...]}`` (APPS, TACO), ``[{"input": ..., "output": ...}, ...]``
    or ``{"test_cases": [...]}`` (open-r1), or the same as a JSON string with
    ``test_format="stdio"``. Assert-style tests need Python, and calls whose arguments and
    return values are plain data (None, bool, int, float, str, bytes, list, tuple, set,
    frozenset, dict); each call of the candidate's function is one run on the service. A
    stdin/stdout case passes when the program exits 0 and its output matches, compared as
    `CodeExecutionReward` does (`code_tests.same_output`): ``compare="lines"`` line by line,
    ignoring trailing whitespace and trailing blank lines, or ``"exact"``. A test that times out,
    crashes or prints more than ``max_response_mb`` fails.

    Args:
        url: the service's ``run_code`` endpoint, e.g. ``http://sandbox:8080/run_code``.
        tests_column: the dataset column holding each row's tests.
        test_format: ``"auto"`` (strings are assert-style, dicts are stdin/stdout), ``"assert"``
            or ``"stdio"`` (JSON strings are parsed).
        language: the service's language for stdin/stdout programs (``"python"``, ``"cpp"``, ...);
            the completion's last fenced block for it (or unlabelled) is the code.
        compare: ``"lines"`` or ``"exact"``, for stdin/stdout outputs.
        binary: 1.0 only when every test passes, else 0.0, instead of the pass rate.
        run_timeout: seconds one run may take on the service (``compile_timeout`` to compile).
        memory_mb: the run's memory limit on the service (MiB), or -1 for the service's default.
        timeout: seconds one request may take; default ``compile_timeout + run_timeout + 10``.
        retries: further attempts after a failed request (connection error, timeout, HTTP
            408/429/5xx, ``SandboxError``); then the call raises `RewardUnavailable`.
        backoff: seconds before the first retry, doubled before each next one.
        max_concurrency: requests in flight at once.
        max_response_mb: answers longer than this are not read; the run counts as failed.
        headers: extra HTTP headers (e.g. ``{"Authorization": "Bearer ..."}``).
        name: logged as ``rewards/<name>/...``.
        code_prefix: what the completion's code continues, run before it as HumanEval's harness
            does: ``None`` (the code alone), ``"prompt"`` or a column name (as `CodeExecutionReward`'s).

    Examples:
        >>> reward = RemoteCodeReward("http://127.0.0.1:8080/run_code", tests_column="test_list")
        >>> module = RLModule(model, reward_funcs=[reward], reward_timeout=300)  # doctest: +SKIP
    """

    def __init__(self, url: str, *, tests_column: str = "tests", test_format: str = "auto", language: str = "python",
                 compare: str = "lines", binary: bool = False, run_timeout: float = 10.0,
                 compile_timeout: float = 10.0, memory_mb: int = 1024, timeout: float | None = None, retries: int = 2,
                 backoff: float = 0.5, max_concurrency: int = 8, max_response_mb: float = 8.0,
                 headers: dict[str, str] | None = None, name: str = "remote_code", code_prefix: str | None = None):
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ValueError(f"RemoteCodeReward url must start with http:// or https:// (got {url!r}); give the "
                             "service's run_code endpoint, e.g. http://127.0.0.1:8080/run_code")
        _check_choice("test_format", test_format, ("auto", "assert", "stdio"))
        _check_choice("compare", compare, COMPARE)
        if not (run_timeout > 0 and compile_timeout > 0 and (timeout is None or timeout > 0)):
            raise ValueError(f"RemoteCodeReward needs run_timeout, compile_timeout and timeout > 0 seconds (got "
                             f"{run_timeout}, {compile_timeout}, {timeout})")
        if retries < 0 or backoff < 0 or max_concurrency < 1 or not max_response_mb > 0:
            raise ValueError(f"RemoteCodeReward needs retries >= 0, backoff >= 0, max_concurrency >= 1 and "
                             f"max_response_mb > 0 (got {retries}, {backoff}, {max_concurrency}, {max_response_mb})")
        if memory_mb != -1 and memory_mb < 16:
            raise ValueError(f"memory_mb={memory_mb!r} is too small to run a program; give MiB (e.g. 1024) or -1")
        self.tests_column, self.test_format, self.language = tests_column, test_format, language
        self.code_prefix = check_code_prefix(code_prefix)
        self.compare, self.binary, self.max_concurrency = compare, binary, max_concurrency
        self.limits = {"run_timeout": run_timeout, "compile_timeout": compile_timeout, "memory_mb": memory_mb}
        self.client = RunCodeClient(url, timeout=timeout or compile_timeout + run_timeout + 10, retries=retries,
                                    backoff=backoff, max_response_bytes=int(max_response_mb * 2 ** 20),
                                    headers=headers)
        self.__name__ = name
        self._warned_size = False

    def __repr__(self) -> str:
        return f"RemoteCodeReward({self.client.url!r}, name={self.__name__!r})"

    async def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **columns: Any) -> list[float]:
        rows = self._rows(columns, len(completions))  # every row checked before anything is sent
        prefixes = code_prefixes(self.code_prefix, prompts, columns, len(completions), "RemoteCodeReward")
        codes = [p + self._code(c) for p, c in zip(prefixes, completions)]
        jobs = list(dict.fromkeys((code, case) for code, row in zip(codes, rows) for case in row))
        gate = asyncio.Semaphore(self.max_concurrency)

        async def one(code: str, case: Any) -> bool:
            async with gate:
                return await in_thread(lambda: self.passes(code, case))

        verdicts = dict(zip(jobs, await asyncio.gather(*(one(*job) for job in jobs))))
        return [self._score([verdicts[code, case] for case in row]) for code, row in zip(codes, rows)]

    def passes(self, code: str, case: str | tuple[str, str]) -> bool:
        """Whether ``code`` passes one test: an assert-style snippet or an ``(input, output)`` pair."""
        if isinstance(case, str):
            return self._assert_passes(code, case)
        answer = self._run(code, language=self.language, stdin=case[0])
        return answer.ok and same_output(answer.stdout, case[1], self.compare)

    def _score(self, verdicts: list[bool]) -> float:
        passed = sum(verdicts)
        return float(passed == len(verdicts)) if self.binary else passed / len(verdicts)

    # ---------------------------------------------------------------- assert-style tests
    def _assert_passes(self, code: str, test: str) -> bool:
        calls = _Calls(self, code)
        # The test decides what the candidate answers for: names it reads and never binds, no builtin.
        namespace = {"__name__": "__test__", "__builtins__": builtins,
                     **{n: RemoteFunction(n, calls) for n in asked_names([test])}}
        try:
            exec(compile(test, "<test>", "exec"), namespace)  # the dataset's test code, in the trainer
            passed = True
        except Exception:  # noqa: BLE001 - a failed assert, or what the candidate's call raised
            passed = False
        if calls.error is not None:  # the service failed: no verdict, whatever the test code caught
            raise calls.error
        return passed and calls.unanswered is None

    def call(self, code: str, name: str, args: tuple, kwargs: dict) -> Any:
        """Run ``code`` on the service and return ``name(*args, **kwargs)`` as plain data, or raise
        what it raised (a builtin exception type, else `CandidateRaised`); `CallUnanswered` when
        no answer came back."""
        try:
            source = harness.program(code, name, args, kwargs)
        except CannotCross as err:
            raise RewardError(f"a test calls {name}() with an argument that cannot be sent to the code-execution "
                              f"service ({err}); RemoteCodeReward's assert-style tests need plain-data arguments, "
                              "or use stdin/stdout tests") from err
        answer = self._run(source, language="python", stdin=None)
        if not answer.ok:
            raise CallUnanswered(f"{name}() got no answer: {answer.why()}")
        try:
            report = harness.read_answer(answer.stdout)
        except ValueError as err:
            raise CallUnanswered(f"{name}() gave an unreadable answer ({err})") from None
        if report is None:
            raise CallUnanswered(f"{name}() got no answer: the program ended without giving one")
        if "ok" in report:
            return report["ok"]
        if "broken" in report:
            raise CallUnanswered(f"{name}() got no answer: {report['broken'][:300]}")
        if report["raised"] in ENDS_ITERATION:  # raised again here it would end the test's loop: a failed call
            raise CallUnanswered(f"{name}() raised {report['raised']}, which a call may not answer with")
        error = getattr(builtins, report["raised"], None)
        if isinstance(error, type) and issubclass(error, Exception):
            raise error(report["message"])  # a builtin type, so a test's `except ValueError` works as locally
        raise CandidateRaised(f"{name}() raised {report['raised'][:80]}: {report['message'][:200]}")

    def _run(self, code: str, *, language: str, stdin: str | None) -> RunAnswer:
        answer = self.client.run(code, language=language, stdin=stdin, **self.limits)
        if answer.oversized and not self._warned_size:
            self._warned_size = True
            cap = self.client.max_response_bytes / 2**20
            warnings.warn(f"{self!r}: a run printed more than max_response_mb={cap:g} MiB and counts as failed; "
                          "raise max_response_mb if correct solutions print that much", stacklevel=2)
        return answer

    # ---------------------------------------------------------------- inputs
    def _code(self, completion: Any) -> str:
        text = completion_text(completion)
        return extract_code(text) if self.language == "python" else block_for(text, self.language)

    def _rows(self, columns: dict[str, Any], n: int) -> list[tuple]:
        if self.tests_column not in columns:
            raise RewardError(f"{self!r} needs the tests in column {self.tests_column!r}, but the batch has "
                              f"{sorted(k for k in columns if k != 'trainer_state')}; map your dataset's column onto "
                              f"it, or pass RemoteCodeReward(url, tests_column=...)")
        rows = list(columns[self.tests_column])
        if len(rows) != n:
            raise RewardError(f"column {self.tests_column!r} has {len(rows)} values for {n} completions")
        out = [read_tests(row, self.test_format, where=f"row {i} of column {self.tests_column!r}")
               for i, row in enumerate(rows)]
        if self.language != "python" and any(isinstance(c, str) for row in out for c in row):
            raise RewardError(f"assert-style tests run Python, but {self!r} has language={self.language!r}: give "
                              "stdin/stdout tests for other languages")
        return out


class _Calls:
    """The calls one test makes; it remembers a call left unanswered or a failed service even
    when the test code catches the exception (``except Exception``)."""

    def __init__(self, reward: RemoteCodeReward, code: str):
        self.reward, self.code = reward, code
        self.unanswered: str | None = None
        self.error: RewardError | None = None

    def __call__(self, name: str, args: tuple, kwargs: dict) -> Any:
        try:
            return self.reward.call(self.code, name, args, kwargs)
        except CallUnanswered as err:
            self.unanswered = self.unanswered or str(err)
            raise
        except RewardError as err:
            self.error = self.error or err
            raise


def _check_choice(option: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"RemoteCodeReward {option} must be one of {choices} (got {value!r})")
