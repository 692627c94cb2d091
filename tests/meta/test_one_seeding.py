"""One seed derivation (`lightning_rlpt.seeding`): no other module of the package hashes or mixes
seeds. A new stream names a domain there instead of writing a fifth derivation."""
import os
import re

from conftest import ROOT

PACKAGES = ("lightning_rlpt", "callbacks", "kernels")
DERIVATION = re.compile(r"\bhashlib\b|SeedSequence|seed \* \d|\bseed\w* \^")


def test_no_seed_is_derived_outside_the_seeding_module():
    found = []
    for package in PACKAGES:
        for folder, _, files in os.walk(os.path.join(ROOT, package)):
            for name in files:
                path = os.path.join(folder, name)
                if not name.endswith(".py") or path.endswith(os.path.join("lightning_rlpt", "seeding.py")):
                    continue
                for number, line in enumerate(open(path), 1):
                    if DERIVATION.search(line):
                        found.append(f"{os.path.relpath(path, ROOT)}:{number}: {line.strip()}")
    assert not found, "seeds derived outside lightning_rlpt/seeding.py:\n" + "\n".join(found)
