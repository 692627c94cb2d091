"""Rewards: calling the user's functions safely (``functions``) and ready-made ones (``library``)."""
from .functions import RewardError, RewardFunctions
from .library import (FormatReward, MathAnswerReward, SoftOverlongPunishment, format_reward, math_answer_reward,
                      soft_overlong_punishment)

__all__ = ["FormatReward", "MathAnswerReward", "RewardError", "RewardFunctions", "SoftOverlongPunishment",
           "format_reward", "math_answer_reward", "soft_overlong_punishment"]
