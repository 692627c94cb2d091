"""The clean side of an assert-style run: the tests run here, the candidate's names are proxies.

Run inside its own sandbox as ``python -I sandbox_checker.py SPEC_FD``. This interpreter never
runs the completion's code. Each function or class the code defined is a proxy here: calling it
sends the arguments to the candidate's process (``sandbox_candidate.py``) and returns only the
value that comes back through the strict serializer (`sandbox_codec`), so an object with its
own ``__eq__`` cannot come back, and the code can neither patch these builtins nor see these
frames. Each test passes when it runs here without raising. The verdict, one JSON line, goes to
this process's standard output, which the candidate cannot reach. Standard library only.
"""
import builtins
import json
import os
import sys

try:
    from .sandbox_codec import CannotCross, decode, encode
    from .sandbox_inside import apply_limits, read_spec, silence
except ImportError:  # run as a script inside the sandbox (``-I`` leaves its folder off sys.path)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from sandbox_codec import CannotCross, decode, encode
    from sandbox_inside import apply_limits, read_spec, silence

MAX_REPLY = 64 << 20  # bytes of one reply line from the candidate; a longer one fails the call


class CandidateError(Exception):
    """A call into the candidate failed: it raised, its process ended, or its reply could not cross."""


class Link:
    """The two pipes to the candidate's process."""

    def __init__(self, requests, replies):
        self.requests, self.replies, self.next_id = requests, replies, 0

    def receive(self) -> dict:
        line = self.replies.readline(MAX_REPLY + 1)
        if not line.endswith(b"\n"):
            raise CandidateError("the candidate's process ended" if not line else "the candidate's reply was too long")
        message = json.loads(line, parse_constant=_refuse)
        if type(message) is not dict:
            raise CandidateError("malformed reply")
        return message

    def call(self, target, method, args, kwargs):
        self.next_id += 1
        try:
            request = {"id": self.next_id, "target": target, "method": method, "args": encode(list(args)),
                       "kwargs": encode(dict(kwargs))}
        except CannotCross as err:
            raise CandidateError(f"an argument cannot be sent to the candidate: {err}") from None
        try:
            self.requests.write(json.dumps(request, allow_nan=False).encode() + b"\n")
            self.requests.flush()
            reply = self.receive()
        except (OSError, ValueError, RecursionError) as err:
            raise CandidateError(f"the candidate's process ended or answered garbage: {err}") from None
        return self.unpack(reply)

    def unpack(self, reply: dict):
        if reply.get("id") != self.next_id:
            raise CandidateError("a reply to another call")
        if "raise" in reply:
            kind, message = reply["raise"], str(reply.get("message", ""))
            cls = getattr(builtins, kind, None) if type(kind) is str else None
            if isinstance(cls, type) and issubclass(cls, Exception):
                raise cls(message)  # `except ValueError:` in a test works as it would in one process
            raise CandidateError(f"{kind}: {message}")
        if type(reply.get("ref")) is int and len(reply) == 2:
            return RemoteObject(self, reply["ref"])
        if set(reply) != {"id", "value"}:
            raise CandidateError("malformed reply")
        try:
            return decode(reply["value"])
        except CannotCross as err:
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
        return Remote(self._link, self._ref, name)

    def __bool__(self):
        raise CandidateError("an object of the candidate has no truth value on the clean side")


def namespace_for(hello: dict, link: Link) -> dict:
    names = {"__name__": "__checker__", "__builtins__": builtins}
    for name in hello.get("callables", []) + hello.get("classes", []):
        names[str(name)] = Remote(link, str(name))
    for name, value in dict(hello.get("values", {})).items():
        try:
            names[str(name)] = decode(value)
        except CannotCross:
            pass
    return names


def run_tests(tests: list, link: Link) -> list:
    """One bool per test: True when it ran here without raising."""
    try:
        hello = link.receive()
    except Exception:  # noqa: BLE001 - whatever the candidate sent first, it did not load
        hello = {"loaded": False}
    if hello.get("loaded") is not True:
        return [False] * len(tests)
    namespace = namespace_for(hello, link)
    passed = []
    for i, test in enumerate(tests):
        try:
            exec(compile(test, f"<test {i}>", "exec"), namespace)
            passed.append(True)
        except BaseException:  # SystemExit and MemoryError included: the test failed
            passed.append(False)
    return passed


def _refuse(name):
    raise ValueError(f"{name} is not allowed")


def main() -> None:
    spec = read_spec(sys.argv)
    verdict = os.fdopen(os.dup(1), "w")
    silence(0, 1, 2)  # the tests' own prints cannot garble the verdict
    apply_limits(spec["limits"])
    link = Link(os.fdopen(spec["requests_fd"], "wb"), os.fdopen(spec["replies_fd"], "rb"))
    passed = run_tests(spec["tests"], link)
    verdict.write(json.dumps({"passed": passed}) + "\n")
    verdict.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
