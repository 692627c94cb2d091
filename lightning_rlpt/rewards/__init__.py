"""Rewards: calling the user's functions safely (``functions``), ready-made ones (``library``) and
reward models (``model``)."""
from .functions import RewardError, RewardFunctions
from .library import (FormatReward, MathAnswerReward, SoftOverlongPunishment, format_reward, math_answer_reward,
                      soft_overlong_punishment)
from .model import RewardModel

__all__ = ["FormatReward", "MathAnswerReward", "RewardError", "RewardFunctions", "RewardModel",
           "SoftOverlongPunishment",
           "format_reward", "math_answer_reward", "soft_overlong_punishment"]
