"""The warm interpreter (mistill.warm): a forked command computes and reports what a cold one does."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from mistill import warm
from mistill.cli import main
from tests.conftest import PYTEST_OWN

REPO = Path(__file__).resolve().parents[1]


def own(**changes) -> dict:
    """A server's facts for comparing callers with: this process's, changed as given."""
    return {**warm.request_of([]), **changes}


# --- who may be served -----------------------------------------------------------------------

def test_a_caller_like_the_server_is_served():
    assert warm.incompatibility(warm.request_of(["repro", "check"]), own()) is None


def test_where_a_command_runs_does_not_matter():
    request = warm.request_of([])
    request["env"] = {**request["env"], "DVC_STAGE": "EV-mistill@qwen-bf16-0", "DVC_ROOT": "/elsewhere",
                      "PATH": "/another/bin", warm.SOCKET_ENV: "/tmp/x.sock",
                      "PS1": "(.venv) $ "}   # an activated virtual environment's prompt, which DVC's shell resets
    request["cwd"] = "/elsewhere"
    request["sys_path"] = ["/another/bin", *request["sys_path"][1:]]   # a console script's own directory
    assert warm.incompatibility(request, own()) is None


def test_an_environment_a_module_may_read_at_import_is_refused():
    request = warm.request_of([])
    request["env"] = {**request["env"], "OMP_NUM_THREADS": "7"}
    server = own(env={k: v for k, v in request["env"].items() if k != "OMP_NUM_THREADS"})
    assert warm.incompatibility(request, server) == "environment differs in OMP_NUM_THREADS"


def test_a_value_the_server_s_imports_set_may_come_back_from_its_own_forks():
    """transformers sets TORCHINDUCTOR_CACHE_DIR at import: a fork's children (a family stage's items) carry it,
    and are served; another value of it is still refused."""
    request = warm.request_of([])
    before = {k: v for k, v in request["env"].items() if k != "TORCHINDUCTOR_CACHE_DIR"}
    request["env"] = {**before, "TORCHINDUCTOR_CACHE_DIR": "/tmp/inductor"}
    server = own(env=before)
    assert warm.incompatibility(request, server, {"TORCHINDUCTOR_CACHE_DIR": "/tmp/inductor"}) is None
    assert warm.incompatibility(request, server) == "environment differs in TORCHINDUCTOR_CACHE_DIR"
    request["env"]["TORCHINDUCTOR_CACHE_DIR"] = "/elsewhere"
    assert warm.incompatibility(request, server, {"TORCHINDUCTOR_CACHE_DIR": "/tmp/inductor"}) == (
        "environment differs in TORCHINDUCTOR_CACHE_DIR")


def test_another_interpreter_or_module_path_is_refused():
    assert "another interpreter" in warm.incompatibility(warm.request_of([]), own(executable="/usr/bin/python9"))
    path = warm.request_of([])["sys_path"]
    assert warm.incompatibility(warm.request_of([]), own(sys_path=[*path, "/extra"])) == "another module path"


def test_the_server_imports_every_module_of_the_package():
    names = warm.own_modules()
    assert {"mistill.cli", "mistill.evaluate.variants", "mistill.repro.registry", "mistill.world.shortlist"} <= set(names)
    assert all(name.startswith("mistill.") for name in names)


# --- a command's exit, as a new interpreter would have it --------------------------------------

@pytest.mark.parametrize(("outcome", "status"), [(0, 0), (3, 3), (None, 0)])
def test_a_returned_status_is_the_exit_status(outcome, status):
    assert warm.exit_status(lambda argv: outcome, []) == status


def test_system_exit_and_errors_as_the_interpreter_reports_them(capsys):
    def exits(code):
        def run(argv):
            raise SystemExit(code)
        return run

    assert warm.exit_status(exits(4), []) == 4
    assert warm.exit_status(exits(None), []) == 0
    assert warm.exit_status(exits("bad input"), []) == 1
    assert "bad input" in capsys.readouterr().err

    def fails(argv):
        raise ValueError("boom")

    assert warm.exit_status(fails, []) == 1
    assert "ValueError: boom" in capsys.readouterr().err

    def interrupted(argv):
        raise KeyboardInterrupt

    assert warm.exit_status(interrupted, []) == -signal.SIGINT


def test_exit_handlers_run_before_the_status_is_reported(tmp_path, monkeypatch):
    import atexit

    ran = tmp_path / "ran"
    monkeypatch.setattr(atexit, "_run_exitfuncs", lambda: ran.write_text("yes"))
    assert warm.exit_status(lambda argv: 0, []) == 0
    assert ran.read_text() == "yes"


# --- a real server -------------------------------------------------------------------------------

def tree_digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def module_path(env: dict[str, str]) -> list[str]:
    """A new interpreter's module path after its first entry: a caller in this process must show the
    server's (pytest extends its own)."""
    shown = subprocess.run([sys.executable, "-c", "import json, sys; print(json.dumps(sys.path[1:]))"],
                           env=env, cwd=REPO, capture_output=True, text=True, check=True).stdout
    return json.loads(shown)


def caller_env(env=os.environ) -> dict[str, str]:
    """An environment (by default this process's) as a caller shows it: without pytest's own variable."""
    return {k: v for k, v in env.items() if k != PYTEST_OWN}


@dataclass(frozen=True)
class Server:
    """A running server: its socket, its pid, the environment it started with and a new interpreter's
    module path after the first entry under that environment."""

    socket: str
    pid: int
    env: dict[str, str]
    path: list[str]


@contextmanager
def started(argv: list[str], socket: Path):
    """A server process (its argv after the interpreter, then the socket), once it says ready; ended
    afterwards. It starts with this process's environment as it is now: earlier tests may have changed
    it, and the callers below take the same one."""
    env = caller_env()
    proc = subprocess.Popen([sys.executable, *argv, str(socket)], env=env, cwd=REPO, stdout=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        assert proc.stdout.readline() == warm.READY
        yield Server(str(socket), proc.pid, env, module_path(env))
    finally:
        proc.terminate()
        proc.wait()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A warm server started from this environment."""
    with started(["-m", "mistill.warm_server"], tmp_path_factory.mktemp("warm") / "stages.sock") as running:
        yield running


def as_a_caller_of(server: Server, monkeypatch) -> None:
    """This process as a caller the server accepts: its environment exactly the server's plus the
    socket, the module path a new interpreter would have, the repository as its working directory."""
    for name in set(os.environ) - set(server.env):
        monkeypatch.delenv(name)
    for name, value in server.env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv(warm.SOCKET_ENV, server.socket)
    monkeypatch.setattr(sys, "path", [sys.path[0], *server.path])
    monkeypatch.chdir(REPO)


def delegated(argv: list[str], monkeypatch):
    """warm.delegate from this process, as a caller: pytest names the running test in the environment
    again when a test's body starts, after the fixtures have run."""
    monkeypatch.delenv(PYTEST_OWN, raising=False)
    return warm.delegate(argv)


@pytest.fixture
def served(server, monkeypatch) -> Server:
    as_a_caller_of(server, monkeypatch)
    return server


def test_no_server_means_the_command_runs_here(monkeypatch, tmp_path):
    monkeypatch.delenv(warm.SOCKET_ENV, raising=False)
    assert warm.delegate(["repro", "registry-md", "--check"]) is None
    monkeypatch.setenv(warm.SOCKET_ENV, str(tmp_path / "nobody.sock"))
    assert warm.delegate(["repro", "registry-md", "--check"]) is None


def test_a_forked_command_prints_and_exits_as_a_cold_one(served, capfd, monkeypatch):
    argv = ["repro", "read", "R-NONE"]
    assert delegated(argv, monkeypatch) == 2
    forked = capfd.readouterr()
    assert main(argv) == 2
    cold = capfd.readouterr()
    assert forked.err == cold.err
    assert "mistill: error:" in forked.err


def test_a_changed_environment_runs_cold(served, monkeypatch, capfd):
    monkeypatch.setenv("OMP_NUM_THREADS", "1" if os.environ.get("OMP_NUM_THREADS") != "1" else "2")
    assert delegated(["repro", "registry-md", "--check"], monkeypatch) is None
    assert "environment differs in OMP_NUM_THREADS" in capfd.readouterr().err


MISTILL = Path(sys.executable).with_name("mistill")


@pytest.fixture(scope="module")
def world(server, tmp_path_factory) -> Path:
    """A working directory with the demo's params, inventory and notes (what the students' tokenizer reads)."""
    root = tmp_path_factory.mktemp("world")
    shutil.copy(REPO / "params.yaml", root / "params.yaml")
    for command in ("inventory", "notes"):
        subprocess.run([str(MISTILL), "world", command], env=server.env, cwd=root, check=True, capture_output=True)
    return root


def init_students(world: Path, out: Path, env: dict[str, str]) -> subprocess.Popen:
    """Seeded random initialisation of the demo students: torch work of a few seconds."""
    return subprocess.Popen([str(MISTILL), "models", "init-students", "--out-dir", str(out)], env=caller_env(env),
                            cwd=world,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def test_forked_torch_work_writes_the_bytes_a_cold_process_writes(served, world, tmp_path):
    env = dict(os.environ)
    for name, run_env in (("warm", env), ("cold", {k: v for k, v in env.items() if k != warm.SOCKET_ENV})):
        proc = init_students(world, tmp_path / name, run_env)
        status, err = proc.wait(), proc.stderr.read()
        assert status == 0, err
        assert "running it cold" not in err
    warm_files, cold_files = tree_digest(tmp_path / "warm"), tree_digest(tmp_path / "cold")
    assert warm_files and warm_files == cold_files


def fork_of(server_pid: int, timeout: float = 30.0) -> int:
    """The pid of the server's (only) fork, once it has one."""
    children = Path(f"/proc/{server_pid}/task/{server_pid}/children")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = children.read_text().split()
        if pids:
            return int(pids[0])
        time.sleep(0.01)
    raise AssertionError("the server forked nothing")


def gone(pid: int, timeout: float = 30.0) -> bool:
    """Whether `pid` has ended and been reaped (no /proc entry) within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not Path(f"/proc/{pid}").exists():
            return True
        time.sleep(0.01)
    return False


linux_only = pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads /proc for the server's forks")


@linux_only
@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM])
def test_a_fork_that_dies_by_a_signal_takes_its_caller_with_it(served, world, tmp_path, signum):
    caller = init_students(world, tmp_path / "out", dict(os.environ))
    os.kill(fork_of(served.pid), signum)
    assert caller.wait(timeout=60) == -signum


@linux_only
def test_ctrl_c_reaches_the_fork_through_its_caller(served, world, tmp_path):
    caller = init_students(world, tmp_path / "out", dict(os.environ))
    fork = fork_of(served.pid)
    time.sleep(0.5)   # the caller learns its fork's pid just after the fork starts
    caller.send_signal(signal.SIGINT)
    assert caller.wait(timeout=60) == -signal.SIGINT
    assert "KeyboardInterrupt" in caller.stderr.read()
    assert gone(fork)


@linux_only
def test_a_fork_whose_caller_was_killed_ends(served, world, tmp_path):
    caller = init_students(world, tmp_path / "out", dict(os.environ))
    fork = fork_of(served.pid)
    caller.kill()
    caller.wait()
    assert gone(fork)


EXEC_SERVER = """
import os, sys
from mistill.warm import READY, WarmServer

before = dict(os.environ)
# a command that replaces its process, as mistill.shard.relaunch does with torchrun
server = WarmServer(sys.argv[1], run=lambda argv: os.execv("/bin/sh", ["sh", "-c", argv[0]]),
                    env_before_imports=before)
sys.stdout.buffer.write(READY)
sys.stdout.flush()
server.serve_forever()
"""


@linux_only
def test_a_command_that_replaces_its_process_reports_the_new_program_s_status(tmp_path, monkeypatch):
    with started(["-c", EXEC_SERVER], tmp_path / "exec.sock") as running:
        as_a_caller_of(running, monkeypatch)
        assert delegated(["exit 7"], monkeypatch) == 7
        assert delegated(["exit 0"], monkeypatch) == 0
