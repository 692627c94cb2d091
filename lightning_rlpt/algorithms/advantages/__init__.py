"""Advantage estimators, one registration point: importing this package imports every module in
this folder, and each registers its estimators with ``@ADVANTAGE_ESTIMATORS.register(name, ...)``.
A new estimator is one new file here (and its test): no other file changes; or, outside the
package, one registered function in the user's own code (docs/objectives.md)."""
import importlib
import pkgutil

from .base import ADVANTAGE_ESTIMATORS, check_estimator, compute_advantages, estimator_fields, estimator_requests
from .inputs import AdvantageInputs

for _member in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_member.name}")

__all__ = ["ADVANTAGE_ESTIMATORS", "AdvantageInputs", "check_estimator", "compute_advantages", "estimator_fields",
           "estimator_requests"]
