"""Every docstring example in the package runs and prints what it says (examples that need a
checkpoint or a GPU are marked ``# doctest: +SKIP`` where they are written)."""
import doctest
import importlib
import pkgutil

import pytest

import lightning_rlpt

import lightning_rlpt.callbacks  # noqa: E402  (installed from callbacks/ and kernels/: walked on their own)
import lightning_rlpt.kernels  # noqa: E402

SKIP = {
    # Its examples need TRITON_INTERPRET=1 set before triton is imported (or a GPU):
    # tests/kernels/test_kernels_triton.py runs them in such a subprocess.
    "lightning_rlpt.kernels.triton_logprobs",
    "lightning_rlpt.kernels.triton_owned",
}
PACKAGES = (lightning_rlpt, lightning_rlpt.callbacks, lightning_rlpt.kernels)
MODULES = sorted({m.name for package in PACKAGES for m in pkgutil.walk_packages(package.__path__, package.__name__ + ".")
                  if m.name not in SKIP})


def test_the_walk_finds_the_subpackages():
    assert {"lightning_rlpt.callbacks.bapo", "lightning_rlpt.kernels.chunked", "lightning_rlpt.optim.schedules",
            "lightning_rlpt.rewards.model"} <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), report=True)
    assert result.failed == 0
