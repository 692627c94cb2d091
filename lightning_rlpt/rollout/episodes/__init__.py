"""Multi-turn episodes: tools, tool-call parsing, chat-template rendering, environments."""
from lightning_rlpt.rollout.episodes.parsing import HermesToolParser, ParsedTurn, ToolCall, ToolParser, as_parser
from lightning_rlpt.rollout.episodes.template import check_tools_template, render_suffix
from lightning_rlpt.rollout.episodes.tools import Tool, ToolBox, ToolResult
from lightning_rlpt.rollout.episodes.environment import (Environment, EnvironmentFactory, EnvironmentReward,  # noqa: E402,I001
                                                          check_reset, check_step, make_environment)

__all__ = [
    "HermesToolParser", "ParsedTurn", "ToolCall", "ToolParser", "as_parser",
    "check_tools_template", "render_suffix",
    "Tool", "ToolBox", "ToolResult",
    "Environment", "EnvironmentFactory", "EnvironmentReward", "check_reset", "check_step", "make_environment",
]
