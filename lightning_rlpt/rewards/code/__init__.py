"""Code rewards: `CodeExecutionReward` runs a completion's code under bubblewrap (``reward.py``,
``sandbox*.py``); `RemoteCodeReward` runs it on a SandboxFusion-style service (``remote*.py``).
In both, the verdict is decided outside the process that ran the code (docs/rewards.md)."""
from .reward import CodeExecutionReward, SandboxLimitError, code_reward, extract_code
from .remote import RemoteCodeReward
from .sandbox_launch import SandboxUnavailable

__all__ = ["CodeExecutionReward", "RemoteCodeReward", "SandboxLimitError", "SandboxUnavailable", "code_reward",
           "extract_code"]
