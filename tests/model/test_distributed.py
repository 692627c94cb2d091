"""Two CPU processes (gloo) under DDP and FSDP2 train exactly like one process on the same
prompts: same logged metrics at every step, same weights, ranks in sync."""
import csv
import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT, TESTS, NOT_COMPARED
import torch

SCRIPT = os.path.join(TESTS, "scripts", "distributed_fit.py")


def _run(strategy: str, out, *extra: str) -> tuple[list[dict[str, float]], dict[str, torch.Tensor]]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("LOCAL_RANK", None)
    proc = subprocess.run([sys.executable, SCRIPT, "--strategy", strategy, "--out", str(out), *extra], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = []
    for path in sorted(out.glob("**/metrics.csv")):
        with open(path) as f:
            rows += [{k: float(v) for k, v in r.items() if v != "" and not k.startswith(NOT_COMPARED)}
                     for r in csv.DictReader(f)]
    if strategy != "single":
        w0, w1 = (torch.load(out / f"weights_rank{r}.pt") for r in (0, 1))
        assert all(torch.equal(w0[k], w1[k]) for k in w0), "ranks hold different weights"
    return rows, torch.load(out / "weights.pt")


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    return _run("single", tmp_path_factory.mktemp("single"))


@pytest.fixture(scope="module")
def single_forward(tmp_path_factory):
    """One process with the head's gradient formed in the forward pass (the DDP runs' reference)."""
    return _run("single", tmp_path_factory.mktemp("single_forward"), *FORWARD)


# DDP runs the forward-pass head path on both sides; FSDP2 recomputes (tests/scripts/distributed_fit.py).
FORWARD = ("--head-gradient", "forward")


def _reference(strategy, single, single_forward):
    return single_forward if strategy == "ddp" else single


def _head(strategy):
    return FORWARD if strategy == "ddp" else ()


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp2"])
def test_two_processes_match_one(strategy, single, single_forward, tmp_path):
    rows, weights = _run(strategy, tmp_path, *_head(strategy))
    ref_rows, ref_weights = _reference(strategy, single, single_forward)
    assert len(rows) == len(ref_rows) == 3
    for step, (a, b) in enumerate(zip(ref_rows, rows)):
        assert a.keys() == b.keys()
        for key in a:
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), f"step {step} {key}: {a[key]} vs {b[key]}"
    for key in ref_weights:
        assert torch.allclose(weights[key], ref_weights[key], atol=1e-5), key


@pytest.mark.slow
@pytest.mark.parametrize("strategy,cap", [("ddp", ("--micro-batch-size", "4")), ("fsdp2", ("--max-tokens", "48")),
                                          ("fsdp2", ("--max-tokens", "48", "--padding-free"))],
                         ids=["ddp-rows", "fsdp2-tokens", "fsdp2-tokens-padding-free"])
def test_two_processes_with_micro_batches_match_one_pass_on_one(strategy, cap, single, single_forward, tmp_path):
    """Micro-batches of 4 rows (DDP: gradients all-reduced once, on the last) or of 48 tokens
    (FSDP2: ranks may cut their rows into different counts and still run as many forwards;
    packed: the sharded root forward keeps the packed row's logits at completion positions)
    train like one process running each step in one pass."""
    rows, weights = _run(strategy, tmp_path, *cap, *_head(strategy))
    ref_rows, ref_weights = _reference(strategy, single, single_forward)
    for step, (a, b) in enumerate(zip(ref_rows, rows)):
        for key in a:
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), f"step {step} {key}: {a[key]} vs {b[key]}"
    for key in ref_weights:
        if "--padding-free" not in cap:
            assert torch.allclose(weights[key], ref_weights[key], atol=1e-5), key
            continue
        # Packed rows attend within one long row under a block-diagonal mask, so the gradients differ from
        # the padded run's by float32 noise. AdamW's first update, lr * g / (|g| + eps), turns that noise
        # into up to ±lr on an element whose gradient is near zero (4 of lm_head's 1,920 once moved 1.3e-4
        # apart, every other weight within 7e-6): a few such elements, each within 2 lr per step (lr 1e-4).
        far = (weights[key] - ref_weights[key]).abs()
        assert (far > 1e-5).float().mean() < 0.005 and far.max() < 3 * 2e-4, (key, far.max(), (far > 1e-5).sum())


@pytest.mark.slow
@pytest.mark.parametrize("strategy,cap", [("ddp", ("--micro-batch-size", "4")), ("fsdp2", ())])
def test_top_entropy_threshold_spans_both_ranks(strategy, cap, tmp_path):
    """``top_entropy_quantile``: the threshold is a quantile over every rank's tokens, so two ranks
    (DDP micro-batched: the entropy pre-pass; FSDP2 in one pass: the loss forward's) train like
    one process holding the whole mini-batch."""
    flag = ("--top-entropy-quantile", "0.3")
    ref_rows, ref_weights = _run("single", tmp_path / "single", *flag)
    rows, weights = _run(strategy, tmp_path / strategy, *flag, *cap)
    assert len(rows) == len(ref_rows) == 3
    for step, (a, b) in enumerate(zip(ref_rows, rows)):
        assert 0 < a["top_entropy/kept_fraction"] < 0.5 and a.keys() == b.keys()
        for key in a:
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), f"step {step} {key}: {a[key]} vs {b[key]}"
    for key in ref_weights:
        assert torch.allclose(weights[key], ref_weights[key], atol=1e-5), key


@pytest.mark.slow
def test_fsdp2_sharded_checkpoint_resumes_exactly(tmp_path):
    straight = _run("fsdp2", tmp_path / "straight", "--steps", "4")
    resumed = _run("fsdp2", tmp_path / "resumed", "--steps", "4", "--resume-at", "2")
    assert list((tmp_path / "resumed" / "ckpt.ckpt").glob("*.distcp")), "expected a sharded (DCP) checkpoint"
    assert [r["step"] for r in straight[0]] == [r["step"] for r in resumed[0]] == [0, 1, 2, 3]
    for a, b in zip(straight[0], resumed[0]):
        assert a == pytest.approx(b, rel=1e-6, abs=1e-7)
    assert all(torch.allclose(straight[1][k], resumed[1][k], atol=1e-6) for k in straight[1])


@pytest.mark.slow
def test_fsdp2_with_vllm_rollouts_keeps_ranks_in_sync(tmp_path):
    """One in-process vLLM engine per rank, fed full weights gathered from the FSDP2 shards."""
    rows, weights = _run("fsdp2", tmp_path, "--engine", "vllm")  # _run checks both ranks hold equal weights
    assert len(rows) == 3
    for row in rows:  # synced every step: the engine samples what the learner scores
        assert row["sampling/importance_sampling_ratio/mean"] == pytest.approx(1.0, abs=1e-3)
        assert row["sampling/logp_diff/max"] < 1e-3
    from safetensors.torch import load_file
    start = load_file(os.path.join(ROOT, "examples", "arithmetic", "warm_start",
                                   "model.safetensors"))
    assert any(not torch.equal(start[k], weights[k]) for k in start), "training did not move the weights"


def _streams(out) -> list[dict]:
    return [json.load(open(out / f"streams_rank{r}.json")) for r in (0, 1)]


@pytest.mark.slow
def test_ddp_ranks_draw_their_own_noise_and_refills_and_resume_them_exactly(tmp_path):
    """Reward dithering and dynamic-filtering refills under DDP: each rank its own stream, the
    streams reproducible, and a run resumed from a checkpoint draws what the straight run drew."""
    _run("ddp", tmp_path / "straight", "--streams", "--steps", "3")
    _run("ddp", tmp_path / "resumed", "--streams", "--steps", "3", "--resume-at", "1")
    straight, resumed = _streams(tmp_path / "straight"), _streams(tmp_path / "resumed")
    assert straight == resumed  # per rank: the same prompts rolled out and the same noise, step by step
    r0, r1 = straight
    assert len(r0["noise"]) == len(r1["noise"]) == 3
    for (step, a), (_, b) in zip(r0["noise"], r1["noise"]):
        assert a != b, f"step {step}: both ranks drew the same dithering noise"
    refills = 0
    for (s0, rows0), (s1, rows1) in zip(r0["rollouts"], r1["rollouts"]):
        assert s0 == s1 and not set(rows0) & set(rows1), f"step {s0}: the ranks rolled out the same prompts"
        refills += 1
    assert refills > 3, "no refill happened: the test would not check the refill stream"


@pytest.fixture(scope="module")
def prefers_seven(tmp_path_factory) -> str:
    from reward_models import build_prefers_seven, save
    return save(build_prefers_seven(), tmp_path_factory.mktemp("prefers_seven"))


@pytest.fixture(scope="module")
def single_with_reward_model(prefers_seven, tmp_path_factory):
    out = tmp_path_factory.mktemp("single_rm")
    return _run("single", out, "--reward-model", prefers_seven), json.load(open(out / "reward_model_rank0.json"))


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp2"])
def test_reward_model_is_a_full_frozen_copy_on_each_rank(strategy, prefers_seven, single_with_reward_model, tmp_path):
    """A reward model in ``reward_funcs`` under DDP / FSDP2: each rank scores with its own whole,
    frozen copy (never sharded, never in the module's state), and two ranks train like one
    process on the same prompts."""
    one, whole = single_with_reward_model
    two = _run(strategy, tmp_path / strategy, "--reward-model", prefers_seven)
    assert len(one[0]) == len(two[0]) == 3
    for step, (a, b) in enumerate(zip(one[0], two[0])):
        assert a.keys() == b.keys() and f"rewards/{os.path.basename(prefers_seven)}/mean" in a
        for key in a:
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), f"step {step} {key}: {a[key]} vs {b[key]}"
    for key in one[1]:
        assert torch.allclose(two[1][key], one[1][key], atol=1e-5), key
    facts = [json.load(open(tmp_path / strategy / f"reward_model_rank{r}.json")) for r in (0, 1)]
    for f in facts:
        assert f == whole  # the same parameters, every one of them, as the single process holds
        assert f["devices"] == [f["module_device"]] and not f["dtensor"] and not f["trainable"]
        assert not f["in_state_dict"]


@pytest.mark.slow
def test_ddp_with_vllm_server_rank_zero_launches_and_sends_every_rank_samples(tmp_path):
    """`VLLMServerRollout(launch=...)` under DDP with a LoRA policy: rank 0 alone starts the
    server and loads each step's adapter on it (once per sync, not once per rank); rank 1 learns
    the adapter's name from rank 0 and samples its own rows from the same server, from the
    synced weights (importance ratio 1), and the ranks stay in sync."""
    rows, _ = _run("ddp", tmp_path, "--engine", "server", "--lora")
    assert len(rows) == 3
    for row in rows:
        assert row["sampling/importance_sampling_ratio/mean"] == pytest.approx(1.0, abs=1e-3)
        assert row["sampling/logp_diff/max"] < 1e-3
    ranks = [json.load(open(tmp_path / f"server_rank{r}.json")) for r in (0, 1)]
    expected = [[v, f"policy-v{v}"] for v in range(3)]  # version of each rollout, adapter its requests named
    assert [[v, m] for v, m, _ in ranks[0]] == [[v, m] for v, m, _ in ranks[1]] == expected
    assert {n for _, _, n in ranks[0]} == {1} and {n for _, _, n in ranks[1]} == {0}  # only rank 0 owns a server
    (log,) = os.listdir(tmp_path / "vllm")  # one server started, by rank 0
    text = open(tmp_path / "vllm" / log).read()
    assert text.count('"POST /v1/load_lora_adapter HTTP/1.1" 200') == 4  # fit start + 3 steps, from one rank
    assert text.count('"POST /v1/completions HTTP/1.1" 200') > 2 * 3 * 8  # both ranks' rows (plus probes)


def test_vllm_server_rollout_refuses_sharded_multi_process_trainers():
    from lightning.pytorch.strategies import DDPStrategy, ModelParallelStrategy
    from lightning_rlpt.rollout.vllm.ranks import check_strategy

    with pytest.raises(ValueError, match=r"with 2 trainer processes only under DDP .*ModelParallelStrategy shards "
                                         r"them.*Use strategy='ddp', or one trainer process \(devices=1\)"):
        check_strategy(ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1), 2)
    check_strategy(DDPStrategy(), 2)
    check_strategy(ModelParallelStrategy(), 1)


def _lead_then_share_worker(rank: int, port: int, out: str) -> None:
    import torch.distributed as dist
    from lightning_rlpt.rollout.ranks import lead_then_share

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    calls = []
    result = lead_then_share(lambda: calls.append(rank) or ["http://a", "http://b"], "launching")
    try:
        lead_then_share(lambda: 1 / 0, "the weight sync of step 4")
        error = None
    except BaseException as err:  # noqa: BLE001 - recorded for the test
        error = f"{type(err).__name__}: {err}"
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"calls": calls, "result": result, "error": error}, f)
    dist.destroy_process_group()


def test_lead_then_share_runs_on_rank_zero_and_shares_its_result_or_error(tmp_path):
    """Two gloo processes: the action runs once (rank 0), both get its result; when it fails,
    rank 0 raises its own error and rank 1 an error naming it, neither blocks."""
    import torch.multiprocessing as mp
    from lightning_rlpt.rollout.vllm.server import free_port

    mp.start_processes(_lead_then_share_worker, args=(free_port(), str(tmp_path)), nprocs=2, start_method="spawn",
                       join=True)
    r0, r1 = (json.load(open(tmp_path / f"rank{r}.json")) for r in (0, 1))
    assert (r0["calls"], r1["calls"]) == ([0], [])
    assert r0["result"] == r1["result"] == ["http://a", "http://b"]
    assert r0["error"] == "ZeroDivisionError: division by zero"
    assert r1["error"] == ("RuntimeError: rank 0 failed the weight sync of step 4, so rank 1 stops too: "
                           "ZeroDivisionError: division by zero")


@pytest.mark.slow
def test_ddp_episode_metrics_are_means_over_both_ranks(tmp_path):
    """tools/call_frequency, tools/failure_frequency, turns/mean, turns/max and
    completions/model_token_fraction under DDP are those of every rank's episodes together (the
    counts gathered before dividing), worked out here from what each rank rolled out."""
    rows, _ = _run("ddp", tmp_path, "--episodes")
    r0, r1 = (s["episodes"] for s in _streams(tmp_path))
    assert len(rows) == len(r0) == len(r1) == 3
    local_differs = False
    for row, a, b in zip(rows, r0, r1):
        calls, failures, turns = a["tool_calls"] + b["tool_calls"], a["tool_failures"] + b["tool_failures"], a["turns"] + b["turns"]
        expected = {"tools/call_frequency": sum(calls) / len(calls),
                    "tools/failure_frequency": sum(failures) / sum(calls) if sum(calls) else 0.0,
                    "turns/mean": sum(turns) / len(turns), "turns/max": max(turns),
                    "completions/model_token_fraction": (sum(a["model_tokens"]) + sum(b["model_tokens"]))
                    / (sum(a["episode_tokens"]) + sum(b["episode_tokens"]))}
        for key, value in expected.items():
            assert row[key] == pytest.approx(value, rel=1e-6), f"step {a['step']} {key}: {row[key]} vs {value}"
        local_differs |= sum(a["tool_calls"]) / len(a["tool_calls"]) != expected["tools/call_frequency"]
    assert local_differs, "rank 0's own rows gave the global values: the test would not see a missing gather"
