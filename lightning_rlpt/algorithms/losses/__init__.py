"""Policy losses, one registration point: importing this package imports every module in this
folder, and each registers its losses with ``@POLICY_LOSSES.register(name, ...)``. A new loss is
one new file here (and its test): no other file changes (docs/objectives.md has a worked example)."""
import importlib
import pkgutil

from .base import POLICY_LOSSES, Stats, per_token

for _member in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_member.name}")

__all__ = ["POLICY_LOSSES", "Stats", "per_token"]
