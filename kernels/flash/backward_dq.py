"""The dQ kernel of the two-kernel FlashAttention-2 backward.

``_attn_bwd_dq``: one program per query block of BLOCK_M rows; it loops over the key
blocks, recomputes P = exp(S - lse) from the saved base-2 lse and accumulates
dQ += dS K in fp32 (``_attn_bwd_dq_inner``). Launched by
:func:`kernels.flash.backward.backward_lse`.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..common import LOG2E_JIT
from .blocks import (
    _load_query_rows,
    _store_tile,
    finite_dot,
    key_range,
    load_tile,
)
from .tiles import (
    _HEURISTICS,
    _all_configs,
    _pruner,
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
    N_K,
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
        k = load_tile(
            k_base + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd,
            offs_n,
            offs_d,
            N_K,
            HEAD_DIM,
            EVEN_N or not MASKED,
            EVEN_D,
        )
        v = load_tile(
            v_base + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd,
            offs_n,
            offs_d,
            N_K,
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
            visible = offs_n[None, :] < N_K
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
        row_base = off_hz.to(tl.int64) * N_Q
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
            N_Q,
            HEAD_DIM,
            EVEN_M,
            EVEN_D,
            UPCAST,
        )
        dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        qk_scale = sm_scale * LOG2E_JIT

        causal_offset = N_K - N_Q
        # the same key ranges as the forward pass
        hi, full_end = key_range(start_m, N_Q, N_K, IS_CAUSAL, BLOCK_M, BLOCK_N)
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
            N_K,
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
                N_K,
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
            N_Q,
            HEAD_DIM,
            EVEN_M,
            EVEN_D,
        )
