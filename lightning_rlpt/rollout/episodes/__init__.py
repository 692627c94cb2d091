"""Multi-turn episodes: tools, tool-call parsing, chat-template rendering, environments, the
loop and the rollout path's entry (docs/agents.md)."""
from lightning_rlpt.rollout.episodes.agent import Agent
from lightning_rlpt.rollout.episodes.episode import Episode, episode_metrics
from lightning_rlpt.rollout.episodes.loop import run_episodes, turn_seed
from lightning_rlpt.rollout.episodes.parsing import HermesToolParser, ParsedTurn, ToolCall, ToolParser, as_parser
from lightning_rlpt.rollout.episodes.template import check_tools_template, render_suffix
from lightning_rlpt.rollout.episodes.tools import Tool, ToolBox, ToolResult
from lightning_rlpt.rollout.episodes.environment import (Environment, EnvironmentFactory, EnvironmentReward,  # noqa: E402,I001
                                                          check_reset, check_step, make_environment)

__all__ = [
    "Agent", "Episode", "episode_metrics", "run_episodes", "turn_seed",
    "HermesToolParser", "ParsedTurn", "ToolCall", "ToolParser", "as_parser",
    "check_tools_template", "render_suffix",
    "Tool", "ToolBox", "ToolResult",
    "Environment", "EnvironmentFactory", "EnvironmentReward", "check_reset", "check_step", "make_environment",
]
