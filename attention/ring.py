"""Ring attention in NumPy: a sequence split over P devices, blockwise attention of one
query shard against one key/value shard returning (o, lse), merged by log-sum-exp
(``attention.core.merge_partials``), the ring schedule walked step by step, and the
causal work of every (device, step).

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

All-gather context parallelism (Llama 3's; PyTorch's ``context_parallel`` default):
``allgather_attention_numpy`` gives every device all K/V at once and attends its query
shard in one block under the global causal mask; ``allgather_attention_backward_numpy``
forms each device's dq and partial dK/dV for all keys, summed and returned to their
owners as a reduce-scatter does. Both equal dense attention in float64.

NaN rules as in ``attention.flash``: a fully masked query row gives o = 0 and
lse = -inf; a NaN in a row's visible inputs gives NaN in that row only; a hidden key
never reaches a query, whatever its values (the mask selects).
"""

from __future__ import annotations

import numpy as np

from .checks import as_real_array, check_axis, check_bool, check_int, check_scale
from .core import logsumexp, merge_partials, softmax, weighted_sum
from .decode import kv_group, repeat_kv

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


def _check_shard(n, rank, world_size, layout):
    layout = check_layout(layout)
    n = check_int("n", n, 0)
    world_size = check_int("world_size", world_size, 1)
    rank = check_int("rank", rank, 0)
    if rank >= world_size:
        raise ValueError(f"rank must be < world_size={world_size}, got {rank}")
    return n, rank, world_size, layout


def shard_intervals(
    n: int, rank: int, world_size: int, layout: str
) -> list[tuple[int, int]]:
    """The [start, end) runs of the ``n`` global positions device ``rank`` of
    ``world_size`` holds, in the order its shard stores them (``striped``: one run of
    length 1 per position). The signature of ``kernels.ring.shard_intervals``."""
    n, rank, world_size, layout = _check_shard(n, rank, world_size, layout)
    if layout == "contiguous":
        return [chunk_bounds(n, world_size)[rank]]
    if layout == "zigzag":
        c = chunk_bounds(n, 2 * world_size)
        return [c[rank], c[2 * world_size - 1 - rank]]
    return [(i, i + 1) for i in range(rank, n, world_size)]


def shard_positions(n: int, rank: int, world_size: int, layout: str) -> np.ndarray:
    """Global positions held by device ``rank``, in its shard's order (int64)."""
    n, rank, world_size, layout = _check_shard(n, rank, world_size, layout)
    if layout == "striped":  # one run per position: all at once
        return np.arange(rank, n, world_size, dtype=np.int64)
    runs = shard_intervals(n, rank, world_size, layout)
    return np.concatenate([np.arange(s, e, dtype=np.int64) for s, e in runs])


def _seq_axis(name: str, a: np.ndarray, axis) -> int:
    """``axis`` of ``a`` as a non-negative int: ValueError naming ``name`` for a 0-d
    array or an axis out of range."""
    if a.ndim == 0:
        raise ValueError(f"{name} must have a sequence axis, got a 0-d array")
    return check_axis("axis", axis, a.ndim)


def shard(x, rank: int, world_size: int, layout: str = "contiguous", axis: int = -2):
    """Device ``rank``'s shard of a full sequence ``x`` (positions along ``axis``)."""
    x = np.asarray(x)
    axis = _seq_axis("x", x, axis)
    pos = shard_positions(x.shape[axis], rank, world_size, layout)
    return np.take(x, pos, axis=axis)


def unshard(shards, layout: str = "contiguous", axis: int = -2) -> np.ndarray:
    """Put the world_size shards of ``shard`` back into one sequence (``shards[r]``
    from device r): they must agree on every axis but ``axis``, and hold the lengths
    ``layout`` gives for their total (ValueError naming ``shards`` otherwise)."""
    layout = check_layout(layout)
    if isinstance(shards, np.ndarray) or not isinstance(shards, (list, tuple)):
        raise TypeError(
            f"shards must be a list of arrays (one per device), got "
            f"{type(shards).__name__}"
        )
    shards = [np.asarray(s) for s in shards]
    if not shards:
        raise ValueError("shards must hold at least one shard")
    world_size = len(shards)
    axis = _seq_axis("shards[0]", shards[0], axis)
    rest = [s.shape[:axis] + s.shape[axis + 1 :] for s in shards]
    if any(s.ndim != shards[0].ndim for s in shards) or len(set(rest)) > 1:
        raise ValueError(
            f"shards must agree on every axis but axis={axis}, got shapes "
            f"{[s.shape for s in shards]}"
        )
    N = sum(s.shape[axis] for s in shards)
    out_shape = list(shards[0].shape)
    out_shape[axis] = N
    out = np.empty(out_shape, dtype=np.result_type(*shards))
    for r, s in enumerate(shards):
        pos = shard_positions(N, r, world_size, layout)
        if s.shape[axis] != len(pos):
            raise ValueError(
                f"shards[{r}] holds {s.shape[axis]} positions; the {layout} layout "
                f"of N={N} over {world_size} devices gives it {len(pos)}"
            )
        idx = [slice(None)] * out.ndim
        idx[axis] = pos
        out[tuple(idx)] = s
    return out


# ---------------------------------------------------------------------------------
# One block: a query shard against one K/V shard -> (o, lse).
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
    pos = [shard_positions(N, r, P, layout) for r in range(P)]
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
            o, lse = (
                (o_b, lse_b) if o is None else merge_partials([o, o_b], [lse, lse_b])
            )
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
    qp = shard_positions(N, q_rank, P, layout)
    kp = np.sort(shard_positions(N, k_rank, P, layout))
    if not check_bool("causal", causal):
        return len(qp) * len(kp)
    return int(np.searchsorted(kp, qp, side="right").sum())


#: What the position-walking counts (``work_matrix`` here, ``simulate_ring`` in
#: ``attention.memory.ring``) accept: P * N positions and P * P blocks. Above either
#: they refuse at once and name the closed form, which gives the same integers from
#: shard sizes and interval arithmetic.
MAX_WALK_POSITIONS = 2**24
MAX_WALK_BLOCKS = 2**16


def check_walk(call: str, N: int, P: int, closed_form: str) -> tuple[int, int]:
    """N and P checked, and the size guard of a count that walks positions: ValueError
    naming ``closed_form`` (the call that gives the same counts at once) when P * N >
    ``MAX_WALK_POSITIONS`` or P * P > ``MAX_WALK_BLOCKS``."""
    N, P = check_int("N", N, 0), check_int("P", P, 1)
    if P * N > MAX_WALK_POSITIONS or P * P > MAX_WALK_BLOCKS:
        raise ValueError(
            f"{call}(N={N:,}, P={P}) would walk P*N = {P * N:,} positions over "
            f"P*P = {P * P:,} blocks, more than its budget of {MAX_WALK_POSITIONS:,} "
            f"positions and {MAX_WALK_BLOCKS:,} blocks: {closed_form} gives the same "
            "counts at once"
        )
    return N, P


def work_matrix(
    N: int, P: int, layout: str = "contiguous", causal: bool = True
) -> np.ndarray:
    """work[t, r]: visible pairs device r computes at step t of the ring (int64),
    counted from positions (``block_pairs``). Sizes beyond ``check_walk``'s budget are
    refused: ``attention.memory.ring.pairs_matrix`` is the closed form."""
    N, P = check_walk(
        "work_matrix", N, P, "attention.memory.ring.pairs_matrix(N, P, layout, causal)"
    )
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
    before its neighbour has sent the shard). 1 - sum(work) / (P * sum_t max_r).

    ``work``: (steps, devices), e.g. ``work_matrix``; ValueError unless 2-D."""
    work = as_real_array("work", work)
    if work.ndim != 2:
        raise ValueError(
            f"work must be 2-D (steps, devices), like work_matrix, got shape "
            f"{work.shape}"
        )
    if work.size == 0:
        raise ValueError(
            f"work must hold at least one step and device, got {work.shape}"
        )
    busy = work.max(axis=1).sum() * work.shape[1]
    return float(1.0 - work.sum() / busy) if busy else 0.0


# ---------------------------------------------------------------------------------
# All-gather context parallelism: every device gathers all K/V once.
# ---------------------------------------------------------------------------------


def _gathered(x, P: int, layout: str) -> tuple[np.ndarray, np.ndarray]:
    """What an all-gather of the P shards of ``x`` gives every device: the shards
    concatenated in rank order (..., N, d), and the global position of each row."""
    N = x.shape[-2]
    pos = np.concatenate([shard_positions(N, r, P, layout) for r in range(P)])
    return np.concatenate([shard(x, r, P, layout) for r in range(P)], axis=-2), pos


def _check_allgather(q, k, v, P, causal, layout):
    q, k, v = (as_real_array(n, t, 2) for n, t in (("q", q), ("k", k), ("v", v)))
    P = check_int("P", P, 1)
    layout, causal = check_layout(layout), check_bool("causal", causal)
    N = q.shape[-2]
    if k.shape[-2] != N or v.shape[-2] != N:
        raise ValueError(
            f"all-gather attention is self-attention: q, k, v need the same length N, "
            f"got {q.shape}, {k.shape}, {v.shape}"
        )
    return q, k, v, P, causal, layout


def allgather_attention_numpy(
    q,
    k,
    v,
    P: int,
    causal: bool = False,
    layout: str = "contiguous",
    scale: float | None = None,
    return_lse: bool = False,
):
    """Exact attention computed the way all-gather context parallelism computes it
    (Llama 3's; PyTorch's ``context_parallel`` default): device r all-gathers every
    device's K/V shard, then attends its own query shard against all N keys in one
    block, the causal mask taken from the global positions (any ``layout``). No merge:
    one softmax per row. Shapes as ``ring_attention_numpy`` (GQA included)."""
    q, k, v, P, causal, layout = _check_allgather(q, k, v, P, causal, layout)
    N = q.shape[-2]
    k_all, k_pos = _gathered(k, P, layout)  # the all-gather: (..., N, d) on every r
    v_all, _ = _gathered(v, P, layout)
    out = [
        block_attention(
            shard(q, r, P, layout),
            k_all,
            v_all,
            shard_positions(N, r, P, layout),
            k_pos,
            causal,
            scale,
        )
        for r in range(P)
    ]
    o = unshard([o for o, _ in out], layout)
    if not check_bool("return_lse", return_lse):
        return o
    return o, unshard([lse[..., None] for _, lse in out], layout)[..., 0]


def allgather_attention_backward_numpy(
    q, k, v, do, P: int, causal: bool = False, layout: str = "contiguous", scale=None
):
    """(dq, dk, dv) of ``allgather_attention_numpy`` for the output gradient ``do``,
    computed as the devices compute them: device r recomputes its rows' probabilities
    against the gathered K/V (with the lse of its own forward, which saw every key),
    forms its dq locally and *partial* dK, dV for all N keys; a reduce-scatter sums the
    P partials and leaves each device the rows of its own shard. GQA: the partials are
    summed over the query heads that share a K/V head. Returns full-sequence arrays."""
    q, k, v, P, causal, layout = _check_allgather(q, k, v, P, causal, layout)
    do = as_real_array("do", do, 2)
    if do.shape[:-1] != q.shape[:-1] or do.shape[-1] != v.shape[-1]:
        raise ValueError(f"do must be o's shape {q.shape[:-1] + v.shape[-1:]}")
    N = q.shape[-2]
    scale = check_scale("scale", scale, q.shape[-1])
    k_all, k_pos = _gathered(_expand_kv(q, k), P, layout)  # (..., H, N, d)
    v_all, _ = _gathered(_expand_kv(q, v), P, layout)
    dq_parts, dk_sum, dv_sum = [], 0.0, 0.0
    for r in range(P):
        q_r, do_r = shard(q, r, P, layout), shard(do, r, P, layout)
        o_r, lse_r = block_attention(
            q_r, k_all, v_all, shard_positions(N, r, P, layout), k_pos, causal, scale
        )
        s = (q_r @ np.swapaxes(k_all, -1, -2)) * scale  # (..., n_r, N)
        if causal:
            keep = k_pos[None, :] <= shard_positions(N, r, P, layout)[:, None]
            s = np.where(keep, s, -np.inf)
        with np.errstate(invalid="ignore"):
            p = np.where(np.isneginf(s), 0.0, np.exp(s - lse_r[..., None]))
        dp = do_r @ np.swapaxes(v_all, -1, -2)  # (..., n_r, N)
        ds = p * (dp - (do_r * o_r).sum(axis=-1, keepdims=True))
        dq_parts.append(scale * (ds @ k_all))  # (..., n_r, d): stays on device r
        dk_sum = dk_sum + scale * (np.swapaxes(ds, -1, -2) @ q_r)  # partial, all N
        dv_sum = dv_sum + np.swapaxes(p, -1, -2) @ do_r
    # the reduce-scatter: rows of the summed partials, in gathered (rank) order, back
    # to their positions; then GQA's heads summed onto their shared K/V head
    order = np.argsort(k_pos)
    dk, dv = np.take(dk_sum, order, axis=-2), np.take(dv_sum, order, axis=-2)
    if k.ndim >= 3 and k.shape[-3] != q.shape[-3]:
        g = q.shape[-3] // k.shape[-3]
        dk = dk.reshape(*dk.shape[:-3], k.shape[-3], g, *dk.shape[-2:]).sum(-3)
        dv = dv.reshape(*dv.shape[:-3], v.shape[-3], g, *dv.shape[-2:]).sum(-3)
    return unshard(dq_parts, layout), dk, dv
