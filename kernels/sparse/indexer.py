"""DeepSeek's DSA selection in torch ops: the lightning indexer's scores and the top-k
tokens, for ``sparse_attention`` with block_size = 1 (twins of
``attention.sparse.lightning_indexer`` and ``topk_tokens``).

``lightning_indexer`` builds the (B, N_q, N_k) scores (fp32); ``index_topk`` ranks
them chunk by chunk of queries without ever holding the whole matrix (what a long
context needs: 64k x 64k fp32 scores are 16 GB). The ranking is ``select.rank``'s
exact int64 key: NaN first, then by score, ties to the lower token, -inf (causal)
never chosen.
"""

from __future__ import annotations

import torch

from ..common import FLOAT_DTYPES, check_bool, check_int, check_tensor
from .select import CHUNK_ELEMENTS, rank


def _check(q_index, k_index, weights, causal):
    for name, t in (("q_index", q_index), ("k_index", k_index), ("weights", weights)):
        check_tensor(name, t)
        if t.dtype not in FLOAT_DTYPES:
            raise TypeError(
                f"{name} must be float16, bfloat16 or float32, got dtype {t.dtype}"
            )
        if t.device != q_index.device:
            raise ValueError(f"{name} is on {t.device}, q_index on {q_index.device}")
    check_bool("causal", causal)
    if q_index.ndim != 4 or k_index.ndim != 3 or q_index.shape[0] != k_index.shape[0]:
        raise ValueError(
            f"q_index must be (B, N_q, H_I, d_I) and k_index (B, N_k, d_I), got "
            f"{tuple(q_index.shape)} and {tuple(k_index.shape)}"
        )
    if q_index.shape[3] != k_index.shape[2]:
        raise ValueError(
            f"q_index {tuple(q_index.shape)} and k_index {tuple(k_index.shape)} "
            "differ in d_I"
        )
    if tuple(weights.shape) != tuple(q_index.shape[:3]):
        raise ValueError(
            f"weights must be (B, N_q, H_I) = {tuple(q_index.shape[:3])}, got "
            f"{tuple(weights.shape)}"
        )


def _scores(qi, ki, w, lo, hi, n_q, causal):
    """Scores of queries [lo, hi): (B, hi - lo, N_k) fp32."""
    s = torch.einsum("btjd,bsd->btjs", qi[:, lo:hi], ki)
    s = torch.einsum("btj,btjs->bts", w[:, lo:hi], torch.relu(s))  # relu keeps NaN
    if causal:
        n_k = ki.shape[1]
        pos = torch.arange(lo, hi, device=s.device)[:, None] + (n_k - n_q)
        s = s.masked_fill(torch.arange(n_k, device=s.device) > pos, float("-inf"))
    return s


def lightning_indexer(q_index, k_index, weights, causal=True) -> torch.Tensor:
    """DSA's index scores (B, N_q, N_k) float32: I[t, s] = sum_j w[t, j] relu(q_I[t,
    j] . k_I[s]), -inf where s is after t under causal (bottom-right aligned).
    q_index (B, N_q, H_I, d_I), k_index (B, N_k, d_I) (one key head shared by every
    head), weights (B, N_q, H_I)."""
    _check(q_index, k_index, weights, causal)
    qi, ki, w = q_index.float(), k_index.float(), weights.float()
    return _scores(qi, ki, w, 0, qi.shape[1], qi.shape[1], causal)


def topk_tokens(index_scores, topk, h_kv=1) -> torch.Tensor:
    """The ``topk`` highest-scored visible tokens of each query as kv_indices (B,
    h_kv, N_q, topk) int32 (one selection shared by every KV head), -1 padding where
    fewer than topk tokens are visible (not -inf). float64 scores are ranked in
    float64, others in float32."""
    check_tensor("index_scores", index_scores)
    if index_scores.ndim != 3 or not index_scores.is_floating_point():
        raise ValueError(
            f"index_scores must be a float (B, N_q, N_k) tensor, got "
            f"{tuple(index_scores.shape)} {index_scores.dtype}"
        )
    topk = check_int("topk", topk, 1)
    h_kv = check_int("h_kv", h_kv, 1)
    # float64 is ranked in float64 (as attention.sparse.topk_tokens), the rest in fp32
    s = index_scores if index_scores.dtype == torch.float64 else index_scores.float()
    tier = torch.where(torch.isnan(s), 2, torch.where(torch.isneginf(s), 0, 1))
    kk = min(topk, s.shape[-1])
    out = torch.full((*s.shape[:2], topk), -1, dtype=torch.int32, device=s.device)
    out[..., :kk] = rank(s, tier, kk)
    return out[:, None].expand(-1, h_kv, -1, -1).contiguous()


def index_topk(q_index, k_index, weights, topk, causal=True, h_kv=1) -> torch.Tensor:
    """``topk_tokens(lightning_indexer(...), topk, h_kv)`` chunk by chunk of queries,
    so the (N_q, N_k) scores never exist at once."""
    _check(q_index, k_index, weights, causal)
    topk = check_int("topk", topk, 1)
    h_kv = check_int("h_kv", h_kv, 1)
    qi, ki, w = q_index.float(), k_index.float(), weights.float()
    B, n_q, h_i, _ = qi.shape
    n_k = ki.shape[1]
    out = torch.full((B, n_q, topk), -1, dtype=torch.int32, device=qi.device)
    rows = max(1, CHUNK_ELEMENTS // max(1, B * h_i * n_k))
    for lo in range(0, n_q, rows):
        hi = min(n_q, lo + rows)
        out[:, lo:hi] = topk_tokens(_scores(qi, ki, w, lo, hi, n_q, causal), topk)[:, 0]
    return out[:, None].expand(-1, h_kv, -1, -1).contiguous()


__all__ = ["index_topk", "lightning_indexer", "topk_tokens"]
