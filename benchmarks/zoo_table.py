"""Render the supported layouts × engines × sync modes table from the conformance matrix's JSON
(``benchmarks/results/zoo_matrix.json``, written by `make zoo`, i.e. ``tests/zoo``) into
docs/support.md and README.md, between ``<!-- zoo-table -->`` markers. Never typed by hand:
tests/zoo/test_support_table.py fails when a page differs from what this script renders.

    python benchmarks/zoo_table.py          # rewrite the pages
    python benchmarks/zoo_table.py --check  # exit 1 if a page is stale
"""
from __future__ import annotations

import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MATRIX = os.path.join(ROOT, "benchmarks", "results", "zoo_matrix.json")
PAGES = [os.path.join(ROOT, "docs", "support.md"), os.path.join(ROOT, "README.md")]
ENGINES = {"hf": "HF `generate`", "vllm": "`VLLMRollout`", "vllm-server": "`VLLMServerRollout`"}
SYNCS = ("full", "lora", "qlora")
MARK = re.compile(r"(<!-- zoo-table -->\n).*?(<!-- /zoo-table -->)", re.S)


def cell_text(cell: dict) -> str:
    if cell["status"] != "ok":
        return "refused"
    worst = max(g["max"] for g in cell["gaps"])
    return f"✓ {worst:.0e}"


def render(cells: dict[str, dict]) -> str:
    """One row per architecture, one column per engine × sync: ✓ with the largest |Δ log p| of the
    cell's two rollouts (fp32), or "refused" (the engine names the layout at construction)."""
    archs = list(dict.fromkeys(key.split("/")[0] for key in cells))
    head = "| architecture | " + " | ".join(f"{ENGINES[e]} {s}" for e in ENGINES for s in SYNCS) + " |"
    lines = [head, "|" + "---|" * (1 + len(ENGINES) * len(SYNCS))]
    for arch in archs:
        row = [cell_text(cells[f"{arch}/{e}/{s}"]) for e in ENGINES for s in SYNCS]
        lines.append(f"| {arch} | " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def updated(text: str, table: str) -> str:
    if not MARK.search(text):
        raise SystemExit("no <!-- zoo-table --> ... <!-- /zoo-table --> markers in the page")
    return MARK.sub(lambda m: m.group(1) + table + m.group(2), text)


def main(check: bool = False) -> int:
    with open(MATRIX) as f:
        table = render(json.load(f))
    stale = []
    for page in PAGES:
        with open(page) as f:
            text = f.read()
        new = updated(text, table)
        if new != text:
            stale.append(page)
            if not check:
                with open(page, "w") as f:
                    f.write(new)
    if check and stale:
        print("stale (run python benchmarks/zoo_table.py):", *stale)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(check="--check" in sys.argv))
