"""The split-KV decode kernels (FlashDecoding over a paged KV cache) and their tiles.

``_decode_split``: one program per (KV head x query-row block, split, sequence). Its
query tile holds every query row that reads this KV head: the G = H_q / H_kv heads of
the group times the N_q new tokens, ``BLOCK_M`` rows (GQA packing), so each K/V tile
is read from HBM once per group, not once per query head. It streams its split's keys
in ``BLOCK_N`` tiles through the block table with the online softmax of
``kernels.flash`` (base 2, exp2) and writes a normalised partial output and its base-2
log-sum-exp in fp32 (or, with one split, the final output and the natural lse).
``_decode_merge``: one program per (query row, head, sequence) merges the splits with
the log-sum-exp rule. The tiles are in :mod:`kernels.decode.tiles`, the checks in
:mod:`kernels.decode.checks`, the public face and launch in :mod:`kernels.decode.api`.
"""

from __future__ import annotations

import triton
import triton.language as tl

# the shared jit blocks of the flash kernels, and their architecture classes
from ..common import LN2, LOG2E
from ..flash import finish_rows, finite_dot, masked_row_max

# kernels.common's constants, as @triton.jit reads them
_LOG2E: tl.constexpr = tl.constexpr(LOG2E)
_LN2: tl.constexpr = tl.constexpr(LN2)


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
def _decode_tiles(
    acc,
    l_i,
    m_i,
    q,
    k_base,
    v_base,
    bt_row,
    lo,
    hi,
    seqlen,
    n_q,
    row_t,
    qk_scale,
    offs_n0,
    offs_d,
    stride_kp,
    stride_kn,
    stride_kd,
    stride_vd,
    HEAD_DIM,
    PAGED: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    EVEN_D: tl.constexpr,
    MASKED: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    UPCAST: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Stream the key tiles [lo, hi) past the resident query tile (online softmax).

    MASKED=False: tiles every query row sees in full (no mask, no bounds). MASKED=True:
    the tiles at the end of the sequence, where keys past ``seqlen`` read as 0 and,
    causal, row t (query position seqlen - N_q + t) sees keys j <= seqlen - N_q + t.
    There a value row hidden from a query could hold NaN (0 * NaN = NaN through the
    dot): non-finite values are zeroed for the product and the rows that do see one
    are set to NaN (a second, small dot counts them).
    """
    causal_offset = seqlen - n_q
    d_ok = offs_d[None, :] < HEAD_DIM
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        offs_n = start_n + offs_n0
        base, rows = _kv_offsets(
            bt_row,
            start_n,
            offs_n0,
            seqlen,
            stride_kp,
            stride_kn,
            PAGED,
            PAGE_SIZE,
            BLOCK_N,
            MASKED,
        )
        k_ptrs = (k_base + base) + rows[:, None] + offs_d[None, :] * stride_kd
        v_ptrs = (v_base + base) + rows[:, None] + offs_d[None, :] * stride_vd
        if MASKED:
            kv_mask = (offs_n[:, None] < seqlen) & d_ok
            k = tl.load(k_ptrs, mask=kv_mask, other=0.0)
            v = tl.load(v_ptrs, mask=kv_mask, other=0.0)
        elif EVEN_D:
            k = tl.load(k_ptrs)
            v = tl.load(v_ptrs)
        else:
            k = tl.load(k_ptrs, mask=d_ok, other=0.0)
            v = tl.load(v_ptrs, mask=d_ok, other=0.0)
        if UPCAST:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)  # (BLOCK_M, BLOCK_N)
        s = qk * qk_scale  # base-2 scores
        if MASKED:
            visible = offs_n[None, :] < seqlen
            if IS_CAUSAL:
                visible = visible & (offs_n[None, :] <= row_t[:, None] + causal_offset)
            s = tl.where(visible, s, float("-inf"))
            m_new, m_sub = masked_row_max(
                m_i, s, start_n, row_t, seqlen, causal_offset, IS_CAUSAL
            )
        else:
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_sub = m_new
        p = tl.exp2(s - m_sub[:, None])
        alpha = tl.exp2(m_i - m_sub)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        if MASKED and IS_CAUSAL:  # no non-finite v reaches a hidden pair
            acc = finite_dot(acc, p, v, visible, True, DOT_PRECISION)
        else:
            acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _decode_split(
    Q,
    K,
    V,
    BT,
    SEQLENS,
    Out,
    LSE,
    sm_scale,
    stride_qb,
    stride_qt,
    stride_qh,
    stride_qd,
    stride_kp,
    stride_kn,
    stride_kh,
    stride_kd,
    stride_vp,
    stride_vn,
    stride_vh,
    stride_vd,
    stride_btb,
    stride_ob,
    stride_ot,
    stride_oh,
    stride_od,
    stride_lb,
    stride_lh,
    stride_lt,
    N_Q,
    GROUP,
    HEAD_DIM,
    N_SPLITS,
    M_BLOCKS,
    PAGED: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    SPLIT: tl.constexpr,
    UPCAST: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    EVEN_D: tl.constexpr,
):
    """One split of one sequence's keys for one KV head's query rows.

    SPLIT=True: Out is the fp32 partial output (B, H_q, N_q, N_SPLITS, d), normalised
    within the split, and LSE the base-2 partial lse (B, H_q, N_q, N_SPLITS), strides
    given for (b, h, t) with the split index contiguous after t. SPLIT=False (one
    split): Out is the output (B, N_q, H_q, d) and LSE the natural lse (B, H_q, N_q).
    """
    pid_hm = tl.program_id(0)  # (KV head, query-row block)
    split = tl.program_id(1)
    b = tl.program_id(2)
    hkv = pid_hm // M_BLOCKS
    mb = pid_hm % M_BLOCKS
    seqlen = tl.load(SEQLENS + b)

    # query rows: m = g * N_q + t (g: head within the group, t: new token)
    offs_m = mb * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = offs_m < GROUP * N_Q
    g = offs_m // N_Q
    row_t = offs_m % N_Q
    head = hkv * GROUP + g
    q_ptrs = (
        Q
        + b.to(tl.int64) * stride_qb
        + row_t[:, None] * stride_qt
        + head[:, None].to(tl.int64) * stride_qh
        + offs_d[None, :] * stride_qd
    )
    q = tl.load(q_ptrs, mask=row_ok[:, None] & (offs_d[None, :] < HEAD_DIM), other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    qk_scale = sm_scale * _LOG2E

    # this split's keys: [lo, hi), chunks a multiple of BLOCK_N long
    n_tiles = tl.cdiv(seqlen, BLOCK_N)
    chunk = tl.cdiv(n_tiles, N_SPLITS) * BLOCK_N
    lo = split * chunk
    hi = tl.minimum(lo + chunk, seqlen)
    # keys < full_end (a multiple of BLOCK_N) are seen by every query row
    if IS_CAUSAL:
        full_end = (tl.maximum(seqlen - N_Q + 1, 0) // BLOCK_N) * BLOCK_N
    else:
        full_end = (seqlen // BLOCK_N) * BLOCK_N
    mid = tl.maximum(tl.minimum(hi, full_end), lo)

    if PAGED:
        k_base = K + hkv.to(tl.int64) * stride_kh
        v_base = V + hkv.to(tl.int64) * stride_vh
    else:  # contiguous (B, N_max, H_kv, d): the sequence's own slab
        k_base = K + b.to(tl.int64) * stride_kp + hkv.to(tl.int64) * stride_kh
        v_base = V + b.to(tl.int64) * stride_vp + hkv.to(tl.int64) * stride_vh
    bt_row = BT + b.to(tl.int64) * stride_btb
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    offs_n0 = tl.arange(0, BLOCK_N)
    # K and V share a layout (checked on the host): one row offset serves both
    acc, l_i, m_i = _decode_tiles(
        acc,
        l_i,
        m_i,
        q,
        k_base,
        v_base,
        bt_row,
        lo,
        mid,
        seqlen,
        N_Q,
        row_t,
        qk_scale,
        offs_n0,
        offs_d,
        stride_kp,
        stride_kn,
        stride_kd,
        stride_vd,
        HEAD_DIM,
        PAGED,
        PAGE_SIZE,
        BLOCK_N,
        BLOCK_D,
        EVEN_D,
        False,
        IS_CAUSAL,
        UPCAST,
        DOT_PRECISION,
    )
    acc, l_i, m_i = _decode_tiles(
        acc,
        l_i,
        m_i,
        q,
        k_base,
        v_base,
        bt_row,
        mid,
        hi,
        seqlen,
        N_Q,
        row_t,
        qk_scale,
        offs_n0,
        offs_d,
        stride_kp,
        stride_kn,
        stride_kd,
        stride_vd,
        HEAD_DIM,
        PAGED,
        PAGE_SIZE,
        BLOCK_N,
        BLOCK_D,
        EVEN_D,
        True,
        IS_CAUSAL,
        UPCAST,
        DOT_PRECISION,
    )
    acc, lse2 = finish_rows(acc, l_i, m_i)

    o_rows = (
        b.to(tl.int64) * stride_ob
        + row_t.to(tl.int64) * stride_ot
        + head.to(tl.int64) * stride_oh
    )
    l_rows = (
        b.to(tl.int64) * stride_lb
        + head.to(tl.int64) * stride_lh
        + row_t.to(tl.int64) * stride_lt
    )
    if SPLIT:  # the split index is the innermost (after t) of the partial buffers
        o_rows += split * stride_od * HEAD_DIM
        l_rows += split
        tl.store(LSE + l_rows, lse2, mask=row_ok)
        tl.store(
            Out + o_rows[:, None] + offs_d[None, :] * stride_od,
            acc,
            mask=row_ok[:, None] & (offs_d[None, :] < HEAD_DIM),
        )
    else:
        tl.store(LSE + l_rows, lse2 * _LN2, mask=row_ok)
        tl.store(
            Out + o_rows[:, None] + offs_d[None, :] * stride_od,
            acc.to(Out.dtype.element_ty),
            mask=row_ok[:, None] & (offs_d[None, :] < HEAD_DIM),
        )


@triton.jit
def _decode_merge(
    OP,
    LSEP,
    Out,
    LSE,
    N_Q,
    H_Q,
    N_SPLITS,
    HEAD_DIM,
    stride_ob,
    stride_ot,
    stride_oh,
    stride_od,
    stride_lb,
    stride_lh,
    stride_lt,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """o = sum_s 2^(lse_s - lse) o_s with lse = log2 sum_s 2^lse_s, for one query row
    of one head (contiguous partials (B, H_q, N_q, N_SPLITS[, d]), base 2). Empty
    splits (lse_s = -inf) weigh 0; a row with no key anywhere gives 0 and -inf; a NaN
    partial lse makes the row NaN."""
    row = tl.program_id(0)  # ((b * H_q) + h) * N_q + t
    t = row % N_Q
    h = (row // N_Q) % H_Q
    b = row // (N_Q * H_Q)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
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
    tl.store(
        LSE
        + b.to(tl.int64) * stride_lb
        + h.to(tl.int64) * stride_lh
        + t.to(tl.int64) * stride_lt,
        lse * _LN2,
    )
