"""Rollouts, by concern: the engine contract (``engine.py``, and the module's side of it in
``contract.py``), the default engine (``hf.py``: `transformers.generate`), vLLM's engines
(``vllm/``), rollouts generated ahead (``pipeline.py``), what every engine samples with
(``sampling/``), completion servers any engine can use (``servers/``), multi-turn episodes
(``episodes/``), and the collection of a batch of prompts into an `Experience` (``collect.py``)."""
from .engine import RolloutEngine, RolloutOutput, WeightSource
from .hf import HFGenerateEngine
from .sampling import SamplingConfig

__all__ = ["HFGenerateEngine", "RolloutEngine", "RolloutOutput", "SamplingConfig", "WeightSource"]
