"""docs/distributed.md's SLURM block on a real SLURM (tests/slurm_cluster.py: munged, slurmctld
and one slurmd on this machine, started by the test): ``sbatch`` with 2 tasks, Lightning's
``SLURMEnvironment`` places the ranks; SIGUSR1 (what SLURM sends before the time limit with
``--signal=USR1@90``) saves the HPC checkpoint at the end of the step it lands in and requeues the job, and the
requeued job resumes from it exactly (every step's metrics equal a straight run's); ``--devices``
that does not match the allocation is refused at start with the fix (`CollectiveWatchdog`: with
one device per node Lightning's own check does not run, and each task would train alone). Skipped, with the
reason, where SLURM is not installed or the test is not root."""
import glob
import os
import re
import subprocess
import time

import pytest
from conftest import ROOT
from slurm_cluster import SlurmCluster

from multinode_recipes import SCRIPT, VENV, env_for, metrics, recipe

BLOCK = "tests/multinode/test_slurm.py runs this block"
STEPS = "8"
TIMEOUT = 420  # seconds for a job (about 30 s when the machine is idle)


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    why = SlurmCluster.unavailable()
    if why:
        pytest.skip(why)
    with SlurmCluster(str(tmp_path_factory.mktemp("slurm"))) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def straight(slurm, tmp_path_factory):
    """One job run straight through: its output directory."""
    out = tmp_path_factory.mktemp("straight")
    job = _submit(slurm, out)
    _wait(slurm, job, out, "COMPLETED")
    return out


def _submit(slurm, out) -> str:
    done = subprocess.run(["bash", "-c", recipe(BLOCK)], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env=env_for(OUT=str(out), NODES="1", TASKS="2", IFNAME="lo", FIT_STEPS=STEPS,
                                      SLURM_CONF=slurm.conf))
    assert done.returncode == 0, done.stderr + slurm.logs()[-2000:]
    return re.search(r"Submitted batch job (\d+)", done.stdout).group(1)


def _log(out) -> str:
    return "".join(open(p, errors="replace").read() for p in sorted(glob.glob(str(out / "slurm-*.log"))))


def _wait(slurm, job: str, out, state: str, timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while (now := slurm.state(job)) != state:
        assert now not in ("FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "GONE") and time.monotonic() < deadline, \
            f"job {job} is {now}, not {state}:\n{_log(out)[-4000:]}"
        time.sleep(1)


@pytest.mark.slow
def test_sbatch_runs_the_docs_block_and_slurm_places_the_ranks(straight):
    log = _log(straight)
    assert "Initializing distributed: GLOBAL_RANK: 0, MEMBER: 1/2" in log, log[-3000:]
    assert "Initializing distributed: GLOBAL_RANK: 1, MEMBER: 2/2" in log
    assert len(metrics(straight)) == int(STEPS)


@pytest.mark.slow
def test_sigusr1_saves_an_hpc_checkpoint_requeues_and_the_job_resumes_exactly(slurm, straight, tmp_path):
    job = _submit(slurm, tmp_path)
    deadline = time.monotonic() + TIMEOUT
    while not glob.glob(str(tmp_path / "checkpoints" / "epoch=0-step=2.ckpt")):
        assert slurm.state(job) in ("PENDING", "RUNNING") and time.monotonic() < deadline, _log(tmp_path)[-3000:]
        time.sleep(0.5)
    assert slurm.run(["scancel", "--signal=USR1", job]).returncode == 0  # SLURM's warning before the limit
    _start_the_requeued_job_now(slurm, job, tmp_path)
    _wait(slurm, job, tmp_path, "COMPLETED")
    log = _log(tmp_path)
    assert glob.glob(str(tmp_path / "hpc_ckpt_*.ckpt")), log[-3000:]
    assert "requeued" in log.lower() and "Restored all states from the checkpoint" in log, log[-4000:]
    assert len(metrics(tmp_path / "restart-1")) >= 1  # the requeued job logged its steps beside the first part's
    resumed, whole = metrics(tmp_path), metrics(straight)  # first part, then restart-1/ (sorted paths)
    by_step = {row["step"]: row for row in resumed}  # a step logged twice (before the signal, after) keeps the last
    assert sorted(by_step) == sorted(row["step"] for row in whole)
    for row in whole:
        assert by_step[row["step"]] == pytest.approx(row, rel=1e-6, abs=1e-9), f"step {row['step']} differs"


def _start_the_requeued_job_now(slurm, job: str, out) -> None:
    """SLURM holds a requeued job for two minutes (``Reason=BeginTime``); an operator's
    ``scontrol update StartTime=now`` releases it, so the test does not wait out the hold."""
    deadline = time.monotonic() + TIMEOUT
    while not _requeued(info := slurm.run(["scontrol", "show", "job", job]).stdout):
        assert re.search(r"JobState=(RUNNING|COMPLETING|PENDING)\b", info) and time.monotonic() < deadline, \
            f"job {job} was not requeued:\n{_log(out)[-4000:]}"
        time.sleep(0.5)
    assert slurm.run(["scontrol", "update", f"JobId={job}", "StartTime=now"]).returncode == 0


def _requeued(info: str) -> bool:
    """``scontrol show job``'s text says the job is back in the queue after a requeue."""
    return "JobState=PENDING" in info and "Restarts=0" not in info


@pytest.mark.slow
def test_devices_that_do_not_match_the_allocation_are_refused_with_the_fix(slurm, tmp_path):
    wrap = f"srun {VENV}/bin/python {SCRIPT} --num-nodes 1 --devices 1 --out {tmp_path}"
    done = slurm.run(["sbatch", "--nodes", "1", "--ntasks-per-node", "2", "--output", str(tmp_path / "slurm-%j.log"),
                      "--wrap", wrap], env={**env_for(), "SLURM_CONF": slurm.conf}, cwd=ROOT)
    job = re.search(r"Submitted batch job (\d+)", done.stdout).group(1)
    deadline = time.monotonic() + TIMEOUT
    while slurm.state(job) in ("PENDING", "RUNNING", "COMPLETING"):
        assert time.monotonic() < deadline
        time.sleep(1)
    assert slurm.state(job) == "FAILED"
    assert "SLURM started 2 tasks (--nodes 1, --ntasks-per-node 2) but the Trainer runs 1 process(es) (num_nodes=1, " \
           "devices=1): each task would train alone. Set num_nodes=1 and devices=2" in _log(tmp_path), _log(tmp_path)[-3000:]
    assert not os.path.exists(tmp_path / "metrics.csv")
