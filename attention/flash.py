"""FlashAttention in NumPy: online softmax, the tiled forward (FA1 and FA2 loop orders)
and the backward with and without recomputation. The math of ``kernels.flash``.

Every function here is exact: in float64 it equals the plain (materialising) version to
~1e-15 relative; the tests hold them to 1e-12. Arrays are ``(..., N, d)`` (leading axes,
e.g. ``(B, H)``, broadcast through); queries ``q: (..., N_q, d)``, keys ``k: (..., N_k,
d)``, values ``v: (..., N_k, d_v)``. ``scale`` defaults to 1/sqrt(d). ``causal=True``
aligns the mask bottom-right (query i sees keys j <= i + N_k - N_q), as
``attention.core.causal_mask`` and the kernels do. A query row that sees no key gets
output 0 and lse = -inf, never NaN; a NaN in a row's inputs gives NaN in that row's
output and lse, and only there: the causal mask *selects* (a NaN in a value row hidden
from a query never reaches it), so no result depends on the block sizes Br, Bc.

Block loops mirror the GPU: ``Br`` query rows (the kernel's BLOCK_M) by ``Bc`` keys (its
BLOCK_N); the last block of either may be ragged. NumPy arrays play HBM; the per-block
locals play SRAM. Tiles that the causal mask hides completely are skipped, as the kernel
skips them.
"""

from __future__ import annotations

import numpy as np

from .checks import as_real_array, check_bool, check_int, check_scale
from .core import attention_keep, logsumexp, softmax, weighted_sum

# ---------------------------------------------------------------------------------
# Online softmax: three passes, then two, then one (fused with the product by V).
# Each loops over the columns of x (the keys) one block at a time, vectorised over rows.
# ---------------------------------------------------------------------------------


def _col_blocks(n: int, block: int):
    block = check_int("block", block, 1)
    return [(s, min(s + block, n)) for s in range(0, n, block)]


def _as_scores(name, x):
    """Scores as a float array with at least one axis
    (integers are computed in float64)."""
    x = as_real_array(name, x, 1)
    return x


def _safe(m):
    """Running max with -inf (a row that has seen nothing yet) replaced by 0."""
    return np.where(np.isneginf(m), 0.0, m)


def softmax_3pass(x: np.ndarray, block: int = 1) -> np.ndarray:
    """Safe softmax over the last axis in three passes over x.

    pass 1: m = max_j x_j;  pass 2: l = sum_j exp(x_j - m);  pass 3:
    y_j = exp(x_j - m) / l.
    """
    x = _as_scores("x", x)
    n = x.shape[-1]
    m = np.full(x.shape[:-1], -np.inf, dtype=x.dtype)
    for s, e in _col_blocks(n, block):  # pass 1: the row max
        m = np.maximum(m, x[..., s:e].max(axis=-1))
    m = _safe(m)  # an all -inf row: exp(-inf - 0) = 0, l = 0, y = 0
    l = np.zeros(x.shape[:-1], dtype=x.dtype)
    for s, e in _col_blocks(n, block):  # pass 2: the sum of exponentials
        l = l + np.exp(x[..., s:e] - m[..., None]).sum(axis=-1)
    y = np.empty_like(x)
    l_safe = np.where(l == 0, 1.0, l)[..., None]
    for s, e in _col_blocks(n, block):  # pass 3: normalise
        with np.errstate(invalid="ignore"):
            y[..., s:e] = np.exp(x[..., s:e] - m[..., None]) / l_safe
    return y


def softmax_2pass(x: np.ndarray, block: int = 1) -> np.ndarray:
    """Online softmax (Milakov & Gimelshein 2018):
    max and sum in ONE pass, then normalise.

    When the running max grows from m to m' the sum so far is rescaled:
    l' = l * exp(m - m') + sum_j exp(x_j - m').
    """
    x = _as_scores("x", x)
    n = x.shape[-1]
    m = np.full(x.shape[:-1], -np.inf, dtype=x.dtype)
    l = np.zeros(x.shape[:-1], dtype=x.dtype)
    for s, e in _col_blocks(n, block):  # pass 1: running max and rescaled sum together
        m_new = np.maximum(m, x[..., s:e].max(axis=-1))
        m_safe = _safe(m_new)  # rows that have seen only -inf so far
        with np.errstate(invalid="ignore"):
            l = l * np.exp(m - m_safe) + np.exp(x[..., s:e] - m_safe[..., None]).sum(
                axis=-1
            )
        m = m_new
    m = _safe(m)
    y = np.empty_like(x)
    l_safe = np.where(l == 0, 1.0, l)[..., None]  # an all -inf row: y = 0
    for s, e in _col_blocks(n, block):  # pass 2: normalise
        with np.errstate(invalid="ignore"):
            y[..., s:e] = np.exp(x[..., s:e] - m[..., None]) / l_safe
    return y


def softmax_1pass_attention(s: np.ndarray, v: np.ndarray, block: int = 1) -> np.ndarray:
    """o = softmax(s) @ v in ONE pass over the keys: running max,
    rescaled sum, rescaled acc.

    s: (..., N_q, N_k) scores, v: (..., N_k, d_v). The softmax is never normalised as a
    vector: the accumulator acc = sum_j exp(s_j - m) v_j is rescaled by exp(m - m') like
    l, and divided by l once at the end (d_v numbers per row instead of N_k).
    """
    s, v = as_real_array("s", s, 2), as_real_array("v", v, 2)
    n = s.shape[-1]
    if v.shape[-2] != n:
        raise ValueError(
            f"v must have N_k = {n} rows like s's last axis, got v {v.shape}"
        )
    rows = s.shape[:-1]
    m = np.full(rows, -np.inf, dtype=s.dtype)
    l = np.zeros(rows, dtype=s.dtype)
    lead = np.broadcast_shapes(s.shape[:-2], v.shape[:-2])
    acc = np.zeros((*lead, s.shape[-2], v.shape[-1]), dtype=np.result_type(s, v))
    for a, b in _col_blocks(n, block):
        m_new = np.maximum(m, s[..., a:b].max(axis=-1))
        m_safe = _safe(m_new)  # a row that has seen only -inf (hidden) scores so far
        with np.errstate(invalid="ignore"):
            alpha = np.exp(m - m_safe)  # rescales everything summed so far
            p = np.exp(s[..., a:b] - m_safe[..., None])  # (..., N_q, b - a)
        l = l * alpha + p.sum(axis=-1)
        # a -inf score hides its key: select it out rather than multiply 0
        # by its value row
        acc = acc * alpha[..., None] + weighted_sum(
            p, v[..., a:b, :], s[..., a:b] > -np.inf
        )
        m = m_new
    empty = (l == 0)[..., None]  # a row that saw no key: 0, not 0/0
    with np.errstate(invalid="ignore"):
        return np.where(empty, 0.0, acc / np.where(empty, 1.0, l[..., None]))


# ---------------------------------------------------------------------------------
# Validation shared by the forward and backward functions.
# ---------------------------------------------------------------------------------


def _check_qkv(q, k, v, Br=1, Bc=1):
    q, k, v = np.asarray(q), np.asarray(k), np.asarray(v)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.ndim < 2:
            raise ValueError(
                f"{name} must be at least 2-D (..., N, d), got shape {t.shape}"
            )
        if not np.issubdtype(t.dtype, np.floating):
            raise TypeError(
                f"{name} must be a floating-point array, got dtype {t.dtype}"
            )
    if k.shape[-1] != q.shape[-1]:
        raise ValueError(f"q and k must share the head dim: q {q.shape}, k {k.shape}")
    if v.shape[-2] != k.shape[-2]:
        raise ValueError(
            f"k and v must have the same length N_k: k {k.shape}, v {v.shape}"
        )
    try:
        np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    except ValueError:
        raise ValueError(
            f"leading (batch, head) dims must broadcast: q {q.shape}, "
            f"k {k.shape}, v {v.shape}"
        ) from None
    for name, b in (("Br", Br), ("Bc", Bc)):
        check_int(name, b, 1)
    return q, k, v


def _scale(q, scale):
    return check_scale("scale", scale, q.shape[-1])


def _check_shape(name, t, shape, doc):
    t = as_real_array(name, t)
    if t.shape != tuple(shape):
        raise ValueError(f"{name} must be {doc} = {tuple(shape)}, got shape {t.shape}")
    return t


def _tile_mask(r0, r1, c0, c1, n_q, n_k):
    """Causal (bottom-right) keep-mask of the (r0:r1, c0:c1) tile,
    or None if all visible."""
    offset = n_k - n_q
    if c1 - 1 <= r0 + offset:  # the tile's last key is visible to its first query
        return None
    return np.arange(c0, c1)[None, :] <= np.arange(r0, r1)[:, None] + offset  # (br, bc)


def _tile_hidden(r0, r1, c0, n_q, n_k):
    """True when the causal mask hides every entry of a tile starting at key c0."""
    return c0 > (r1 - 1) + (n_k - n_q)


# ---------------------------------------------------------------------------------
# Forward: the plain version, then FA1's and FA2's loop orders.
# ---------------------------------------------------------------------------------


def standard_forward(q, k, v, causal: bool = False, scale: float | None = None):
    """Standard attention, materialising S and P: returns (o, lse, p).

    o: (..., N_q, d_v); lse = logsumexp of each row of S:
    (..., N_q); p: (..., N_q, N_k).
    """
    q, k, v = _check_qkv(q, k, v)
    causal = check_bool("causal", causal)
    s = (q @ np.swapaxes(k, -1, -2)) * _scale(q, scale)  # (..., N_q, N_k)
    keep = attention_keep(q.shape[-2], k.shape[-2], causal)
    # (..., N_q, N_k); rows that see nothing are 0, NaN rows NaN
    p = softmax(s, mask=keep)
    lse = logsumexp(s if keep is None else np.where(keep, s, -np.inf))  # (..., N_q)
    return weighted_sum(p, v, keep), lse, p


def flash1_forward(
    q,
    k,
    v,
    Br: int = 64,
    Bc: int = 64,
    causal: bool = False,
    scale: float | None = None,
):
    """FlashAttention-1's Algorithm 1: K/V blocks outside,
    Q blocks inside. Returns (o, lse).

    O, l and m live "in HBM" (full arrays) and every (j, i) step reads O_i, l_i, m_i,
    updates them with the new block of keys and writes them back, O_i normalised each
    time:
        m_new = max(m_i, rowmax(S_ij));  P~ = exp(S_ij - m~_ij);  l~ = rowsum(P~)
        l_new = e^(m_i - m_new) l_i + e^(m~_ij - m_new) l~
        O_i  <- (l_i e^(m_i - m_new) O_i + e^(m~_ij - m_new) P~ V_j) / l_new
    """
    q, k, v = _check_qkv(q, k, v, Br, Bc)
    causal = check_bool("causal", causal)
    scale = _scale(q, scale)
    n_q, n_k = q.shape[-2], k.shape[-2]
    lead = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    dtype = np.result_type(q, k, v)
    o = np.zeros((*lead, n_q, v.shape[-1]), dtype=dtype)  # (..., N_q, d_v) in "HBM"
    l = np.zeros((*lead, n_q), dtype=dtype)
    m = np.full((*lead, n_q), -np.inf, dtype=dtype)
    for c0 in range(0, n_k, Bc):  # outer loop: K_j, V_j stay in SRAM
        c1 = min(c0 + Bc, n_k)
        k_j, v_j = k[..., c0:c1, :], v[..., c0:c1, :]
        for r0 in range(0, n_q, Br):  # inner loop: Q_i, O_i, l_i, m_i in and out
            r1 = min(r0 + Br, n_q)
            if causal and _tile_hidden(r0, r1, c0, n_q, n_k):
                continue
            q_i, o_i = q[..., r0:r1, :], o[..., r0:r1, :]
            l_i, m_i = l[..., r0:r1], m[..., r0:r1]
            s_ij = (q_i @ np.swapaxes(k_j, -1, -2)) * scale  # (..., br, bc)
            keep = _tile_mask(r0, r1, c0, c1, n_q, n_k) if causal else None
            if keep is not None:
                s_ij = np.where(keep, s_ij, -np.inf)
            m_t = s_ij.max(axis=-1)  # m~_ij, -inf where a row sees no key of this tile
            m_t_safe = np.where(np.isfinite(m_t), m_t, 0.0)
            with np.errstate(invalid="ignore"):
                p_t = np.exp(s_ij - m_t_safe[..., None])  # P~_ij, 0 at masked entries
            l_t = p_t.sum(axis=-1)
            m_new = np.maximum(m_i, m_t)
            m_new_safe = np.where(np.isfinite(m_new), m_new, 0.0)
            a_old = np.exp(np.where(np.isfinite(m_i), m_i, m_new_safe) - m_new_safe)
            # nothing seen yet: no old part
            a_old = np.where(np.isfinite(m_i), a_old, 0.0)
            a_new = np.where(np.isfinite(m_t), np.exp(m_t_safe - m_new_safe), 0.0)
            l_new = a_old * l_i + a_new * l_t
            num = (l_i * a_old)[..., None] * o_i + a_new[..., None] * weighted_sum(
                p_t, v_j, keep
            )
            # l_new = 0: nothing seen yet (o stays 0); NaN: a NaN row stays NaN
            inv = np.divide(1.0, l_new, out=np.zeros_like(l_new), where=l_new != 0)
            o[..., r0:r1, :] = inv[..., None] * num  # write O_i to HBM
            l[..., r0:r1] = l_new  # write l_i, m_i to HBM
            m[..., r0:r1] = m_new
    with np.errstate(divide="ignore", invalid="ignore"):
        lse = np.where(l == 0, -np.inf, m + np.log(np.where(l == 0, 1.0, l)))
    return o, lse


def flash2_forward(
    q,
    k,
    v,
    Br: int = 64,
    Bc: int = 64,
    causal: bool = False,
    scale: float | None = None,
):
    """FlashAttention-2's forward: Q blocks outside,
    K/V blocks inside. Returns (o, lse).

    Per query block, m_i, l_i and the UNnormalised accumulator acc stay in SRAM:
        m_new = max(m_i, rowmax(S_ij));  P~ = exp(S_ij - m_new)
        l_i <- e^(m_i - m_new) l_i + rowsum(P~);  acc <- e^(m_i - m_new) acc + P~ V_j
    and only at the end O_i = acc / l_i and L_i = m_i + log l_i are written, once.
    """
    q, k, v = _check_qkv(q, k, v, Br, Bc)
    causal = check_bool("causal", causal)
    scale = _scale(q, scale)
    n_q, n_k = q.shape[-2], k.shape[-2]
    lead = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    dtype = np.result_type(q, k, v)
    o = np.empty((*lead, n_q, v.shape[-1]), dtype=dtype)  # (..., N_q, d_v)
    lse = np.empty((*lead, n_q), dtype=dtype)  # (..., N_q)
    for r0 in range(0, n_q, Br):  # outer loop: Q_i, m_i, l_i, acc stay in SRAM
        r1 = min(r0 + Br, n_q)
        q_i = q[..., r0:r1, :]
        m_i = np.full((*lead, r1 - r0), -np.inf, dtype=dtype)
        l_i = np.zeros((*lead, r1 - r0), dtype=dtype)
        acc = np.zeros((*lead, r1 - r0, v.shape[-1]), dtype=dtype)  # (..., br, d_v)
        for c0 in range(0, n_k, Bc):  # inner loop: K_j, V_j stream through
            c1 = min(c0 + Bc, n_k)
            if causal and _tile_hidden(r0, r1, c0, n_q, n_k):
                break  # every later key block is hidden too
            k_j = k[..., c0:c1, :]  # (..., bc, d)
            s_ij = (q_i @ np.swapaxes(k_j, -1, -2)) * scale  # (..., br, bc)
            keep = _tile_mask(r0, r1, c0, c1, n_q, n_k) if causal else None
            if keep is not None:
                s_ij = np.where(keep, s_ij, -np.inf)
            m_new = np.maximum(m_i, s_ij.max(axis=-1))
            m_safe = np.where(np.isfinite(m_new), m_new, 0.0)  # rows with no key yet
            with np.errstate(invalid="ignore"):
                alpha = np.exp(m_i - m_safe)  # 0 when m_i = -inf
                p_ij = np.exp(s_ij - m_safe[..., None])  # (..., br, bc)
            l_i = alpha * l_i + p_ij.sum(axis=-1)
            acc = alpha[..., None] * acc + weighted_sum(p_ij, v[..., c0:c1, :], keep)
            m_i = m_new
        # a row that saw no key has l = 0 exactly: o = 0, lse = -inf.
        # A NaN row has l = NaN, which is not 0: it keeps its NaN in o and lse
        # (never mistaken for "no key").
        empty = l_i == 0
        with np.errstate(invalid="ignore"):
            o[..., r0:r1, :] = np.where(
                empty[..., None], 0.0, acc / np.where(empty, 1.0, l_i)[..., None]
            )
        with np.errstate(divide="ignore", invalid="ignore"):
            lse[..., r0:r1] = np.where(
                empty, -np.inf, m_i + np.log(np.where(empty, 1.0, l_i))
            )
    return o, lse


# ---------------------------------------------------------------------------------
# Backward: from the stored P, and FlashAttention-2's, recomputing P from Q, K and L.
# ---------------------------------------------------------------------------------


def standard_backward(q, k, v, p, do, scale: float | None = None):
    """Gradients of o = P V, P = softmax(scale Q K^T) from the stored P: (dq, dk, dv).

        dV = P^T dO;  dP = dO V^T;  dS = P o (dP - rowsum(P o dP));
        dQ = scale dS K;  dK = scale dS^T Q
    (a causal mask needs nothing extra: its zeros are in P).
    """
    q, k, v = _check_qkv(q, k, v)
    lead = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    n_q, n_k = q.shape[-2], k.shape[-2]
    p = _check_shape("p", p, (*lead, n_q, n_k), "(..., N_q, N_k)")
    do = _check_shape("do", do, (*lead, n_q, v.shape[-1]), "(..., N_q, d_v)")
    scale = _scale(q, scale)
    dv = np.swapaxes(p, -1, -2) @ do  # (..., N_k, d_v)
    dp = do @ np.swapaxes(v, -1, -2)  # (..., N_q, N_k)
    ds = p * (dp - (p * dp).sum(axis=-1, keepdims=True))  # (..., N_q, N_k)
    dq = scale * (ds @ k)  # (..., N_q, d)
    dk = scale * (np.swapaxes(ds, -1, -2) @ q)  # (..., N_k, d)
    return dq, dk, dv


def flash2_backward(
    q,
    k,
    v,
    o,
    lse,
    do,
    Br: int = 64,
    Bc: int = 64,
    causal: bool = False,
    scale: float | None = None,
    dlse=None,
):
    """FlashAttention-2's backward (Algorithm 2):
    P recomputed tile by tile from Q, K and L.

    D = rowsum(dO o O) replaces rowsum(P o dP) (they are equal: O = P V). Then, with K/V
    blocks outside and Q blocks inside:
        P_ij = exp(scale Q_i K_j^T - L_i);  dV_j += P_ij^T dO_i;  dP_ij = dO_i V_j^T
        dS_ij = P_ij o (dP_ij - D_i);  dQ_i += scale dS_ij K_j;  dK_j += scale dS_ij^T
        Q_i
    Returns (dq, dk, dv). Nothing of size N_q x N_k is ever stored.

    ``dlse`` (..., N_q), optional: a gradient on the returned lse as well. Since
    d lse_i / d S_ij = P_ij it enters as D_i <- D_i - dlse_i (the kernel does the same).
    """
    q, k, v = _check_qkv(q, k, v, Br, Bc)
    causal = check_bool("causal", causal)
    scale = _scale(q, scale)
    n_q, n_k = q.shape[-2], k.shape[-2]
    lead = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    o = _check_shape("o", o, (*lead, n_q, v.shape[-1]), "(..., N_q, d_v)")
    do = _check_shape("do", do, (*lead, n_q, v.shape[-1]), "(..., N_q, d_v)")
    lse = _check_shape("lse", lse, (*lead, n_q), "(..., N_q)")
    dtype = np.result_type(q, k, v, do)
    D = (do * o).sum(axis=-1)  # (..., N_q)
    if dlse is not None:
        D = D - _check_shape("dlse", dlse, (*lead, n_q), "(..., N_q)")
    lse_safe = np.where(np.isneginf(lse), np.inf, lse)  # rows that saw nothing: P = 0
    dq = np.zeros((*lead, n_q, q.shape[-1]), dtype=dtype)
    dk = np.zeros((*lead, n_k, k.shape[-1]), dtype=dtype)
    dv = np.zeros((*lead, n_k, v.shape[-1]), dtype=dtype)
    for c0 in range(0, n_k, Bc):  # outer: K_j, V_j, dK_j, dV_j stay in SRAM
        c1 = min(c0 + Bc, n_k)
        k_j, v_j = k[..., c0:c1, :], v[..., c0:c1, :]
        dk_j = np.zeros((*lead, c1 - c0, k.shape[-1]), dtype=dtype)
        dv_j = np.zeros((*lead, c1 - c0, v.shape[-1]), dtype=dtype)
        for r0 in range(0, n_q, Br):  # inner: Q_i, dO_i, L_i, D_i stream; dQ_i updated
            r1 = min(r0 + Br, n_q)
            if causal and _tile_hidden(r0, r1, c0, n_q, n_k):
                continue
            q_i, do_i = q[..., r0:r1, :], do[..., r0:r1, :]
            s_ij = (q_i @ np.swapaxes(k_j, -1, -2)) * scale  # (..., br, bc)
            p_ij = np.exp(s_ij - lse_safe[..., r0:r1, None])  # recomputed, exact
            keep = _tile_mask(r0, r1, c0, c1, n_q, n_k) if causal else None
            keep_t = None
            if keep is not None:  # hidden pairs are selected out, never 0 * (a NaN)
                p_ij = np.where(keep, p_ij, 0.0)
                keep_t = keep.T
            dv_j += weighted_sum(np.swapaxes(p_ij, -1, -2), do_i, keep_t)
            dp_ij = do_i @ np.swapaxes(v_j, -1, -2)  # (..., br, bc)
            ds_ij = p_ij * (dp_ij - D[..., r0:r1, None])
            if keep is not None:
                ds_ij = np.where(keep, ds_ij, 0.0)
            # read-modify-write
            dq[..., r0:r1, :] += scale * weighted_sum(ds_ij, k_j, keep)
            dk_j += scale * weighted_sum(np.swapaxes(ds_ij, -1, -2), q_i, keep_t)
        dk[..., c0:c1, :] = dk_j
        dv[..., c0:c1, :] = dv_j
    return dq, dk, dv
