"""Scaled dot-product attention in NumPy: softmax, masks, self-, cross- and multi-head attention.

Shapes follow the kernels: a single head is ``(..., N, d)``; multi-head tensors are
``(B, H, N, d)``. Masks are boolean with ``True`` meaning *may attend*. A query row
whose mask hides every key gets weights 0 and output 0 (never NaN), as the kernels do.
"""

from __future__ import annotations

import math

import numpy as np


def naive_softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """softmax(x)_i = exp(x_i) / sum_j exp(x_j), computed literally (overflows for large x)."""
    e = np.exp(x)
    return e / e.sum(axis=axis, keepdims=True)


def softmax(x: np.ndarray, axis: int = -1, mask: np.ndarray | None = None) -> np.ndarray:
    """Numerically stable softmax: subtract the row max before exponentiating.

    softmax(x) = softmax(x - c) for any constant c; with c = max(x) every exponent is
    <= 0, so exp never overflows and the largest term is exactly 1. Positions where
    ``mask`` is False get probability 0; a row with no True entry is all zeros.
    """
    x = np.asarray(x)
    if mask is not None:
        mask = np.broadcast_to(mask, x.shape)
        x = np.where(mask, x, -np.inf)
    m = np.max(x, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)  # fully masked row: avoid (-inf) - (-inf)
    e = np.exp(x - m)
    s = e.sum(axis=axis, keepdims=True)
    return np.divide(e, s, out=np.zeros_like(e), where=s > 0)


def logsumexp(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """log(sum(exp(x))) along ``axis``, stably; -inf for an all -inf row."""
    m = np.max(x, axis=axis, keepdims=True)
    m_safe = np.where(np.isfinite(m), m, 0.0)
    s = np.exp(x - m_safe).sum(axis=axis, keepdims=True)
    with np.errstate(divide="ignore"):
        out = np.log(s) + m_safe
    return np.squeeze(out, axis=axis)


def causal_mask(n_q: int, n_k: int | None = None) -> np.ndarray:
    """Boolean (n_q, n_k) mask, True where query i may see key j.

    Aligned bottom-right (the FlashAttention-2 convention): query i sees keys
    ``j <= i + n_k - n_q``. For n_q == n_k this is the usual lower triangle. When
    n_q > n_k the first ``n_q - n_k`` query rows see no key at all.
    """
    n_k = n_q if n_k is None else n_k
    i = np.arange(n_q)[:, None]
    j = np.arange(n_k)[None, :]
    return j <= i + (n_k - n_q)


def padding_mask(lengths, n_k: int) -> np.ndarray:
    """Key padding mask of shape (B, 1, n_k): True for the first ``lengths[b]`` keys of batch b.

    Broadcasts against scores of shape (B, n_q, n_k).
    """
    lengths = np.asarray(lengths)
    return (np.arange(n_k)[None, :] < lengths[:, None])[:, None, :]


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
    q, k, v = np.asarray(q), np.asarray(k), np.asarray(v)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.ndim < 2:
            raise ValueError(f"{name} must be at least 2-D (..., N, d), got shape {t.shape}")
    d = q.shape[-1]
    if k.shape[-1] != d:
        raise ValueError(f"q and k must share the head dim: q {q.shape}, k {k.shape}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v must have the same length: k {k.shape}, v {v.shape}")
    # A Python float keeps the inputs' dtype (a NumPy float64 scalar would upcast float32).
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    s = (q @ np.swapaxes(k, -1, -2)) * scale  # (..., N_q, N_k)
    keep = None
    if causal:
        keep = causal_mask(q.shape[-2], k.shape[-2])
    if mask is not None:
        keep = mask if keep is None else (keep & mask)
    p = softmax(s, axis=-1, mask=keep)  # (..., N_q, N_k)
    o = p @ v  # (..., N_q, d_v)
    return (o, p) if return_weights else o


def self_attention(x, w_q, w_k, w_v, causal=False, mask=None, return_weights=False):
    """Self-attention: queries, keys and values all come from the same sequence x (N, d_model)."""
    q, k, v = x @ w_q, x @ w_k, x @ w_v  # each (N, d)
    return scaled_dot_product_attention(
        q, k, v, mask=mask, causal=causal, return_weights=return_weights
    )


def cross_attention(x_dec, x_enc, w_q, w_k, w_v, mask=None, return_weights=False):
    """Cross-attention: m decoder queries (m, d_model) over n encoder states (n, d_model)."""
    q = x_dec @ w_q  # (m, d)
    k, v = x_enc @ w_k, x_enc @ w_v  # (n, d)
    return scaled_dot_product_attention(q, k, v, mask=mask, return_weights=return_weights)


def split_heads(x: np.ndarray, n_heads: int) -> np.ndarray:
    """(B, N, H*d) -> (B, H, N, d)."""
    b, n, dm = x.shape
    if dm % n_heads:
        raise ValueError(f"model dim {dm} is not divisible by n_heads={n_heads}")
    return x.reshape(b, n, n_heads, dm // n_heads).transpose(0, 2, 1, 3)


def merge_heads(x: np.ndarray) -> np.ndarray:
    """(B, H, N, d) -> (B, N, H*d)."""
    b, h, n, d = x.shape
    return x.transpose(0, 2, 1, 3).reshape(b, n, h * d)


def multi_head_attention(
    x_q, x_kv, w_q, w_k, w_v, w_o, n_heads, causal=False, mask=None, return_weights=False
):
    """Multi-head attention: H independent heads of width d = d_model / H, then W_o.

    x_q: (B, N_q, d_model) queries; x_kv: (B, N_k, d_model) keys/values (x_kv is x_q
    for self-attention). Weights are (d_model, d_model). ``mask`` broadcasts to
    (B, H, N_q, N_k). Returns (B, N_q, d_model) and optionally the (B, H, N_q, N_k) weights.
    """
    q = split_heads(x_q @ w_q, n_heads)  # (B, H, N_q, d)
    k = split_heads(x_kv @ w_k, n_heads)  # (B, H, N_k, d)
    v = split_heads(x_kv @ w_v, n_heads)  # (B, H, N_k, d)
    o, p = scaled_dot_product_attention(q, k, v, mask=mask, causal=causal, return_weights=True)
    out = merge_heads(o) @ w_o  # (B, N_q, d_model)
    return (out, p) if return_weights else out


def attention_flops(n_q: int, n_k: int, d: int, causal: bool = False) -> int:
    """Matmul FLOPs of one head's forward: 2·N_q·N_k·d for S = QK^T plus the same for PV.

    Halved when causal, the convention benchmarks use (exact only as N_q = N_k grows; for
    N_q != N_k the bottom-right mask keeps a different fraction).
    """
    f = 4 * n_q * n_k * d
    return f // 2 if causal else f
