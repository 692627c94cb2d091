"""Figures come from their JSON, not from typing: the blocks `benchmarks/headlines.py` renders (the
README's headline results; docs/results.md's demo line, calculator table, engine table, sampler
table and floors) are what it renders from ``benchmarks/results/`` today, and every other table of
docs/results.md is found, verbatim, in a report a benchmark rendered from its JSON
(``benchmarks/results/**/*.md``)."""
import glob
import os
import re
import subprocess
import sys

from conftest import ROOT


def tables(path: str) -> list[list[str]]:
    """The page's tables, outside the blocks headlines.py renders (checked whole by --check)."""
    text = re.sub(r"<!-- ([\w-]+) -->\n.*?<!-- /\1 -->", "", open(path, encoding="utf-8").read(), flags=re.S)
    out, current = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            current.append(line)
        elif current:
            out, current = out + [current], []
    return out


def test_the_rendered_blocks_are_what_the_json_gives():
    done = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "headlines.py"), "--check"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_other_results_table_is_a_rendered_report():
    reports = [open(p, encoding="utf-8").read()
               for p in glob.glob(os.path.join(ROOT, "benchmarks", "results", "**", "*.md"), recursive=True)]
    typed = [t[0] for t in tables(os.path.join(ROOT, "docs", "results.md"))
             if not any("\n".join(t) in r for r in reports)]
    assert not typed, f"tables of docs/results.md found in no report under benchmarks/results: {typed}"
