"""Argument validation of the deformable kernels: ``_validate_msda`` (Deformable
DETR's tensors and level table) and ``_validate_dat`` (the query, the maps, the points
and the softmax scale), each error naming the argument; the tensors' kind, dims and
dtype through ``kernels.common.check_float_tensor``, the dat inputs' shared dtype and
device through ``kernels.common.check_alike`` (as ``check_qkv`` checks q, k, v).
"""

from __future__ import annotations

import torch

from ..common import FLOAT_DTYPES, check_alike, check_float_tensor, kernel_scale
from .tiles import _MSDA_DTYPES, MAX_HEAD_DIM


def _validate_msda(
    value, spatial_shapes, level_start_index, sampling_locations, attention_weights
):
    """Check every argument; returns the level shapes and starts, checked, on value's
    device."""
    check_float_tensor("value", value, 4, "(B, S, H, D_h)", _MSDA_DTYPES)
    check_float_tensor(
        "sampling_locations",
        sampling_locations,
        6,
        "(B, L_q, H, L, P, 2)",
        _MSDA_DTYPES,
    )
    check_float_tensor(
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


def _validate_dat(q, k_map, v_map, points, softmax_scale, scale_name="softmax_scale"):
    check_float_tensor("q", q, 4, "(B, H, N_q, d)", FLOAT_DTYPES)
    check_float_tensor("k_map", k_map, 5, "(B, H, H_f, W_f, d)", FLOAT_DTYPES)
    check_float_tensor("v_map", v_map, 5, "(B, H, H_f, W_f, d)", FLOAT_DTYPES)
    check_float_tensor("points", points, 4, "(B, G, N_s, 2)", FLOAT_DTYPES)
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
    check_alike("dtype", q=q, k_map=k_map, v_map=v_map)
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
    check_alike("device", q=q, k_map=k_map, v_map=v_map, points=points)
    # finite, and softmax_scale * log2(e) (the kernel's exp2 factor) within float32;
    # a bad one is named as the caller wrote it (``scale_name``: sm_scale, its old name)
    return kernel_scale(softmax_scale, d, scale_name)
