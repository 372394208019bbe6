"""The decode kernels' shared jit blocks: where a key tile lies in the cache
(``_kv_offsets``), the running row max of a masked tile under a window
(``_window_row_max``), the score transforms (``_scores``: scale, softcap, ALiBi, the
mask) and the split merge (``_decode_merge``).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..common import LN2_JIT
from ..flex.mods import tanh  # the softcap's accurate tanh, one for both families


@triton.jit
def _kv_offsets(
    bt_row,
    start_n,
    offs_n,
    seqlen,
    stride_kp,
    stride_kn,
    PAGED: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MASKED: tl.constexpr,
):
    """Where the key rows ``start_n + offs_n`` of one sequence lie in the cache: a
    scalar int64 element offset and per-row offsets (BLOCK_N,). Through the block table
    when PAGED (one entry per tile when a tile lies within a page: the per-row offsets
    then stay 32-bit; else one entry per key), else rows of the sequence's own slab.
    """
    if PAGED:
        if PAGE_SIZE % BLOCK_N == 0:  # the tile lies in one page
            page = tl.load(bt_row + start_n // PAGE_SIZE).to(tl.int64)
            base = page * stride_kp + (start_n % PAGE_SIZE).to(tl.int64) * stride_kn
            return base, offs_n * stride_kn
        else:
            keys = start_n + offs_n
            if MASKED:
                pages = tl.load(bt_row + keys // PAGE_SIZE, mask=keys < seqlen, other=0)
            else:
                pages = tl.load(bt_row + keys // PAGE_SIZE)
            return 0, (
                pages.to(tl.int64) * stride_kp
                + (keys % PAGE_SIZE).to(tl.int64) * stride_kn
            )
    else:
        return start_n.to(tl.int64) * stride_kn, offs_n * stride_kn


@triton.jit
def _scores(
    qk,
    qk_scale,
    cap2,
    slope2,
    offs_n,
    pos,
    seqlen,
    win_left,
    win_right,
    MASKED: tl.constexpr,
    HAS_LEFT: tl.constexpr,
    HAS_RIGHT: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    HAS_ALIBI: tl.constexpr,
):
    """Base-2 scores of one tile: s = qk * scale (log2(e) folded in), capped as
    cap * tanh(s / cap) (cap2 = cap log2(e): the same cap in base 2), minus the ALiBi
    bias slope |i - j| (slope2 = slope log2(e)), hidden pairs -inf when MASKED (key j
    visible to the query at position i when j < seqlen, j <= i + right, j >= i - left).
    Returns (s, visible); visible is None-free: all True when not MASKED."""
    s = qk * qk_scale
    if HAS_SOFTCAP:
        s = cap2 * tanh(s / cap2)
    if HAS_ALIBI:
        dist = tl.abs(pos[:, None] - offs_n[None, :]).to(tl.float32)
        s = s - slope2[:, None] * dist
    visible = offs_n[None, :] < seqlen
    if MASKED:
        if HAS_RIGHT:
            visible = visible & (offs_n[None, :] <= pos[:, None] + win_right)
        if HAS_LEFT:
            visible = visible & (offs_n[None, :] >= pos[:, None] - win_left)
        s = tl.where(visible, s, float("-inf"))
    return s, visible


@triton.jit
def _window_row_max(
    m_i,
    s,
    start_n,
    pos,
    seqlen,
    win_left,
    win_right,
    HAS_LEFT: tl.constexpr,
    HAS_RIGHT: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """``kernels.flash.masked_row_max`` under a window: the running row max after a
    masked tile and the value to subtract (0 for a row with no visible key yet). A row
    that sees a key of this tile (the tile meets [i - left, min(i + right, seqlen - 1)])
    but whose scores are all -inf has no softmax: NaN, never "no visible key"."""
    m_ij = tl.maximum(m_i, tl.max(s, 1))
    last = tl.minimum(start_n + BLOCK_N - 1, seqlen - 1)
    if HAS_RIGHT:
        last = tl.minimum(last, pos + win_right)
    first = tl.zeros_like(pos) + start_n
    if HAS_LEFT:
        first = tl.maximum(first, pos - win_left)
    sees = first <= last
    m_ij = tl.where(sees & (m_ij == float("-inf")), float("nan"), m_ij)
    return m_ij, tl.where(m_ij == float("-inf"), 0.0, m_ij)


@triton.jit
def _decode_merge(
    OP, LSEP, Out, LSE, N_Q, H_Q, N_SPLITS, HEAD_DIM,
    stride_ob, stride_ot, stride_oh, stride_od, stride_lb, stride_lh, stride_lt,
    BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """o = sum_s 2^(lse_s - lse) o_s with lse = log2 sum_s 2^lse_s, for one query row
    of one head and one BLOCK_D chunk of its columns (program_id(1); contiguous
    partials (B, H_q, N_q, N_SPLITS[, d]), base 2). Empty splits (lse_s = -inf) weigh
    0; a row with no key anywhere gives 0 and -inf; a NaN partial lse makes the row
    NaN. The first chunk writes lse."""
    row = tl.program_id(0)  # ((b * H_q) + h) * N_q + t
    chunk = tl.program_id(1)
    t = row % N_Q
    h = (row // N_Q) % H_Q
    b = row // (N_Q * H_Q)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = chunk * BLOCK_D + tl.arange(0, BLOCK_D)
    s_ok = offs_s < N_SPLITS
    lse_s = tl.load(
        LSEP + row.to(tl.int64) * N_SPLITS + offs_s, mask=s_ok, other=float("-inf")
    )
    o_s = tl.load(
        OP
        + (row.to(tl.int64) * N_SPLITS + offs_s[:, None]) * HEAD_DIM
        + offs_d[None, :],
        mask=s_ok[:, None] & (offs_d[None, :] < HEAD_DIM),
        other=0.0,
    )
    m = tl.max(lse_s, 0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    w = tl.exp2(lse_s - m_safe)  # (BLOCK_S,)
    total = tl.sum(w, 0)
    nan = tl.sum((lse_s != lse_s).to(tl.int32), 0) > 0
    empty = total == 0.0
    o = tl.sum(w[:, None] * o_s, 0) / tl.where(empty, 1.0, total)
    lse = tl.where(empty, float("-inf"), m_safe + tl.log2(tl.where(empty, 1.0, total)))
    o = tl.where(nan, float("nan"), o)
    lse = tl.where(nan, float("nan"), lse)
    o_ptrs = (
        Out
        + b.to(tl.int64) * stride_ob
        + t.to(tl.int64) * stride_ot
        + h.to(tl.int64) * stride_oh
        + offs_d * stride_od
    )
    tl.store(o_ptrs, o.to(Out.dtype.element_ty), mask=offs_d < HEAD_DIM)
    if chunk == 0:
        tl.store(
            LSE
            + b.to(tl.int64) * stride_lb
            + h.to(tl.int64) * stride_lh
            + t.to(tl.int64) * stride_lt,
            lse * LN2_JIT,
        )
