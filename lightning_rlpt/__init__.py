"""lightning-rlpt: reinforcement-learning post-training of language models on a standard
``lightning.Trainer``. See docs/architecture.md for the walk of a batch through the code."""
from .advantages import ADVANTAGE_ESTIMATORS, compute_advantages
from .aggregation import AGGREGATIONS, aggregate_loss
from .data import PromptDataModule, PromptDataset
from .experience import Experience
from .hooks import RLCallback
from .kl import KL_ESTIMATORS
from .module import RLModule
from .objectives import PRESETS
from .policy_losses import POLICY_LOSSES
from .reward_library import (FormatReward, MathAnswerReward, SoftOverlongPunishment, format_reward,
                             math_answer_reward, soft_overlong_punishment)
from .rewards import RewardError, RewardFunctions
from .rollout import HFGenerateEngine, RolloutEngine, RolloutOutput
from .sampling import SamplingConfig

__version__ = "0.1.0"

__all__ = [
    "ADVANTAGE_ESTIMATORS", "AGGREGATIONS", "Experience", "FormatReward", "HFGenerateEngine", "KL_ESTIMATORS",
    "MathAnswerReward", "POLICY_LOSSES", "PRESETS", "PromptDataModule", "PromptDataset", "RLCallback", "RLModule",
    "RewardError", "RewardFunctions", "RolloutEngine", "RolloutOutput", "SamplingConfig", "SoftOverlongPunishment",
    "aggregate_loss", "compute_advantages", "format_reward", "math_answer_reward", "soft_overlong_punishment",
]
