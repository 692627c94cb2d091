"""callbacks/ and kernels/ install inside the package namespace, in a wheel and editable."""
import os
import subprocess
import sys
import zipfile

import pytest
from conftest import ROOT



@pytest.mark.slow
def test_wheel_maps_callbacks_and_kernels_into_the_package(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", ROOT, "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path)], check=True, capture_output=True)
    (wheel,) = tmp_path.glob("lightning_rlpt-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "lightning_rlpt/callbacks/__init__.py" in names
    assert "lightning_rlpt/kernels/__init__.py" in names
    assert not any(n.startswith(("callbacks/", "kernels/")) for n in names)
    tree = {f"lightning_rlpt/{os.path.relpath(os.path.join(d, f), os.path.join(ROOT, 'lightning_rlpt'))}"
            for d, _, files in os.walk(os.path.join(ROOT, "lightning_rlpt")) for f in files if f.endswith(".py")}
    assert tree - set(names) == set(), "modules missing from the wheel: list their package in pyproject.toml"


def test_installed_package_imports_its_subpackages_from_anywhere(tmp_path):
    code = ("import lightning_rlpt.callbacks as c, lightning_rlpt.kernels as k, lightning_rlpt as p;"
            "print(c.RLCallback is p.RLCallback, hasattr(k, 'fused_logprobs'))")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, check=True, capture_output=True, text=True)
    assert out.stdout.split() == ["True", "True"]
