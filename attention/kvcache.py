"""The decode kernels' calls in float64 NumPy (chapter 5): flash-attn's
``flash_attn_with_kvcache`` with its keywords (sliding window, softcap, ALiBi, learned
sinks, an fp8 e4m3 cache with descales) and FlashMLA's ``flash_mla_with_kvcache`` (one
latent row per token read by every query head). The math of ``kernels.decode``; the
names are re-exported by ``attention.decode``.

Layouts are flash-attn's: q (B, N_q, H_q, d) against a cache (B, N_max, H_kv, d), or
pages (num_pages, page_size, H_kv, d) with a block table (B, max_pages). Query head h
reads KV head h // (H_q // H_kv) (GQA). The N_q queries of sequence b are the last N_q
of its L = cache_seqlens[b] positions: query t sits at i = L - N_q + t.

What a query sees and scores (flash-attn's semantics, in this order):

* score s_ij = scale * q_i . k_j; with ``softcap`` c > 0, s_ij = c * tanh(s_ij / c);
* with ``alibi_slopes`` (H_q,) or (B, H_q), s_ij -= slope * |i - j|;
* key j is visible when j < L, i - left <= j <= i + right for ``window_size`` =
  (left, right) (-1: unbounded on that side), and ``causal`` sets right = 0;
* with ``sinks`` (H_q,), the softmax's denominator gains exp(sink) (a key no value
  belongs to, gpt-oss's learned sink): lse includes it, and a row with no visible key
  gets o = 0 and lse = sink.

The keys are cut into ``num_splits`` chunks merged by ``attention.core.merge_partials``
(the result does not depend on the count). The rules of ``attention.core`` hold: a row
that sees no key gets 0 and lse -inf (or the sink); a NaN stays in its own row.

fp8: ``round_e4m3`` rounds to the float8_e4m3fn grid (round to nearest even, 448 the
largest finite value, saturating beyond it, as torch's cast). A quantised cache holds
round_e4m3(K / descale) with ``k_descale`` (B, H_kv), FlashAttention-3's name; the call
reads K as cache * descale. ``quantize_e4m3`` makes such a cache with one descale per
(sequence, KV head), amax / 448.
"""

from __future__ import annotations

import warnings

import numpy as np

from .checks import as_real_array, check_bool, check_int, check_scale
from .core import logsumexp, merge_partials, softmax, weighted_sum

#: float8_e4m3fn: the largest finite value, the smallest normal exponent, mantissa bits.
E4M3_MAX = 448.0
E4M3_MIN_EXP = -6
E4M3_MANTISSA = 3


def kv_group(n_heads_q: int, n_heads_kv: int) -> int:
    """Query heads per KV head, H_q // H_kv (ValueError unless H_kv divides H_q)."""
    h_q, h_kv = check_int("H_q", n_heads_q, 1), check_int("H_kv", n_heads_kv, 1)
    if h_q % h_kv:
        raise ValueError(f"H_q must be a multiple of H_kv, got H_q={h_q}, H_kv={h_kv}")
    return h_q // h_kv


def repeat_kv(x, group: int, axis: int = -3) -> np.ndarray:
    """Each KV head repeated ``group`` times along the head axis (default ``(B, H_kv, N,
    d)`` -> ``(B, H_kv * group, N, d)``): query head h then meets KV head h // group."""
    x = as_real_array("x", x, 3)
    return np.repeat(x, check_int("group", group, 1), axis=axis)


def _int_array(name, x, ndim):
    a = np.asarray(x)
    if a.dtype == np.bool_ or not np.issubdtype(a.dtype, np.integer):
        raise TypeError(f"{name} must be an integer array, got dtype {a.dtype}")
    if a.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {a.shape}")
    return a.astype(np.int64)


# ---------------------------------------------------------------------------------
# fp8 e4m3
# ---------------------------------------------------------------------------------


def round_e4m3(x) -> np.ndarray:
    """``x`` rounded to the nearest float8_e4m3fn value (ties to even), as float64:
    4 exponent bits (bias 7, subnormals below 2^-6), 3 mantissa bits, 448 the largest
    finite value; larger |x| and inf saturate to +-448 (e4m3fn has no inf) and NaN stays
    NaN, as ``torch.Tensor.to(torch.float8_e4m3fn)`` does."""
    x = np.asarray(as_real_array("x", x), dtype=np.float64)
    a = np.abs(x)
    with np.errstate(divide="ignore", invalid="ignore"):
        e = np.floor(np.log2(np.where(a > 0, a, 1.0)))
    e = np.clip(e, E4M3_MIN_EXP, None)
    step = np.exp2(e - E4M3_MANTISSA)
    with np.errstate(invalid="ignore"):
        r = np.round(a / step) * step  # np.round: ties to even
    r = np.where(np.isinf(a), E4M3_MAX, np.minimum(r, E4M3_MAX))  # saturating
    return np.where(np.isnan(x), np.nan, np.copysign(r, x))


def quantize_e4m3(x, axis=(1, 3)):
    """A cache ``x (B, N, H_kv, d)`` quantised to e4m3 with one descale per (sequence,
    KV head): descale = amax / 448 over ``axis`` (1 where the amax is 0). Returns
    (round_e4m3(x / descale), descale (B, H_kv))."""
    x = as_real_array("x", x, 4)
    amax = np.max(np.abs(x), axis=axis, keepdims=True)
    descale = np.where(amax > 0, amax / E4M3_MAX, 1.0)
    return round_e4m3(x / descale), np.squeeze(descale, axis=axis)


# ---------------------------------------------------------------------------------
# Argument checks of the keywords
# ---------------------------------------------------------------------------------


def _check_window(window_size):
    if (
        not isinstance(window_size, (tuple, list))
        or len(window_size) != 2
        or any(isinstance(w, (bool, np.bool_)) for w in window_size)
    ):
        raise TypeError(
            f"window_size must be a pair (left, right) of ints, got {window_size!r}"
        )
    left, right = (check_int("window_size", w) for w in window_size)
    if left < -1 or right < -1:
        raise ValueError(
            f"window_size must be (left, right) with each >= 0 or -1 (unbounded), "
            f"got {tuple(window_size)}"
        )
    return left, right


def _check_softcap(softcap):
    if isinstance(softcap, (bool, np.bool_)):
        raise TypeError(f"softcap must be a real number, got {softcap!r}")
    try:
        cap = float(softcap)
    except (TypeError, ValueError):
        raise TypeError(
            f"softcap must be a real number, got {type(softcap).__name__}"
        ) from None
    if not np.isfinite(cap) or cap < 0:
        raise ValueError(f"softcap must be >= 0 (0: no cap) and finite, got {softcap}")
    return cap


def _check_per_head(name, x, B, h_q, batched):
    a = as_real_array(name, x)
    shapes = [(h_q,)] + ([(B, h_q)] if batched else [])
    if a.shape not in shapes:
        want = " or ".join(str(s) for s in shapes)
        raise ValueError(f"{name} must be {want} (H_q = {h_q}), got shape {a.shape}")
    return np.broadcast_to(a, (B, h_q)).astype(np.float64)


def _check_descale(name, x, B, h_kv, cache, cache_name):
    a = as_real_array(name, x)
    if a.shape != (B, h_kv):
        raise ValueError(f"{name} must be (B, H_kv) = ({B}, {h_kv}), got {a.shape}")
    if not np.all(np.isfinite(a)) or (a <= 0).any():
        raise ValueError(f"{name} must be finite and > 0")
    finite = cache[np.isfinite(cache)]
    if not np.array_equal(round_e4m3(finite), finite):
        raise ValueError(
            f"{name} is given but {cache_name} is not an fp8 (e4m3) cache: its values "
            f"are not on the float8_e4m3fn grid (make it with quantize_e4m3)"
        )
    return a.astype(np.float64)


# ---------------------------------------------------------------------------------
# The calls
# ---------------------------------------------------------------------------------


def _renamed_scale(scale, softmax_scale, fn: str):
    """(the scale, the name the caller gave it): ``scale``, or ``softmax_scale`` (the
    kernels' name) with a DeprecationWarning, so that old calls still run and an error
    names what the caller wrote. Both given: TypeError."""
    if softmax_scale is None:
        return scale, "scale"
    warnings.warn(
        f"attention.decode.{fn}: softmax_scale is deprecated here (the NumPy "
        "functions call it scale); pass scale",
        DeprecationWarning,
        stacklevel=3,
    )
    if scale is not None:
        raise TypeError("pass scale or softmax_scale, not both")
    return softmax_scale, "softmax_scale"


def _chunk_partial(s, keep, v):
    """(o, lse) of scores ``s (H, N_q, n)`` over one chunk, hidden where not keep."""
    if s.shape[-1] == 0:
        return np.zeros((*s.shape[:-1], v.shape[-1])), np.full(s.shape[:-1], -np.inf)
    s = np.where(keep, s, -np.inf)
    lse = logsumexp(s, axis=-1)
    o = weighted_sum(softmax(s, axis=-1), v, keep)
    return o, np.where(np.isposinf(lse), np.nan, lse)


def attention_with_kvcache(
    q,
    k_cache,
    v_cache,
    cache_seqlens,
    block_table=None,
    causal: bool = True,
    scale: float | None = None,
    num_splits: int = 0,
    return_lse: bool = False,
    *,
    softmax_scale: float | None = None,
    window_size=(-1, -1),
    softcap: float = 0.0,
    alibi_slopes=None,
    sinks=None,
    k_descale=None,
    v_descale=None,
):
    """The decode kernel's call (``kernels.decode.attention_with_kvcache``, flash-attn's
    ``flash_attn_with_kvcache``) in float64 NumPy; the module docstring gives the
    semantics of ``window_size``, ``softcap``, ``alibi_slopes``, ``sinks`` and the fp8
    descales.

    q (B, N_q, H_q, d); k_cache, v_cache (B, N_max, H_kv, d), or pages (num_pages,
    page_size, H_kv, d) with ``block_table`` (B, max_pages) of physical page numbers;
    cache_seqlens (B,): the valid keys of each sequence, the N_q new tokens included.
    ``scale`` is the softmax scale (default 1/sqrt(d)); the kernel's name for it,
    ``softmax_scale``, is accepted with a DeprecationWarning. Returns out (B, N_q, H_q,
    d_v), and lse (B, H_q, N_q) with ``return_lse``.
    """
    scale, scale_name = _renamed_scale(scale, softmax_scale, "attention_with_kvcache")
    if np.shape(k_cache) != np.shape(v_cache):
        raise ValueError(
            f"k_cache and v_cache must have one shape, got "
            f"{np.shape(k_cache)} and {np.shape(v_cache)}"
        )
    return _with_kvcache(
        q, k_cache, v_cache, cache_seqlens, block_table, causal, scale, scale_name,
        num_splits, return_lse, window_size, softcap, alibi_slopes, sinks, k_descale,
        v_descale,
    )  # fmt: skip


def _with_kvcache(
    q, k_cache, v_cache, cache_seqlens, block_table, causal, scale, scale_name,
    num_splits, return_lse, window_size, softcap, alibi_slopes, sinks, k_descale,
    v_descale, k_name="k_cache", v_name="v_cache",
):  # fmt: skip
    q = as_real_array("q", q)
    k_cache, v_cache = as_real_array(k_name, k_cache), as_real_array(v_name, v_cache)
    for name, t in (("q", q), (k_name, k_cache), (v_name, v_cache)):
        if t.ndim != 4:
            raise ValueError(f"{name} must be 4-D, got shape {t.shape}")
    if k_cache.shape[:3] != v_cache.shape[:3]:
        raise ValueError(
            f"{k_name} and {v_name} must agree but for the head dim, got "
            f"{k_cache.shape} and {v_cache.shape}"
        )
    B, n_q, h_q, d = q.shape
    if k_cache.shape[3] != d:
        raise ValueError(
            f"q and {k_name} must share the head dim d: q {q.shape}, "
            f"{k_name} {k_cache.shape}"
        )
    h_kv = k_cache.shape[2]
    group = kv_group(h_q, h_kv)
    causal, return_lse = (
        check_bool("causal", causal),
        check_bool("return_lse", return_lse),
    )
    scale = check_scale(scale_name, scale, d)
    splits = max(1, check_int("num_splits", num_splits, 0))
    left, right = _check_window(window_size)
    if causal:
        right = 0
    cap = _check_softcap(softcap)
    slopes = None
    if alibi_slopes is not None:
        slopes = _check_per_head("alibi_slopes", alibi_slopes, B, h_q, True)
    sink = None if sinks is None else _check_per_head("sinks", sinks, B, h_q, False)
    if (k_descale is None) != (v_descale is None):
        raise ValueError("pass k_descale and v_descale together (or neither)")
    if k_descale is not None:
        kd = _check_descale("k_descale", k_descale, B, h_kv, k_cache, k_name)
        vd = _check_descale("v_descale", v_descale, B, h_kv, v_cache, v_name)
    lens = _int_array("cache_seqlens", cache_seqlens, 1)
    if lens.shape != (B,):
        raise ValueError(f"cache_seqlens must be (B,) = ({B},), got {lens.shape}")
    if block_table is None:
        capacity = k_cache.shape[1]
        if k_cache.shape[0] != B:
            raise ValueError(
                f"without a block_table, {k_name} must be (B, N_max, H_kv, "
                f"d) with B = {B}, got {k_cache.shape}"
            )
    else:
        table = _int_array("block_table", block_table, 2)
        if table.shape[0] != B:
            raise ValueError(
                f"block_table must be (B, max_pages) with B = {B}, got {table.shape}"
            )
        page = k_cache.shape[1]
        capacity = table.shape[1] * page
    if lens.size and (lens.min() < 0 or lens.max() > capacity):
        raise ValueError(
            f"cache_seqlens must be in 0..{capacity} (the cache's "
            f"capacity per sequence), got {lens.tolist()}"
        )
    if ((lens > 0) & (lens < n_q)).any():
        # the queries are the sequence's last N_q positions: as kernels.decode, a
        # sequence holds them all or is an empty slot (0)
        raise ValueError(
            f"cache_seqlens counts the N_q = {n_q} new tokens: each must "
            f"be 0 (an empty slot) or >= {n_q}, got {lens.tolist()}"
        )
    d_v = v_cache.shape[3]
    out = np.empty((B, h_q, n_q, d_v))  # (B, H_q, N_q, d_v)
    lse = np.empty((B, h_q, n_q))  # (B, H_q, N_q)
    for b in range(B):
        n = int(lens[b])
        if block_table is None:
            k, v = k_cache[b, :n], v_cache[b, :n]  # (n, H_kv, d)
        else:
            pages = table[b, : -(-n // page)]
            if pages.size and (pages.min() < 0 or pages.max() >= k_cache.shape[0]):
                raise ValueError(
                    f"block_table[{b}] points outside the pool of "
                    f"{k_cache.shape[0]} pages: {pages.tolist()}"
                )
            k = k_cache[pages].reshape(-1, *k_cache.shape[2:])[:n]  # (n, H_kv, d)
            v = v_cache[pages].reshape(-1, *v_cache.shape[2:])[:n]
        if k_descale is not None:
            k, v = k * kd[b][:, None], v * vd[b][:, None]  # K = cache * descale
        k = np.repeat(k.transpose(1, 0, 2), group, axis=0)  # (H_q, n, d)
        v = np.repeat(v.transpose(1, 0, 2), group, axis=0)
        s = q[b].transpose(1, 0, 2) @ k.transpose(0, 2, 1) * scale  # (H_q, N_q, n)
        if cap > 0:
            s = cap * np.tanh(s / cap)
        i = np.arange(n - n_q, n)[:, None]  # (N_q, 1) query positions
        j = np.arange(n)[None, :]  # (1, n) key positions
        if slopes is not None:
            s = s - slopes[b][:, None, None] * np.abs(i - j)
        keep = np.ones((n_q, n), dtype=bool)
        if left >= 0:
            keep &= j >= i - left
        if right >= 0:
            keep &= j <= i + right
        per = max(1, -(-n // splits))
        parts = [
            _chunk_partial(s[..., a : a + per], keep[:, a : a + per], v[:, a : a + per])
            for a in range(0, max(n, 1), per)
        ]
        if sink is not None:  # a key of score `sink` and value 0
            sink_lse = np.broadcast_to(sink[b][:, None], (h_q, n_q))
            parts.append((np.zeros((h_q, n_q, d_v)), sink_lse))
        out[b], lse[b] = merge_partials([o for o, _ in parts], [x for _, x in parts])
    out = out.transpose(0, 2, 1, 3)  # (B, N_q, H_q, d_v)
    return (out, lse) if return_lse else out


def mla_with_kvcache(
    q,
    kv_cache,
    cache_seqlens,
    block_table=None,
    head_dim_v: int = 512,
    scale: float | None = None,
    causal: bool = True,
    return_lse: bool = False,
    *,
    softmax_scale: float | None = None,
):
    """Multi-head latent attention's decode (DeepSeek-V2/V3, FlashMLA's
    ``flash_mla_with_kvcache`` in this book's argument order) in float64 NumPy.

    The projections are absorbed: each token's cache is one latent row of width
    D = head_dim_v + rope dim (DeepSeek-V3: 512 + 64 = 576), its keys; its values are
    that row's first ``head_dim_v`` columns; every query head reads the same row (an
    MQA with d = D). q (B, N_q, H_q, D); kv_cache (B, N_max, 1, D), or pages
    (num_pages, page_size, 1, D) with ``block_table``; ``scale`` defaults to
    1/sqrt(D) (``softmax_scale``, the kernel's name, is accepted with a
    DeprecationWarning). Returns out (B, N_q, H_q, head_dim_v), and lse (B, H_q, N_q)
    with ``return_lse``.
    """
    scale, scale_name = _renamed_scale(scale, softmax_scale, "mla_with_kvcache")
    kv = as_real_array("kv_cache", kv_cache)
    if kv.ndim != 4 or kv.shape[2] != 1:
        raise ValueError(
            f"kv_cache must be (B, N_max, 1, D) or (num_pages, page_size, 1, D): one "
            f"latent row a token, got shape {kv.shape}"
        )
    dv = check_int("head_dim_v", head_dim_v, 1)
    if dv > kv.shape[3]:
        raise ValueError(
            f"head_dim_v={dv} exceeds the latent row's width D = {kv.shape[3]}"
        )
    return _with_kvcache(
        q, kv, kv[..., :dv], cache_seqlens, block_table, causal, scale, scale_name,
        0, return_lse, (-1, -1), 0.0, None, None, None, None,
        "kv_cache", "kv_cache",
    )  # fmt: skip


def cascade_attention(
    q, k_prefix, v_prefix, k_cache, v_cache, cache_seqlens, scale=None
):
    """Cascade attention (FlashInfer's; SGLang and vLLM ship it for shared prompts): B
    requests share a ``prefix`` of P tokens, ``k_prefix, v_prefix (P, H_kv, d)`` stored
    once, and own suffixes in ``k_cache, v_cache (B, N_max, H_kv, d)`` of
    ``cache_seqlens`` tokens (the N_q new ones included). One partial over the shared
    prefix for all B N_q H_q rows (the prefix read once: every row sees all of it), one
    per request over its suffix (causal), merged by ``attention.core.merge_partials``.
    Returns (out (B, N_q, H_q, d), lse (B, H_q, N_q)): attention over prefix + suffix.
    """
    q = as_real_array("q", q, 4)
    kp, vp = (
        as_real_array("k_prefix", k_prefix, 3),
        as_real_array("v_prefix", v_prefix, 3),
    )
    if kp.ndim != 3 or kp.shape != vp.shape or kp.shape[1:] != np.shape(k_cache)[2:]:
        raise ValueError(
            f"k_prefix and v_prefix must be (P, H_kv, d) matching the cache's "
            f"(H_kv, d), got {kp.shape}, {vp.shape} against {np.shape(k_cache)}"
        )
    B, n_q, h_q, d = q.shape
    group = kv_group(h_q, kp.shape[1])
    scale = check_scale("scale", scale, d)
    o_s, lse_s = attention_with_kvcache(
        q, k_cache, v_cache, cache_seqlens, scale=scale, return_lse=True
    )
    k = np.repeat(kp.transpose(1, 0, 2), group, axis=0)  # (H_q, P, d)
    v = np.repeat(vp.transpose(1, 0, 2), group, axis=0)
    rows = q.transpose(2, 0, 1, 3).reshape(h_q, B * n_q, d)  # every request's rows
    keep = np.ones((1, kp.shape[0]), dtype=bool)
    o_p, lse_p = _chunk_partial(rows @ k.transpose(0, 2, 1) * scale, keep, v)
    o_p = o_p.reshape(h_q, B, n_q, d).transpose(1, 2, 0, 3)  # (B, N_q, H_q, d)
    lse_p = lse_p.reshape(h_q, B, n_q).transpose(1, 0, 2)  # (B, H_q, N_q)
    o, lse = merge_partials(
        [o_p.transpose(0, 2, 1, 3), o_s.transpose(0, 2, 1, 3)], [lse_p, lse_s]
    )
    return o.transpose(0, 2, 1, 3), lse
