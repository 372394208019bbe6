"""Scaled dot-product attention in NumPy: softmax, the log-sum-exp merge of partial
softmaxes, masks, self-, cross- and multi-head attention.

Shapes follow the kernels: a single head is ``(..., N, d)``; multi-head tensors are
``(B, H, N, d)``. Masks are boolean with ``True`` meaning *may attend*.

Two rules hold for every function here and in the rest of the package, as in the
kernels:

* a query row whose mask hides every key gets weights 0,
  output 0 and lse -inf (never NaN);
* a NaN in a row's inputs (or a +inf score, where softmax is undefined) gives NaN in
  that row's weights, output and lse, and only there. The two are never confused.

Masked positions are *selected out*, never multiplied by 0: a NaN or inf in a value row
that a query cannot see does not reach that query's output.

Public functions check their arguments first and raise ``TypeError`` (wrong kind: a
string where a bool belongs, a float where an int belongs, a non-numeric array) or
``ValueError`` (wrong shape or range), naming the argument and the expected shape
(the checks are ``attention.checks``).
"""

from __future__ import annotations

import numpy as np

from .checks import (
    as_mask,
    as_real_array,
    check_axis,
    check_bool,
    check_int,
    check_scale,
)

# ---------------------------------------------------------------------------------
# Softmax
# ---------------------------------------------------------------------------------


def naive_softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """softmax(x)_i = exp(x_i) / sum_j exp(x_j), computed literally
    (overflows for large x)."""
    e = np.exp(x)
    return e / e.sum(axis=axis, keepdims=True)


def softmax(
    x: np.ndarray, axis: int = -1, mask: np.ndarray | None = None
) -> np.ndarray:
    """Numerically stable softmax: subtract the row max before exponentiating.

    softmax(x) = softmax(x - c) for any constant c; with c = max(x) every exponent is
    <= 0, so exp never overflows and the largest term is exactly 1. Positions where
    ``mask`` is False get probability 0; a row with no True entry is all zeros. A row
    with a NaN (or a +inf, where the softmax is undefined) at a visible position is all
    NaN. An empty axis gives an empty result.
    """
    x = as_real_array("x", x)
    if x.ndim == 0:
        raise ValueError("x must have at least one axis, got a scalar")
    axis = check_axis("axis", axis, x.ndim)
    if mask is not None:
        x = np.where(as_mask("mask", mask, x.shape), x, -np.inf)
    if x.shape[axis] == 0:
        return x.copy()
    m = np.max(x, axis=axis, keepdims=True)  # NaN if the row has a NaN
    bad = np.isnan(m) | np.isposinf(m)  # NaN, or +inf: inf - inf is undefined
    m = np.where(np.isfinite(m), m, 0.0)  # fully masked row: avoid (-inf) - (-inf)
    with np.errstate(invalid="ignore"):
        e = np.exp(x - m)
        s = e.sum(axis=axis, keepdims=True)
        out = np.divide(e, s, out=np.zeros_like(e), where=s > 0)
    return np.where(bad, np.nan, out)


def logsumexp(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """log(sum(exp(x))) along ``axis``, stably; -inf for an all -inf (or empty) row, NaN
    for a row with a NaN, +inf for a row with a +inf."""
    x = as_real_array("x", x)
    if x.ndim == 0:
        raise ValueError("x must have at least one axis, got a scalar")
    axis = check_axis("axis", axis, x.ndim)
    if x.shape[axis] == 0:
        return np.full(x.shape[:axis] + x.shape[axis + 1 :], -np.inf, dtype=x.dtype)
    m = np.max(x, axis=axis, keepdims=True)
    m_safe = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(invalid="ignore"):
        s = np.exp(x - m_safe).sum(axis=axis, keepdims=True)
    with np.errstate(divide="ignore"):
        out = np.log(s) + m_safe
    out = np.where(np.isposinf(m), np.inf, out)
    return np.squeeze(out, axis=axis)


def merge_partials(o_parts, lse_parts):
    """The log-sum-exp merge of S partial softmaxes over disjoint key chunks.

    ``o_parts (S, ..., N_q, d)``, ``lse_parts (S, ..., N_q)`` (or sequences of S
    arrays of one shape each). With m = max_s lse_s and w_s = exp(lse_s - m):

        lse = m + log(sum_s w_s),   o = sum_s w_s o_s / sum_s w_s

    equal to attention over the union of the chunks: chapter 2's online softmax across
    tiles, chapter 5's split-KV across programs, chapter 6's ring across devices. A
    chunk with lse_s = -inf (it saw no key) has w_s = 0 and is *selected out* (its o_s
    is never multiplied in); if every chunk is empty, o = 0 and lse = -inf. A NaN lse_s
    (or +inf), or a NaN in an o_s of weight > 0, gives NaN in that row.
    """
    o = _stack("o_parts", o_parts, 3)
    lse = _stack("lse_parts", lse_parts, 2)
    if o.shape[:-1] != lse.shape:
        raise ValueError(
            f"o_parts (S, ..., N_q, d) and lse_parts (S, ..., N_q) "
            f"disagree: o_parts {o.shape}, lse_parts {lse.shape}"
        )
    bad = np.isnan(lse).any(axis=0) | np.isposinf(lse).any(axis=0)  # (..., N_q)
    m = np.max(np.where(np.isnan(lse), -np.inf, lse), axis=0)  # (..., N_q)
    empty = np.isneginf(m)
    m_safe = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(invalid="ignore"):
        w = np.exp(lse - m_safe)  # (S, ..., N_q); 0 for an empty chunk
    seen = w > 0
    with np.errstate(invalid="ignore"):
        terms = np.where(seen[..., None], w[..., None] * o, 0.0)  # (S, ..., N_q, d)
    total = w.sum(axis=0)  # (..., N_q); >= 1 unless every chunk is empty
    safe = np.where(empty, 1.0, total)
    out = np.where(empty[..., None], 0.0, terms.sum(axis=0) / safe[..., None])
    with np.errstate(divide="ignore"):
        lse_out = np.where(empty, -np.inf, m_safe + np.log(safe))
    out = np.where(bad[..., None], np.nan, out)
    lse_out = np.where(bad, np.nan, lse_out)
    return out, lse_out


def _stack(name, parts, min_ndim):
    """S parts as one (S, ...) real array: a list of arrays of one shape, or an array
    already stacked. A ragged list is a ValueError naming ``name`` and the shapes."""
    if isinstance(parts, (list, tuple)):
        if not parts:
            raise ValueError(f"{name} must hold at least one part, got none")
        arrs = [as_real_array(f"{name}[{i}]", p) for i, p in enumerate(parts)]
        shapes = {a.shape for a in arrs}
        if len(shapes) > 1:
            raise ValueError(
                f"{name} must hold parts of one shape, got shapes "
                f"{[a.shape for a in arrs]}"
            )
        parts = np.stack(arrs)
    a = as_real_array(name, parts, min_ndim)
    if a.shape[0] == 0:
        raise ValueError(f"{name} must hold at least one part, got shape {a.shape}")
    return a


# ---------------------------------------------------------------------------------
# Weights times values (the masked terms selected out)
# ---------------------------------------------------------------------------------


def weighted_sum(
    p: np.ndarray, v: np.ndarray, keep: np.ndarray | None = None
) -> np.ndarray:
    """o = sum_j p_ij v_j over the *kept* j only: (..., N_q, N_k) x (..., N_k, d_v).

    ``p @ v`` multiplies a hidden weight 0 by the hidden value, and 0 * NaN = NaN: a NaN
    or inf in a value row would reach queries that cannot see it. When every value is
    finite that product is exactly 0, so the matmul is used; otherwise the hidden terms
    are selected out before summing (the kernels do the same).
    """
    if keep is None or np.all(np.isfinite(v)):
        return p @ v
    keep = np.broadcast_to(keep, p.shape)
    # 0 * inf at hidden terms, selected out right here
    with np.errstate(invalid="ignore"):
        terms = np.where(keep[..., None], p[..., None] * v[..., None, :, :], 0.0)
    return terms.sum(axis=-2)


# ---------------------------------------------------------------------------------
# Masks and scaled dot-product attention
# ---------------------------------------------------------------------------------


def causal_mask(n_q: int, n_k: int | None = None) -> np.ndarray:
    """Boolean (n_q, n_k) mask, True where query i may see key j.

    Aligned bottom-right (the FlashAttention-2 convention): query i sees keys
    ``j <= i + n_k - n_q``. For n_q == n_k this is the usual lower triangle. When
    n_q > n_k the first ``n_q - n_k`` query rows see no key at all.
    """
    n_q = check_int("n_q", n_q, 0)
    n_k = n_q if n_k is None else check_int("n_k", n_k, 0)
    i = np.arange(n_q)[:, None]
    j = np.arange(n_k)[None, :]
    return j <= i + (n_k - n_q)


def padding_mask(lengths, n_k: int) -> np.ndarray:
    """Key padding mask of shape (B, 1, n_k): True for the first ``lengths[b]``
    keys of batch b.

    Broadcasts against scores of shape (B, n_q, n_k).
    """
    n_k = check_int("n_k", n_k, 0)
    lengths = np.asarray(lengths)
    if lengths.ndim != 1 or not (
        np.issubdtype(lengths.dtype, np.integer) or lengths.size == 0
    ):
        raise TypeError(
            "lengths must be a 1-D sequence of ints (B,), got dtype "
            f"{lengths.dtype} shape {lengths.shape}"
        )
    if lengths.size and (lengths.min() < 0 or lengths.max() > n_k):
        raise ValueError(f"lengths must be in 0..n_k={n_k}, got {lengths.tolist()}")
    return (np.arange(n_k)[None, :] < lengths[:, None])[:, None, :]


def _lead_shape(*arrays_and_names) -> tuple:
    shapes = [a.shape[:-2] for _, a in arrays_and_names]
    try:
        return np.broadcast_shapes(*shapes)
    except ValueError:
        desc = ", ".join(f"{n} {a.shape}" for n, a in arrays_and_names)
        raise ValueError(f"leading (batch, head) dims must broadcast: {desc}") from None


def _check_qkv(q, k, v) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple]:
    """q (..., N_q, d), k (..., N_k, d), v (..., N_k, d_v) as real arrays; returns the
    broadcast leading shape too."""
    q, k, v = (as_real_array(n, t, 2) for n, t in (("q", q), ("k", k), ("v", v)))
    if k.shape[-1] != q.shape[-1]:
        raise ValueError(f"q and k must share the head dim: q {q.shape}, k {k.shape}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(
            f"k and v must have the same length N_k: k {k.shape}, v {v.shape}"
        )
    lead = _lead_shape(("q", q), ("k", k), ("v", v))
    return q, k, v, lead


def attention_keep(n_q: int, n_k: int, causal: bool, mask=None, shape=None):
    """The keep-mask (True = may attend) from ``causal`` and ``mask``,
    or None for "all"."""
    keep = causal_mask(n_q, n_k) if causal else None
    if mask is not None:
        shape = (n_q, n_k) if shape is None else tuple(shape)
        m = np.asarray(mask)
        # a mask may carry extra leading dims, e.g. (B, 1, 1, N_k) against (N_q, N_k)
        try:
            full = np.broadcast_shapes(shape, m.shape)
        except ValueError:
            full = None
        if full is None or full[-2:] != shape[-2:]:
            raise ValueError(
                f"mask of shape {m.shape} does not broadcast to the "
                f"scores' shape {shape} (..., N_q, N_k)"
            )
        m = as_mask("mask", m, full)
        keep = m if keep is None else (keep & m)
    return keep


def scaled_dot_product_attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    mask: np.ndarray | None = None,
    causal: bool = False,
    scale: float | None = None,
    return_weights: bool = False,
):
    """softmax(q k^T * scale) v over the last two axes.

    q: (..., N_q, d), k: (..., N_k, d), v: (..., N_k, d_v). ``scale`` defaults to
    1/sqrt(d). ``mask`` (broadcastable to (..., N_q, N_k), True = keep) and ``causal``
    (bottom-right aligned) combine. Returns o (..., N_q, d_v) and, optionally, the
    weights P (..., N_q, N_k).
    """
    q, k, v, lead = _check_qkv(q, k, v)
    causal = check_bool("causal", causal)
    return_weights = check_bool("return_weights", return_weights)
    # A Python float keeps the inputs' dtype
    # (a NumPy float64 scalar would upcast float32).
    scale = check_scale("scale", scale, q.shape[-1])
    s = (q @ np.swapaxes(k, -1, -2)) * scale  # (..., N_q, N_k)
    keep = attention_keep(q.shape[-2], k.shape[-2], causal, mask, s.shape)
    if keep is not None:  # a mask may add leading dims
        s = np.broadcast_to(s, np.broadcast_shapes(s.shape, keep.shape))
    p = softmax(s, axis=-1, mask=keep)  # (..., N_q, N_k)
    o = weighted_sum(p, v, keep)  # (..., N_q, d_v)
    return (o, p) if return_weights else o


def self_attention(x, w_q, w_k, w_v, causal=False, mask=None, return_weights=False):
    """Self-attention: queries, keys and values all come from the same
    sequence x (N, d_model)."""
    x = as_real_array("x", x, 2)
    for name, w in (("w_q", w_q), ("w_k", w_k), ("w_v", w_v)):
        _check_weight(name, w, x.shape[-1])
    q, k, v = x @ w_q, x @ w_k, x @ w_v  # each (N, d)
    return scaled_dot_product_attention(
        q, k, v, mask=mask, causal=causal, return_weights=return_weights
    )


def _check_weight(name, w, d_in):
    w = as_real_array(name, w)
    if w.ndim != 2 or w.shape[0] != d_in:
        raise ValueError(
            f"{name} must be (d_model, d) with d_model={d_in}, got shape {w.shape}"
        )
    return w


def cross_attention(x_dec, x_enc, w_q, w_k, w_v, mask=None, return_weights=False):
    """Cross-attention: m decoder queries (m, d_model) over n encoder states
    (n, d_model)."""
    x_dec, x_enc = as_real_array("x_dec", x_dec, 2), as_real_array("x_enc", x_enc, 2)
    _check_weight("w_q", w_q, x_dec.shape[-1])
    for name, w in (("w_k", w_k), ("w_v", w_v)):
        _check_weight(name, w, x_enc.shape[-1])
    q = x_dec @ w_q  # (m, d)
    k, v = x_enc @ w_k, x_enc @ w_v  # (n, d)
    return scaled_dot_product_attention(
        q, k, v, mask=mask, return_weights=return_weights
    )


def split_heads(x: np.ndarray, n_heads: int) -> np.ndarray:
    """(B, N, H*d) -> (B, H, N, d)."""
    x = np.asarray(x)
    n_heads = check_int("n_heads", n_heads, 1)
    if x.ndim != 3:
        raise ValueError(f"x must be (B, N, H*d), got shape {x.shape}")
    b, n, dm = x.shape
    if dm % n_heads:
        raise ValueError(f"model dim {dm} is not divisible by n_heads={n_heads}")
    return x.reshape(b, n, n_heads, dm // n_heads).transpose(0, 2, 1, 3)


def merge_heads(x: np.ndarray) -> np.ndarray:
    """(B, H, N, d) -> (B, N, H*d)."""
    x = np.asarray(x)
    if x.ndim != 4:
        raise ValueError(f"x must be (B, H, N, d), got shape {x.shape}")
    b, h, n, d = x.shape
    return x.transpose(0, 2, 1, 3).reshape(b, n, h * d)


def multi_head_attention(
    x_q,
    x_kv,
    w_q,
    w_k,
    w_v,
    w_o,
    n_heads,
    causal=False,
    mask=None,
    return_weights=False,
):
    """Multi-head attention: H independent heads of width d = d_model / H, then W_o.

    x_q: (B, N_q, d_model) queries; x_kv:
    (B, N_k, d_model) keys/values (x_kv is x_q for self-attention).
    Weights are (d_model, d_model). ``mask`` broadcasts to (B, H, N_q, N_k).
    Returns (B, N_q, d_model) and optionally the (B, H, N_q, N_k) weights.
    """
    x_q, x_kv = as_real_array("x_q", x_q), as_real_array("x_kv", x_kv)
    for name, x in (("x_q", x_q), ("x_kv", x_kv)):
        if x.ndim != 3:
            raise ValueError(f"{name} must be (B, N, d_model), got shape {x.shape}")
    if x_kv.shape[0] != x_q.shape[0] or x_kv.shape[2] != x_q.shape[2]:
        raise ValueError(
            f"x_kv must be (B, N_k, d_model) = ({x_q.shape[0]}, N_k, "
            f"{x_q.shape[2]}) like x_q {x_q.shape}, got {x_kv.shape}"
        )
    dm = x_q.shape[2]
    for name, w in (("w_q", w_q), ("w_k", w_k), ("w_v", w_v), ("w_o", w_o)):
        _check_weight(name, w, dm)
    q = split_heads(x_q @ w_q, n_heads)  # (B, H, N_q, d)
    k = split_heads(x_kv @ w_k, n_heads)  # (B, H, N_k, d)
    v = split_heads(x_kv @ w_v, n_heads)  # (B, H, N_k, d)
    o, p = scaled_dot_product_attention(
        q, k, v, mask=mask, causal=causal, return_weights=True
    )
    out = merge_heads(o) @ w_o  # (B, N_q, d_model)
    return (out, p) if check_bool("return_weights", return_weights) else out


def attention_flops(n_q: int, n_k: int, d: int, causal: bool = False) -> int:
    """Matmul FLOPs of one head's forward: 2·N_q·N_k·d for S = QK^T plus
    the same for PV.

    Halved when causal, the convention benchmarks use (exact only as N_q = N_k grows;
    for N_q != N_k the bottom-right mask keeps a different fraction).
    """
    n_q, n_k = check_int("n_q", n_q, 0), check_int("n_k", n_k, 0)
    d = check_int("d", d, 0)
    f = 4 * n_q * n_k * d
    return f // 2 if check_bool("causal", causal) else f
