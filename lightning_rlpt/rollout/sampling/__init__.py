"""What every rollout engine samples with: the settings (`SamplingConfig`, ``settings.py``), the
extra keyword arguments of each engine's sampler (``generation_kwargs.py``) and the seed of each
row (``per_row.py``)."""
from .settings import SamplingConfig

__all__ = ["SamplingConfig"]
