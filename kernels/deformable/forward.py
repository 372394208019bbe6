"""The forward ``@triton.jit`` kernels: ``_msda_fwd`` (multi-scale deformable
attention, one program per block of queries and a head) and ``_dat_fwd``
(FlashAttention-2 over bilinearly sampled keys and values, with the online softmax in
base 2).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .blocks import _bilinear_setup, _gather_samples, _msda_corner, _to_acc


@triton.jit
def _msda_fwd(
    Value,
    Shapes,
    Starts,
    Loc,
    Attn,
    Out,
    stride_vb,
    stride_vs,
    stride_vh,
    stride_vd,
    stride_ob,
    stride_oq,
    stride_oh,
    stride_od,
    N_Q,
    H,
    HEAD_DIM,
    N_LEVELS: tl.constexpr,
    N_POINTS: tl.constexpr,
    FP64: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    pid_q = tl.program_id(0)
    pid_bh = tl.program_id(1).to(tl.int64)
    b = pid_bh // H
    h = pid_bh % H
    offs_q = pid_q * BLOCK_Q + tl.arange(0, BLOCK_Q)
    mask_q = offs_q < N_Q
    v_base = Value + b * stride_vb + h * stride_vh
    # Loc (B, N_Q, H, L, P, 2) and Attn (B, N_Q, H, L, P) are contiguous
    row = ((b * N_Q + offs_q) * H + h) * (N_LEVELS * N_POINTS)  # (BLOCK_Q,)
    # channel blocks: any head dim (one when <= 128)
    for d0 in range(0, HEAD_DIM, BLOCK_D):
        offs_d = d0 + tl.arange(0, BLOCK_D)
        mask_d = offs_d < HEAD_DIM
        # in registers
        acc = _to_acc(tl.zeros([BLOCK_Q, BLOCK_D], dtype=tl.float32), FP64)
        for lvl in range(N_LEVELS):
            H_l = tl.load(Shapes + 2 * lvl).to(tl.int32)
            W_l = tl.load(Shapes + 2 * lvl + 1).to(tl.int32)
            lvl_base = v_base + tl.load(Starts + lvl) * stride_vs
            for p in tl.static_range(N_POINTS):
                lp = lvl * N_POINTS + p
                x = _to_acc(tl.load(Loc + (row + lp) * 2, mask=mask_q, other=0.0), FP64)
                y = _to_acc(
                    tl.load(Loc + (row + lp) * 2 + 1, mask=mask_q, other=0.0), FP64
                )
                w = _to_acc(tl.load(Attn + row + lp, mask=mask_q, other=0.0), FP64)
                # align_corners=False on grid 2*loc - 1: pixel = loc * size - 0.5
                x0, y0, lx, ly = _bilinear_setup(x * W_l - 0.5, y * H_l - 0.5)
                hx = 1.0 - lx
                hy = 1.0 - ly
                sy = W_l * stride_vs  # one row of the level down
                v00 = _msda_corner(
                    lvl_base,
                    x0,
                    y0,
                    W_l,
                    H_l,
                    sy,
                    stride_vs,
                    offs_d,
                    stride_vd,
                    mask_q,
                    mask_d,
                    FP64,
                )
                v01 = _msda_corner(
                    lvl_base,
                    x0 + 1,
                    y0,
                    W_l,
                    H_l,
                    sy,
                    stride_vs,
                    offs_d,
                    stride_vd,
                    mask_q,
                    mask_d,
                    FP64,
                )
                v10 = _msda_corner(
                    lvl_base,
                    x0,
                    y0 + 1,
                    W_l,
                    H_l,
                    sy,
                    stride_vs,
                    offs_d,
                    stride_vd,
                    mask_q,
                    mask_d,
                    FP64,
                )
                v11 = _msda_corner(
                    lvl_base,
                    x0 + 1,
                    y0 + 1,
                    W_l,
                    H_l,
                    sy,
                    stride_vs,
                    offs_d,
                    stride_vd,
                    mask_q,
                    mask_d,
                    FP64,
                )
                sample = (
                    (hy * hx)[:, None] * v00
                    + (hy * lx)[:, None] * v01
                    + (ly * hx)[:, None] * v10
                    + (ly * lx)[:, None] * v11
                )
                acc += w[:, None] * sample
        o_ptrs = (
            Out
            + b * stride_ob
            + offs_q[:, None] * stride_oq
            + h * stride_oh
            + offs_d[None, :] * stride_od
        )
        tl.store(
            o_ptrs, acc.to(Out.dtype.element_ty), mask=mask_q[:, None] & mask_d[None, :]
        )


@triton.jit
def _dat_fwd(
    Q,
    K,
    V,
    Pts,
    Out,
    LSE2,
    qk_scale,
    stride_qb,
    stride_qh,
    stride_qn,
    stride_qd,
    stride_kb,
    stride_kh,
    stride_ky,
    stride_kx,
    stride_kd,
    stride_vb,
    stride_vh,
    stride_vy,
    stride_vx,
    stride_vd,
    stride_pb,
    stride_pg,
    stride_pn,
    stride_pc,
    stride_ob,
    stride_oh,
    stride_on,
    stride_od,
    N_Q,
    N_K,
    H_f,
    W_f,
    H,
    HEADS_PER_GROUP,
    HEAD_DIM,
    ALIGN_CORNERS: tl.constexpr,
    DOT_FP32: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1).to(tl.int64)
    b = pid_bh // H
    h = pid_bh % H
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    mask_m = offs_m < N_Q
    mask_d = offs_d < HEAD_DIM
    q = tl.load(
        Q
        + b * stride_qb
        + h * stride_qh
        + offs_m[:, None] * stride_qn
        + offs_d[None, :] * stride_qd,
        mask=mask_m[:, None] & mask_d[None, :],
        other=0.0,
    )  # q stays in SRAM for the whole inner loop
    k_base = K + b * stride_kb + h * stride_kh
    v_base = V + b * stride_vb + h * stride_vh
    p_base = Pts + b * stride_pb + (h // HEADS_PER_GROUP) * stride_pg
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    for start_n in range(0, N_K, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        # sampled keys and values: built in registers from four corner gathers each
        k = _gather_samples(
            k_base,
            p_base,
            offs_n,
            N_K,
            stride_pn,
            stride_pc,
            H_f,
            W_f,
            stride_ky,
            stride_kx,
            stride_kd,
            offs_d,
            mask_d,
            ALIGN_CORNERS,
        )
        v = _gather_samples(
            v_base,
            p_base,
            offs_n,
            N_K,
            stride_pn,
            stride_pc,
            H_f,
            W_f,
            stride_vy,
            stride_vx,
            stride_vd,
            offs_d,
            mask_d,
            ALIGN_CORNERS,
        )
        if DOT_FP32:
            s = tl.dot(q.to(tl.float32), tl.trans(k), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k.to(Q.dtype.element_ty)))
        # base-2 logits
        s = tl.where((offs_n < N_K)[None, :], s * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if DOT_FP32:
            acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(
                p.to(Q.dtype.element_ty), v.to(Q.dtype.element_ty)
            )
        m_i = m_new
    acc = acc / l_i[:, None]
    tl.store(
        Out
        + b * stride_ob
        + h * stride_oh
        + offs_m[:, None] * stride_on
        + offs_d[None, :] * stride_od,
        acc.to(Out.dtype.element_ty),
        mask=mask_m[:, None] & mask_d[None, :],
    )
    tl.store(LSE2 + pid_bh * N_Q + offs_m, m_i + tl.log2(l_i), mask=mask_m)  # base 2
