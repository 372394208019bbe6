"""The shared ``@triton.jit`` pieces of the FlashAttention kernels.

Tile loads and stores with their edge masks, the causal key and query ranges of a
block, the masked row maximum, the online-softmax step of the forwards
(``softmax_pv_step``, used by the pointer and the TMA forward), the rows' finish, the
backward's query-row loader and the pair-by-pair dot of the NaN shield.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def load_tile(
    ptrs, offs_r, offs_d, n_rows, HEAD_DIM, EVEN_R: tl.constexpr, EVEN_D: tl.constexpr
):
    """Load a (rows, BLOCK_D) tile; rows >= n_rows and columns >= HEAD_DIM read as 0."""
    if EVEN_R and EVEN_D:
        return tl.load(ptrs)
    elif EVEN_R:
        return tl.load(ptrs, mask=offs_d[None, :] < HEAD_DIM, other=0.0)
    elif EVEN_D:
        return tl.load(ptrs, mask=offs_r[:, None] < n_rows, other=0.0)
    else:
        return tl.load(
            ptrs,
            mask=(offs_r[:, None] < n_rows) & (offs_d[None, :] < HEAD_DIM),
            other=0.0,
        )


@triton.jit
def _store_tile(
    ptrs,
    value,
    offs_r,
    offs_d,
    n_rows,
    HEAD_DIM,
    EVEN_R: tl.constexpr,
    EVEN_D: tl.constexpr,
):
    """Store a (rows, BLOCK_D) tile, skipping rows >= n_rows and columns >= HEAD_DIM."""
    if EVEN_R and EVEN_D:
        tl.store(ptrs, value)
    elif EVEN_R:
        tl.store(ptrs, value, mask=offs_d[None, :] < HEAD_DIM)
    elif EVEN_D:
        tl.store(ptrs, value, mask=offs_r[:, None] < n_rows)
    else:
        tl.store(
            ptrs, value, mask=(offs_r[:, None] < n_rows) & (offs_d[None, :] < HEAD_DIM)
        )


@triton.jit
def _select_dot(
    acc,
    a,
    visible,
    b_base,
    stride_br,
    stride_bd,
    start,
    offs,
    offs_d,
    n_rows,
    HEAD_DIM,
    BLOCK: tl.constexpr,
):
    """acc += where(visible, a, 0) @ B[start : start + BLOCK], one column of ``a`` (one
    row of B, read from global memory) at a time: rank-1 updates selected by
    ``visible``, so a hidden pair's row of B never enters a product (in ``tl.dot`` a
    hidden pair weighs 0, and 0 * NaN = NaN). ``offs`` numbers a's columns (= B's rows);
    B rows >= n_rows read as 0. The slow path of the causal masked tiles, taken only
    when V holds NaN/inf: the forward's P V."""
    for jj in range(0, BLOCK):
        col = offs == start + jj  # (BLOCK,)
        a_j = tl.sum(tl.where(col[None, :], a, 0.0), 1)  # column jj of a
        vis_j = tl.sum(tl.where(col[None, :] & visible, 1, 0), 1) > 0
        b_j = tl.load(
            b_base + (start + jj) * stride_br + offs_d * stride_bd,
            mask=(offs_d < HEAD_DIM) & (start + jj < n_rows),
            other=0.0,
        ).to(tl.float32)  # (BLOCK_D,)
        acc += tl.where(vis_j[:, None], a_j[:, None] * b_j[None, :], 0.0)
    return acc


@triton.jit
def key_range(
    start_m,
    N_Q,
    N_K,
    IS_CAUSAL: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """The keys of query block ``start_m``: (hi, full_end). Causal (bottom-right): row
    i sees keys j <= i + N_k - N_q, so the block needs keys < hi, and keys < full_end
    (a multiple of BLOCK_N) are visible to every row of the block: no mask there.
    Shared by the forwards, the dQ kernel and kernels.hard."""
    if IS_CAUSAL:
        causal_offset = N_K - N_Q
        hi = tl.maximum(tl.minimum(N_K, (start_m + 1) * BLOCK_M + causal_offset), 0)
        first_row_sees = tl.maximum(start_m * BLOCK_M + causal_offset + 1, 0)
        full_end = tl.minimum(
            (first_row_sees // BLOCK_N) * BLOCK_N, (N_K // BLOCK_N) * BLOCK_N
        )
    else:
        hi = N_K
        full_end = (N_K // BLOCK_N) * BLOCK_N
    return hi, full_end


@triton.jit
def _query_range(
    start_n,
    N_Q,
    N_K,
    IS_CAUSAL: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """The query blocks of key block ``start_n``: (lo, full_start, end_m). Causal: key
    j is seen by rows i >= j - (N_k - N_q); rows [lo, full_start) see some keys of the
    block (masked), rows [full_start, end_m) every key. Shared by the dK/dV kernel and
    kernels.flash.backward_fused."""
    end_m = tl.cdiv(N_Q, BLOCK_M) * BLOCK_M
    if IS_CAUSAL:
        causal_offset = N_K - N_Q
        lo = (tl.maximum(start_n - causal_offset, 0) // BLOCK_M) * BLOCK_M
        full_start = (
            tl.cdiv(tl.maximum(start_n + BLOCK_N - 1 - causal_offset, 0), BLOCK_M)
            * BLOCK_M
        )
        full_start = tl.minimum(full_start, end_m)
        lo = tl.minimum(lo, full_start)
    else:
        lo = 0
        full_start = 0
    return lo, full_start, end_m


@triton.jit
def masked_row_max(
    m_i, s, start_n, offs_m, N_K, causal_offset, IS_CAUSAL: tl.constexpr
):
    """The running row max after a masked tile of base-2 scores ``s`` (hidden pairs
    -inf), and the value to subtract from the scores (0 for a row with no visible key
    yet, whose max stays -inf).

    A row that sees a key of this tile but whose scores are all -inf (an input inf, or
    q k^T * scale overflowing fp32) has no softmax: NaN, never read as "no visible
    key". (The tile's first key is visible to a row iff any of its keys is.)
    """
    m_ij = tl.maximum(m_i, tl.max(s, 1))
    sees = start_n < N_K
    if IS_CAUSAL:
        sees = sees & (start_n <= offs_m + causal_offset)
    m_ij = tl.where(sees & (m_ij == float("-inf")), float("nan"), m_ij)
    return m_ij, tl.where(m_ij == float("-inf"), 0.0, m_ij)


@triton.jit
def finish_rows(acc, l_i, m_i):
    """The forward's epilogue: o = acc / l and the base-2 lse (on the same fp32 grid
    as the scores the backward recomputes). A row that saw no key has l = 0: o = 0, lse
    = -inf. l = 0 with a max other than -inf means the row's top score overflowed fp32
    (q k^T * scale beyond 3.4e38; otherwise its own key adds exp2(0) = 1): no fp32
    softmax exists, so NaN, never the "no visible key" answer."""
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    acc = acc / l_safe[:, None]
    lse2 = tl.where(empty, float("-inf"), m_i + tl.log2(l_safe))
    overflow = empty & (m_i != float("-inf"))
    acc = tl.where(overflow[:, None], float("nan"), acc)
    return acc, tl.where(overflow, float("nan"), lse2)


@triton.jit
def softmax_pv_step(
    acc,
    l_i,
    m_i,
    qk,
    v,
    v_base,
    stride_vn,
    stride_vd,
    start_n,
    offs_n,
    offs_m,
    offs_d,
    qk_scale,
    N_K,
    HEAD_DIM,
    causal_offset,
    v_bad,
    BLOCK_N: tl.constexpr,
    MASKED: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    NEG_SCALE: tl.constexpr,
):
    """One key block of the online softmax, from the raw scores qk = q k^T of the
    block and its value tile v: the new running max, row sum and accumulator.
    (Shared by the pointer forward (kernels.flash.forward) and the TMA forward
    (kernels.flash.forward_tma), which differ only in how k and v reach SRAM.)

    MASKED=False: every (query, key) pair in range is visible, no mask is computed, and
    the scale is folded into one FFMA per score: m = max(m, rowmax(qk) * scale) and p =
    exp2(qk * scale - m) (rowmin when the scale is negative, NEG_SCALE).
    MASKED=True: the diagonal blocks (causal) and the ragged last key block; there the
    scores are scaled first and then masked with -inf (the order the sign needs).
    """
    if MASKED:
        # scores in base 2: s = q k^T * scale * log2(e), hidden pairs -inf
        s = qk * qk_scale
        visible = offs_n[None, :] < N_K
        if IS_CAUSAL:
            visible = visible & (offs_n[None, :] <= offs_m[:, None] + causal_offset)
        s = tl.where(visible, s, float("-inf"))
        # -- online softmax: new running max, rescale what was accumulated so far --
        m_ij, m_ij_safe = masked_row_max(
            m_i, s, start_n, offs_m, N_K, causal_offset, IS_CAUSAL
        )
        p = tl.exp2(s - m_ij_safe[:, None])
    else:
        # max of qk * scale without scaling every score: the scale is one number
        if NEG_SCALE:
            m_ij = tl.maximum(m_i, tl.min(qk, 1) * qk_scale)
        else:
            m_ij = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        m_ij_safe = m_ij
        p = tl.exp2(qk * qk_scale - m_ij[:, None])  # one FFMA per score
    alpha = tl.exp2(m_i - m_ij_safe)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    if MASKED and IS_CAUSAL:
        # A hidden key has p = 0, but 0 * NaN = NaN: a NaN/inf in a value row hidden
        # from a query would reach it through the dot. When V holds a non-finite
        # value anywhere (v_bad: one flag computed beside the launch), the causal
        # tiles are summed key by key instead, selecting only the visible terms, so
        # no result depends on the tiles. (The keys past N_K of a ragged tile
        # load as 0 and need no care. Scanning each tile for non-finite values
        # instead costs a float32 copy of it in registers: ptxas spills.)
        if v_bad != 0:
            acc = _select_dot(
                acc,
                p,
                visible,
                v_base,
                stride_vn,
                stride_vd,
                start_n,
                offs_n,
                offs_d,
                N_K,
                HEAD_DIM,
                BLOCK_N,
            )
        else:
            acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)
    else:
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)
    return acc, l_i, m_ij


@triton.jit
def _load_query_rows(
    q_base,
    do_base,
    lse_base,
    delta_base,
    offs_m,
    offs_d,
    stride_qm,
    stride_qd,
    stride_dom,
    stride_dod,
    N_Q,
    HEAD_DIM,
    EVEN_M: tl.constexpr,
    EVEN_D: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """The backward's per-query-row inputs for rows ``offs_m``: q and dO tiles, the
    base-2 lse and delta. Rows past N_q read lse = +inf (P = 0), and a row with no
    visible key (lse = -inf) gets +inf too, so its P is 0, not inf. Shared by both
    backward kernels and kernels.flash.backward_fused."""
    q = load_tile(
        q_base + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd,
        offs_m,
        offs_d,
        N_Q,
        HEAD_DIM,
        EVEN_M,
        EVEN_D,
    )
    do = load_tile(
        do_base + offs_m[:, None] * stride_dom + offs_d[None, :] * stride_dod,
        offs_m,
        offs_d,
        N_Q,
        HEAD_DIM,
        EVEN_M,
        EVEN_D,
    )
    if UPCAST:
        q = q.to(tl.float32)
        do = do.to(tl.float32)
    if EVEN_M:
        lse2 = tl.load(lse_base + offs_m)
        delta = tl.load(delta_base + offs_m)
    else:
        lse2 = tl.load(lse_base + offs_m, mask=offs_m < N_Q, other=float("inf"))
        delta = tl.load(delta_base + offs_m, mask=offs_m < N_Q, other=0.0)
    lse2 = tl.where(lse2 == float("-inf"), float("inf"), lse2)
    return q, do, lse2, delta


@triton.jit
def finite_dot(acc, a, b, visible, COUNT: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """acc += a @ b, where ``a`` is 0 at the hidden pairs (``visible`` False) and no
    non-finite entry of b may reach acc through a hidden pair (in a plain dot it weighs
    0, and 0 * NaN = NaN). The slow path of the causal masked tiles, taken only when an
    input holds NaN/inf.

    b's non-finite entries are zeroed for the product. Where a VISIBLE pair meets one,
    the output must still turn NaN: for dS^T Q and dS K it does by itself (a NaN in q
    or k makes that row's scores, lse and so its dS NaN, and a NaN dS spreads through
    the product); for P^T dO (COUNT) a second dot counts, per output entry, the visible
    non-finite entries of b that feed it, and those outputs become NaN.
    """
    finite = tl.abs(b.to(tl.float32)) < float("inf")  # NaN compares False
    acc = tl.dot(
        a.to(b.dtype),
        tl.where(finite, b, 0.0).to(b.dtype),
        acc,
        input_precision=DOT_PRECISION,
    )
    if COUNT:
        hits = tl.dot(visible.to(tl.float16), (~finite).to(tl.float16))
        acc = tl.where(hits > 0, float("nan"), acc)
    return acc
