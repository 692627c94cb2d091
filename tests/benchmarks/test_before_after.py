"""`benchmarks/step_before_after.py` and `parts_before_after.py` render what their JSON holds: the
floor at the higher of the peaks measured in the same invocation (a slow reading would lengthen
the floor and flatter the ratios), each side's ratios to it, and medians and paired ratios by hand."""
from __future__ import annotations

import os
import sys

import pytest
from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import floor  # noqa: E402
import parts_before_after  # noqa: E402
import step_before_after  # noqa: E402


def _side(step, rollout, rest):
    return {"runs": [dict(step=step, rollout=rollout, sync=0.0, rest=rest, peak_rss_mb=100.0)]}


def test_the_floor_is_the_reference_step_at_the_higher_peak_and_the_ratios_divide_by_it():
    result = dict(before_commit="abc1234", fp32_peak_gflops=[50.0, 100.0],
                  engines={"hf": {"before": _side(8.0, 3.0, 5.0), "after": _side(4.0, 2.0, 2.0)}})
    flops = floor.floor_flops(floor.reference_step())
    floors = step_before_after.floors(result)
    assert floors == pytest.approx({k: flops[k] / 100e9 for k in ("step", "rollout", "update")})
    rows = step_before_after.table(result).splitlines()[2:]
    assert rows[0] == (f"| HF engine | before (abc1234) | 8.00 | 8.00–8.00 | {8.0 / floors['step']:.1f}× | 3.00 | "
                       f"{3.0 / floors['rollout']:.1f}× | 5.00 | {5.0 / floors['update']:.1f}× | 100 |")
    assert rows[1].startswith("| HF engine | after | 4.00 | 4.00–4.00 | ")


def test_the_parts_table_gives_medians_and_the_range_of_paired_ratios():
    result = {"parts": {"AdamW": {"before_s": [0.010, 0.012, 0.030], "after_s": [0.005, 0.004, 0.010]}}}
    row = parts_before_after.table(result).splitlines()[2]
    # medians 12 and 5 ms; paired ratios 2, 3, 3
    assert row == "| AdamW | 12.0 | 5.0 | 7.0 | 2.00–3.00 |"
