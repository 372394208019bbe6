"""The public calls of the deformable kernels and their autograd: ``ms_deform_attn``
(and ``MSDeformAttnFunction`` with the CUDA op's signature), ``deformable_attention``,
``sample_maps``, and the PyTorch references ``ms_deform_attn_reference`` and
``deformable_attention_reference`` built on ``grid_sample``. The spec sheet is
:mod:`kernels.deformable`'s.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
import triton

from ..common import LOG2E, renamed_scale
from .backward import _dat_bwd_dkdv, _dat_bwd_dq, _msda_bwd
from .checks import _validate_dat, _validate_msda
from .forward import _dat_fwd, _msda_fwd
from .tiles import (
    NUM_STAGES,
    _block_d,
    _capability,
    _interpret_rows,
    _msda_block_d,
    dat_config,
    dot_fp32,
    msda_config,
)


class _MSDeformAttn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, value, shapes, starts, sampling_locations, attention_weights):
        b, s, n_h, d = value.shape
        _, l_q, _, n_l, n_p, _ = sampling_locations.shape
        loc = sampling_locations.contiguous()
        attn = attention_weights.contiguous()
        fp64 = torch.float64 in (value.dtype, loc.dtype, attn.dtype)
        out = torch.empty((b, l_q, n_h, d), device=value.device, dtype=value.dtype)
        block_q, num_warps = msda_config(
            "fwd",
            b * l_q * n_h,
            d,
            _capability(value.device),
            value.dtype in (torch.float32, torch.float64),
        )
        block_q = _interpret_rows(block_q, l_q, value.device)
        grid = (triton.cdiv(l_q, block_q), b * n_h)
        _msda_fwd[grid](
            value,
            shapes,
            starts,
            loc,
            attn,
            out,
            *value.stride(),
            *out.stride(),
            l_q,
            n_h,
            d,
            N_LEVELS=n_l,
            N_POINTS=n_p,
            FP64=fp64,
            BLOCK_Q=block_q,
            BLOCK_D=_msda_block_d(d, _capability(value.device)),
            num_warps=num_warps,
            num_stages=NUM_STAGES,
        )
        ctx.save_for_backward(value, shapes, starts, loc, attn)
        ctx.fp64 = fp64
        return out.view(b, l_q, n_h * d)  # (B, L_q, H*D_h)

    @staticmethod
    def backward(ctx, grad_out):
        value, shapes, starts, loc, attn = ctx.saved_tensors
        b, s, n_h, d = value.shape
        _, l_q, _, n_l, n_p, _ = loc.shape
        acc_dtype = torch.float64 if ctx.fp64 else torch.float32
        go = grad_out.view(b, l_q, n_h, d)  # (B, L_q, H, D_h)
        d_value = torch.zeros((b, s, n_h, d), device=value.device, dtype=acc_dtype)
        d_loc = torch.empty(loc.shape, device=value.device, dtype=acc_dtype)
        d_attn = torch.empty(attn.shape, device=value.device, dtype=acc_dtype)
        block_q, num_warps = msda_config(
            "bwd",
            b * l_q * n_h,
            d,
            _capability(value.device),
            value.dtype in (torch.float32, torch.float64),
        )
        block_q = _interpret_rows(block_q, l_q, value.device)
        bd = _msda_block_d(d, _capability(value.device))
        grid = (triton.cdiv(l_q, block_q), b * n_h)
        _msda_bwd[grid](
            value,
            shapes,
            starts,
            loc,
            attn,
            go,
            d_value,
            d_loc,
            d_attn,
            *value.stride(),
            *go.stride(),
            l_q,
            s,
            n_h,
            d,
            N_LEVELS=n_l,
            N_POINTS=n_p,
            FP64=ctx.fp64,
            BLOCK_Q=block_q,
            BLOCK_D=bd,
            D_BLOCKS=triton.cdiv(d, bd),
            num_warps=num_warps,
            num_stages=NUM_STAGES,
        )
        return (
            d_value.to(value.dtype),
            None,
            None,
            d_loc.to(loc.dtype),
            d_attn.to(attn.dtype),
        )


def ms_deform_attn(
    value: torch.Tensor,
    spatial_shapes: torch.Tensor,
    level_start_index: torch.Tensor,
    sampling_locations: torch.Tensor,
    attention_weights: torch.Tensor,
    im2col_step: int | None = None,
) -> torch.Tensor:
    """Multi-scale deformable attention (Deformable DETR's op), forward and backward.

    value: (B, S, H, D_h); spatial_shapes: (L, 2) int64 (H_l, W_l); level_start_index:
    (L,); sampling_locations: (B, L_q, H, L, P, 2) (x, y) in [0, 1]; attention_weights:
    (B, L_q, H, L, P). Returns (B, L_q, H * D_h). Differentiable in value,
    sampling_locations and attention_weights. float16/bfloat16/float32/float64, any D_h.
    ``im2col_step`` (the CUDA op's batching knob) is accepted for drop-in use and
    ignored: this kernel needs no im2col buffer.
    """
    if im2col_step is not None and (
        isinstance(im2col_step, bool)
        or not isinstance(im2col_step, int)
        or im2col_step < 1
    ):
        raise TypeError(
            f"im2col_step must be a positive int or None, got {im2col_step!r}"
        )
    shapes, starts = _validate_msda(
        value, spatial_shapes, level_start_index, sampling_locations, attention_weights
    )
    return _MSDeformAttn.apply(
        value, shapes, starts, sampling_locations, attention_weights
    )


class MSDeformAttnFunction:
    """Drop-in for Deformable DETR's ``MSDeformAttnFunction``:
    ``MSDeformAttnFunction.apply(value, spatial_shapes, level_start_index,
    sampling_locations, attention_weights, im2col_step)``."""

    @staticmethod
    def apply(
        value,
        spatial_shapes,
        level_start_index,
        sampling_locations,
        attention_weights,
        im2col_step=None,
    ):
        return ms_deform_attn(
            value,
            spatial_shapes,
            level_start_index,
            sampling_locations,
            attention_weights,
            im2col_step,
        )


def ms_deform_attn_reference(
    value, spatial_shapes, level_start_index, sampling_locations, attention_weights
) -> torch.Tensor:
    """Deformable DETR's ``ms_deform_attn_core_pytorch``: one grid_sample per level."""
    b, _, n_h, d = value.shape
    _, l_q, _, n_l, n_p, _ = sampling_locations.shape
    shapes = [(int(h), int(w)) for h, w in spatial_shapes.tolist()]
    value_list = value.split([h * w for h, w in shapes], dim=1)
    grids = 2 * sampling_locations - 1
    samples = []
    for lvl, (h, w) in enumerate(shapes):
        # (B*H, D, h, w)
        v = value_list[lvl].flatten(2).transpose(1, 2).reshape(b * n_h, d, h, w)
        g = grids[:, :, :, lvl].transpose(1, 2).flatten(0, 1)  # (B*H, L_q, P, 2)
        samples.append(
            F.grid_sample(
                v, g, mode="bilinear", padding_mode="zeros", align_corners=False
            )
        )  # (B*H, D, L_q, P)
    w = attention_weights.transpose(1, 2).reshape(b * n_h, 1, l_q, n_l * n_p)
    out = (torch.stack(samples, dim=-2).flatten(-2) * w).sum(-1).view(b, n_h * d, l_q)
    return out.transpose(1, 2).contiguous()  # (B, L_q, H*D_h)


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
        block_m, block_n, num_warps = dat_config("fwd", n_s, d, cap, use_fp32, n_q)
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
        block_m, block_n, num_warps = dat_config("dkdv", n_s, d, cap, ctx.dot_fp32, n_q)
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
        block_m, block_n, num_warps = dat_config("dq", n_s, d, cap, ctx.dot_fp32, n_q)
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
    softmax_scale: float | None = None,
    align_corners: bool = True,
    *,
    sm_scale: float | None = None,
) -> torch.Tensor:
    """Attention over keys and values bilinearly sampled from maps, fused (DAT).

    q: (B, H, N_q, d); k_map, v_map: (B, H, H_f, W_f, d); points: (B, G, N_s, 2) as
    (x, y) in [-1, 1] (grid_sample's convention, ``align_corners`` as there), shared by
    the H / G heads of each group. ``softmax_scale`` (flash-attn's name, as the other
    kernels) defaults to 1 / sqrt(d); ``sm_scale=``, its old name, still works with a
    DeprecationWarning. Returns (B, H, N_q, d). Differentiable in q, k_map, v_map and
    points.
    """
    name = "softmax_scale" if sm_scale is None else "sm_scale"
    softmax_scale = renamed_scale(softmax_scale, sm_scale, "softmax_scale")
    scale = _validate_dat(q, k_map, v_map, points, softmax_scale, name)
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
    q, k_map, v_map, points, scale=None, align_corners=True, *, sm_scale=None
) -> torch.Tensor:
    """Naive PyTorch: grid_sample the maps, then materialise the attention matrix.
    ``scale`` (PyTorch's name, as the other baselines) defaults to 1 / sqrt(d);
    ``sm_scale=``, its old name, still works with a DeprecationWarning."""
    scale = renamed_scale(scale, sm_scale, "scale")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    k, v = sample_maps(k_map, v_map, points, align_corners)
    p = torch.softmax((q @ k.transpose(-1, -2)) * scale, dim=-1)  # (B, H, N_q, N_s)
    return p @ v
