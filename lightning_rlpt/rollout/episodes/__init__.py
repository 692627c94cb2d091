"""Multi-turn episodes: tools, tool-call parsing, chat-template rendering, environments."""
from lightning_rlpt.rollout.episodes.parsing import HermesToolParser, ParsedTurn, ToolCall, ToolParser, as_parser
from lightning_rlpt.rollout.episodes.tools import Tool, ToolBox, ToolResult

__all__ = [
    "HermesToolParser", "ParsedTurn", "ToolCall", "ToolParser", "as_parser",
    "Tool", "ToolBox", "ToolResult",
]
