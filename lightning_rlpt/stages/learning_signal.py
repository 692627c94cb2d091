"""`NoSignalWatch`: a warning, once per fit, when most groups have carried no learning signal for
a while. A group whose completions all score the same has advantages of 0 and teaches nothing; a
run from a model that never solves its task shows a flat reward of 0 and nothing else says why.

Only a warning: it changes nothing in the run. Its count is not checkpointed, so a resumed fit
counts afresh (it may warn later than the straight run would)."""
from __future__ import annotations

from lightning.pytorch.utilities import rank_zero_warn

STEPS = 10  # training rollouts in a row
SHARE = 0.9  # of the groups with identical rewards (frac_reward_zero_std)


class NoSignalWatch:
    """Counts training rollouts in a row whose ``frac_reward_zero_std`` is at least ``share``;
    warns once at ``steps`` of them, saying what the flat rewards were and what to try."""

    def __init__(self, steps: int = STEPS, share: float = SHARE):
        self.steps, self.share = steps, share
        self.run, self.warned = 0, False

    def see(self, frac_zero_std: float, reward: float, group_size: int) -> str | None:
        """Note one rollout; the warning's text when it is given (once), else None."""
        self.run = self.run + 1 if frac_zero_std >= self.share else 0
        if self.warned or self.run < self.steps:
            return None
        self.warned = True
        message = (
            f"lightning_rlpt: for the last {self.run} training rollouts at least {self.share:.0%} of the groups had "
            f"identical rewards (frac_reward_zero_std {frac_zero_std:.2f}, mean reward {reward:.3g}): their "
            "advantages are 0, so those groups teach the policy nothing. If every completion scores the lowest "
            "reward, the task is too hard for this model: start from one that solves some prompts (an SFT or warm "
            "start), easier prompts, or a reward with partial credit; if every one scores the highest, too easy; "
            "otherwise the reward may not tell completions apart. A larger group_size (now "
            f"{group_size}) or temperature spreads a group's scores; CurriculumSampler(dynamic_filtering=True) "
            "drops groups without signal.")
        rank_zero_warn(message)
        return message
