"""docs/objectives.md documents every registered policy loss, advantage estimator and KL estimator."""
import os
import re

import pytest
from conftest import ROOT

from lightning_rlpt import ADVANTAGE_ESTIMATORS, KL_ESTIMATORS, POLICY_LOSSES

DOC = os.path.join(ROOT, "docs", "objectives.md")
KINDS = {"policy loss": POLICY_LOSSES, "advantage": ADVANTAGE_ESTIMATORS, "KL estimator": KL_ESTIMATORS}


def table_rows():
    """``{name: (kind, cells)}`` of the table's rows."""
    rows = {}
    with open(DOC, encoding="utf-8") as f:
        for line in f:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            match = re.fullmatch(r"`([^`]+)`", cells[0]) if line.startswith("|") else None
            if match:
                rows[match.group(1)] = cells
    return rows


@pytest.mark.parametrize("kind", list(KINDS))
def test_every_registered_name_has_a_complete_row(kind):
    rows = table_rows()
    for name in KINDS[kind].names():
        assert name in rows, f"{kind} {name!r} is registered but not documented in docs/objectives.md"
        cells = rows[name]
        assert cells[1] == kind, f"{name!r} is listed as {cells[1]!r}, not {kind!r}"
        assert len(cells) == 6 and all(cells[2:5]), f"{name!r}: fill in formula, source and when to use"


def test_no_row_names_an_unregistered_function():
    known = {n for registry in KINDS.values() for n in registry.names()}
    assert set(table_rows()) <= known
