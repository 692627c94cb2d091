"""``python -m lightning_rlpt ...`` is the ``lightning-rlpt`` command (`cli.main`): ``fit``,
``validate``, ``plot``, ``export``."""
import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
