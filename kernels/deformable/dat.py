"""Fused DAT attention in Triton: FlashAttention-2 over bilinearly sampled keys.

``deformable_attention`` (keys and values gathered from the maps at the sampled
points inside the attention loop), its forward and two backward kernels, tile choice
``dat_config``, ``sample_maps`` and the PyTorch reference
``deformable_attention_reference``. The spec sheet is :mod:`kernels.deformable`'s.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from ..common import kernel_scale
from .sampling import (
    LOG2E,
    MAX_HEAD_DIM,
    NUM_STAGES,
    _bilinear_setup,
    _block_d,
    _capability,
    _check_float,
    _corner_rows,
    _corner_scatter,
)

# --------------------------------------------------------------------------------------
# Fused DAT attention: FlashAttention-2 over keys/values gathered by bilinear sampling
# --------------------------------------------------------------------------------------


@triton.jit
def _pixel(x, size, ALIGN_CORNERS: tl.constexpr):
    """Normalised coordinate in [-1, 1] -> pixel coordinate (grid_sample's
    convention)."""
    if ALIGN_CORNERS:
        return (x + 1.0) * 0.5 * (size - 1)
    else:
        return ((x + 1.0) * size - 1.0) * 0.5


@triton.jit
def _gather_samples(
    base,
    Pts,
    offs_n,
    N_s,
    stride_pn,
    stride_pc,
    H_f,
    W_f,
    stride_my,
    stride_mx,
    stride_md,
    offs_d,
    mask_d,
    ALIGN_CORNERS: tl.constexpr,
):
    """Bilinear samples of one map at a block of points: (BLOCK_N, BLOCK_D) fp32."""
    mask_n = offs_n < N_s
    x = tl.load(Pts + offs_n * stride_pn, mask=mask_n, other=0.0).to(tl.float32)
    y = tl.load(Pts + offs_n * stride_pn + stride_pc, mask=mask_n, other=0.0).to(
        tl.float32
    )
    x0, y0, lx, ly = _bilinear_setup(
        _pixel(x, W_f, ALIGN_CORNERS), _pixel(y, H_f, ALIGN_CORNERS)
    )
    hx = 1.0 - lx
    hy = 1.0 - ly
    t = (hy * hx)[:, None] * _corner_rows(
        base, x0, y0, W_f, H_f, stride_my, stride_mx, offs_d, stride_md, mask_n, mask_d
    )
    t += (hy * lx)[:, None] * _corner_rows(
        base,
        x0 + 1,
        y0,
        W_f,
        H_f,
        stride_my,
        stride_mx,
        offs_d,
        stride_md,
        mask_n,
        mask_d,
    )
    t += (ly * hx)[:, None] * _corner_rows(
        base,
        x0,
        y0 + 1,
        W_f,
        H_f,
        stride_my,
        stride_mx,
        offs_d,
        stride_md,
        mask_n,
        mask_d,
    )
    t += (ly * lx)[:, None] * _corner_rows(
        base,
        x0 + 1,
        y0 + 1,
        W_f,
        H_f,
        stride_my,
        stride_mx,
        offs_d,
        stride_md,
        mask_n,
        mask_d,
    )
    return t


@triton.jit
def _dat_fwd(
    Q,
    K,
    V,
    Pts,
    Out,
    LSE,
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
    N_q,
    N_s,
    H_f,
    W_f,
    N_HEADS,
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
    b = pid_bh // N_HEADS
    h = pid_bh % N_HEADS
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    mask_m = offs_m < N_q
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
    for start_n in range(0, N_s, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        # sampled keys and values: built in registers from four corner gathers each
        k = _gather_samples(
            k_base,
            p_base,
            offs_n,
            N_s,
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
            N_s,
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
        s = tl.where((offs_n < N_s)[None, :], s * qk_scale, float("-inf"))
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
    tl.store(LSE + pid_bh * N_q + offs_m, m_i + tl.log2(l_i), mask=mask_m)  # base 2


@triton.jit
def _dat_bwd_dkdv(
    Q,
    K,
    V,
    Pts,
    dO,
    LSE,
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
    N_q,
    N_s,
    H_f,
    W_f,
    N_HEADS,
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
    b = pid_bh // N_HEADS
    h = pid_bh % N_HEADS
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    mask_n = offs_n < N_s
    mask_d = offs_d < HEAD_DIM
    k_base = K + b * stride_kb + h * stride_kh
    v_base = V + b * stride_vb + h * stride_vh
    p_base = Pts + b * stride_pb + (h // HEADS_PER_GROUP) * stride_pg
    k = _gather_samples(
        k_base,
        p_base,
        offs_n,
        N_s,
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
        N_s,
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
    for start_m in range(0, N_q, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        mask_m = offs_m < N_q
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
        lse = tl.load(LSE + pid_bh * N_q + offs_m, mask=mask_m, other=0.0)
        delta = tl.load(Delta + pid_bh * N_q + offs_m, mask=mask_m, other=0.0)
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
    # per-head point gradient (B, H, N_s, 2); the wrapper sums the heads of a group
    dp_ptrs = dPts + (pid_bh * N_s + offs_n) * 2
    tl.store(dp_ptrs, g_px * scale_x, mask=mask_n)
    tl.store(dp_ptrs + 1, g_py * scale_y, mask=mask_n)


@triton.jit
def _dat_bwd_dq(
    Q,
    K,
    V,
    Pts,
    dO,
    LSE,
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
    N_q,
    N_s,
    H_f,
    W_f,
    N_HEADS,
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
    b = pid_bh // N_HEADS
    h = pid_bh % N_HEADS
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    mask_m = offs_m < N_q
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
    lse = tl.load(LSE + pid_bh * N_q + offs_m, mask=mask_m, other=0.0)
    delta = tl.load(Delta + pid_bh * N_q + offs_m, mask=mask_m, other=0.0)
    k_base = K + b * stride_kb + h * stride_kh
    v_base = V + b * stride_vb + h * stride_vh
    p_base = Pts + b * stride_pb + (h // HEADS_PER_GROUP) * stride_pg
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    for start_n in range(0, N_s, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k = _gather_samples(
            k_base,
            p_base,
            offs_n,
            N_s,
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
            N_s,
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
        p = tl.where((offs_n < N_s)[None, :], p, 0.0)
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


def dot_fp32(dtype: torch.dtype, capability: tuple[int, int] | None) -> bool:
    """fp32 dot products: fp32 inputs, the interpreter (``capability`` None: bf16 dots
    are wrong there), and bf16 below sm_80 (no bf16 tensor cores)."""
    if dtype == torch.float32 or capability is None:
        return True
    return dtype == torch.bfloat16 and capability[0] < 8


def dat_config(
    kernel: str,
    n_s: int,
    head_dim: int,
    capability: tuple[int, int] | None,
    fp32_dots: bool = False,
) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps) for ``"fwd"``, ``"dkdv"`` or ``"dq"``.

    Under the interpreter (``capability`` None): 64 queries and up to 64 samples per
    tile (fewer programs run faster). sm_80/sm_90: 64 x 32 with 8 warps, 32 x 16 when
    the dots run in fp32 (``fp32_dots``: twice the registers per element). sm_75:
    64 x 16, and 32 x 16 for fp32 dots or d > 64 (its 64 KB of shared memory). The dkdv
    kernel, which holds dk̃, dṽ and the corner gathers at once, drops to 16 x 16 with
    4 warps above d = 64 (d = 32 on sm_75). With ``NUM_STAGES = 1`` these fit shared
    memory and do not spill registers for d <= 128 and fp16/bf16/fp32 on sm_80 and
    sm_90, and for d <= 64 on sm_75 (``tests/kernels/test_deformable.py`` compiles a
    representative subset ahead of time).
    BLOCK_N is at least 16, the smallest tl.dot tile on a GPU.
    """
    if capability is None:
        return 64, min(64, max(16, triton.next_power_of_2(n_s))), 4
    if capability[0] >= 8:
        if kernel == "dkdv" and head_dim > 64:
            return 16, 16, 4
        return (32, 16, 8) if fp32_dots else (64, 32, 8)
    if kernel == "dkdv" and head_dim > 32:
        return 16, 16, 4
    return (32, 16, 8) if fp32_dots or head_dim > 64 else (64, 16, 8)


def _validate_dat(q, k_map, v_map, points, sm_scale):
    _check_float("q", q, 4, "(B, H, N_q, d)")
    _check_float("k_map", k_map, 5, "(B, H, H_f, W_f, d)")
    _check_float("v_map", v_map, 5, "(B, H, H_f, W_f, d)")
    _check_float("points", points, 4, "(B, G, N_s, 2)")
    b, n_h, n_q, d = q.shape
    if k_map.shape[:2] != (b, n_h) or k_map.shape[-1] != d:
        raise ValueError(
            f"k_map must be (B, H, H_f, W_f, d) with B={b}, H={n_h}, "
            f"d={d}, got shape {tuple(k_map.shape)}"
        )
    if v_map.shape != k_map.shape:
        raise ValueError(
            f"v_map must have k_map's shape {tuple(k_map.shape)}, "
            f"got shape {tuple(v_map.shape)}"
        )
    if v_map.dtype != k_map.dtype or q.dtype != k_map.dtype:
        raise TypeError(
            f"q, k_map and v_map must share a dtype, got {q.dtype}, "
            f"{k_map.dtype}, {v_map.dtype}"
        )
    g = points.shape[1]
    if points.shape[0] != b or points.shape[-1] != 2 or g < 1 or n_h % g:
        raise ValueError(
            f"points must be (B, G, N_s, 2) with B={b} and G dividing "
            f"H={n_h}, got shape {tuple(points.shape)}"
        )
    if points.shape[2] < 1 or n_q < 1 or min(k_map.shape[2:4]) < 1:
        raise ValueError(
            f"need N_q >= 1, N_s >= 1 and a non-empty map: "
            f"q {tuple(q.shape)}, k_map {tuple(k_map.shape)}, "
            f"points {tuple(points.shape)}"
        )
    if not 1 <= d <= MAX_HEAD_DIM:
        raise ValueError(f"head dim d={d} must be in 1..{MAX_HEAD_DIM}")
    for name, t in (("k_map", k_map), ("v_map", v_map), ("points", points)):
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}")
    # finite, and sm_scale * log2(e) (the kernel's exp2 factor) within float32
    return kernel_scale(sm_scale, d)


def _dat_args(q, k_map, v_map, points):
    b, n_h, n_q, d = q.shape
    g, n_s = points.shape[1:3]
    h_f, w_f = k_map.shape[2:4]
    return (*q.stride(), *k_map.stride(), *v_map.stride(), *points.stride()), (
        n_q,
        n_s,
        h_f,
        w_f,
        n_h,
        n_h // g,
        d,
    )


class _DeformableAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k_map, v_map, points, sm_scale, align_corners):
        b, n_h, n_q, d = q.shape
        n_s = points.shape[2]
        # (B, H, N_q, d)
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
        lse = torch.empty((b, n_h, n_q), device=q.device, dtype=torch.float32)
        cap = _capability(q.device)
        use_fp32 = dot_fp32(q.dtype, cap)
        block_m, block_n, num_warps = dat_config("fwd", n_s, d, cap, use_fp32)
        strides, sizes = _dat_args(q, k_map, v_map, points)
        grid = (triton.cdiv(n_q, block_m), b * n_h)
        _dat_fwd[grid](
            q,
            k_map,
            v_map,
            points,
            out,
            lse,
            sm_scale * LOG2E,
            *strides,
            *out.stride(),
            *sizes,
            ALIGN_CORNERS=align_corners,
            DOT_FP32=use_fp32,
            BLOCK_M=block_m,
            BLOCK_N=block_n,
            BLOCK_D=_block_d(d),
            num_warps=num_warps,
            num_stages=NUM_STAGES,
        )
        ctx.save_for_backward(q, k_map, v_map, points, out, lse)
        ctx.sm_scale, ctx.align_corners = sm_scale, align_corners
        ctx.dot_fp32 = use_fp32
        return out

    @staticmethod
    def backward(ctx, do):
        q, k_map, v_map, points, out, lse = ctx.saved_tensors
        b, n_h, n_q, d = q.shape
        g, n_s = points.shape[1:3]
        h_f, w_f = k_map.shape[2:4]
        # (B, H, N_q): rowsum(dO * O)
        delta = (out.float() * do.float()).sum(-1).contiguous()
        dq = torch.empty_like(q, memory_format=torch.contiguous_format)
        dk = torch.zeros((b, n_h, h_f, w_f, d), device=q.device, dtype=torch.float32)
        dv = torch.zeros_like(dk)
        dpts = torch.empty((b, n_h, n_s, 2), device=q.device, dtype=torch.float32)
        strides, sizes = _dat_args(q, k_map, v_map, points)
        common = dict(
            ALIGN_CORNERS=ctx.align_corners, DOT_FP32=ctx.dot_fp32, BLOCK_D=_block_d(d)
        )
        qk_scale = ctx.sm_scale * LOG2E
        cap = _capability(q.device)
        block_m, block_n, num_warps = dat_config("dkdv", n_s, d, cap, ctx.dot_fp32)
        _dat_bwd_dkdv[(triton.cdiv(n_s, block_n), b * n_h)](
            q,
            k_map,
            v_map,
            points,
            do,
            lse,
            delta,
            dk,
            dv,
            dpts,
            qk_scale,
            ctx.sm_scale,
            *strides,
            *do.stride(),
            *sizes,
            BLOCK_M=block_m,
            BLOCK_N=block_n,
            num_warps=num_warps,
            num_stages=NUM_STAGES,
            **common,
        )
        block_m, block_n, num_warps = dat_config("dq", n_s, d, cap, ctx.dot_fp32)
        _dat_bwd_dq[(triton.cdiv(n_q, block_m), b * n_h)](
            q,
            k_map,
            v_map,
            points,
            do,
            lse,
            delta,
            dq,
            qk_scale,
            ctx.sm_scale,
            *strides[:4],
            *dq.stride(),
            *strides[4:],
            *do.stride(),
            *sizes,
            BLOCK_M=block_m,
            BLOCK_N=block_n,
            num_warps=num_warps,
            num_stages=NUM_STAGES,
            **common,
        )
        # (B, G, N_s, 2): the heads of a group summed
        dpts = dpts.view(b, g, n_h // g, n_s, 2).sum(2)
        return (
            dq,
            dk.to(k_map.dtype),
            dv.to(v_map.dtype),
            dpts.to(points.dtype),
            None,
            None,
        )


def deformable_attention(
    q: torch.Tensor,
    k_map: torch.Tensor,
    v_map: torch.Tensor,
    points: torch.Tensor,
    sm_scale: float | None = None,
    align_corners: bool = True,
) -> torch.Tensor:
    """Attention over keys and values bilinearly sampled from maps, fused (DAT).

    q: (B, H, N_q, d); k_map, v_map: (B, H, H_f, W_f, d); points: (B, G, N_s, 2) as
    (x, y) in [-1, 1] (grid_sample's convention, ``align_corners`` as there), shared by
    the H / G heads of each group. Returns (B, H, N_q, d). Differentiable in q, k_map,
    v_map and points.
    """
    scale = _validate_dat(q, k_map, v_map, points, sm_scale)
    if not isinstance(align_corners, bool):
        raise TypeError(
            f"align_corners must be a bool, "
            f"got {type(align_corners).__name__} {align_corners!r}"
        )
    return _DeformableAttention.apply(q, k_map, v_map, points, scale, align_corners)


def sample_maps(
    k_map: torch.Tensor,
    v_map: torch.Tensor,
    points: torch.Tensor,
    align_corners: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """grid_sample both maps at each group's points: k̃, ṽ of shape (B, H, N_s, d)."""
    b, n_h, h_f, w_f, d = k_map.shape
    g, n_s = points.shape[1:3]
    grid = points.repeat_interleave(n_h // g, dim=1).reshape(b * n_h, 1, n_s, 2)
    out = []
    for m in (k_map, v_map):
        m2 = m.reshape(b * n_h, h_f, w_f, d).permute(0, 3, 1, 2)  # (B*H, d, H_f, W_f)
        s = F.grid_sample(
            m2,
            grid.to(m.dtype),
            mode="bilinear",
            padding_mode="zeros",
            align_corners=align_corners,
        )  # (B*H, d, 1, N_s)
        out.append(s[:, :, 0].transpose(1, 2).reshape(b, n_h, n_s, d))  # (B, H, N_s, d)
    return out[0], out[1]


def deformable_attention_reference(
    q, k_map, v_map, points, sm_scale=None, align_corners=True
) -> torch.Tensor:
    """Naive PyTorch: grid_sample the maps, then materialise the attention matrix."""
    k, v = sample_maps(k_map, v_map, points, align_corners)
    scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else sm_scale
    p = torch.softmax((q @ k.transpose(-1, -2)) * scale, dim=-1)  # (B, H, N_q, N_s)
    return p @ v
