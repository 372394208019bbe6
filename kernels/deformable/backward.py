"""The backward ``@triton.jit`` kernels: ``_msda_bwd`` (gradients of the values,
sampling locations and attention weights, scattered by atomics) and DAT's two-kernel
backward ``_dat_bwd_dkdv`` / ``_dat_bwd_dq`` (P recomputed from the saved lse).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .blocks import (
    _bilinear_setup,
    _corner_rows,
    _corner_scatter,
    _gather_samples,
    _msda_corner,
    _pixel,
    _to_acc,
)


@triton.jit
def _msda_bwd(
    Value,
    Shapes,
    Starts,
    Loc,
    Attn,
    dOut,
    dValue,
    dLoc,
    dAttn,
    stride_vb,
    stride_vs,
    stride_vh,
    stride_vd,
    stride_gb,
    stride_gq,
    stride_gh,
    stride_gd,
    N_Q,
    S,
    H,
    HEAD_DIM,
    N_LEVELS: tl.constexpr,
    N_POINTS: tl.constexpr,
    FP64: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_D: tl.constexpr,
    D_BLOCKS: tl.constexpr,
):
    pid_q = tl.program_id(0)
    pid_bh = tl.program_id(1).to(tl.int64)
    b = pid_bh // H
    h = pid_bh % H
    offs_q = pid_q * BLOCK_Q + tl.arange(0, BLOCK_Q)
    mask_q = offs_q < N_Q
    v_base = Value + b * stride_vb + h * stride_vh
    # dValue is a contiguous (B, S, H, D) buffer in the arithmetic type (fp32 or fp64)
    dv_base = dValue + (b * S * H + h) * HEAD_DIM
    dv_stride_s = H * HEAD_DIM
    row = ((b * N_Q + offs_q) * H + h) * (N_LEVELS * N_POINTS)
    for lvl in range(N_LEVELS):
        H_l = tl.load(Shapes + 2 * lvl).to(tl.int32)
        W_l = tl.load(Shapes + 2 * lvl + 1).to(tl.int32)
        start = tl.load(Starts + lvl)
        lvl_base = v_base + start * stride_vs
        dlvl_base = dv_base + start * dv_stride_s
        for p in tl.static_range(N_POINTS):
            lp = lvl * N_POINTS + p
            x = _to_acc(tl.load(Loc + (row + lp) * 2, mask=mask_q, other=0.0), FP64)
            y = _to_acc(tl.load(Loc + (row + lp) * 2 + 1, mask=mask_q, other=0.0), FP64)
            w = _to_acc(tl.load(Attn + row + lp, mask=mask_q, other=0.0), FP64)
            x0, y0, lx, ly = _bilinear_setup(x * W_l - 0.5, y * H_l - 0.5)
            hx = 1.0 - lx
            hy = 1.0 - ly
            sy = W_l * stride_vs
            dsy = W_l * dv_stride_s
            g_w = w * 0.0  # sums over the channel blocks, in the arithmetic type
            g_px = w * 0.0
            g_py = w * 0.0
            for db in tl.static_range(D_BLOCKS):  # one block when D_h <= 128 (unrolled)
                offs_d = db * BLOCK_D + tl.arange(0, BLOCK_D)
                mask_d = offs_d < HEAD_DIM
                go = _to_acc(
                    tl.load(
                        dOut
                        + b * stride_gb
                        + offs_q[:, None] * stride_gq
                        + h * stride_gh
                        + offs_d[None, :] * stride_gd,
                        mask=mask_q[:, None] & mask_d[None, :],
                        other=0.0,
                    ),
                    FP64,
                )
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
                # d out / d weight = sample;  d sample / d px, d py from corner
                # differences
                g_w += tl.sum(go * sample, axis=1)
                ds_dpx = hy[:, None] * (v01 - v00) + ly[:, None] * (v11 - v10)
                ds_dpy = hx[:, None] * (v10 - v00) + lx[:, None] * (v11 - v01)
                g_px += tl.sum(go * ds_dpx, axis=1)
                g_py += tl.sum(go * ds_dpy, axis=1)
                # d value: scatter w * bilinear weight * dOut to the four corners
                gw = w[:, None] * go
                _corner_scatter(
                    dlvl_base,
                    x0,
                    y0,
                    W_l,
                    H_l,
                    dsy,
                    dv_stride_s,
                    offs_d,
                    mask_q,
                    mask_d,
                    (hy * hx)[:, None] * gw,
                )
                _corner_scatter(
                    dlvl_base,
                    x0 + 1,
                    y0,
                    W_l,
                    H_l,
                    dsy,
                    dv_stride_s,
                    offs_d,
                    mask_q,
                    mask_d,
                    (hy * lx)[:, None] * gw,
                )
                _corner_scatter(
                    dlvl_base,
                    x0,
                    y0 + 1,
                    W_l,
                    H_l,
                    dsy,
                    dv_stride_s,
                    offs_d,
                    mask_q,
                    mask_d,
                    (ly * hx)[:, None] * gw,
                )
                _corner_scatter(
                    dlvl_base,
                    x0 + 1,
                    y0 + 1,
                    W_l,
                    H_l,
                    dsy,
                    dv_stride_s,
                    offs_d,
                    mask_q,
                    mask_d,
                    (ly * lx)[:, None] * gw,
                )
            tl.store(dAttn + row + lp, g_w, mask=mask_q)
            # d px / d loc_x = W_l
            tl.store(dLoc + (row + lp) * 2, w * g_px * W_l, mask=mask_q)
            tl.store(dLoc + (row + lp) * 2 + 1, w * g_py * H_l, mask=mask_q)


@triton.jit
def _dat_bwd_dkdv(
    Q,
    K,
    V,
    Pts,
    dO,
    LSE2,
    Delta,
    dK,
    dV,
    dPts,
    qk_scale,
    sm_scale,
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
    stride_gb,
    stride_gh,
    stride_gn,
    stride_gd,
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
    pid_n = tl.program_id(0)
    pid_bh = tl.program_id(1).to(tl.int64)
    b = pid_bh // H
    h = pid_bh % H
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    mask_n = offs_n < N_K
    mask_d = offs_d < HEAD_DIM
    k_base = K + b * stride_kb + h * stride_kh
    v_base = V + b * stride_vb + h * stride_vh
    p_base = Pts + b * stride_pb + (h // HEADS_PER_GROUP) * stride_pg
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
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    q_base = Q + b * stride_qb + h * stride_qh
    do_base = dO + b * stride_gb + h * stride_gh
    for start_m in range(0, N_Q, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        mask_m = offs_m < N_Q
        tile_mask = mask_m[:, None] & mask_d[None, :]
        q = tl.load(
            q_base + offs_m[:, None] * stride_qn + offs_d[None, :] * stride_qd,
            mask=tile_mask,
            other=0.0,
        )
        do = tl.load(
            do_base + offs_m[:, None] * stride_gn + offs_d[None, :] * stride_gd,
            mask=tile_mask,
            other=0.0,
        )
        lse = tl.load(LSE2 + pid_bh * N_Q + offs_m, mask=mask_m, other=0.0)
        delta = tl.load(Delta + pid_bh * N_Q + offs_m, mask=mask_m, other=0.0)
        if DOT_FP32:
            s_t = tl.dot(k, tl.trans(q.to(tl.float32)), input_precision="ieee")
        else:
            s_t = tl.dot(k.to(Q.dtype.element_ty), tl.trans(q))
        p_t = tl.exp2(s_t * qk_scale - lse[None, :])  # (BLOCK_N, BLOCK_M) = P^T
        p_t = tl.where(mask_n[:, None] & mask_m[None, :], p_t, 0.0)
        if DOT_FP32:
            dv += tl.dot(p_t, do.to(tl.float32), input_precision="ieee")
            dp_t = tl.dot(v, tl.trans(do.to(tl.float32)), input_precision="ieee")
        else:
            dv += tl.dot(p_t.to(Q.dtype.element_ty), do)
            dp_t = tl.dot(v.to(Q.dtype.element_ty), tl.trans(do))
        ds_t = p_t * (dp_t - delta[None, :])
        if DOT_FP32:
            dk += tl.dot(ds_t, q.to(tl.float32), input_precision="ieee")
        else:
            dk += tl.dot(ds_t.to(Q.dtype.element_ty), q)
    dk = dk * sm_scale
    # Scatter dk̃, dṽ to the four corners of each sample (fp32 maps, contiguous
    # (B, H, H_f, W_f, d)) and differentiate the bilinear weights for the point
    # gradient.
    x = tl.load(p_base + offs_n * stride_pn, mask=mask_n, other=0.0).to(tl.float32)
    y = tl.load(p_base + offs_n * stride_pn + stride_pc, mask=mask_n, other=0.0).to(
        tl.float32
    )
    x0, y0, lx, ly = _bilinear_setup(
        _pixel(x, W_f, ALIGN_CORNERS), _pixel(y, H_f, ALIGN_CORNERS)
    )
    hx = 1.0 - lx
    hy = 1.0 - ly
    map_stride_y = W_f * HEAD_DIM
    dk_base = dK + pid_bh * H_f * W_f * HEAD_DIM
    dv_base = dV + pid_bh * H_f * W_f * HEAD_DIM
    g_px = tl.zeros([BLOCK_N], dtype=tl.float32)
    g_py = tl.zeros([BLOCK_N], dtype=tl.float32)
    for c in tl.static_range(4):
        cx = x0 + (c % 2)
        cy = y0 + (c // 2)
        wx = lx if c % 2 == 1 else hx
        wy = ly if c // 2 == 1 else hy
        sgn_x = 1.0 if c % 2 == 1 else -1.0  # d wx / d px
        sgn_y = 1.0 if c // 2 == 1 else -1.0  # d wy / d py
        w = wx * wy
        _corner_scatter(
            dk_base,
            cx,
            cy,
            W_f,
            H_f,
            map_stride_y,
            HEAD_DIM,
            offs_d,
            mask_n,
            mask_d,
            w[:, None] * dk,
        )
        _corner_scatter(
            dv_base,
            cx,
            cy,
            W_f,
            H_f,
            map_stride_y,
            HEAD_DIM,
            offs_d,
            mask_n,
            mask_d,
            w[:, None] * dv,
        )
        kc = _corner_rows(
            k_base,
            cx,
            cy,
            W_f,
            H_f,
            stride_ky,
            stride_kx,
            offs_d,
            stride_kd,
            mask_n,
            mask_d,
        )
        vc = _corner_rows(
            v_base,
            cx,
            cy,
            W_f,
            H_f,
            stride_vy,
            stride_vx,
            offs_d,
            stride_vd,
            mask_n,
            mask_d,
        )
        dot_c = tl.sum(kc * dk + vc * dv, axis=1)  # <corner, d sample> for K and V
        g_px += sgn_x * wy * dot_c
        g_py += sgn_y * wx * dot_c
    if ALIGN_CORNERS:
        scale_x = (W_f - 1) * 0.5
        scale_y = (H_f - 1) * 0.5
    else:
        scale_x = W_f * 0.5
        scale_y = H_f * 0.5
    # per-head point gradient (B, H, N_K, 2); the wrapper sums the heads of a group
    dp_ptrs = dPts + (pid_bh * N_K + offs_n) * 2
    tl.store(dp_ptrs, g_px * scale_x, mask=mask_n)
    tl.store(dp_ptrs + 1, g_py * scale_y, mask=mask_n)


@triton.jit
def _dat_bwd_dq(
    Q,
    K,
    V,
    Pts,
    dO,
    LSE2,
    Delta,
    dQ,
    qk_scale,
    sm_scale,
    stride_qb,
    stride_qh,
    stride_qn,
    stride_qd,
    stride_dqb,
    stride_dqh,
    stride_dqn,
    stride_dqd,
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
    stride_gb,
    stride_gh,
    stride_gn,
    stride_gd,
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
    tile_mask = mask_m[:, None] & mask_d[None, :]
    q = tl.load(
        Q
        + b * stride_qb
        + h * stride_qh
        + offs_m[:, None] * stride_qn
        + offs_d[None, :] * stride_qd,
        mask=tile_mask,
        other=0.0,
    )
    do = tl.load(
        dO
        + b * stride_gb
        + h * stride_gh
        + offs_m[:, None] * stride_gn
        + offs_d[None, :] * stride_gd,
        mask=tile_mask,
        other=0.0,
    )
    lse = tl.load(LSE2 + pid_bh * N_Q + offs_m, mask=mask_m, other=0.0)
    delta = tl.load(Delta + pid_bh * N_Q + offs_m, mask=mask_m, other=0.0)
    k_base = K + b * stride_kb + h * stride_kh
    v_base = V + b * stride_vb + h * stride_vh
    p_base = Pts + b * stride_pb + (h // HEADS_PER_GROUP) * stride_pg
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    for start_n in range(0, N_K, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
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
            dp = tl.dot(do.to(tl.float32), tl.trans(v), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k.to(Q.dtype.element_ty)))
            dp = tl.dot(do, tl.trans(v.to(Q.dtype.element_ty)))
        p = tl.exp2(s * qk_scale - lse[:, None])
        p = tl.where((offs_n < N_K)[None, :], p, 0.0)
        ds = p * (dp - delta[:, None])
        if DOT_FP32:
            dq += tl.dot(ds, k, input_precision="ieee")
        else:
            dq += tl.dot(ds.to(Q.dtype.element_ty), k.to(Q.dtype.element_ty))
    dq = dq * sm_scale
    tl.store(
        dQ
        + b * stride_dqb
        + h * stride_dqh
        + offs_m[:, None] * stride_dqn
        + offs_d[None, :] * stride_dqd,
        dq.to(dQ.dtype.element_ty),
        mask=tile_mask,
    )
