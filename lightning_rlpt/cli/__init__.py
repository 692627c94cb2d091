"""The ``lightning-rlpt`` command (LightningCLI ``fit``/``validate``, ``plot``, ``export``)."""
from .main import find_metrics, main

__all__ = ["find_metrics", "main"]
