"""The dK/dV kernel of the two-kernel FlashAttention-2 backward.

``_attn_bwd_dkdv``: one program per key block of BLOCK_N rows; it loops over the query
blocks of every q head that shares this k/v head (GQA), recomputes P^T = exp(S^T -
lse) tile by tile from the saved base-2 lse and accumulates dV += P^T dO and
dK += dS^T Q in fp32 (``_attn_bwd_dkdv_inner``, ``_dkdv_dots``). Launched by
:func:`kernels.flash.backward.backward_lse`.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..common import LOG2E_JIT
from .blocks import (
    _load_query_rows,
    _query_range,
    _store_tile,
    finite_dot,
    load_tile,
)
from .tiles import (
    _HEURISTICS,
    _all_configs,
    _pruner,
)


@triton.jit
def _dkdv_dots(dk, dv, pT, v, q, do, delta, DOT_PRECISION: tl.constexpr):
    """dV += P^T dO;  dP^T = V dO^T;  dS^T = P^T * (dP^T - delta);  dK += dS^T Q
    (dK times sm_scale once, at the end)."""
    dv = tl.dot(pT.to(do.dtype), do, dv, input_precision=DOT_PRECISION)
    dpT = tl.dot(v, tl.trans(do), input_precision=DOT_PRECISION)
    dsT = pT * (dpT - delta[None, :])
    dk = tl.dot(dsT.to(q.dtype), q, dk, input_precision=DOT_PRECISION)
    return dk, dv


@triton.jit
def _attn_bwd_dkdv_inner(
    dk,
    dv,
    k,
    v,
    q_base,
    do_base,
    lse_base,
    delta_base,
    stride_qm,
    stride_qd,
    stride_dom,
    stride_dod,
    offs_n,
    offs_d,
    lo,
    hi,
    qk_scale,
    N_Q,
    N_K,
    HEAD_DIM,
    causal_offset,
    BLOCK_M: tl.constexpr,
    MASKED: tl.constexpr,
    SHIELD: tl.constexpr,
    EVEN_M: tl.constexpr,
    EVEN_N: tl.constexpr,
    EVEN_D: tl.constexpr,
    UPCAST: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Accumulate dK, dV of the resident key block over query blocks [lo, hi).

    Works with transposed tiles (keys along rows): pT = P^T, (BLOCK_N, BLOCK_M).
    MASKED=True applies the causal mask (the diagonal blocks). Query rows past N_q load
    lse = +inf, so their P is exactly 0 and they contribute nothing. Key rows past N_k
    (a ragged last key block, EVEN_N=False) get s = -inf, so exp2 never sees them: with
    a strongly negative lse their exp2(0 - lse) would overflow. SHIELD (the second
    launch, which runs only when an input holds NaN/inf): the masked tiles sum dV and
    dK over the visible pairs only (``finite_dot``), so a hidden query row's NaN in q,
    dO, lse or delta never reaches a key it cannot see.
    """
    for start_m in range(lo, hi, BLOCK_M):
        start_m = tl.multiple_of(start_m, BLOCK_M)
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
        # recompute P^T = exp2(K Q^T * scale * log2(e) - lse2),
        # (BLOCK_N, BLOCK_M), on chip
        sT = tl.dot(k, tl.trans(q), input_precision=DOT_PRECISION) * qk_scale
        if MASKED:  # hidden pairs get s = -inf, so P = 0 exactly
            visT = offs_n[:, None] <= offs_m[None, :] + causal_offset
            sT = tl.where(visT, sT, float("-inf"))
        # padded key rows of the ragged last block: P = 0, never exp2(-lse)
        if not EVEN_N:
            sT = tl.where(offs_n[:, None] < N_K, sT, float("-inf"))
        pT = tl.exp2(sT - lse2[None, :])
        if MASKED:
            if SHIELD:  # NaN/inf somewhere: only visible pairs enter the sums
                pT = tl.where(visT, pT, 0.0)  # 0 even where lse is NaN
                dpT = tl.dot(v, tl.trans(do), input_precision=DOT_PRECISION)
                dsT = tl.where(visT, pT * (dpT - delta[None, :]), 0.0)
                dv = finite_dot(dv, pT, do, visT, True, DOT_PRECISION)
                dk = finite_dot(dk, dsT, q, visT, False, DOT_PRECISION)
            else:
                dk, dv = _dkdv_dots(dk, dv, pT, v, q, do, delta, DOT_PRECISION)
        else:
            dk, dv = _dkdv_dots(dk, dv, pT, v, q, do, delta, DOT_PRECISION)
    return dk, dv


@triton.autotune(
    configs=_all_configs("dkdv"),
    key=["HEAD_DIM", "IS_CAUSAL"],
    prune_configs_by=_pruner("dkdv"),
)
@triton.heuristics(_HEURISTICS)
@triton.jit
def _attn_bwd_dkdv(
    Q,
    K,
    V,
    DO,
    LSE2,
    Delta,
    DK,
    DV,
    BAD,
    sm_scale,
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
    stride_dkz,
    stride_dkh,
    stride_dkn,
    stride_dkd,
    H_KV,
    GROUP,
    N_Q,
    N_K,
    HEAD_DIM,
    IS_CAUSAL: tl.constexpr,
    BLOCK_D: tl.constexpr,
    UPCAST: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    EVEN_M: tl.constexpr,
    EVEN_N: tl.constexpr,
    EVEN_D: tl.constexpr,
    SHIELD: tl.constexpr,
):
    # SHIELD: the second, slow launch of a causal backward. It does nothing unless an
    # input holds NaN/inf (BAD, set on the device); then it recomputes this program's
    # gradients keeping hidden pairs out of every sum, and overwrites them.
    if SHIELD:
        go = tl.load(BAD) != 0
    else:
        go = True
    if go:
        start_n = tl.program_id(0) * BLOCK_N  # first key of this program's block
        off_hz = tl.program_id(1)  # which (batch, k/v head)
        off_z = off_hz // H_KV
        off_hkv = off_hz % H_KV
        offs_n = start_n + tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, BLOCK_D)
        k_base = K + off_z.to(tl.int64) * stride_kz + off_hkv.to(tl.int64) * stride_kh
        v_base = V + off_z.to(tl.int64) * stride_vz + off_hkv.to(tl.int64) * stride_vh
        # k and v stay in SRAM while every query block of every q head in the
        # group streams by
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
            v_base + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd,
            offs_n,
            offs_d,
            N_K,
            HEAD_DIM,
            EVEN_N,
            EVEN_D,
        )
        if UPCAST:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
        dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
        qk_scale = sm_scale * LOG2E_JIT

        # query range: rows [lo, full_start) masked, [full_start, end_m) see every key
        causal_offset = N_K - N_Q
        lo, full_start, end_m = _query_range(
            start_n, N_Q, N_K, IS_CAUSAL, BLOCK_M, BLOCK_N
        )

        # the q heads that share this k/v head (GQA); 1 for plain MHA
        for g in range(GROUP):
            off_h = off_hkv * GROUP + g
            off_bh = off_z * (H_KV * GROUP) + off_h
            q_base = Q + off_z.to(tl.int64) * stride_qz + off_h.to(tl.int64) * stride_qh
            do_base = (
                DO + off_z.to(tl.int64) * stride_doz + off_h.to(tl.int64) * stride_doh
            )
            lse_base = LSE2 + off_bh.to(tl.int64) * N_Q
            delta_base = Delta + off_bh.to(tl.int64) * N_Q
            if IS_CAUSAL:  # diagonal blocks, masked
                dk, dv = _attn_bwd_dkdv_inner(
                    dk,
                    dv,
                    k,
                    v,
                    q_base,
                    do_base,
                    lse_base,
                    delta_base,
                    stride_qm,
                    stride_qd,
                    stride_dom,
                    stride_dod,
                    offs_n,
                    offs_d,
                    lo,
                    full_start,
                    qk_scale,
                    N_Q,
                    N_K,
                    HEAD_DIM,
                    causal_offset,
                    BLOCK_M,
                    True,
                    SHIELD,
                    EVEN_M,
                    EVEN_N,
                    EVEN_D,
                    UPCAST,
                    DOT_PRECISION,
                )
            dk, dv = _attn_bwd_dkdv_inner(
                dk,
                dv,
                k,
                v,
                q_base,
                do_base,
                lse_base,
                delta_base,
                stride_qm,
                stride_qd,
                stride_dom,
                stride_dod,
                offs_n,
                offs_d,
                full_start,
                end_m,
                qk_scale,
                N_Q,
                N_K,
                HEAD_DIM,
                causal_offset,
                BLOCK_M,
                False,
                SHIELD,
                EVEN_M,
                EVEN_N,
                EVEN_D,
                UPCAST,
                DOT_PRECISION,
            )

        dk = dk * sm_scale  # S = scale * Q K^T  =>  dK = scale * dS^T Q
        kv_off = off_z.to(tl.int64) * stride_dkz + off_hkv.to(tl.int64) * stride_dkh
        dk_base = DK + kv_off
        dv_base = DV + kv_off
        tile = offs_n[:, None] * stride_dkn + offs_d[None, :] * stride_dkd
        _store_tile(
            dk_base + tile,
            dk.to(DK.dtype.element_ty),
            offs_n,
            offs_d,
            N_K,
            HEAD_DIM,
            EVEN_N,
            EVEN_D,
        )
        _store_tile(
            dv_base + tile,
            dv.to(DV.dtype.element_ty),
            offs_n,
            offs_d,
            N_K,
            HEAD_DIM,
            EVEN_N,
            EVEN_D,
        )
