"""Rollouts: engines (the interface, `transformers.generate`, vLLM in ``vllm/``), sampling
settings and the collection of a batch of prompts into a scored `Experience` (``collect``)."""
from .engine import RolloutEngine, RolloutOutput, WeightSource
from .hf import HFGenerateEngine
from .sampling import SamplingConfig

__all__ = ["HFGenerateEngine", "RolloutEngine", "RolloutOutput", "SamplingConfig", "WeightSource"]
