"""attention_with_kvcache and mla_with_kvcache: validation, the split heuristic and the
two launches.

``prepare`` (``prepare_mla``) validates once on the host and returns a launcher that
only launches (``kernels.decode.timing`` times that, so a host synchronisation of the
validation is not timed); ``attention_with_kvcache`` is ``prepare(...)()``.
"""

from __future__ import annotations

import torch
import triton

from .. import runtime
from ..common import check_int, dot_precision, upcast
from . import tiles as K
from .blocks import _decode_merge
from .checks import (
    FP8,
    MAX_MLA_DIM_V,
    MAX_ROPE_DIM,
    check_inputs,
    check_options,
    choose_splits,
    sm_count,
    visible_span,
)
from .forward import _decode_split

#: fp8 tiles use Triton's fp8 conversion from this compute capability on (below it the
#: bytes are decoded with integer ops: sm_75/80 have no e4m3 conversion instruction).
FP8_NATIVE_CAPABILITY = (8, 9)


def fp8_native(capability) -> bool:
    """Whether fp8 tiles use Triton's conversion: on sm_89+. Not under the interpreter
    (``capability`` None), whose conversion reads the NaN bytes as +-480."""
    return capability is not None and tuple(capability) >= FP8_NATIVE_CAPABILITY


#: The merge reads at most this many columns of the partials per program.
MERGE_BLOCK_D = 128


def _launcher(
    q, k_cache, v_cache, cache_seqlens, block_table, scale, max_len, num_splits,
    return_lse, d_v, rope, left, right, cap, alibi, sinks, kd, vd,
):  # fmt: skip
    B, n_q, h_q, d = q.shape
    h_kv = k_cache.shape[2]
    group = h_q // h_kv
    paged = block_table is not None
    page = k_cache.shape[1] if paged else 0
    dev_cap = None if runtime.INTERPRET else torch.cuda.get_device_capability(q.device)
    if not K.supported(dev_cap, d_v, q.dtype):
        raise ValueError(
            f"float32 q/k_cache/v_cache support head dims up to 128 on a "
            f"GPU, got d = {d} (use float16 or bfloat16)"
        )
    shared = rope is not None  # MLA: V is K's first d_v columns
    fp8 = k_cache.dtype == FP8
    bm = K.block_m(group, n_q, K.max_block_m(dev_cap, d_v, q.dtype, shared))
    tr = cap > 0 or alibi is not None
    bn = K.block_n(dev_cap, d_v, bm, q.dtype, page if paged else None, shared, fp8, tr)
    _, warps, stages = K.tiles(dev_cap, d_v, bm, q.dtype, shared, fp8, tr)
    m_blocks = triton.cdiv(group * n_q, bm)
    programs = B * h_kv * m_blocks
    span = visible_span(max_len, n_q, left)
    splits = num_splits or choose_splits(
        programs, span, sm_count(q.device), runtime.INTERPRET
    )
    # at most one split per visible key tile (a window's keys may straddle one more)
    splits = max(1, min(splits, triton.cdiv(span, bn) + (left >= 0)))
    bt = block_table if paged else cache_seqlens
    if paged and bt.stride(1) != 1:
        bt = bt.contiguous()
    seqlens = cache_seqlens.contiguous()
    bd = K.block_d(d_v)
    native = fp8_native(dev_cap)
    kc, vc = k_cache, v_cache
    if fp8 and not native:  # the raw bytes, decoded in the kernel
        kc, vc = k_cache.view(torch.uint8), v_cache.view(torch.uint8)
    dummy = seqlens  # an unused pointer argument
    common = dict(
        PAGED=paged,
        PAGE_SIZE=page,
        HAS_LEFT=left >= 0,
        HAS_RIGHT=right >= 0,
        HAS_SOFTCAP=cap > 0,
        HAS_ALIBI=alibi is not None,
        HAS_SINKS=sinks is not None,
        FP8=fp8,
        FP8_NATIVE=native,
        SHARED_KV=shared,
        UPCAST=upcast(q.dtype, q.device),
        DOT_PRECISION=dot_precision(q.dtype),
        BLOCK_M=bm,
        BLOCK_N=bn,
        BLOCK_D=bd,
        BLOCK_R=K.block_r(rope) if shared else 0,
        EVEN_D=d_v == bd,
        num_warps=warps,
        num_stages=stages,
    )
    grid = (h_kv * m_blocks, splits, B)
    extras = (
        dummy if alibi is None else alibi,
        dummy if sinks is None else sinks,
        dummy if kd is None else kd,
        dummy if vd is None else vd,
        scale,
        cap,
        left,
        right,
    )
    sizes = (
        0 if alibi is None or alibi.ndim == 1 else h_q,
        h_kv,
        n_q,
        group,
        d_v,
        rope or 0,
        splits,
        m_blocks,
    )

    def launch():
        out = torch.empty((B, n_q, h_q, d_v), dtype=q.dtype, device=q.device)
        lse = torch.empty((B, h_q, n_q), dtype=torch.float32, device=q.device)
        args = (q, kc, vc, bt, seqlens)
        strides = (
            *q.stride(),
            *kc.stride(),
            *vc.stride(),
            bt.stride(0) if paged else 0,
        )
        if splits == 1:
            _decode_split[grid](
                *args,
                out,
                lse,
                *extras,
                *strides,
                *out.stride(),
                *lse.stride(),
                *sizes,
                SPLIT=False,
                **common,
            )
            return (out, lse) if return_lse else out
        # (B, H_q, N_q, splits, d_v) and (B, H_q, N_q, splits), fp32, base 2
        o_part = torch.empty(
            (B, h_q, n_q, splits, d_v), dtype=torch.float32, device=q.device
        )
        l_part = torch.empty(
            (B, h_q, n_q, splits), dtype=torch.float32, device=q.device
        )
        so, sl = o_part.stride(), l_part.stride()
        _decode_split[grid](
            *args,
            o_part,
            l_part,
            *extras,
            *strides,
            so[0],
            so[2],
            so[1],
            1,
            sl[0],
            sl[1],
            sl[2],
            *sizes,
            SPLIT=True,
            **common,
        )
        md = min(bd, MERGE_BLOCK_D)
        _decode_merge[(B * h_q * n_q, triton.cdiv(d_v, md))](
            o_part,
            l_part,
            out,
            lse,
            n_q,
            h_q,
            splits,
            d_v,
            *out.stride(),
            *lse.stride(),
            BLOCK_S=max(2, triton.next_power_of_2(splits)),
            BLOCK_D=md,
            num_warps=4 if md >= 128 else 2,
        )
        return (out, lse) if return_lse else out

    launch.splits = splits
    return launch


def prepare(
    q, k_cache, v_cache, cache_seqlens, block_table=None, causal=True,
    softmax_scale=None, num_splits=0, return_lse=False, *, window_size=(-1, -1),
    softcap=0.0, alibi_slopes=None, sinks=None, k_descale=None, v_descale=None,
):  # fmt: skip
    """Validate (one host sync) and return ``launch()``: the launches only, returning
    what ``attention_with_kvcache`` returns. The launcher reads the tensors each time
    it is called (their values may change; their shapes and the checked lengths and
    pages must not)."""
    scale, max_len = check_inputs(
        q, k_cache, v_cache, cache_seqlens, block_table, causal, softmax_scale,
        num_splits, return_lse,
    )  # fmt: skip
    opts = check_options(
        q, k_cache, causal, window_size, softcap, alibi_slopes, sinks, k_descale,
        v_descale,
    )  # fmt: skip
    return _launcher(
        q, k_cache, v_cache, cache_seqlens, block_table, scale, max_len, num_splits,
        return_lse, q.shape[3], None, *opts,
    )  # fmt: skip


def attention_with_kvcache(
    q, k_cache, v_cache, cache_seqlens, block_table=None, causal=True,
    softmax_scale=None, num_splits=0, return_lse=False, *, window_size=(-1, -1),
    softcap=0.0, alibi_slopes=None, sinks=None, k_descale=None, v_descale=None,
):  # fmt: skip
    """Attention of N_q new query tokens per sequence to its cached keys and values.

    q (B, N_q, H_q, d); k_cache, v_cache (num_pages, page_size, H_kv, d) with
    block_table (B, max_pages) int32, or (B, N_max, H_kv, d) without one;
    cache_seqlens (B,) int32: valid cached keys per sequence, the N_q new tokens
    included (0: an empty slot). flash-attn's keywords: ``window_size`` (left, right),
    ``softcap``, ``alibi_slopes`` (H_q,) or (B, H_q), ``sinks`` (H_q,), and for a
    float8_e4m3fn cache ``k_descale``, ``v_descale`` (B, H_kv). Returns out (B, N_q,
    H_q, d) in q's dtype and, with ``return_lse``, lse (B, H_q, N_q) float32, natural
    log. See :mod:`kernels.decode`.
    """
    return prepare(
        q, k_cache, v_cache, cache_seqlens, block_table, causal, softmax_scale,
        num_splits, return_lse, window_size=window_size, softcap=softcap,
        alibi_slopes=alibi_slopes, sinks=sinks, k_descale=k_descale,
        v_descale=v_descale,
    )()  # fmt: skip


def prepare_mla(
    q, kv_cache, cache_seqlens, block_table=None, head_dim_v=512, softmax_scale=None,
    causal=True, return_lse=False, num_splits=0,
):  # fmt: skip
    """``prepare`` for ``mla_with_kvcache`` (``num_splits``: 0 = the heuristic)."""
    scale, max_len = check_inputs(
        q, kv_cache, kv_cache, cache_seqlens, block_table, causal, softmax_scale,
        num_splits, return_lse, k_name="kv_cache",
        max_head_dim=MAX_MLA_DIM_V + MAX_ROPE_DIM,
    )  # fmt: skip
    if kv_cache.shape[2] != 1:
        raise ValueError(
            f"kv_cache must be (B, N_max, 1, D) or (num_pages, page_size, 1, D): one "
            f"latent row a token, got shape {tuple(kv_cache.shape)}"
        )
    if kv_cache.dtype == FP8:
        raise TypeError("mla_with_kvcache: kv_cache must be float16/bfloat16/float32")
    if not runtime.INTERPRET and not K.mla_supported(
        torch.cuda.get_device_capability(q.device)
    ):
        raise ValueError(
            "mla_with_kvcache needs sm_80 or newer: on sm_75 its 512-wide tiles do "
            "not fit the 64 KB of shared memory"
        )
    dv = check_int("head_dim_v", head_dim_v, 1)
    D = q.shape[3]
    if dv > D:
        raise ValueError(f"head_dim_v={dv} exceeds the latent row's width D = {D}")
    if dv > MAX_MLA_DIM_V or D - dv > MAX_ROPE_DIM:
        raise ValueError(
            f"head_dim_v={dv} must be at most {MAX_MLA_DIM_V} and the rope part "
            f"D - head_dim_v = {D - dv} at most {MAX_ROPE_DIM}"
        )
    return _launcher(
        q, kv_cache, kv_cache, cache_seqlens, block_table, scale, max_len, num_splits,
        return_lse, dv, D - dv, -1, 0 if causal else -1, 0.0, None, None, None, None,
    )  # fmt: skip


def mla_with_kvcache(
    q, kv_cache, cache_seqlens, block_table=None, head_dim_v=512, softmax_scale=None,
    causal=True, return_lse=False,
):  # fmt: skip
    """Multi-head latent attention's absorbed decode (FlashMLA's
    ``flash_mla_with_kvcache`` in this book's argument order).

    q (B, N_q, H_q, D); kv_cache (num_pages, page_size, 1, D) with block_table
    (B, max_pages) int32, or (B, N_max, 1, D): one latent row per token, D =
    head_dim_v + rope dim (DeepSeek-V3: 512 + 64); the keys are the rows, the values
    their first head_dim_v columns, every query head reads the one row.
    softmax_scale defaults to 1/sqrt(D). Returns out (B, N_q, H_q, head_dim_v) and,
    with ``return_lse``, lse (B, H_q, N_q). See :mod:`kernels.decode`.
    """
    return prepare_mla(
        q, kv_cache, cache_seqlens, block_table, head_dim_v, softmax_scale, causal,
        return_lse,
    )()  # fmt: skip
