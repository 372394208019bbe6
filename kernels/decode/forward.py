"""The split-KV decode kernel (FlashDecoding over a paged KV cache).

``_decode_split``: one program per (KV head x query-row block, split, sequence). Its
query tile holds every query row that reads this KV head: the G = H_q / H_kv heads of
the group times the N_q new tokens, ``BLOCK_M`` rows (GQA packing; for MLA every query
head reads the one latent row), so each K/V tile is read from HBM once per group, not
once per query head. It streams its split's visible keys in ``BLOCK_N`` tiles through
the block table with the online softmax of ``kernels.flash`` (base 2, exp2) and writes
a normalised partial output and its base-2 log-sum-exp in fp32 (or, with one split,
the final output and the natural lse). A sliding window skips the key tiles outside
it; softcap, ALiBi, learned sinks and an fp8 cache (upcast after loading, descales
folded into the scale and the output) are constexpr paths. The merge and the shared
blocks are in :mod:`kernels.decode.blocks`, the tiles in :mod:`kernels.decode.tiles`,
the checks in :mod:`kernels.decode.checks`, the launch in :mod:`kernels.decode.api`.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..common import LN2_JIT, LOG2E_JIT
from ..flash import finish_rows, finite_dot
from .blocks import _decode_merge, _kv_offsets, _scores, _window_row_max

__all__ = ["_decode_split", "_decode_merge"]


@triton.jit
def _fp8_to(x, dtype, NATIVE: tl.constexpr):
    """An e4m3fn tile as ``dtype`` (exact: every e4m3 value is an fp16/bf16 value).
    NATIVE: Triton's conversion (sm_89+, the interpreter). Else x holds the raw bytes
    (uint8) and they are decoded with integer ops, for GPUs without fp8 conversions:
    shifted into an fp16's sign, exponent and mantissa fields the byte reads as its
    value times 2^-8 (normal and subnormal alike: the biases differ by 8), and
    S.1111.111 is NaN."""
    if NATIVE:
        y = x.to(dtype)
    else:
        b = x.to(tl.uint16)
        bits = ((b & 0x80) << 8) | ((b & 0x7F) << 7)
        h = bits.to(tl.float16, bitcast=True) * 256.0
        y = tl.where((b & 0x7F) == 0x7F, float("nan"), h).to(dtype)
    return y


@triton.jit
def _decode_tiles(
    acc,
    l_i,
    m_i,
    q,
    q_r,
    k_base,
    v_base,
    bt_row,
    lo,
    hi,
    seqlen,
    pos,
    qk_scale,
    cap2,
    slope2,
    win_left,
    win_right,
    offs_n0,
    offs_d,
    offs_r,
    stride_kp,
    stride_kn,
    stride_kd,
    stride_vd,
    HEAD_DIM,
    ROPE_DIM,
    PAGED: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_R: tl.constexpr,
    EVEN_D: tl.constexpr,
    MASKED: tl.constexpr,
    HAS_LEFT: tl.constexpr,
    HAS_RIGHT: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    HAS_ALIBI: tl.constexpr,
    SHARED_KV: tl.constexpr,
    FP8: tl.constexpr,
    FP8_NATIVE: tl.constexpr,
    UPCAST: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Stream the key tiles [lo, hi) past the resident query tile (online softmax).

    MASKED=False: tiles every query row sees in full (no mask, no bounds). MASKED=True:
    the tiles at the ends of the visible range, where keys past ``seqlen`` read as 0
    and the query at position i sees keys i - left <= j <= i + right (HAS_LEFT,
    HAS_RIGHT; causal is right = 0). There a value row hidden from a query could hold
    NaN (0 * NaN = NaN through the dot): non-finite values are zeroed for the product
    and the rows that do see one are set to NaN (a second, small dot counts them).
    BLOCK_R > 0 (MLA): the keys have ROPE_DIM more columns after the HEAD_DIM first
    (q_r's), and SHARED_KV: the values are the keys' first HEAD_DIM columns.
    """
    d_ok = offs_d[None, :] < HEAD_DIM
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        offs_n = start_n + offs_n0
        base, rows = _kv_offsets(
            bt_row, start_n, offs_n0, seqlen, stride_kp, stride_kn, PAGED, PAGE_SIZE,
            BLOCK_N, MASKED,
        )  # fmt: skip
        k_rows = (k_base + base) + rows[:, None]
        k_ptrs = k_rows + offs_d[None, :] * stride_kd
        v_ptrs = (v_base + base) + rows[:, None] + offs_d[None, :] * stride_vd
        if MASKED:
            kv_mask = (offs_n[:, None] < seqlen) & d_ok
            k = tl.load(k_ptrs, mask=kv_mask, other=0.0)
            if not SHARED_KV:
                v = tl.load(v_ptrs, mask=kv_mask, other=0.0)
        elif EVEN_D:
            k = tl.load(k_ptrs)
            if not SHARED_KV:
                v = tl.load(v_ptrs)
        else:
            k = tl.load(k_ptrs, mask=d_ok, other=0.0)
            if not SHARED_KV:
                v = tl.load(v_ptrs, mask=d_ok, other=0.0)
        if FP8:
            k = _fp8_to(k, q.dtype, FP8_NATIVE)
            v = _fp8_to(v, q.dtype, FP8_NATIVE)
        elif UPCAST:
            k = k.to(tl.float32)
            if not SHARED_KV:
                v = v.to(tl.float32)
        if SHARED_KV:
            v = k
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)  # (BLOCK_M, BLOCK_N)
        if BLOCK_R > 0:  # the rope columns of the latent row
            r_ptrs = k_rows + (HEAD_DIM + offs_r[None, :]) * stride_kd
            r_mask = offs_r[None, :] < ROPE_DIM
            if MASKED:
                r_mask = r_mask & (offs_n[:, None] < seqlen)
            k_r = tl.load(r_ptrs, mask=r_mask, other=0.0)
            if UPCAST:
                k_r = k_r.to(tl.float32)
            qk = tl.dot(q_r, tl.trans(k_r), qk, input_precision=DOT_PRECISION)
        s, visible = _scores(
            qk, qk_scale, cap2, slope2, offs_n, pos, seqlen, win_left, win_right,
            MASKED, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, HAS_ALIBI,
        )  # fmt: skip
        if MASKED:
            m_new, m_sub = _window_row_max(
                m_i, s, start_n, pos, seqlen, win_left, win_right, HAS_LEFT, HAS_RIGHT,
                BLOCK_N,
            )  # fmt: skip
        else:
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_sub = m_new
        p = tl.exp2(s - m_sub[:, None])
        alpha = tl.exp2(m_i - m_sub)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        if MASKED and (HAS_LEFT or HAS_RIGHT):  # no non-finite v reaches a hidden pair
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
    ALIBI,
    SINKS,
    KDESC,
    VDESC,
    sm_scale,
    softcap,
    win_left,
    win_right,
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
    stride_ab,
    stride_dsb,
    N_Q,
    GROUP,
    HEAD_DIM,
    ROPE_DIM,
    N_SPLITS,
    M_BLOCKS,
    PAGED: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    HAS_LEFT: tl.constexpr,
    HAS_RIGHT: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    HAS_ALIBI: tl.constexpr,
    HAS_SINKS: tl.constexpr,
    FP8: tl.constexpr,
    FP8_NATIVE: tl.constexpr,
    SHARED_KV: tl.constexpr,
    SPLIT: tl.constexpr,
    UPCAST: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_R: tl.constexpr,
    EVEN_D: tl.constexpr,
):
    """One split of one sequence's visible keys for one KV head's query rows.

    SPLIT=True: Out is the fp32 partial output (B, H_q, N_q, N_SPLITS, d), normalised
    within the split, and LSE the base-2 partial lse (B, H_q, N_q, N_SPLITS), strides
    given for (b, h, t) with the split index contiguous after t. SPLIT=False (one
    split): Out is the output (B, N_q, H_q, d) and LSE the natural lse (B, H_q, N_q).
    The visible keys are [max(0, L - N_q - left), L) (HAS_LEFT) or [0, L), cut into
    N_SPLITS chunks of whole tiles. Split 0 starts its online softmax from the sink
    (HAS_SINKS: a key of score sink and value 0). KDESC/VDESC (FP8, (B, H_kv)): the
    key descale multiplies the scale, the value descale the output.
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
    offs_r = tl.arange(0, BLOCK_R if BLOCK_R > 0 else 16)
    row_ok = offs_m < GROUP * N_Q
    g = offs_m // N_Q
    row_t = offs_m % N_Q
    pos = seqlen - N_Q + row_t  # the query's position in its sequence
    head = hkv * GROUP + g
    q_rows = (
        Q
        + b.to(tl.int64) * stride_qb
        + row_t[:, None] * stride_qt
        + head[:, None].to(tl.int64) * stride_qh
    )
    q = tl.load(
        q_rows + offs_d[None, :] * stride_qd,
        mask=row_ok[:, None] & (offs_d[None, :] < HEAD_DIM),
        other=0.0,
    )
    if BLOCK_R > 0:
        q_r = tl.load(
            q_rows + (HEAD_DIM + offs_r[None, :]) * stride_qd,
            mask=row_ok[:, None] & (offs_r[None, :] < ROPE_DIM),
            other=0.0,
        )
    else:
        q_r = q
    if UPCAST:
        q = q.to(tl.float32)
        q_r = q_r.to(tl.float32)
    qk_scale = sm_scale * LOG2E_JIT
    if FP8:
        qk_scale = qk_scale * tl.load(KDESC + b * stride_dsb + hkv)
    cap2 = softcap * LOG2E_JIT
    if HAS_ALIBI:
        slope2 = (
            tl.load(ALIBI + b * stride_ab + head, mask=row_ok, other=0.0) * LOG2E_JIT
        )
    else:
        slope2 = qk_scale

    # the visible keys [k_lo, seqlen); this split's [lo, hi), whole tiles
    if HAS_LEFT:
        k_lo = (tl.maximum(seqlen - N_Q - win_left, 0) // BLOCK_N) * BLOCK_N
    else:
        k_lo = 0
    n_tiles = tl.cdiv(seqlen - k_lo, BLOCK_N)
    chunk = tl.cdiv(n_tiles, N_SPLITS) * BLOCK_N
    lo = k_lo + split * chunk
    hi = tl.minimum(lo + chunk, seqlen)
    # keys in [full_lo, full_end) (multiples of BLOCK_N) are seen by every query row
    if HAS_LEFT:  # the last query (i = L - 1) sees j >= L - 1 - left
        full_lo = tl.cdiv(tl.maximum(seqlen - 1 - win_left, 0), BLOCK_N) * BLOCK_N
    else:
        full_lo = 0
    full_end = (seqlen // BLOCK_N) * BLOCK_N
    if HAS_RIGHT:  # the first query (i = L - N_q) sees j <= L - N_q + right
        full_end = tl.minimum(
            full_end,
            (tl.maximum(seqlen - N_Q + win_right + 1, 0) // BLOCK_N) * BLOCK_N,
        )
    a_end = tl.minimum(tl.maximum(full_lo, lo), tl.maximum(hi, lo))
    b_end = tl.minimum(tl.maximum(full_end, a_end), tl.maximum(hi, a_end))

    if PAGED:
        k_base = K + hkv.to(tl.int64) * stride_kh
        v_base = V + hkv.to(tl.int64) * stride_vh
    else:  # contiguous (B, N_max, H_kv, d): the sequence's own slab
        k_base = K + b.to(tl.int64) * stride_kp + hkv.to(tl.int64) * stride_kh
        v_base = V + b.to(tl.int64) * stride_vp + hkv.to(tl.int64) * stride_vh
    bt_row = BT + b.to(tl.int64) * stride_btb
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    if HAS_SINKS:  # the sink joins split 0 as a key of value 0
        sink2 = tl.load(SINKS + head, mask=row_ok, other=0.0) * LOG2E_JIT
        m_i = tl.where(split == 0, sink2, m_i)
        l_i = tl.where(split == 0, 1.0, l_i)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    offs_n0 = tl.arange(0, BLOCK_N)
    # K and V share a layout (checked on the host): one row offset serves both. Three
    # runs of tiles, unrolled: [lo, a_end) masked at the window's start (HAS_LEFT
    # only), [a_end, b_end) seen in full by every row, [b_end, hi) masked at the end.
    ends = (lo, a_end, b_end, hi)
    for part in tl.static_range(3):
        if part != 0 or HAS_LEFT:
            acc, l_i, m_i = _decode_tiles(
                acc, l_i, m_i, q, q_r, k_base, v_base, bt_row, ends[part],
                ends[part + 1], seqlen, pos, qk_scale, cap2, slope2, win_left,
                win_right, offs_n0, offs_d, offs_r, stride_kp, stride_kn, stride_kd,
                stride_vd, HEAD_DIM, ROPE_DIM, PAGED, PAGE_SIZE, BLOCK_N, BLOCK_D,
                BLOCK_R, EVEN_D, part != 1, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP,
                HAS_ALIBI, SHARED_KV, FP8, FP8_NATIVE, UPCAST, DOT_PRECISION,
            )  # fmt: skip
    acc, lse2 = finish_rows(acc, l_i, m_i)
    if FP8:
        acc = acc * tl.load(VDESC + b * stride_dsb + hkv)

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
    o_mask = row_ok[:, None] & (offs_d[None, :] < HEAD_DIM)
    if SPLIT:  # the split index is the innermost (after t) of the partial buffers
        o_rows += split * stride_od * HEAD_DIM
        l_rows += split
        tl.store(LSE + l_rows, lse2, mask=row_ok)
        tl.store(Out + o_rows[:, None] + offs_d[None, :] * stride_od, acc, mask=o_mask)
    else:
        tl.store(LSE + l_rows, lse2 * LN2_JIT, mask=row_ok)
        tl.store(
            Out + o_rows[:, None] + offs_d[None, :] * stride_od,
            acc.to(Out.dtype.element_ty),
            mask=o_mask,
        )
