"""What the sparse forward and backward share: the ``@triton.jit`` pieces of their key
loop and the arguments of their launch.

``group_rows`` decodes a program's query token, batch, KV head and the GQA group's
heads it holds as rows; ``chunk_keys`` the keys one step of the token's selection
gathers and which of them it sees; ``gathered_scores`` loads those K and V rows
(``load_rows``) and scores them against q. ``launch_sizes`` is the grid and the sizes,
flags and tile both launches pass after their pointers and strides.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def group_rows(H_KV, GROUP, M_BLOCKS, BLOCK_M: tl.constexpr):
    """Program (t, (b * H_KV + hkv) * M_BLOCKS + mb): its query token t, batch b and
    KV head hkv (int64), which of its BLOCK_M rows are heads of the group (row_ok)
    and their query heads: (t, b, hkv, row_ok, head)."""
    t = tl.program_id(0)
    pid = tl.program_id(1)
    mb = pid % M_BLOCKS
    bh = pid // M_BLOCKS
    b = (bh // H_KV).to(tl.int64)
    hkv = (bh % H_KV).to(tl.int64)
    offs_m = mb * BLOCK_M + tl.arange(0, BLOCK_M)  # head within the group
    return t, b, hkv, offs_m < GROUP, hkv * GROUP + offs_m


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
def gathered_scores(
    q,
    k_base,
    v_base,
    key,
    visible,
    strides_k,
    strides_v,
    offs_d,
    offs_dv,
    HEAD_DIM,
    HEAD_DIM_V,
    qk_scale,
    UPCAST: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """One step's K (BLOCK_N, BLOCK_D) and V (BLOCK_N, BLOCK_DV) rows ``key``
    (``strides_k``, ``strides_v``: (row, column) strides) and the base-2 scores
    (BLOCK_M, BLOCK_N) of q against them: -inf where a key is hidden."""
    k = load_rows(k_base, key, visible, strides_k[0], offs_d, strides_k[1], HEAD_DIM)
    v = load_rows(v_base, key, visible, strides_v[0], offs_dv, strides_v[1], HEAD_DIM_V)
    if UPCAST:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
    return k, v, tl.where(visible[None, :], qk * qk_scale, float("-inf"))


def launch_sizes(q, k, v, idx, block_size, causal, plan):
    """(grid, sizes, flags): the launch grid, the sizes the kernel takes after its
    strides (H_KV ... HEAD_DIM_V) and its compile-time flags, tile and launch options
    as keywords. ``plan`` is a :class:`.tiles.Plan`'s ``fwd`` or ``bwd``."""
    bm, m_blocks, bn, warps, stages, up, prec = plan
    B, H, N_q, d = q.shape
    H_kv, N_k, dv = k.shape[1], k.shape[2], v.shape[3]
    n_keys = idx.shape[3] * block_size
    sizes = (H_kv, N_q, N_k, H // H_kv, m_blocks, n_keys, block_size, d, dv)
    flags = {
        "IS_CAUSAL": causal,
        "CONTIG": block_size % bn == 0,
        "UPCAST": up,
        "DOT_PRECISION": prec,
        "BLOCK_M": bm,
        "BLOCK_N": bn,
        "BLOCK_D": max(16, triton.next_power_of_2(d)),
        "BLOCK_DV": max(16, triton.next_power_of_2(dv)),
        "num_warps": warps,
        "num_stages": stages,
    }
    return (N_q, B * H_kv * m_blocks), sizes, flags
