"""Lightning callbacks for RL post-training, installed as ``lightning_rlpt.callbacks``.

Each callback acts through the hook points of `lightning_rlpt.hooks` and the module's public
surface (`lightning_rlpt.hooks.PUBLIC_SURFACE`, docs/architecture.md). Imports are lazy so that, for example, vLLM is only imported
when `VLLMRollout` is used.
"""
from importlib import import_module

from lightning_rlpt.hooks import RLCallback

_WHERE = {
    "EngineCallback": "engine_callback",
    "VLLMRollout": "vllm_rollout",
    "VLLMServerRollout": "vllm_server_rollout",
    "EntropyGatedKL": "entropy_gated_kl",
    "ReferenceReset": "reference_reset",
    "ResponseWeightedKL": "response_weighted_kl",
    "AccuracyConditionedKL": "accuracy_conditioned_kl",
    "CurriculumSampler": "curriculum_sampler",
    "ESSScaledLR": "ess_scaled_lr",
    "RewardDithering": "reward_dithering",
    "BAPO": "bapo",
    "CompletionSamples": "completion_samples",
    "CollectiveWatchdog": "collective_watchdog",
}

__all__ = ["RLCallback", *_WHERE]


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(import_module(f".{_WHERE[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
