"""attention_with_kvcache: validation, the split heuristic and the two launches.

``prepare`` validates once on the host and returns a launcher that only launches
(``kernels.timing.decode`` times that, so a host synchronisation of the validation is
not timed); ``attention_with_kvcache`` is ``prepare(...)()``.
"""

from __future__ import annotations

import torch
import triton

from .. import runtime
from ..common import (
    dot_precision,
    upcast,
)
from . import tiles as K
from .checks import check_inputs, choose_splits, sm_count
from .forward import _decode_merge, _decode_split


def prepare(
    q,
    k_cache,
    v_cache,
    cache_seqlens,
    block_table=None,
    causal=True,
    softmax_scale=None,
    num_splits=0,
    return_lse=False,
):
    """Validate (one host sync) and return ``launch()``: the launches only, returning
    what ``attention_with_kvcache`` returns. The launcher reads the tensors each time
    it is called (their values may change; their shapes and the checked lengths and
    pages must not)."""
    scale, max_len = check_inputs(
        q,
        k_cache,
        v_cache,
        cache_seqlens,
        block_table,
        causal,
        softmax_scale,
        num_splits,
        return_lse,
    )
    B, n_q, h_q, d = q.shape
    h_kv = k_cache.shape[2]
    group = h_q // h_kv
    paged = block_table is not None
    page = k_cache.shape[1] if paged else 0
    cap = None if runtime.INTERPRET else torch.cuda.get_device_capability(q.device)
    if not K.supported(cap, d, q.dtype):
        raise ValueError(
            f"float32 q/k_cache/v_cache support head dims up to 128 on a "
            f"GPU, got d = {d} (use float16 or bfloat16)"
        )
    bm = K.block_m(group, n_q, K.max_block_m(cap, d, q.dtype))
    bn = K.block_n(cap, d, bm, q.dtype, page if paged else None)
    _, warps, stages = K.tiles(cap, d, bm, q.dtype)
    m_blocks = triton.cdiv(group * n_q, bm)
    programs = B * h_kv * m_blocks
    splits = num_splits or choose_splits(
        programs, max_len, sm_count(q.device), runtime.INTERPRET
    )
    splits = max(1, min(splits, max(1, triton.cdiv(max_len, bn))))
    bt = block_table if paged else cache_seqlens
    if paged and bt.stride(1) != 1:
        bt = bt.contiguous()
    seqlens = cache_seqlens.contiguous()
    bd = K.block_d(d)
    common = dict(
        PAGED=paged,
        PAGE_SIZE=page,
        IS_CAUSAL=causal,
        UPCAST=upcast(q.dtype, q.device),
        DOT_PRECISION=dot_precision(q.dtype),
        BLOCK_M=bm,
        BLOCK_N=bn,
        BLOCK_D=bd,
        EVEN_D=d == bd,
        num_warps=warps,
        num_stages=stages,
    )
    grid = (h_kv * m_blocks, splits, B)

    def launch():
        out = torch.empty((B, n_q, h_q, d), dtype=q.dtype, device=q.device)
        lse = torch.empty((B, h_q, n_q), dtype=torch.float32, device=q.device)
        args = (q, k_cache, v_cache, bt, seqlens)
        strides = (
            *q.stride(),
            *k_cache.stride(),
            *v_cache.stride(),
            bt.stride(0) if paged else 0,
        )
        if splits == 1:
            _decode_split[grid](
                *args,
                out,
                lse,
                scale,
                *strides,
                *out.stride(),
                *lse.stride(),
                n_q,
                group,
                d,
                1,
                m_blocks,
                SPLIT=False,
                **common,
            )
        else:
            # (B, H_q, N_q, splits, d) and (B, H_q, N_q, splits), fp32, base 2
            o_part = torch.empty(
                (B, h_q, n_q, splits, d), dtype=torch.float32, device=q.device
            )
            l_part = torch.empty(
                (B, h_q, n_q, splits), dtype=torch.float32, device=q.device
            )
            so = o_part.stride()
            sl = l_part.stride()
            _decode_split[grid](
                *args,
                o_part,
                l_part,
                scale,
                *strides,
                so[0],
                so[2],
                so[1],
                1,
                sl[0],
                sl[1],
                sl[2],
                n_q,
                group,
                d,
                splits,
                m_blocks,
                SPLIT=True,
                **common,
            )
            _decode_merge[(B * h_q * n_q,)](
                o_part,
                l_part,
                out,
                lse,
                n_q,
                h_q,
                splits,
                d,
                *out.stride(),
                *lse.stride(),
                BLOCK_S=max(2, triton.next_power_of_2(splits)),
                BLOCK_D=bd,
                num_warps=4 if bd >= 128 else 2,
            )
        return (out, lse) if return_lse else out

    launch.splits = splits
    return launch


def attention_with_kvcache(
    q,
    k_cache,
    v_cache,
    cache_seqlens,
    block_table=None,
    causal=True,
    softmax_scale=None,
    num_splits=0,
    return_lse=False,
):
    """Attention of N_q new query tokens per sequence to its cached keys and values.

    q (B, N_q, H_q, d); k_cache, v_cache (num_pages, page_size, H_kv, d) with
    block_table (B, max_pages) int32, or (B, N_max, H_kv, d) without one;
    cache_seqlens (B,) int32: valid cached keys per sequence, the N_q new tokens
    included (0: an empty slot). Returns out (B, N_q, H_q, d) in q's dtype and, with
    ``return_lse``, lse (B, H_q, N_q) float32, natural log. See :mod:`kernels.decode`.
    """
    return prepare(
        q,
        k_cache,
        v_cache,
        cache_seqlens,
        block_table,
        causal,
        softmax_scale,
        num_splits,
        return_lse,
    )()
