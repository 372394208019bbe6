"""The sparse backward kernel: one program per (query token, batch x KV head x row
block), as the forward, recomputing P from the saved base-2 lse step by step.

dQ of the program's rows is summed in registers and written once (each query row
belongs to one program). dK and dV of the gathered keys, dS^T Q and P^T dO, are added
by relaxed fp32 atomics into (B, H_kv, N_k, d) buffers: the keys a token chose are
shared with every other token that chose them, in any order, so there is no per-key
program to own them without a transposed (key -> queries) list; the atomics make the
backward one kernel and one pass, at the price of a summation order (and so the last
bits of dK, dV) that varies from run to run. Hidden keys (padding, causal, past N_k)
are neither loaded nor written.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..common import LOG2E_JIT
from .blocks import chunk_keys, gathered_scores, group_rows, launch_sizes


@triton.jit
def _sparse_bwd(
    Q,
    K,
    V,
    IDX,
    DO,
    LSE2,
    Delta,
    DQ,
    DK,
    DV,
    sm_scale,
    stride_qb,
    stride_qh,
    stride_qm,
    stride_qd,
    stride_kb,
    stride_kh,
    stride_kn,
    stride_kd,
    stride_vb,
    stride_vh,
    stride_vn,
    stride_vd,
    stride_ib,
    stride_ih,
    stride_im,
    stride_is,
    stride_dob,
    stride_doh,
    stride_dom,
    stride_dod,
    H_KV,
    N_Q,
    N_K,
    GROUP,
    M_BLOCKS,
    n_keys,
    block_size,
    HEAD_DIM,
    HEAD_DIM_V,
    IS_CAUSAL: tl.constexpr,
    CONTIG: tl.constexpr,
    UPCAST: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
):
    """dq of one token's group rows; dk, dv of its keys by atomics. DQ has q's
    strides, DK/DV are contiguous fp32 (B, H_kv, N_k, d / d_v), LSE2 and Delta
    contiguous (B, H_q, N_q) fp32."""
    t, b, hkv, row_ok, head = group_rows(H_KV, GROUP, M_BLOCKS, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    t64 = t.to(tl.int64)
    d_ok = offs_d[None, :] < HEAD_DIM
    dv_ok = offs_dv[None, :] < HEAD_DIM_V
    q_off = b * stride_qb + head[:, None] * stride_qh + t64 * stride_qm
    q = tl.load(
        Q + q_off + offs_d[None, :] * stride_qd, mask=row_ok[:, None] & d_ok, other=0.0
    )
    do_ptrs = (
        DO
        + b * stride_dob
        + head[:, None] * stride_doh
        + t64 * stride_dom
        + offs_dv[None, :] * stride_dod
    )
    do = tl.load(do_ptrs, mask=row_ok[:, None] & dv_ok, other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
        do = do.to(tl.float32)
    row = (b * H_KV * GROUP + head) * N_Q + t64
    lse2 = tl.load(LSE2 + row, mask=row_ok, other=float("inf"))
    lse2 = tl.where(lse2 == float("-inf"), float("inf"), lse2)  # empty row: P = 0
    delta = tl.load(Delta + row, mask=row_ok, other=0.0)
    k_base = K + b * stride_kb + hkv * stride_kh
    v_base = V + b * stride_vb + hkv * stride_vh
    kv_row = (b * H_KV + hkv) * N_K
    idx_row = IDX + b * stride_ib + hkv * stride_ih + t64 * stride_im
    pos = t + N_K - N_Q
    qk_scale = sm_scale * LOG2E_JIT

    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    for start in range(0, n_keys, BLOCK_N):
        key, visible = chunk_keys(
            idx_row,
            stride_is,
            start,
            offs_n,
            n_keys,
            block_size,
            pos,
            N_K,
            IS_CAUSAL,
            CONTIG,
        )
        if tl.max(visible.to(tl.int32), 0) > 0:
            k, v, s = gathered_scores(
                q,
                k_base,
                v_base,
                key,
                visible,
                (stride_kn, stride_kd),
                (stride_vn, stride_vd),
                offs_d,
                offs_dv,
                HEAD_DIM,
                HEAD_DIM_V,
                qk_scale,
                UPCAST,
                DOT_PRECISION,
            )
            p = tl.exp2(s - lse2[:, None])  # (BLOCK_M, BLOCK_N)
            dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)
            ds = p * (dp - delta[:, None])  # d loss / d (q.k * scale)
            dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=DOT_PRECISION)
            dv_t = tl.dot(tl.trans(p).to(do.dtype), do, input_precision=DOT_PRECISION)
            dk_t = tl.dot(tl.trans(ds).to(q.dtype), q, input_precision=DOT_PRECISION)
            rows = (kv_row + key.to(tl.int64))[:, None]
            tl.atomic_add(
                DV + rows * HEAD_DIM_V + offs_dv[None, :],
                dv_t,
                mask=visible[:, None] & dv_ok,
                sem="relaxed",
            )
            tl.atomic_add(
                DK + rows * HEAD_DIM + offs_d[None, :],
                dk_t * sm_scale,
                mask=visible[:, None] & d_ok,
                sem="relaxed",
            )
    tl.store(
        DQ + q_off + offs_d[None, :] * stride_qd,
        (dq * sm_scale).to(DQ.dtype.element_ty),
        mask=row_ok[:, None] & d_ok,
    )


def backward(do, q, k, v, o, lse2, dlse, idx, block_size, scale, causal, tile):
    """dq, dk, dv (in q's dtype) from dO and the gradient of the natural lse.
    ``lse2`` is the forward's base-2 lse; ``tile`` a :class:`.tiles.Plan`."""
    grid, sizes, flags = launch_sizes(q, k, v, idx, block_size, causal, tile.bwd)
    B, H_kv, N_k = k.shape[:3]
    delta = (do.float() * o.float()).sum(-1)
    if dlse is not None:
        delta = delta - dlse.float()
    delta = delta.contiguous()
    dq = torch.empty_like(q)
    dk = torch.zeros((B, H_kv, N_k, q.shape[3]), dtype=torch.float32, device=q.device)
    dv = torch.zeros((B, H_kv, N_k, v.shape[3]), dtype=torch.float32, device=q.device)
    _sparse_bwd[grid](
        q,
        k,
        v,
        idx,
        do,
        lse2.contiguous(),
        delta,
        dq,
        dk,
        dv,
        scale,
        *q.stride(),
        *k.stride(),
        *v.stride(),
        *idx.stride(),
        *do.stride(),
        *sizes,
        **flags,
    )
    return dq, dk.to(k.dtype), dv.to(v.dtype)
