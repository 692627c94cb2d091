"""The strict serializer that values cross the sandbox's boundary with.

Only plain data crosses: ``None``, ``bool``, ``int``, ``float``, ``str``, ``bytes``, ``complex``
and ``list``, ``tuple``, ``dict``, ``set``, ``frozenset`` of them. Types are checked exactly
(``type(x) is int``, never ``isinstance``), so an ``int`` subclass, or any object with its own
``__eq__``, cannot cross: `encode` refuses it. `decode` rebuilds only those builtin types from
JSON, so what the clean side compares has the builtins' own ``__eq__``. JSON objects carry one
tag (``{"$tuple": [...]}``), which keeps tuples, sets, non-string dict keys and NaN apart from
lists and strings. Standard library only: it also runs inside the sandbox.

Example:
    >>> decode(json.loads(json.dumps(encode({(1, 2): [3.5, None, {"a"}]}))))
    {(1, 2): [3.5, None, {'a'}]}
"""
import json
import math

MAX_DEPTH = 200
SPECIAL_FLOATS = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


class CannotCross(TypeError):
    """A value that is not plain data (a custom object, a function, a generator) or nested too deeply."""


def encode(value, depth=0):
    """``value`` as JSON-ready data with tags; `CannotCross` for anything but the plain types."""
    if depth > MAX_DEPTH:
        raise CannotCross(f"a value nested deeper than {MAX_DEPTH} levels cannot cross")
    kind = type(value)
    if value is None or kind is bool or kind is int or kind is str:
        return value
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
    raise CannotCross(f"a {kind.__name__} cannot cross the sandbox (only plain data: None, bool, int, float, str, "
                      "bytes, complex, list, tuple, dict, set)")


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
    if type(body) is not list:
        raise CannotCross(f"malformed data: {str(data)[:80]!r}")
    items = [decode(v, depth + 1) for v in body]
    if tag == "$tuple":
        return tuple(items)
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
    return json.dumps(encode(value), allow_nan=False, separators=(",", ":"))


def loads(text):
    """The value of one line `dumps` wrote; `CannotCross` for anything else (NaN literals included)."""
    try:
        data = json.loads(text, parse_constant=_no_constant)
    except (ValueError, RecursionError) as err:
        raise CannotCross(f"malformed data: {err}") from None
    return decode(data)


def _no_constant(name):
    raise ValueError(f"{name} is not allowed")
