"""Argument checks of the decode kernel and the split heuristic.

``check_inputs`` (q, the paged or contiguous cache, its lengths and block table, the
flags and the softmax scale, each error naming the argument as the caller wrote it),
``choose_splits`` (num_splits=0's heuristic, which refuses sizes that are not ints or
an SM count below 1) and ``sm_count``.
"""

from __future__ import annotations

import numbers

import torch

from .. import runtime
from ..common import (
    FLOAT_DTYPES,
    check_bool,
    check_int,
    check_tensor,
    kernel_scale,
)

MAX_HEAD_DIM = 256
MAX_SPLITS = 64
#: Keys a split gets at least before the heuristic adds another split.
MIN_KEYS_PER_SPLIT = 256
#: Under the interpreter the heuristic picks at most this many splits.
INTERPRET_MAX_SPLITS = 2


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of ``device`` (under the interpreter: 4, a stand-in so
    the heuristic still splits)."""
    if device.type != "cuda":
        return 4
    return torch.cuda.get_device_properties(device).multi_processor_count


def choose_splits(
    programs: int, max_seqlen: int, sms: int, interpret: bool = False
) -> int:
    """num_splits=0's heuristic: enough splits that ``programs`` (sequences x KV heads
    x query-row blocks) times the splits reach two programs per SM, but never a split
    shorter than ``MIN_KEYS_PER_SPLIT`` keys (each split's partial output costs a
    write and a read in the merge) and at most ``MAX_SPLITS``. One split when the
    grid fills the GPU by itself. Under the interpreter at most
    ``INTERPRET_MAX_SPLITS``."""
    programs = check_int("programs", programs, 0)
    max_seqlen = check_int("max_seqlen", max_seqlen, 0)
    sms = check_int("sms", sms, 1)
    check_bool("interpret", interpret)
    if programs == 0 or max_seqlen == 0:
        return 1
    want = -(-2 * sms // programs)  # ceil(2 SMs / programs)
    fit = -(-max_seqlen // MIN_KEYS_PER_SPLIT)
    s = max(1, min(want, fit, MAX_SPLITS))
    if interpret:
        s = min(s, INTERPRET_MAX_SPLITS)
    return s


def check_inputs(
    q,
    k_cache,
    v_cache,
    cache_seqlens,
    block_table,
    causal,
    softmax_scale,
    num_splits,
    return_lse,
):
    for name, t in (
        ("q", q),
        ("k_cache", k_cache),
        ("v_cache", v_cache),
        ("cache_seqlens", cache_seqlens),
    ):
        check_tensor(name, t)
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if t.ndim != 4:
            raise ValueError(f"{name} must be 4-D, got shape {tuple(t.shape)}")
        if t.dtype not in FLOAT_DTYPES:
            raise TypeError(
                f"{name} must be float16, bfloat16 or float32, got dtype {t.dtype}"
            )
    if not (q.dtype == k_cache.dtype == v_cache.dtype):
        raise TypeError(
            f"q, k_cache, v_cache must share a dtype, got q {q.dtype}, "
            f"k_cache {k_cache.dtype}, v_cache {v_cache.dtype}"
        )
    check_bool("causal", causal)
    check_bool("return_lse", return_lse)
    if isinstance(num_splits, bool) or not isinstance(num_splits, numbers.Integral):
        raise TypeError(
            f"num_splits must be an int (0: chosen by the heuristic), "
            f"got {type(num_splits).__name__}"
        )
    if num_splits < 0:
        raise ValueError(
            f"num_splits must be >= 0 (0: chosen by the heuristic), got {num_splits}"
        )
    dev = q.device
    tensors = [
        ("k_cache", k_cache),
        ("v_cache", v_cache),
        ("cache_seqlens", cache_seqlens),
    ]
    if block_table is not None:
        check_tensor("block_table", block_table)
        tensors.append(("block_table", block_table))
    for name, t in tensors:
        if t.device != dev:
            raise ValueError(f"{name} is on {t.device}, q on {dev}: one device needed")
    if not runtime.INTERPRET and dev.type != "cuda":
        raise ValueError(
            f"q must be a CUDA tensor for the compiled kernels, got "
            f"device {dev} (set TRITON_INTERPRET=1 before importing "
            f"kernels to run on the CPU)"
        )
    B, n_q, h_q, d = q.shape
    if k_cache.shape != v_cache.shape:
        raise ValueError(
            f"k_cache and v_cache must have one shape, got "
            f"{tuple(k_cache.shape)} and {tuple(v_cache.shape)}"
        )
    n_pages, page, h_kv, dk = k_cache.shape
    if B < 1 or n_q < 1:
        raise ValueError(
            f"q (B, N_q, H_q, d) needs B >= 1 and N_q >= 1, got {tuple(q.shape)}"
        )
    if B > 65535:
        raise ValueError(f"q batch {B} exceeds the launch grid's 65535")
    if dk != d:
        raise ValueError(f"k_cache head dim {dk} does not match q head dim {d}")
    if not 1 <= d <= MAX_HEAD_DIM:
        raise ValueError(
            f"head dim d must be in 1..{MAX_HEAD_DIM}, got q shape {tuple(q.shape)}"
        )
    if h_kv < 1 or h_q % h_kv != 0:
        raise ValueError(
            f"q heads H_q={h_q} must be a positive multiple of the "
            f"cache's KV heads H_kv={h_kv}"
        )
    if k_cache.stride() != v_cache.stride():
        raise ValueError(
            f"k_cache and v_cache must have one memory layout (strides "
            f"{k_cache.stride()} and {v_cache.stride()})"
        )
    if cache_seqlens.dtype != torch.int32:
        raise TypeError(f"cache_seqlens must be int32, got {cache_seqlens.dtype}")
    if tuple(cache_seqlens.shape) != (B,):
        raise ValueError(
            f"cache_seqlens must have shape (B,) = ({B},), got "
            f"{tuple(cache_seqlens.shape)}"
        )
    if block_table is None:
        if n_pages != B:
            raise ValueError(
                f"without block_table, k_cache is (B, N_max, H_kv, d) "
                f"with B = {B}, got {tuple(k_cache.shape)}"
            )
        capacity = page
    else:
        if block_table.dtype != torch.int32:
            raise TypeError(f"block_table must be int32, got {block_table.dtype}")
        if block_table.ndim != 2 or block_table.shape[0] != B:
            raise ValueError(
                f"block_table must be (B, max_pages) with B = {B}, got "
                f"shape {tuple(block_table.shape)}"
            )
        if n_pages < 1 or page < 1:
            raise ValueError(
                f"k_cache (num_pages, page_size, H_kv, d) needs a page, "
                f"got {tuple(k_cache.shape)}"
            )
        capacity = block_table.shape[1] * page
    # one host synchronisation: the lengths and the pages they use
    lens = cache_seqlens.to(torch.int64)
    too_long = (lens < 0) | (lens > capacity)
    too_short = (lens > 0) & (lens < n_q)
    checks = [too_long.any(), too_short.any(), lens.max()]
    if block_table is not None and block_table.shape[1] > 0:
        used = (
            torch.arange(block_table.shape[1], device=dev)[None, :]
            < (lens[:, None] + page - 1) // page
        )
        outside = used & ((block_table < 0) | (block_table >= n_pages))
        checks.append(outside.any())
    host = torch.stack([c.to(torch.int64) for c in checks]).tolist()
    if host[0]:
        raise ValueError(
            f"cache_seqlens must lie in 0..{capacity} (the cache's "
            f"capacity per sequence), got {cache_seqlens.tolist()}"
        )
    if host[1]:
        raise ValueError(
            f"cache_seqlens counts the N_q = {n_q} new tokens: each "
            f"must be 0 (an empty slot) or >= {n_q}, got "
            f"{cache_seqlens.tolist()}"
        )
    if len(host) > 3 and host[3]:
        bad = torch.nonzero(outside)[0].tolist()
        raise ValueError(
            f"block_table[{bad[0]}, {bad[1]}] = "
            f"{int(block_table[bad[0], bad[1]])} points outside the pool "
            f"of {n_pages} pages (k_cache {tuple(k_cache.shape)})"
        )
    scale = kernel_scale(softmax_scale, d, "softmax_scale")
    return scale, int(host[2])
