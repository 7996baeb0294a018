"""The fork server a :class:`~numcheck.properties.distributed.pool.pool.DistPool` starts its ranks from, so a pool's start
costs a fork instead of a Python start and a torch import per rank.

One zygote runs per pool-owning process (a pytest worker), started as its own program, ``python -m
numcheck.properties.distributed.pool.zygote ADDRESS`` (the key in ``NUMCHECK_DIST_AUTHKEY``), not through multiprocessing, so no
``__main__`` of the owner is imported in it. It imports torch, torch.distributed and :func:`preload_modules` once,
says ``ready``, and then answers its owner's requests, one pickled tuple each:

- ``("spawn", argvs, sys_path, environ)``: fork one rank per argv (``RANK WORLD_SIZE BACKEND STORE ADDRESS``, what
  :func:`numcheck.properties.distributed.pool.worker.main` takes); each child takes the owner's current ``sys.path`` and
  environment, runs the worker and exits with ``os._exit``; the reply is ``("ok", [pid, ...])``.
- ``("poll", [pid, ...])``: ``("ok", {pid: exit code or None while it runs})``; codes as ``subprocess.Popen``'s
  ``returncode`` (−N for signal N). The zygote reaps its children itself.

It starts no helper thread or process and never initialises CUDA or a process group before forking (a forked child
inherits the locks of threads it does not have): OpenMP is held to one thread, inductor's compile workers are off
(:func:`main`); the ranks initialise the rest after the fork. When its owner's connection
closes (the owner exited or died), it kills every child it forked that still runs, and exits.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import pickle
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge, wait
from typing import Any

AUTHKEY_ENV = "NUMCHECK_DIST_AUTHKEY"
#: ``NUMCHECK_DIST_PRELOAD``: a comma-separated module list replacing the warm list (a user's override).
PRELOAD_ENV = "NUMCHECK_DIST_PRELOAD"
#: How the owner hands its warm list (:func:`warm`) to the zygote it starts.
WARM_ENV = "NUMCHECK_DIST_WARM"
#: Imported once in the zygote, so that no rank imports them again: the pool's rank-side module, and what each
#: family that runs on the pool adds with :func:`warm` when it is imported (its rank-side modules and, for
#: vocabulary-parallel linear+CE, megatron-core's entry points: their import alone is ~5 s of CPU per process).
_WARM: list[str] = ["numcheck.properties.distributed.pool.worker"]
#: Seconds between reaping passes while no request comes.
POLL_S = 0.5


def warm(*modules: str) -> None:
    """Have every zygote this process starts from now on import ``modules`` before it forks (an optimisation: a
    module missing there is imported by the rank that needs it)."""
    _WARM.extend(m for m in modules if m not in _WARM)


def preload_modules() -> tuple[str, ...]:
    """The modules the zygote imports before forking: ``NUMCHECK_DIST_PRELOAD``'s list, else the owner's warm
    list (:func:`warm`), else the pool's own rank-side module."""
    raw = os.environ.get(PRELOAD_ENV, os.environ.get(WARM_ENV))
    return tuple(m.strip() for m in raw.split(",") if m.strip()) if raw is not None else tuple(_WARM)


def preload(modules: tuple[str, ...]) -> list[str]:
    """Import each module whose top-level package is installed; a module that is missing or fails to import is
    left to the ranks (which import it themselves when a call needs it, and report its error with that call).
    Returns the modules left out, with why, for the ready message."""
    left = []
    for name in modules:
        if importlib.util.find_spec(name.split(".")[0]) is None:
            left.append(f"{name}: not installed")
            continue
        try:
            with warnings.catch_warnings():  # an import's warnings (megatron's about missing TE/apex) are not ours
                warnings.simplefilter("ignore")
                importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - a preload is an optimisation; the rank will raise it in its call
            left.append(f"{name}: {type(exc).__name__}: {exc}")
    return left


def _reap(children: dict[int, int | None]) -> None:
    """Record the exit code of every child that ended."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        children[pid] = os.waitstatus_to_exitcode(status)


def _fork_rank(argv: list[str], sys_path: list[str], environ: dict[str, str], owner: Connection) -> int:
    """Fork one rank; the child runs the worker on ``argv`` and never returns."""
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        owner.close()  # the zygote's link to its owner is not the rank's
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        sys.path[:] = sys_path
        os.environ.clear()
        os.environ.update(environ)
        from numcheck.properties.distributed.pool import worker as dist_worker

        dist_worker.main(argv)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - the rank's own failure was sent to its pool; this is the exit
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def serve(owner: Connection) -> None:
    """Answer the owner's requests (module docstring) until its connection closes; then kill the live children."""
    children: dict[int, int | None] = {}
    while True:
        _reap(children)
        if not wait([owner], timeout=POLL_S):
            continue
        try:
            op, *args = pickle.loads(owner.recv_bytes())
        except (EOFError, OSError):
            break
        try:
            if op == "spawn":
                argvs, sys_path, environ = args
                pids = [_fork_rank(a, sys_path, environ, owner) for a in argvs]
                children.update({p: None for p in pids})
                reply: tuple[str, Any] = ("ok", pids)
            elif op == "poll":
                _reap(children)
                reply = ("ok", {p: children.get(p) for p in args[0]})
            else:
                reply = ("err", f"unknown request {op!r}")
        except Exception:  # noqa: BLE001 - a request that fails is answered with why
            reply = ("err", traceback.format_exc())
        owner.send_bytes(pickle.dumps(reply))
    _reap(children)
    for pid, code in children.items():
        if code is None:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def main(argv: list[str]) -> None:
    """Entry point: ``ADDRESS`` (a Unix socket the owner listens on)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(argv[0])
    owner = Connection(sock.detach())
    answer_challenge(owner, bytes.fromhex(os.environ[AUTHKEY_ENV]))
    # No helper threads or children before a fork: a forked rank inherits a held lock of a thread that does not exist
    # in it. OpenMP's pool (libgomp reads OMP_NUM_THREADS when torch loads it; an op run by an import would start the
    # pool, and under torch 2.6 a forked rank then hung in its first parallel op) and inductor's compile-worker pool
    # (torch 2.6 starts one when megatron-core is imported). The ranks run one intra-op thread anyway
    # (dist_worker.serve) and never compile.
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = "1"
    os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = "1"
    try:
        import torch  # noqa: F401 - imported once here, inherited by every rank
        import torch.distributed  # noqa: F401

        left = preload(preload_modules())
    except BaseException:  # noqa: BLE001 - a zygote that cannot start says why
        owner.send_bytes(pickle.dumps(("err", traceback.format_exc())))
        raise
    owner.send_bytes(pickle.dumps(("ready", left)))
    serve(owner)


# -- the owner's side ---------------------------------------------------------------------------------------------


class ZygoteError(RuntimeError):
    """The zygote could not be started or did not answer a request (the text says which and why)."""


class ForkedRank:
    """A rank forked by a :class:`Zygote`, with the part of ``subprocess.Popen``'s interface the pool uses
    (``pid``, ``poll``, ``wait``, ``kill``); its exit code comes from the zygote, its parent."""

    def __init__(self, zygote: "Zygote", pid: int) -> None:
        self.zygote, self.pid = zygote, pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        """The exit code, or ``None`` while the rank runs."""
        if self.returncode is None:
            self.returncode = self.zygote.exit_codes([self.pid]).get(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """The exit code once the rank ended; ``subprocess.TimeoutExpired`` after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"rank pid {self.pid}", timeout)
            time.sleep(0.02)
        return code

    def kill(self) -> None:
        """SIGKILL the rank (nothing if it already ended)."""
        if self.returncode is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


class Zygote:
    """The owner's handle on its zygote (module docstring): :meth:`get` starts one per process on first use."""

    _by_owner: dict[int, "Zygote"] = {}

    def __init__(self, env: dict[str, str], startup_timeout_s: float) -> None:
        self.timeout_s = startup_timeout_s
        self._dir = tempfile.mkdtemp(prefix="numcheck-dist-zygote-")
        key = secrets.token_hex(16)
        address = os.path.join(self._dir, "zygote.sock")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
            listener.bind(address)
            listener.listen(1)
            listener.settimeout(startup_timeout_s)
            self.process = subprocess.Popen(
                [sys.executable, "-m", "numcheck.properties.distributed.pool.zygote", address],
                env={**env, AUTHKEY_ENV: key, WARM_ENV: ",".join(_WARM)},
                stdin=subprocess.DEVNULL,
            )
            try:
                sock, _ = listener.accept()
            except OSError as exc:
                self.close()
                raise ZygoteError(
                    f"the rank zygote did not connect within {startup_timeout_s:g} s ({exc!r}); "
                    f"exit code {self.process.poll()}"
                ) from exc
        sock.setblocking(True)
        self.conn = Connection(sock.detach())
        deliver_challenge(self.conn, bytes.fromhex(key))
        status, self.left_out = self._reply("start-up", startup_timeout_s)
        if status != "ready":
            self.close()
            raise ZygoteError(f"the rank zygote failed to start:\n{self.left_out}")

    @classmethod
    def get(cls, env: dict[str, str], startup_timeout_s: float) -> "Zygote":
        """This process's live zygote, started (with ``env``) on first use or after it died."""
        z = cls._by_owner.get(os.getpid())
        if z is None or z.process.poll() is not None:
            if z is not None:
                z.close()
            z = cls._by_owner[os.getpid()] = Zygote(env, startup_timeout_s)
        return z

    def _reply(self, what: str, timeout_s: float) -> tuple[str, Any]:
        if not self.conn.poll(timeout_s):
            raise ZygoteError(f"the rank zygote did not answer {what} within {timeout_s:g} s")
        try:
            return pickle.loads(self.conn.recv_bytes())
        except (EOFError, OSError) as exc:
            raise ZygoteError(f"the rank zygote died during {what} (exit code {self.process.poll()})") from exc

    def _request(self, what: str, *msg: Any) -> Any:
        try:
            self.conn.send_bytes(pickle.dumps(msg))
        except OSError as exc:
            raise ZygoteError(f"the rank zygote is gone ({exc!r}; exit code {self.process.poll()})") from exc
        status, value = self._reply(what, self.timeout_s)
        if status != "ok":
            raise ZygoteError(f"the rank zygote failed {what}:\n{value}")
        return value

    def spawn(self, argvs: list[list[str]], environ: dict[str, str]) -> list[ForkedRank]:
        """One forked rank per argv, with this process's ``sys.path`` and ``environ``."""
        pids = self._request("spawn", "spawn", argvs, list(sys.path), environ)
        return [ForkedRank(self, p) for p in pids]

    def exit_codes(self, pids: list[int]) -> dict[int, int | None]:
        """Each pid's exit code (``None`` while it runs); a zygote that is gone answers ``-9`` for ranks no longer
        alive and ``None`` for the others."""
        try:
            return self._request("poll", "poll", pids)
        except ZygoteError:
            return {p: None if _alive(p) else -9 for p in pids}

    def close(self) -> None:
        """Stop the zygote (it kills the ranks it forked that still run) and remove its folder."""
        conn = getattr(self, "conn", None)
        if conn is not None:
            conn.close()
        else:
            self.process.kill()
        try:
            self.process.wait(10.0)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        shutil.rmtree(self._dir, ignore_errors=True)

    @classmethod
    def close_all(cls) -> None:
        """Stop this process's zygote (registered with ``atexit`` by the harness)."""
        z = cls._by_owner.pop(os.getpid(), None)
        if z is not None:
            z.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


if __name__ == "__main__":
    main(sys.argv[1:])
