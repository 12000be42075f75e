"""A warm interpreter for stage commands: torch and transformers imported once per `dvc repro`.

Every DVC stage is a new `mistill` process, and before it computes anything it imports torch,
transformers' model classes, scipy and statsmodels: 3-5 s on two cores, longer than many of the
demo's stages compute. `mistill repro warm CMD...` (what `nox -s repro` runs `dvc repro` under)
starts one server process that imports them and then waits on a Unix socket. Each `mistill` that
finds the socket in its environment (`MISTILL_WARM_SOCKET`) sends its arguments, working directory,
environment and its own stdin, stdout and stderr (the descriptors themselves) to the server, which
forks; the fork becomes that command, computes with the already imported modules, and exits. The
server reports the fork's exit status, and the `mistill` DVC started exits with it.

What a stage computes does not change: the fork runs the same `mistill.cli.main` on the same
arguments, in the caller's directory and environment, writing to the caller's descriptors, with
torch's random state and thread pool as untouched as in a new process (the server imports modules
and runs nothing; importing torch starts no threads, so forking after it is safe). The server
refuses a caller whose interpreter, module path or import-relevant environment differs from its
own (a module read those at import time), and that caller runs cold, in its own process, as it
would with no server at all; so does any `mistill` when the server cannot be reached.

Signals keep their meaning: the caller forwards SIGINT, SIGTERM and SIGHUP to its fork, the server
ends a fork whose caller has gone (DVC killed), and a fork that dies by a signal makes its caller
die by the same signal. A command that replaces its process (`mistill.shard.relaunch` under
torchrun) keeps working: the server reports the status of whatever runs under the fork's pid.
"""

from __future__ import annotations

import atexit
import gc
import importlib
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

SOCKET_ENV = "MISTILL_WARM_SOCKET"
# What the server imports before it forks: the modules whose import dominates a stage's start.
WARM_MODULES = (
    "torch",
    "transformers",
    "transformers.modeling_utils",
    "transformers.generation",
    "transformers.models.auto.modeling_auto",
    "safetensors.torch",
    "tokenizers",
    "scipy.stats",
    "statsmodels.stats.multitest",
    "sacrebleu",
    "jinja2",
)
# Environment variables that say where a command runs, not how a module imported: a caller may
# differ from the server in these and still use it (DVC sets the first two; it also edits PATH,
# which cannot matter here because the interpreter itself is compared; the shell's prompts differ
# under an activated virtual environment, whose `activate` exports PS1).
WHERE_NOT_HOW = frozenset({"DVC_ROOT", "DVC_STAGE", "PATH", "PWD", "OLDPWD", "SHLVL", "_", "PS1", "PS2", "PS4"})
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
READY = b"ready\n"
RECEIVE_LIMIT = 1 << 20   # a request: arguments, directory and environment, as one JSON line


def model_modules() -> list[str]:
    """transformers' modeling modules of the architectures the profiles load (Qwen3, SmolLM3, Qwen2)."""
    from mistill.models.architectures import TOKENIZER_FAMILY

    return [f"transformers.models.{family}.modeling_{family}" for family in TOKENIZER_FAMILY]


def own_modules() -> list[str]:
    """Every module of this package. A stage's command imports its share of them (its command group, the
    library it calls, a reader's analyses): about a second of a two-core fork's time, before DVC's next stage
    can start, that the server pays once. Their imports only define (constants, compiled patterns); none
    reads params, the environment or the working directory."""
    import pkgutil

    import mistill

    return [m.name for m in pkgutil.walk_packages(mistill.__path__, "mistill.")]


# --- the request a caller sends ------------------------------------------------------------

def request_of(argv: Sequence[str]) -> dict[str, Any]:
    """What the fork needs to become this command."""
    return {"argv": list(argv), "argv0": sys.argv[0], "cwd": os.getcwd(), "env": dict(os.environ),
            "executable": sys.executable, "sys_path": list(sys.path)}


def incompatibility(request: dict[str, Any], own: dict[str, Any],
                    set_by_imports: dict[str, str] | None = None) -> str | None:
    """Why the server (whose own request-shaped facts are `own`) must not run `request`; None if it may.

    The interpreter and the module path must be the server's; so must every environment variable
    a module may have read at import time, that is every one outside `WHERE_NOT_HOW`. A variable the
    server's imports set (`set_by_imports`) may also carry the value they set: a caller started by one of the
    server's own forks (a family stage's items, mistill.repro.families) inherits it.
    """
    if request.get("executable") != own["executable"]:
        return f"another interpreter ({request.get('executable')})"
    # the first entry is the started script's directory (the server is started with -m): only the rest
    # decides where modules come from
    if request.get("sys_path", [None])[1:] != own["sys_path"][1:]:
        return "another module path"
    theirs, ours = request.get("env", {}), own["env"]
    imported = set_by_imports or {}
    differ = sorted(k for k in (theirs.keys() | ours.keys()) - WHERE_NOT_HOW - {SOCKET_ENV}
                    if theirs.get(k) != ours.get(k) and not (k in imported and theirs.get(k) == imported[k]))
    if differ:
        shown = ", ".join(differ[:5]) + (f" and {len(differ) - 5} more" if len(differ) > 5 else "")
        return f"environment differs in {shown}"
    return None


def send(sock: socket.socket, message: dict[str, Any]) -> None:
    sock.sendall(json.dumps(message).encode() + b"\n")


def receive(stream) -> dict[str, Any] | None:
    """The next JSON line from a socket's file, or None once the other side has closed it."""
    line = stream.readline()
    return json.loads(line) if line else None


# --- the caller: a `mistill` process DVC started ----------------------------------------------

def delegate(argv: Sequence[str]) -> int | None:
    """Run this command in a fork of the warm server; its exit status, or None to run it here.

    None when no server is named or reachable, or when the server refuses this caller (its reason
    goes to stderr, since the command then pays the import time the server was meant to save).
    """
    path = os.environ.get(SOCKET_ENV)
    if not path or not hasattr(socket, "send_fds"):
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
        socket.send_fds(sock, [json.dumps(request_of(argv)).encode() + b"\n"], [0, 1, 2])
    except OSError:
        sock.close()
        return None
    with sock, sock.makefile("rb") as replies:
        reply = receive(replies)
        if reply is None or "cold" in reply:
            if reply:
                print(f"mistill: the warm interpreter cannot run this command ({reply['cold']}); "
                      f"running it cold", file=sys.stderr)
            return None
        fork = reply["pid"]
        for signum in FORWARDED:
            signal.signal(signum, lambda signum, _frame: os.kill(fork, signum))
        reply = receive(replies)
    if reply is None:
        print("mistill: the warm interpreter went away before the command ended", file=sys.stderr)
        return 1
    status = reply["exit"]
    if status < 0:   # the fork died by a signal: so does its caller, as a cold command would have
        die_by(-status)
    return status


def die_by(signum: int) -> None:
    """End this process by `signum`, whatever handler it had for it."""
    if signum not in (signal.SIGKILL, signal.SIGSTOP):   # the two whose handling cannot be changed
        signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


# --- the server ----------------------------------------------------------------------------

class WarmServer:
    """Accepts callers on a Unix socket, forks one child per command, reports each child's status."""

    def __init__(self, path: str, run: Callable[[list[str]], int], env_before_imports: dict[str, str]):
        self.run = run
        # callers are compared with the environment the modules were imported under; what the imports
        # themselves set (transformers sets TORCHINDUCTOR_CACHE_DIR) a cold command would have set too
        self.own = {**request_of([]), "env": env_before_imports}
        self.set_by_imports = {k: v for k, v in os.environ.items() if env_before_imports.get(k) != v}
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        self.listener.listen(64)
        self.children: dict[int, socket.socket] = {}   # fork pid -> its caller's connection
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.listener, selectors.EVENT_READ)
        # SIGCHLD wakes the loop through a pipe, so a finished fork is reported at once
        self.wake_read, self.wake_write = os.pipe()
        os.set_blocking(self.wake_read, False)
        os.set_blocking(self.wake_write, False)
        self.selector.register(self.wake_read, selectors.EVENT_READ)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.set_wakeup_fd(self.wake_write)

    def serve_forever(self) -> None:
        while True:
            for key, _ in self.selector.select():
                if key.fileobj is self.listener:
                    self.accept()
                elif key.fileobj == self.wake_read:
                    try:
                        os.read(self.wake_read, 4096)   # the wake-up bytes; any number of SIGCHLDs
                    except BlockingIOError:
                        pass
                    self.reap()
                else:   # a caller's connection became readable: it hung up, so its fork must end
                    self.selector.unregister(key.fileobj)
                    try:
                        os.kill(key.data, signal.SIGTERM)
                    except ProcessLookupError:
                        pass

    def accept(self) -> None:
        conn, _ = self.listener.accept()
        conn.settimeout(30)
        fds: list[int] = []
        try:
            data, fds, _, _ = socket.recv_fds(conn, RECEIVE_LIMIT, 3)
            while not data.endswith(b"\n"):
                more = conn.recv(RECEIVE_LIMIT)
                if not more:
                    raise OSError("caller closed its connection mid-request")
                data += more
            request = json.loads(data)
            reason = (incompatibility(request, self.own, self.set_by_imports) if len(fds) == 3
                      else "no stdin, stdout and stderr")
        except (OSError, ValueError) as err:
            for fd in fds:
                os.close(fd)
            conn.close()
            print(f"mistill warm: dropped a request ({err})", file=sys.stderr)
            return
        if reason:
            self.refuse(conn, fds, reason)
            return
        pid = os.fork()
        if pid == 0:
            self.become(request, fds)   # never returns
        for fd in fds:
            os.close(fd)
        self.children[pid] = conn
        send(conn, {"pid": pid})
        self.selector.register(conn, selectors.EVENT_READ, data=pid)

    @staticmethod
    def refuse(conn: socket.socket, fds: list[int], reason: str) -> None:
        for fd in fds:
            os.close(fd)
        with conn:
            send(conn, {"cold": reason})

    def reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.children.pop(pid, None)
            if conn is None:
                continue
            if conn.fileno() in self.selector.get_map():
                self.selector.unregister(conn)
            try:
                send(conn, {"exit": os.waitstatus_to_exitcode(status)})
            except OSError:
                pass   # the caller is gone
            conn.close()

    def become(self, request: dict[str, Any], fds: list[int]) -> None:
        """In the fork: drop the server's state, take the caller's place, run the command, exit."""
        signal.set_wakeup_fd(-1)
        for signum, action in ((signal.SIGCHLD, signal.SIG_DFL), (signal.SIGTERM, signal.SIG_DFL),
                               (signal.SIGHUP, signal.SIG_DFL), (signal.SIGINT, signal.default_int_handler)):
            signal.signal(signum, action)
        self.selector.close()
        self.listener.close()
        for conn in self.children.values():
            conn.close()
        os.close(self.wake_read)
        os.close(self.wake_write)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        os.environ.update(self.set_by_imports)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        sys.stdout.reconfigure(line_buffering=sys.stdout.isatty())   # as a new process would set it
        sys.argv = [request["argv0"], *request["argv"]]
        sys.path[:] = request["sys_path"]
        status = exit_status(self.run, request["argv"])
        if status < 0:
            die_by(-status)
        os._exit(status)


def exit_status(run: Callable[[list[str]], int], argv: list[str]) -> int:
    """Run a command as a new interpreter would and return its exit status, after the exit handlers.

    An uncaught error prints its traceback and gives 1, `SystemExit` gives its code (a message is
    printed and gives 1), and Ctrl-C gives -SIGINT: the interpreter then dies by that signal.
    """
    try:
        status = run(argv)
    except SystemExit as done:
        status = done.code
        if status is not None and not isinstance(status, int):
            print(status, file=sys.stderr)
            status = 1
    except KeyboardInterrupt:
        traceback.print_exc()
        status = -signal.SIGINT
    except BaseException:  # noqa: BLE001 - what the interpreter prints for any uncaught error
        sys.excepthook(*sys.exc_info())
        status = 1
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    return int(status or 0)


def serve(path: str, run: Callable[[list[str]], int]) -> None:
    """The server's process (`mistill.warm_server`): import the heavy modules, say ready on stdout, serve `run`
    (the command line's entry point) until killed."""
    env_before_imports = dict(os.environ)
    for name in (*WARM_MODULES, *model_modules(), *own_modules()):
        try:
            importlib.import_module(name)
        except ImportError:   # an optional package this environment lacks: its commands import it cold
            pass
    # Out of the collector's sight: a fork's collections would otherwise walk (and so copy, page by
    # page) the million objects these imports made, each time, in every command.
    gc.collect()
    gc.freeze()
    server = WarmServer(path, run=run, env_before_imports=env_before_imports)
    sys.stdout.buffer.write(READY)
    sys.stdout.flush()
    devnull = os.open(os.devnull, os.O_WRONLY)   # nobody reads the server's stdout after this line
    os.dup2(devnull, 1)
    os.close(devnull)
    server.serve_forever()


def run_warm(command: Sequence[str]) -> int:
    """Run `command` (typically `dvc repro ...`) with a warm server for the `mistill` it starts."""
    if not command:
        raise ValueError("no command to run")
    if not hasattr(os, "fork") or not hasattr(socket, "send_fds"):
        return subprocess.call(list(command))   # no fork or descriptor passing here: every stage runs cold
    with tempfile.TemporaryDirectory(prefix="mistill-warm-") as directory:
        path = str(Path(directory) / "stages.sock")
        server = subprocess.Popen([sys.executable, "-m", "mistill.warm_server", path], stdout=subprocess.PIPE,
                                  stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            ready = server.stdout.readline() == READY
            env = dict(os.environ, **({SOCKET_ENV: path} if ready else {}))
            if not ready:
                print("mistill: the warm interpreter did not start; every stage runs cold", file=sys.stderr)
            child = subprocess.Popen(list(command), env=env)
            # Ctrl-C reaches the command itself (same process group); wait for it to finish its own way
            previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
            try:
                return child.wait()
            finally:
                signal.signal(signal.SIGINT, previous)
        finally:
            server.terminate()
            server.wait()
