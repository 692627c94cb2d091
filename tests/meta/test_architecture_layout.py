"""docs/architecture.md's layout tree names every module of the package, where it is: a module
added, moved or removed without the tree following would leave the page that says where things
are saying something else."""
import os
import re

from conftest import ROOT

PACKAGES = ("lightning_rlpt", "callbacks", "kernels")


def tree_paths(text: str) -> set[str]:
    """The file paths of the first fenced block of ``text``: two spaces of indent per level, a
    name ending in ``/`` a folder, the rest of each line its description."""
    block = text.split("```\n", 2)[1]
    folders: list[str] = []
    paths = set()
    for line in block.splitlines():
        match = re.match(r"( *)(\S+)", line)
        if not match:
            continue
        depth, name = len(match.group(1)) // 2, match.group(2)
        del folders[depth:]
        if name.endswith("/"):
            folders.append(name.rstrip("/"))
        elif name.endswith(".py"):
            paths.add("/".join(folders + [name]))
    return paths


def package_paths() -> set[str]:
    found = set()
    for package in PACKAGES:
        for folder, _, files in os.walk(os.path.join(ROOT, package)):
            found.update(os.path.relpath(os.path.join(folder, f), ROOT) for f in files if f.endswith(".py"))
    return found


def test_the_tree_parses_nested_folders():
    text = "x\n```\npkg/\n  a.py  one\n  sub/\n    b.py  two\n  c.py  three\n```\n"
    assert tree_paths(text) == {"pkg/a.py", "pkg/sub/b.py", "pkg/c.py"}


def test_the_architecture_tree_names_every_module_and_no_other():
    listed = tree_paths(open(os.path.join(ROOT, "docs", "architecture.md")).read())
    modules = {p for p in package_paths() if not p.endswith("__init__.py")}
    listed = {p for p in listed if not p.endswith("__init__.py")}
    assert not modules - listed, f"modules the layout in docs/architecture.md does not list: {sorted(modules - listed)}"
    assert not listed - modules, f"docs/architecture.md lists modules that do not exist: {sorted(listed - modules)}"
