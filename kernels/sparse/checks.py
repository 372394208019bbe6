"""Argument checks of ``kernels.sparse``: every refusal is a TypeError/ValueError
naming the argument as the caller wrote it.

``check_inputs`` (q, k, v through ``kernels.common.check_qkv``, the flags, the
scale), ``check_kv_indices`` (shape, dtype, device, range and distinctness, one host
synchronisation) and ``check_select`` (``select_blocks``'s q, k, block size and topk).
"""

from __future__ import annotations

import torch

from ..common import (
    FLOAT_DTYPES,
    check_bool,
    check_int,
    check_qkv,
    check_scale,
    check_tensor,
    kernel_scale,
)
from .tiles import MAX_HEAD_DIM


def _check_grid(k) -> None:
    B, H_kv = k.shape[:2]
    if B * H_kv > 65535:
        raise ValueError(f"B x H_kv = {B * H_kv} exceeds the launch grid's 65535")


def check_inputs(q, k, v, block_size, scale, causal, return_lse):
    """q, k, v, block_size, scale and the flags of ``sparse_attention``; returns
    (block_size, kernel scale)."""
    check_qkv(
        q, k, v, dtypes=FLOAT_DTYPES, same_head_dim_v=False, max_head_dim=MAX_HEAD_DIM
    )
    _check_grid(k)
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
    check_qkv(q, k, None, dtypes=FLOAT_DTYPES, max_head_dim=MAX_HEAD_DIM)
    _check_grid(k)
    block_size = check_int("block_size", block_size, 1)
    topk = check_int("topk", topk, 1)
    check_bool("causal", causal)
    return block_size, topk, check_scale(scale, q.shape[-1], "scale")
