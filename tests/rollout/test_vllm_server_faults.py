"""vLLM servers through faults (issue 27 item 5): launched servers end with their trainer however
it ends (SIGKILL, SIGTERM while they start, a scheduler's SIGTERM then SIGKILL while a rollout
waits on a hung server) and take their temporary folders with them; a hung or killed server is
dropped with a warning and the run goes on; a dropped server that answers again rejoins after a
full sync and checks; an abandoned reload still finds its snapshot; a smaller embedding table is
refused at start. Two servers are shared by the module (the last test kills one); the trainer
processes that launch their own run as children, killed by pid, each with a bounded wait."""
import logging
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import requests

import tiny_task as task
from conftest import quiet_trainer
from lightning_rlpt import PromptDataModule, RLCallback, RLModule, SamplingConfig
from lightning_rlpt.callbacks import VLLMServerRollout
from lightning_rlpt.model.weights import policy_weights
from lightning_rlpt.rollout.parity import ParityProbe
from lightning_rlpt.rollout.servers.pool import ServerFailure
from lightning_rlpt.rollout.vllm import guard
from lightning_rlpt.rollout.vllm.remote_engine import RemoteVLLMEngine
from lightning_rlpt.rollout.vllm.server import VLLMServer
from lightning_rlpt.rollout.vllm.transport import SnapshotTransport

CLIENT = "lightning_rlpt.rollout.servers.pool"
GREEDY = SamplingConfig(max_new_tokens=4, temperature=0.0, max_prompt_length=8)
SERVE = dict(max_model_len=64, kv_cache_memory_bytes=64 << 20, startup_timeout=240)
PYTHON = sys.executable
TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def session_pids(sid: int) -> list[int]:
    """Every process whose session is ``sid`` (a guard leads its server's session)."""
    found = []
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if name.isdigit() and int(fields[3]) == sid and fields[0] != "Z":
            found.append(int(name))
    return found


def guards_under(folder: str) -> list[int]:
    """Pids of the guards whose ``--remove`` folder lies in ``folder``."""
    pids = []
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{name}/cmdline", "rb") as cmd:
                args = cmd.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        if any(a.endswith("guard.py") for a in args) and any(a.startswith(folder) for a in args):
            pids.append(int(name))
    return pids


def wait_for(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"not within {timeout:.0f} s: {what}")


# ---------------------------------------------------------------------------- the guard alone (fast)
def test_the_guard_ends_the_whole_session_and_removes_folders_when_its_trainer_is_killed(tmp_path):
    """A stand-in server that spawns a child of its own (as the api_server spawns EngineCore) and
    ignores SIGTERM: SIGKILL of the process that launched it ends both, and the folder goes."""
    folder, pids = tmp_path / "run", tmp_path / "pids"
    folder.mkdir()
    server = (f"import os, signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
              f"c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)']); "
              f"open({str(pids)!r}, 'w').write(f'{{os.getpid()}} {{c.pid}}'); time.sleep(300)")
    trainer = (f"import os, subprocess, sys, time; subprocess.Popen([sys.executable, {guard.__file__!r}, "
               f"str(os.getpid()), '--remove', {str(folder)!r}, '--', sys.executable, '-c', {server!r}], "
               "start_new_session=True); time.sleep(300)")
    parent = subprocess.Popen([PYTHON, "-c", trainer])
    started = wait_for(lambda: pids.exists() and pids.read_text().split(), 30, "the stand-in server started")
    server_pid, child_pid = map(int, started)
    sid = os.getsid(server_pid)
    try:
        assert sid != os.getsid(0) and sid in session_pids(sid)  # the guard leads the server's session
        time.sleep(1.0)
        assert os.path.exists(folder) and child_pid in session_pids(sid)  # a live trainer: nothing is touched
        parent.kill()
        parent.wait()
        wait_for(lambda: not session_pids(sid), guard.GRACE + 5, "the session ended after the trainer's SIGKILL")
        assert not folder.exists()
    finally:
        kill_session(sid)
        parent.kill()


def test_a_wait_threshold_of_zero_is_refused_before_any_server_starts():
    with pytest.raises(ValueError, match=r"warn_after must be > 0 seconds \(got 600.0, 600.0, 0\)"):
        VLLMServerRollout(launch=dict(num_servers=1), warn_after=0)


def kill_session(sid: int) -> None:
    """What a failed test left: SIGKILL every process of session ``sid``, by pid."""
    for pid in session_pids(sid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


# ---------------------------------------------------------------------------- launched servers and their trainer
TRAINER = """
import os, sys
sys.path.insert(0, {tests!r})
import tiny_task as task
from conftest import quiet_trainer
from lightning_rlpt import PromptDataModule, RLCallback, RLModule, SamplingConfig
from lightning_rlpt.callbacks import VLLMServerRollout

class Mark(RLCallback):  # tells the test that training has reached step 1
    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        if trainer.global_step == 1:
            open({marker!r}, "w").write("training")

module = RLModule({model!r}, reward_funcs=[task.exact_answer], group_size=4, kl_coef=0.0,
                  generation=dict(max_new_tokens=4, temperature=1.0, max_prompt_length=8))
launch = dict(num_servers=1, kv_cache_memory_bytes=64 << 20, startup_timeout=240, log_dir={logs!r})
callback = VLLMServerRollout(launch=launch, warn_after=2)
train, _ = task.split_pairs()
quiet_trainer(max_steps=100, callbacks=[callback, Mark()]).fit(
    module, datamodule=PromptDataModule(task.rows(train[:64]), batch_size=4))
"""


def start_trainer(tmp_path, model: str) -> tuple[subprocess.Popen, str, str]:
    """A trainer process with ``launch=`` (its temporary folders under ``tmp_path/tmp`` plus 60
    characters: past the length at which vLLM's socket paths no longer fit, `server.rpc_base`); returns
    it, the folder its temporary files go to and the marker file it writes at step 1."""
    tmp, marker = tmp_path / ("tmp" + "-" * 60), tmp_path / "step1"
    tmp.mkdir()
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER.format(tests=TESTS, marker=str(marker), model=model, logs=str(tmp_path / "logs")))
    stderr = open(tmp_path / "stderr", "w")
    child = subprocess.Popen([PYTHON, str(script)], stdout=subprocess.DEVNULL, stderr=stderr,
                             env={**os.environ, "TMPDIR": str(tmp)})
    return child, str(tmp), str(marker)


def test_a_temp_dir_too_long_for_vllm_socket_paths_moves_them_to_tmp(monkeypatch):
    """vLLM names its sockets <temp dir>/<uuid4> and a socket path holds 107 bytes: a longer temp dir
    would kill the server at start (ZMQError), so its sockets go to /tmp; the user's own base is kept
    when it fits and refused, with the limit, when it does not."""
    from lightning_rlpt.rollout.vllm.server import RPC_BASE_MAX, rpc_base

    fits, too_long = "/t" + "x" * (RPC_BASE_MAX - 2), "/t" + "x" * (RPC_BASE_MAX - 1)
    assert rpc_base({"TMPDIR": fits}) == {}
    assert rpc_base({"TMPDIR": too_long}) == {"VLLM_RPC_BASE_PATH": "/tmp"}
    assert rpc_base({"TMP": too_long}) == {"VLLM_RPC_BASE_PATH": "/tmp"}
    assert rpc_base({"TMPDIR": too_long, "VLLM_RPC_BASE_PATH": fits}) == {}
    with pytest.raises(ValueError, match=rf"VLLM_RPC_BASE_PATH='/tx+' has {RPC_BASE_MAX + 1} characters.*at most "
                                         rf"{RPC_BASE_MAX} characters"):
        rpc_base({"VLLM_RPC_BASE_PATH": too_long})


def run_dirs(tmp: str) -> list[str]:
    return [n for n in os.listdir(tmp) if n.startswith("rlpt-serve-")]


@pytest.mark.slow
def test_sigterm_while_the_server_starts_stops_it_and_removes_the_run_folder(tmp_path, warm_start_dir):
    """Lightning's SIGTERM handler comes after setup: the callback's own stops the server by pid."""
    child, tmp, _ = start_trainer(tmp_path, warm_start_dir)
    sid = None
    try:
        sid = wait_for(lambda: guards_under(tmp), 120, "the server process started")[0]
        assert run_dirs(tmp)
        child.send_signal(signal.SIGTERM)  # vLLM needs ~35 s to be healthy: this lands while it starts
        child.wait(timeout=60)
        err = (tmp_path / "stderr").read_text()
        assert "SIGTERM while vLLM servers were starting" in err, err[-3000:]
        assert not session_pids(sid) and not run_dirs(tmp)
    finally:
        child.kill()
        if sid:
            kill_session(sid)


@pytest.mark.slow
def test_sigterm_then_sigkill_while_a_rollout_waits_on_a_hung_server_ends_the_server(tmp_path, warm_start_dir):
    """A scheduler's SIGTERM, then SIGKILL, reaches a trainer blocked on a hung (stopped) server:
    the wait is reported after ``warn_after``, and once the trainer is gone the server's guard ends
    every process of the server (stopped ones too) and removes the export and snapshot folder."""
    child, tmp, marker = start_trainer(tmp_path, warm_start_dir)
    sid = None
    try:
        wait_for(lambda: os.path.exists(marker) or child.poll() is not None, 300, "training reached step 1")
        assert child.poll() is None, (tmp_path / "stderr").read_text()[-3000:]
        sid = guards_under(tmp)[0]
        for pid in session_pids(sid):  # the api_server and its EngineCore hang; the guard keeps watching
            if pid != sid:
                os.kill(pid, signal.SIGSTOP)
        warned = wait_for(lambda: re.search(r"vLLM server http://127\.0\.0\.1:\d+ has not answered /\S+ for 2 s at "
                                            r"global step \d", (tmp_path / "stderr").read_text()), 30,
                          "a warning naming the server, the route and the step")
        assert warned
        child.send_signal(signal.SIGTERM)
        time.sleep(2.0)
        assert child.poll() is None  # blocked on the hung server: the scheduler's SIGKILL follows
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
        wait_for(lambda: not session_pids(sid), guard.GRACE + 10, "the server's processes ended")
        assert not run_dirs(tmp)
    finally:
        child.kill()
        if sid:
            kill_session(sid)


# ---------------------------------------------------------------------------- two shared servers
def make_module(path, **kwargs):
    return RLModule(path, reward_funcs=[task.exact_answer], group_size=4, kl_coef=0.0,
                    generation=dict(max_new_tokens=4, temperature=1.0, max_prompt_length=8), **kwargs)


@pytest.fixture(scope="module")
def servers(warm_start_dir, tmp_path_factory):
    started = VLLMServer.launch_many(warm_start_dir, 2, log_dir=str(tmp_path_factory.mktemp("vllm-logs")), **SERVE)
    yield started
    for server in started:
        os.killpg(server.pid, signal.SIGCONT)  # a test that failed may have left one stopped
        server.stop()


@pytest.mark.slow
def test_a_hung_server_is_dropped_then_rejoins_and_its_abandoned_reload_finds_its_snapshot(
        servers, warm_start_dir, tmp_path, caplog):
    """Server b hangs (SIGSTOP) just as step 1's reload is sent to it: the sync waits
    ``control_timeout``, warns after ``warn_after``, drops b (a warning names it, the step and why)
    and goes on with a. Step 1's snapshot folder is kept while b may still read it; step 2's sync
    probes b (still hung: it stays out). Resumed, b runs the abandoned reload from that folder
    (alive afterwards); step 3's sync brings it back with a full sync, a version check and the
    parity probe, and it serves again."""
    a, b = servers
    module = make_module(warm_start_dir)
    folder = tmp_path / "weights"
    engine = RemoteVLLMEngine([a.url, b.url], eos_token_id=task.EOS_ID, transport=SnapshotTransport(str(folder)),
                              control_timeout=8, warn_after=1)
    probed = []
    module.parity = ParityProbe(threshold=1e-3)
    module.parity.prompt = [1, 4, 5, 13]
    engine.probe = lambda url: probed.append((url, module.probe_rejoined(engine._one_server(url))))
    engine.load_weights(policy_weights(module.policy), 0)
    post = engine.pool.post

    def hang_b_before_its_reload(url, path, body=None):
        if url == b.url and path == "/collective_rpc":
            os.killpg(b.pid, signal.SIGSTOP)
        return post(url, path, body)

    ids = module.tokenizer([row["prompt"] for row in task.rows([(1, 2), (3, 4), (5, 6), (7, 1)])])["input_ids"]
    caplog.set_level(logging.WARNING, logger=CLIENT)
    engine.pool.post = hang_b_before_its_reload
    try:
        engine.where = "global step 1"
        engine.load_weights(policy_weights(module.policy), 1)
        engine.pool.post = post
        assert engine.pool.live == [a.url]
        assert f"vLLM server {b.url} has not answered /collective_rpc for 1 s at global step 1" in caplog.text
        assert f"vLLM server {b.url} dropped at global step 1: ReadTimeout on /collective_rpc" in caplog.text
        abandoned = folder / "sync-1-v1"
        assert (abandoned / "model.safetensors").exists()
        assert engine.generate(ids, GREEDY, 0).completion_ids  # a alone serves step 1
        engine.where = "global step 2"
        engine.load_weights(policy_weights(module.policy), 2)  # b does not answer the probe: it stays out
        assert engine.pool.live == [a.url] and probed == []
        assert sorted(os.listdir(folder)) == ["sync-1-v1", "sync-2-v2"]  # step 0's went, b's may be read
    finally:
        engine.pool.post = post
        os.killpg(b.pid, signal.SIGCONT)
    wait_for(lambda: requests.get(b.url + "/weight_info", timeout=5).json()["weight_version"] == "updating-1", 30,
             "b resumed")
    time.sleep(3.0)  # b runs step 1's reload it was sent before it hung
    assert b.alive(), b.log_tail()
    engine.where = "global step 3"
    engine.load_weights(policy_weights(module.policy), 3)
    assert engine.pool.live == [a.url, b.url] and [url for url, _ in probed] == [b.url]
    assert f"vLLM server {b.url} answers again at global step 3" in caplog.text
    assert sorted(os.listdir(folder)) == ["sync-3-v3"]  # b answered a later reload: nothing reads step 1's
    engine.pool.served = {url: 0 for url in engine.pool.urls}
    engine.generate(ids * 8, GREEDY, 0)
    assert min(engine.pool.served.values()) > 0
    engine.close()
    assert not folder.exists()


@pytest.mark.slow
def test_a_smaller_embedding_table_is_refused_with_both_sizes(servers):
    """The served table has the tokenizer's 15 rows, the policy 17: the vocabulary probe (token ids
    up to the tokenizer's) passes, the first sync would fail with vLLM's bare 500."""
    engine = RemoteVLLMEngine([servers[0].url], eos_token_id=task.EOS_ID)
    policy, tokenizer = task.build_model(vocab_size=17), task.build_tokenizer()
    with pytest.raises(ValueError, match=rf"{servers[0].url} serves .* embedding table of 15 rows, the policy's "
                                         "has 17: its weights cannot be loaded"):
        engine.check_model(policy, tokenizer, 64)
    engine.check_model(task.build_model(vocab_size=15), tokenizer, 64)  # the same size passes


@pytest.mark.slow
def test_a_server_a_stopped_run_left_mid_sync_is_not_sampled_before_the_first_sync(
        servers, warm_start_dir, arithmetic_rows, tmp_path, caplog):
    """A trainer stopped between the snapshot-directory probe (a reload that fails, leaving part of
    the weights reset) and its first sync leaves the server at version 'checking-snapshot-dir'.
    The next run's vocabulary probe used to sample a token there: vLLM's worker died on the reset
    tensors (meta tensors), and the server with it. Now that probe is skipped with a warning, the
    first sync reloads every weight, and the run samples."""
    a = servers[0]
    engine = RemoteVLLMEngine([a.url], eos_token_id=task.EOS_ID)
    empty = tmp_path / "probe-visible"
    empty.mkdir()
    engine.pool.post(a.url, "/update_weight_version", {"new_version": "checking-snapshot-dir"})
    with pytest.raises(ServerFailure, match="Cannot find any model weights"):  # the probe of a run then killed
        engine.pool.post(a.url, "/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(empty)}})
    caplog.set_level(logging.WARNING, logger="lightning_rlpt.rollout.vllm.remote_engine")
    module = make_module(warm_start_dir)
    quiet_trainer(max_steps=1, callbacks=[VLLMServerRollout(urls=[a.url], control_timeout=60)]).fit(
        module, datamodule=PromptDataModule(arithmetic_rows, batch_size=4))
    assert module.policy_version == 1
    assert f"vLLM server {a.url} holds weight version 'checking-snapshot-dir'" in caplog.text


@pytest.mark.slow
def test_a_server_killed_between_a_rollout_and_the_sync_is_dropped_and_the_run_goes_on(
        servers, warm_start_dir, arithmetic_rows, caplog):
    """Runs last: it kills server b after step 1's rollout. Step 1's sync drops b (a warning),
    steps 2 and 3 sample from a, and ``vllm/live_servers`` is logged every step: 2, 2, 1, 1."""
    a, b = servers
    live = []

    class KillAndRecord(RLCallback):
        def on_rewards_computed(self, trainer, module, experience):
            if trainer.global_step == 1:
                os.killpg(b.pid, signal.SIGKILL)

        def on_train_batch_end(self, trainer, module, *args):
            live.append(trainer.callback_metrics["vllm/live_servers"].item())

    caplog.set_level(logging.WARNING, logger=CLIENT)
    module = make_module(warm_start_dir)
    callback = VLLMServerRollout(urls=[a.url, b.url], control_timeout=30)
    quiet_trainer(max_steps=4, callbacks=[callback, KillAndRecord()]).fit(
        module, datamodule=PromptDataModule(arithmetic_rows, batch_size=4))
    assert module.policy_version == 4 and live == [2.0, 2.0, 1.0, 1.0]
    assert f"vLLM server {b.url} dropped at global step 1: ConnectionError on /update_weight_version" in caplog.text
