"""The layout stays clean: no import cycle inside the package, every subpackage packaged, and
callbacks that touch only the module's public surface. (Module sizes are a report at the end of
the run, `package_layout.long_modules`, not a test: files are split by concern, not by count.)"""
import ast
import os
import tomllib

import pytest
from conftest import ROOT
from package_layout import modules

from lightning_rlpt.hooks import PUBLIC_SURFACE

def imports(name: str, path: str, known: set[str]) -> set[str]:
    """Modules of the package that ``name`` imports (at any depth of the file, lazy ones included)."""
    is_pkg = path.endswith("__init__.py")
    found = set()
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                parts = name.split(".") if is_pkg else name.split(".")[:-1]
                base = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            continue
        # importing a submodule runs its parents' __init__ first: not a dependency on purpose
        found |= {t for t in targets if t in known and t != name and not name.startswith(t + ".")}
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v), on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle_inside_the_package():
    mods = modules()
    graph = {name: imports(name, path, set(mods)) for name, path in mods.items()}
    assert cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c"]]


def test_every_package_is_listed_for_the_build():
    listed = set(tomllib.load(open(os.path.join(ROOT, "pyproject.toml"), "rb"))["tool"]["setuptools"]["packages"])
    packages = {name for name, path in modules().items() if path.endswith("__init__.py")}
    assert packages == listed


def _module_attributes(path: str) -> set[str]:
    """Attributes read or set on ``module`` / ``pl_module`` in a callback file."""
    return {node.attr for node in ast.walk(ast.parse(open(path).read()))
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
            and node.value.id in ("module", "pl_module")}


# LightningModule's own API that callbacks may use, as Lightning's callbacks do.
LIGHTNING_API = {"log", "device", "trainer", "global_rank", "current_epoch", "global_step"}


@pytest.mark.parametrize("path", sorted(p for n, p in modules().items() if n.startswith("lightning_rlpt.callbacks.")))
def test_callbacks_touch_only_the_public_surface(path):
    outside = _module_attributes(path) - set(PUBLIC_SURFACE) - LIGHTNING_API
    assert outside == set(), f"{os.path.basename(path)} reaches into RLModule: {sorted(outside)}"


@pytest.mark.parametrize("family", ["lightning_rlpt.algorithms.losses", "lightning_rlpt.algorithms.advantages"])
def test_a_family_imports_every_member_file(family):
    """A new loss or estimator is one file: the family's package imports every module beside it."""
    import importlib
    import sys

    package = importlib.import_module(family)
    files = {f[:-3] for f in os.listdir(os.path.dirname(package.__file__)) if f.endswith(".py") and f != "__init__.py"}
    assert files and all(f"{family}.{f}" in sys.modules for f in files)
