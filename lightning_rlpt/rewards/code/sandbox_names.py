"""Which names a test may ask of the candidate: the names its program reads and never binds
itself, builtins left out. The rule of the verdict: the test decides what the candidate may
answer for. A candidate that defines ``abs``, ``range`` or ``check`` never replaces the test's
own; only names the test leaves open (the function under test) reach the candidate.

Parsed with ``ast``, never run. Standard library only: the checker imports it inside the sandbox.
"""
import ast
import builtins
import threading

# CPython 3.11 (3.11.7 here and in CI) keeps the AST constructor's recursion depth in state
# that threads share: two threads parsing at once can fail with "SystemError: AST constructor
# recursion depth mismatch" (python/cpython#106905). RemoteCodeReward checks its tests in threads,
# so parsing here is one thread at a time; a parse takes well under a millisecond next to a service
# round trip.
_PARSING = threading.Lock()


def parse(test):
    """``ast.parse(test)``, one thread at a time (the CPython issue above)."""
    with _PARSING:
        return ast.parse(test)


def read_and_bound(test):
    """The names ``test`` reads and the names it binds (definitions, assignments, arguments,
    imports, ``except ... as``, comprehension variables); a test that does not parse has neither."""
    try:
        tree = parse(test)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return set(), set()
    read, bound = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (read if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            bound.update(node.names)
    return read, bound


def free_names(test):
    """The names ``test`` reads but never binds itself (its calls of the candidate's functions,
    and builtins), sorted; dunder names are left out.

    Examples:
        >>> free_names("def check(candidate):\\n    assert candidate(1) == abs(-1)\\ncheck(add_one)")
        ['abs', 'add_one']
    """
    read, bound = read_and_bound(test)
    return sorted(n for n in read - bound if not n.startswith("__"))


def asked_names(tests):
    """The names a candidate may answer for in ``tests`` (which share one namespace): read by some
    test, bound by none, not a builtin, not a dunder.

    Examples:
        >>> sorted(asked_names(["assert abs(f(1)) == 1", "x = g(2)\\nassert x == LIMIT"]))
        ['LIMIT', 'f', 'g']
    """
    read, bound = set(), set()
    for test in tests:
        r, b = read_and_bound(test)
        read |= r
        bound |= b
    return {n for n in read - bound if not n.startswith("__") and not hasattr(builtins, n)}
