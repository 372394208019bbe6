"""Learned sparse attention in NumPy: a hard choice of key blocks (or tokens) outside,
soft attention inside. One attention over chosen blocks and the selection rules of
MoBA, NSA, DeepSeek's DSA and Quest, each in its paper's own terms (chapter 8).

Shapes: q (B, H_q, N_q, d); k, v (B, H_kv, N_k, d) / (B, H_kv, N_k, d_v); H_q a multiple
of H_kv, query head h reading KV head h // (H_q // H_kv) (GQA). A selection is
``kv_indices`` (B, H_kv, N_q, S) integers: for every query token and KV head (shared by
its query-head group, as NSA and DSA share it) the indices of the key blocks of
``block_size`` keys it reads (block_size = 1: single tokens, as DSA); -1 is padding, the
indices of one row are distinct, in any order. causal aligns bottom-right as
``attention.core``: query i sits at position ``i + N_k - N_q`` and sees keys j <= it.

``sparse_attention``   softmax attention over the chosen blocks only (the twin of
                       ``kernels.sparse.sparse_attention``).
``select_blocks``      MoBA's gate with NSA's group sharing: block c scores
                       sum_{h in group} q_h . mean(k[block c]) * scale; under causal
                       only blocks starting at or before the query are eligible and
                       the query's own block is always chosen; top-k, ties to the
                       lower index, -1 padding (Lu et al. 2025).
``moba_attention``     ``select_blocks`` then ``sparse_attention``.
``nsa_attention``      NSA's three branches (Yuan et al. 2025): attention over
                       compressed blocks, over the top-n blocks ranked by the
                       compressed branch's probabilities summed over the GQA group
                       (``nsa_select``), and over a sliding window, mixed by gates.
``lightning_indexer``  DSA's index scores I[t, s] = sum_j w[t, j] relu(q_I[t, j] .
                       k_I[s]) (DeepSeek-AI 2025); ``topk_tokens`` keeps the top k
                       earlier tokens per query (block_size = 1).
``quest_select``       Quest's page choice (Tang et al. 2024): per page and channel
                       the min and max key, the upper bound sum_i max(q_i m_i,
                       q_i M_i) of q . k over the page, top-k pages.

The edge rules (those of ``kernels.flash`` and ``attention.hard``): a row with no
visible chosen key gives 0 and lse -inf; a NaN reaches only the rows that read it (a
NaN in q its own row, a NaN in k or v the rows that chose that key) and is never read
as "no key"; in every ranking a NaN score ranks above every number (lowest index
first), so a NaN row keeps its NaN. Learned parts (NSA's compression and gate MLPs,
DSA's indexer projections) are inputs here, not trained: ``compress`` defaults to
mean pooling.
"""

from __future__ import annotations

import numpy as np

from .checks import (
    as_block_indices,
    as_mask,
    as_real_array,
    check_bool,
    check_int,
    check_scale,
)
from .core import weighted_sum

__all__ = [
    "block_keep",
    "block_scores",
    "check_kv_indices",
    "lightning_indexer",
    "mean_pool",
    "moba_attention",
    "nsa_attention",
    "nsa_select",
    "quest_bounds",
    "quest_select",
    "rank_topk",
    "select_blocks",
    "sparse_attention",
    "topk_tokens",
    "window_indices",
]


# ---------------------------------------------------------------------------------
# Checks
# ---------------------------------------------------------------------------------


def _check_qk(q, k, names=("q", "k")):
    q = as_real_array(names[0], q)
    k = as_real_array(names[1], k)
    for name, t in zip(names, (q, k)):
        if t.ndim != 4:
            raise ValueError(f"{name} must be 4-D (B, H, N, d), got shape {t.shape}")
    (b, h_q, _, d), (b_k, h_kv, _, d_k) = q.shape, k.shape
    if b != b_k or d != d_k:
        raise ValueError(
            f"{names[0]} {q.shape} and {names[1]} {k.shape} must agree in batch and "
            "head dim: (B, H_q, N_q, d) and (B, H_kv, N_k, d)"
        )
    if h_kv < 1 or h_q % h_kv:
        raise ValueError(
            f"the query heads H_q={h_q} must be a multiple of the KV heads H_kv={h_kv}"
        )
    return q, k


def check_kv_indices(kv_indices, shape, n_blocks, name="kv_indices") -> np.ndarray:
    """``kv_indices`` as int64 (B, H_kv, N_q, S): integers in [-1, n_blocks), the
    non-negative ones of a row distinct. ``shape`` is (B, H_kv, N_q)."""
    return as_block_indices(name, kv_indices, n_blocks, tuple(shape))


def _positions(n_q: int, n_k: int) -> np.ndarray:
    """Bottom-right aligned positions of the queries among the keys."""
    return np.arange(n_q) + (n_k - n_q)


# ---------------------------------------------------------------------------------
# Attention over chosen blocks
# ---------------------------------------------------------------------------------


def block_keep(kv_indices, n_k: int, block_size: int, causal: bool) -> np.ndarray:
    """The keys each row reads, (B, H_kv, N_q, N_k) bool: the keys of its chosen
    blocks, and under causal only those at or before its position."""
    n_k = check_int("n_k", n_k, 0)
    block_size = check_int("block_size", block_size, 1)
    causal = check_bool("causal", causal)
    n_blocks = -(-n_k // block_size)
    idx = as_block_indices("kv_indices", kv_indices, n_blocks)
    if idx.ndim != 4:
        raise ValueError(f"kv_indices must be (B, H_kv, N_q, S), got {idx.shape}")
    b, h, n_q, _ = idx.shape
    chosen = np.zeros((b, h, n_q, n_blocks + 1), dtype=bool)  # last column: padding
    np.put_along_axis(chosen, np.where(idx < 0, n_blocks, idx), True, axis=-1)
    keep = chosen[..., np.arange(n_k) // block_size]  # (B, H_kv, N_q, N_k)
    if causal:
        keep &= np.arange(n_k) <= _positions(n_q, n_k)[:, None]
    return keep


def _masked_attention(q, k, v, keep, scale):
    """Softmax attention of q (B, H_q, N_q, d) over the kept keys of keep (B, H_kv,
    N_q, N_k), grouped heads; o and lse in float64."""
    h_q, h_kv = q.shape[1], k.shape[1]
    g = h_q // h_kv
    keep = np.repeat(keep, g, axis=1)  # (B, H_q, N_q, N_k)
    k, v = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
    with np.errstate(invalid="ignore", over="ignore"):
        s = np.einsum("bhid,bhjd->bhij", q, k) * scale
    s = np.where(keep, s, -np.inf)
    m = s.max(axis=-1, keepdims=True) if s.shape[-1] else s.sum(-1, keepdims=True)
    m_safe = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(invalid="ignore", over="ignore"):
        p = np.exp(s - m_safe)
        l = p.sum(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        pn = np.divide(p, l, out=np.zeros_like(p), where=l > 0)
        o = weighted_sum(pn, v, keep)
        lse = np.log(l[..., 0]) + m_safe[..., 0]
    bad = np.isnan(m[..., 0]) | np.isposinf(m[..., 0])
    o = np.where(bad[..., None], np.nan, o)
    lse = np.where(bad, np.nan, lse)
    return o, lse


def sparse_attention(
    q, k, v, kv_indices, block_size=64, scale=None, causal=True, return_lse=False
):
    """Softmax attention of every query over the key blocks ``kv_indices`` names.

    q (B, H_q, N_q, d), k (B, H_kv, N_k, d), v (B, H_kv, N_k, d_v), kv_indices (B, H_kv,
    N_q, S) integers (-1 padding). Returns o (B, H_q, N_q, d_v) in float64 and, with
    ``return_lse``, lse (B, H_q, N_q) (natural log; -inf for a row with no visible
    chosen key, whose o is 0)."""
    q, k = _check_qk(q, k)
    v = as_real_array("v", v)
    if v.ndim != 4 or v.shape[:3] != k.shape[:3]:
        raise ValueError(
            f"v must be (B, H_kv, N_k, d_v) with k's {k.shape[:3]}, got {v.shape}"
        )
    block_size = check_int("block_size", block_size, 1)
    scale = check_scale("scale", scale, q.shape[-1])
    causal = check_bool("causal", causal)
    return_lse = check_bool("return_lse", return_lse)
    b, h_kv, n_k, _ = k.shape
    n_q = q.shape[2]
    idx = check_kv_indices(kv_indices, (b, h_kv, n_q), -(-n_k // block_size))
    keep = block_keep(idx, n_k, block_size, causal)
    o, lse = _masked_attention(
        q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), keep, scale
    )
    return (o, lse) if return_lse else o


# ---------------------------------------------------------------------------------
# Ranking
# ---------------------------------------------------------------------------------


def rank_topk(scores, topk: int, eligible=None, forced=None) -> np.ndarray:
    """The top ``topk`` indices of the last axis, best first: ``forced`` (bool, same
    shape) first, then by score, NaN above every number, ties to the lower index;
    ineligible entries never chosen; fewer than ``topk`` eligible: padded with -1."""
    s = as_real_array("scores", scores).astype(np.float64)
    topk = check_int("topk", topk, 1)
    if eligible is None:
        eligible = np.ones(s.shape, bool)
    eligible = as_mask("eligible", eligible, s.shape)
    if forced is None:
        forced = np.zeros(s.shape, bool)
    forced = as_mask("forced", forced, s.shape) & eligible
    # a sortable key: forced, NaN, +inf, ..., -inf, ineligible (stable: lower index)
    key = np.where(np.isnan(s), -np.inf, -s)
    tier = np.where(forced, 0, np.where(np.isnan(s), 1, 2))
    tier = np.where(eligible, tier, 3)
    order = np.lexsort((key, tier), axis=-1)[..., :topk]
    out = np.where(np.take_along_axis(tier, order, -1) < 3, order, -1)
    if out.shape[-1] < topk:
        pad = np.full(out.shape[:-1] + (topk - out.shape[-1],), -1)
        out = np.concatenate([out, pad], axis=-1)
    return out.astype(np.int64)


def mean_pool(x, block_size: int) -> np.ndarray:
    """(..., N, d) -> (..., ceil(N / block_size), d): the mean of each block of rows
    (the last block may be shorter: the mean of its own rows)."""
    x = as_real_array("x", x, 2)
    block_size = check_int("block_size", block_size, 1)
    n = x.shape[-2]
    starts = np.arange(0, n, block_size)
    sums = (
        np.add.reduceat(x.astype(np.float64), starts, axis=-2) if n else x[..., :0, :]
    )
    return sums / np.minimum(block_size, n - starts)[:, None]


# ---------------------------------------------------------------------------------
# MoBA
# ---------------------------------------------------------------------------------


def block_scores(q, k, block_size, scale=None) -> np.ndarray:
    """MoBA's gate scores shared by each query-head group: (B, H_kv, N_q, n_blocks),
    score[b, g, i, c] = sum over g's query heads h of q[b, h, i] . mean(k[b, g, block
    c]) * scale."""
    q, k = _check_qk(q, k)
    block_size = check_int("block_size", block_size, 1)
    scale = check_scale("scale", scale, q.shape[-1])
    b, h_q, n_q, d = q.shape
    h_kv = k.shape[1]
    qg = q.astype(np.float64).reshape(b, h_kv, h_q // h_kv, n_q, d).sum(axis=2)
    with np.errstate(invalid="ignore", over="ignore"):
        return np.einsum("bgid,bgcd->bgic", qg, mean_pool(k, block_size)) * scale


def select_blocks(q, k, block_size, topk, causal=True, scale=None) -> np.ndarray:
    """MoBA's gate with NSA's group sharing: kv_indices (B, H_kv, N_q, topk) int32.

    Ranked by ``block_scores``; under causal only blocks starting at or before the
    query's position are eligible and the query's own block is always chosen (first);
    without causal every block is eligible and none is forced. Ties go to the lower
    block index; fewer eligible blocks than ``topk`` pad with -1."""
    causal = check_bool("causal", causal)
    topk = check_int("topk", topk, 1)
    s = block_scores(q, k, block_size, scale)  # checks q, k, block_size, scale
    n_q, n_k, n_blocks = s.shape[2], k.shape[2], s.shape[3]
    eligible = forced = None
    if causal:
        pos = _positions(n_q, n_k)[:, None]  # (N_q, 1)
        starts = np.arange(n_blocks) * block_size
        eligible = np.broadcast_to(starts <= pos, s.shape)
        forced = np.broadcast_to(starts == pos // block_size * block_size, s.shape)
    return rank_topk(s, topk, eligible, forced).astype(np.int32)


def moba_attention(q, k, v, block_size, topk, causal=True, scale=None):
    """MoBA: each query attends softly inside its ``topk`` gated blocks
    (``select_blocks``, then ``sparse_attention``)."""
    idx = select_blocks(q, k, block_size, topk, causal, scale)
    return sparse_attention(q, k, v, idx, block_size, scale, causal)


# ---------------------------------------------------------------------------------
# NSA
# ---------------------------------------------------------------------------------


def _group_softmax_sum(q, kc, visible, scale):
    """Softmax of every query head over the compressed keys it may see, summed over
    each head's group: (B, H_kv, N_q, n_blocks)."""
    b, h_q, n_q, d = q.shape
    h_kv = kc.shape[1]
    g = h_q // h_kv
    with np.errstate(invalid="ignore", over="ignore"):
        s = np.einsum("bhid,bhcd->bhic", q, np.repeat(kc, g, axis=1)) * scale
    s = np.where(visible, s, -np.inf)
    m = s.max(-1, keepdims=True) if s.shape[-1] else s.sum(-1, keepdims=True)
    with np.errstate(invalid="ignore", over="ignore"):
        e = np.exp(s - np.where(np.isfinite(m), m, 0.0))
        z = e.sum(-1, keepdims=True)
        p = np.divide(e, z, out=np.zeros_like(e), where=z > 0)
    p = np.where(np.isnan(m) | np.isposinf(m), np.nan, p)
    return p.reshape(b, h_kv, g, n_q, -1).sum(axis=2)


def nsa_select(
    q,
    k,
    block_size,
    topk,
    causal=True,
    scale=None,
    n_initial=1,
    n_local=2,
    compress=None,
):
    """NSA's selected blocks, kv_indices (B, H_kv, N_q, topk) int32, with selection
    blocks equal to compression blocks (l' = l = stride, the paper's case where
    p_slc = p_cmp).

    The compressed keys ``compress(k, block_size)`` (default ``mean_pool``) are scored
    by every query head's softmax over the compressed blocks it may see (under causal
    the blocks that end at or before its position), and the probabilities are summed
    over the GQA group. The first ``n_initial`` blocks and the ``n_local`` blocks up to
    the query's own are always chosen (the paper's 1 initial and 2 local), the rest by
    score; ties to the lower index, -1 padding."""
    q, k = _check_qk(q, k)
    block_size = check_int("block_size", block_size, 1)
    topk = check_int("topk", topk, 1)
    causal = check_bool("causal", causal)
    scale = check_scale("scale", scale, q.shape[-1])
    n_initial = check_int("n_initial", n_initial, 0)
    n_local = check_int("n_local", n_local, 0)
    kc = (mean_pool if compress is None else compress)(k, block_size)
    n_q, n_k = q.shape[2], k.shape[2]
    n_blocks = -(-n_k // block_size)
    if kc.shape[-2] != n_blocks:
        raise ValueError(
            f"compress must give one key per block ({n_blocks}), got {kc.shape}"
        )
    c = np.arange(n_blocks)
    pos = _positions(n_q, n_k)[:, None]
    ends = np.minimum((c + 1) * block_size, n_k) - 1
    complete = ends <= pos if causal else np.ones((n_q, n_blocks), bool)
    p = _group_softmax_sum(q.astype(np.float64), kc, complete, scale)
    own = pos // block_size  # the query's own block (bottom-right positions)
    eligible = c * block_size <= pos if causal else np.ones((n_q, n_blocks), bool)
    forced = (c < n_initial) | ((c <= own) & (c > own - n_local))
    shape = p.shape
    return rank_topk(
        p, topk, np.broadcast_to(eligible, shape), np.broadcast_to(forced, shape)
    ).astype(np.int32)


def window_indices(n_q: int, n_k: int, window: int, causal=True) -> np.ndarray:
    """The sliding window as token indices (N_q, window): the ``window`` keys ending
    at each query's position, -1 before the first key (without causal: centred)."""
    window = check_int("window", window, 1)
    pos = _positions(n_q, n_k)[:, None]
    lo = pos - window + 1 if causal else pos - window // 2
    j = lo + np.arange(window)
    return np.where((j >= 0) & (j < n_k), j, -1)


def nsa_attention(
    q,
    k,
    v,
    block_size,
    topk,
    window,
    gates=None,
    causal=True,
    scale=None,
    n_initial=1,
    n_local=2,
    compress=None,
    return_parts=False,
):
    """NSA: o = g_cmp o_cmp + g_slc o_slc + g_win o_win per query head.

    o_cmp attends the compressed keys and values (``compress``, default mean pooling)
    of the blocks that end at or before the query; o_slc attends the ``nsa_select``
    blocks; o_win the last ``window`` keys. ``gates`` (B, H_q, N_q, 3) in [0, 1] (the
    paper's sigmoid gates; None: 1/3 each, an untrained choice of this book). With
    ``return_parts`` also the three branch outputs and the selection."""
    q, k = _check_qk(q, k)
    v = as_real_array("v", v)
    causal = check_bool("causal", causal)
    scale = check_scale("scale", scale, q.shape[-1])
    b, h_q, n_q, _ = q.shape
    h_kv, n_k = k.shape[1], k.shape[2]
    if gates is None:
        gates = np.full((b, h_q, n_q, 3), 1.0 / 3.0)
    gates = as_real_array("gates", gates)
    if gates.shape != (b, h_q, n_q, 3):
        raise ValueError(f"gates must be (B, H_q, N_q, 3), got {gates.shape}")
    pool = mean_pool if compress is None else compress
    idx = nsa_select(q, k, block_size, topk, causal, scale, n_initial, n_local, pool)
    o_slc = sparse_attention(q, k, v, idx, block_size, scale, causal)
    win = np.broadcast_to(
        window_indices(n_q, n_k, window, causal), (b, h_kv, n_q, window)
    )
    o_win = sparse_attention(q, k, v, win, 1, scale, causal)
    kc, vc = pool(k, block_size), pool(v, block_size)
    n_blocks = kc.shape[2]
    ends = np.minimum((np.arange(n_blocks) + 1) * block_size, n_k) - 1
    complete = ends <= _positions(n_q, n_k)[:, None] if causal else True
    keep = np.broadcast_to(complete, (b, h_kv, n_q, n_blocks))
    o_cmp, _ = _masked_attention(q.astype(np.float64), kc, vc, keep, scale)
    parts = (o_cmp, o_slc, o_win)
    o = sum(gates[..., i, None] * parts[i] for i in range(3))
    return (o, parts, idx) if return_parts else o


# ---------------------------------------------------------------------------------
# DSA and Quest
# ---------------------------------------------------------------------------------


def lightning_indexer(q_index, k_index, weights, causal=True) -> np.ndarray:
    """DSA's index scores (B, N_q, N_k): I[t, s] = sum_j w[t, j] relu(q_I[t, j] .
    k_I[s]), -inf where s is after t under causal.

    q_index (B, N_q, H_I, d_I) the indexer's few query heads, k_index (B, N_k, d_I)
    its one key head (shared by every head), weights (B, N_q, H_I)."""
    qi = as_real_array("q_index", q_index).astype(np.float64)
    ki = as_real_array("k_index", k_index).astype(np.float64)
    w = as_real_array("weights", weights).astype(np.float64)
    causal = check_bool("causal", causal)
    if qi.ndim != 4 or ki.ndim != 3 or qi.shape[0] != ki.shape[0]:
        raise ValueError(
            f"q_index must be (B, N_q, H_I, d_I) and k_index (B, N_k, d_I), got "
            f"{qi.shape} and {ki.shape}"
        )
    if qi.shape[3] != ki.shape[2]:
        raise ValueError(f"q_index {qi.shape} and k_index {ki.shape} differ in d_I")
    if w.shape != qi.shape[:3]:
        raise ValueError(
            f"weights must be (B, N_q, H_I) = {qi.shape[:3]}, got {w.shape}"
        )
    with np.errstate(invalid="ignore", over="ignore"):
        s = np.einsum("btjd,bsd->btjs", qi, ki)
        scores = np.einsum("btj,btjs->bts", w, np.maximum(s, 0))  # keeps NaN
    if causal:
        n_q, n_k = qi.shape[1], ki.shape[1]
        scores = np.where(
            np.arange(n_k) <= _positions(n_q, n_k)[:, None], scores, -np.inf
        )
    return scores


def topk_tokens(index_scores, topk, h_kv=1) -> np.ndarray:
    """DSA's selection: the ``topk`` highest-scored visible tokens of each query as
    kv_indices (B, h_kv, N_q, topk) int32 for ``sparse_attention`` with block_size =
    1 (one selection shared by every head: DSA runs MLA in its MQA form)."""
    s = as_real_array("index_scores", index_scores)
    if s.ndim != 3:
        raise ValueError(f"index_scores must be (B, N_q, N_k), got {s.shape}")
    h_kv = check_int("h_kv", h_kv, 1)
    idx = rank_topk(s, topk, eligible=~np.isneginf(s))
    return np.repeat(idx[:, None], h_kv, axis=1).astype(np.int32)


def quest_bounds(q, k, page_size, scale=None) -> np.ndarray:
    """Quest's criticality (B, H_kv, N_q, n_pages): per page and channel the min m
    and max M of the keys; the bound sum_i max(q_i m_i, q_i M_i) * scale is at least
    q . k * scale for every key of the page. Grouped query heads add their bounds
    (a bound on the group's summed score)."""
    q, k = _check_qk(q, k)
    page_size = check_int("page_size", page_size, 1)
    scale = check_scale("scale", scale, q.shape[-1])
    b, h_q, n_q, d = q.shape
    h_kv, n_k = k.shape[1], k.shape[2]
    starts = np.arange(0, n_k, page_size)
    kmin = np.minimum.reduceat(k.astype(np.float64), starts, axis=2)
    kmax = np.maximum.reduceat(k.astype(np.float64), starts, axis=2)
    qg = q.astype(np.float64).reshape(b, h_kv, h_q // h_kv, n_q, d)
    # max(q_i m_i, q_i M_i) = max(q_i, 0) M_i + min(q_i, 0) m_i: two products, each
    # summed over the group's heads before the dot (NaN and inf as the max gives)
    with np.errstate(invalid="ignore", over="ignore"):
        pos, neg = np.maximum(qg, 0).sum(2), np.minimum(qg, 0).sum(2)
        u = np.einsum("bgid,bgcd->bgic", pos, kmax)
        u += np.einsum("bgid,bgcd->bgic", neg, kmin)
        return u * scale


def quest_select(q, k, page_size, topk, causal=True, scale=None) -> np.ndarray:
    """Quest's pages, kv_indices (B, H_kv, N_q, topk) int32: top-k by
    ``quest_bounds``; under causal only pages starting at or before the query."""
    causal = check_bool("causal", causal)
    u = quest_bounds(q, k, page_size, scale)
    n_q, n_k, n_pages = u.shape[2], k.shape[2], u.shape[3]
    eligible = None
    if causal:
        starts = np.arange(n_pages) * page_size
        eligible = np.broadcast_to(starts <= _positions(n_q, n_k)[:, None], u.shape)
    return rank_topk(u, topk, eligible).astype(np.int32)
