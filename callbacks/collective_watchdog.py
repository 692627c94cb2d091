"""`CollectiveWatchdog`: collectives bounded in time, and the silent rank named while waiting.

Without it, a data-parallel run whose peer froze (SIGSTOP, a hung driver) or whose link was cut
waits in its collective for the process group's timeout (Lightning's default: 30 minutes), and
the error then names neither the rank nor the host. On every rank this callback

- sets the default process group's timeout, the one knob (``timeout``, seconds): given, from
  setup on; by default (None) ``step_multiple`` x the slowest step so far, at least
  ``min_timeout``, from the end of the first step on (before it, start-up, which loads weights and
  starts engines, keeps the strategy's own timeout). A collective lives inside one step, so a
  wait ten times the slowest step is no slow step but a lost peer;
- beats: a thread writes (step, a timestamp) under a key of its own into the rendezvous store
  (``MASTER_ADDR:MASTER_PORT``, through a client of its own with a short timeout) every ``beat``
  seconds and reads the other ranks'. A rank whose counter has not moved for 3 beats is silent
  (frozen, or cut off); a store that does not answer is named too (it lives on node 0);
- while a step has lasted more than ``warn_after`` seconds, logs every ``warn_after`` seconds
  which ranks are silent or behind, on which host and address, for how long, at which step; and
  between batches (checkpoint saves and validation wait in collectives too) the same once a rank
  is silent, naming the phase;
- when the run ends in an exception (the collective timed out, a peer reset the connection),
  logs an error naming the step, the silent ranks and their hosts, and the last checkpoint;
- if a step has still not ended after twice the timeout (a wait that no collective timeout
  covers), logs the same error and ends the process (exit code 3).

Set ``timeout`` above the longest healthy step, checkpoint saves and validation included.
Refused at setup: a multi-node run whose ``MASTER_ADDR`` resolves to a loopback address, and a
SLURM job whose task count is not the Trainer's process count.
"""
from __future__ import annotations

import ipaddress
import json
import logging
import os
import socket
import threading
import time
from datetime import timedelta
from typing import Any

import lightning as L

log = logging.getLogger(__name__)
KEY = "rlpt-watchdog/{}"
SILENT_BEATS = 3  # a rank is silent once its counter has not moved for this many beats
EXIT_CODE = 3


def check_master_address(num_nodes: int, address: str | None = None) -> None:
    """Refuse a multi-node run whose ``MASTER_ADDR`` is (or resolves to) a loopback address."""
    address = address or os.environ.get("MASTER_ADDR")
    if num_nodes < 2 or not address:
        return
    try:
        resolved = sorted({info[4][0] for info in socket.getaddrinfo(address, None)})
    except socket.gaierror as err:
        raise ValueError(f"MASTER_ADDR={address} does not resolve on host {socket.gethostname()} ({err}): set it "
                         "to node 0's address on the network the nodes share") from err
    loopback = [a for a in resolved if ipaddress.ip_address(a.split("%")[0]).is_loopback]
    if loopback:
        raise ValueError(f"MASTER_ADDR={address} resolves to the loopback address {loopback[0]} on host "
                         f"{socket.gethostname()}, but this run has {num_nodes} nodes: the other nodes cannot "
                         "reach node 0 there. Set MASTER_ADDR (torchrun --master-addr) to node 0's address on the "
                         "network the nodes share (e.g. the first of `hostname -I` on node 0)")


def check_slurm_allocation(world_size: int, num_nodes: int, devices: int) -> None:
    """Refuse a Trainer whose process count is not the SLURM job's task count: under a mismatch
    each task trains alone (Lightning validates only its parallel strategies)."""
    tasks, name = os.environ.get("SLURM_NTASKS"), os.environ.get("SLURM_JOB_NAME")
    if not tasks or name in ("bash", "interactive") or int(tasks) == world_size:
        return
    nodes, per_node = os.environ.get("SLURM_NNODES", "?"), os.environ.get("SLURM_NTASKS_PER_NODE", "?")
    raise ValueError(f"SLURM started {tasks} tasks (--nodes {nodes}, --ntasks-per-node {per_node}) but the Trainer "
                     f"runs {world_size} process(es) (num_nodes={num_nodes}, devices={devices}): each task would train "
                     f"alone. Set num_nodes={nodes} and devices={per_node} (the script's --num-nodes/--devices), or "
                     f"submit with --nodes {num_nodes} --ntasks-per-node {devices}")


def local_address(peer: str, port: int) -> str:
    """This host's address on the route to ``peer`` (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((peer, port))
            return s.getsockname()[0]
        except OSError:
            return "?"


def last_checkpoint(trainer: L.Trainer) -> str:
    """The newest checkpoint this run saved, or a sentence saying there is none."""
    paths = [getattr(cb, "_last_checkpoint_saved", "") or cb.last_model_path or cb.best_model_path
             for cb in trainer.checkpoint_callbacks]
    paths = [p for p in paths if p]
    return max(paths, key=lambda p: os.path.getmtime(p) if os.path.exists(p) else 0) if paths \
        else "none saved by this run"


class CollectiveWatchdog(L.Callback):
    """Args (module docstring):
        timeout: the collective timeout in seconds; None: ``step_multiple`` x the slowest step, at
            least ``min_timeout``, after the first step.
        warn_after: seconds a step may last before the silent ranks are logged (default: 60, or a
            quarter of an explicit ``timeout`` when that is less).
        beat: seconds between heartbeats.
    """

    def __init__(self, timeout: float | None = None, warn_after: float | None = None, beat: float = 2.0,
                 step_multiple: float = 10.0, min_timeout: float = 300.0):
        if timeout is not None and timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds (or None for {step_multiple:g} x the slowest step), "
                             f"got {timeout}")
        self.timeout, self.beat, self.step_multiple, self.min_timeout = timeout, beat, step_multiple, min_timeout
        self.warn_after = warn_after or (min(60.0, timeout / 4) if timeout else 60.0)
        self.applied: float | None = None  # the timeout the process group has now (None: the strategy's)
        self.step, self.started, self.slowest, self.warnings, self.trainer = 0, None, 0.0, 0, None
        self.since: float | None = None  # the last sign of progress: a batch began or ended (None: not yet)
        self.phase = "in the step"  # where this rank waits since `since`: the warning names it
        self.rank, self.world, self.born = 0, 1, time.monotonic()
        self.master, self.me = ("127.0.0.1", 29500), {"host": socket.gethostname(), "address": "?"}
        self.peers: dict[int, dict[str, Any]] = {}  # rank -> its last beat and when it last changed
        self.store_ok, self.store_error = time.monotonic(), None  # the store's last answer; its last error
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ Lightning hooks
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        import torch.distributed as dist

        check_master_address(trainer.num_nodes)
        check_slurm_allocation(trainer.world_size, trainer.num_nodes, trainer.num_devices)
        if stage != "fit" or trainer.world_size < 2 or not (dist.is_available() and dist.is_initialized()):
            return
        self.trainer, self.rank, self.world = trainer, trainer.global_rank, trainer.world_size
        self.master = (os.environ.get("MASTER_ADDR", "127.0.0.1"), int(os.environ.get("MASTER_PORT", "29500")))
        self.me = {"host": socket.gethostname(), "address": local_address(*self.master)}
        if self.timeout is not None:
            self._apply(self.timeout)
        self._stop.clear()
        # A fresh watch: nothing left from an earlier validate() or fit with this callback
        self.since, self.started, self.warnings, self.peers = None, None, 0, {}
        self.born = self.store_ok = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="rlpt-collective-watchdog", daemon=True)
        self._thread.start()

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        self.step, self.started = trainer.global_step, time.monotonic()
        self._progress("in the step")

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if self.started is not None:
            self.slowest = max(self.slowest, time.monotonic() - self.started)
        self.started = None
        # Watched after the step too: the checkpoint callbacks that run next wait in a barrier, and
        # a peer lost there went unnamed (a cut link seen in a test ended the run with no warning)
        self._progress("since the step ended")
        if self.timeout is None and self._thread is not None:
            wanted = max(self.min_timeout, self.step_multiple * self.slowest)
            if self.applied is None or wanted > self.applied * 1.1:
                self._apply(wanted)

    def on_validation_batch_start(self, *args: Any) -> None:
        self._progress("in validation")

    def on_validation_batch_end(self, *args: Any) -> None:
        self._progress("since a validation batch ended")

    def _progress(self, phase: str) -> None:
        self.since, self.phase, self.warnings = time.monotonic(), phase, 0

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        if self._thread is not None:
            first = (str(exception).strip().splitlines() or [""])[0][:300]
            log.error("%s. The run ended with %s: %s", self.describe(time.monotonic()), type(exception).__name__,
                      first)
        self._stop.set()  # Lightning skips teardown after an exception: the watch ends here

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * self.beat + 5)
        self._thread = None

    # ------------------------------------------------------------------ the watch
    def _apply(self, seconds: float) -> None:
        from torch.distributed.distributed_c10d import _set_pg_timeout

        _set_pg_timeout(timedelta(seconds=seconds))
        self.applied = seconds

    def _run(self) -> None:
        """Watch on one thread, beat on another: a store operation may block past its timeout (a
        cut link), and the warnings must still come."""
        threading.Thread(target=self._beat, name="rlpt-collective-heartbeat", daemon=True).start()
        while not self._stop.wait(self.beat):
            self._watch(time.monotonic())

    def _beat(self) -> None:
        # The first beat at once, not after ``beat`` seconds: a peer lost in the first seconds of a
        # fit (a short one reaches its first checkpoint in about one) is then named with its host,
        # never "never heard".
        store = None
        while True:
            now = time.monotonic()
            try:
                if store is None:
                    from torch.distributed import TCPStore
                    store = TCPStore(*self.master, is_master=False, wait_for_workers=False,
                                     timeout=timedelta(seconds=max(1.0, self.beat)))
                self._exchange(store, now)
                self.store_ok, self.store_error = time.monotonic(), None
            except Exception as err:  # the store (node 0) does not answer: try a fresh client next beat
                store, self.store_error = None, f"{type(err).__name__}: {str(err).strip().splitlines()[0][:120]}"
            if self._stop.wait(self.beat):
                return

    def _exchange(self, store: Any, now: float) -> None:
        beat = {**self.me, "step": self.step, "beat": round(now, 3)}
        store.set(KEY.format(self.rank), json.dumps(beat))
        for rank in range(self.world):
            if rank != self.rank and store.check([KEY.format(rank)]):
                info = json.loads(store.get(KEY.format(rank)))
                seen = self.peers.get(rank)
                if seen is None or seen["info"]["beat"] != info["beat"]:
                    self.peers[rank] = {"info": info, "changed": now}

    def _watch(self, now: float) -> None:
        if self.since is None:
            return
        silent, behind = self._missing(now)
        # Between batches only a lost peer is worth a word: a long save or validation is no fault
        if now - self.since > self.warn_after * (self.warnings + 1) and (self.started or silent or behind):
            self.warnings += 1
            log.warning("%s", self.describe(now))
        # The exit only inside a step: after it, a long validation may lawfully outlast the timeout
        limit, waited = self.applied, now - (self.started or now)
        if limit is not None and self.slowest > 0 and waited > 2 * limit:
            log.error("%s. No collective timeout ended the wait (%.0f s, twice the timeout): ending this process",
                      self.describe(now), waited)
            logging.shutdown()
            os._exit(EXIT_CODE)

    def describe(self, now: float) -> str:
        """Who this rank waits for, since when, and the last checkpoint: the warning's and the error's text."""
        waited = f"{now - (self.since or now):.0f} s" + ("" if self.phase == "in the step" else f" {self.phase}")
        me = f"rank {self.rank} ({self.me['host']} {self.me['address']})"
        silent, behind = self._missing(now)
        timeout = f"{self.applied:.0f} s" if self.applied else "the strategy's (until the first step ends)"
        who = "; ".join(silent + behind) or "every rank answers (a slow step, not a lost peer)"
        return (f"CollectiveWatchdog: {me} at global step {self.step}, waiting {waited}: {who}. Collective "
                f"timeout {timeout}. Last checkpoint: {last_checkpoint(self.trainer)}")

    def _missing(self, now: float) -> tuple[list[str], list[str]]:
        """The silent ranks (and the store, when it stopped answering), and the ranks still behind."""
        silent, behind = [], []
        for rank in range(self.world):
            if rank == self.rank:
                continue
            seen = self.peers.get(rank)
            quiet = now - (seen["changed"] if seen else self.born)
            where = f"rank {rank} ({seen['info']['host']} {seen['info']['address']})" if seen else f"rank {rank}"
            if quiet > SILENT_BEATS * self.beat:
                last = f"last heard at step {seen['info']['step']}" if seen else "never heard"
                silent.append(f"{where} silent for {quiet:.0f} s ({last})")
            elif seen and self.started is not None and seen["changed"] > self.started \
                    and seen["info"]["step"] < self.step:  # a beat written while this rank waits: still behind
                behind.append(f"{where} alive but at step {seen['info']['step']}")
        if self.world > 1 and now - self.store_ok > SILENT_BEATS * self.beat:
            why = f" ({self.store_error})" if self.store_error else ""
            silent.append(f"the rendezvous store at {self.master[0]}:{self.master[1]} (node 0) has not answered "
                          f"for {now - self.store_ok:.0f} s{why}")
        return silent, behind
