"""Bridges from other RL trainers' configurations to this project's arguments.

- `lightning_rlpt.compat.trl`: TRL's ``GRPOConfig`` (an object or a dict of its fields) to
  `RLModule` / `PromptDataModule` / ``lightning.Trainer`` keyword arguments, and the table of
  TRL argument names that `RLModule` answers with the equivalent (docs/from_trl.md);
  `lightning_rlpt.compat.trl_fields` holds the tables of TRL's fields (mapped, refused, ignored)
  and a stand-in ``GRPOConfig`` for scripts run without TRL, `lightning_rlpt.compat.trl_checks`
  the checks of their values.

Nothing here imports torch, Lightning or TRL at import time: `RLModule` consults the name table
on every construction.
"""
