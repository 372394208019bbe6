"""The FlashAttention-2 backward in two kernels: delta, dK/dV, dQ.

``_attn_bwd_preprocess`` (delta = rowsum(dO * O)), ``_attn_bwd_dkdv`` (one program per
key block), ``_attn_bwd_dq`` (one program per query block), each recomputing P from
the saved lse, and ``backward_lse``, which launches them (and their NaN-shield
launches on causal problems).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import runtime
from ..common import dot_precision, upcast
from .blocks import (
    _load_query_rows,
    _load_tile,
    _query_range,
    _store_tile,
    finite_dot,
    key_range,
)
from .checks import _grad_flag
from .tiles import (
    _HEURISTICS,
    _LOG2E,
    INTERPRET_CONFIG,
    _all_configs,
    _pruner,
    block_d,
    configs,
)


def preprocess_block_m(head_dim: int) -> int:
    """Rows per program of the delta kernel: 64 x BLOCK_D fp32 tiles fit in
    registers."""
    return min(64, 4096 // block_d(head_dim))


PREPROCESS_NUM_WARPS = 4


@triton.heuristics(
    {
        "EVEN_M": lambda a: a["N_CTX_Q"] % a["BLOCK_M"] == 0,
        "EVEN_D": lambda a: a["HEAD_DIM"] == a["BLOCK_D"],
    }
)
@triton.jit
def _attn_bwd_preprocess(
    O,
    DO,
    Delta,
    stride_oz,
    stride_oh,
    stride_om,
    stride_od,
    stride_doz,
    stride_doh,
    stride_dom,
    stride_dod,
    H,
    N_CTX_Q,
    HEAD_DIM,
    BLOCK_M: tl.constexpr,
    BLOCK_D: tl.constexpr,
    EVEN_M: tl.constexpr,
    EVEN_D: tl.constexpr,
):
    """delta_i = sum_d dO[i, d] * O[i, d] (= rowsum(dP * P)).

    One (B, H, N_q) float per row.
    """
    start_m = tl.program_id(0)
    off_hz = tl.program_id(1)
    off_z = off_hz // H
    off_h = off_hz % H
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    o = _load_tile(
        O
        + off_z.to(tl.int64) * stride_oz
        + off_h.to(tl.int64) * stride_oh
        + offs_m[:, None] * stride_om
        + offs_d[None, :] * stride_od,
        offs_m,
        offs_d,
        N_CTX_Q,
        HEAD_DIM,
        EVEN_M,
        EVEN_D,
    )
    do = _load_tile(
        DO
        + off_z.to(tl.int64) * stride_doz
        + off_h.to(tl.int64) * stride_doh
        + offs_m[:, None] * stride_dom
        + offs_d[None, :] * stride_dod,
        offs_m,
        offs_d,
        N_CTX_Q,
        HEAD_DIM,
        EVEN_M,
        EVEN_D,
    )
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)
    # contiguous (B, H, N_q)
    delta_ptrs = Delta + off_hz.to(tl.int64) * N_CTX_Q + offs_m
    if EVEN_M:
        tl.store(delta_ptrs, delta)
    else:
        tl.store(delta_ptrs, delta, mask=offs_m < N_CTX_Q)


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
    N_CTX_Q,
    N_CTX_K,
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
            N_CTX_Q,
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
            sT = tl.where(offs_n[:, None] < N_CTX_K, sT, float("-inf"))
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
    N_CTX_Q,
    N_CTX_K,
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
        k = _load_tile(
            k_base + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd,
            offs_n,
            offs_d,
            N_CTX_K,
            HEAD_DIM,
            EVEN_N,
            EVEN_D,
        )
        v = _load_tile(
            v_base + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd,
            offs_n,
            offs_d,
            N_CTX_K,
            HEAD_DIM,
            EVEN_N,
            EVEN_D,
        )
        if UPCAST:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
        dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
        qk_scale = sm_scale * _LOG2E

        # query range: rows [lo, full_start) masked, [full_start, end_m) see every key
        causal_offset = N_CTX_K - N_CTX_Q
        lo, full_start, end_m = _query_range(
            start_n, N_CTX_Q, N_CTX_K, IS_CAUSAL, BLOCK_M, BLOCK_N
        )

        # the q heads that share this k/v head (GQA); 1 for plain MHA
        for g in range(GROUP):
            off_h = off_hkv * GROUP + g
            off_bh = off_z * (H_KV * GROUP) + off_h
            q_base = Q + off_z.to(tl.int64) * stride_qz + off_h.to(tl.int64) * stride_qh
            do_base = (
                DO + off_z.to(tl.int64) * stride_doz + off_h.to(tl.int64) * stride_doh
            )
            lse_base = LSE2 + off_bh.to(tl.int64) * N_CTX_Q
            delta_base = Delta + off_bh.to(tl.int64) * N_CTX_Q
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
                    N_CTX_Q,
                    N_CTX_K,
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
                N_CTX_Q,
                N_CTX_K,
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
            N_CTX_K,
            HEAD_DIM,
            EVEN_N,
            EVEN_D,
        )
        _store_tile(
            dv_base + tile,
            dv.to(DV.dtype.element_ty),
            offs_n,
            offs_d,
            N_CTX_K,
            HEAD_DIM,
            EVEN_N,
            EVEN_D,
        )


@triton.jit
def _attn_bwd_dq_inner(
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
    offs_m,
    offs_d,
    lo,
    hi,
    qk_scale,
    N_CTX_K,
    HEAD_DIM,
    causal_offset,
    BLOCK_N: tl.constexpr,
    MASKED: tl.constexpr,
    SHIELD: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    EVEN_N: tl.constexpr,
    EVEN_D: tl.constexpr,
    UPCAST: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Accumulate dQ of the resident query block over key blocks [lo, hi).

    SHIELD (the second launch, which runs only when an input holds NaN/inf): the
    causal masked tiles sum dS K over the visible keys only (``finite_dot``), so a
    hidden key's NaN in k or v never reaches a query that cannot see it.
    """
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k = _load_tile(
            k_base + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd,
            offs_n,
            offs_d,
            N_CTX_K,
            HEAD_DIM,
            EVEN_N or not MASKED,
            EVEN_D,
        )
        v = _load_tile(
            v_base + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd,
            offs_n,
            offs_d,
            N_CTX_K,
            HEAD_DIM,
            EVEN_N or not MASKED,
            EVEN_D,
        )
        if UPCAST:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        # recompute P = exp2(Q K^T * scale * log2(e) - lse2),
        # (BLOCK_M, BLOCK_N), on chip
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
        if MASKED:  # hidden pairs and keys past N_k get s = -inf, so P = 0 exactly
            visible = offs_n[None, :] < N_CTX_K
            if IS_CAUSAL:
                visible = visible & (offs_n[None, :] <= offs_m[:, None] + causal_offset)
            s = tl.where(visible, s, float("-inf"))
        p = tl.exp2(s - lse2[:, None])
        # dP = dO V^T;  dS = P * (dP - delta);  dQ += dS K
        dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)
        ds = p * (dp - delta[:, None])
        if MASKED and IS_CAUSAL:
            if SHIELD:  # NaN/inf somewhere: only visible keys enter the sum
                ds = tl.where(visible, ds, 0.0)
                dq = finite_dot(dq, ds, k, visible, False, DOT_PRECISION)
            else:
                dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=DOT_PRECISION)
        else:
            dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=DOT_PRECISION)
    return dq


@triton.autotune(
    configs=_all_configs("dq"),
    key=["HEAD_DIM", "IS_CAUSAL"],
    prune_configs_by=_pruner("dq"),
)
@triton.heuristics(_HEURISTICS)
@triton.jit
def _attn_bwd_dq(
    Q,
    K,
    V,
    DO,
    LSE2,
    Delta,
    DQ,
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
    stride_dqz,
    stride_dqh,
    stride_dqm,
    stride_dqd,
    H,
    GROUP,
    N_CTX_Q,
    N_CTX_K,
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
        start_m = tl.program_id(0)
        off_hz = tl.program_id(1)  # which (batch, q head)
        off_z = off_hz // H
        off_h = off_hz % H
        off_hkv = off_h // GROUP
        offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, BLOCK_D)
        q_base = Q + off_z.to(tl.int64) * stride_qz + off_h.to(tl.int64) * stride_qh
        do_base = DO + off_z.to(tl.int64) * stride_doz + off_h.to(tl.int64) * stride_doh
        k_base = K + off_z.to(tl.int64) * stride_kz + off_hkv.to(tl.int64) * stride_kh
        v_base = V + off_z.to(tl.int64) * stride_vz + off_hkv.to(tl.int64) * stride_vh
        # q, dO, lse and delta stay on chip while the key blocks stream by
        row_base = off_hz.to(tl.int64) * N_CTX_Q
        q, do, lse2, delta = _load_query_rows(
            q_base,
            do_base,
            LSE2 + row_base,
            Delta + row_base,
            offs_m,
            offs_d,
            stride_qm,
            stride_qd,
            stride_dom,
            stride_dod,
            N_CTX_Q,
            HEAD_DIM,
            EVEN_M,
            EVEN_D,
            UPCAST,
        )
        dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        qk_scale = sm_scale * _LOG2E

        causal_offset = N_CTX_K - N_CTX_Q
        # the same key ranges as the forward pass
        hi, full_end = key_range(start_m, N_CTX_Q, N_CTX_K, IS_CAUSAL, BLOCK_M, BLOCK_N)
        dq = _attn_bwd_dq_inner(
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
            offs_m,
            offs_d,
            0,
            full_end,
            qk_scale,
            N_CTX_K,
            HEAD_DIM,
            causal_offset,
            BLOCK_N,
            False,
            SHIELD,
            IS_CAUSAL,
            EVEN_N,
            EVEN_D,
            UPCAST,
            DOT_PRECISION,
        )
        if IS_CAUSAL or not EVEN_N:
            dq = _attn_bwd_dq_inner(
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
                offs_m,
                offs_d,
                full_end,
                hi,
                qk_scale,
                N_CTX_K,
                HEAD_DIM,
                causal_offset,
                BLOCK_N,
                True,
                SHIELD,
                IS_CAUSAL,
                EVEN_N,
                EVEN_D,
                UPCAST,
                DOT_PRECISION,
            )
        dq = dq * sm_scale  # S = scale * Q K^T  =>  dQ = scale * dS K
        _store_tile(
            DQ
            + off_z.to(tl.int64) * stride_dqz
            + off_h.to(tl.int64) * stride_dqh
            + offs_m[:, None] * stride_dqm
            + offs_d[None, :] * stride_dqd,
            dq.to(DQ.dtype.element_ty),
            offs_m,
            offs_d,
            N_CTX_Q,
            HEAD_DIM,
            EVEN_M,
            EVEN_D,
        )


def backward_lse(do, q, k, v, o, lse2, causal: bool, scale: float, dlse=None):
    B, H, N_q, d = q.shape
    if not runtime.INTERPRET:
        cap = torch.cuda.get_device_capability(q.device)
        if not configs("dq", cap, d, q.dtype):
            raise ValueError(
                f"the backward pass does not support head dim {d} "
                f"(q shape {tuple(q.shape)}) on sm_{cap[0]}{cap[1]}: "
                f"without tensor cores every tile spills registers; "
                f"use d <= 128 or an sm_80+ GPU"
            )
    H_kv, N_k = k.shape[1], k.shape[2]
    group = H // H_kv
    bd = block_d(d)
    up, precision = upcast(q.dtype, q.device), dot_precision(q.dtype)
    delta = torch.empty_like(lse2)  # (B, H, N_q) float32
    dq = torch.empty((B, H, N_q, d), dtype=q.dtype, device=q.device)  # (B, H, N_q, d)
    # (B, H_kv, N_k, d)
    dk = torch.empty((B, H_kv, N_k, d), dtype=k.dtype, device=k.device)
    # same layout as dk: the kernel uses dk's strides for both
    dv = torch.empty_like(dk)

    block_m_pre = preprocess_block_m(d)
    _attn_bwd_preprocess[(triton.cdiv(N_q, block_m_pre), B * H)](
        o,
        do,
        delta,
        *o.stride(),
        *do.stride(),
        H,
        N_q,
        d,
        BLOCK_M=block_m_pre,
        BLOCK_D=bd,
        num_warps=PREPROCESS_NUM_WARPS,
    )
    if dlse is not None:
        # lse_i = log sum_j exp(S_ij): d lse_i / d S_ij = P_ij, so a gradient dL_i on
        # the lse adds dL_i * P_ij to dS_ij = P_ij (dP_ij - delta_i):
        # delta_i <- delta_i - dL_i
        delta = (delta - dlse.to(torch.float32)).contiguous()
    # NaN/inf in an input (computed on the device, no host sync): read by the causal
    # backward's second launch only
    bad = _grad_flag(causal, q, k, v, do, lse2, dlse)
    dkdv_args = (
        q,
        k,
        v,
        do,
        lse2,
        delta,
        dk,
        dv,
        bad,
        scale,
        *q.stride(),
        *k.stride(),
        *v.stride(),
        *do.stride(),
        *dk.stride(),
        H_kv,
        group,
        N_q,
        N_k,
        d,
    )
    dq_args = (
        q,
        k,
        v,
        do,
        lse2,
        delta,
        dq,
        bad,
        scale,
        *q.stride(),
        *k.stride(),
        *v.stride(),
        *do.stride(),
        *dq.stride(),
        H,
        group,
        N_q,
        N_k,
        d,
    )
    flags = dict(IS_CAUSAL=causal, BLOCK_D=bd, UPCAST=up, DOT_PRECISION=precision)
    grid_kv = lambda META: (triton.cdiv(N_k, META["BLOCK_N"]), B * H_kv)
    grid_q = lambda META: (triton.cdiv(N_q, META["BLOCK_M"]), B * H)
    _attn_bwd_dkdv[grid_kv](*dkdv_args, **flags, SHIELD=False)
    _attn_bwd_dq[grid_q](*dq_args, **flags, SHIELD=False)
    if causal:
        # A hidden pair weighs 0 in the tiles above, and 0 * NaN = NaN. If an input
        # holds NaN/inf, these launches recompute dK, dV and dQ keeping the hidden pairs
        # out of every sum (and overwrite them); otherwise each program reads the flag
        # and stops.
        bm, bn, w, st = (
            INTERPRET_CONFIG
            if runtime.INTERPRET
            else configs(
                "dq-shield", torch.cuda.get_device_capability(q.device), d, q.dtype
            )[0]
        )
        tiles = dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=w, num_stages=st)
        # .fn: the @heuristics-wrapped kernel under the @autotune
        _attn_bwd_dkdv.fn[(triton.cdiv(N_k, bn), B * H_kv)](
            *dkdv_args, **flags, SHIELD=True, **tiles
        )
        _attn_bwd_dq.fn[(triton.cdiv(N_q, bm), B * H)](
            *dq_args, **flags, SHIELD=True, **tiles
        )
    return dq, dk, dv
