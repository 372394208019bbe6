"""Run a function on a local process group: P processes on this machine, gloo over
loopback (or NCCL, one GPU per rank), for the tests and the chapter.

``run_local(fn, world_size, *args)`` starts ``world_size`` processes with
``torch.multiprocessing`` (from a fork server that imported torch once; spawn where
there is none), joins them into one process group and calls
``fn(rank, world_size, *args)`` in each; it returns the ranks' results in rank order.

No fixed port and no port race: the parent opens the rendezvous store itself on a free
port (``TCPStore`` on port 0, kept open until the run ends) and the ranks join it as
clients. Nothing hangs: every collective has the group's ``timeout``; each rank arms a
watchdog (``faulthandler.dump_traceback_later``) that prints its stack and exits if
``fn`` runs past the timeout; the parent waits at most ``timeout`` (plus start-up) and
then kills what is left. A rank that raises sends its traceback to the parent, which
stops the other ranks and raises ``RuntimeError`` naming the rank, with the traceback.
Results travel as ``torch.save`` bytes, tensors moved to the CPU first.
"""

from __future__ import annotations

import datetime
import faulthandler
import io
import queue as queue_mod
import time
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ..common import check_int

#: seconds a rank process may take to start (import torch, triton, kernels)
STARTUP_S = 120.0


def _to_cpu(x):
    if isinstance(x, torch.Tensor):
        return x.detach().cpu()
    if isinstance(x, dict):
        return {key: _to_cpu(val) for key, val in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_to_cpu(val) for val in x)
    return x


def _worker(rank, world_size, port, backend, timeout, group_timeout, fn, args, results):
    faulthandler.dump_traceback_later(timeout, exit=True)  # the rank's own watchdog
    try:
        store = dist.TCPStore(
            "127.0.0.1",
            port,
            world_size,
            is_master=False,
            timeout=datetime.timedelta(seconds=timeout),
        )
        if backend == "nccl":
            torch.cuda.set_device(rank % torch.cuda.device_count())
        dist.init_process_group(
            backend,
            store=store,
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=group_timeout),
        )
        out = _to_cpu(fn(rank, world_size, *args))
        buf = io.BytesIO()
        torch.save(out, buf)
        results.put(("ok", rank, buf.getvalue()))
    except BaseException:  # noqa: BLE001 - every failure goes to the parent
        results.put(("error", rank, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        faulthandler.cancel_dump_traceback_later()


def _stop(procs):
    """End every rank that was started (a start that failed leaves the rest
    unstarted: they have nothing to join)."""
    procs = [p for p in procs if p.pid is not None]
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + 5
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join()


def _context():
    """Where the ranks' processes come from: a fork server that imported torch once
    (each rank then starts in a fraction of a second, not the ~2 s of importing torch
    anew; the server touches no GPU, so forking from it is safe for CUDA and OpenMP),
    or new interpreters (spawn) where the platform has no fork server."""
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torch.distributed"])
    return ctx


def run_local(
    fn,
    world_size: int,
    *args,
    timeout: float = 60.0,
    backend: str = "gloo",
    collective_timeout: float | None = None,
) -> list:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` local processes.

    Args:
        fn: a module-level function (spawned processes import it by name).
        world_size: number of ranks, >= 1.
        timeout: seconds for ``fn`` on each rank (its watchdog), and by default for
            every collective and transfer of the group.
        collective_timeout: the group's timeout, if not ``timeout``.
        backend: "gloo" (CPU, loopback) or "nccl" (one GPU per rank).
    Returns:
        [fn's result on rank 0, ..., on rank world_size - 1], tensors on the CPU.
    Raises:
        RuntimeError naming the first rank that raised, with its traceback;
        TimeoutError if a rank neither returned nor raised in time (all ranks killed).
    """
    check_int("world_size", world_size, 1)
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend must be 'gloo' or 'nccl', got {backend!r}")
    for name, value in (
        ("timeout", timeout),
        ("collective_timeout", collective_timeout or timeout),
    ):
        if isinstance(value, bool) or not (
            isinstance(value, (int, float)) and value > 0
        ):
            raise ValueError(
                f"{name} must be a positive number of seconds, got {value!r}"
            )
    ctx = _context()
    # the rendezvous: open on a free port now, so no other process can take it
    store = dist.TCPStore(
        "127.0.0.1",
        0,
        world_size + 1,
        is_master=True,
        timeout=datetime.timedelta(seconds=timeout),
        wait_for_workers=False,
    )
    results = ctx.Queue()
    procs = [
        ctx.Process(
            target=_worker,
            daemon=True,
            args=(
                rank,
                world_size,
                store.port,
                backend,
                float(timeout),
                float(collective_timeout or timeout),
                fn,
                args,
                results,
            ),
        )
        for rank in range(world_size)
    ]
    try:
        for p in procs:
            p.start()
        out: dict[int, object] = {}
        deadline = time.monotonic() + STARTUP_S + timeout
        while len(out) < world_size:
            try:
                status, rank, payload = results.get(timeout=1.0)
            except queue_mod.Empty:
                dead = [
                    r for r, p in enumerate(procs) if not p.is_alive() and r not in out
                ]
                if dead:  # died without a word (killed, segfault, watchdog)
                    time.sleep(0.5)  # its last message may still be in flight
                    if results.empty():
                        raise RuntimeError(
                            f"rank {dead[0]} exited with code "
                            f"{procs[dead[0]].exitcode} without a result"
                        ) from None
                if time.monotonic() > deadline:
                    missing = sorted(set(range(world_size)) - set(out))
                    raise TimeoutError(
                        f"ranks {missing} of {world_size} did not "
                        f"finish within {timeout} s (+ start-up); "
                        f"all ranks stopped"
                    ) from None
                continue
            if status == "error":
                raise RuntimeError(f"rank {rank} of {world_size} raised:\n{payload}")
            out[rank] = torch.load(io.BytesIO(payload), weights_only=False)
        for p in procs:
            p.join(10)
        return [out[r] for r in range(world_size)]
    finally:
        _stop(procs)
        del store
