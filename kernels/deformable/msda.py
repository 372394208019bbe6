"""Multi-scale deformable attention (Deformable DETR) in Triton: forward, backward.

``ms_deform_attn`` (and ``MSDeformAttnFunction`` with the CUDA op's signature), its
kernels ``_msda_fwd``/``_msda_bwd``, tile choice ``msda_config`` and the PyTorch
reference ``ms_deform_attn_reference``. The spec sheet is :mod:`kernels.deformable`'s.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from .sampling import (
    _MSDA_DTYPES,
    NUM_STAGES,
    _bilinear_setup,
    _block_d,
    _capability,
    _check_float,
    _corner_scatter,
)

# --------------------------------------------------------------------------------------
# Multi-scale deformable attention (Deformable DETR)
# --------------------------------------------------------------------------------------

#: MSDA walks the value head dim in blocks of at most this many channels on a GPU (any
#: D_h works); under the interpreter, where every tile op costs Python overhead, in one
#: block up to this many (the tests lower it to exercise the channel loop).
MSDA_MAX_BLOCK_D = 128
MSDA_INTERPRET_MAX_BLOCK_D = 4096


@triton.jit
def _to_acc(x, FP64: tl.constexpr):
    """MSDA's arithmetic type: fp64 for float64 inputs, fp32 otherwise."""
    if FP64:
        return x.to(tl.float64)
    else:
        return x.to(tl.float32)


@triton.jit
def _msda_corner(
    base,
    xi,
    yi,
    W,
    H,
    stride_y,
    stride_x,
    offs_d,
    stride_d,
    mask_r,
    mask_d,
    FP64: tl.constexpr,
):
    """Gather one corner for a block of queries: (BLOCK_Q, BLOCK_D), 0 outside the
    map."""
    inside = (xi >= 0) & (xi < W) & (yi >= 0) & (yi < H) & mask_r
    ptrs = (
        base
        + (yi.to(tl.int64) * stride_y + xi.to(tl.int64) * stride_x)[:, None]
        + offs_d[None, :] * stride_d
    )
    return _to_acc(
        tl.load(ptrs, mask=inside[:, None] & mask_d[None, :], other=0.0), FP64
    )


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
    L_q,
    N_HEADS,
    HEAD_DIM,
    N_LEVELS: tl.constexpr,
    N_POINTS: tl.constexpr,
    FP64: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    pid_q = tl.program_id(0)
    pid_bh = tl.program_id(1).to(tl.int64)
    b = pid_bh // N_HEADS
    h = pid_bh % N_HEADS
    offs_q = pid_q * BLOCK_Q + tl.arange(0, BLOCK_Q)
    mask_q = offs_q < L_q
    v_base = Value + b * stride_vb + h * stride_vh
    # Loc (B, L_q, H, L, P, 2) and Attn (B, L_q, H, L, P) are contiguous
    row = ((b * L_q + offs_q) * N_HEADS + h) * (N_LEVELS * N_POINTS)  # (BLOCK_Q,)
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
    L_q,
    S,
    N_HEADS,
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
    b = pid_bh // N_HEADS
    h = pid_bh % N_HEADS
    offs_q = pid_q * BLOCK_Q + tl.arange(0, BLOCK_Q)
    mask_q = offs_q < L_q
    v_base = Value + b * stride_vb + h * stride_vh
    # dValue is a contiguous (B, S, H, D) buffer in the arithmetic type (fp32 or fp64)
    dv_base = dValue + (b * S * N_HEADS + h) * HEAD_DIM
    dv_stride_s = N_HEADS * HEAD_DIM
    row = ((b * L_q + offs_q) * N_HEADS + h) * (N_LEVELS * N_POINTS)
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


def msda_config(
    kernel: str,
    n_rows: int,
    head_dim: int,
    capability: tuple[int, int] | None,
    fp32: bool = False,
) -> tuple[int, int]:
    """(BLOCK_Q, num_warps) for ``"fwd"`` or ``"bwd"`` over ``n_rows = B * L_q * H``
    rows.

    Under the interpreter (``capability`` None): big tiles (fewer, vectorised programs).
    On a GPU the forward takes 32 queries per program when there are enough rows to fill
    the SMs (and D_h <= 64 in 16-bit), otherwise 16; the backward, whose four corner
    scatters hold more registers, always 16.
    """
    if capability is None:
        return 64, 4
    if kernel == "fwd" and n_rows >= 32 * 1024 and head_dim <= 64 and not fp32:
        return 32, 4
    return 16, 4


def _validate_msda(
    value, spatial_shapes, level_start_index, sampling_locations, attention_weights
):
    """Check every argument; returns the level shapes and starts, checked, on value's
    device."""
    _check_float("value", value, 4, "(B, S, H, D_h)", _MSDA_DTYPES)
    _check_float(
        "sampling_locations",
        sampling_locations,
        6,
        "(B, L_q, H, L, P, 2)",
        _MSDA_DTYPES,
    )
    _check_float(
        "attention_weights", attention_weights, 5, "(B, L_q, H, L, P)", _MSDA_DTYPES
    )
    for name, t, nd in (
        ("spatial_shapes", spatial_shapes, 2),
        ("level_start_index", level_start_index, 1),
    ):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"{name} must be int64, got {t.dtype}")
        if t.dim() != nd:
            raise ValueError(f"{name} must have {nd} dims, got shape {tuple(t.shape)}")
    b, s, n_h, d = value.shape
    _, l_q, _, n_l, n_p, _ = sampling_locations.shape
    if spatial_shapes.shape != (n_l, 2):
        raise ValueError(
            f"spatial_shapes must be (L, 2) = ({n_l}, 2) for L={n_l} "
            f"levels in sampling_locations, "
            f"got shape {tuple(spatial_shapes.shape)}"
        )
    if level_start_index.shape != (n_l,):
        raise ValueError(
            f"level_start_index must be (L,) = ({n_l},), "
            f"got shape {tuple(level_start_index.shape)}"
        )
    if sampling_locations.shape != (b, l_q, n_h, n_l, n_p, 2):
        raise ValueError(
            f"sampling_locations must be (B, L_q, H, L, P, 2) with B={b}, "
            f"H={n_h}, got shape {tuple(sampling_locations.shape)}"
        )
    if attention_weights.shape != (b, l_q, n_h, n_l, n_p):
        raise ValueError(
            f"attention_weights must be (B, L_q, H, L, P) = "
            f"{(b, l_q, n_h, n_l, n_p)}, "
            f"got shape {tuple(attention_weights.shape)}"
        )
    if d < 1 or l_q < 1 or n_l < 1 or n_p < 1 or b < 1 or n_h < 1:
        raise ValueError(
            f"value (B, S, H, D_h) and sampling_locations "
            f"(B, L_q, H, L, P, 2) need every size >= 1, "
            f"got value {tuple(value.shape)}, "
            f"sampling_locations {tuple(sampling_locations.shape)}"
        )
    for name, t in (
        ("spatial_shapes", spatial_shapes),
        ("level_start_index", level_start_index),
        ("sampling_locations", sampling_locations),
        ("attention_weights", attention_weights),
    ):
        if t.device != value.device:
            raise ValueError(f"{name} is on {t.device} but value is on {value.device}")
    # Checked on every call: no cache may skip a bounds check on data the caller can
    # change (e.g. in place through .numpy()). One small device-to-host copy (a sync)
    # per call; the kernel then reads these very checked values, copied back, not the
    # caller's tensors.
    shapes = spatial_shapes.detach().cpu().to(torch.int64)
    areas = shapes[:, 0] * shapes[:, 1]
    if (shapes <= 0).any():
        raise ValueError(f"spatial_shapes must be positive, got {shapes.tolist()}")
    if int(areas.sum()) != s:
        raise ValueError(
            f"spatial_shapes {shapes.tolist()} cover "
            f"{int(areas.sum())} positions but value has S={s}"
        )
    starts = torch.cat([areas.new_zeros(1), areas.cumsum(0)[:-1]])
    if not torch.equal(level_start_index.detach().cpu().to(torch.int64), starts):
        raise ValueError(
            f"level_start_index {level_start_index.tolist()} does not "
            f"match spatial_shapes (expected {starts.tolist()})"
        )
    return shapes.to(value.device), starts.to(value.device)


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


def _interpret_rows(block_q: int, l_q: int, device) -> int:
    """Under the interpreter, no wider query tile than the queries need (at least
    16)."""
    if _capability(device) is None:
        return min(block_q, max(16, triton.next_power_of_2(l_q)))
    return block_q


def _msda_block_d(head_dim: int, capability: tuple[int, int] | None = None) -> int:
    """Channels per block of the MSDA kernels: the padded head dim, at most 128 on a GPU
    (the kernels loop over channel blocks for larger head dims)."""
    top = MSDA_INTERPRET_MAX_BLOCK_D if capability is None else MSDA_MAX_BLOCK_D
    return max(16, min(_block_d(head_dim), top))


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
