"""A real SLURM on this machine for tests: ``munged``, ``slurmctld`` and one ``slurmd`` (this host as
the only node), each started in the foreground by the test from a configuration of its own in a
temporary directory (``SLURM_CONF``), and stopped by PID.

Needs root and Debian's ``slurmctld``, ``slurmd``, ``slurm-client`` and ``munge`` (``make
install`` installs them as root with apt-get); `SlurmCluster.unavailable` says why not, for
pytest's skip. Jobs run as root with ``proctrack/linuxproc`` and ``task/none`` (no cgroups in a
container).
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time

from netns_cluster import _stop_pids

TOOLS = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "scontrol", "squeue", "sacct")
CONF = """ClusterName=rlpt
SlurmctldHost={host}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={dir}/munge.socket
CredType=cred/munge
SlurmctldPort={port}
SlurmdPort={port2}
StateSaveLocation={dir}/ctld
SlurmdSpoolDir={dir}/d
SlurmctldPidFile={dir}/ctld.pid
SlurmdPidFile={dir}/d.pid
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
JobRequeue=1
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=2
KillWait=10
MinJobAge=300
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
NodeName={host} CPUs={cpus} State=UNKNOWN
PartitionName=test Nodes={host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SlurmCluster:
    """``with SlurmCluster(tmp_dir) as slurm: slurm.sbatch([...])``; ``slurm.env`` holds ``SLURM_CONF``."""

    def __init__(self, directory: str, cpus: int = 2):
        self.dir, self.host = os.path.abspath(directory), socket.gethostname()
        for sub in ("ctld", "d"):
            os.makedirs(os.path.join(self.dir, sub), exist_ok=True)
        self.conf = os.path.join(self.dir, "slurm.conf")
        with open(self.conf, "w") as f:
            f.write(CONF.format(host=self.host, dir=self.dir, port=_free_port(), port2=_free_port(), cpus=cpus))
        self.env = {**os.environ, "SLURM_CONF": self.conf}
        self.procs: list[subprocess.Popen] = []
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    @staticmethod
    def unavailable() -> str | None:
        missing = [t for t in TOOLS if shutil.which(t) is None]
        if missing:
            return (f"SLURM is not installed here (missing {', '.join(missing)}): apt-get install slurmctld slurmd "
                    "slurm-client munge (`make install` does it as root)")
        if os.geteuid() != 0:
            return "the SLURM daemons run as root in the test: run it as root (CI does)"
        return None

    def _daemon(self, argv: list[str], name: str) -> None:
        log = open(os.path.join(self.dir, f"{name}.log"), "wb")
        self.procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                           start_new_session=True))

    def _start(self) -> None:
        key = os.path.join(self.dir, "munge.key")
        with open(key, "wb") as f:
            f.write(os.urandom(128))
        os.chmod(key, 0o400)
        self._daemon(["munged", "-F", "--force", "-S", os.path.join(self.dir, "munge.socket"), "--key-file", key,
                      "--pid-file", os.path.join(self.dir, "munged.pid"), "--log-file",
                      os.path.join(self.dir, "munged.log"), "--seed-file", os.path.join(self.dir, "munged.seed")],
                     "munged-out")
        self._wait(lambda: os.path.exists(os.path.join(self.dir, "munge.socket")), "munged")
        self._daemon(["slurmctld", "-D", "-i", "-f", self.conf], "slurmctld")
        self._daemon(["slurmd", "-D", "-f", self.conf], "slurmd")
        self._wait(lambda: "idle" in self.run(["sinfo", "-h", "-o", "%t"]).stdout, "the node to be idle")

    def _wait(self, ready, what: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            for p in self.procs:
                if p.poll() is not None:
                    raise RuntimeError(f"{p.args[0]} exited ({p.returncode}) while waiting for {what}: "
                                       + self.logs()[-3000:])
            if time.monotonic() > deadline:
                raise RuntimeError(f"SLURM: no {what} within {timeout} s: " + self.logs()[-3000:])
            time.sleep(0.5)

    def logs(self) -> str:
        return "".join(f"--- {n}\n" + open(os.path.join(self.dir, n), errors="replace").read()
                       for n in sorted(os.listdir(self.dir)) if n.endswith(".log"))

    def run(self, argv: list[str], timeout: float = 60, **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(argv, env=kwargs.pop("env", self.env), capture_output=True, text=True, timeout=timeout,
                              **kwargs)

    def state(self, job: str) -> str:
        """The job's state (PENDING, RUNNING, COMPLETED, ...), from slurmctld."""
        out = self.run(["scontrol", "show", "job", job]).stdout
        return next((w.split("=", 1)[1] for w in out.split() if w.startswith("JobState=")), "GONE")

    def close(self) -> None:
        """Cancel every job, then stop the daemons by PID (the jobs' steps go with slurmd)."""
        if self.procs and self.procs[-1].poll() is None:
            self.run(["scancel", "--full", "--user", "root"], timeout=30)
        _stop_pids([p.pid for p in reversed(self.procs)])
        for p in self.procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
        self.procs.clear()

    def __enter__(self) -> "SlurmCluster":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
