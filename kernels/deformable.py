"""Deformable attention in Triton: Deformable DETR's multi-scale op (MSDA) and a
fused DAT attention whose keys and values are bilinear samples gathered inside the
attention loop.

Spec sheet
----------
``ms_deform_attn(value, spatial_shapes, level_start_index, sampling_locations,
                 attention_weights)``
    Drop-in for Deformable DETR's ``MSDeformAttnFunction`` (and its PyTorch reference
    ``ms_deform_attn_core_pytorch``): value (B, S, H, D_h) with S = sum_l H_l W_l;
    spatial_shapes (L, 2) int64 as (H_l, W_l); level_start_index (L,) int64;
    sampling_locations (B, L_q, H, L, P, 2) as (x, y) in [0, 1]; attention_weights
    (B, L_q, H, L, P). Returns (B, L_q, H * D_h) in value's dtype. ``im2col_step`` is
    accepted and ignored; ``MSDeformAttnFunction.apply`` has the CUDA op's signature.
    The level tensors are checked against S on every call (a small device-to-host
    copy); the kernel reads the checked copy, so no in-place edit can make it read out
    of bounds.
    Algorithm: one program per (block of ``BLOCK_Q`` queries, batch x head); the
    (BLOCK_Q, D_h) accumulator stays in registers while the program walks the L x P
    samples of each query, gathering four corner rows of D_h contiguous values each
    (bilinear, zero padding, ``align_corners=False``: pixel = loc * W_l - 0.5, the same
    as grid_sample on 2 * loc - 1). Backward: the same walk recomputes each sample and
    writes d(weights) and d(locations) directly (each program owns its queries), and
    scatters d(value) to the four corners with ``tl.atomic_add`` into an fp32 buffer
    (so d(value) is not bit-reproducible run to run, like the CUDA op).
``deformable_attention(q, k_map, v_map, points, sm_scale=None, align_corners=True)``
    q (B, H, N_q, d); k_map, v_map (B, H, H_f, W_f, d) projected key/value maps; points
    (B, G, N_s, 2) as (x, y) in [-1, 1], shared by the H / G heads of each offset group.
    Returns softmax(q k̃^T * sm_scale) ṽ, (B, H, N_q, d), where k̃, ṽ are the maps sampled
    bilinearly (zero padding) at the points. Algorithm: FlashAttention-2 forward in
    which each ``BLOCK_N`` tile of sampled keys and values is built in registers from
    four corner gathers of the maps, so k̃ and ṽ never exist in HBM. Backward:
    ``delta = rowsum(dO * O)`` (PyTorch), ``_dat_bwd_dkdv`` (one program per sample
    block: accumulates dk̃, dṽ over every query block, then scatters them to the maps'
    corners with ``tl.atomic_add`` and writes the point gradient of its head) and
    ``_dat_bwd_dq`` (one program per query block). Point gradients of the heads in a
    group are summed in PyTorch (deterministic).
Dtypes
    float16, bfloat16, float32; MSDA also float64 (computed in fp64: Deformable DETR's
    own float64 tests and gradcheck pass). MSDA's value, locations and weights may
    differ in dtype (the output follows value); DAT's q, k_map and v_map share one
    (points may differ).
    Bilinear weights, sums and softmax statistics are fp32. Dot products run in the
    input dtype on tensor cores for fp16/bf16 and in IEEE fp32 (no TF32) for fp32;
    under the Triton interpreter, and for bf16 below sm_80, tiles are upcast to fp32.
Head dims
    DAT: d from 1 to 128, padded to the next power of two (at least 16) and masked.
    MSDA: any D_h (Deformable DETR tests 30 ... 3096): the kernels loop over channel
    blocks of at most 128 (one block up to 128).
Devices
    CUDA GPUs sm_75 ... sm_90 with Triton 3.6 / 3.7 (only long-stable Triton APIs:
    masked pointer loads/stores, tl.dot, tl.atomic_add; no block pointers or TMA). On a
    CPU, the Triton interpreter (``TRITON_INTERPRET=1``, set by ``kernels.runtime``)
    with CPU tensors.
Tiles
    Per architecture (``msda_config``, ``dat_config``), not autotuned, and no software
    pipelining (``NUM_STAGES = 1``). Within shared memory and without register spills
    for aligned contiguous inputs on sm_80 and sm_90 up to d = 128, on sm_75 up to
    d = 64 (at d = 128 its DAT backward spills: correct, slower); the tests compile a
    representative subset ahead of time.
Known limits
    No GPU timing has been recorded in this repository yet:
    ``benchmarks/suite_deformable.py`` records it on a CUDA machine (``make bench``).
    The fused DAT kernel re-gathers the four corners of every sample once per query
    block (served by L2 when the maps fit there), and the gathers are not coalesced
    across samples. ``deformable_attention`` has no attention bias (DAT's relative
    position bias is not included) and no mask. MSDA's ``im2col_step`` argument of the
    CUDA op is not needed (accepted and ignored). DAT does not take float64 (use the
    reference below). A NaN/inf sampling location gives a NaN sample. sm_scale whose
    product with log2(e) overflows float32 is refused.

``ms_deform_attn_reference`` and ``deformable_attention_reference`` are the naive
PyTorch versions built on ``grid_sample`` that the tests and benchmarks compare against.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from . import runtime
from .naive import kernel_scale

LOG2E = 1.4426950408889634  # log2(e): exp(x) = exp2(x * LOG2E)
LN2 = 0.6931471805599453  # ln(2)
MAX_HEAD_DIM = 128
#: No software pipelining: the gathers' addresses depend on the points, and
#: multi-buffering four corner tiles per map costs more shared memory than it hides
#: (164 KB at d = 128, fp32).
NUM_STAGES = 1
_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
#: MSDA also takes float64 (Deformable DETR's own tests run in it): gathers and FMAs
#: only, no tensor-core dot, so the kernel simply computes in fp64 then.
_MSDA_DTYPES = _FLOAT_DTYPES + (torch.float64,)
#: MSDA walks the value head dim in blocks of at most this many channels on a GPU (any
#: D_h works); under the interpreter, where every tile op costs Python overhead, in one
#: block up to this many (the tests lower it to exercise the channel loop).
MSDA_MAX_BLOCK_D = 128
MSDA_INTERPRET_MAX_BLOCK_D = 4096


# --------------------------------------------------------------------------------------
# Bilinear sampling helpers (shared by both kernels)
# --------------------------------------------------------------------------------------


@triton.jit
def _bilinear_setup(px, py):
    """Integer top-left corner and fractional parts of pixel coordinates (px, py)."""
    x0f = tl.floor(px)
    y0f = tl.floor(py)
    lx = px - x0f  # weight of the right neighbour
    ly = py - y0f  # weight of the lower neighbour
    return x0f.to(tl.int32), y0f.to(tl.int32), lx, ly


@triton.jit
def _corner_rows(base, xi, yi, W, H, stride_y, stride_x, offs_d, stride_d, mask_r,
                 mask_d):
    """Gather one corner for a block of samples: (BLOCK, BLOCK_D) fp32, 0 outside the
    map."""
    inside = (xi >= 0) & (xi < W) & (yi >= 0) & (yi < H) & mask_r
    ptrs = base + (yi.to(tl.int64) * stride_y + xi.to(tl.int64) * stride_x)[:, None] \
        + offs_d[None, :] * stride_d
    return tl.load(ptrs, mask=inside[:, None] & mask_d[None, :],
                   other=0.0).to(tl.float32)


@triton.jit
def _corner_scatter(base, xi, yi, W, H, stride_y, stride_x, offs_d, mask_r, mask_d,
                    val):
    """atomic_add a (BLOCK, BLOCK_D) tile into one corner of a contiguous fp32 map.

    Relaxed: a sum needs no ordering against other memory, only atomicity, so no fence
    (``MEMBAR.ALL.GPU``, a round trip to L2) is issued around each add, as the default
    ``acq_rel`` would."""
    inside = (xi >= 0) & (xi < W) & (yi >= 0) & (yi < H) & mask_r
    ptrs = base + (yi.to(tl.int64) * stride_y + xi.to(tl.int64) * stride_x)[:, None] \
        + offs_d[None, :]
    tl.atomic_add(ptrs, val, mask=inside[:, None] & mask_d[None, :], sem="relaxed")


# --------------------------------------------------------------------------------------
# Multi-scale deformable attention (Deformable DETR)
# --------------------------------------------------------------------------------------


@triton.jit
def _to_acc(x, FP64: tl.constexpr):
    """MSDA's arithmetic type: fp64 for float64 inputs, fp32 otherwise."""
    if FP64:
        return x.to(tl.float64)
    else:
        return x.to(tl.float32)


@triton.jit
def _msda_corner(base, xi, yi, W, H, stride_y, stride_x, offs_d, stride_d, mask_r,
                 mask_d, FP64: tl.constexpr):
    """Gather one corner for a block of queries: (BLOCK_Q, BLOCK_D), 0 outside the map.
    """
    inside = (xi >= 0) & (xi < W) & (yi >= 0) & (yi < H) & mask_r
    ptrs = base + (yi.to(tl.int64) * stride_y + xi.to(tl.int64) * stride_x)[:, None] \
        + offs_d[None, :] * stride_d
    return _to_acc(tl.load(ptrs, mask=inside[:, None] & mask_d[None, :], other=0.0),
                   FP64)


@triton.jit
def _msda_fwd(Value, Shapes, Starts, Loc, Attn, Out,
              stride_vb, stride_vs, stride_vh, stride_vd,
              stride_ob, stride_oq, stride_oh, stride_od,
              L_q, N_HEADS, HEAD_DIM,
              N_LEVELS: tl.constexpr, N_POINTS: tl.constexpr, FP64: tl.constexpr,
              BLOCK_Q: tl.constexpr, BLOCK_D: tl.constexpr):
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
                x = _to_acc(tl.load(Loc + (row + lp) * 2, mask=mask_q, other=0.0),
                            FP64)
                y = _to_acc(tl.load(Loc + (row + lp) * 2 + 1, mask=mask_q, other=0.0),
                            FP64)
                w = _to_acc(tl.load(Attn + row + lp, mask=mask_q, other=0.0), FP64)
                # align_corners=False on grid 2*loc - 1: pixel = loc * size - 0.5
                x0, y0, lx, ly = _bilinear_setup(x * W_l - 0.5, y * H_l - 0.5)
                hx = 1.0 - lx
                hy = 1.0 - ly
                sy = W_l * stride_vs  # one row of the level down
                v00 = _msda_corner(lvl_base, x0, y0, W_l, H_l, sy, stride_vs,
                                   offs_d, stride_vd, mask_q, mask_d, FP64)
                v01 = _msda_corner(lvl_base, x0 + 1, y0, W_l, H_l, sy, stride_vs,
                                   offs_d, stride_vd, mask_q, mask_d, FP64)
                v10 = _msda_corner(lvl_base, x0, y0 + 1, W_l, H_l, sy, stride_vs,
                                   offs_d, stride_vd, mask_q, mask_d, FP64)
                v11 = _msda_corner(lvl_base, x0 + 1, y0 + 1, W_l, H_l, sy, stride_vs,
                                   offs_d, stride_vd, mask_q, mask_d, FP64)
                sample = (hy * hx)[:, None] * v00 + (hy * lx)[:, None] * v01 \
                    + (ly * hx)[:, None] * v10 + (ly * lx)[:, None] * v11
                acc += w[:, None] * sample
        o_ptrs = Out + b * stride_ob + offs_q[:, None] * stride_oq + h * stride_oh \
            + offs_d[None, :] * stride_od
        tl.store(o_ptrs, acc.to(Out.dtype.element_ty),
                 mask=mask_q[:, None] & mask_d[None, :])


@triton.jit
def _msda_bwd(Value, Shapes, Starts, Loc, Attn, dOut, dValue, dLoc, dAttn,
              stride_vb, stride_vs, stride_vh, stride_vd,
              stride_gb, stride_gq, stride_gh, stride_gd,
              L_q, S, N_HEADS, HEAD_DIM,
              N_LEVELS: tl.constexpr, N_POINTS: tl.constexpr, FP64: tl.constexpr,
              BLOCK_Q: tl.constexpr, BLOCK_D: tl.constexpr, D_BLOCKS: tl.constexpr):
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
                go = _to_acc(tl.load(dOut + b * stride_gb + offs_q[:, None] * stride_gq
                                     + h * stride_gh + offs_d[None, :] * stride_gd,
                                     mask=mask_q[:, None] & mask_d[None, :],
                                     other=0.0), FP64)
                v00 = _msda_corner(lvl_base, x0, y0, W_l, H_l, sy, stride_vs,
                                   offs_d, stride_vd, mask_q, mask_d, FP64)
                v01 = _msda_corner(lvl_base, x0 + 1, y0, W_l, H_l, sy, stride_vs,
                                   offs_d, stride_vd, mask_q, mask_d, FP64)
                v10 = _msda_corner(lvl_base, x0, y0 + 1, W_l, H_l, sy, stride_vs,
                                   offs_d, stride_vd, mask_q, mask_d, FP64)
                v11 = _msda_corner(lvl_base, x0 + 1, y0 + 1, W_l, H_l, sy, stride_vs,
                                   offs_d, stride_vd, mask_q, mask_d, FP64)
                sample = (hy * hx)[:, None] * v00 + (hy * lx)[:, None] * v01 \
                    + (ly * hx)[:, None] * v10 + (ly * lx)[:, None] * v11
                # d out / d weight = sample;  d sample / d px, d py from corner
                # differences
                g_w += tl.sum(go * sample, axis=1)
                ds_dpx = hy[:, None] * (v01 - v00) + ly[:, None] * (v11 - v10)
                ds_dpy = hx[:, None] * (v10 - v00) + lx[:, None] * (v11 - v01)
                g_px += tl.sum(go * ds_dpx, axis=1)
                g_py += tl.sum(go * ds_dpy, axis=1)
                # d value: scatter w * bilinear weight * dOut to the four corners
                gw = w[:, None] * go
                _corner_scatter(dlvl_base, x0, y0, W_l, H_l, dsy, dv_stride_s,
                                offs_d, mask_q, mask_d, (hy * hx)[:, None] * gw)
                _corner_scatter(dlvl_base, x0 + 1, y0, W_l, H_l, dsy, dv_stride_s,
                                offs_d, mask_q, mask_d, (hy * lx)[:, None] * gw)
                _corner_scatter(dlvl_base, x0, y0 + 1, W_l, H_l, dsy, dv_stride_s,
                                offs_d, mask_q, mask_d, (ly * hx)[:, None] * gw)
                _corner_scatter(dlvl_base, x0 + 1, y0 + 1, W_l, H_l, dsy, dv_stride_s,
                                offs_d, mask_q, mask_d, (ly * lx)[:, None] * gw)
            tl.store(dAttn + row + lp, g_w, mask=mask_q)
            # d px / d loc_x = W_l
            tl.store(dLoc + (row + lp) * 2, w * g_px * W_l, mask=mask_q)
            tl.store(dLoc + (row + lp) * 2 + 1, w * g_py * H_l, mask=mask_q)


def _block_d(head_dim: int) -> int:
    return max(16, triton.next_power_of_2(head_dim))


def _capability(device: torch.device) -> tuple[int, int] | None:
    """The GPU's compute capability, or None when the kernels run under the interpreter.
    """
    if runtime.INTERPRET or device.type != "cuda":
        return None
    return tuple(torch.cuda.get_device_capability(device))


def msda_config(kernel: str, n_rows: int, head_dim: int,
                capability: tuple[int, int] | None,
                fp32: bool = False) -> tuple[int, int]:
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


def _check_float(name: str, t, ndim: int, shape_doc: str, dtypes=_FLOAT_DTYPES) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        names = ", ".join(str(x).replace("torch.", "") for x in dtypes)
        raise TypeError(f"{name} must be one of {names}, got {t.dtype}")
    if t.dim() != ndim:
        raise ValueError(f"{name} must be {shape_doc}, got shape {tuple(t.shape)}")


def _validate_msda(value, spatial_shapes, level_start_index, sampling_locations,
                   attention_weights):
    """Check every argument; returns the level shapes and starts, checked, on value's
    device."""
    _check_float("value", value, 4, "(B, S, H, D_h)", _MSDA_DTYPES)
    _check_float("sampling_locations", sampling_locations, 6, "(B, L_q, H, L, P, 2)",
                 _MSDA_DTYPES)
    _check_float("attention_weights", attention_weights, 5, "(B, L_q, H, L, P)",
                 _MSDA_DTYPES)
    for name, t, nd in (("spatial_shapes", spatial_shapes, 2),
                        ("level_start_index", level_start_index, 1)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"{name} must be int64, got {t.dtype}")
        if t.dim() != nd:
            raise ValueError(f"{name} must have {nd} dims, got shape {tuple(t.shape)}")
    b, s, n_h, d = value.shape
    _, l_q, _, n_l, n_p, _ = sampling_locations.shape
    if spatial_shapes.shape != (n_l, 2):
        raise ValueError(f"spatial_shapes must be (L, 2) = ({n_l}, 2) for L={n_l} "
                         f"levels in sampling_locations, "
                         f"got shape {tuple(spatial_shapes.shape)}")
    if level_start_index.shape != (n_l,):
        raise ValueError(f"level_start_index must be (L,) = ({n_l},), "
                         f"got shape {tuple(level_start_index.shape)}")
    if sampling_locations.shape != (b, l_q, n_h, n_l, n_p, 2):
        raise ValueError(f"sampling_locations must be (B, L_q, H, L, P, 2) with B={b}, "
                         f"H={n_h}, got shape {tuple(sampling_locations.shape)}")
    if attention_weights.shape != (b, l_q, n_h, n_l, n_p):
        raise ValueError(f"attention_weights must be (B, L_q, H, L, P) = "
                         f"{(b, l_q, n_h, n_l, n_p)}, "
                         f"got shape {tuple(attention_weights.shape)}")
    if d < 1 or l_q < 1 or n_l < 1 or n_p < 1 or b < 1 or n_h < 1:
        raise ValueError(f"value (B, S, H, D_h) and sampling_locations "
                         f"(B, L_q, H, L, P, 2) need every size >= 1, "
                         f"got value {tuple(value.shape)}, "
                         f"sampling_locations {tuple(sampling_locations.shape)}")
    for name, t in (("spatial_shapes", spatial_shapes),
                    ("level_start_index", level_start_index),
                    ("sampling_locations", sampling_locations),
                    ("attention_weights", attention_weights)):
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
        raise ValueError(f"spatial_shapes {shapes.tolist()} cover "
                         f"{int(areas.sum())} positions but value has S={s}")
    starts = torch.cat([areas.new_zeros(1), areas.cumsum(0)[:-1]])
    if not torch.equal(level_start_index.detach().cpu().to(torch.int64), starts):
        raise ValueError(f"level_start_index {level_start_index.tolist()} does not "
                         f"match spatial_shapes (expected {starts.tolist()})")
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
        block_q, num_warps = msda_config("fwd", b * l_q * n_h, d,
                                       _capability(value.device),
                                       value.dtype in (torch.float32, torch.float64))
        block_q = _interpret_rows(block_q, l_q, value.device)
        grid = (triton.cdiv(l_q, block_q), b * n_h)
        _msda_fwd[grid](value, shapes, starts, loc, attn, out,
                        *value.stride(), *out.stride(), l_q, n_h, d,
                        N_LEVELS=n_l, N_POINTS=n_p, FP64=fp64, BLOCK_Q=block_q,
                        BLOCK_D=_msda_block_d(d, _capability(value.device)),
                        num_warps=num_warps, num_stages=NUM_STAGES)
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
        block_q, num_warps = msda_config("bwd", b * l_q * n_h, d,
                                       _capability(value.device),
                                       value.dtype in (torch.float32, torch.float64))
        block_q = _interpret_rows(block_q, l_q, value.device)
        bd = _msda_block_d(d, _capability(value.device))
        grid = (triton.cdiv(l_q, block_q), b * n_h)
        _msda_bwd[grid](value, shapes, starts, loc, attn, go, d_value, d_loc, d_attn,
                        *value.stride(), *go.stride(), l_q, s, n_h, d,
                        N_LEVELS=n_l, N_POINTS=n_p, FP64=ctx.fp64, BLOCK_Q=block_q,
                        BLOCK_D=bd, D_BLOCKS=triton.cdiv(d, bd), num_warps=num_warps,
                        num_stages=NUM_STAGES)
        return (d_value.to(value.dtype), None, None, d_loc.to(loc.dtype),
                d_attn.to(attn.dtype))


def _interpret_rows(block_q: int, l_q: int, device) -> int:
    """Under the interpreter, no wider query tile than the queries need (at least 16).
    """
    if _capability(device) is None:
        return min(block_q, max(16, triton.next_power_of_2(l_q)))
    return block_q


def _msda_block_d(head_dim: int, capability: tuple[int, int] | None = None) -> int:
    """Channels per block of the MSDA kernels: the padded head dim, at most 128 on a GPU
    (the kernels loop over channel blocks for larger head dims)."""
    top = MSDA_INTERPRET_MAX_BLOCK_D if capability is None else MSDA_MAX_BLOCK_D
    return max(16, min(_block_d(head_dim), top))


def ms_deform_attn(value: torch.Tensor, spatial_shapes: torch.Tensor,
                   level_start_index: torch.Tensor, sampling_locations: torch.Tensor,
                   attention_weights: torch.Tensor, im2col_step: int | None = None
                   ) -> torch.Tensor:
    """Multi-scale deformable attention (Deformable DETR's op), forward and backward.

    value: (B, S, H, D_h); spatial_shapes: (L, 2) int64 (H_l, W_l); level_start_index:
    (L,); sampling_locations: (B, L_q, H, L, P, 2) (x, y) in [0, 1]; attention_weights:
    (B, L_q, H, L, P). Returns (B, L_q, H * D_h). Differentiable in value,
    sampling_locations and attention_weights. float16/bfloat16/float32/float64, any D_h.
    ``im2col_step`` (the CUDA op's batching knob) is accepted for drop-in use and
    ignored: this kernel needs no im2col buffer.
    """
    if im2col_step is not None and (isinstance(im2col_step, bool)
                                    or not isinstance(im2col_step, int)
                                    or im2col_step < 1):
        raise TypeError(f"im2col_step must be a positive int or None, "
                        f"got {im2col_step!r}")
    shapes, starts = _validate_msda(value, spatial_shapes, level_start_index,
                                    sampling_locations, attention_weights)
    return _MSDeformAttn.apply(value, shapes, starts, sampling_locations,
                               attention_weights)


class MSDeformAttnFunction:
    """Drop-in for Deformable DETR's ``MSDeformAttnFunction``:
    ``MSDeformAttnFunction.apply(value, spatial_shapes, level_start_index,
    sampling_locations, attention_weights, im2col_step)``."""

    @staticmethod
    def apply(value, spatial_shapes, level_start_index, sampling_locations,
              attention_weights, im2col_step=None):
        return ms_deform_attn(value, spatial_shapes, level_start_index,
                              sampling_locations, attention_weights, im2col_step)


def ms_deform_attn_reference(value, spatial_shapes, level_start_index,
                             sampling_locations, attention_weights) -> torch.Tensor:
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
        samples.append(F.grid_sample(v, g, mode="bilinear", padding_mode="zeros",
                                     align_corners=False))  # (B*H, D, L_q, P)
    w = attention_weights.transpose(1, 2).reshape(b * n_h, 1, l_q, n_l * n_p)
    out = (torch.stack(samples, dim=-2).flatten(-2) * w).sum(-1).view(b, n_h * d, l_q)
    return out.transpose(1, 2).contiguous()  # (B, L_q, H*D_h)


# --------------------------------------------------------------------------------------
# Fused DAT attention: FlashAttention-2 over keys/values gathered by bilinear sampling
# --------------------------------------------------------------------------------------


@triton.jit
def _pixel(x, size, ALIGN_CORNERS: tl.constexpr):
    """Normalised coordinate in [-1, 1] -> pixel coordinate (grid_sample's convention).
    """
    if ALIGN_CORNERS:
        return (x + 1.0) * 0.5 * (size - 1)
    else:
        return ((x + 1.0) * size - 1.0) * 0.5


@triton.jit
def _gather_samples(base, Pts, offs_n, N_s, stride_pn, stride_pc, H_f, W_f,
                    stride_my, stride_mx, stride_md, offs_d, mask_d,
                    ALIGN_CORNERS: tl.constexpr):
    """Bilinear samples of one map at a block of points: (BLOCK_N, BLOCK_D) fp32."""
    mask_n = offs_n < N_s
    x = tl.load(Pts + offs_n * stride_pn, mask=mask_n, other=0.0).to(tl.float32)
    y = tl.load(Pts + offs_n * stride_pn + stride_pc, mask=mask_n,
                other=0.0).to(tl.float32)
    x0, y0, lx, ly = _bilinear_setup(_pixel(x, W_f, ALIGN_CORNERS),
                                     _pixel(y, H_f, ALIGN_CORNERS))
    hx = 1.0 - lx
    hy = 1.0 - ly
    t = (hy * hx)[:, None] * _corner_rows(base, x0, y0, W_f, H_f, stride_my,
                                          stride_mx, offs_d, stride_md, mask_n, mask_d)
    t += (hy * lx)[:, None] * _corner_rows(base, x0 + 1, y0, W_f, H_f, stride_my,
                                           stride_mx, offs_d, stride_md, mask_n, mask_d)
    t += (ly * hx)[:, None] * _corner_rows(base, x0, y0 + 1, W_f, H_f, stride_my,
                                           stride_mx, offs_d, stride_md, mask_n, mask_d)
    t += (ly * lx)[:, None] * _corner_rows(base, x0 + 1, y0 + 1, W_f, H_f, stride_my,
                                           stride_mx, offs_d, stride_md, mask_n, mask_d)
    return t


@triton.jit
def _dat_fwd(Q, K, V, Pts, Out, LSE, qk_scale,
             stride_qb, stride_qh, stride_qn, stride_qd,
             stride_kb, stride_kh, stride_ky, stride_kx, stride_kd,
             stride_vb, stride_vh, stride_vy, stride_vx, stride_vd,
             stride_pb, stride_pg, stride_pn, stride_pc,
             stride_ob, stride_oh, stride_on, stride_od,
             N_q, N_s, H_f, W_f, N_HEADS, HEADS_PER_GROUP, HEAD_DIM,
             ALIGN_CORNERS: tl.constexpr, DOT_FP32: tl.constexpr,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1).to(tl.int64)
    b = pid_bh // N_HEADS
    h = pid_bh % N_HEADS
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    mask_m = offs_m < N_q
    mask_d = offs_d < HEAD_DIM
    q = tl.load(Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qn
                + offs_d[None, :] * stride_qd, mask=mask_m[:, None] & mask_d[None, :],
                other=0.0)  # q stays in SRAM for the whole inner loop
    k_base = K + b * stride_kb + h * stride_kh
    v_base = V + b * stride_vb + h * stride_vh
    p_base = Pts + b * stride_pb + (h // HEADS_PER_GROUP) * stride_pg
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    for start_n in range(0, N_s, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        # sampled keys and values: built in registers from four corner gathers each
        k = _gather_samples(k_base, p_base, offs_n, N_s, stride_pn, stride_pc, H_f, W_f,
                            stride_ky, stride_kx, stride_kd, offs_d, mask_d,
                            ALIGN_CORNERS)
        v = _gather_samples(v_base, p_base, offs_n, N_s, stride_pn, stride_pc, H_f, W_f,
                            stride_vy, stride_vx, stride_vd, offs_d, mask_d,
                            ALIGN_CORNERS)
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
            acc = acc * alpha[:, None] + tl.dot(p.to(Q.dtype.element_ty),
                                                v.to(Q.dtype.element_ty))
        m_i = m_new
    acc = acc / l_i[:, None]
    tl.store(Out + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_on
             + offs_d[None, :] * stride_od, acc.to(Out.dtype.element_ty),
             mask=mask_m[:, None] & mask_d[None, :])
    tl.store(LSE + pid_bh * N_q + offs_m, m_i + tl.log2(l_i), mask=mask_m)  # base 2


@triton.jit
def _dat_bwd_dkdv(Q, K, V, Pts, dO, LSE, Delta, dK, dV, dPts, qk_scale, sm_scale,
                  stride_qb, stride_qh, stride_qn, stride_qd,
                  stride_kb, stride_kh, stride_ky, stride_kx, stride_kd,
                  stride_vb, stride_vh, stride_vy, stride_vx, stride_vd,
                  stride_pb, stride_pg, stride_pn, stride_pc,
                  stride_gb, stride_gh, stride_gn, stride_gd,
                  N_q, N_s, H_f, W_f, N_HEADS, HEADS_PER_GROUP, HEAD_DIM,
                  ALIGN_CORNERS: tl.constexpr, DOT_FP32: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
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
    k = _gather_samples(k_base, p_base, offs_n, N_s, stride_pn, stride_pc, H_f, W_f,
                        stride_ky, stride_kx, stride_kd, offs_d, mask_d, ALIGN_CORNERS)
    v = _gather_samples(v_base, p_base, offs_n, N_s, stride_pn, stride_pc, H_f, W_f,
                        stride_vy, stride_vx, stride_vd, offs_d, mask_d, ALIGN_CORNERS)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    q_base = Q + b * stride_qb + h * stride_qh
    do_base = dO + b * stride_gb + h * stride_gh
    for start_m in range(0, N_q, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        mask_m = offs_m < N_q
        tile_mask = mask_m[:, None] & mask_d[None, :]
        q = tl.load(q_base + offs_m[:, None] * stride_qn + offs_d[None, :] * stride_qd,
                    mask=tile_mask, other=0.0)
        do = tl.load(do_base + offs_m[:, None] * stride_gn
                     + offs_d[None, :] * stride_gd,
                     mask=tile_mask, other=0.0)
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
    y = tl.load(p_base + offs_n * stride_pn + stride_pc, mask=mask_n,
                other=0.0).to(tl.float32)
    x0, y0, lx, ly = _bilinear_setup(_pixel(x, W_f, ALIGN_CORNERS),
                                     _pixel(y, H_f, ALIGN_CORNERS))
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
        _corner_scatter(dk_base, cx, cy, W_f, H_f, map_stride_y, HEAD_DIM, offs_d,
                        mask_n, mask_d, w[:, None] * dk)
        _corner_scatter(dv_base, cx, cy, W_f, H_f, map_stride_y, HEAD_DIM, offs_d,
                        mask_n, mask_d, w[:, None] * dv)
        kc = _corner_rows(k_base, cx, cy, W_f, H_f, stride_ky, stride_kx, offs_d,
                          stride_kd, mask_n, mask_d)
        vc = _corner_rows(v_base, cx, cy, W_f, H_f, stride_vy, stride_vx, offs_d,
                          stride_vd, mask_n, mask_d)
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
def _dat_bwd_dq(Q, K, V, Pts, dO, LSE, Delta, dQ, qk_scale, sm_scale,
                stride_qb, stride_qh, stride_qn, stride_qd,
                stride_dqb, stride_dqh, stride_dqn, stride_dqd,
                stride_kb, stride_kh, stride_ky, stride_kx, stride_kd,
                stride_vb, stride_vh, stride_vy, stride_vx, stride_vd,
                stride_pb, stride_pg, stride_pn, stride_pc,
                stride_gb, stride_gh, stride_gn, stride_gd,
                N_q, N_s, H_f, W_f, N_HEADS, HEADS_PER_GROUP, HEAD_DIM,
                ALIGN_CORNERS: tl.constexpr, DOT_FP32: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1).to(tl.int64)
    b = pid_bh // N_HEADS
    h = pid_bh % N_HEADS
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    mask_m = offs_m < N_q
    mask_d = offs_d < HEAD_DIM
    tile_mask = mask_m[:, None] & mask_d[None, :]
    q = tl.load(Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qn
                + offs_d[None, :] * stride_qd, mask=tile_mask, other=0.0)
    do = tl.load(dO + b * stride_gb + h * stride_gh + offs_m[:, None] * stride_gn
                 + offs_d[None, :] * stride_gd, mask=tile_mask, other=0.0)
    lse = tl.load(LSE + pid_bh * N_q + offs_m, mask=mask_m, other=0.0)
    delta = tl.load(Delta + pid_bh * N_q + offs_m, mask=mask_m, other=0.0)
    k_base = K + b * stride_kb + h * stride_kh
    v_base = V + b * stride_vb + h * stride_vh
    p_base = Pts + b * stride_pb + (h // HEADS_PER_GROUP) * stride_pg
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    for start_n in range(0, N_s, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k = _gather_samples(k_base, p_base, offs_n, N_s, stride_pn, stride_pc, H_f, W_f,
                            stride_ky, stride_kx, stride_kd, offs_d, mask_d,
                            ALIGN_CORNERS)
        v = _gather_samples(v_base, p_base, offs_n, N_s, stride_pn, stride_pc, H_f, W_f,
                            stride_vy, stride_vx, stride_vd, offs_d, mask_d,
                            ALIGN_CORNERS)
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
    tl.store(dQ + b * stride_dqb + h * stride_dqh + offs_m[:, None] * stride_dqn
             + offs_d[None, :] * stride_dqd, dq.to(dQ.dtype.element_ty), mask=tile_mask)


def dot_fp32(dtype: torch.dtype, capability: tuple[int, int] | None) -> bool:
    """fp32 dot products: fp32 inputs, the interpreter (``capability`` None: bf16 dots
    are wrong there), and bf16 below sm_80 (no bf16 tensor cores)."""
    if dtype == torch.float32 or capability is None:
        return True
    return dtype == torch.bfloat16 and capability[0] < 8


def dat_config(kernel: str, n_s: int, head_dim: int, capability: tuple[int, int] | None,
               fp32_dots: bool = False) -> tuple[int, int, int]:
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
        raise ValueError(f"k_map must be (B, H, H_f, W_f, d) with B={b}, H={n_h}, "
                         f"d={d}, got shape {tuple(k_map.shape)}")
    if v_map.shape != k_map.shape:
        raise ValueError(f"v_map must have k_map's shape {tuple(k_map.shape)}, "
                         f"got shape {tuple(v_map.shape)}")
    if v_map.dtype != k_map.dtype or q.dtype != k_map.dtype:
        raise TypeError(f"q, k_map and v_map must share a dtype, got {q.dtype}, "
                        f"{k_map.dtype}, {v_map.dtype}")
    g = points.shape[1]
    if points.shape[0] != b or points.shape[-1] != 2 or g < 1 or n_h % g:
        raise ValueError(f"points must be (B, G, N_s, 2) with B={b} and G dividing "
                         f"H={n_h}, got shape {tuple(points.shape)}")
    if points.shape[2] < 1 or n_q < 1 or min(k_map.shape[2:4]) < 1:
        raise ValueError(f"need N_q >= 1, N_s >= 1 and a non-empty map: "
                         f"q {tuple(q.shape)}, k_map {tuple(k_map.shape)}, "
                         f"points {tuple(points.shape)}")
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
    return (*q.stride(), *k_map.stride(), *v_map.stride(), *points.stride()), \
        (n_q, n_s, h_f, w_f, n_h, n_h // g, d)


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
        _dat_fwd[grid](q, k_map, v_map, points, out, lse, sm_scale * LOG2E,
                       *strides, *out.stride(), *sizes,
                       ALIGN_CORNERS=align_corners, DOT_FP32=use_fp32,
                       BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=_block_d(d),
                       num_warps=num_warps, num_stages=NUM_STAGES)
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
        common = dict(ALIGN_CORNERS=ctx.align_corners, DOT_FP32=ctx.dot_fp32,
                      BLOCK_D=_block_d(d))
        qk_scale = ctx.sm_scale * LOG2E
        cap = _capability(q.device)
        block_m, block_n, num_warps = dat_config("dkdv", n_s, d, cap, ctx.dot_fp32)
        _dat_bwd_dkdv[(triton.cdiv(n_s, block_n), b * n_h)](
            q, k_map, v_map, points, do, lse, delta, dk, dv, dpts, qk_scale,
            ctx.sm_scale, *strides, *do.stride(), *sizes,
            BLOCK_M=block_m, BLOCK_N=block_n,
            num_warps=num_warps, num_stages=NUM_STAGES, **common)
        block_m, block_n, num_warps = dat_config("dq", n_s, d, cap, ctx.dot_fp32)
        _dat_bwd_dq[(triton.cdiv(n_q, block_m), b * n_h)](
            q, k_map, v_map, points, do, lse, delta, dq, qk_scale, ctx.sm_scale,
            *strides[:4], *dq.stride(), *strides[4:], *do.stride(), *sizes,
            BLOCK_M=block_m, BLOCK_N=block_n,
            num_warps=num_warps, num_stages=NUM_STAGES, **common)
        # (B, G, N_s, 2): the heads of a group summed
        dpts = dpts.view(b, g, n_h // g, n_s, 2).sum(2)
        return (dq, dk.to(k_map.dtype), dv.to(v_map.dtype), dpts.to(points.dtype), None,
                None)


def deformable_attention(q: torch.Tensor, k_map: torch.Tensor, v_map: torch.Tensor,
                         points: torch.Tensor, sm_scale: float | None = None,
                         align_corners: bool = True) -> torch.Tensor:
    """Attention over keys and values bilinearly sampled from maps, fused (DAT).

    q: (B, H, N_q, d); k_map, v_map: (B, H, H_f, W_f, d); points: (B, G, N_s, 2) as
    (x, y) in [-1, 1] (grid_sample's convention, ``align_corners`` as there), shared by
    the H / G heads of each group. Returns (B, H, N_q, d). Differentiable in q, k_map,
    v_map and points.
    """
    scale = _validate_dat(q, k_map, v_map, points, sm_scale)
    if not isinstance(align_corners, bool):
        raise TypeError(f"align_corners must be a bool, "
                        f"got {type(align_corners).__name__} {align_corners!r}")
    return _DeformableAttention.apply(q, k_map, v_map, points, scale, align_corners)


def sample_maps(k_map: torch.Tensor, v_map: torch.Tensor, points: torch.Tensor,
                align_corners: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """grid_sample both maps at each group's points: k̃, ṽ of shape (B, H, N_s, d)."""
    b, n_h, h_f, w_f, d = k_map.shape
    g, n_s = points.shape[1:3]
    grid = points.repeat_interleave(n_h // g, dim=1).reshape(b * n_h, 1, n_s, 2)
    out = []
    for m in (k_map, v_map):
        m2 = m.reshape(b * n_h, h_f, w_f, d).permute(0, 3, 1, 2)  # (B*H, d, H_f, W_f)
        s = F.grid_sample(m2, grid.to(m.dtype), mode="bilinear", padding_mode="zeros",
                          align_corners=align_corners)  # (B*H, d, 1, N_s)
        out.append(s[:, :, 0].transpose(1, 2).reshape(b, n_h, n_s, d))  # (B, H, N_s, d)
    return out[0], out[1]


def deformable_attention_reference(q, k_map, v_map, points, sm_scale=None,
                                   align_corners=True) -> torch.Tensor:
    """Naive PyTorch: grid_sample the maps, then materialise the attention matrix."""
    k, v = sample_maps(k_map, v_map, points, align_corners)
    scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else sm_scale
    p = torch.softmax((q @ k.transpose(-1, -2)) * scale, dim=-1)  # (B, H, N_q, N_s)
    return p @ v
