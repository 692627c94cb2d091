"""The clean side of an assert-style run: the tests run here, the candidate's names are proxies.

Run inside its own sandbox as ``python -I sandbox_checker.py SPEC_FD``. This interpreter never
runs the completion's code. The test decides what the candidate answers for: only the names
the tests read and never bind, and that are not builtins (`sandbox_names.asked_names`), are
taken from the candidate; a function or class among them is a proxy here: calling it sends the
arguments to the candidate's process (``sandbox_candidate.py``) and returns only the value that
comes back, rebuilt by the strict decoder (`sandbox_codec`), so an object with its own
``__eq__`` cannot come back, and the code can neither patch these builtins nor see these
frames. A call that gets no value (the process ended, the value cannot cross, or it raised
``StopIteration``, which would end the test's own loop) fails its test, even if the test
catches the exception. Each test passes when it runs here without raising. The verdict, one
JSON line, goes to this process's standard output, which the candidate cannot reach.
Standard library only.
"""
import builtins
import json
import os
import sys

try:
    from .sandbox_codec import ENDS_ITERATION, CannotCross, decode, encode, room
    from .sandbox_inside import apply_limits, read_spec, silence
    from .sandbox_names import asked_names
except ImportError:  # run as a script inside the sandbox (``-I`` leaves its folder off sys.path)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from sandbox_codec import ENDS_ITERATION, CannotCross, decode, encode, room
    from sandbox_inside import apply_limits, read_spec, silence
    from sandbox_names import asked_names

MAX_REPLY = 64 << 20  # bytes of one reply line from the candidate; a longer one fails the call


class CandidateError(Exception):
    """A call into the candidate failed: its process ended, its reply could not cross, or it
    raised what a call may not answer with. The test that made the call fails (`Link.failed`)."""


class Link:
    """The two pipes to the candidate's process. ``failed``: a call of the current test failed."""

    def __init__(self, requests, replies):
        self.requests, self.replies, self.next_id, self.failed = requests, replies, 0, False

    def receive(self) -> dict:
        line = self.replies.readline(MAX_REPLY + 1)
        if not line.endswith(b"\n"):
            raise CandidateError("the candidate's process ended" if not line else "the candidate's reply was too long")
        with room():
            message = json.loads(line, parse_constant=_refuse)
        if type(message) is not dict:
            raise CandidateError("malformed reply")
        return message

    def call(self, target, method, args, kwargs, attr=None):
        try:
            return self.unpack(self.ask(target, method, args, kwargs, attr), target, attr)
        except CandidateError:
            self.failed = True  # the test fails even if it catches this
            raise

    def ask(self, target, method, args, kwargs, attr) -> dict:
        self.next_id += 1
        try:
            with room():
                request = {"id": self.next_id, "target": target, "method": method, "attr": attr,
                           "args": encode(list(args)), "kwargs": encode(dict(kwargs))}
                line = json.dumps(request, allow_nan=False).encode()
        except (CannotCross, RecursionError) as err:
            raise CandidateError(f"an argument cannot be sent to the candidate: {err}") from None
        try:
            self.requests.write(line + b"\n")
            self.requests.flush()
            reply = self.receive()
        except (OSError, ValueError, RecursionError) as err:
            raise CandidateError(f"the candidate's process ended or answered garbage: {err}") from None
        if reply.get("id") != self.next_id:
            raise CandidateError("a reply to another call")
        return reply

    def unpack(self, reply: dict, target, attr):
        if "raise" in reply:
            kind, message = reply["raise"], str(reply.get("message", ""))
            cls = getattr(builtins, kind, None) if type(kind) is str else None
            if kind not in ENDS_ITERATION and isinstance(cls, type) and issubclass(cls, Exception):
                raise cls(message)  # `except ValueError:` in a test works as it would in one process
            raise CandidateError(f"{kind}: {message}")
        if "broken" in reply:
            raise CandidateError(f"the answer cannot cross: {str(reply['broken'])[:200]}")
        if type(reply.get("ref")) is int and len(reply) == 2:
            return RemoteObject(self, reply["ref"])
        if attr and reply.get("method") is True and len(reply) == 2:
            return Remote(self, target, attr)
        if set(reply) != {"id", "value"}:
            raise CandidateError("malformed reply")
        try:
            with room():
                return decode(reply["value"])
        except (CannotCross, RecursionError) as err:
            raise CandidateError(str(err)) from None


class Remote:
    """A function or class of the candidate (or a method of one of its objects), called remotely."""

    def __init__(self, link: Link, target, method=None):
        self._link, self._target, self._method = link, target, method
        self.__name__ = method or str(target)

    def __call__(self, *args, **kwargs):
        return self._link.call(self._target, self._method, args, kwargs)

    def __repr__(self):
        return f"<candidate's {self.__name__}>"


class RemoteObject:
    """An object a candidate's class made; it stays in the candidate's process. Its methods are
    `Remote`; it has no truth value and equals only itself, so it can never make a test pass."""

    def __init__(self, link: Link, ref: int):
        self._link, self._ref = link, ref

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return self._link.call(self._ref, None, (), {}, attr=name)  # data comes back as data, a method as a Remote

    def __bool__(self):
        raise CandidateError("an object of the candidate has no truth value on the clean side")


def namespace_for(hello: dict, link: Link, tests: list) -> dict:
    """The tests' globals: the candidate's names that the tests ask for (`asked_names`), nothing else."""
    asked = asked_names(tests)
    names = {"__name__": "__checker__", "__builtins__": builtins}
    for name in list(hello.get("callables", [])) + list(hello.get("classes", [])):
        if type(name) is str and name in asked:
            names[name] = Remote(link, name)
    for name, value in dict(hello.get("values", {})).items():
        if type(name) is str and name in asked:
            try:
                with room():
                    names[name] = decode(value)
            except (CannotCross, RecursionError):
                pass
    return names


def run_tests(tests: list, link: Link) -> tuple:
    """One bool per test (True when it ran here without raising and none of its calls failed),
    and why the code did not load ("" when it did)."""
    try:
        hello = link.receive()
    except Exception:  # noqa: BLE001 - whatever the candidate sent first, it did not load
        hello = {"loaded": False, "error": "the candidate's process ended before it loaded the code"}
    if type(hello) is not dict or hello.get("loaded") is not True:
        error = hello.get("error") if type(hello) is dict else None
        return [False] * len(tests), str(error or "the code did not load")[:1000]
    namespace = namespace_for(hello, link, tests)
    passed = []
    for i, test in enumerate(tests):
        link.failed = False
        try:
            exec(compile(test, f"<test {i}>", "exec"), namespace)
            passed.append(not link.failed)
        except BaseException:  # SystemExit and MemoryError included: the test failed
            passed.append(False)
    return passed, ""


def _refuse(name):
    raise ValueError(f"{name} is not allowed")


def main() -> None:
    spec = read_spec(sys.argv)
    verdict = os.fdopen(os.dup(1), "w")
    silence(0, 1, 2)  # the tests' own prints cannot garble the verdict
    apply_limits(spec["limits"])
    link = Link(os.fdopen(spec["requests_fd"], "wb"), os.fdopen(spec["replies_fd"], "rb"))
    passed, error = run_tests(spec["tests"], link)
    verdict.write(json.dumps({"passed": passed, "error": error}) + "\n")
    verdict.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
