"""What the example scripts share: `write_json`, the results file a script writes with ``--json``
(``benchmarks/results/*.json``, rendered into the docs by ``benchmarks/headlines.py``).

A script in a subfolder puts this folder on ``sys.path`` to import it."""
from __future__ import annotations

import json
from typing import Any

from lightning_rlpt.checkpoint_io import atomic_write


def write_json(path: str, data: dict[str, Any]) -> None:
    """Write ``data`` to ``path`` as ``json.dump(data, f, indent=1)`` writes it (keys in their
    order, ASCII, no final newline: the format of the committed results), atomically: a temp file
    beside ``path`` renamed over it, so a run killed mid-write leaves the previous file whole.
    Creates the folder; the file gets the mode a plain ``open(path, "w")`` gives (`atomic_write`)."""
    atomic_write(path, lambda f: f.write(json.dumps(data, indent=1).encode()))
