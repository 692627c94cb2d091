"""Shared fixtures: tiny real models (head_dim 64, so vLLM's CPU backend runs them too)."""
from __future__ import annotations

import os
import sys

import pytest
import torch

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)
ARITHMETIC = os.path.join(ROOT, "examples", "arithmetic")  # the demo: only tests of the example import it
sys.path.insert(0, TESTS)  # the shared helpers (tiny_task, callback_helpers, resume_utils) from any subfolder

import tiny_task as task  # noqa: E402

# One thread per pytest-xdist worker (`make test` runs one per core), two in a plain run; the
# processes a test starts (vllm serve, torchrun ranks, examples) inherit OMP_NUM_THREADS.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
else:
    torch.set_num_threads(2)
# The bf16 cases check correctness, not speed: run them on CPUs without bf16 instructions too
# (their processes inherit it). The refusal itself is tested with this unset.
os.environ.setdefault("LIGHTNING_RLPT_ALLOW_SLOW_BF16", "1")

# Metrics measured in wall-clock seconds (timing/*, throughput/*, step_time) differ from run to
# run; runs compared for equality leave them out.
# Metrics a run-vs-run comparison leaves out: wall-clock ones, and the parity probe's, which each fit
# (a resumed one too) takes at its own first sync (lightning_rlpt/rollout/parity.py).
NOT_COMPARED = ("timing/", "throughput/", "step_time", "sampling/parity_max")


@pytest.fixture(scope="session")
def warm_start_dir() -> str:
    """The demo's shipped warm start (Llama, 2 × 128, the 15-symbol vocabulary of `tiny_task`),
    used as a checkpoint that answers some sums right and some wrong."""
    return os.path.join(ARITHMETIC, "warm_start")


@pytest.fixture(scope="session")
def arithmetic_rows() -> list[dict[str, str]]:
    train, _ = task.split_pairs()
    return task.rows(train[:64])


@pytest.fixture(scope="session")
def held_out_rows() -> list[dict[str, str]]:
    _, held = task.split_pairs()
    return task.rows(held[:32])


def _save(model, tmp_path_factory, name: str) -> str:
    path = str(tmp_path_factory.mktemp(name))
    model.save_pretrained(path)
    task.build_tokenizer().save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def llama_dir(tmp_path_factory) -> str:
    """A randomly initialised tiny Llama saved with the arithmetic tokenizer."""
    return _save(task.build_model(seed=1), tmp_path_factory, "llama")


@pytest.fixture(scope="session")
def qwen2_dir(tmp_path_factory) -> str:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(2)
    config = Qwen2Config(vocab_size=15, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=64, max_position_embeddings=64,
                         bos_token_id=task.BOS_ID, eos_token_id=task.EOS_ID, pad_token_id=task.PAD_ID,
                         tie_word_embeddings=True)
    return _save(Qwen2ForCausalLM(config), tmp_path_factory, "qwen2")


def quiet_trainer(**kwargs):
    """A CPU Trainer without the noise (no progress bar, summary or checkpoints unless asked)."""
    import lightning as L

    defaults = dict(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                    enable_model_summary=False, enable_checkpointing=False, num_sanity_val_steps=0,
                    log_every_n_steps=1)
    return L.Trainer(**{**defaults, **kwargs})


@pytest.fixture
def cluster():
    """``cluster(["trainer0", "rollout0"])`` builds hosts as network namespaces (tests/netns_cluster.py);
    each is torn down by PID and name after the test, also when it fails. Skipped, with the reason,
    where namespaces cannot be made."""
    from netns_cluster import Cluster, sweep
    why = Cluster.unavailable()
    if why:
        pytest.skip(f"multi-host tests need network namespaces: {why}")
    sweep()  # what a killed earlier run left behind
    built: list[Cluster] = []

    def build(hosts, **kwargs) -> Cluster:
        built.append(Cluster(hosts, **kwargs))
        return built[-1]

    yield build
    for c in built:
        c.close()


def pytest_terminal_summary(terminalreporter):
    """After the run: behaviour tests and meta checks (tests/meta: layout, docstrings, docs
    references) counted apart, and the modules past ~400 lines (a report, not a failure)."""
    from package_layout import LONG, long_modules

    outcome_of: dict[str, str] = {}
    for outcome in ("passed", "skipped", "failed", "error"):  # a later (worse) outcome of a test wins
        for report in terminalreporter.stats.get(outcome, []):
            if getattr(report, "nodeid", ""):
                outcome_of[report.nodeid] = outcome
    counts: dict[str, dict[str, int]] = {"behaviour": {}, "meta": {}}
    for nodeid, outcome in outcome_of.items():
        kind = counts["meta" if nodeid.startswith("tests/meta/") else "behaviour"]
        kind[outcome] = kind.get(outcome, 0) + 1
    terminalreporter.section("lightning-rlpt: what was counted")
    for kind, seen in counts.items():
        terminalreporter.write_line(f"{kind:>9} tests: " + (", ".join(f"{n} {o}" for o, n in seen.items()) or "none"))
    long = long_modules()
    if long:
        terminalreporter.write_line(f"modules past {LONG} lines (worth a look; split by concern, not by count): "
                                    + ", ".join(f"{p} ({n})" for p, n in long))
