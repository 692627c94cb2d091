"""The arithmetic of `benchmarks/async_model.py` (the step-time model) and of the cost fit in
`benchmarks/async_costs.py`, on a toy cost table computed by hand. No server, no model."""
from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
import async_costs  # noqa: E402
from async_model import Costs, Workload, compare, step_seconds  # noqa: E402

TOY = Costs(gen_fixed_s=0.5, gen_row_s=0.01, prefill_token_s=0.001, decode_step_s=0.1, decode_token_s=0.002,
            concurrency=8, train_fixed_s=1.0, train_token_s=0.01, logprob_token_s=0.005, reward_s=0.02,
            sync_bytes=1e9, sync_fixed_s=0.3, sync_per_server_s=0.2, sync_bandwidth=1e9)
WORK = Workload(rows=16, prompt=10, completion=20, longest=30, logprob_passes=1)


def test_one_trainer_one_server_sync_and_staleness_1():
    # generation: 16 rows, 8 in flight -> 2 waves of the longest (30) completion:
    # 0.5 + 16*0.01 + 16*10*0.001 + 2*30*0.1 + 16*20*0.002 = 0.5 + 0.16 + 0.16 + 6.0 + 0.64 = 7.46
    # trainer: 1.0 + 16*0.02 + 16*30*(0.01 + 0.005) = 1.0 + 0.32 + 7.2 = 8.52; sync: 0.3 + (0.2 + 1e9/1e9) = 1.5
    sync = step_seconds(TOY, WORK, trainers=1, servers=1, max_staleness=0)
    assert sync == pytest.approx(dict(generation=7.46, trainer=8.52, sync=1.5, step=17.48))
    assert step_seconds(TOY, WORK, 1, 1, 1)["step"] == pytest.approx(max(7.46, 8.52) + 1.5)


def test_two_trainers_two_servers():
    # each server: 8 rows, 8 // 2 = 4 in flight -> still 2 waves: 0.5 + 0.08 + 0.08 + 6.0 + 0.32 = 6.98
    # each trainer: 8 rows, 240 tokens: 1.0 + 0.16 + 3.6 = 4.76; sync to 2 servers: 0.3 + 2*1.2 = 2.7
    assert step_seconds(TOY, WORK, 2, 2, 0) == pytest.approx(dict(generation=6.98, trainer=4.76, sync=2.7, step=14.44))
    assert step_seconds(TOY, WORK, 2, 2, 1)["step"] == pytest.approx(6.98 + 2.7)  # generation is the longer side


def test_shared_cores_bound_what_overlap_buys():
    shared = Costs(**{**TOY.__dict__, "shared_cores": 2, "gen_cores": 1.5, "train_cores": 2, "idle_server_cores": 0.25})
    # 2 servers generating: 2 * 6.98 * 1.5 = 20.94 CPU-s on 2 cores -> 10.47 s (not 6.98)
    # synchronous: the trainer (2 cores) beside 2 idle servers (0.25 each): 8.52 * 2.5 / 2 = 10.65
    assert step_seconds(shared, WORK, 1, 2, 0) == pytest.approx(dict(generation=10.47, trainer=10.65, sync=2.7,
                                                                     step=10.47 + 10.65 + 2.7))
    # staleness 1: the overlap takes (20.94 + 8.52 * 2) / 2 = 18.99 s, more than either side alone
    assert step_seconds(shared, WORK, 1, 2, 1)["step"] == pytest.approx(18.99 + 2.7)


def test_refuses_what_it_does_not_model():
    with pytest.raises(ValueError, match=r"max_staleness 0 .* and 1 \(got 2\)"):
        step_seconds(TOY, WORK, 1, 1, 2)
    with pytest.raises(ValueError, match=r"at least one trainer and one server \(got trainers=1, servers=0\)"):
        step_seconds(TOY, WORK, 1, 0, 0)


def test_generation_fit_recovers_known_costs():
    truth = dict(gen_fixed_s=0.05, gen_row_s=0.002, prefill_token_s=1e-4, decode_step_s=0.02, decode_token_s=5e-4)
    points = [dict(rows=r, prompt=p, completion=c, cores=1.0,
                   wall_s=sum(t * x for t, x in zip(truth.values(), async_costs.gen_design(r, p, c, 64))))
              for r, p, c in async_costs.GRID]
    fitted = async_costs.fit_generation(points, concurrency=64)
    assert {k: fitted[k] for k in truth} == pytest.approx(truth, rel=1e-6)
    assert fitted["gen_fit_rel_err_median"] < 1e-9


def test_compare_takes_medians_after_warmup_and_reports_skipped_configurations():
    step = dict(rows=16, prompt_tokens=160, completion_tokens=320, longest=30, timing={}, policy_version=1, version=0)
    run = lambda seconds: dict(servers=1, max_staleness=0, steps=[dict(step, seconds=s) for s in seconds])  # noqa: E731
    costs = {**TOY.__dict__, "shared_cores": None, "sync_bandwidth": 1e9}
    rows = compare(costs, [run([99, 99, 17.0, 18.0, 19.0]), run([99, 99, 20.0]),
                           dict(servers=1, max_staleness=1, skipped="no max_staleness")], warmup=2)
    assert rows[0]["per_run"] == [18.0, 20.0] and rows[0]["measured"] == 19.0
    assert rows[0]["predicted"]["step"] == pytest.approx(17.48) and rows[0]["error"] == pytest.approx(17.48 / 19 - 1)
    assert rows[0]["lag"] == 0 and rows[1] == dict(servers=1, max_staleness=1, skipped="no max_staleness")
