"""`benchmarks/gpu_check.py --dry-run`: the GPU check's own code at tiny shapes on CPU, so the
script cannot rot between the sessions that have a GPU. Every part reports (ok / skipped with the
reason), the short table comes last, the JSON and Markdown are written; a part that fails or
hangs is reported as such and the parts after it still run."""
import json
import os
import subprocess
import sys

import pytest
import torch
from conftest import ROOT

SCRIPT = os.path.join(ROOT, "benchmarks", "gpu_check.py")
# VLLMRollout's own tests cover the colocated engine; vLLM's CPU start-up alone takes 35-47 s.
SKIPPED_HERE = "smoke_vllm"


def _run(results, *args, timeout=900):
    proc = subprocess.run([sys.executable, SCRIPT, "--dry-run", "--results", str(results), *args],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    with open(results / "gpu_check.json") as f:
        data = json.load(f)
    return proc, data, {p["part"]: p for p in data["parts"]}


def _table(stdout: str) -> list[str]:
    """The rows of the table printed last (the script's final lines)."""
    lines = stdout.strip().splitlines()
    start = max(i for i, line in enumerate(lines) if line.startswith("| part | status |"))
    assert all(line.startswith("|") for line in lines[start:]), "the table must be the last thing printed"
    return lines[start + 2:]


def _cases(part):
    return [r for r in part["records"] if "case" in r and "error" not in r and "skipped" not in r]


@pytest.mark.slow
def test_dry_run_runs_every_part_and_writes_the_report(tmp_path):
    proc, data, parts = _run(tmp_path, "--skip", SKIPPED_HERE, "--budget", "800")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    expected = ["kernel_accuracy", "kernel_speed", "grpo_ours", "grpo_trl", "smoke_demo", "smoke_lora_bf16_kl",
                "smoke_micro_one_pass", "smoke_fsdp2"]
    assert list(parts) == expected
    rows = _table(proc.stdout)
    assert [r.split("|")[1].strip() for r in rows] == expected
    for name, part in parts.items():
        assert part["status"] in ("ok", "skipped"), (name, part.get("reason"), part.get("log_tail"))
        if part["status"] == "skipped":  # only an optional peer may be missing, and the line says how to add it
            assert "not installed" in part["reason"] and "pip install" in part["reason"], part["reason"]
    assert data["dry_run"] and "perf_counter" in data["timer"]

    accuracy = _cases(parts["kernel_accuracy"])
    fused = [r for r in accuracy if r["candidate"].startswith("fused:")]
    assert {r["candidate"] for r in accuracy} >= {"plain"} and fused
    for r in fused:  # fp32: the op's arithmetic against fp64; bf16: gradients are returned in bf16
        bound = 1e-4 if r["dtype"] == "float32" else 1e-2
        assert max(r["logp"], r["entropy"], r["d_hidden"], r["d_weight"]) < bound, r
    speed = _cases(parts["kernel_speed"])
    assert {r["candidate"] for r in speed} >= {"plain"} | {r["candidate"] for r in fused}
    assert all(r["ms"] > 0 and len(r["times_ms"]) >= 2 and r["extra_mb"] is None for r in speed)
    (ours,) = _cases(parts["grpo_ours"])
    assert ours["median_step_s"] > 0 and ours["tokens_per_step"] > 0 and ours["steps"] == 2
    (demo,) = _cases(parts["smoke_demo"])
    assert 0 <= demo["before"] <= 1 and 0 <= demo["after"] <= 1
    (micro,) = _cases(parts["smoke_micro_one_pass"])
    assert micro["equal"] and micro["rel"] <= micro["tolerance"]
    (fsdp,) = _cases(parts["smoke_fsdp2"])
    assert fsdp["dtensor_params"] > 0 and fsdp["steps"] == 2

    markdown = (tmp_path / "gpu_check.md").read_text()
    for name in expected:
        assert f"## {name}:" in markdown
    assert "| fwd+bwd (ms, median) |" in markdown and "| log-probs | entropy | d hidden | d weight |" in markdown


def test_a_failing_and_a_hanging_part_are_reported_and_the_next_part_runs(tmp_path):
    proc, data, parts = _run(tmp_path, "--parts", "smoke_demo,smoke_fsdp2,kernel_accuracy", "--inject",
                             "smoke_demo=fail", "--inject", "smoke_fsdp2=hang", "--timeout", "smoke_fsdp2=3",
                             timeout=300)
    assert proc.returncode == 1  # not every part passed
    assert parts["smoke_demo"]["status"] == "failed"
    assert "RuntimeError: injected failure" in parts["smoke_demo"]["reason"]
    assert parts["smoke_fsdp2"]["status"] == "timeout" and "stopped after 3 s" in parts["smoke_fsdp2"]["reason"]
    assert parts["smoke_fsdp2"]["seconds"] < 30
    assert parts["kernel_accuracy"]["status"] == "ok" and _cases(parts["kernel_accuracy"])
    rows = {r.split("|")[1].strip(): r for r in _table(proc.stdout)}
    assert "**FAILED**" in rows["smoke_demo"] and "injected failure" in rows["smoke_demo"]
    assert "**TIMEOUT**" in rows["smoke_fsdp2"] and "| ok |" in rows["kernel_accuracy"]
    assert "log tail" in (tmp_path / "gpu_check.md").read_text()


def test_bad_arguments_are_refused_before_any_part_runs(tmp_path):
    proc = subprocess.run([sys.executable, SCRIPT, "--dry-run", "--parts", "kernel_acuracy", "--results",
                           str(tmp_path)], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 2 and "unknown part(s) ['kernel_acuracy']" in proc.stderr
    assert "kernel_accuracy" in proc.stderr.split("the parts are:")[1]  # the valid names are listed
    assert not (tmp_path / "gpu_check.json").exists()
    proc = subprocess.run([sys.executable, SCRIPT, "--inject", "kernel_speed=explode", "--dry-run"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 2 and "PART=fail or PART=hang" in proc.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA machine runs the real check")
def test_without_cuda_the_real_check_says_to_use_a_gpu_or_dry_run(tmp_path):
    proc = subprocess.run([sys.executable, SCRIPT, "--results", str(tmp_path)], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert proc.returncode == 1 and "no CUDA device" in proc.stderr and "--dry-run" in proc.stderr
    assert not (tmp_path / "gpu_check.json").exists()


def _gpu_like_results() -> dict:
    """Records shaped like a CUDA run's (memory measured, Liger present, the op's choice named)."""
    speed = [dict(case=c, candidate=c, n=16384, h=4096, v=128256, dtype="bfloat16", ms=ms, times_ms=[ms, ms],
                  first_ms=ms * 3, extra_mb=mb) for c, ms, mb in
             (("plain", 40.0, 30000.0), ("fused:triton", 20.0, 1500.0), ("liger", 25.0, 1000.0))]
    speed[1]["chosen"] = "forward triton, backward triton"
    accuracy = [dict(case="liger", candidate="liger", n=2048, h=896, v=151936, dtype="float32", logp=1e-7,
                     entropy=None, d_hidden=2e-7, d_weight=3e-7, grad_through="log-probs"),
                dict(case="f", candidate="fused:triton", n=2048, h=896, v=151936, dtype="float32", logp=1e-7,
                     entropy=4e-7, d_hidden=5e-7, d_weight=6e-7, grad_through="log-probs and entropy")]
    side = dict(steps=4, median_step_s=2.0, rollout_s=1.0, tokens_per_step=4096, startup_s=9.0, peak_gpu_mb=9000.0,
                shape=dict(layers=24, hidden=896, vocab=151936), prompts=16, group=8, max_new_tokens=32)
    part = lambda name, records, status="ok", **kw: dict(part=name, what=name, status=status, seconds=1.0,  # noqa: E731
                                                        records=records, **kw)
    return dict(date="d", device="NVIDIA H200", dry_run=False, versions={"torch": "2.11"}, timer="CUDA events",
                budget_s=450, parts=[part("kernel_accuracy", accuracy), part("kernel_speed", speed),
                                     part("grpo_ours", [dict(side, case="lightning-rlpt (HF generate)")]),
                                     part("grpo_trl", [dict(side, case="TRL GRPOTrainer (generate)", median_step_s=3.0)]),
                                     part("smoke_fsdp2", [], "timeout", reason="stopped after 40 s (0 records kept)",
                                          log_tail="...")])


def test_the_report_renders_what_a_gpu_run_records():
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    from gpu_check_parts.report import markdown, table
    data = _gpu_like_results()
    rows = {r.split("|")[1].strip(): r for r in _table(table(data))}
    assert "fused:triton 20.0 ms/1.46 GiB" in rows["kernel_speed"] and "liger 25.0 ms/0.98 GiB" in rows["kernel_speed"]
    assert "plain 40.0 ms/29.30 GiB" in rows["kernel_speed"]
    assert "1.50× TRL's speed" in rows["grpo_trl"]  # TRL 3.0 s/step, ours 2.0
    assert "**TIMEOUT**" in rows["smoke_fsdp2"] and "stopped after 40 s" in rows["smoke_fsdp2"]
    md = markdown(data)
    assert "| 16384 × 4096 × 128256 | bfloat16 | fused:triton (chose forward triton, backward triton) | 20.00 | 0.50 | " \
           "1500 | 0.050 |" in md
    assert "| 896 × 151936 | 2048 | float32 | liger | 1.0e-07 | — | 2.0e-07 | 3.0e-07 | log-probs |" in md
    assert "| TRL GRPOTrainer (generate) | 4 | 3.000 | 1.00 |" in md and "| 2.000 | 1.50 |" in md
