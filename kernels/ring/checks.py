"""Ring attention on a real local process group, for the chapter: a check against
fp64 attention, and a measured timeline of one run.

Each function here with a ``rank`` first argument runs inside a rank of
:func:`kernels.ring.launch.run_local`; the others start the group and collect.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..naive import reference_attention
from .api import ring_attention
from .blocks import recording
from .launch import run_local
from .layout import shard


def _inputs(n, heads, kv_heads, head_dim, seed):
    """q (1, H, N, d), k, v (1, H_kv, N, d), dO (1, H, N, d): float32, from ``seed``."""
    g = torch.Generator().manual_seed(seed)
    shapes = [
        (1, heads, n, head_dim),
        (1, kv_heads, n, head_dim),
        (1, kv_heads, n, head_dim),
        (1, heads, n, head_dim),
    ]
    return [torch.randn(s, generator=g) for s in shapes]


def check_rank(
    rank: int,
    world_size: int,
    n: int,
    causal: bool,
    layout: str,
    heads: int,
    kv_heads: int,
    head_dim: int,
    seed: int,
) -> dict:
    """This rank's largest errors of o, lse, dq, dk, dv against fp64 attention of the
    whole sequence (computed on every rank from the same seed)."""
    q, k, v, do = _inputs(n, heads, kv_heads, head_dim, seed)
    full = [t.double().requires_grad_() for t in (q, k, v)]
    o_ref, lse_ref = reference_attention(*full, causal)
    refs = [o_ref, lse_ref, *torch.autograd.grad(o_ref, full, do.double())]
    mine = [shard(t, rank, world_size, layout).requires_grad_() for t in (q, k, v)]
    o, lse = ring_attention(*mine, causal=causal, layout=layout, return_lse=True)
    o.backward(shard(do, rank, world_size, layout))
    got = [o, lse, *(t.grad for t in mine)]
    return {
        name: (g.double() - shard(r.detach(), rank, world_size, layout))
        .abs()
        .max()
        .item()
        for name, g, r in zip(("o", "lse", "dq", "dk", "dv"), got, refs)
    }


def check_ring(
    world_size: int,
    n: int = 64,
    causal: bool = True,
    layout: str = "zigzag",
    heads: int = 2,
    kv_heads: int = 2,
    head_dim: int = 16,
    seed: int = 0,
    timeout: float = 120.0,
) -> dict:
    """Run ring_attention forward and backward on ``world_size`` gloo ranks; return
    the largest error of each of o, lse, dq, dk, dv over all ranks (float32 inputs
    against fp64 attention of the whole sequence)."""
    ranks = run_local(
        check_rank,
        world_size,
        n,
        causal,
        layout,
        heads,
        kv_heads,
        head_dim,
        seed,
        timeout=timeout,
    )
    return {name: max(r[name] for r in ranks) for name in ranks[0]}


def timeline_rank(
    rank: int,
    world_size: int,
    n: int,
    causal: bool,
    layout: str,
    heads: int,
    head_dim: int,
    backward: bool,
    seed: int,
) -> list:
    """This rank's measured spans of one ring_attention call (and its backward)."""
    q, k, v, do = _inputs(n, heads, heads, head_dim, seed)
    mine = [
        shard(t, rank, world_size, layout).requires_grad_(backward) for t in (q, k, v)
    ]
    # a warm-up call, so the spans measure the ring, not the kernels' first launch
    warm = [t.detach().requires_grad_(backward) for t in mine]
    o = ring_attention(*warm, causal=causal, layout=layout)
    if backward:
        o.sum().backward()
    spans: list = []
    dist.barrier()  # the ranks start the measured call together
    with recording(spans):
        o = ring_attention(*mine, causal=causal, layout=layout)
        if backward:
            o.backward(shard(do, rank, world_size, layout))
    return spans


def ring_timeline(
    world_size: int,
    n: int = 64,
    causal: bool = True,
    layout: str = "contiguous",
    heads: int = 2,
    head_dim: int = 16,
    backward: bool = False,
    seed: int = 0,
    timeout: float = 120.0,
) -> list[dict]:
    """Measured spans of one ring_attention call on ``world_size`` gloo ranks.

    Returns a list of dicts ``{rank, step, kind, phase, what, start, end}``:
    ``kind`` is "compute" (one block: the flash kernel and the merge), "wait"
    (blocked until a transfer finished) or "send" (from posting a transfer to seeing
    it done); ``what`` is "block", "kv" (a K/V shard) or "dkv" (a dK/dV accumulator,
    backward only); ``phase`` is "forward" or "backward"; times in seconds from the
    earliest span (``time.perf_counter``, one clock for all processes of a Linux
    machine).
    A CPU run: the blocks run under the Triton interpreter and the ranks share this
    machine's cores, so the spans show the schedule, not GPU timings.
    """
    ranks = run_local(
        timeline_rank,
        world_size,
        n,
        causal,
        layout,
        heads,
        head_dim,
        backward,
        seed,
        timeout=timeout,
    )
    return _gather_spans(ranks)


def _gather_spans(ranks: list[list]) -> list[dict]:
    spans = [s for r in ranks for s in r]
    t0 = min(s["start"] for s in spans)
    return sorted(
        ({**s, "start": s["start"] - t0, "end": s["end"] - t0} for s in spans),
        key=lambda s: (s["rank"], s["start"]),
    )


def _check_then_time_rank(
    rank: int, world_size: int, check: dict, timeline: dict
) -> tuple[dict, list]:
    errs = check_rank(rank, world_size, **check)
    return errs, timeline_rank(rank, world_size, **timeline)


def check_and_timeline(
    world_size: int, check: dict, timeline: dict, timeout: float = 180.0
) -> tuple[dict, list[dict]]:
    """:func:`check_ring` and :func:`ring_timeline` in ONE process group (starting a
    group of spawned processes costs seconds on a CPU): ``check`` and ``timeline``
    hold their keyword arguments (all of ``check_rank``'s and ``timeline_rank``'s but
    the rank and world size). Returns (largest errors, spans)."""
    ranks = run_local(
        _check_then_time_rank, world_size, check, timeline, timeout=timeout
    )
    errs = {name: max(r[0][name] for r in ranks) for name in ranks[0][0]}
    return errs, _gather_spans([r[1] for r in ranks])
