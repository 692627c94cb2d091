"""The package's modules as the tests see them (callbacks and kernels mapped into
``lightning_rlpt``), and the size report printed at the end of a test run."""
from __future__ import annotations

import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCES = {"lightning_rlpt": "lightning_rlpt", "lightning_rlpt.callbacks": "callbacks",
           "lightning_rlpt.kernels": "kernels"}
LONG = 400  # lines: past this a module is worth a look (a file holds one concern, whatever its length)


def modules() -> dict[str, str]:
    """``{dotted name: path}`` of every module of the installed package (callbacks and kernels mapped in)."""
    out = {}
    for package, folder in SOURCES.items():
        base = os.path.join(ROOT, folder)
        for d, _, files in os.walk(base):
            for f in files:
                if f.endswith(".py"):
                    rel = os.path.relpath(os.path.join(d, f), base)[:-3].replace(os.sep, ".")
                    name = package if rel == "__init__" else f"{package}.{rel.removesuffix('.__init__')}"
                    out[name] = os.path.join(d, f)
    return out


def long_modules(limit: int = LONG) -> list[tuple[str, int]]:
    """``(path relative to the repository, lines)`` of the modules longer than ``limit``, longest first."""
    sizes = [(os.path.relpath(p, ROOT), sum(1 for _ in open(p))) for p in modules().values()]
    return sorted(((p, n) for p, n in sizes if n > limit), key=lambda item: -item[1])
