"""The ``@triton.jit`` pieces both deformable kernels share: bilinear corner weights
(``_bilinear_setup``), the four corner rows of a sample (``_corner_rows``,
``_msda_corner``) and their scatter in the backward (``_corner_scatter``), and DAT's
gather of sampled keys and values (``_pixel``, ``_gather_samples``).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _bilinear_setup(px, py):
    """Integer top-left corner and fractional parts of pixel coordinates (px, py)."""
    x0f = tl.floor(px)
    y0f = tl.floor(py)
    lx = px - x0f  # weight of the right neighbour
    ly = py - y0f  # weight of the lower neighbour
    return x0f.to(tl.int32), y0f.to(tl.int32), lx, ly


@triton.jit
def _corner_rows(
    base, xi, yi, W, H, stride_y, stride_x, offs_d, stride_d, mask_r, mask_d
):
    """Gather one corner for a block of samples: (BLOCK, BLOCK_D) fp32, 0 outside the
    map."""
    inside = (xi >= 0) & (xi < W) & (yi >= 0) & (yi < H) & mask_r
    ptrs = (
        base
        + (yi.to(tl.int64) * stride_y + xi.to(tl.int64) * stride_x)[:, None]
        + offs_d[None, :] * stride_d
    )
    return tl.load(ptrs, mask=inside[:, None] & mask_d[None, :], other=0.0).to(
        tl.float32
    )


@triton.jit
def _corner_scatter(
    base, xi, yi, W, H, stride_y, stride_x, offs_d, mask_r, mask_d, val
):
    """atomic_add a (BLOCK, BLOCK_D) tile into one corner of a contiguous fp32 map.

    Relaxed: a sum needs no ordering against other memory, only atomicity, so no fence
    (``MEMBAR.ALL.GPU``, a round trip to L2) is issued around each add, as the default
    ``acq_rel`` would."""
    inside = (xi >= 0) & (xi < W) & (yi >= 0) & (yi < H) & mask_r
    ptrs = (
        base
        + (yi.to(tl.int64) * stride_y + xi.to(tl.int64) * stride_x)[:, None]
        + offs_d[None, :]
    )
    tl.atomic_add(ptrs, val, mask=inside[:, None] & mask_d[None, :], sem="relaxed")


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
    N_K,
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
    mask_n = offs_n < N_K
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
