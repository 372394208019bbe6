"""Positional encodings in NumPy: the Transformer's sinusoidal table and rotary
position embeddings (RoPE), with the score of a rotated query-key pair.

Sinusoidal (Vaswani et al., 2017): PE[t, 2i] = sin(t w_i), PE[t, 2i+1] = cos(t w_i)
with w_i = base^(-2i/d), added to the token embeddings.

RoPE (Su et al., 2021): coordinates (2i, 2i+1) of a query or key at position t turn by
the angle t theta_i, theta_i = base^(-2i/d), the interleaved pairs of the RoFormer
paper. Rotations compose, R_m^T R_n = R_(n-m), so a rotated query at m and a rotated key
at n score q^T R_(n-m) k: a function of the offset alone (``rope_score``).
"""

from __future__ import annotations

import numpy as np

from .checks import as_real_array, check_int

DEFAULT_BASE = 10000.0


def _check_base(base) -> float:
    if isinstance(base, bool) or not isinstance(base, (int, float)) or not base > 1:
        raise ValueError(f"base must be a number > 1, got {base!r}")
    return float(base)


def frequencies(d: int, base: float = DEFAULT_BASE) -> np.ndarray:
    """The d/2 angular frequencies base^(-2i/d), i = 0 .. d/2 - 1, fastest first."""
    d = check_int("d", d, 2)
    if d % 2:
        raise ValueError(f"d must be even (coordinates come in pairs), got {d}")
    return _check_base(base) ** (-np.arange(0, d, 2) / d)  # (d / 2,)


def sinusoidal_table(
    n_positions: int, d: int, base: float = DEFAULT_BASE
) -> np.ndarray:
    """The (n_positions, d) sinusoidal table: sin in even columns, cos in odd ones."""
    n_positions = check_int("n_positions", n_positions, 1)
    w = frequencies(d, base)  # (d / 2,)
    t = np.arange(n_positions, dtype=float)[:, None]  # (n, 1)
    pe = np.empty((n_positions, d))
    pe[:, 0::2], pe[:, 1::2] = np.sin(t * w), np.cos(t * w)
    return pe


def rope(x, positions=None, base: float = DEFAULT_BASE) -> np.ndarray:
    """x: (..., N, d), d even, rotated pair by pair: (x_2i, x_2i+1) by positions[t]
    theta_i at row t. ``positions``: (N,) numbers (default 0 .. N-1)."""
    x = as_real_array("x", x, 2)
    n, d = x.shape[-2], x.shape[-1]
    if d % 2:
        raise ValueError(f"x's last axis must be even (coordinate pairs), got {d}")
    pos = (
        np.arange(n, dtype=float)
        if positions is None
        else as_real_array("positions", positions, 1)
    )
    if pos.shape != (n,):
        raise ValueError(
            f"positions must have shape ({n},) like x's rows, got {pos.shape}"
        )
    ang = pos[:, None] * frequencies(d, base)  # (N, d / 2)
    c, s = np.cos(ang), np.sin(ang)
    x1, x2 = x[..., 0::2], x[..., 1::2]  # (..., N, d / 2)
    out = np.empty(np.broadcast_shapes(x.shape), dtype=np.result_type(x, float))
    out[..., 0::2] = x1 * c - x2 * s
    out[..., 1::2] = x1 * s + x2 * c
    return out


def rope_score(q, k, m, n, base: float = DEFAULT_BASE) -> np.ndarray:
    """q_m' . k_n': the dot product of q (d,) rotated to position(s) m and k (d,)
    rotated to position(s) n; m and n broadcast against each other."""
    q, k = as_real_array("q", q, 1), as_real_array("k", k, 1)
    if q.ndim != 1 or q.shape != k.shape:
        raise ValueError(
            f"q and k must be two vectors of one length, got {q.shape} and {k.shape}"
        )
    m, n = np.broadcast_arrays(np.asarray(m, dtype=float), np.asarray(n, dtype=float))
    mf, nf = m.ravel(), n.ravel()
    qr = rope(np.broadcast_to(q, (mf.size, q.size)), mf, base)  # (P, d)
    kr = rope(np.broadcast_to(k, (nf.size, k.size)), nf, base)
    return (qr * kr).sum(axis=-1).reshape(m.shape)
