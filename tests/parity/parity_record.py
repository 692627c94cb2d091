"""What the parity tests measured, for the table in docs/from_trl.md.

Each comparison calls `compare`, which asserts the agreement and records the largest difference
under the setting's name and the peer's. With ``PARITY_JSON=<path>`` set, the records are written
there when the test process ends (`write_json`; no conftest here: a second ``conftest`` module would
shadow tests/conftest.py for the other folders' ``from conftest import ...``); ``python benchmarks/parity_table.py`` renders the committed
benchmarks/results/parity.json into the doc, and tests/parity/test_parity_table.py fails when the
two differ.
"""
from __future__ import annotations

import atexit
import json
import os
from typing import Any

import torch

RTOL, ATOL = 1e-6, 1e-9  # the 1e-6 relative; ATOL for values that are 0 on one side
RESULTS: dict[tuple[str, str], dict[str, Any]] = {}


def _as_tensor(x: Any) -> torch.Tensor:
    return torch.as_tensor(x, dtype=torch.float64).detach().reshape(-1)


def max_diff(ours: Any, peer: Any) -> float:
    a, b = _as_tensor(ours), _as_tensor(peer)
    return float((a - b).abs().max()) if a.numel() else 0.0


def compare(setting: str, peer: str, pairs: dict[str, tuple[Any, Any]], rtol: float = RTOL, atol: float = ATOL) -> float:
    """Assert each ``name: (ours, peer's)`` agrees to ``rtol`` (relative) and record the largest
    absolute difference of the setting against ``peer``; returns it."""
    worst = 0.0
    for name, (ours, theirs) in pairs.items():
        a, b = _as_tensor(ours), _as_tensor(theirs)
        assert a.shape == b.shape, f"{setting}: {name} has shape {tuple(a.shape)} here, {tuple(b.shape)} in {peer}"
        assert torch.allclose(a, b, rtol=rtol, atol=atol, equal_nan=True), \
            f"{setting}: {name} differs from {peer}'s by {max_diff(a, b):.3g}\n  ours {a[:8].tolist()}\n  {peer} {b[:8].tolist()}"
        worst = max(worst, max_diff(a, b))
    entry = RESULTS.setdefault((setting, peer), {"setting": setting, "peer": peer, "quantities": [], "max_diff": 0.0})
    entry["quantities"] = sorted(set(entry["quantities"]) | set(pairs))
    entry["max_diff"] = max(entry["max_diff"], worst)
    return worst


def differs(setting: str, peer: str, pairs: dict[str, tuple[Any, Any]], why: str) -> float:
    """A known, documented difference: assert that it is still there (so a change on either side
    is seen) and record it with ``why``; returns the largest difference."""
    worst = max(max_diff(a, b) for a, b in pairs.values())
    assert worst > ATOL, f"{setting}: now agrees with {peer}: move it to the agreeing settings and drop the note"
    RESULTS[(setting, peer)] = {"setting": setting, "peer": peer, "quantities": sorted(pairs), "max_diff": worst,
                                "differs": why}
    return worst


@atexit.register
def write_json() -> None:
    """What this process measured, to ``$PARITY_JSON`` when that is set (benchmarks/parity_table.py renders it)."""
    path = os.environ.get("PARITY_JSON")
    if not path or not RESULTS:
        return
    rows = sorted(RESULTS.values(), key=lambda r: (r["peer"], r["setting"]))
    with open(path, "w") as f:
        json.dump({"tolerance": "1e-6 relative", "rows": rows}, f, indent=1)
        f.write("\n")
