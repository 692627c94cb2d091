"""Lightning callbacks for RL post-training, installed as ``lightning_rlpt.callbacks``.

Each callback acts through the hook points of `lightning_rlpt.hooks` and the module's
public knobs; see docs/architecture.md.
"""
from lightning_rlpt.hooks import RLCallback

__all__ = ["RLCallback"]
