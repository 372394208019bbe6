"""Ring attention in NumPy: a sequence split over P devices, blockwise attention of one
query shard against one key/value shard returning (o, lse), the log-sum-exp merge, the
ring schedule walked step by step, and the causal work of every (device, step).

The math of ``kernels.ring`` (chapter 6). Everything is exact: in float64
``ring_attention_numpy`` equals ``attention.core.scaled_dot_product_attention`` to
~1e-15 relative (the tests hold it to 1e-12), for every P, layout and length.

Layouts (how the N positions of a sequence are dealt to P devices), shared with
``kernels.ring.shard``:

``contiguous``  device r holds chunk r of P chunks.
``zigzag``      the sequence is cut into 2P chunks; device r holds chunks r and
                2P-1-r, in that order (the layout of Llama 3's context parallelism
                and of ring-flash-attention's zig-zag variant).
``striped``     device r holds positions r, r+P, r+2P, ... (Striped Attention,
                Brandon et al. 2023). NumPy only: ``kernels.ring`` ships the first two.

Chunks are cut with ``np.array_split``'s rule when N is not divisible: sizes differ by
at most one, the larger chunks first (``chunk_bounds``).

The ring (Liu et al. 2023): at step t = 0..P-1 device r holds the K/V shard of device
(r - t) mod P, computes its queries against it, and (for t < P-1) sends that shard to
device r+1 while receiving the next one from device r-1. Causal masks use the global
positions of the tokens (self-attention, N_q = N_k), so every layout gives the same
result as one device would.

NaN rules as in ``attention.flash``: a fully masked query row gives o = 0 and
lse = -inf; a NaN in a row's visible inputs gives NaN in that row only; a hidden key
never reaches a query, whatever its values (the mask selects).
"""

from __future__ import annotations

import numpy as np

from .core import (
    as_real_array,
    check_bool,
    check_int,
    check_scale,
    logsumexp,
    softmax,
    weighted_sum,
)
from .decode import kv_group, repeat_kv
from .decode import merge_partials as _merge_many

#: The layouts ``shard`` knows; ``kernels.ring`` ships the first two.
LAYOUTS = ("contiguous", "zigzag", "striped")


def check_layout(layout) -> str:
    if not isinstance(layout, str):
        raise TypeError(f"layout must be a str, got {type(layout).__name__}")
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    return layout


# ---------------------------------------------------------------------------------
# Sharding: which global positions each device holds.
# ---------------------------------------------------------------------------------


def chunk_bounds(N: int, n_chunks: int) -> list[tuple[int, int]]:
    """[start, end) of ``n_chunks`` consecutive chunks of N positions, cut as
    ``np.array_split`` cuts: sizes differ by at most one, the larger ones first."""
    N, n_chunks = check_int("N", N, 0), check_int("n_chunks", n_chunks, 1)
    q, r = divmod(N, n_chunks)
    starts = [i * q + min(i, r) for i in range(n_chunks + 1)]
    return list(zip(starts[:-1], starts[1:]))


def shard_intervals(N: int, P: int, layout: str, rank: int) -> list[tuple[int, int]]:
    """The [start, end) runs of global positions device ``rank`` holds, in the order
    its shard stores them (``striped``: one run of length 1 per position)."""
    layout = check_layout(layout)
    P = check_int("P", P, 1)
    rank = check_int("rank", rank, 0)
    if rank >= P:
        raise ValueError(f"rank must be < P={P}, got {rank}")
    if layout == "contiguous":
        return [chunk_bounds(N, P)[rank]]
    if layout == "zigzag":
        c = chunk_bounds(N, 2 * P)
        return [c[rank], c[2 * P - 1 - rank]]
    return [(i, i + 1) for i in range(rank, check_int("N", N, 0), P)]


def shard_positions(N: int, P: int, layout: str, rank: int) -> np.ndarray:
    """Global positions held by device ``rank``, in its shard's order (int64)."""
    runs = shard_intervals(N, P, layout, rank)
    if not runs:
        return np.zeros(0, dtype=np.int64)
    return np.concatenate([np.arange(s, e, dtype=np.int64) for s, e in runs])


def shard(x, rank: int, P: int, layout: str = "contiguous", axis: int = -2):
    """Device ``rank``'s shard of a full sequence ``x`` (positions along ``axis``)."""
    x = np.asarray(x)
    axis = axis % x.ndim
    return np.take(x, shard_positions(x.shape[axis], P, layout, rank), axis=axis)


def unshard(shards, layout: str = "contiguous", axis: int = -2) -> np.ndarray:
    """Put the P shards of ``shard`` back into one sequence."""
    shards = [np.asarray(s) for s in shards]
    if not shards:
        raise ValueError("shards must hold at least one shard")
    P = len(shards)
    axis = axis % shards[0].ndim
    N = sum(s.shape[axis] for s in shards)
    out_shape = list(shards[0].shape)
    out_shape[axis] = N
    out = np.empty(out_shape, dtype=np.result_type(*shards))
    for r, s in enumerate(shards):
        pos = shard_positions(N, P, layout, r)
        if s.shape[axis] != len(pos):
            raise ValueError(
                f"shard {r} holds {s.shape[axis]} positions; the "
                f"{layout} layout of N={N} over P={P} gives it {len(pos)}"
            )
        idx = [slice(None)] * out.ndim
        idx[axis] = pos
        out[tuple(idx)] = s
    return out


# ---------------------------------------------------------------------------------
# One block: a query shard against one K/V shard -> (o, lse); the merge.
# ---------------------------------------------------------------------------------


def _expand_kv(q: np.ndarray, k: np.ndarray) -> np.ndarray:
    """GQA: repeat each of H_kv heads H/H_kv times along the head axis (-3)
    (``attention.decode.repeat_kv``); unchanged when there is nothing to repeat."""
    if q.ndim < 3 or k.ndim < 3 or k.shape[-3] == q.shape[-3] or k.shape[-3] == 1:
        return k
    return repeat_kv(k, kv_group(q.shape[-3], k.shape[-3]))


def block_attention(
    q, k, v, q_pos=None, k_pos=None, causal: bool = False, scale: float | None = None
):
    """Attention of queries ``q`` (..., n_q, d) against one K/V shard ``k`` (..., n_k,
    d), ``v`` (..., n_k, d_v): the partial output normalised over this shard's keys
    and its log-sum-exp.

    ``causal``: key j is visible to query i when ``k_pos[j] <= q_pos[i]`` (global
    positions; default 0..n-1 for both). Returns (o (..., n_q, d_v), lse (..., n_q)); a
    row that sees no key here gets o = 0, lse = -inf (it contributes nothing to the
    merge).
    """
    q, k, v = (as_real_array(n, t, 2) for n, t in (("q", q), ("k", k), ("v", v)))
    k, v = _expand_kv(q, k), _expand_kv(q, v)
    if k.shape[-1] != q.shape[-1] or k.shape[-2] != v.shape[-2]:
        raise ValueError(f"shapes do not match: q {q.shape}, k {k.shape}, v {v.shape}")
    causal = check_bool("causal", causal)
    scale = check_scale("scale", scale, q.shape[-1])
    n_q, n_k = q.shape[-2], k.shape[-2]
    q_pos = np.arange(n_q) if q_pos is None else np.asarray(q_pos)
    k_pos = np.arange(n_k) if k_pos is None else np.asarray(k_pos)
    if q_pos.shape != (n_q,) or k_pos.shape != (n_k,):
        raise ValueError(
            f"q_pos {q_pos.shape} and k_pos {k_pos.shape} must list one "
            f"position per query ({n_q}) and key ({n_k})"
        )
    s = (q @ np.swapaxes(k, -1, -2)) * scale  # (..., n_q, n_k)
    keep = (k_pos[None, :] <= q_pos[:, None]) if causal else None  # (n_q, n_k)
    # as flash.standard_forward: rows that see no key give o = 0, lse = -inf; the mask
    # selects, so a hidden NaN is gone
    p = softmax(s, mask=keep)  # (..., n_q, n_k)
    lse = logsumexp(s if keep is None else np.where(keep, s, -np.inf))  # (..., n_q)
    return weighted_sum(p, v, keep), lse


def merge_partials(o1, lse1, o2, lse2):
    """Merge two partial results over disjoint key sets: the log-sum-exp rule.

    lse = log(e^lse1 + e^lse2), o = e^(lse1 - lse) o1 + e^(lse2 - lse) o2. A part with
    lse = -inf (no visible key) contributes nothing, whatever its o; both -inf gives
    o = 0, lse = -inf; a NaN in either part's lse stays NaN in o and lse.
    """
    return _merge_many([o1, o2], [lse1, lse2])  # attention.decode's S-way merge


# ---------------------------------------------------------------------------------
# The ring schedule.
# ---------------------------------------------------------------------------------


def ring_holds(P: int) -> np.ndarray:
    """holds[t, r]: whose K/V shard device r computes with at step t, (r - t) mod P.

    At step t < P-1, device r sends holds[t, r] to r+1 and receives holds[t+1, r] =
    holds[t, r-1] from r-1, so holds[t+1] is holds[t] rotated by one device.
    """
    P = check_int("P", P, 1)
    t = np.arange(P)[:, None]
    r = np.arange(P)[None, :]
    return (r - t) % P  # (steps, devices)


def ring_attention_numpy(
    q,
    k,
    v,
    P: int,
    causal: bool = False,
    layout: str = "contiguous",
    scale: float | None = None,
    return_lse: bool = False,
):
    """Exact attention computed the way P devices of a ring compute it.

    q: (..., N, d); k, v: (..., N, d) (GQA: k, v may have H_kv heads on axis -3 where
    q has H). The sequence is sharded with ``layout``; at step t device r merges
    ``block_attention`` of its queries against shard ``ring_holds(P)[t, r]`` into its
    running (o, lse). Returns the unsharded o (..., N, d_v), and lse (..., N) when
    ``return_lse``.
    """
    q, k, v = (as_real_array(n, t, 2) for n, t in (("q", q), ("k", k), ("v", v)))
    P = check_int("P", P, 1)
    layout = check_layout(layout)
    causal = check_bool("causal", causal)
    N = q.shape[-2]
    if k.shape[-2] != N or v.shape[-2] != N:
        raise ValueError(
            f"ring attention is self-attention: q, k, v need the same "
            f"length N, got {q.shape}, {k.shape}, {v.shape}"
        )
    pos = [shard_positions(N, P, layout, r) for r in range(P)]
    qs = [shard(q, r, P, layout) for r in range(P)]  # P x (..., N_r, d)
    kv = [(shard(k, r, P, layout), shard(v, r, P, layout)) for r in range(P)]
    out = []
    for r in range(P):
        o = lse = None
        for t in range(P):
            src = (r - t) % P  # the shard device r holds at step t
            o_b, lse_b = block_attention(
                qs[r], *kv[src], pos[r], pos[src], causal, scale
            )
            o, lse = (o_b, lse_b) if o is None else merge_partials(o, lse, o_b, lse_b)
        out.append((o, lse))
    o = unshard([o for o, _ in out], layout)
    if not check_bool("return_lse", return_lse):
        return o
    return o, unshard([lse[..., None] for _, lse in out], layout)[..., 0]


# ---------------------------------------------------------------------------------
# Causal work: visible (query, key) pairs per device per step.
# ---------------------------------------------------------------------------------


def block_pairs(
    N: int, P: int, layout: str, q_rank: int, k_rank: int, causal: bool
) -> int:
    """(query, key) pairs device ``q_rank`` computes against shard ``k_rank``, counted
    from the positions (the simulator's count; ``attention.memory.ring`` has the closed
    form). Non-causal: n_q * n_k; causal: the pairs with key position <= query's."""
    qp = shard_positions(N, P, layout, q_rank)
    kp = np.sort(shard_positions(N, P, layout, k_rank))
    if not check_bool("causal", causal):
        return len(qp) * len(kp)
    return int(np.searchsorted(kp, qp, side="right").sum())


def work_matrix(
    N: int, P: int, layout: str = "contiguous", causal: bool = True
) -> np.ndarray:
    """work[t, r]: visible pairs device r computes at step t of the ring (int64)."""
    holds = ring_holds(P)
    return np.array(
        [
            [block_pairs(N, P, layout, r, int(holds[t, r]), causal) for r in range(P)]
            for t in range(P)
        ],
        dtype=np.int64,
    )


def idle_fraction(work) -> float:
    """The fraction of device-steps spent waiting when every step lasts as long as its
    busiest device (the ring advances in lock step: a device cannot start step t+1
    before its neighbour has sent the shard). 1 - sum(work) / (P * sum_t max_r)."""
    work = np.asarray(work)
    busy = work.max(axis=1).sum() * work.shape[1]
    return float(1.0 - work.sum() / busy) if busy else 0.0
