"""Multi-scale deformable attention (MSDA, Deformable DETR) in NumPy: the core op
``ms_deform_attn`` (the twin of ``kernels.deformable.ms_deform_attn``), the per-query
sampling locations and weights, and one layer."""

from __future__ import annotations

import math

import numpy as np

from ..checks import as_real_array, check_int
from ..core import softmax
from .sampling import bilinear_sample


def level_start_index(spatial_shapes) -> np.ndarray:
    """Offsets of each level in the flattened value: [0, H_0 W_0, H_0 W_0 + H_1 W_1,
    ...]. ``spatial_shapes`` is (L, 2) as (H_l, W_l), L >= 1, sizes >= 1."""
    shapes = np.asarray(spatial_shapes)
    if shapes.ndim != 2 or shapes.shape[1] != 2 or shapes.shape[0] < 1:
        raise ValueError(
            "spatial_shapes must be (L, 2) rows of (H_l, W_l) with at "
            f"least one level, got shape {shapes.shape}"
        )
    if not np.issubdtype(shapes.dtype, np.integer) or np.any(shapes < 1):
        raise ValueError(
            f"spatial_shapes must hold integer sizes >= 1, got {shapes.tolist()}"
        )
    areas = np.prod(shapes.astype(np.int64), axis=1)
    return np.concatenate([[0], np.cumsum(areas)[:-1]]).astype(np.int64)


def ms_deform_attn(
    value: np.ndarray,
    spatial_shapes,
    level_start,
    sampling_locations,
    attention_weights,
) -> np.ndarray:
    """Deformable DETR's core op: a weighted sum of bilinear samples over levels and
    points.

    value: (B, S, H, D) with S = sum_l H_l W_l; spatial_shapes (L, 2) as (H_l, W_l);
    level_start (L,); sampling_locations (B, L_q, H, L, P, 2) as (x, y) in [0, 1];
    attention_weights (B, L_q, H, L, P). Returns (B, L_q, H * D). Sampling is
    ``align_corners=False`` with zero padding on the grid 2 * loc - 1.

    The level tensors are checked as the kernel checks them: ``spatial_shapes`` must
    cover exactly the S positions of ``value`` and ``level_start`` must be their
    offsets.
    """
    value, shapes, starts, sampling_locations, attention_weights = _check_msda(
        value, spatial_shapes, level_start, sampling_locations, attention_weights
    )
    b, _, n_h, d = value.shape
    _, l_q, _, n_l, n_p, _ = sampling_locations.shape
    out = np.zeros((b, n_h, l_q, d), dtype=np.result_type(value, attention_weights))
    for lvl, (h_l, w_l) in enumerate(shapes):
        s0 = int(starts[lvl])
        v_l = value[:, s0 : s0 + h_l * w_l].reshape(b, h_l, w_l, n_h, d)
        v_l = v_l.transpose(0, 3, 1, 2, 4).reshape(b * n_h, h_l, w_l, d)  # (B*H,.,.,D)
        grid = 2.0 * sampling_locations[:, :, :, lvl] - 1.0  # (B, L_q, H, P, 2)
        grid = grid.transpose(0, 2, 1, 3, 4).reshape(b * n_h, l_q * n_p, 2)
        sampled = bilinear_sample(v_l, grid, align_corners=False)  # (B*H, L_q*P, D)
        sampled = sampled.reshape(b, n_h, l_q, n_p, d)  # (B, H, L_q, P, D)
        w = attention_weights[:, :, :, lvl].transpose(0, 2, 1, 3)  # (B, H, L_q, P)
        out += np.einsum("bhqp,bhqpd->bhqd", w, sampled)
    return out.transpose(0, 2, 1, 3).reshape(b, l_q, n_h * d)  # (B, L_q, H*D)


def _check_msda(
    value, spatial_shapes, level_start, sampling_locations, attention_weights
):
    value = as_real_array("value", value)
    loc = as_real_array("sampling_locations", sampling_locations)
    attn = as_real_array("attention_weights", attention_weights)
    if value.ndim != 4:
        raise ValueError(f"value must be (B, S, H, D), got shape {value.shape}")
    b, s, n_h, d = value.shape
    if loc.ndim != 6 or loc.shape[0] != b or loc.shape[2] != n_h or loc.shape[-1] != 2:
        raise ValueError(
            f"sampling_locations must be (B, L_q, H, L, P, 2) with B={b}, "
            f"H={n_h}, got shape {loc.shape}"
        )
    if attn.shape != loc.shape[:-1]:
        raise ValueError(
            f"attention_weights must be (B, L_q, H, L, P) = "
            f"{loc.shape[:-1]}, got shape {attn.shape}"
        )
    n_l = loc.shape[3]
    shapes, starts = np.asarray(spatial_shapes), np.asarray(level_start)
    for name, t in (("spatial_shapes", shapes), ("level_start", starts)):
        if not np.issubdtype(t.dtype, np.integer):
            raise TypeError(f"{name} must hold integers, got dtype {t.dtype}")
    if shapes.shape != (n_l, 2):
        raise ValueError(
            f"spatial_shapes must be (L, 2) = ({n_l}, 2) for the L={n_l} "
            f"levels of sampling_locations, got shape {shapes.shape}"
        )
    if starts.shape != (n_l,):
        raise ValueError(
            f"level_start must be (L,) = ({n_l},), got shape {starts.shape}"
        )
    shapes = shapes.astype(np.int64)
    if (shapes <= 0).any():
        raise ValueError(f"spatial_shapes must be positive, got {shapes.tolist()}")
    areas = shapes[:, 0] * shapes[:, 1]
    if int(areas.sum()) != s:
        raise ValueError(
            f"spatial_shapes {shapes.tolist()} cover {int(areas.sum())} "
            f"positions but value has S={s}"
        )
    expected = np.concatenate([[0], np.cumsum(areas)[:-1]])
    if not np.array_equal(starts.astype(np.int64), expected):
        raise ValueError(
            f"level_start {starts.tolist()} does not match spatial_shapes "
            f"(expected {expected.tolist()})"
        )
    return value, shapes, starts, loc, attn


def init_msda_params(
    d_model: int, n_heads: int, n_levels: int, n_points: int, rng: np.random.Generator
) -> dict:
    """Deformable DETR's initialisation: offsets start on square rings around the
    reference point (head h points in direction 2*pi*h/H, scaled so the larger
    coordinate is 1; point p sits p+1 times that, i.e. at max-norm distance p+1
    pixels), weights uniform."""
    for name, value in (
        ("d_model", d_model),
        ("n_heads", n_heads),
        ("n_levels", n_levels),
        ("n_points", n_points),
    ):
        check_int(name, value, 1)
    s = 1.0 / math.sqrt(d_model)
    theta = 2.0 * math.pi * np.arange(n_heads) / n_heads
    dirs = np.stack([np.cos(theta), np.sin(theta)], -1)  # (H, 2)
    dirs = dirs / np.abs(dirs).max(-1, keepdims=True)
    steps = np.arange(1, n_points + 1)[None, None, :, None]
    bias = dirs[:, None, None, :] * steps  # (H, 1, P, 2)
    bias = np.broadcast_to(bias, (n_heads, n_levels, n_points, 2)).reshape(-1)
    n_hlp = n_heads * n_levels * n_points
    return {
        "w_off": rng.normal(0, 0.01, (d_model, n_hlp * 2)),
        "b_off": bias.copy(),
        "w_attn": rng.normal(0, s, (d_model, n_hlp)),
        "b_attn": np.zeros(n_hlp),
        "w_v": rng.normal(0, s, (d_model, d_model)),
        "w_o": rng.normal(0, s, (d_model, d_model)),
    }


def msda_sampling(
    query: np.ndarray,
    reference_points: np.ndarray,
    params: dict,
    spatial_shapes,
    n_heads: int,
    n_points: int,
):
    """Per-query sampling locations (linear in the query) and attention weights (a
    softmax over the L * P samples of each head of a linear function of the query).

    query (B, L_q, C); reference_points (B, L_q, 2) as (x, y) in [0, 1]. Offsets are in
    pixels of each level: loc = ref + Δ / (W_l, H_l). Returns locations
    (B, L_q, H, L, P, 2) and weights (B, L_q, H, L, P).
    """
    level_start_index(spatial_shapes)  # checks the shapes
    shapes = np.asarray(spatial_shapes, dtype=np.float64)
    n_l = shapes.shape[0]
    n_heads = check_int("n_heads", n_heads, 1)
    n_points = check_int("n_points", n_points, 1)
    query = np.asarray(query)
    if query.ndim != 3:
        raise ValueError(f"query must be (B, L_q, C), got shape {query.shape}")
    b, l_q, _ = query.shape
    n_out = params["w_attn"].shape[-1]
    if n_out != n_heads * n_l * n_points:
        raise ValueError(
            f"spatial_shapes has {n_l} levels, so params must hold "
            f"n_heads * n_levels * n_points = {n_heads} * {n_l} * "
            f"{n_points} attention weights per query, but w_attn gives "
            f"{n_out}: the levels do not match the parameters"
        )
    off = query @ params["w_off"] + params["b_off"]
    off = off.reshape(b, l_q, n_heads, n_l, n_points, 2)  # (B, L_q, H, L, P, 2)
    normalizer = shapes[:, ::-1]  # (L, 2) as (W_l, H_l)
    loc = (
        reference_points[:, :, None, None, None, :]
        + off / normalizer[None, None, None, :, None, :]
    )
    logits = query @ params["w_attn"] + params["b_attn"]
    logits = logits.reshape(b, l_q, n_heads, n_l * n_points)
    weights = softmax(logits, axis=-1).reshape(b, l_q, n_heads, n_l, n_points)
    return loc, weights


def msda_layer(
    query,
    reference_points,
    input_flatten,
    spatial_shapes,
    params: dict,
    n_heads: int,
    n_points: int,
    return_all: bool = False,
):
    """One multi-scale deformable attention layer: value projection, sampling, W_o.

    input_flatten: (B, S, C), the L levels' features flattened and concatenated.
    Returns (B, L_q, C) or, with ``return_all``, a dict with the locations and weights.
    """
    b, s, c = input_flatten.shape
    value = input_flatten @ params["w_v"]
    value = value.reshape(b, s, n_heads, c // n_heads)  # (B, S, H, D)
    loc, w = msda_sampling(
        query, reference_points, params, spatial_shapes, n_heads, n_points
    )
    core = ms_deform_attn(
        value, spatial_shapes, level_start_index(spatial_shapes), loc, w
    )
    out = core @ params["w_o"]  # (B, L_q, C)
    if return_all:
        return {"out": out, "locations": loc, "weights": w, "value": value}
    return out
