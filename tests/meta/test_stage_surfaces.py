"""Each stage of `RLModule` declares what it reads of the module (typed class annotations, and
the hyper-parameters it reads as ``*_SETTINGS``), so a reader of a stage sees what it may touch.
Checked both ways, from the stage's code: everything it uses beyond its own methods and state and
Lightning's attributes is declared, and nothing declared goes unused."""
import ast
import os

import lightning as L
import pytest

from conftest import ROOT

STAGES = [("lightning_rlpt/stages/experience.py", "MakeExperience", "EXPERIENCE_SETTINGS"),
          ("lightning_rlpt/stages/update.py", "PolicyUpdate", "UPDATE_SETTINGS")]
LIGHTNING = set(dir(L.LightningModule)) | set(vars(L.LightningModule()))


def surface(path: str, name: str, settings: str) -> dict[str, set[str]]:
    """The stage's declared attributes and settings, and those its code uses."""
    tree = ast.parse(open(os.path.join(ROOT, path)).read())
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name]
    declared = {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and n.value is None}
    own = {n.name for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    own |= {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and n.value is not None}
    own |= {t.id for n in cls.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    used, stored, hparams = set(), set(), set()
    for node in ast.walk(cls):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
            (stored if isinstance(node.ctx, ast.Store) else used).add(node.attr)
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute)
                and isinstance(node.value.value, ast.Name) and node.value.value.id == "self"
                and node.value.attr == "hparams"):
            hparams.add(node.attr)
    (listed,) = [ast.literal_eval(n.value) for n in cls.body if isinstance(n, ast.Assign)
                 and any(isinstance(t, ast.Name) and t.id == settings for t in n.targets)]
    used |= stored & declared  # a declared attribute the stage moves (policy_version) is used; others are its own state
    own |= stored - declared
    return dict(declared=declared, used=used - own - LIGHTNING, settings=set(listed), hparams=hparams)


@pytest.mark.parametrize("path, name, settings", STAGES, ids=[s[1] for s in STAGES])
def test_a_stage_reads_only_what_it_declares_and_declares_only_what_it_reads(path, name, settings):
    found = surface(path, name, settings)
    assert found["used"] - found["declared"] == set(), f"{name} reads these without declaring them"
    assert found["declared"] - found["used"] == set(), f"{name} declares these and does not read them"
    assert found["hparams"] == found["settings"], f"{name}'s {settings} differs from the hyper-parameters it reads"


def test_the_check_sees_an_undeclared_read(tmp_path, monkeypatch):
    """The check can fail: a stage reading one more attribute, or one more setting, is caught."""
    source = open(os.path.join(ROOT, STAGES[1][0])).read()
    extra = source.replace("        start = time.perf_counter()\n",
                           "        start = time.perf_counter() + self.tokens_seen * self.hparams.seed\n", 1)
    assert extra != source
    (tmp_path / "update.py").write_text(extra)
    monkeypatch.setattr("test_stage_surfaces.ROOT", str(tmp_path))
    found = surface("update.py", "PolicyUpdate", "UPDATE_SETTINGS")
    assert found["used"] - found["declared"] == {"tokens_seen"} and found["hparams"] - found["settings"] == {"seed"}
