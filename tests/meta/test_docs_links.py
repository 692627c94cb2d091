"""Every relative link in the README and docs/ leads somewhere: the file exists and, for a link
to a heading (``page.md#anchor``), the page has that heading under GitHub's anchor rule. Pages
moved between the README and docs/ keep their links only if this holds."""
import glob
import os
import re

import pytest
from conftest import ROOT

PAGES = sorted(glob.glob(os.path.join(ROOT, "docs", "*.md"))) + [os.path.join(ROOT, "README.md")]


def prose(path: str) -> str:
    """The page without its fenced code blocks (a fence is a line of its own: ```` ```python ````
    inside a sentence opens nothing)."""
    kept, fenced = [], False
    for line in open(path, encoding="utf-8").read().splitlines():
        if re.match(r"\s*```+[\w-]*\s*$", line):
            fenced = not fenced
        elif not fenced:
            kept.append(line)
    return "\n".join(kept)


def anchors(path: str) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces to hyphens."""
    text = prose(path)
    heads = re.findall(r"^#+\s+(.*)$", text, flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}


def links(path: str) -> list[str]:
    text = prose(path)
    return [t for t in re.findall(r"\]\(([^)\s]+)\)", text) if not re.match(r"[a-z]+:", t)]


def test_anchor_rule():
    assert "sampling-parity-checked-at-run-time" in anchors(os.path.join(ROOT, "docs", "vllm.md"))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: os.path.relpath(p, ROOT))
def test_every_relative_link_resolves(page):
    broken = []
    for link in links(page):
        target, _, anchor = link.partition("#")
        path = os.path.normpath(os.path.join(os.path.dirname(page), target)) if target else page
        if not os.path.exists(path):
            broken.append(f"{link} (no file {os.path.relpath(path, ROOT)})")
        elif anchor and path.endswith(".md") and anchor not in anchors(path):
            broken.append(f"{link} (no heading #{anchor} in {os.path.relpath(path, ROOT)})")
    assert not broken, broken
