"""docs/generation.md's table of generation defaults is the code's: the "default here" column is
`SamplingConfig`'s, the TRL column is `TRL_DEFAULTS` (which tests/parity checks against the
installed TRL's `GRPOConfig`), and every field has its row."""
import dataclasses
import os
import re

from conftest import ROOT

from lightning_rlpt.compat.trl_fields import TRL_DEFAULTS
from lightning_rlpt.rollout.sampling import SamplingConfig

TRL_NAMES = {"max_new_tokens": "max_completion_length"}  # the only field TRL names otherwise


def table_rows() -> dict[str, tuple[str, str]]:
    text = open(os.path.join(ROOT, "docs", "generation.md")).read()
    rows = re.findall(r"^\| `(\w+)` \| `([^`]*)` \| ([^|]*) \|", text, re.M)
    return {name: (ours, trl.strip()) for name, ours, trl in rows}


def test_the_docs_table_is_the_codes_defaults_beside_trls():
    rows = table_rows()
    fields = {f.name: f.default for f in dataclasses.fields(SamplingConfig)}
    assert list(rows) == list(fields)
    for name, default in fields.items():
        ours, trl = rows[name]
        assert ours == repr(default), name
        trl_name = TRL_NAMES.get(name, name)
        expected = f"`{trl_name}`: `{TRL_DEFAULTS[trl_name]!r}`" if trl_name in TRL_DEFAULTS else "—"
        assert trl == expected, name
