"""A persistent pool of torch.distributed ranks for the distributed properties.

One switch picks the engine: ``backend="gloo"`` (CPU, CI) or ``"nccl"`` (CUDA, one GPU per rank; never run on
the CPU machines). :func:`default_backend` follows the suite's device (``NUMCHECK_DEVICE``), and
``NUMCHECK_DIST_BACKEND`` overrides it.

API (stable: later additions only add)::

    pool = DistPool.get(world_size, backend)          # started once per (backend, world size) per process
    results = pool.run(fn, per_rank_args, timeout_s)  # fn(rank, world_size, group, args) on every rank
    # results[r] is rank r's return value, every tensor in it detached and moved to the CPU

``fn`` must be picklable by reference (a module-level function); ``per_rank_args`` is a sequence of one
picklable argument per rank, or ``None`` (each rank gets ``None``). Each call runs on a process group made for
that call alone (``group``, over every rank) and destroyed before the next call, so no collective of one case can
pair with one of the next, and no group an impl creates lives on in the ranks: after each call the worker checks that no
other group is left.

Failures raise :class:`RankFailure`, naming the rank, the world size and backend, and what happened: the rank's
own traceback (``kind="raised"``), its death (``"died"``, with its exit code) or the call's timeout
(``"timeout"``, naming the ranks that had not answered). After a failure in which a rank did not finish (it hung
in a collective the failing rank never joined, died, or timed out), every rank is killed and the pool is
rebuilt on next use (``RankFailure.rebuilt`` is then true); a call in which every rank answered leaves the pool
standing. A rank that died is reported before the errors it caused in the others. Pools are torn down at
interpreter exit; a rank whose parent dies exits when its connection closes. Ranks are their own programs
(:mod:`numcheck.properties.distributed.pool.worker`, started with this process's ``sys.path``), not multiprocessing's
spawn children, so no ``__main__`` of the parent is imported again in them. On Linux the ranks are forked from a
per-process fork server (:mod:`numcheck.properties.distributed.pool.zygote`, started on first use; gloo only: nccl ranks,
which must initialise CUDA, always start as programs) that imported torch,
numcheck's rank-side modules and megatron-core once: a pool then starts in about a second instead of a Python
start and a torch import per rank (17–57 s for 4 ranks on the loaded 2-core machine), and a rebuild after a failure
costs the same second. ``NUMCHECK_DIST_START=exec`` (the only way elsewhere) starts each rank as a fresh program
instead. A call's round trip is about 0.06 s.

A timeout or a killed rank must fail its case once, without hypothesis shrinking through further timeouts
(each costs the full timeout plus a pool rebuild). :class:`FailureLatch` does that: inside the ``@given`` body,
``latch.run(pool, ...)`` returns ``None`` after such a failure (the body then returns, so hypothesis counts a
passing example and draws on without running anything), and outside hypothesis' loop ``latch.raise_if_failed()``
re-raises the first one with its case. A rank that raised while every other rank answered is an ordinary
failure: it propagates, and hypothesis shrinks it like any other.

Deadlines (:data:`DEFAULT_TIMEOUT_S`) are sized for a loaded 2-core machine on which world size 4
oversubscribes the cores; each worker runs torch with one intra-op thread.
"""

from __future__ import annotations

import atexit
import os
import pickle
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection, deliver_challenge, wait
from typing import Any, Callable, Literal, Sequence

from numcheck.properties.distributed.pool.worker import AUTHKEY_ENV, qualname, rank_device, to_cpu
from numcheck.properties.distributed.pool.zygote import Zygote, ZygoteError

__all__ = [
    "BACKENDS",
    "DEFAULT_TIMEOUT_S",
    "WORLD_SIZES",
    "DistPool",
    "FailureLatch",
    "RankFailure",
    "default_backend",
    "rank_device",
    "to_cpu",
    "world_size_unavailable",
]

Backend = Literal["gloo", "nccl"]
BACKENDS: tuple[str, ...] = ("gloo", "nccl")
#: The world sizes the suite runs (CI: gloo at 2 and 4; 1 is the unsharded baseline through the same path).
WORLD_SIZES: tuple[int, ...] = (1, 2, 4)
BACKEND_ENV = "NUMCHECK_DIST_BACKEND"
#: ``NUMCHECK_DIST_START``: ``fork`` (the default on Linux: ranks forked from the zygote) or ``exec``.
START_ENV = "NUMCHECK_DIST_START"

#: Seconds one call may take before it fails as a timeout. The distributed cases are small (N ≤ 40, H ≤ 24,
#: V ≤ 48): measured with two suite processes at once on the 2-core machine (load average ~5, 8 ranks at world
#: size 4 plus their owners), the worst call of every impl's accuracy and invariance examples took 0.26 s, a margin
#: of ~460x; a hung call costs this timeout once (the latch), so the margin is kept wide.
DEFAULT_TIMEOUT_S = 120.0
#: Seconds a pool's ranks are given to start and join their first process group (a cold torch import on each).
STARTUP_TIMEOUT_S = 180.0
#: Seconds the other ranks are still awaited once one rank raised (they may finish, or hang in a collective the
#: failing rank never joined; those are then killed).
GRACE_S = 5.0


def default_backend() -> str:
    """``NUMCHECK_DIST_BACKEND`` if set, else ``"nccl"`` when the suite runs on CUDA (``NUMCHECK_DEVICE=cuda``),
    else ``"gloo"``. ValueError naming the variable for an unknown backend."""
    raw = os.environ.get(BACKEND_ENV)
    if raw:
        if raw not in BACKENDS:
            raise ValueError(f"{BACKEND_ENV}={raw!r} is not one of {BACKENDS}")
        return raw
    return "nccl" if os.environ.get("NUMCHECK_DEVICE", "cpu").startswith("cuda") else "gloo"


def world_size_unavailable(world_size: int, backend: str) -> str | None:
    """Why ``world_size`` ranks cannot run on ``backend`` here, or ``None``: nccl needs one GPU per rank (NCCL
    refuses a communicator with two ranks on one device), so world sizes above the visible GPU count cannot run.

    >>> world_size_unavailable(4, "gloo") is None
    True
    """
    if backend != "nccl":
        return None
    import torch

    gpus = torch.cuda.device_count()
    if world_size > gpus:
        return f"nccl needs one GPU per rank: world size {world_size}, {gpus} GPU(s) visible"
    return None


def start_method(backend: str = "gloo") -> str:
    """``NUMCHECK_DIST_START`` if set, else ``"fork"`` for gloo on Linux and ``"exec"`` elsewhere and for nccl.
    ValueError naming the variable for another value, or for ``fork`` with nccl.

    nccl ranks are always started as programs: a rank forked from the zygote cannot initialise CUDA once anything
    the zygote imported touched it (seen on the H200: every nccl rank failed with "Cannot re-initialize CUDA in
    forked subprocess"), and forking a process that holds a CUDA context is not supported by CUDA at all."""
    raw = os.environ.get(START_ENV)
    if raw:
        if raw not in ("fork", "exec"):
            raise ValueError(f"{START_ENV}={raw!r} is not 'fork' or 'exec'")
        if raw == "fork" and backend == "nccl":
            raise ValueError(
                f"{START_ENV}=fork cannot start nccl ranks (CUDA cannot be initialised in a forked "
                f"child); unset it or use {START_ENV}=exec"
            )
        return raw
    return "fork" if sys.platform.startswith("linux") and backend != "nccl" else "exec"


class RankFailure(Exception):
    """A distributed call that did not succeed on every rank.

    Attributes: ``rank`` (the first rank that failed), ``kind`` (``"raised"``, ``"died"``, ``"timeout"``),
    ``detail`` (its traceback, exit code or the ranks still running), ``world_size``, ``backend``, ``fn`` (the
    function's qualified name), ``timeout_s``, ``rebuilt`` (whether the pool was killed for it).
    """

    def __init__(
        self,
        *,
        rank: int,
        kind: str,
        detail: str,
        world_size: int,
        backend: str,
        fn: str,
        timeout_s: float,
        rebuilt: bool,
    ) -> None:
        self.rank, self.kind, self.detail = rank, kind, detail
        self.world_size, self.backend, self.fn = world_size, backend, fn
        self.timeout_s, self.rebuilt = timeout_s, rebuilt
        what = {"raised": "raised", "died": "died", "timeout": f"did not answer within {timeout_s:g} s"}[kind]
        tail = " (every rank was killed; the pool is rebuilt on next use)" if rebuilt else ""
        super().__init__(f"rank {rank} of world size {world_size} ({backend}) {what} in {fn}{tail}:\n{detail}")

    def __reduce__(self) -> Any:
        return (
            _rebuild_failure,
            (self.rank, self.kind, self.detail, self.world_size, self.backend, self.fn, self.timeout_s, self.rebuilt),
        )


def _rebuild_failure(*a: Any) -> RankFailure:
    keys = ("rank", "kind", "detail", "world_size", "backend", "fn", "timeout_s", "rebuilt")
    return RankFailure(**dict(zip(keys, a)))


@dataclass
class _Rank:
    process: Any  # subprocess.Popen, or a dist_zygote.ForkedRank (the same interface)
    conn: Connection


def _worker_env(key: str | None) -> dict[str, str]:
    """The ranks' (and the zygote's) environment: this process's, its ``sys.path`` as ``PYTHONPATH`` (so a rank
    imports every module the parent can, test modules included), the pool's key. Inductor compiles in the rank
    itself (``TORCHINDUCTOR_COMPILE_THREADS=1`` unless set: with torch 2.6 its compile-worker pool never answered
    in a forked rank, so a torch.compile'd impl, Megatron's fused CE, timed out on every call)."""
    env = dict(os.environ)
    env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    if key is not None:
        env[AUTHKEY_ENV] = key
    return env


class DistPool:
    """``world_size`` persistent ranks on ``backend``, one process each (see the module docstring)."""

    _pools: dict[tuple[int, str, int], "DistPool"] = {}

    def __init__(self, world_size: int, backend: str) -> None:
        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"DistPool: world_size must be an int >= 1, got {world_size!r}")
        if backend not in BACKENDS:
            raise ValueError(f"DistPool: backend {backend!r} is not one of {BACKENDS}")
        self.world_size, self.backend = world_size, backend
        self.ranks: list[_Rank] = []
        self.calls = 0
        self._dir = tempfile.mkdtemp(prefix=f"numcheck-dist-{backend}-{world_size}-")
        self._start()

    @classmethod
    def get(cls, world_size: int, backend: str | None = None) -> "DistPool":
        """The live pool for ``(world_size, backend)`` in this process, started on first use (or after a
        failure killed the previous one). ``backend=None``: :func:`default_backend`."""
        backend = backend or default_backend()
        key = (world_size, backend, os.getpid())
        pool = cls._pools.get(key)
        if pool is None or not pool.alive():
            if pool is not None:
                pool.close()
            pool = cls._pools[key] = DistPool(world_size, backend)
        return pool

    @classmethod
    def close_all(cls) -> None:
        """Kill every pool this process started (registered with ``atexit``)."""
        for key, pool in list(cls._pools.items()):
            if key[2] == os.getpid():
                pool.close()
            cls._pools.pop(key, None)

    def _start(self) -> None:
        key = secrets.token_hex(16)
        address = os.path.join(self._dir, "pool.sock")
        store = os.path.join(self._dir, "store")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
            listener.bind(address)
            listener.listen(self.world_size)
            listener.settimeout(STARTUP_TIMEOUT_S)  # accept() must not wait forever for a rank that died
            procs = self._launch(
                [[str(rank), str(self.world_size), self.backend, store, address] for rank in range(self.world_size)],
                _worker_env(key),
            )
            conns = self._accept(listener, procs, bytes.fromhex(key))
        self.ranks = [_Rank(p, c) for p, c in zip(procs, conns)]
        replies = self._collect("DistPool startup", STARTUP_TIMEOUT_S)
        if len(replies) < self.world_size or any(s != "ready" for s, _ in replies.values()):
            self.close()
            raise self._failure_from(replies, "DistPool startup", STARTUP_TIMEOUT_S, rebuilt=True)

    def _launch(self, argvs: list[list[str]], env: dict[str, str]) -> list[Any]:
        """The rank processes, forked from this process's zygote or started as programs (:func:`start_method`)."""
        if start_method(self.backend) == "fork":
            try:
                return Zygote.get(_worker_env(None), STARTUP_TIMEOUT_S).spawn(argvs, env)
            except ZygoteError as exc:
                shutil.rmtree(self._dir, ignore_errors=True)
                raise RankFailure(
                    rank=0,
                    kind="died",
                    detail=str(exc),
                    world_size=self.world_size,
                    backend=self.backend,
                    fn="DistPool startup",
                    timeout_s=STARTUP_TIMEOUT_S,
                    rebuilt=True,
                ) from exc
        return [
            subprocess.Popen(
                [sys.executable, "-m", "numcheck.properties.distributed.pool.worker", *a],
                env=env,
                stdin=subprocess.DEVNULL,
            )
            for a in argvs
        ]

    def _accept(self, listener: socket.socket, procs: list[subprocess.Popen], key: bytes) -> list[Connection]:
        """One authenticated connection per rank, in rank order (ranks connect in any order; each first sends
        its rank number)."""
        by_rank: dict[int, Connection] = {}
        try:
            while len(by_rank) < len(procs):
                sock, _ = listener.accept()
                sock.setblocking(True)
                conn = Connection(sock.detach())
                deliver_challenge(conn, key)
                by_rank[pickle.loads(conn.recv_bytes())] = conn
        except (OSError, EOFError) as exc:
            for p in procs:
                p.kill()
            codes = {r: p.wait() for r, p in enumerate(procs)}
            shutil.rmtree(self._dir, ignore_errors=True)
            raise RankFailure(
                rank=min(set(range(len(procs))) - set(by_rank), default=0),
                kind="died",
                detail=f"ranks did not connect within {STARTUP_TIMEOUT_S:g} s ({exc!r}); exit codes {codes}",
                world_size=self.world_size,
                backend=self.backend,
                fn="DistPool startup",
                timeout_s=STARTUP_TIMEOUT_S,
                rebuilt=True,
            ) from exc
        return [by_rank[r] for r in range(len(procs))]

    def alive(self) -> bool:
        """Whether every rank's process is still running."""
        return bool(self.ranks) and all(r.process.poll() is None for r in self.ranks)

    def close(self) -> None:
        """Kill every rank and remove the rendezvous folder."""
        for r in self.ranks:
            try:
                r.conn.close()
            except OSError:
                pass
            if r.process.poll() is None:
                r.process.kill()
        for r in self.ranks:
            try:
                r.process.wait(10.0)
            except subprocess.TimeoutExpired:
                pass
        self.ranks = []
        shutil.rmtree(self._dir, ignore_errors=True)

    def run(
        self,
        fn: Callable[[int, int, Any, Any], Any],
        per_rank_args: Sequence[Any] | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> list[Any]:
        """``fn(rank, world_size, group, per_rank_args[rank])`` on every rank; each rank's result, tensors on the
        CPU. Raises :class:`RankFailure` (see the module docstring); ValueError for a wrong argument count."""
        args = [None] * self.world_size if per_rank_args is None else list(per_rank_args)
        if len(args) != self.world_size:
            raise ValueError(
                f"DistPool.run({qualname(fn)}): {len(args)} per-rank arguments for world size {self.world_size}"
            )
        if not self.ranks:
            raise RuntimeError(
                f"DistPool(world_size={self.world_size}, {self.backend}) was closed; get a live one with DistPool.get"
            )
        for r, a in zip(self.ranks, args):
            r.conn.send_bytes(pickle.dumps((fn, a)))
        self.calls += 1
        replies = self._collect(qualname(fn), timeout_s)
        if len(replies) == self.world_size and all(s == "ok" for s, _ in replies.values()):
            return [replies[r][1] for r in range(self.world_size)]
        rebuilt = len(replies) < self.world_size or any(s == "died" for s, _ in replies.values())
        if rebuilt:
            self.close()
        raise self._failure_from(replies, qualname(fn), timeout_s, rebuilt=rebuilt)

    def _collect(self, what: str, timeout_s: float) -> dict[int, tuple[str, Any]]:
        """Each rank's reply until all have answered, ``timeout_s`` passed, or :data:`GRACE_S` after the first
        error; a rank whose connection closed is entered as ``("died", exit code)``, one missing from the result
        did not answer."""
        replies: dict[int, tuple[str, Any]] = {}
        deadline = time.monotonic() + timeout_s
        by_conn = {r.conn: i for i, r in enumerate(self.ranks)}
        while len(replies) < self.world_size:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            for conn in wait([r.conn for i, r in enumerate(self.ranks) if i not in replies], timeout=remaining):
                i = by_conn[conn]
                try:
                    replies[i] = pickle.loads(conn.recv_bytes())
                except (EOFError, OSError):
                    replies[i] = ("died", self._exit_code(i))
            if any(s not in ("ok", "ready") for s, _ in replies.values()):
                deadline = min(deadline, time.monotonic() + GRACE_S)
        return replies

    def _exit_code(self, rank: int) -> str:
        """What a rank whose connection closed died of."""
        try:
            code = self.ranks[rank].process.wait(5.0)
        except subprocess.TimeoutExpired:
            return "its connection closed while the process still ran"
        return f"exit code {code}" + (f" (signal {-code})" if code < 0 else "")

    def _failure_from(
        self, replies: dict[int, tuple[str, Any]], what: str, timeout_s: float, rebuilt: bool
    ) -> RankFailure:
        """The :class:`RankFailure` for a call's replies: the lowest rank that died (the others' errors are then
        its consequence), else that raised, else the timeout (naming the ranks that had not answered)."""
        common = dict(world_size=self.world_size, backend=self.backend, fn=what, timeout_s=timeout_s, rebuilt=rebuilt)
        for kind, status in (("died", "died"), ("raised", "err")):  # a death first: the others' errors follow from it
            failed = sorted(r for r, (s, _) in replies.items() if s == status)
            if failed:
                detail = str(replies[failed[0]][1])
                silent = [r for r in range(self.world_size) if r not in replies]
                if silent:
                    detail += f"\n(ranks {silent} had not answered {GRACE_S:g} s later and were killed)"
                return RankFailure(rank=failed[0], kind=kind, detail=detail, **common)
        silent = [r for r in range(self.world_size) if r not in replies]
        return RankFailure(
            rank=silent[0],
            kind="timeout",
            detail=f"ranks {silent} had not answered after "
            f"{timeout_s:g} s (a deadlock, or a rank far slower than the others)",
            **common,
        )


atexit.register(Zygote.close_all)  # registered first, so it runs after the pools are closed
atexit.register(DistPool.close_all)


class FailureLatch:
    """Keeps the first pool-killing failure (timeout, dead rank, a rank hung after another raised) of one
    hypothesis run, so the property fails once with that case instead of hypothesis shrinking through further
    timeouts. Use one latch per test::

        latch = FailureLatch()

        @given(data=st.data())
        def body(data):
            case = draw(data)
            results = latch.run(DistPool.get(case.world_size), fn, args, note=case.describe())
            if results is None:
                return          # a failure is latched: run nothing more
            judge(results)

        body()
        latch.raise_if_failed()   # outside hypothesis: the latched failure, with its case
    """

    def __init__(self) -> None:
        self.failure: RankFailure | None = None
        self.note: str = ""

    def run(
        self,
        pool: "DistPool | Callable[[], DistPool]",
        fn: Callable[..., Any],
        per_rank_args: Sequence[Any] | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        note: str = "",
    ) -> list[Any] | None:
        """``pool.run(...)``; ``None`` once a failure is latched (this call's or an earlier one's). ``pool`` may
        be a zero-argument callable giving the pool, so no pool is started after a latch. ``note`` (the case,
        its repro line) is kept with a latched failure. A rank that raised while every rank answered is not
        latched: it propagates."""
        if self.failure is not None:
            return None
        try:
            live = pool() if callable(pool) and not isinstance(pool, DistPool) else pool
            return live.run(fn, per_rank_args, timeout_s)
        except RankFailure as exc:
            if not exc.rebuilt:
                raise
            self.failure, self.note = exc, note
            return None

    def raise_if_failed(self) -> None:
        """Raise the latched failure (with its case note), if any."""
        if self.failure is not None:
            if self.note:
                self.failure.add_note(self.note)
            raise self.failure
