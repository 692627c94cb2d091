"""Rewards: calling the user's functions safely (``functions``) and ready-made ones (``library``)."""
from .functions import RewardError, RewardFunctions
from .library import (CodeExecutionReward, FormatReward, LengthPenalty, MathAnswerReward, SoftOverlongPunishment,
                      format_reward, math_answer_reward, soft_overlong_punishment, think_format_reward)

__all__ = ["CodeExecutionReward", "FormatReward", "LengthPenalty", "MathAnswerReward", "RewardError",
           "RewardFunctions", "SoftOverlongPunishment", "format_reward", "math_answer_reward",
           "soft_overlong_punishment", "think_format_reward"]
