"""Multi-turn and tool-calling rollouts: episodes, the loop, and the rollout path's entry (docs/agents.md)."""
from .agent import Agent
from .episode import Episode, episode_metrics
from .loop import run_episodes, turn_seed

__all__ = ["Agent", "Episode", "episode_metrics", "run_episodes", "turn_seed"]
