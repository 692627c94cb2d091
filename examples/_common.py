"""What the example scripts share: `write_json`, the results file a script writes with ``--json``
(``benchmarks/results/*.json``, rendered into the docs by ``benchmarks/headlines.py``).

A script in a subfolder puts this folder on ``sys.path`` to import it."""
from __future__ import annotations

import json
import os
from typing import Any, BinaryIO

from lightning_rlpt.checkpoint_io import atomic_write


def write_json(path: str, data: dict[str, Any]) -> None:
    """Write ``data`` to ``path`` as ``json.dump(data, f, indent=1)`` writes it (keys in their
    order, ASCII, no final newline: the format of the committed results), atomically: a temp file
    beside ``path`` renamed over it, so a run killed mid-write leaves the previous file whole.
    Creates the folder; the file gets the mode a plain ``open(path, "w")`` gives (the umask's)."""
    mask = os.umask(0)
    os.umask(mask)

    def write(f: BinaryIO) -> None:
        os.fchmod(f.fileno(), 0o666 & ~mask)  # the temp is made 0600
        f.write(json.dumps(data, indent=1).encode())

    atomic_write(path, write)
