"""Rewards: calling the user's functions safely (``functions``, ``calling``), remote ones
(``http``), reward models (``model``) and ready-made ones (``library``)."""
from .calling import RewardError, RewardTimeout, RewardUnavailable
from .functions import RewardFunctions, as_trl_completions
from .http import HTTPReward
from .library import (CodeExecutionReward, FormatReward, LengthPenalty, MathAnswerReward, SoftOverlongPunishment,
                      format_reward, math_answer_reward, soft_overlong_punishment, think_format_reward)
from .model import RewardModel
from .scoring import score_experience
from .code import RemoteCodeReward
from .state import TrainerState

__all__ = ["CodeExecutionReward", "FormatReward", "HTTPReward", "LengthPenalty", "MathAnswerReward", "RemoteCodeReward",
           "RewardError", "RewardFunctions", "RewardModel", "RewardTimeout", "RewardUnavailable", "SoftOverlongPunishment",
           "TrainerState", "as_trl_completions", "format_reward", "math_answer_reward", "score_experience",
           "soft_overlong_punishment", "think_format_reward"]
