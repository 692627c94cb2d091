"""Multi-turn episodes: tools, tool-call parsing, chat-template rendering, environments."""
from lightning_rlpt.rollout.episodes.environment import (Environment, EnvironmentFactory, EnvironmentReward,
                                                          check_reset, check_step, make_environment)
from lightning_rlpt.rollout.episodes.parsing import HermesToolParser, ParsedTurn, ToolCall, ToolParser, as_parser
from lightning_rlpt.rollout.episodes.template import check_tools_template, render_suffix
from lightning_rlpt.rollout.episodes.tools import Tool, ToolBox, ToolResult

__all__ = [
    "Environment", "EnvironmentFactory", "EnvironmentReward", "check_reset", "check_step", "make_environment",
    "HermesToolParser", "ParsedTurn", "ToolCall", "ToolParser", "as_parser",
    "check_tools_template", "render_suffix",
    "Tool", "ToolBox", "ToolResult",
]
