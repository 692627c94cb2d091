"""Ready-made reward functions with TRL's signature ``fn(prompts, completions, **columns) -> list[float]``.

- `math_answer_reward` (`MathAnswerReward`, ``math_answer.py``): 1.0 when the completion's final
  answer equals the gold answer as mathematics (``\\boxed{1/2}`` = ``0.5`` = ``$\\frac{1}{2}$``),
  checked with the ``math_verify`` library; logged as ``rewards/math_answer/...``.
- `format_reward`, `think_format_reward` (`FormatReward`, ``format.py``): 1.0 when the whole
  completion matches a regular expression (``<think>...</think> <answer>...</answer>``; TRL's
  think format); logged as ``rewards/format/...`` and ``rewards/think_format/...``.
- `soft_overlong_punishment` (`SoftOverlongPunishment`, ``length.py``): DAPO's length penalty, 0
  down to −1 over the last ``soft_punish_cache`` tokens of the budget; ``rewards/overlong/...``.
- `LengthPenalty` (``length.py``): Kimi k1.5's length reward within each group, from +0.5 for the
  shortest correct completion to −0.5 for the longest; ``rewards/length/...``.
- `CodeExecutionReward` (``code/reward.py``): the fraction of the row's tests the completion's Python
  code passes, run under bubblewrap against assert-style or stdin/stdout tests, the verdict
  decided outside the code's process; ``rewards/code/...``.

All are callable classes rather than closures so they pickle (dataloader workers, spawned
processes), and all accept completions as strings or as TRL's conversational lists of messages.
This module gathers them, so configs can name e.g. ``lightning_rlpt.rewards.library:math_answer_reward``.
"""
from .code import CodeExecutionReward, SandboxLimitError, code_reward, extract_code
from .format import THINK_ANSWER_FORMAT, THINK_FORMAT, FormatReward, format_reward, think_format_reward
from .length import LengthPenalty, SoftOverlongPunishment, soft_overlong_punishment
from .math_answer import MathAnswerReward, math_answer_reward
from .text import completion_text

__all__ = ["THINK_ANSWER_FORMAT", "THINK_FORMAT", "CodeExecutionReward", "FormatReward", "LengthPenalty",
           "MathAnswerReward", "SandboxLimitError", "SoftOverlongPunishment", "code_reward", "completion_text", "extract_code",
           "format_reward", "math_answer_reward", "soft_overlong_punishment", "think_format_reward"]
