"""Argument checks of ``kernels.sparse``: every refusal is a TypeError/ValueError
naming the argument as the caller wrote it.

``check_inputs`` (q, k, v, the flags, the scale), ``check_kv_indices`` (shape,
dtype, device, range and distinctness, one host synchronisation) and
``check_select`` (``select_blocks``'s q, k, block size and topk).
"""

from __future__ import annotations

import torch

from ..common import (
    FLOAT_DTYPES,
    check_bool,
    check_device,
    check_int,
    check_scale,
    check_tensor,
    kernel_scale,
)
from .tiles import MAX_HEAD_DIM


def _check_4d(name, t):
    check_tensor(name, t)
    if t.ndim != 4:
        raise ValueError(f"{name} must be 4-D (B, H, N, d), got shape {tuple(t.shape)}")
    if t.dtype not in FLOAT_DTYPES:
        raise TypeError(
            f"{name} must be float16, bfloat16 or float32, got dtype {t.dtype}"
        )


def _check_qk(q, k):
    for name, t in (("q", q), ("k", k)):
        _check_4d(name, t)
    if q.dtype != k.dtype:
        raise TypeError(f"q and k must share a dtype, got q {q.dtype}, k {k.dtype}")
    if q.device != k.device:
        raise ValueError(f"q and k must be on one device, got {q.device}, {k.device}")
    check_device("q", q.device)
    (B, H, N_q, d), (Bk, H_kv, N_k, dk) = q.shape, k.shape
    if Bk != B:
        raise ValueError(f"k batch {Bk} does not match q batch {B}")
    if dk != d:
        raise ValueError(f"k head dim {dk} does not match q head dim {d}")
    if not 1 <= d <= MAX_HEAD_DIM:
        raise ValueError(f"q's head dim must be in 1..{MAX_HEAD_DIM}, got {d}")
    if min(B, H, N_q, H_kv, N_k) < 1:
        raise ValueError(
            f"batch, heads and lengths must be >= 1, got q {tuple(q.shape)}, "
            f"k {tuple(k.shape)}"
        )
    if H % H_kv:
        raise ValueError(
            f"q heads H_q={H} must be a multiple of k/v heads H_kv={H_kv} "
            f"(q {tuple(q.shape)}, k {tuple(k.shape)})"
        )
    if B * H_kv > 65535:
        raise ValueError(f"B x H_kv = {B * H_kv} exceeds the launch grid's 65535")


def check_inputs(q, k, v, block_size, scale, causal, return_lse):
    """q, k, v, block_size, scale and the flags of ``sparse_attention``; returns
    (block_size, kernel scale)."""
    _check_qk(q, k)
    _check_4d("v", v)
    if v.dtype != q.dtype:
        raise TypeError(f"v must share q's dtype {q.dtype}, got {v.dtype}")
    if v.device != q.device:
        raise ValueError(f"v is on {v.device}, q on {q.device}")
    if tuple(v.shape[:3]) != tuple(k.shape[:3]):
        raise ValueError(
            f"v must be (B, H_kv, N_k, d_v) with k's (B, H_kv, N_k) = "
            f"{tuple(k.shape[:3])}, got v {tuple(v.shape)}"
        )
    if not 1 <= v.shape[3] <= MAX_HEAD_DIM:
        raise ValueError(f"v's head dim must be in 1..{MAX_HEAD_DIM}, got {v.shape[3]}")
    block_size = check_int("block_size", block_size, 1)
    check_bool("causal", causal)
    check_bool("return_lse", return_lse)
    return block_size, kernel_scale(scale, q.shape[-1], "scale")


def check_kv_indices(kv_indices, shape, n_blocks, values=True) -> torch.Tensor:
    """``kv_indices`` as a contiguous int32 tensor (B, H_kv, N_q, S): integers in
    [-1, n_blocks) (-1 padding), the non-negative ones of a row distinct, on q's
    device. ``shape`` is (B, H_kv, N_q, device). One host synchronisation (the range
    and the distinctness, checked together), skipped when ``values`` is False."""
    check_tensor("kv_indices", kv_indices)
    *dims, device = shape
    if kv_indices.dtype not in (torch.int32, torch.int64):
        raise TypeError(
            f"kv_indices must be int32 (or int64), got dtype {kv_indices.dtype}"
        )
    if kv_indices.ndim != 4 or tuple(kv_indices.shape[:3]) != tuple(dims):
        raise ValueError(
            f"kv_indices must have shape (B, H_kv, N_q, S) = {tuple(dims)} + (S,), "
            f"got {tuple(kv_indices.shape)}"
        )
    if kv_indices.device != device:
        raise ValueError(f"kv_indices is on {kv_indices.device}, q on {device}")
    idx = kv_indices
    if idx.shape[3] == 0 or not values:
        return idx.to(torch.int32).contiguous()
    bad = (idx < -1) | (idx >= n_blocks)
    s = torch.sort(idx, dim=-1).values
    dup = (s[..., 1:] == s[..., :-1]) & (s[..., 1:] >= 0)
    host = torch.stack([bad.any(), dup.any()]).tolist()
    if host[0]:
        where = torch.nonzero(bad)[0].tolist()
        raise ValueError(
            f"kv_indices{where} = {int(idx[tuple(where)])} lies outside the key "
            f"blocks [0, {n_blocks}) of block_size keys (-1 is padding)"
        )
    if host[1]:
        where = torch.nonzero(dup.any(-1))[0].tolist()
        raise ValueError(
            f"kv_indices{where} repeats a block index (the indices of one row must "
            f"be distinct)"
        )
    return idx.to(torch.int32).contiguous()


def check_select(q, k, block_size, topk, causal, scale):
    """``select_blocks``'s arguments; returns (block_size, topk, scale)."""
    _check_qk(q, k)
    block_size = check_int("block_size", block_size, 1)
    topk = check_int("topk", topk, 1)
    check_bool("causal", causal)
    return block_size, topk, check_scale(scale, q.shape[-1], "scale")
