"""The sparse forward kernel: one program per (query token, batch x KV head x row
block), the G query heads of the GQA group packed as the rows of its tile.

The program walks its row of ``kv_indices`` as one flat list of S x block_size keys
(slot s, offset r: key ``kv_indices[s] * block_size + r``), gathering ``BLOCK_N`` of
them per step (so block_size = 1, DSA's tokens, and block sizes that are not powers of
two run the same code), with the online softmax of :mod:`kernels.flash` in base 2.
Every row of the tile is the same query token, so which keys it may see (chosen, not
padding, inside N_k, and under causal at or before the token's position) is one
vector for the whole tile: hidden keys are masked out of the loads themselves, and a
NaN or inf in a K/V row nobody chose is never read. Steps whose keys are all hidden
(padding, causal) load nothing. The pieces the backward shares are in
:mod:`.blocks`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..common import LOG2E_JIT
from ..flash import finish_rows
from .blocks import chunk_keys, gathered_scores, group_rows, launch_sizes


@triton.jit
def _sparse_fwd(
    Q,
    K,
    V,
    IDX,
    O,
    LSE2,
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
    stride_ob,
    stride_oh,
    stride_om,
    stride_od,
    stride_lb,
    stride_lh,
    stride_lm,
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
    """o and the base-2 lse of one query token for the heads of one GQA group."""
    t, b, hkv, row_ok, head = group_rows(H_KV, GROUP, M_BLOCKS, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    q_ptrs = (
        Q
        + b * stride_qb
        + head[:, None] * stride_qh
        + t.to(tl.int64) * stride_qm
        + offs_d[None, :] * stride_qd
    )
    q = tl.load(q_ptrs, mask=row_ok[:, None] & (offs_d[None, :] < HEAD_DIM), other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    k_base = K + b * stride_kb + hkv * stride_kh
    v_base = V + b * stride_vb + hkv * stride_vh
    idx_row = IDX + b * stride_ib + hkv * stride_ih + t.to(tl.int64) * stride_im
    pos = t + N_K - N_Q  # bottom-right aligned
    qk_scale = sm_scale * LOG2E_JIT

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
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
            # every row sees a key of this step: a row whose scores are all -inf
            # (an input inf, fp32 overflow) has no softmax: NaN, not "no key"
            m_ij = tl.maximum(m_i, tl.max(s, 1))
            m_ij = tl.where(m_ij == float("-inf"), float("nan"), m_ij)
            p = tl.exp2(s - m_ij[:, None])
            alpha = tl.exp2(m_i - m_ij)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None]
            acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)
            m_i = m_ij
    acc, lse2 = finish_rows(acc, l_i, m_i)
    o_ptrs = (
        O
        + b * stride_ob
        + head[:, None] * stride_oh
        + t.to(tl.int64) * stride_om
        + offs_dv[None, :] * stride_od
    )
    tl.store(
        o_ptrs,
        acc.to(O.dtype.element_ty),
        mask=row_ok[:, None] & (offs_dv[None, :] < HEAD_DIM_V),
    )
    l_ptrs = LSE2 + b * stride_lb + head * stride_lh + t.to(tl.int64) * stride_lm
    tl.store(l_ptrs, lse2, mask=row_ok)


def forward(q, k, v, idx, block_size, scale, causal, tile):
    """Launch the forward: o (B, H_q, N_q, d_v) in q's dtype and the base-2 lse
    (B, H_q, N_q) float32. ``tile`` is a :class:`.tiles.Plan`."""
    grid, sizes, flags = launch_sizes(q, k, v, idx, block_size, causal, tile.fwd)
    B, H, N_q = q.shape[:3]
    o = torch.empty((B, H, N_q, v.shape[3]), dtype=q.dtype, device=q.device)
    lse = torch.empty((B, H, N_q), dtype=torch.float32, device=q.device)
    _sparse_fwd[grid](
        q,
        k,
        v,
        idx,
        o,
        lse,
        scale,
        *q.stride(),
        *k.stride(),
        *v.stride(),
        *idx.stride(),
        *o.stride(),
        *lse.stride(),
        *sizes,
        **flags,
    )
    return o, lse
