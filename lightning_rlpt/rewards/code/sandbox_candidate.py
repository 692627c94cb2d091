"""The candidate's side of an assert-style run: load the completion's code, then answer calls.

Run inside its own sandbox as ``python -I sandbox_candidate.py SPEC_FD``. It runs the code in a
namespace named ``__solution__`` and sends one line that lists the namespace's names (or why the
code did not load). Then, for each request line from the checker (a call of one of those names,
of a method of an object a class returned, or the read of such an object's attribute), it sends
back the result converted to plain data (`sandbox_codec`), a reference to a new object when a
*class* was called, a note that an attribute is a method, or the name of the nearest builtin
class of the exception it raised and its text.
Whatever the code patches or prints stays in this process: the checker decides the verdict.
Standard library only; importing it has no effect.
"""
import json
import os
import sys

try:
    from .sandbox_codec import PLAIN, CannotCross, decode, encode, exception_name, message, room
    from .sandbox_inside import MEMORY_EXIT, apply_limits, read_spec, silence
except ImportError:  # run as a script inside the sandbox (``-I`` leaves its folder off sys.path)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from sandbox_codec import PLAIN, CannotCross, decode, encode, exception_name, message, room
    from sandbox_inside import MEMORY_EXIT, apply_limits, read_spec, silence

MAX_REQUEST = 64 << 20  # bytes of one request line from the checker


def describe(namespace: dict) -> dict:
    """The names the tests may use: functions and classes by name, plain-data values by value."""
    callables, classes, values = [], [], {}
    for name, value in list(namespace.items()):
        if name.startswith("__"):
            continue
        if isinstance(value, type):
            classes.append(name)
        elif callable(value):
            callables.append(name)
        elif value is None or type(value) in PLAIN:  # not an iterator: reading it here would use it up
            try:
                values[name] = encode(value)
            except (CannotCross, RecursionError):
                pass  # nested too deep, or holding what is not data: not visible to the tests
    return {"loaded": True, "callables": callables, "classes": classes, "values": values}


def answer(request: dict, namespace: dict, objects: list) -> dict:
    """Run one call or attribute read; its value, a reference to a new instance, a note that the
    attribute is a method, or (raised) the exception."""
    target = request["target"]
    obj = objects[target] if type(target) is int else namespace[target]
    if request.get("attr"):  # `node.val`: data comes back as data, a method as a note
        value = getattr(obj, request["attr"])
        return {"method": True} if callable(value) and not isinstance(value, type) else value_reply(value)
    fn = getattr(obj, request["method"]) if request.get("method") else obj
    with room():
        args, kwargs = decode(request["args"]), decode(request["kwargs"])
    result = fn(*args, **kwargs)
    if isinstance(obj, type) and not request.get("method") and isinstance(result, obj):
        objects.append(result)  # `Solution()`: the object stays here, the checker gets a handle
        return {"ref": len(objects) - 1}
    return value_reply(result)


def value_reply(value) -> dict:
    """The value as plain data, or why it cannot cross (the checker fails that call)."""
    try:
        with room():
            return {"value": encode(value)}
    except (CannotCross, RecursionError) as err:
        return {"broken": message(err)}


def serve(code: str, requests, replies) -> None:
    namespace = {"__name__": "__solution__", "__builtins__": __builtins__}
    try:
        exec(compile(code, "<completion>", "exec"), namespace)
        hello = describe(namespace)
    except MemoryError:
        os._exit(MEMORY_EXIT)
    except BaseException as err:  # SystemExit included: the code did not load
        hello = {"loaded": False, "error": f"{type(err).__name__}: {message(err)}"[:1000]}
    send(replies, hello)
    objects = []
    while True:
        line = requests.readline(MAX_REQUEST)
        if not line:
            return  # the checker is done
        with room():
            request = json.loads(line)
        try:
            reply = answer(request, namespace, objects)
        except MemoryError:
            os._exit(MEMORY_EXIT)
        except BaseException as err:
            reply = {"raise": exception_name(err), "message": message(err)}
        send(replies, {"id": request["id"], **reply})


def send(replies, reply: dict) -> None:
    with room():
        line = json.dumps(reply, allow_nan=False, separators=(",", ":")).encode()
    replies.write(line + b"\n")
    replies.flush()


def main() -> None:
    spec = read_spec(sys.argv)
    silence(0, 1, 2)  # the code's output goes nowhere
    apply_limits(spec["limits"])
    requests, replies = os.fdopen(spec["requests_fd"], "rb"), os.fdopen(spec["replies_fd"], "wb")
    code = spec["code"]
    del spec
    try:
        serve(code, requests, replies)
    except BrokenPipeError:
        pass
    os._exit(0)


if __name__ == "__main__":
    main()
