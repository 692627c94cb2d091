"""The parity table in docs/from_trl.md is the rendering of benchmarks/results/parity.json, and that
JSON holds every setting the parity tests compare (none added or renamed without regenerating it)."""
import importlib.util
import json
import os

from parity_record import RESULTS

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

spec = importlib.util.spec_from_file_location("parity_table", os.path.join(ROOT, "benchmarks", "parity_table.py"))
table = importlib.util.module_from_spec(spec)
spec.loader.exec_module(table)


def recorded():
    with open(table.RESULTS) as f:
        return json.load(f)


def test_the_doc_holds_the_rendered_json():
    with open(table.DOC) as f:
        doc = f.read()
    assert table.with_table(doc, table.render(recorded())) == doc, \
        "docs/from_trl.md's parity table is not the JSON's: run python benchmarks/parity_table.py"


def test_the_json_holds_every_compared_setting():
    import test_parity_liger as liger
    import test_parity_trl_advantages as advantages
    import test_parity_trl_loss as loss
    import test_parity_verl as verl

    names = {(s, "TRL 1.16") for s in list(loss.SETTINGS) + list(advantages.SETTINGS)}
    names |= {(s, "Liger-Kernel 0.8.5 (CPU, compiled=False)") for s in liger.SETTINGS}
    names |= {(f"advantage: {s}", verl.PEER) for s in verl.ADVANTAGES} | {(f"policy loss: {s}", verl.PEER)
                                                                         for s in verl.LOSSES}
    rows = {(r["setting"], r["peer"]): r for r in recorded()["rows"]}
    assert sorted(names - set(rows)) == [], "settings missing from the JSON: regenerate it (benchmarks/parity_table.py)"
    for key, entry in RESULTS.items():  # what this session measured, where the parity tests ran before this one
        assert key in rows and bool(entry.get("differs")) == bool(rows[key].get("differs")), key
