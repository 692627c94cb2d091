"""The review's attacks on the code reward (issue 24), each run as a real completion through
`CodeExecutionReward` under bubblewrap. A completion that defines nothing must score 0, a
forged verdict must not count, and nothing may leave the box. Every attack is bounded in time."""
import os
import random
import resource
import shutil
import socket
import subprocess

import pytest

from lightning_rlpt import CodeExecutionReward
from lightning_rlpt.rewards import RewardFunctions
from lightning_rlpt.rewards.code import SandboxLimitError

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap (make install puts it in)")
ADD_TESTS = ["assert add(1, 2) == 3", "assert add(2, 2) == 4", "assert add(-1, 1) == 0"]
HUMANEVAL = "def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(2, 2) == 4\ncheck(add)"


def score(code, tests=ADD_TESTS, **kwargs):
    reward = CodeExecutionReward(timeout=kwargs.pop("timeout", 5), **kwargs)
    return reward(["q"], [code], tests=[tests])[0]


FAKES = {
    # the harness compiles each test with the builtin compile: make every test "pass"
    "patch compile": "import builtins\n_c = compile\nbuiltins.compile = lambda s, n, m, *a, **k: _c('pass', n, m)\n"
                     "import builtins as b; b.AssertionError = type('Never', (Exception,), {})\n",
    # find the harness's frame (its nonce and report pipe) and report every test as passed
    "walk the stack": "import sys, os\nf = sys._getframe()\nwhile f is not None and 'nonce' not in f.f_locals:\n"
                      "    f = f.f_back\nif f is not None:\n    r, n = f.f_locals['report'], f.f_locals['nonce']\n"
                      "    for i in range(3):\n        r.write(f'{n} {i} 1\\n')\n    r.write(f'{n} done\\n'); r.flush(); os._exit(0)\n",
    # an answer that equals everything
    "always equal": "class Yes:\n    def __eq__(self, other): return True\n    __hash__ = object.__hash__\n"
                    "def add(a, b): return Yes()\n",
}


@pytest.mark.parametrize("tests", [ADD_TESTS, HUMANEVAL], ids=["assert", "check(candidate)"])
@pytest.mark.parametrize("attack", list(FAKES))
def test_faking_a_pass_from_inside_the_interpreter_scores_zero(attack, tests):
    assert score(FAKES[attack], tests) == 0.0
    assert score("def add(a, b): return a + b", tests) == 1.0  # the honest answer still passes


FORGE = """import os, signal, json
line = json.dumps({"passed": [True] * 3, "status": "ok", "network": "namespace"})  # the supervisor's report
for pid in (os.getppid(), 1):  # its parent's stdout: the pipe the trainer reads the verdict from
    try:
        with open(f'/proc/{pid}/fd/1', 'w') as out:
            out.write(line + '\\n')
    except OSError:
        pass
import subprocess
subprocess.Popen(['sleep', '%s'], start_new_session=True)
if os.fork() == 0:  # a double-forked grandchild in its own session too
    os.setsid(); os.execvp('sleep', ['sleep', '%s'])
os.kill(os.getppid(), signal.SIGKILL)
"""


def sleepers(marker: str) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if f.read() == b"sleep\0" + marker.encode() + b"\0":
                    found.append(int(pid))
        except OSError:
            pass
    return found


def test_a_forged_verdict_and_a_killed_supervisor_never_pass_and_leave_no_process():
    marker_a, marker_b = (f"61.{random.randrange(10**6):06d}" for _ in range(2))  # unique to this run
    try:
        assert score(FORGE % (marker_a, marker_b)) == 0.0
    except SandboxLimitError:
        pass  # a verdict that cannot be trusted: no score, which reward_on_error handles
    assert sleepers(marker_a) == [] and sleepers(marker_b) == []  # grandchildren in new sessions are gone too


SETNS = """import ctypes, os, socket
libc = ctypes.CDLL(None, use_errno=True)
for pid in ['TRAINER', '1'] + [p for p in os.listdir('/proc') if p.isdigit()]:
    try:
        fd = os.open(f'/proc/{pid}/ns/net', os.O_RDONLY)
    except OSError:
        continue
    if libc.setns(fd, 0x40000000) == 0:  # the trainer's network namespace, where 127.0.0.1 is its loopback
        break
reached = False
try:
    socket.create_connection(('127.0.0.1', PORT), timeout=1).close()
    reached = True
except OSError:
    pass
"""


def test_no_way_back_into_the_trainers_network():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.setblocking(False)
        port = listener.getsockname()[1]
        assert score(SETNS.replace("PORT", str(port)).replace("TRAINER", str(os.getpid())), ["assert reached"], timeout=8) == 0.0
        with pytest.raises(BlockingIOError):  # nothing reached the listener
            listener.accept()


def test_no_secrets_and_no_files_outside_the_box(tmp_path, monkeypatch):
    token = "sk-rlpt-secret-123"
    (tmp_path / "train.py").write_text(f"API_TOKEN = {token!r}")
    trainer = subprocess.Popen(["sleep", "30"], env={"RLPT_API_TOKEN": token})  # a process with a token in its environment
    try:
        places = [f"/proc/{trainer.pid}/environ", f"/proc/{os.getpid()}/environ", str(tmp_path / "train.py"),
                  "/etc/shadow", os.path.expanduser("~/.bashrc")]
        read = ("import os\ndef text(path):\n    try:\n        return open(path, 'rb').read()\n    except OSError:\n"
                "        return b''\nprocs = [f'/proc/{p}/environ' for p in os.listdir('/proc') if p.isdigit()]\n"
                f"seen = [p for p in {places!r} + procs if {token.encode()!r} in text(p) or p in {places[3:]!r} and text(p)]\n")
        assert score(read, ["assert seen"]) == 0.0
    finally:
        trainer.kill()
        trainer.wait()
    monkeypatch.setenv("RLPT_API_TOKEN", token)  # the trainer's environment is not the sandbox's
    assert score("import os\nseen = dict(os.environ)\n", ["assert 'PATH' in seen", "assert 'RLPT_API_TOKEN' in seen"]) == 0.5
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    code = f"import os, shutil\nfor p in [{str(victim)!r}, {str(tmp_path)!r}]:\n    try:\n        os.remove(p)\n" \
           "    except OSError:\n        shutil.rmtree(p, ignore_errors=True)\n"
    score(code, ["assert True"])
    assert victim.read_text() == "keep me"


def test_output_flooding_the_parents_pipes_is_capped():
    """150 MB into each stdout/stderr the code can reach (its own and its parent's) does not
    reach the trainer's memory."""
    flood = ("import os\nblock = b'x' * (1 << 20)\n"
             "for pid in [os.getppid(), os.getpid()]:\n"
             "    for fd in (1, 2):\n        try:\n            out = os.open(f'/proc/{pid}/fd/{fd}', os.O_WRONLY)\n"
             "            for _ in range(150):\n                os.write(out, block)\n        except OSError:\n            pass\n"
             "def add(a, b): return a + b\n")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        score(flood, timeout=20)
    except SandboxLimitError:
        pass
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 100 << 10  # KiB: under 100 MB more


def test_total_bytes_written_are_limited():
    code = ("written = 0\nfor i in range(30):\n    try:\n        with open(f'f{i}', 'wb') as f:\n"
            "            f.write(b'x' * (2 << 20))\n        written += 2 << 20\n    except OSError:\n        break\n")
    assert score(code, ["assert written <= 16 << 20", "assert written >= 8 << 20"], max_file_mb=16) == 1.0


def test_the_process_count_is_limited():
    """A bounded fork bomb: 120 sleeping children asked for, at most max_processes (default 32) granted."""
    code = ("import os, time\nforked = 0\nfor _ in range(120):\n    try:\n        pid = os.fork()\n"
            "    except OSError:\n        break\n    if pid == 0:\n        time.sleep(3)\n        os._exit(0)\n    forked += 1\n")
    assert score(code, ["assert 0 < forked < 32"], timeout=8) == 1.0
    assert score(code, ["assert 0 < forked < 8"], max_processes=8, timeout=8) == 1.0


def test_each_completion_runs_once_under_reward_on_error_zero():
    runs = []

    class Counting(CodeExecutionReward):
        def _run(self, key):
            runs.append(key[0])
            return super()._run(key)

    completions = ["def add(a, b): return a + b", "while True:\n    pass", "def add(a, b): return abs(a) + b"]
    zero = RewardFunctions([Counting(timeout=2, max_workers=2)], on_error="zero")
    scores, failures = zero(["q"] * 3, completions, {"tests": [ADD_TESTS] * 3})
    assert scores[:, 0].tolist() == pytest.approx([1.0, 0.0, 2 / 3]) and failures == {"code": 1}
    assert sorted(runs) == sorted(completions)
