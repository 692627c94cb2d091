"""`CollectiveWatchdog`'s refusals at start (a multi-node run whose MASTER_ADDR is loopback, a
timeout that is no time) and its report. The hangs it bounds are tested across hosts in
tests/multinode/test_multinode_faults.py (a frozen node, a cut link)."""
import time

import pytest

from lightning_rlpt.callbacks import CollectiveWatchdog
from lightning_rlpt.callbacks.collective_watchdog import check_master_address


@pytest.mark.parametrize("address", ["127.0.0.1", "localhost", "127.0.1.1", "::1"])
def test_a_loopback_master_address_is_refused_on_a_multi_node_run(address):
    with pytest.raises(ValueError, match=rf"MASTER_ADDR={address} resolves to the loopback address .* but this run "
                                         r"has 2 nodes: .*Set MASTER_ADDR \(torchrun --master-addr\) to node 0's"):
        check_master_address(2, address)
    check_master_address(1, address)  # one node: loopback is right


def test_a_routable_master_address_passes_and_an_unknown_one_is_named():
    check_master_address(2, "10.0.0.10")
    with pytest.raises(ValueError, match="MASTER_ADDR=no-such-host.invalid does not resolve"):
        check_master_address(2, "no-such-host.invalid")


def test_a_timeout_must_be_positive():
    with pytest.raises(ValueError, match="timeout must be > 0 seconds"):
        CollectiveWatchdog(timeout=0)


def test_the_report_names_silent_and_late_ranks_with_their_hosts():
    dog = CollectiveWatchdog(timeout=20, beat=1.0)
    now = time.monotonic()
    dog.rank, dog.world, dog.step, dog.started, dog.since, dog.applied = 0, 3, 7, now - 12, now - 12, 20.0
    dog.me = {"host": "h0", "address": "10.0.0.1"}
    dog.peers = {1: {"info": {"host": "h1", "address": "10.0.0.2", "step": 7, "beat": 1.0}, "changed": now - 9},
                 2: {"info": {"host": "h2", "address": "10.0.0.3", "step": 6, "beat": 2.0}, "changed": now - 0.5}}
    dog.trainer = type("T", (), {"checkpoint_callbacks": []})()
    assert dog.describe(now) == (
        "CollectiveWatchdog: rank 0 (h0 10.0.0.1) at global step 7, waiting 12 s: rank 1 (h1 10.0.0.2) silent for "
        "9 s (last heard at step 7); rank 2 (h2 10.0.0.3) alive but at step 6. Collective timeout 20 s. "
        "Last checkpoint: none saved by this run")


def test_a_wait_after_the_step_is_watched_too_but_never_ends_the_process(caplog, monkeypatch):
    """Between steps the checkpoint callbacks wait in a barrier: a peer lost there is named while
    waiting (a cut link seen in a test ended the run with no warning), but a long wait with every
    peer answering (a save, a validation) is no fault and says nothing. The exit at twice the
    timeout stays inside a step: a validation after it may lawfully run longer."""
    import logging
    import os

    dog = CollectiveWatchdog(timeout=20, beat=1.0)
    trainer = type("T", (), {"checkpoint_callbacks": [], "global_step": 3})()
    dog.rank, dog.world, dog.applied, dog.slowest, dog.trainer = 0, 2, 20.0, 1.0, trainer
    dog.on_train_batch_start(trainer)
    dog.on_train_batch_end(trainer)
    now = time.monotonic()
    dog.since = now - 50  # 50 s since the step ended: more than twice the timeout
    answering = {"info": {"host": "h1", "address": "10.0.0.2", "step": 3, "beat": 1.0}, "changed": now - 0.5}
    dog.peers = {1: answering}
    monkeypatch.setattr(os, "_exit", lambda code: pytest.fail(f"the process was ended (exit {code})"))
    monkeypatch.setattr(logging, "shutdown", lambda: None)  # the exit path's, which would close every handler
    with caplog.at_level("WARNING"):
        dog._watch(now)
    assert caplog.text == ""  # every peer answers: a long save, not a lost peer
    dog.peers = {1: {**answering, "changed": now - 50}}
    with caplog.at_level("WARNING"):
        dog._watch(now)
    assert "at global step 3, waiting 50 s since the step ended: rank 1 (h1 10.0.0.2) silent for 50 s" in caplog.text
    dog.on_train_batch_start(trainer)
    dog.started = dog.since = now - 50  # the same wait inside a step ends the process
    with pytest.raises(pytest.fail.Exception, match="exit 3"):
        dog._watch(now)


def test_the_first_step_keeps_the_strategys_timeout_and_an_exception_ends_the_watch(monkeypatch):
    """Before the first step ends there is no step to scale from: start-up and the first step keep
    the strategy's timeout (the default path applies one only at a step's end). And after an
    exception, which Lightning follows with no teardown, the watch stops."""
    dog = CollectiveWatchdog(beat=1.0)  # timeout=None: 10 x the slowest step, at least min_timeout
    applied = []
    monkeypatch.setattr(dog, "_apply", applied.append)
    trainer = type("T", (), {"checkpoint_callbacks": [], "global_step": 0})()
    dog._thread, dog.trainer = object(), trainer  # as if setup had started the watch
    dog.on_validation_batch_start()
    dog.on_train_batch_start(trainer)
    assert applied == []
    dog.on_train_batch_end(trainer)
    assert applied == [300.0]  # min_timeout, once a step has been measured
    dog.on_exception(trainer, None, RuntimeError("gloo: Timed out waiting"))
    assert dog._stop.is_set()


def test_the_first_beat_is_written_at_once():
    """A rank writes its heartbeat when its watch starts, not a ``beat`` later: a peer lost in a
    fit's first seconds is then named with its host (CI met "rank 1 silent (never heard)" when
    the link was cut one second into a fit). A real TCPStore on loopback stands for node 0's."""
    import json
    import threading
    from datetime import timedelta

    from torch.distributed import TCPStore

    from lightning_rlpt.callbacks.collective_watchdog import KEY

    master = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))
    dog = CollectiveWatchdog(timeout=20, beat=30.0)  # a next beat far away: only the first can land in time
    dog.rank, dog.world, dog.master = 1, 2, ("127.0.0.1", master.port)
    dog.me = {"host": "h1", "address": "10.0.0.2"}
    thread = threading.Thread(target=dog._beat, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not master.check([KEY.format(1)]):
            assert time.monotonic() < deadline, "no beat within 10 s"
            time.sleep(0.05)
        assert json.loads(master.get(KEY.format(1)))["host"] == "h1"
    finally:
        dog._stop.set()
        thread.join(timeout=10)


def test_a_slurm_job_whose_tasks_are_not_the_trainers_processes_is_refused(monkeypatch):
    from lightning_rlpt.callbacks.collective_watchdog import check_slurm_allocation

    monkeypatch.setenv("SLURM_NTASKS", "2")
    monkeypatch.setenv("SLURM_NNODES", "1")
    monkeypatch.setenv("SLURM_NTASKS_PER_NODE", "2")
    monkeypatch.setenv("SLURM_JOB_NAME", "wrap")
    check_slurm_allocation(2, 1, 2)
    with pytest.raises(ValueError, match=r"SLURM started 2 tasks .* the Trainer runs 1 process\(es\) \(num_nodes=1, "
                                         r"devices=1\): each task would train alone\. Set num_nodes=1 and devices=2"):
        check_slurm_allocation(1, 1, 1)
    monkeypatch.setenv("SLURM_JOB_NAME", "interactive")  # Lightning's opt-out of SLURM: not checked
    check_slurm_allocation(1, 1, 1)
