"""The ``@triton.jit`` pieces of the fused backward (:mod:`.backward_fused`).

``_select_pairs`` (the NaN/inf shield of a masked tile: dV, dK and the dQ partial query
row by query row, visible pairs only), ``_tile_updates`` (the five matmuls of one
(key block, query block) tile and the dQ atomics) and ``_attn_bwd_fused_inner`` (the
loop over the query blocks of one q head).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .blocks import _load_query_rows


@triton.jit
def _select_pairs(
    dk,
    dv,
    q_base,
    do_base,
    k_base,
    v_base,
    dq_base,
    lse_base,
    delta_base,
    stride_qm,
    stride_qd,
    stride_dom,
    stride_dod,
    stride_kn,
    stride_kd,
    stride_vn,
    stride_vd,
    stride_dqm,
    stride_dqd,
    start_m,
    start_n,
    offs_d,
    qk_scale,
    N_Q,
    N_K,
    HEAD_DIM,
    causal_offset,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """One masked tile, pair by pair: only the VISIBLE (query, key) pairs are computed
    (p = exp2(q.k * scale - lse), ds = p (dO.v - delta)) and added into dV, dK and,
    by fp32 atomics, dQ, so a NaN/inf in a hidden query row (Q, dO) or a hidden key
    (K, V) never enters a product as 0 * NaN. The rows and keys are re-read from
    memory (L1/L2 hits): no tile of scores is held, so this rare path adds few
    registers to the kernel. Slow (BLOCK_M x BLOCK_N scalar steps), and only taken
    when the inputs hold a NaN/inf."""
    dmask = offs_d < HEAD_DIM
    rows = tl.arange(0, BLOCK_N)
    for jj in range(0, BLOCK_N):
        key = start_n + jj
        k_j = tl.load(
            k_base + key * stride_kn + offs_d * stride_kd,
            mask=dmask & (key < N_K),
            other=0.0,
        ).to(tl.float32)
        v_j = tl.load(
            v_base + key * stride_vn + offs_d * stride_vd,
            mask=dmask & (key < N_K),
            other=0.0,
        ).to(tl.float32)
        dk_j = tl.zeros([BLOCK_D], dtype=tl.float32)
        dv_j = tl.zeros([BLOCK_D], dtype=tl.float32)
        for ii in range(0, BLOCK_M):
            row = start_m + ii
            if (key <= row + causal_offset) & (key < N_K) & (row < N_Q):
                q_i = tl.load(
                    q_base + row * stride_qm + offs_d * stride_qd, mask=dmask, other=0.0
                ).to(tl.float32)
                do_i = tl.load(
                    do_base + row * stride_dom + offs_d * stride_dod,
                    mask=dmask,
                    other=0.0,
                ).to(tl.float32)
                p = tl.exp2(tl.sum(q_i * k_j, 0) * qk_scale - tl.load(lse_base + row))
                ds = p * (tl.sum(do_i * v_j, 0) - tl.load(delta_base + row))
                dv_j += p * do_i
                dk_j += ds * q_i
                tl.atomic_add(
                    dq_base + row * stride_dqm + offs_d * stride_dqd,
                    ds * k_j,
                    mask=dmask,
                    sem="relaxed",
                )
        dv = tl.where(rows[:, None] == jj, dv + dv_j[None, :], dv)
        dk = tl.where(rows[:, None] == jj, dk + dk_j[None, :], dk)
    return dk, dv


@triton.jit
def _tile_updates(
    dk,
    dv,
    k,
    v,
    q_base,
    do_base,
    dq_base,
    lse_base,
    delta_base,
    stride_qm,
    stride_qd,
    stride_dom,
    stride_dod,
    stride_dqm,
    stride_dqd,
    start_m,
    offs_n,
    offs_d,
    qk_scale,
    N_Q,
    N_K,
    HEAD_DIM,
    causal_offset,
    BLOCK_M: tl.constexpr,
    MASKED: tl.constexpr,
    EVEN_M: tl.constexpr,
    EVEN_N: tl.constexpr,
    EVEN_D: tl.constexpr,
    UPCAST: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """The five matmuls for one query block against the resident key block.

    Transposed tiles (keys along rows), as kernels.flash's dK/dV kernel. MASKED=True:
    a causal diagonal block. Query rows past N_q load lse = +inf (P = 0); key rows past
    N_k get s = -inf before exp2.
    """
    offs_m = start_m + tl.arange(0, BLOCK_M)
    q, do, lse2, delta = _load_query_rows(
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
        EVEN_M,
        EVEN_D,
        UPCAST,
    )
    # S^T = K Q^T, (BLOCK_N, BLOCK_M), in base 2
    sT = tl.dot(k, tl.trans(q), input_precision=DOT_PRECISION) * qk_scale
    if MASKED:
        sT = tl.where(
            offs_n[:, None] <= offs_m[None, :] + causal_offset, sT, float("-inf")
        )
    if not EVEN_N:  # padded key rows: P = 0, never exp2(0 - lse)
        sT = tl.where(offs_n[:, None] < N_K, sT, float("-inf"))
    pT = tl.exp2(sT - lse2[None, :])
    # dV += P^T dO
    dv = tl.dot(pT.to(do.dtype), do, dv, input_precision=DOT_PRECISION)
    # dP^T = V dO^T;  dS^T = P^T * (dP^T - delta)
    dpT = tl.dot(v, tl.trans(do), input_precision=DOT_PRECISION)
    dsT = (pT * (dpT - delta[None, :])).to(q.dtype)
    # dQ_partial = dS K -> fp32 atomics (relaxed: only the sum matters, not the order)
    dq = tl.dot(tl.trans(dsT), k, input_precision=DOT_PRECISION)
    dq_ptrs = dq_base + offs_m[:, None] * stride_dqm + offs_d[None, :] * stride_dqd
    if EVEN_M and EVEN_D:
        tl.atomic_add(dq_ptrs, dq, sem="relaxed")
    elif EVEN_M:
        tl.atomic_add(dq_ptrs, dq, mask=offs_d[None, :] < HEAD_DIM, sem="relaxed")
    elif EVEN_D:
        tl.atomic_add(dq_ptrs, dq, mask=offs_m[:, None] < N_Q, sem="relaxed")
    else:
        tl.atomic_add(
            dq_ptrs,
            dq,
            mask=(offs_m[:, None] < N_Q) & (offs_d[None, :] < HEAD_DIM),
            sem="relaxed",
        )
    # dK += dS^T Q  (times sm_scale once, at the end)
    dk = tl.dot(dsT, q, dk, input_precision=DOT_PRECISION)
    return dk, dv


@triton.jit
def _attn_bwd_fused_inner(
    dk,
    dv,
    k,
    v,
    q_base,
    do_base,
    k_base,
    v_base,
    dq_base,
    lse_base,
    delta_base,
    stride_qm,
    stride_qd,
    stride_dom,
    stride_dod,
    stride_kn,
    stride_kd,
    stride_vn,
    stride_vd,
    stride_dqm,
    stride_dqd,
    start_n,
    offs_n,
    offs_d,
    lo,
    hi,
    qk_scale,
    N_Q,
    N_K,
    HEAD_DIM,
    causal_offset,
    bad,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    MASKED: tl.constexpr,
    EVEN_M: tl.constexpr,
    EVEN_N: tl.constexpr,
    EVEN_D: tl.constexpr,
    UPCAST: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Query blocks [lo, hi) against the resident key block. MASKED=True: the causal
    diagonal blocks, pair by pair when the inputs hold a NaN/inf (``bad``)."""
    for start_m in range(lo, hi, BLOCK_M):
        start_m = tl.multiple_of(start_m, BLOCK_M)
        if MASKED:
            if bad != 0:
                dk, dv = _select_pairs(
                    dk,
                    dv,
                    q_base,
                    do_base,
                    k_base,
                    v_base,
                    dq_base,
                    lse_base,
                    delta_base,
                    stride_qm,
                    stride_qd,
                    stride_dom,
                    stride_dod,
                    stride_kn,
                    stride_kd,
                    stride_vn,
                    stride_vd,
                    stride_dqm,
                    stride_dqd,
                    start_m,
                    start_n,
                    offs_d,
                    qk_scale,
                    N_Q,
                    N_K,
                    HEAD_DIM,
                    causal_offset,
                    BLOCK_M,
                    BLOCK_N,
                    BLOCK_D,
                )
            else:
                dk, dv = _tile_updates(
                    dk,
                    dv,
                    k,
                    v,
                    q_base,
                    do_base,
                    dq_base,
                    lse_base,
                    delta_base,
                    stride_qm,
                    stride_qd,
                    stride_dom,
                    stride_dod,
                    stride_dqm,
                    stride_dqd,
                    start_m,
                    offs_n,
                    offs_d,
                    qk_scale,
                    N_Q,
                    N_K,
                    HEAD_DIM,
                    causal_offset,
                    BLOCK_M,
                    True,
                    EVEN_M,
                    EVEN_N,
                    EVEN_D,
                    UPCAST,
                    DOT_PRECISION,
                )
        else:
            dk, dv = _tile_updates(
                dk,
                dv,
                k,
                v,
                q_base,
                do_base,
                dq_base,
                lse_base,
                delta_base,
                stride_qm,
                stride_qd,
                stride_dom,
                stride_dod,
                stride_dqm,
                stride_dqd,
                start_m,
                offs_n,
                offs_d,
                qk_scale,
                N_Q,
                N_K,
                HEAD_DIM,
                causal_offset,
                BLOCK_M,
                False,
                EVEN_M,
                EVEN_N,
                EVEN_D,
                UPCAST,
                DOT_PRECISION,
            )
    return dk, dv
