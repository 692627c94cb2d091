"""How values cross the sandbox's boundary: converted to plain data on the candidate's side,
rebuilt strictly on the clean side.

`encode` runs where the candidate's code runs, so it protects nothing and tries to help: it
turns what correct code returns every day into the builtin value it stands for: subclasses
of ``int``, ``float``, ``str``, ``bytes``, ``list``, ``tuple``, ``dict``, ``set`` and
``frozenset`` (``Counter``, ``defaultdict``, ``OrderedDict``, a ``namedtuple``, an
``IntEnum``) become their builtin base; numpy scalars become ``int``/``float``/``bool``/
``complex`` (``item()``), numpy arrays nested lists (``tolist()``); a ``range`` stays a range;
an iterator (a generator, ``map``, ``filter``, ``zip``, a dict view) crosses as an iterator over
its items, so ``list(f())`` works and ``f() == [1]`` is False, as in one process; ints of any
size cross (as hex: no 4,300-digit limit), nesting up to `MAX_DEPTH` levels. Anything else
(a function, a module, an object of the candidate's own class) raises `CannotCross`.

`decode` runs on the clean side and is the boundary: it rebuilds only builtin types from
JSON (``type(x) is ...`` checks), so what the tests compare has the builtins' own ``__eq__``.
JSON objects carry one tag (``{"$tuple": [...]}``), which keeps tuples, sets, non-string dict
keys and NaN apart from lists and strings. Standard library only (it also runs inside the
sandbox and on a remote service, whose Python may be 3.6).

Examples:
    >>> decode(json.loads(json.dumps(encode({(1, 2): [3.5, None, {"a"}]}))))
    {(1, 2): [3.5, None, {'a'}]}
"""
import builtins
import contextlib
import json
import math
import sys

MAX_DEPTH = 1000  # what a default recursion limit lets one process compare, give or take
MAX_INT_HEX = 1 << 20  # hex digits of one int (4 Mbit): a bound, not a kill
SPECIAL_FLOATS = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}
PLAIN = (bool, int, float, complex, str, bytes, list, tuple, dict, set, frozenset)
# Raised again on the clean side these would end the test's own loop (`all(map(f, xs))`) or
# generator early: a call that ends with one has failed, whatever the test catches.
ENDS_ITERATION = ("StopIteration", "StopAsyncIteration", "GeneratorExit")


class CannotCross(TypeError):
    """A value that is not plain data (a custom object, a function, a module) or nested too deeply."""


@contextlib.contextmanager
def room():
    """Room on the stack for `MAX_DEPTH` levels (each takes a few frames, in Python and in json)."""
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old, 8 * MAX_DEPTH + 200))
    try:
        yield
    finally:
        sys.setrecursionlimit(old)


def encode(value, depth=0):
    """``value`` as JSON-ready data with tags (see the module); `CannotCross` for what is not data."""
    if depth > MAX_DEPTH:
        raise CannotCross("a value nested deeper than %d levels cannot cross" % MAX_DEPTH)
    kind = type(value)
    if value is None or kind is bool or kind is str:
        return value
    if kind is int:
        if -(1 << 62) < value < (1 << 62):
            return value
        digits = hex(value)  # hex has no digit limit (str() of an int has one: 4,300 digits)
        if len(digits) > MAX_INT_HEX:
            raise CannotCross("an int of more than %d hex digits cannot cross" % MAX_INT_HEX)
        return {"$int": digits}
    if kind is float:
        return value if math.isfinite(value) else {"$float": repr(value)}
    if kind is list:
        return [encode(v, depth + 1) for v in value]
    if kind in (tuple, set, frozenset):
        return {"$" + kind.__name__: [encode(v, depth + 1) for v in value]}
    if kind is dict:
        return {"$dict": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]}
    if kind is bytes:
        return {"$bytes": value.hex()}
    if kind is complex:
        return {"$complex": [encode(value.real), encode(value.imag)]}
    if kind is range:
        return {"$range": [value.start, value.stop, value.step]}
    if kind is Items:
        return {"$iter": [encode(v, depth + 1) for v in value]}
    return encode(plain(value), depth + 1)  # a subclass whose conversion gives a subclass again ends at MAX_DEPTH


def plain(value):
    """The builtin value ``value`` stands for (see the module), or `CannotCross`."""
    module = getattr(type(value), "__module__", "") or ""
    if module.split(".")[0] == "numpy" and hasattr(value, "tolist"):
        return value.tolist()  # an array: nested lists; a scalar: its Python value
    for base in PLAIN:  # bool first: it cannot be subclassed, and an int subclass is not a bool
        if isinstance(value, base):
            return base(value) if base not in (dict,) else dict(value.items())
    if isinstance(value, bytearray) or isinstance(value, memoryview):
        return bytes(value)
    if hasattr(type(value), "__next__") or type(value).__name__ in ("dict_keys", "dict_values", "dict_items"):
        return Items(value)
    raise CannotCross("a %s cannot cross the sandbox (only plain data: None, bool, int, float, str, bytes, complex, "
                      "list, tuple, dict, set, range, iterators, numpy values and subclasses of these)"
                      % type(value).__name__)


class Items(list):
    """The items of an iterator, crossing as an iterator (``$iter``)."""


def exception_name(err):
    """The name of the nearest builtin class of ``err`` (a ``ValueError`` subclass crosses as
    ``ValueError``, so a test's ``except ValueError`` catches it as it would in one process)."""
    for cls in type(err).__mro__:
        if getattr(builtins, cls.__name__, None) is cls:
            return cls.__name__
    return "BaseException"


def message(err):
    """The exception's text, at most 1,000 characters; a text that cannot be made is replaced."""
    try:
        return str(err)[:1000]
    except BaseException:  # noqa: BLE001 - its own __str__ raised
        return "(the exception's text could not be read)"


def decode(data, depth=0):
    """The value `encode` made ``data`` from; `CannotCross` for anything malformed."""
    if depth > MAX_DEPTH:
        raise CannotCross(f"data nested deeper than {MAX_DEPTH} levels")
    kind = type(data)
    if data is None or kind in (bool, int, float, str):
        return data
    if kind is list:
        return [decode(v, depth + 1) for v in data]
    if kind is not dict or len(data) != 1:
        raise CannotCross(f"malformed data: {str(data)[:80]!r}")
    (tag, body), = data.items()
    if tag == "$float" and body in SPECIAL_FLOATS:
        return SPECIAL_FLOATS[body]
    if tag == "$bytes" and type(body) is str:
        return bytes.fromhex(body)
    if tag == "$int" and type(body) is str and len(body) <= MAX_INT_HEX + 3:
        try:
            return int(body, 16)
        except ValueError:
            raise CannotCross(f"malformed data: {body[:80]!r}") from None
    if tag == "$range" and type(body) is list and len(body) == 3 and all(type(v) is int for v in body) and body[2]:
        return range(*body)
    if type(body) is not list:
        raise CannotCross(f"malformed data: {str(data)[:80]!r}")
    items = [decode(v, depth + 1) for v in body]
    if tag == "$tuple":
        return tuple(items)
    if tag == "$iter":
        return iter(items)
    if tag in ("$set", "$frozenset"):
        return (set if tag == "$set" else frozenset)(_hashable(items))
    if tag == "$dict" and all(type(p) is list and len(p) == 2 for p in items):
        return dict((k, v) for k, v in zip(_hashable([p[0] for p in items]), [p[1] for p in items]))
    if tag == "$complex" and len(items) == 2 and all(type(v) is float for v in items):
        return complex(*items)
    raise CannotCross(f"malformed data: {str(data)[:80]!r}")


def _hashable(items):
    try:
        [hash(v) for v in items]
    except TypeError:
        raise CannotCross("malformed data: an unhashable set member or dict key") from None
    return items


def dumps(value) -> str:
    """One line of JSON for ``value`` (`encode`), no NaN literals."""
    with room():
        return json.dumps(encode(value), allow_nan=False, separators=(",", ":"))


def loads(text):
    """The value of one line `dumps` wrote; `CannotCross` for anything else (NaN literals included)."""
    with room():
        try:
            data = json.loads(text, parse_constant=_no_constant)
        except (ValueError, RecursionError) as err:
            raise CannotCross(f"malformed data: {err}") from None
        return decode(data)


def _no_constant(name):
    raise ValueError(f"{name} is not allowed")
