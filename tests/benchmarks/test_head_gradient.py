"""`benchmarks/head_gradient.py` compares like for like: both sides compute the same loss and the
same gradients on the same tensors (so a speed-up cannot come from doing less), its floor is three
GEMMs at floor.json's peak, and a quick run writes the JSON the docs render from."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import torch
from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import head_gradient  # noqa: E402


def _run_side(side, tensors):
    hidden, weight = tensors[0], tensors[1]
    grads = {}
    hook = [hidden.register_hook(lambda g: grads.__setitem__("hidden", g.clone())),
            weight.register_hook(lambda g: grads.__setitem__("weight", g.clone()))]
    head_gradient.step(side, *tensors)
    for h in hook:
        h.remove()
    return grads


def test_both_sides_compute_the_same_gradients():
    tensors = head_gradient._inputs(4, 8, 16, 300)
    forward, recompute = _run_side("forward", tensors), _run_side("recompute", tensors)
    assert forward.keys() == recompute.keys() == {"hidden", "weight"}
    for name in forward:
        assert forward[name].abs().max() > 1e-6
        assert torch.allclose(forward[name], recompute[name], atol=1e-6, rtol=1e-4), name


def test_the_floor_is_three_gemms_at_the_measured_peak():
    peak = json.load(open(os.path.join(ROOT, "benchmarks", "results", "floor.json")))["peaks"]["cpu_fp32"]["flop_per_s"]
    assert head_gradient.floor_seconds((2, 3, 5, 7)) == 3 * 2 * (2 * 3) * 5 * 7 / peak


def test_a_quick_run_writes_both_sides(tmp_path):
    out = tmp_path / "hg.json"
    done = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "head_gradient.py"), "--quick", "--rounds",
                           "1", "--steps", "1", "--idle-wait", "0", "--retries", "0", "--results", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=os.path.join(ROOT, "benchmarks"))
    assert done.returncode == 0, done.stderr[-2000:]
    data = json.loads(out.read_text())
    assert set(data["sides"]) == {"forward", "recompute"} and data["shape"]["vocab"] == 2048
    assert data["speedup"] == data["sides"]["recompute"]["seconds"] / data["sides"]["forward"]["seconds"]
