"""lightning-rlpt: reinforcement-learning post-training of language models on a standard
``lightning.Trainer``. See docs/architecture.md for the layout and the walk of a batch."""
from .algorithms import (ADVANTAGE_ESTIMATORS, AGGREGATIONS, KL_ESTIMATORS, POLICY_LOSSES, PRESETS, aggregate_loss,
                         compute_advantages)
from .data import PromptDataModule, PromptDataset
from .experience import Experience
from .hooks import RLCallback
from .knobs import Knobs, Requests
from .module import RLModule
from .options import (AgentOptions, CheckpointOptions, LoadingOptions, MemoryOptions, ObjectiveOptions, OptimizationOptions,
                      RewardOptions, ValidationOptions)
from .rewards import (CodeExecutionReward, FormatReward, HTTPReward, LengthPenalty, MathAnswerReward, RemoteCodeReward,
                      RewardError, RewardFunctions, RewardModel, SoftOverlongPunishment, format_reward, math_answer_reward,
                      soft_overlong_punishment, think_format_reward)
from .rollout import HFGenerateEngine, RolloutEngine, RolloutOutput, SamplingConfig

__version__ = "0.1.0"

__all__ = [
    "ADVANTAGE_ESTIMATORS", "AGGREGATIONS", "Experience", "FormatReward", "HFGenerateEngine", "HTTPReward",
    "KL_ESTIMATORS", "Knobs",
    "MathAnswerReward", "POLICY_LOSSES", "PRESETS", "PromptDataModule", "PromptDataset", "RLCallback", "RLModule",
    "Requests", "RewardError", "RewardFunctions", "RewardModel", "RolloutEngine", "RolloutOutput", "SamplingConfig",
    "SoftOverlongPunishment", "aggregate_loss", "compute_advantages", "format_reward", "math_answer_reward",
    "soft_overlong_punishment", "CodeExecutionReward", "LengthPenalty", "RemoteCodeReward", "think_format_reward",
    "AgentOptions", "CheckpointOptions", "LoadingOptions", "MemoryOptions", "ObjectiveOptions", "OptimizationOptions",
    "RewardOptions", "ValidationOptions",
]
