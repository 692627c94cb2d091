"""The program `RemoteCodeReward` sends to a code-execution service for one call of a candidate's
function: the strict codec (`sandbox_codec`, shipped as source), `run_call`, and one line that
calls it. The service's Python may be older than the trainer's: what is shipped is standard
library only and avoids syntax newer than 3.6.
"""
from __future__ import annotations

import builtins
import functools
import inspect
import os

from . import sandbox_codec
from .sandbox_codec import dumps, loads

MARK = "#lightning-rlpt-answer "  # starts the answer line on the saved stdout


def run_call(code, name, blob):
    """Run the candidate's ``code``, call its function ``name`` on the arguments in ``blob``
    (``[args, kwargs]``, `sandbox_codec`), and write one answer line on the original stdout,
    encoded by the codec: ``{"ok": value}``, ``{"raised": type name, "message": text}`` when the
    function raised, or ``{"broken": text}`` when there was nothing to call (the code did not
    load, or defines no such function) or the value it returned cannot cross.

    The code's own stdout and stderr go to /dev/null, so what it prints cannot garble the
    answer. The code can still reach the saved descriptor, or this function: whatever it writes
    there only becomes its own answer to this one call, which the trainer decodes and checks.
    """
    answer = os.dup(1)
    quiet = os.open(os.devnull, os.O_WRONLY)
    os.dup2(quiet, 1)
    os.dup2(quiet, 2)
    try:
        namespace = {"__name__": "__candidate__", "__builtins__": builtins}
        exec(compile(code, "<candidate>", "exec"), namespace)
        function = namespace.get(name)
        if not callable(function):
            raise NameError("the code defines no function %r" % name)
        args, kwargs = loads(blob)
    except BaseException as err:  # noqa: BLE001 - SystemExit too: the code ended before any call
        line = dumps({"broken": "%s: %s" % (type(err).__name__, str(err)[:500])})
    else:
        try:
            value = function(*args, **kwargs)
        except BaseException as err:  # noqa: BLE001 - what the function raised is its answer
            line = dumps({"raised": exception_name(err), "message": message(err)})
        else:
            try:
                line = dumps({"ok": value})
            except BaseException as err:  # noqa: BLE001 - CannotCross, or a value too deep to encode
                line = dumps({"broken": "its answer cannot cross: %s" % str(err)[:500]})
    with open(answer, "w", closefd=True) as out:
        out.write(MARK + line + "\n")


def program(code: str, name: str, args: tuple, kwargs: dict) -> str:
    """The source the service runs for ``name(*args, **kwargs)`` on ``code``; `sandbox_codec`'s
    ``CannotCross`` when an argument is not plain data.

    Examples:
        >>> print(program("def f(x): return x", "f", (1,), {}).splitlines()[-1])
        run_call('def f(x): return x', 'f', '[[1],{"$dict":[]}]')
    """
    blob = dumps([list(args), kwargs])
    return "\n".join([_prelude(), f"run_call({code!r}, {name!r}, {blob!r})", ""])


@functools.cache
def _prelude() -> str:
    """The fixed part of every program (the codec and `run_call` as source): read once, not per call."""
    return "\n".join([inspect.getsource(sandbox_codec), "import builtins", "import os", f"MARK = {MARK!r}",
                      inspect.getsource(run_call)])


def read_answer(stdout: str) -> dict | None:
    """The last answer line of ``stdout`` as one of `run_call`'s three reports, or None when
    there is none; ``ValueError`` when it does not decode to one of those."""
    lines = [line for line in stdout.splitlines() if line.startswith(MARK)]
    if not lines:
        return None
    try:
        report = loads(lines[-1][len(MARK):])
    except sandbox_codec.CannotCross as err:
        raise ValueError(str(err)) from None
    keys = set(report) if type(report) is dict else set()
    if keys == {"ok"}:
        return report
    if keys in ({"broken"}, {"raised", "message"}) and all(type(v) is str for v in report.values()):
        return report
    raise ValueError(f"an answer that is neither a value nor an exception: {str(report)[:80]!r}")

