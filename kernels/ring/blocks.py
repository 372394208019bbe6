"""The pieces of the ring loop: the log-sum-exp merge, the block plan, the ring.

``merge_partials`` (S partial attentions merged by their lse: public as
``kernels.ring.merge_partials``), ``Block`` / ``block_plan`` (which part of a (query
shard, key shard) pair is visible under the global causal mask), ``Ring`` /
``make_ring`` (the process group, the neighbours and every rank's segments, agreed by
one all_gather), the bounded waits and the P2P transfer of a step, and the timeline
spans ``ring_timeline`` records.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..common import FLOAT_DTYPES, check_bool, check_tensor
from .layout import shard_intervals

_TAG_KV, _TAG_DKV = 1, 2  # P2P tags: K/V shards and dK/dV accumulators


# --------------------------------------------------------------------------------------
# The log-sum-exp merge
# --------------------------------------------------------------------------------------
def merge_partials(o_parts: torch.Tensor, lse_parts: torch.Tensor, *, base2=False):
    """Merge S partial attentions of the same query rows over disjoint key sets.

    o_parts: (S, ..., N, d), each part normalised over its own keys; lse_parts:
    (S, ..., N), natural log (base 2 with ``base2``). Returns (o, lse) of attention over
    the union of the keys: lse = log sum_s e^lse_s, o = sum_s e^(lse_s - lse) o_s, the
    torch twin of ``attention``'s NumPy ``merge_partials``. A part with lse = -inf (no
    visible key, o = 0) contributes nothing, exactly: with one other part, that part
    comes back bit for bit. All -inf gives (0, -inf). A NaN in any part's lse gives
    NaN (and a NaN in a part's o reaches that row). Bad arguments are refused by name.
    """
    check_tensor("o_parts", o_parts)
    check_tensor("lse_parts", lse_parts)
    check_bool("base2", base2)
    if o_parts.ndim < 3 or o_parts.shape[0] < 1:
        raise ValueError(
            "o_parts must be (S, ..., N, d) with S >= 1 parts stacked on axis 0, "
            f"got shape {tuple(o_parts.shape)}"
        )
    if tuple(lse_parts.shape) != tuple(o_parts.shape[:-1]):
        raise ValueError(
            f"lse_parts must be (S, ..., N) = {tuple(o_parts.shape[:-1])} to match "
            f"o_parts {tuple(o_parts.shape)}, got {tuple(lse_parts.shape)}"
        )
    if not (lse_parts.is_floating_point() and o_parts.is_floating_point()):
        raise TypeError(
            f"o_parts and lse_parts must be floating point, got {o_parts.dtype} "
            f"and {lse_parts.dtype}"
        )
    exp, log = (torch.exp2, torch.log2) if base2 else (torch.exp, torch.log)
    top = lse_parts.amax(0)  # (..., N); NaN if a part's lse is NaN
    top = torch.where(torch.isneginf(top), 0.0, top)  # every part empty
    lse = top + log(exp(lse_parts - top).sum(0))  # (..., N)
    ref = torch.where(torch.isneginf(lse), 0.0, lse)
    w = exp(lse_parts - ref)  # (S, ..., N)
    return (w.unsqueeze(-1) * o_parts).sum(0), lse


# --------------------------------------------------------------------------------------
# Which block of a (query shard, key shard) pair is visible under the causal mask
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Block:
    """Local rows [q0, q1) of the query shard against rows [k0, k1) of the key shard;
    ``causal``: the block is a diagonal block (top-left = bottom-right causal mask, as
    N_q == N_k), else every pair in it is visible."""

    q0: int
    q1: int
    k0: int
    k1: int
    causal: bool


def _relation(q: tuple[int, int], k: tuple[int, int]) -> str:
    """'all' (every query sees every key), 'none', or 'part' for two global ranges."""
    if k[1] - 1 <= q[0]:
        return "all"
    if k[0] >= q[1]:
        return "none"
    return "part"


def _span_of(segs, picked):
    """Local [start, end) of the picked segments (which must be consecutive)."""
    lengths = [e - s for s, e in segs]
    if picked != list(range(picked[0], picked[-1] + 1)):
        raise RuntimeError(
            f"ring attention: visible segments {picked} of {segs} "
            f"are not consecutive rows"
        )
    return sum(lengths[: picked[0]]), sum(lengths[: picked[-1] + 1])


def block_plan(q_segs, k_segs, causal: bool) -> Block | None:
    """The visible block of queries at global ranges ``q_segs`` (in local order)
    against keys at ``k_segs``; None when no query sees any key (the block is skipped).

    The mask is the global one (query i sees key j iff j <= i). For both layouts the
    visible part of a block is a rectangle of whole segments that is either fully
    visible or the shard against itself (a diagonal block, N_q == N_k, segments in
    increasing order so the local top-left mask is the global mask). Anything else
    raises RuntimeError (no layout of this module produces it; the tests check every
    split up to P = 6 against the dense mask).
    """
    nq, nk = sum(e - s for s, e in q_segs), sum(e - s for s, e in k_segs)
    if not causal:
        return Block(0, nq, 0, nk, False)
    rel = [[_relation(qs, ks) for ks in k_segs] for qs in q_segs]
    rows = [i for i in range(len(q_segs)) if any(r != "none" for r in rel[i])]
    if not rows:
        return None
    cols = [j for j in range(len(k_segs)) if any(rel[i][j] != "none" for i in rows)]
    (q0, q1), (k0, k1) = _span_of(q_segs, rows), _span_of(k_segs, cols)
    if all(rel[i][j] == "all" for i in rows for j in cols):
        return Block(q0, q1, k0, k1, False)
    sub_q, sub_k = [q_segs[i] for i in rows], [k_segs[j] for j in cols]
    if sub_q == sub_k and all(a[1] <= b[0] for a, b in zip(sub_q, sub_q[1:])):
        return Block(q0, q1, k0, k1, True)
    raise RuntimeError(
        f"ring attention: no block plan for queries {q_segs} against keys {k_segs}"
    )


# --------------------------------------------------------------------------------------
# The ring: process group, neighbours, every rank's segments
# --------------------------------------------------------------------------------------
@dataclass
class Ring:
    group: object
    world_size: int
    rank: int
    next: int  # global rank to send to
    prev: int  # global rank to receive from
    segs: list  # segs[r]: the global ranges rank r holds, in local order
    causal: bool
    wait_timeout: object = None  # timedelta: a CPU wait gives up after it (gloo)

    def src(self, step: int) -> int:
        """Whose K/V shard this rank holds at ``step``."""
        return (self.rank - step) % self.world_size

    def plan(self, step: int) -> Block | None:
        return block_plan(self.segs[self.rank], self.segs[self.src(step)], self.causal)

    def length(self, r: int) -> int:
        return sum(e - s for s, e in self.segs[r])


def group_size(group) -> tuple[int, int]:
    """(world size, rank) of ``group``; (1, 0) with no process group initialised."""
    if group is None and not (dist.is_available() and dist.is_initialized()):
        return 1, 0
    if group is not None and not isinstance(group, dist.ProcessGroup):
        raise TypeError(
            f"group must be a torch.distributed ProcessGroup or None, "
            f"got {type(group).__name__}"
        )
    return dist.get_world_size(group), dist.get_rank(group)


def make_ring(q, k, causal: bool, group, layout: str, scale: float) -> Ring:
    """Agree on shapes across the ranks (one small all_gather) and lay out the ring.

    Every rank receives the same table, so a mismatch raises the same ValueError on
    every rank (no rank is left waiting in a transfer).
    """
    P, rank = group_size(group)
    B, H, n, d = q.shape
    meta = [
        B,
        H,
        k.shape[1],
        d,
        n,
        FLOAT_DTYPES.index(q.dtype),
        int(causal),
        ("contiguous", "zigzag").index(layout),
        scale,
    ]
    # float64 holds every integer here exactly, and the scale bit for bit
    mine = torch.tensor(meta, dtype=torch.float64, device=q.device)
    table = [torch.empty_like(mine) for _ in range(P)]
    dist.all_gather(table, mine, group=group)
    rows = [t.tolist() for t in table]
    names = ("B", "H", "H_kv", "d", None, "dtype", "causal", "layout", "softmax_scale")
    for r, row in enumerate(rows):
        for name, a, b in zip(names, row, rows[0]):
            if name is not None and a != b:
                raise ValueError(
                    f"q, k, v: rank {r} of the group has "
                    f"{name}={a:.17g} but rank 0 has {b:.17g} (every "
                    f"rank must pass shards of one sequence with the "
                    f"same arguments)"
                )
    lengths = [int(row[4]) for row in rows]
    n_total = sum(lengths)
    if layout == "contiguous":  # any positive lengths: positions follow the ranks
        starts = [sum(lengths[:r]) for r in range(P)]
        segs = [[(s, s + m)] for s, m in zip(starts, lengths)]
    else:
        if n_total < 2 * P:
            raise ValueError(
                f"q: a zigzag sequence of {n_total} positions over {P} "
                f"ranks needs at least {2 * P} (one per chunk)"
            )
        segs = [shard_intervals(n_total, r, P, layout) for r in range(P)]
        expected = [sum(e - s for s, e in sg) for sg in segs]
        if lengths != expected:
            raise ValueError(
                f"q: shard lengths {lengths} over the ranks are not the "
                f"zigzag split of {n_total} positions (expected "
                f"{expected}; use kernels.ring.shard)"
            )
    to_global = (
        (lambda r: r) if group is None else (lambda r: dist.get_global_rank(group, r))
    )
    return Ring(
        group,
        P,
        rank,
        to_global((rank + 1) % P),
        to_global((rank - 1) % P),
        segs,
        causal,
        _wait_timeout(group, q.device),
    )


def _wait_timeout(group, device):
    """The group's timeout, for waits on CPU transfers (gloo): ``Work.wait()`` with no
    argument is not bounded by it there. None on CUDA, where a timed wait would block
    the host (NCCL's own watchdog enforces the group's timeout)."""
    if device.type == "cuda":
        return None
    pg = dist.group.WORLD if group is None else group
    try:  # private API (torch 2.x): the backend's options hold the group's timeout
        return pg._get_backend(device).options._timeout
    except (AttributeError, RuntimeError):
        return None


# --------------------------------------------------------------------------------------
# Timeline: measured spans per ring step (only while ring_timeline records)
# --------------------------------------------------------------------------------------
_RECORD: list | None = None


@contextlib.contextmanager
def recording(spans: list):
    """Collect this process's ring spans into ``spans`` for the duration."""
    global _RECORD
    previous, _RECORD = _RECORD, spans
    try:
        yield spans
    finally:
        _RECORD = previous


def _sync(device):
    if device.type == "cuda":  # measured spans need the GPU's work finished
        torch.cuda.synchronize(device)


@contextlib.contextmanager
def _span(kind, step, phase, ring, device, what="block"):
    if _RECORD is None:
        yield
        return
    _sync(device)
    start = time.perf_counter()
    yield
    _sync(device)
    _RECORD.append(
        dict(
            rank=ring.rank,
            step=step,
            kind=kind,
            phase=phase,
            what=what,
            start=start,
            end=time.perf_counter(),
        )
    )


class _Transfer:
    """One posted batch_isend_irecv: send ``buf`` to the next rank, receive a tensor
    of ``shape`` from the previous one."""

    def __init__(self, ring: Ring, buf, shape, tag: int, step: int, phase: str):
        self.ring, self.step, self.phase = ring, step, phase
        self.what = "kv" if tag == _TAG_KV else "dkv"
        self.buf = buf  # kept alive until the transfer is done
        self.recv = torch.empty(shape, dtype=buf.dtype, device=buf.device)
        self.start = time.perf_counter()
        self.reqs = dist.batch_isend_irecv(
            [
                dist.P2POp(dist.isend, buf, ring.next, ring.group, tag),
                dist.P2POp(dist.irecv, self.recv, ring.prev, ring.group, tag),
            ]
        )

    def wait(self, step: int) -> torch.Tensor:
        """Block until done (``step``: the ring step that waits, for the timeline)."""
        with _span("wait", step, self.phase, self.ring, self.recv.device, self.what):
            timeout = self.ring.wait_timeout
            for req in self.reqs:
                req.wait(timeout) if timeout is not None else req.wait()
        if _RECORD is not None:
            _RECORD.append(
                dict(
                    rank=self.ring.rank,
                    step=self.step,
                    kind="send",
                    phase=self.phase,
                    what=self.what,
                    start=self.start,
                    end=time.perf_counter(),
                )
            )
        return self.recv
