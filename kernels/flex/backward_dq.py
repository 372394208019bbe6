"""The flex backward's dQ kernel: one program per (BLOCK_M queries, batch x q head),
walking the block mask's kv lists as the forward does (full tiles, then partial ones
with the mask evaluated), dQ += dS K with P recomputed from the saved lse; and the
score mod's value and derivative (``_score_and_grad``), shared with the dK/dV kernel
of :mod:`.backward`.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..common import LOG2E_JIT
from ..flash import finite_dot, load_tile


@triton.jit
def _score_and_grad(
    x,
    b,
    h,
    q_idx,
    kv_idx,
    SMI,
    SMF,
    SCORE_FN: tl.constexpr,
    GRAD_FN: tl.constexpr,
    HAS_SCORE: tl.constexpr,
    HAS_GRAD: tl.constexpr,
):
    """(f(x), f'(x)) of the score mod at the natural score x (f = identity without)."""
    if HAS_SCORE:
        s = SCORE_FN(x, b, h, q_idx, kv_idx, SMI, SMF)
        if HAS_GRAD:
            g = GRAD_FN(x, b, h, q_idx, kv_idx, SMI, SMF)
        else:  # a user's mod without its derivative: a five-point difference
            # f' ~ (8 (f(x+h) - f(x-h)) - (f(x+2h) - f(x-2h))) / 12h, error O(h^4 f^(5))
            # plus the rounding of f over h. The step follows the scale of the score
            # and of what the mod adds to it, max(1, |x|, |f(x) - x|): a large offset
            # (a bias of 1,000) is then differenced over a step its rounding cannot
            # swamp. h is that scale's power of two times 2^-5 (the exponent bits
            # kept, the mantissa cleared), so x +- h and x +- 2h are exact in fp32 and
            # the stencil's spacing is the one divided by.
            reach = tl.maximum(tl.maximum(tl.abs(x), tl.abs(s - x)), 1.0)
            bits = reach.to(tl.int32, bitcast=True) & 0x7F800000
            step = bits.to(tl.float32, bitcast=True) * 0.03125
            f1 = SCORE_FN(x + step, b, h, q_idx, kv_idx, SMI, SMF)
            m1 = SCORE_FN(x - step, b, h, q_idx, kv_idx, SMI, SMF)
            f2 = SCORE_FN(x + 2.0 * step, b, h, q_idx, kv_idx, SMI, SMF)
            m2 = SCORE_FN(x - 2.0 * step, b, h, q_idx, kv_idx, SMI, SMF)
            g = (8.0 * (f1 - m1) - (f2 - m2)) / (12.0 * step)
            # a score the mod sets to -inf is its own mask: weight 0 and no gradient
            # (the difference across it is -inf - -inf = NaN, and 0 * NaN = NaN)
            g = tl.where(s == float("-inf"), 0.0, g)
    else:
        s = x
        g = x  # unused
    return s, g


@triton.jit
def _dq_tile(
    dq,
    q,
    do,
    lse2,
    delta,
    k_base,
    v_base,
    stride_kn,
    stride_kd,
    stride_vn,
    stride_vd,
    start_n,
    offs_m,
    offs_d,
    offs_dv,
    b,
    h,
    scale,
    N_K,
    HEAD_DIM,
    HEAD_DIM_V,
    MI,
    MF,
    SMI,
    SMF,
    SHIELD: tl.constexpr,
    MASK_FN: tl.constexpr,
    SCORE_FN: tl.constexpr,
    GRAD_FN: tl.constexpr,
    PARTIAL: tl.constexpr,
    HAS_SCORE: tl.constexpr,
    HAS_GRAD: tl.constexpr,
    EVEN_N: tl.constexpr,
    EVEN_D: tl.constexpr,
    UPCAST: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    offs_n = start_n + tl.arange(0, BLOCK_N)
    k = load_tile(
        k_base + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd,
        offs_n,
        offs_d,
        N_K,
        HEAD_DIM,
        EVEN_N,
        EVEN_D,
    )
    v = load_tile(
        v_base + offs_n[:, None] * stride_vn + offs_dv[None, :] * stride_vd,
        offs_n,
        offs_dv,
        N_K,
        HEAD_DIM_V,
        EVEN_N,
        EVEN_D,
    )
    if UPCAST:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    x = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale
    s, g = _score_and_grad(
        x,
        b,
        h,
        offs_m[:, None],
        offs_n[None, :],
        SMI,
        SMF,
        SCORE_FN,
        GRAD_FN,
        HAS_SCORE,
        HAS_GRAD,
    )
    s = s * LOG2E_JIT
    vis = offs_n[None, :] < N_K
    if PARTIAL:
        vis = vis & MASK_FN(b, h, offs_m[:, None], offs_n[None, :], MI, MF)
    if PARTIAL or not EVEN_N:
        s = tl.where(vis, s, float("-inf"))
    p = tl.exp2(s - lse2[:, None])
    if PARTIAL:
        p = tl.where(vis, p, 0.0)
    dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)
    ds = p * (dp - delta[:, None])
    if HAS_SCORE:
        ds = ds * g
    if PARTIAL or not EVEN_N:
        ds = tl.where(vis, ds, 0.0)
    if PARTIAL:
        if SHIELD:
            dq = finite_dot(dq, ds, k, vis, False, DOT_PRECISION)
        else:
            dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=DOT_PRECISION)
    else:
        dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=DOT_PRECISION)
    return dq


@triton.jit
def _flex_dq(
    Q,
    K,
    V,
    DO,
    LSE2,
    Delta,
    DQ,
    BAD,
    KV_NUM,
    KV_IDX,
    FKV_NUM,
    FKV_IDX,
    MI,
    MF,
    SMI,
    SMF,
    scale,
    stride_qz,
    stride_qh,
    stride_qm,
    stride_qd,
    stride_kz,
    stride_kh,
    stride_kn,
    stride_kd,
    stride_vz,
    stride_vh,
    stride_vn,
    stride_vd,
    stride_doz,
    stride_doh,
    stride_dom,
    stride_dod,
    stride_dqz,
    stride_dqh,
    stride_dqm,
    stride_dqd,
    bm_sz,
    bm_sh,
    NKB,
    H,
    GROUP,
    N_Q,
    N_K,
    HEAD_DIM,
    HEAD_DIM_V,
    MASK_FN: tl.constexpr,
    SCORE_FN: tl.constexpr,
    GRAD_FN: tl.constexpr,
    HAS_SCORE: tl.constexpr,
    HAS_GRAD: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    UPCAST: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SQ: tl.constexpr,
    SK: tl.constexpr,
    EVEN_M: tl.constexpr,
    EVEN_N: tl.constexpr,
    EVEN_D: tl.constexpr,
    SHIELD: tl.constexpr,
):
    # SHIELD: the second launch (only when an input holds NaN/inf: it stops otherwise)
    start_m = tl.program_id(0)
    off_hz = tl.program_id(1)
    b = off_hz // H
    h = off_hz % H
    h_kv = h // GROUP
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    q = load_tile(
        Q
        + b.to(tl.int64) * stride_qz
        + h.to(tl.int64) * stride_qh
        + offs_m[:, None] * stride_qm
        + offs_d[None, :] * stride_qd,
        offs_m,
        offs_d,
        N_Q,
        HEAD_DIM,
        EVEN_M,
        EVEN_D,
    )
    do = load_tile(
        DO
        + b.to(tl.int64) * stride_doz
        + h.to(tl.int64) * stride_doh
        + offs_m[:, None] * stride_dom
        + offs_dv[None, :] * stride_dod,
        offs_m,
        offs_dv,
        N_Q,
        HEAD_DIM_V,
        EVEN_M,
        EVEN_D,
    )
    if UPCAST:
        q = q.to(tl.float32)
        do = do.to(tl.float32)
    row_base = off_hz.to(tl.int64) * N_Q
    lse2 = tl.load(LSE2 + row_base + offs_m, mask=offs_m < N_Q, other=float("inf"))
    lse2 = tl.where(lse2 == float("-inf"), float("inf"), lse2)
    delta = tl.load(Delta + row_base + offs_m, mask=offs_m < N_Q, other=0.0)
    k_base = K + b.to(tl.int64) * stride_kz + h_kv.to(tl.int64) * stride_kh
    v_base = V + b.to(tl.int64) * stride_vz + h_kv.to(tl.int64) * stride_vh
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    if SHIELD:
        go = tl.load(BAD) != 0
    else:
        go = True
    row = b * bm_sz + h * bm_sh + (start_m * BLOCK_M) // SQ
    # the full tiles first (no mask evaluated), then the partial ones (the mask
    # evaluated pair by pair): one loop, unrolled twice at compile time
    for PARTIAL in tl.static_range(2):
        if PARTIAL:
            n_tiles = tl.load(KV_NUM + row)
            idx = KV_IDX
        else:
            n_tiles = tl.load(FKV_NUM + row)
            idx = FKV_IDX
        if SHIELD:
            n_tiles = tl.where(go, n_tiles, 0)
        for i in range(0, n_tiles * (SK // BLOCK_N)):
            kb = tl.load(idx + row * NKB + i // (SK // BLOCK_N))
            sub = i % (SK // BLOCK_N)
            dq = _dq_tile(
                dq,
                q,
                do,
                lse2,
                delta,
                k_base,
                v_base,
                stride_kn,
                stride_kd,
                stride_vn,
                stride_vd,
                kb * SK + sub * BLOCK_N,
                offs_m,
                offs_d,
                offs_dv,
                b,
                h,
                scale,
                N_K,
                HEAD_DIM,
                HEAD_DIM_V,
                MI,
                MF,
                SMI,
                SMF,
                SHIELD,
                MASK_FN,
                SCORE_FN,
                GRAD_FN,
                PARTIAL,
                HAS_SCORE,
                HAS_GRAD,
                EVEN_N,
                EVEN_D,
                UPCAST,
                DOT_PRECISION,
                BLOCK_N,
            )
    dq = dq * scale
    tl.store(
        DQ
        + b.to(tl.int64) * stride_dqz
        + h.to(tl.int64) * stride_dqh
        + offs_m[:, None] * stride_dqm
        + offs_d[None, :] * stride_dqd,
        dq.to(DQ.dtype.element_ty),
        mask=(offs_m[:, None] < N_Q) & (offs_d[None, :] < HEAD_DIM) & go,
    )
