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
(padding, causal) load nothing.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..common import LN2, LOG2E
from ..flash import finish_rows

_LOG2E: tl.constexpr = tl.constexpr(LOG2E)
_LN2: tl.constexpr = tl.constexpr(LN2)


@triton.jit
def chunk_keys(
    idx_row,
    stride_is,
    start,
    offs_n,
    n_keys,
    block_size,
    pos,
    N_K,
    IS_CAUSAL: tl.constexpr,
    CONTIG: tl.constexpr,
):
    """The keys of flat positions ``start + offs_n`` of one row's selection and
    which of them the row sees: (key (BLOCK_N,) int32, visible (BLOCK_N,) bool).
    CONTIG (block_size a multiple of BLOCK_N): the step lies inside one block, so
    one scalar index and contiguous keys; else one index per key (any block size)."""
    if CONTIG:
        slot = start // block_size
        blk = tl.load(idx_row + slot * stride_is)
        key = blk * block_size + (start - slot * block_size) + offs_n
        visible = (blk >= 0) & (key < N_K)
    else:
        flat = start + offs_n
        in_list = flat < n_keys
        slot = flat // block_size
        blk = tl.load(idx_row + slot * stride_is, mask=in_list, other=-1)
        key = blk * block_size + (flat - slot * block_size)
        visible = in_list & (blk >= 0) & (key < N_K)
    if IS_CAUSAL:
        visible = visible & (key <= pos)
    return key, visible


@triton.jit
def load_rows(base, rows, visible, stride_n, offs_d, stride_d, HEAD_DIM):
    """Gather the K or V rows ``rows`` (BLOCK_N, BLOCK_D); hidden rows and columns
    past HEAD_DIM read as 0 (never loaded)."""
    ptrs = base + rows.to(tl.int64)[:, None] * stride_n + offs_d[None, :] * stride_d
    return tl.load(
        ptrs, mask=visible[:, None] & (offs_d[None, :] < HEAD_DIM), other=0.0
    )


@triton.jit
def _sparse_fwd(
    Q,
    K,
    V,
    IDX,
    O,
    LSE,
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
    t = tl.program_id(0)
    pid = tl.program_id(1)
    mb = pid % M_BLOCKS
    bh = pid // M_BLOCKS
    b = (bh // H_KV).to(tl.int64)
    hkv = (bh % H_KV).to(tl.int64)
    offs_m = mb * BLOCK_M + tl.arange(0, BLOCK_M)  # head within the group
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    row_ok = offs_m < GROUP
    head = hkv * GROUP + offs_m
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
    qk_scale = sm_scale * _LOG2E

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
            k = load_rows(k_base, key, visible, stride_kn, offs_d, stride_kd, HEAD_DIM)
            v = load_rows(
                v_base, key, visible, stride_vn, offs_dv, stride_vd, HEAD_DIM_V
            )
            if UPCAST:
                k = k.to(tl.float32)
                v = v.to(tl.float32)
            qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
            s = tl.where(visible[None, :], qk * qk_scale, float("-inf"))
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
    l_ptrs = LSE + b * stride_lb + head * stride_lh + t.to(tl.int64) * stride_lm
    tl.store(l_ptrs, lse2, mask=row_ok)


def forward(q, k, v, idx, block_size, scale, causal, tile):
    """Launch the forward: o (B, H_q, N_q, d_v) in q's dtype and the base-2 lse
    (B, H_q, N_q) float32. ``tile`` is a :class:`.tiles.Plan`."""
    bm, m_blocks, bn, warps, stages, up, prec = tile.fwd
    B, H, N_q, d = q.shape
    H_kv, N_k, dv = k.shape[1], k.shape[2], v.shape[3]
    o = torch.empty((B, H, N_q, dv), dtype=q.dtype, device=q.device)
    lse = torch.empty((B, H, N_q), dtype=torch.float32, device=q.device)
    grid = (N_q, B * H_kv * m_blocks)
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
        H_kv,
        N_q,
        N_k,
        H // H_kv,
        m_blocks,
        idx.shape[3] * block_size,
        block_size,
        d,
        dv,
        IS_CAUSAL=causal,
        CONTIG=block_size % bn == 0,
        UPCAST=up,
        DOT_PRECISION=prec,
        BLOCK_M=bm,
        BLOCK_N=bn,
        BLOCK_D=max(16, triton.next_power_of_2(d)),
        BLOCK_DV=max(16, triton.next_power_of_2(dv)),
        num_warps=warps,
        num_stages=stages,
    )
    return o, lse
