"""Argument checks of the decode kernel and the split heuristic.

``check_inputs`` (q, the paged or contiguous cache, its lengths and block table, the
flags and the softmax scale, each error naming the argument as the caller wrote it),
``choose_splits`` (num_splits=0's heuristic, which refuses sizes that are not ints or
an SM count below 1) and ``sm_count``.
"""

from __future__ import annotations

import math
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
#: MLA: the values' columns (DeepSeek-V2/V3: 512) and the rope columns, at most.
MAX_MLA_DIM_V = 512
MAX_ROPE_DIM = 128
#: The fp8 cache's dtype (FlashAttention-3's e4m3).
FP8 = torch.float8_e4m3fn
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
    k_name="k_cache",
    max_head_dim=MAX_HEAD_DIM,
):
    for name, t in (
        ("q", q),
        (k_name, k_cache),
        ("v_cache", v_cache),
        ("cache_seqlens", cache_seqlens),
    ):
        check_tensor(name, t)
    fp8 = k_cache.dtype == FP8 or v_cache.dtype == FP8
    for name, t in (("q", q), (k_name, k_cache), ("v_cache", v_cache)):
        if t.ndim != 4:
            raise ValueError(f"{name} must be 4-D, got shape {tuple(t.shape)}")
        if t.dtype not in FLOAT_DTYPES and not (fp8 and name != "q"):
            raise TypeError(
                f"{name} must be float16, bfloat16 or float32"
                f"{' (or float8_e4m3fn for a cache)' if name != 'q' else ''}, "
                f"got dtype {t.dtype}"
            )
    if fp8:
        if not (k_cache.dtype == v_cache.dtype == FP8):
            raise TypeError(
                f"k_cache and v_cache must both be float8_e4m3fn or neither, got "
                f"k_cache {k_cache.dtype}, v_cache {v_cache.dtype}"
            )
        if q.dtype not in (torch.float16, torch.bfloat16):
            raise TypeError(
                f"q must be float16 or bfloat16 with an fp8 cache (the tiles are "
                f"upcast to q's dtype), got dtype {q.dtype}"
            )
    elif not (q.dtype == k_cache.dtype == v_cache.dtype):
        raise TypeError(
            f"q and {k_name} must share a dtype, got q {q.dtype}, "
            f"{k_name} {k_cache.dtype}, v_cache {v_cache.dtype}"
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
        (k_name, k_cache),
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
        raise ValueError(f"{k_name} head dim {dk} does not match q head dim {d}")
    if not 1 <= d <= max_head_dim:
        raise ValueError(
            f"head dim d must be in 1..{max_head_dim}, got q shape {tuple(q.shape)}"
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
                f"without block_table, {k_name} is (B, N_max, H_kv, d) "
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
                f"{k_name} (num_pages, page_size, H_kv, d) needs a page, "
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
            f"of {n_pages} pages ({k_name} {tuple(k_cache.shape)})"
        )
    scale = kernel_scale(softmax_scale, d, "softmax_scale")
    return scale, int(host[2])


def _f32_vector(name, t, shapes, dev, what):
    check_tensor(name, t)
    if t.dtype != torch.float32:
        raise TypeError(f"{name} must be float32, got dtype {t.dtype}")
    if tuple(t.shape) not in shapes:
        want = " or ".join(str(s) for s in shapes)
        raise ValueError(f"{name} must be {want} ({what}), got {tuple(t.shape)}")
    if t.device != dev:
        raise ValueError(f"{name} is on {t.device}, q on {dev}: one device needed")
    return t.contiguous()


def check_options(
    q,
    k_cache,
    causal,
    window_size,
    softcap,
    alibi_slopes,
    sinks,
    k_descale,
    v_descale,
):
    """flash-attn's keywords of the call, each error naming the argument: returns
    (left, right, cap, alibi, sinks, k_descale, v_descale), right = 0 under causal,
    -1 = unbounded, cap 0 = none, the tensors contiguous (or None)."""
    if (
        not isinstance(window_size, (tuple, list))
        or len(window_size) != 2
        or any(
            isinstance(w, bool) or not isinstance(w, numbers.Integral)
            for w in window_size
        )
    ):
        raise TypeError(
            f"window_size must be a pair (left, right) of ints, got {window_size!r}"
        )
    left, right = (int(w) for w in window_size)
    if left < -1 or right < -1:
        raise ValueError(
            f"window_size must be (left, right) with each >= 0 or -1 (unbounded), "
            f"got {tuple(window_size)}"
        )
    if causal:
        right = 0
    if isinstance(softcap, bool) or not isinstance(softcap, numbers.Real):
        raise TypeError(f"softcap must be a real number, got {softcap!r}")
    cap = float(softcap)
    if not math.isfinite(cap) or cap < 0:
        raise ValueError(f"softcap must be >= 0 (0: no cap) and finite, got {softcap}")
    B, _, h_q, _ = q.shape
    h_kv = k_cache.shape[2]
    dev = q.device
    alibi = sink = kd = vd = None
    if alibi_slopes is not None:
        alibi = _f32_vector(
            "alibi_slopes", alibi_slopes, [(h_q,), (B, h_q)], dev, f"H_q = {h_q}"
        )
    if sinks is not None:
        sink = _f32_vector("sinks", sinks, [(h_q,)], dev, f"H_q = {h_q}")
    if (k_descale is None) != (v_descale is None):
        raise ValueError("pass k_descale and v_descale together (or neither)")
    if k_descale is not None:
        if k_cache.dtype != FP8:
            raise ValueError(
                f"k_descale and v_descale need an fp8 cache (float8_e4m3fn), "
                f"got k_cache of dtype {k_cache.dtype}"
            )
        what = f"B = {B}, H_kv = {h_kv}"
        kd = _f32_vector("k_descale", k_descale, [(B, h_kv)], dev, what)
        vd = _f32_vector("v_descale", v_descale, [(B, h_kv)], dev, what)
    elif k_cache.dtype == FP8:  # FlashAttention-3's default: descale 1
        kd = torch.ones((B, h_kv), dtype=torch.float32, device=dev)
        vd = kd
    return left, right, cap, alibi, sink, kd, vd


def visible_span(max_len: int, n_q: int, left: int) -> int:
    """The keys the longest sequence's queries can see, at most: all ``max_len``, or
    under a left window the last N_q + left (the split heuristic counts only these)."""
    return max_len if left < 0 else min(max_len, n_q + left)
