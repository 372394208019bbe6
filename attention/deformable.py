"""Deformable attention in NumPy: reference grids, the offset network, bilinear sampling and
its gradient, DAT's attention over sampled keys and values, and multi-scale deformable
attention (MSDA, Deformable DETR).

Conventions (the same as ``torch.nn.functional.grid_sample`` and the kernels):

* A feature map is channels-last, ``(B, H_f, W_f, C)``; a point is ``(x, y)`` with x along
  the width and y along the height, normalised to [-1, 1].
* ``align_corners=True``: -1 and +1 are the *centres* of the corner pixels,
  ``px = (x + 1) / 2 * (W_f - 1)``. ``align_corners=False``: -1 and +1 are the outer *edges*
  of the corner pixels, ``px = ((x + 1) * W_f - 1) / 2``.
* Zero padding: a bilinear corner outside the map contributes 0, so a point far outside
  samples 0 and has zero gradient.
* A NaN (or infinite) coordinate has no place on the map: its sample is NaN, as in the
  kernels, never an index error or a silent 0.

DAT (Xia et al. 2022) here follows the paper's six steps; it omits DAT's relative position
bias and the LayerNorm inside the offset network. ``deformable_attention`` is the NumPy twin
of ``kernels.deformable.deformable_attention`` (project first, then sample: exactly DAT
when there is one offset group). ``ms_deform_attn`` is the twin of
``kernels.deformable.ms_deform_attn`` (Deformable DETR's op, ``align_corners=False``).
"""

from __future__ import annotations

import math

import numpy as np

from . import memory
from .core import (
    as_real_array,
    check_bool,
    check_int,
    merge_heads,
    scaled_dot_product_attention,
    softmax,
    split_heads,
)

#: Bilinear interpolation reads the four neighbouring pixels of every sample.
CORNERS = 4


# ------------------------------------------------------------------------------------------
# Coordinates
# ------------------------------------------------------------------------------------------


def reference_grid(h_r: int, w_r: int) -> np.ndarray:
    """Centres of an ``h_r x w_r`` grid of cells covering [-1, 1]^2, as (x, y), row-major.

    Returns ``(h_r * w_r, 2)``. With ``align_corners=False`` on a map of ``r*h_r x r*w_r``
    pixels, cell (i, j) is the centre of the r x r block of pixels it stands for.
    """
    h_r, w_r = check_int("h_r", h_r, 1), check_int("w_r", w_r, 1)
    ys = (2.0 * np.arange(h_r) + 1.0) / h_r - 1.0
    xs = (2.0 * np.arange(w_r) + 1.0) / w_r - 1.0
    gy, gx = np.meshgrid(ys, xs, indexing="ij")  # (h_r, w_r) each
    return np.stack([gx, gy], axis=-1).reshape(h_r * w_r, 2)  # (N_s, 2)


def to_pixels(points: np.ndarray, height: int, width: int,
              align_corners: bool = False) -> np.ndarray:
    """Normalised (x, y) in [-1, 1] -> pixel coordinates (column, row), floats."""
    p = _as_points(points)
    size = np.array([check_int("width", width, 1), check_int("height", height, 1)],
                    dtype=np.float64)
    if check_bool("align_corners", align_corners):
        return (p + 1.0) / 2.0 * (size - 1.0)
    return ((p + 1.0) * size - 1.0) / 2.0


def to_normalized(pixels: np.ndarray, height: int, width: int,
                  align_corners: bool = False) -> np.ndarray:
    """Pixel coordinates (column, row) -> normalised (x, y); the inverse of ``to_pixels``."""
    p = _as_points(pixels, "pixels")
    size = np.array([check_int("width", width, 1), check_int("height", height, 1)],
                    dtype=np.float64)
    if check_bool("align_corners", align_corners):
        return 2.0 * p / (size - 1.0) - 1.0
    return (2.0 * p + 1.0) / size - 1.0


def pixel_scale(height: int, width: int, align_corners: bool = False) -> np.ndarray:
    """d(pixel)/d(normalised) for (x, y): the chain-rule factor of every point gradient."""
    size = np.array([check_int("width", width, 1), check_int("height", height, 1)],
                    dtype=np.float64)
    return (size - 1.0) / 2.0 if check_bool("align_corners", align_corners) else size / 2.0


def _as_points(points, name="points"):
    p = as_real_array(name, points, 1).astype(np.float64)
    if p.shape[-1] != 2:
        raise ValueError(f"{name} must be (..., 2) as (x, y), got shape {p.shape}")
    return p


# ------------------------------------------------------------------------------------------
# Bilinear interpolation, from scratch, and its gradient
# ------------------------------------------------------------------------------------------


def bilinear_corners(points: np.ndarray, height: int, width: int, align_corners: bool = False):
    """The four corners a bilinear sample reads, their weights and the weights' derivatives.

    points: (..., 2) normalised (x, y). Returns a dict of arrays with a trailing corner axis
    of 4, ordered (y0, x0), (y0, x1), (y1, x0), (y1, x1):

    * ``index``: flat pixel index ``row * width + col`` (clipped into the map; use ``valid``),
    * ``valid``: the corner lies inside the map (zero padding: invalid corners read 0),
    * ``weight``: bilinear weight, 0 for invalid corners,
    * ``dweight_dx`` / ``dweight_dy``: derivative of ``weight`` w.r.t. the *normalised* x / y.
    """
    px = to_pixels(points, height, width, align_corners)  # (..., 2)
    bad = ~np.isfinite(px).all(axis=-1)  # a NaN/inf point: NaN weights, no index
    px = np.where(bad[..., None], 0.0, px)
    x, y = px[..., 0], px[..., 1]
    x0, y0 = np.floor(x), np.floor(y)
    lx, ly = x - x0, y - y0  # fractional parts: weight of the right / lower neighbour
    hx, hy = 1.0 - lx, 1.0 - ly
    cols = np.stack([x0, x0 + 1, x0, x0 + 1], axis=-1)  # (..., 4)
    rows = np.stack([y0, y0, y0 + 1, y0 + 1], axis=-1)  # (..., 4)
    valid = (cols >= 0) & (cols <= width - 1) & (rows >= 0) & (rows <= height - 1)
    weight = np.stack([hy * hx, hy * lx, ly * hx, ly * lx], axis=-1) * valid
    sx, sy = pixel_scale(height, width, align_corners)
    dwdx = np.stack([-hy, hy, -ly, ly], axis=-1) * valid * sx
    dwdy = np.stack([-hx, -lx, hx, lx], axis=-1) * valid * sy
    index = (np.clip(rows, 0, height - 1) * width + np.clip(cols, 0, width - 1)).astype(np.int64)
    nan4 = bad[..., None]
    weight = np.where(nan4, np.nan, weight)
    dwdx, dwdy = np.where(nan4, np.nan, dwdx), np.where(nan4, np.nan, dwdy)
    return {"index": index, "valid": valid, "weight": weight,
            "dweight_dx": dwdx, "dweight_dy": dwdy}


def _check_map_points(feat, points):
    feat, points = as_real_array("feat", feat), as_real_array("points", points)
    if feat.ndim != 4:
        raise ValueError(f"feat must be (B, H_f, W_f, C), got shape {feat.shape}")
    if points.ndim != 3 or points.shape[-1] != 2 or points.shape[0] != feat.shape[0]:
        raise ValueError(f"points must be (B, N, 2) with B={feat.shape[0]}, "
                         f"got shape {points.shape}")
    if min(feat.shape[1:3]) < 1:
        raise ValueError(f"feat must be a non-empty map (B, H_f >= 1, W_f >= 1, C), "
                         f"got shape {feat.shape}")
    return feat, points


def bilinear_sample(feat: np.ndarray, points: np.ndarray, align_corners: bool = False):
    """Sample a channels-last map at real-valued points, with zero padding.

    feat: (B, H_f, W_f, C); points: (B, N, 2) normalised (x, y). Returns (B, N, C).
    Equal to ``grid_sample(feat.permute(0, 3, 1, 2), points[:, None], "bilinear", "zeros",
    align_corners)`` up to a transpose.
    """
    feat, points = _check_map_points(feat, points)
    b, h, w, c = feat.shape
    cor = bilinear_corners(points, h, w, align_corners)  # each (B, N, 4)
    flat = feat.reshape(b, h * w, c)  # (B, H_f*W_f, C)
    gathered = np.take_along_axis(flat[:, None], cor["index"][..., None], axis=2)  # (B,N,4,C)
    return np.einsum("bnk,bnkc->bnc", cor["weight"], gathered)  # (B, N, C)


def bilinear_sample_backward(feat: np.ndarray, points: np.ndarray, grad_out: np.ndarray,
                             align_corners: bool = False):
    """Gradients of ``sum(grad_out * bilinear_sample(feat, points))``.

    Returns ``(grad_feat (B, H_f, W_f, C), grad_points (B, N, 2))``. The value gradient
    scatters each output gradient back to its four corners with the bilinear weights;
    the point gradient is sum_corners d(weight)/d(point) * <feat[corner], grad_out>.
    """
    feat, points = _check_map_points(feat, points)
    grad_out = as_real_array("grad_out", grad_out)
    b, h, w, c = feat.shape
    if grad_out.shape != (b, points.shape[1], c):
        raise ValueError(f"grad_out must be (B, N, C) = {(b, points.shape[1], c)}, "
                         f"got shape {grad_out.shape}")
    cor = bilinear_corners(points, h, w, align_corners)  # (B, N, 4)
    flat = feat.reshape(b, h * w, c)  # (B, H_f*W_f, C)
    gathered = np.take_along_axis(flat[:, None], cor["index"][..., None], axis=2)  # (B,N,4,C)
    dot = np.einsum("bnkc,bnc->bnk", gathered, grad_out)  # <feat[corner], grad_out>
    grad_points = np.stack([(cor["dweight_dx"] * dot).sum(-1),
                            (cor["dweight_dy"] * dot).sum(-1)], axis=-1)  # (B, N, 2)
    grad_flat = np.zeros_like(flat, dtype=np.result_type(feat, grad_out))
    contrib = cor["weight"][..., None] * grad_out[:, :, None, :]  # (B, N, 4, C)
    for bi in range(b):
        np.add.at(grad_flat[bi], cor["index"][bi].reshape(-1), contrib[bi].reshape(-1, c))
    return grad_flat.reshape(b, h, w, c), grad_points


# ------------------------------------------------------------------------------------------
# The offset network: depthwise conv (stride r) -> GELU -> 1x1 conv to 2 -> tanh * range
# ------------------------------------------------------------------------------------------


def depthwise_conv2d(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None = None,
                     stride: int = 1, padding: int = 0) -> np.ndarray:
    """Depthwise 2-D convolution (cross-correlation, like torch): one k x k filter per channel.

    x: (B, C, H, W); weight: (C, k, k); bias: (C,). Returns (B, C, H_o, W_o) with
    H_o = (H + 2*padding - k) // stride + 1.
    """
    x, weight = as_real_array("x", x), as_real_array("weight", weight)
    if x.ndim != 4:
        raise ValueError(f"x must be (B, C, H, W), got shape {x.shape}")
    if weight.ndim != 3:
        raise ValueError(f"weight must be (C, k, k), got shape {weight.shape}")
    stride, padding = check_int("stride", stride, 1), check_int("padding", padding, 0)
    b, c, h, w = x.shape
    k = weight.shape[-1]
    if weight.shape != (c, k, k):
        raise ValueError(f"weight must be (C, k, k) = ({c}, {k}, {k}), got {weight.shape}")
    xp = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    h_o = (h + 2 * padding - k) // stride + 1
    w_o = (w + 2 * padding - k) // stride + 1
    out = np.zeros((b, c, h_o, w_o), dtype=np.result_type(x, weight))
    for i in range(k):  # one shifted, strided view of the input per filter tap
        for j in range(k):
            patch = xp[:, :, i:i + stride * h_o:stride, j:j + stride * w_o:stride]
            out += weight[None, :, i, j, None, None] * patch  # (B, C, H_o, W_o)
    if bias is not None:
        out += bias[None, :, None, None]
    return out


_erf = np.vectorize(math.erf, otypes=[np.float64])


def gelu(x: np.ndarray) -> np.ndarray:
    """GELU(x) = x * Phi(x), with the exact Gaussian CDF (torch's default)."""
    return 0.5 * x * (1.0 + _erf(np.asarray(x, dtype=np.float64) / math.sqrt(2.0)))


def init_offset_params(channels: int, kernel_size: int, rng: np.random.Generator,
                       scale: float = 1.0) -> dict:
    """Weights of the offset network for ``channels`` channels per offset group."""
    fan = kernel_size * kernel_size
    return {
        "w_dw": rng.normal(0, scale / math.sqrt(fan), (channels, kernel_size, kernel_size)),
        "b_dw": np.zeros(channels),
        "w_pw": rng.normal(0, scale / math.sqrt(channels), (2, channels)),
    }


def offset_network(q_map: np.ndarray, params: dict, stride: int,
                   offset_range: float) -> np.ndarray:
    """Predict one offset per reference point from the queries of one offset group.

    q_map: (B', C_g, H, W) queries of a group, channels first. A depthwise k x k conv with
    stride r (padding k // 2) pools each r x r neighbourhood, GELU, a 1x1 conv to 2 channels
    (dx, dy) and ``tanh * offset_range`` bound the offsets (in normalised units).
    Returns (B', H_r, W_r, 2) with H_r = ceil(H / r).
    """
    k = params["w_dw"].shape[-1]
    hid = gelu(depthwise_conv2d(q_map, params["w_dw"], params["b_dw"], stride, k // 2))
    raw = np.einsum("oc,bchw->bhwo", params["w_pw"], hid)  # (B', H_r, W_r, 2)
    return np.tanh(raw) * offset_range


# ------------------------------------------------------------------------------------------
# DAT: deformable attention over sampled keys and values
# ------------------------------------------------------------------------------------------


def init_dat_params(d_model: int, n_groups: int, kernel_size: int,
                    rng: np.random.Generator) -> dict:
    """Projections W_q, W_k, W_v, W_o (d_model x d_model) and the shared offset network."""
    s = 1.0 / math.sqrt(d_model)
    p = {n: rng.normal(0, s, (d_model, d_model)) for n in ("w_q", "w_k", "w_v", "w_o")}
    p["offset"] = init_offset_params(d_model // n_groups, kernel_size, rng)
    return p


def dat_attention(x: np.ndarray, params: dict, n_heads: int, n_groups: int, stride: int,
                  offset_range: float, align_corners: bool = False, return_all: bool = False):
    """DAT's deformable multi-head attention on a feature map x: (B, H, W, C).

    1. q = x W_q for every position.
    2. reference points: the centres of an H_r x W_r grid (H_r = ceil(H / r) for the odd
       kernel sizes DAT uses).
    3. offsets from the queries of each group: Δp = offset_network(q_g).
    4. deformed points p + Δp.
    5. sample x at them (bilinear, per group of C / G channels), then k̃ = x̃ W_k, ṽ = x̃ W_v.
    6. multi-head attention of every query over the N_s = H_r W_r sampled keys, then W_o.

    Returns the output (B, H, W, C), or with ``return_all`` a dict of every intermediate.
    """
    x = as_real_array("x", x)
    if x.ndim != 4:
        raise ValueError(f"x must be a feature map (B, H, W, C), got shape {x.shape}")
    n_heads, n_groups = check_int("n_heads", n_heads, 1), check_int("n_groups", n_groups, 1)
    stride = check_int("stride", stride, 1)
    align_corners = check_bool("align_corners", align_corners)
    return_all = check_bool("return_all", return_all)
    b, h, w, c = x.shape
    g, n_h = n_groups, n_heads
    if c % n_h or c % g or n_h % g:
        raise ValueError(f"C={c} must divide by n_heads={n_h} and n_groups={g}, "
                         f"and n_heads by n_groups")
    c_g = c // g
    q = x @ params["w_q"]  # (B, H, W, C)
    q_g = q.reshape(b, h, w, g, c_g).transpose(0, 3, 4, 1, 2).reshape(b * g, c_g, h, w)
    offsets = offset_network(q_g, params["offset"], stride, offset_range)  # (B*G, H_r, W_r, 2)
    h_r, w_r = offsets.shape[1:3]
    ref = reference_grid(h_r, w_r)  # (N_s, 2)
    points = ref[None] + offsets.reshape(b * g, h_r * w_r, 2)  # (B*G, N_s, 2)
    x_g = x.reshape(b, h, w, g, c_g).transpose(0, 3, 1, 2, 4).reshape(b * g, h, w, c_g)
    x_s = bilinear_sample(x_g, points, align_corners)  # (B*G, N_s, C_g)
    n_s = h_r * w_r
    x_s = x_s.reshape(b, g, n_s, c_g).transpose(0, 2, 1, 3).reshape(b, n_s, c)  # (B, N_s, C)
    k, v = x_s @ params["w_k"], x_s @ params["w_v"]  # (B, N_s, C)
    qh = split_heads(q.reshape(b, h * w, c), n_h)  # (B, n_heads, H*W, d)
    kh, vh = split_heads(k, n_h), split_heads(v, n_h)  # (B, n_heads, N_s, d)
    o, p = scaled_dot_product_attention(qh, kh, vh, return_weights=True)
    out = (merge_heads(o) @ params["w_o"]).reshape(b, h, w, c)  # (B, H, W, C)
    if not return_all:
        return out
    return {"q": q, "offsets": offsets, "reference": ref, "points": points.reshape(b, g, n_s, 2),
            "x_sampled": x_s, "k": k, "v": v, "weights": p, "o": o, "out": out}


def deformable_attention(q: np.ndarray, k_map: np.ndarray, v_map: np.ndarray,
                         points: np.ndarray, scale: float | None = None,
                         align_corners: bool = True, return_weights: bool = False):
    """Attention of q over keys and values bilinearly sampled from projected maps.

    q: (B, H, N_q, d); k_map, v_map: (B, H, H_f, W_f, d); points: (B, G, N_s, 2) in [-1, 1],
    shared by the H / G heads of each group. The NumPy twin of the fused kernel.
    """
    q, k_map, v_map = (as_real_array(n, t) for n, t in (("q", q), ("k_map", k_map),
                                                         ("v_map", v_map)))
    points = as_real_array("points", points)
    align_corners = check_bool("align_corners", align_corners)
    if q.ndim != 4:
        raise ValueError(f"q must be (B, H, N_q, d), got shape {q.shape}")
    b, n_h, n_q, d = q.shape
    if k_map.ndim != 5 or k_map.shape[:2] != (b, n_h) or k_map.shape[-1] != d:
        raise ValueError(f"k_map must be (B, H, H_f, W_f, d) with B={b}, H={n_h}, d={d}, "
                         f"got shape {k_map.shape}")
    if v_map.ndim != 5 or v_map.shape[:4] != k_map.shape[:4]:
        raise ValueError(f"v_map must be (B, H, H_f, W_f, d_v) = {k_map.shape[:4]} + (d_v,), "
                         f"got shape {v_map.shape}")
    if points.ndim != 4 or points.shape[0] != b or points.shape[-1] != 2 \
            or points.shape[1] < 1 or n_h % points.shape[1]:
        raise ValueError(f"points must be (B, G, N_s, 2) with B={b} and G dividing H={n_h}, "
                         f"got shape {points.shape}")
    g, n_s = points.shape[1:3]
    h_f, w_f = k_map.shape[2:4]
    pts = np.repeat(points, n_h // g, axis=1).reshape(b * n_h, n_s, 2)  # (B*H, N_s, 2)
    k = bilinear_sample(k_map.reshape(b * n_h, h_f, w_f, d), pts, align_corners)
    v = bilinear_sample(v_map.reshape(b * n_h, h_f, w_f, -1), pts, align_corners)
    k = k.reshape(b, n_h, n_s, d)  # (B, H, N_s, d)
    v = v.reshape(b, n_h, n_s, -1)  # (B, H, N_s, d)
    return scaled_dot_product_attention(q, k, v, scale=scale, return_weights=return_weights)


# ------------------------------------------------------------------------------------------
# Multi-scale deformable attention (Deformable DETR)
# ------------------------------------------------------------------------------------------


def level_start_index(spatial_shapes) -> np.ndarray:
    """Offsets of each level in the flattened value: [0, H_0 W_0, H_0 W_0 + H_1 W_1, ...]."""
    areas = np.prod(np.asarray(spatial_shapes, dtype=np.int64), axis=1)
    return np.concatenate([[0], np.cumsum(areas)[:-1]]).astype(np.int64)


def ms_deform_attn(value: np.ndarray, spatial_shapes, level_start, sampling_locations,
                   attention_weights) -> np.ndarray:
    """Deformable DETR's core op: a weighted sum of bilinear samples over levels and points.

    value: (B, S, H, D) with S = sum_l H_l W_l; spatial_shapes (L, 2) as (H_l, W_l);
    level_start (L,); sampling_locations (B, L_q, H, L, P, 2) as (x, y) in [0, 1];
    attention_weights (B, L_q, H, L, P). Returns (B, L_q, H * D). Sampling is
    ``align_corners=False`` with zero padding on the grid 2 * loc - 1.

    The level tensors are checked as the kernel checks them: ``spatial_shapes`` must cover
    exactly the S positions of ``value`` and ``level_start`` must be their offsets.
    """
    value, shapes, starts, sampling_locations, attention_weights = _check_msda(
        value, spatial_shapes, level_start, sampling_locations, attention_weights)
    b, _, n_h, d = value.shape
    _, l_q, _, n_l, n_p, _ = sampling_locations.shape
    out = np.zeros((b, n_h, l_q, d), dtype=np.result_type(value, attention_weights))
    for lvl, (h_l, w_l) in enumerate(shapes):
        s0 = int(starts[lvl])
        v_l = value[:, s0:s0 + h_l * w_l].reshape(b, h_l, w_l, n_h, d)  # (B, H_l, W_l, H, D)
        v_l = v_l.transpose(0, 3, 1, 2, 4).reshape(b * n_h, h_l, w_l, d)  # (B*H, H_l, W_l, D)
        grid = 2.0 * sampling_locations[:, :, :, lvl] - 1.0  # (B, L_q, H, P, 2)
        grid = grid.transpose(0, 2, 1, 3, 4).reshape(b * n_h, l_q * n_p, 2)  # (B*H, L_q*P, 2)
        sampled = bilinear_sample(v_l, grid, align_corners=False)  # (B*H, L_q*P, D)
        sampled = sampled.reshape(b, n_h, l_q, n_p, d)  # (B, H, L_q, P, D)
        w = attention_weights[:, :, :, lvl].transpose(0, 2, 1, 3)  # (B, H, L_q, P)
        out += np.einsum("bhqp,bhqpd->bhqd", w, sampled)
    return out.transpose(0, 2, 1, 3).reshape(b, l_q, n_h * d)  # (B, L_q, H*D)


def _check_msda(value, spatial_shapes, level_start, sampling_locations, attention_weights):
    value = as_real_array("value", value)
    loc = as_real_array("sampling_locations", sampling_locations)
    attn = as_real_array("attention_weights", attention_weights)
    if value.ndim != 4:
        raise ValueError(f"value must be (B, S, H, D), got shape {value.shape}")
    b, s, n_h, d = value.shape
    if loc.ndim != 6 or loc.shape[0] != b or loc.shape[2] != n_h or loc.shape[-1] != 2:
        raise ValueError(f"sampling_locations must be (B, L_q, H, L, P, 2) with B={b}, "
                         f"H={n_h}, got shape {loc.shape}")
    if attn.shape != loc.shape[:-1]:
        raise ValueError(f"attention_weights must be (B, L_q, H, L, P) = {loc.shape[:-1]}, "
                         f"got shape {attn.shape}")
    n_l = loc.shape[3]
    shapes, starts = np.asarray(spatial_shapes), np.asarray(level_start)
    for name, t in (("spatial_shapes", shapes), ("level_start", starts)):
        if not np.issubdtype(t.dtype, np.integer):
            raise TypeError(f"{name} must hold integers, got dtype {t.dtype}")
    if shapes.shape != (n_l, 2):
        raise ValueError(f"spatial_shapes must be (L, 2) = ({n_l}, 2) for the L={n_l} levels "
                         f"of sampling_locations, got shape {shapes.shape}")
    if starts.shape != (n_l,):
        raise ValueError(f"level_start must be (L,) = ({n_l},), got shape {starts.shape}")
    shapes = shapes.astype(np.int64)
    if (shapes <= 0).any():
        raise ValueError(f"spatial_shapes must be positive, got {shapes.tolist()}")
    areas = shapes[:, 0] * shapes[:, 1]
    if int(areas.sum()) != s:
        raise ValueError(f"spatial_shapes {shapes.tolist()} cover {int(areas.sum())} positions "
                         f"but value has S={s}")
    expected = np.concatenate([[0], np.cumsum(areas)[:-1]])
    if not np.array_equal(starts.astype(np.int64), expected):
        raise ValueError(f"level_start {starts.tolist()} does not match spatial_shapes "
                         f"(expected {expected.tolist()})")
    return value, shapes, starts, loc, attn


def init_msda_params(d_model: int, n_heads: int, n_levels: int, n_points: int,
                     rng: np.random.Generator) -> dict:
    """Deformable DETR's initialisation: offsets start on square rings around the reference
    point (head h points in direction 2*pi*h/H, scaled so the larger coordinate is 1; point p
    sits p+1 times that, i.e. at max-norm distance p+1 pixels), weights uniform."""
    s = 1.0 / math.sqrt(d_model)
    theta = 2.0 * math.pi * np.arange(n_heads) / n_heads
    dirs = np.stack([np.cos(theta), np.sin(theta)], -1)  # (H, 2)
    dirs = dirs / np.abs(dirs).max(-1, keepdims=True)
    bias = dirs[:, None, None, :] * np.arange(1, n_points + 1)[None, None, :, None]  # (H,1,P,2)
    bias = np.broadcast_to(bias, (n_heads, n_levels, n_points, 2)).reshape(-1)
    return {
        "w_off": rng.normal(0, 0.01, (d_model, n_heads * n_levels * n_points * 2)),
        "b_off": bias.copy(),
        "w_attn": rng.normal(0, s, (d_model, n_heads * n_levels * n_points)),
        "b_attn": np.zeros(n_heads * n_levels * n_points),
        "w_v": rng.normal(0, s, (d_model, d_model)),
        "w_o": rng.normal(0, s, (d_model, d_model)),
    }


def msda_sampling(query: np.ndarray, reference_points: np.ndarray, params: dict,
                  spatial_shapes, n_heads: int, n_points: int):
    """Per-query sampling locations and attention weights, both linear in the query.

    query (B, L_q, C); reference_points (B, L_q, 2) as (x, y) in [0, 1]. Offsets are in
    pixels of each level: loc = ref + Δ / (W_l, H_l). The weights are a softmax over the
    L * P samples of each head. Returns locations (B, L_q, H, L, P, 2) and weights
    (B, L_q, H, L, P).
    """
    shapes = np.asarray(spatial_shapes, dtype=np.float64)
    n_l = shapes.shape[0]
    b, l_q, _ = query.shape
    off = (query @ params["w_off"] + params["b_off"])
    off = off.reshape(b, l_q, n_heads, n_l, n_points, 2)  # (B, L_q, H, L, P, 2)
    normalizer = shapes[:, ::-1]  # (L, 2) as (W_l, H_l)
    loc = reference_points[:, :, None, None, None, :] + off / normalizer[None, None, None, :,
                                                                         None, :]
    logits = (query @ params["w_attn"] + params["b_attn"]).reshape(b, l_q, n_heads,
                                                                    n_l * n_points)
    weights = softmax(logits, axis=-1).reshape(b, l_q, n_heads, n_l, n_points)
    return loc, weights


def msda_layer(query, reference_points, input_flatten, spatial_shapes, params: dict,
               n_heads: int, n_points: int, return_all: bool = False):
    """One multi-scale deformable attention layer: value projection, sampling, W_o.

    input_flatten: (B, S, C), the L levels' features flattened and concatenated.
    Returns (B, L_q, C) or, with ``return_all``, a dict with the locations and weights.
    """
    b, s, c = input_flatten.shape
    value = (input_flatten @ params["w_v"]).reshape(b, s, n_heads, c // n_heads)  # (B,S,H,D)
    loc, w = msda_sampling(query, reference_points, params, spatial_shapes, n_heads, n_points)
    core = ms_deform_attn(value, spatial_shapes, level_start_index(spatial_shapes), loc, w)
    out = core @ params["w_o"]  # (B, L_q, C)
    if return_all:
        return {"out": out, "locations": loc, "weights": w, "value": value}
    return out


def attention_cost(height: int, width: int, d_model: int, r: int = 8, n_levels: int = 4,
                   n_points: int = 4) -> dict:
    """Keys (or samples) per query and multiply-adds of the attention itself, per variant.

    Dense attends to all H*W positions, DAT to ceil(H/r)*ceil(W/r) sampled keys (each read
    as four corners), MSDA to L*P points (each four corners, no keys: weights come from a
    linear map of the query). Counts for H*W queries; projections excluded.
    """
    n = height * width
    n_s = -(-height // r) * -(-width // r)
    lp = n_levels * n_points
    return {
        "dense": {"keys": n, "macs": 2 * n * n * d_model},
        "dat": {"keys": n_s, "macs": 2 * n * n_s * d_model + 2 * CORNERS * n_s * d_model},
        "msda": {"keys": lp, "macs": n * lp * (CORNERS + 1) * d_model},
    }


# ------------------------------------------------------------------------------------------
# Memory traffic (per batch element and head; counts in elements, see attention.memory)
# ------------------------------------------------------------------------------------------


def _sim_dense_image(height: int, width: int, d: int, Br: int = 64, Bc: int = 64,
                     M: int | None = None, keep_trace: bool = True) -> memory.Traffic:
    """Fused (FlashAttention-style) dense attention of all H*W queries over all H*W keys."""
    n = height * width
    sim = memory.HBMSim(M, keep_trace)
    for i, br in enumerate(memory.blocks(n, Br)):
        sim.step = i
        sim.hold(br * d * 2, "the Q tile and the O accumulator")
        sim.load("Q", br * d, (i,))
        for j, bc in enumerate(memory.blocks(n, Bc)):
            sim.hold(2 * bc * d, "K and V tiles")
            sim.load("K", bc * d, (j,))
            sim.load("V", bc * d, (j,))
            sim.release(2 * bc * d)
        sim.store("O", br * d, (i,))
        sim.release(br * d * 2)
    return sim.result()


def _closed_dense_image(height: int, width: int, d: int, Br: int = 64, Bc: int = 64,
                        M: int | None = None, keep_trace: bool = True) -> memory.Traffic:
    n = height * width
    peak = memory.fit_tiles("dense-image", {"the loop over K, V": {
        "Q_i, O_i": 2 * min(Br, n) * d, "K_j, V_j": 2 * min(Bc, n) * d}}, M)
    t_r, t_c = memory.cdiv(n, Br), memory.cdiv(n, Bc)
    return memory.traffic({"Q": (n * d, 0), "K": (t_r * n * d, 0), "V": (t_r * n * d, 0),
                           "O": (0, n * d)}, peak, steps=t_r, events=2 * t_r * t_c + 2 * t_r)


def _sim_dat(height: int, width: int, d: int, r: int = 8, Br: int = 64, Bc: int = 64,
             M: int | None = None, keep_trace: bool = True) -> memory.Traffic:
    """Fused DAT: every query block gathers the four corners of each sample from the K and V
    maps inside its loop; sampled keys are never written."""
    n = height * width
    n_s = -(-height // r) * -(-width // r)
    sim = memory.HBMSim(M, keep_trace)
    for i, br in enumerate(memory.blocks(n, Br)):
        sim.step = i
        sim.hold(br * d * 2, "the Q tile and the O accumulator")
        sim.load("Q", br * d, (i,))
        for j, bc in enumerate(memory.blocks(n_s, Bc)):
            sim.hold(2 * bc + 2 * bc * d, "points and sampled K, V tiles")
            sim.load("points", 2 * bc, (j,))
            sim.load("K", CORNERS * bc * d, (j,))  # four corners per sample
            sim.load("V", CORNERS * bc * d, (j,))
            sim.release(2 * bc + 2 * bc * d)
        sim.store("O", br * d, (i,))
        sim.release(br * d * 2)
    return sim.result()


def _closed_dat(height: int, width: int, d: int, r: int = 8, Br: int = 64, Bc: int = 64,
                M: int | None = None, keep_trace: bool = True) -> memory.Traffic:
    n = height * width
    n_s = -(-height // r) * -(-width // r)
    bc = min(Bc, n_s)
    peak = memory.fit_tiles("dat", {"the loop over samples": {
        "Q_i, O_i": 2 * min(Br, n) * d, "points": 2 * bc, "sampled K_j, V_j": 2 * bc * d}}, M)
    t_r, t_s = memory.cdiv(n, Br), memory.cdiv(n_s, Bc)
    return memory.traffic({"Q": (n * d, 0), "points": (t_r * 2 * n_s, 0),
                           "K": (t_r * CORNERS * n_s * d, 0), "V": (t_r * CORNERS * n_s * d, 0),
                           "O": (0, n * d)}, peak, steps=t_r, events=3 * t_r * t_s + 2 * t_r)


def _sim_dat_unfused(height: int, width: int, d: int, r: int = 8, Br: int = 64, Bc: int = 64,
                     M: int | None = None, keep_trace: bool = True) -> memory.Traffic:
    """grid_sample writes the sampled K̃, Ṽ to HBM; fused attention then reads them back."""
    n = height * width
    n_s = -(-height // r) * -(-width // r)
    sim = memory.HBMSim(M, keep_trace)
    sim.step = 0
    for j, bc in enumerate(memory.blocks(n_s, Bc)):  # 1. grid_sample
        sim.hold(2 * bc + 2 * bc * d, "points and sampled K, V tiles")
        sim.load("points", 2 * bc, (j,))
        sim.load("K", CORNERS * bc * d, (j,))
        sim.load("V", CORNERS * bc * d, (j,))
        sim.store("K̃", bc * d, (j,))
        sim.store("Ṽ", bc * d, (j,))
        sim.release(2 * bc + 2 * bc * d)
    for i, br in enumerate(memory.blocks(n, Br)):  # 2. attention over the N_s sampled keys
        sim.step = i + 1
        sim.hold(br * d * 2, "the Q tile and the O accumulator")
        sim.load("Q", br * d, (i,))
        for j, bc in enumerate(memory.blocks(n_s, Bc)):
            sim.hold(2 * bc * d, "K̃ and Ṽ tiles")
            sim.load("K̃", bc * d, (j,))
            sim.load("Ṽ", bc * d, (j,))
            sim.release(2 * bc * d)
        sim.store("O", br * d, (i,))
        sim.release(br * d * 2)
    return sim.result()


def _closed_dat_unfused(height: int, width: int, d: int, r: int = 8, Br: int = 64,
                        Bc: int = 64, M: int | None = None,
                        keep_trace: bool = True) -> memory.Traffic:
    n = height * width
    n_s = -(-height // r) * -(-width // r)
    bc = min(Bc, n_s)
    peak = memory.fit_tiles("dat-unfused", {
        "grid_sample": {"points": 2 * bc, "sampled K_j, V_j": 2 * bc * d},
        "the attention over the samples": {"Q_i, O_i": 2 * min(Br, n) * d,
                                           "K̃_j, Ṽ_j": 2 * bc * d}}, M)
    t_r, t_s = memory.cdiv(n, Br), memory.cdiv(n_s, Bc)
    return memory.traffic({"Q": (n * d, 0), "points": (2 * n_s, 0),
                           "K": (CORNERS * n_s * d, 0), "V": (CORNERS * n_s * d, 0),
                           "K̃": (t_r * n_s * d, n_s * d), "Ṽ": (t_r * n_s * d, n_s * d),
                           "O": (0, n * d)}, peak, steps=t_r + 1,
                          events=5 * t_s + 2 * t_r * t_s + 2 * t_r)


def _sim_msda(n_queries: int, d: int, n_levels: int = 4, n_points: int = 4, Bq: int = 64,
              M: int | None = None, keep_trace: bool = True) -> memory.Traffic:
    """MSDA: each query reads its L*P locations and weights and four corners per sample."""
    lp = n_levels * n_points
    sim = memory.HBMSim(M, keep_trace)
    for i, bq in enumerate(memory.blocks(n_queries, Bq)):
        sim.step = i
        sim.hold(bq * d + 3 * bq, "the accumulator, one location and one weight per query")
        for _ in range(lp):
            sim.load("points", 2 * bq, (i,))
            sim.load("P", bq, (i,))  # attention weights
            sim.load("V", CORNERS * bq * d, (i,))
        sim.store("O", bq * d, (i,))
        sim.release(bq * d + 3 * bq)
    return sim.result()


def _closed_msda(n_queries: int, d: int, n_levels: int = 4, n_points: int = 4, Bq: int = 64,
                 M: int | None = None, keep_trace: bool = True) -> memory.Traffic:
    lp = n_levels * n_points
    bq = min(Bq, n_queries)
    peak = memory.fit_tiles("msda", {"the loop over samples": {
        "the O accumulator": bq * d, "one location and one weight per query": 3 * bq}}, M)
    t_q = memory.cdiv(n_queries, Bq)
    return memory.traffic({"points": (2 * n_queries * lp, 0), "P": (n_queries * lp, 0),
                           "V": (CORNERS * n_queries * lp * d, 0), "O": (0, n_queries * d)},
                          peak, steps=t_q, events=t_q * (3 * lp + 1))


memory.register("dense-image", _sim_dense_image, _closed_dense_image)
memory.register("dat", _sim_dat, _closed_dat)
memory.register("dat-unfused", _sim_dat_unfused, _closed_dat_unfused)
memory.register("msda", _sim_msda, _closed_msda)
