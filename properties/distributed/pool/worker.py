"""One rank of a :class:`numcheck.properties.distributed.pool.pool.DistPool`: a process started as
``python -m numcheck.properties.distributed.pool.worker RANK WORLD_SIZE BACKEND STORE ADDRESS`` (the pool's authentication key
in ``NUMCHECK_DIST_AUTHKEY``), which joins the pool's process group and then runs one call per message from its
pool until the connection closes. Started as its own program, not through multiprocessing's spawn, so that no
``__main__`` of the parent (a script, a CLI) is imported again in the rank.

Each call runs on a process group made for it alone and destroyed before the next call runs; a call that leaves another group of
its own behind fails (:func:`leaked_groups`). Every tensor of a result is detached and moved to the CPU.
"""

from __future__ import annotations

import os
import pickle
import socket
import sys
import traceback
from datetime import timedelta
from multiprocessing.connection import Connection, answer_challenge
from typing import Any, Callable

import torch

from numcheck.properties.core import matmul_precision

AUTHKEY_ENV = "NUMCHECK_DIST_AUTHKEY"
#: The timeout of the collectives inside the ranks. The pool's own timeout is what fails a case; this only keeps
#: a rank orphaned by a dead parent from waiting forever.
COLLECTIVE_TIMEOUT = timedelta(seconds=900)


def to_cpu(value: Any) -> Any:
    """``value`` with every tensor (also inside tuples, named tuples, lists and dicts) detached and on the CPU."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(to_cpu(v) for v in value))
    if isinstance(value, (tuple, list)):
        return type(value)(to_cpu(v) for v in value)
    if isinstance(value, dict):
        return {k: to_cpu(v) for k, v in value.items()}
    return value


def qualname(fn: Callable[..., Any]) -> str:
    """``module.qualname`` of a rank function, for messages."""
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def rank_device(backend: str, rank: int) -> torch.device:
    """The device rank ``rank``'s tensors live on: the CPU for gloo, GPU ``rank`` (modulo the visible count) for
    nccl."""
    if backend == "nccl":
        return torch.device("cuda", rank % max(torch.cuda.device_count(), 1))
    return torch.device("cpu")


def leaked_groups(dist: Any) -> int:
    """How many process groups besides the default one exist in this rank (torch's group registry)."""
    pg_map = getattr(getattr(dist.distributed_c10d, "_world", None), "pg_map", None)
    return max(len(pg_map) - 1, 0) if pg_map is not None else 0


#: The previous call's group, destroyed when the next call arrives (see :func:`_call`).
_finished: list[Any] = []


def _destroy_finished(dist: Any) -> None:
    """Destroy the previous call's group. Not at the end of its own call: gloo's worker threads drop their last
    reference to a collective's tensor (a decref needing the GIL) just after the collective completed, and the
    group's destructor joins those threads with the GIL held; destroyed at once, that deadlocked (seen under torch
    2.6: a rank hung in destroy_process_group). By the next call the rank has waited for its message with the GIL
    released, so the threads are idle."""
    while _finished:
        dist.destroy_process_group(_finished.pop())


def _call(dist: Any, world_size: int, rank: int, fn: Callable[..., Any], args: Any) -> tuple[str, Any]:
    """One call on a fresh group (the previous call's destroyed first): ``("ok", result)`` or ``("err", traceback
    text)``."""
    _destroy_finished(dist)
    group = dist.new_group(list(range(world_size)), timeout=COLLECTIVE_TIMEOUT)
    try:
        with matmul_precision.pinned():
            out = fn(rank, world_size, group, args)
        result: tuple[str, Any] = ("ok", to_cpu(out))
    except BaseException:  # noqa: BLE001 - everything a rank raises is reported with its traceback
        result = ("err", traceback.format_exc())
    finally:
        _finished.append(group)
    leaked = leaked_groups(dist) - len(_finished)
    if result[0] == "ok" and leaked:
        result = (
            "err",
            f"{qualname(fn)} left {leaked} process group(s) it created undestroyed; a group must not "
            f"outlive its call (destroy it with torch.distributed.destroy_process_group)",
        )
    return result


def serve(rank: int, world_size: int, backend: str, store_path: str, conn: Connection) -> None:
    """Join the pool's process group, say ``ready``, then answer one call per message until the pipe closes."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    if backend == "nccl":
        torch.cuda.set_device(rank_device(backend, rank))
    dist.init_process_group(
        backend, init_method=f"file://{store_path}", rank=rank, world_size=world_size, timeout=COLLECTIVE_TIMEOUT
    )
    conn.send_bytes(pickle.dumps(("ready", None)))
    while True:
        try:
            msg = conn.recv_bytes()
        except (EOFError, OSError):
            break
        try:
            fn, args = pickle.loads(msg)
        except Exception:  # noqa: BLE001 - a call the rank cannot even unpickle is that call's failure
            result: tuple[str, Any] = ("err", f"the call could not be unpickled in the rank:\n{traceback.format_exc()}")
        else:
            result = _call(dist, world_size, rank, fn, args)
        try:
            payload = pickle.dumps(result)
        except Exception:  # noqa: BLE001 - an unpicklable result is the call's failure, said as such
            payload = pickle.dumps(
                ("err", f"the result of {qualname(fn)} cannot be pickled:\n{traceback.format_exc()}")
            )
        conn.send_bytes(payload)
    _destroy_finished(dist)
    dist.destroy_process_group()


def main(argv: list[str]) -> None:
    """Entry point: ``RANK WORLD_SIZE BACKEND STORE ADDRESS``."""
    rank, world_size, backend, store, address = int(argv[0]), int(argv[1]), argv[2], argv[3], argv[4]
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(address)
    conn = Connection(sock.detach())
    answer_challenge(conn, bytes.fromhex(os.environ[AUTHKEY_ENV]))
    conn.send_bytes(pickle.dumps(rank))
    try:
        serve(rank, world_size, backend, store, conn)
    except BaseException:  # noqa: BLE001 - a rank that cannot start says why before it exits
        try:
            conn.send_bytes(pickle.dumps(("err", traceback.format_exc())))
        except OSError:
            pass
        raise


if __name__ == "__main__":
    main(sys.argv[1:])
