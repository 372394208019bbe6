"""``select_blocks``: MoBA's gate with NSA's group sharing, in torch ops.

The scores are one small matmul per query chunk: the group's query heads summed
(B, H_kv, N_q, d) against the mean-pooled keys (B, H_kv, n_blocks, d), in fp32 (no
TF32). The ranking is exact and deterministic with ``torch.topk`` on one int64 key per
(query, block): the tier (forced own block > NaN > eligible > ineligible), then the
fp32 score's bits mapped to an order-preserving integer, then the complement of the
block index, so equal scores go to the lower index and no two keys are equal (what a
float top-k does not promise). Queries are ranked in chunks of at most
``CHUNK_ELEMENTS`` scores, so the (N_q, n_blocks) key never grows past a few hundred
MB whatever N. float64 scores (``topk_tokens`` of float64 index scores) have no bits
left for the index in one int64 key: they are ranked by two stable sorts instead, in
float64, as ``attention.sparse`` ranks them.
"""

from __future__ import annotations

import torch

from .checks import check_select

#: scores ranked per chunk of queries (int64 keys: 8 bytes each)
CHUNK_ELEMENTS = 1 << 25
_INDEX_BITS = 21  # blocks per row: at most 2**21 (2M blocks)


def mean_pool(k: torch.Tensor, block_size: int) -> torch.Tensor:
    """(B, H, N, d) -> (B, H, ceil(N / block_size), d) float32: the mean of each block
    of rows (the last block: the mean of its own rows)."""
    B, H, N, d = k.shape
    nb = -(-N // block_size)
    kf = k.float()
    if nb * block_size != N:
        kf = torch.cat([kf, kf.new_zeros(B, H, nb * block_size - N, d)], dim=2)
    sums = kf.view(B, H, nb, block_size, d).sum(3)
    counts = torch.clamp(
        N - torch.arange(nb, device=k.device) * block_size, max=block_size
    )
    return sums / counts.to(torch.float32)[:, None]


def _ordered(scores: torch.Tensor) -> torch.Tensor:
    """fp32 -> int64 in [0, 2**32), in the order of the floats (-0 and +0 equal)."""
    bits = (scores + 0.0).view(torch.int32).to(torch.int64)  # -0.0 + 0.0 = +0.0
    return torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits) + (1 << 31)


def select_blocks(q, k, block_size, topk, causal=True, scale=None) -> torch.Tensor:
    """kv_indices (B, H_kv, N_q, topk) int32 for ``sparse_attention``, best first.

    The score of block c for query i and KV head g is the sum over g's query heads h
    of q[h, i] . mean(k[g, block c]) * scale. Under causal only blocks starting at or
    before the query's position (bottom-right aligned, as kernels.flash) are eligible
    and the query's own block is always chosen (first); without causal every block is
    eligible. Top-k by score, NaN above every number, ties to the lower block index;
    fewer eligible blocks than topk pad with -1. Equal to
    ``attention.sparse.select_blocks`` up to the fp32 rounding of the scores."""
    block_size, topk, scale = check_select(q, k, block_size, topk, causal, scale)
    B, H, N_q, d = q.shape
    H_kv, N_k = k.shape[1], k.shape[2]
    nb = -(-N_k // block_size)
    if nb >= 1 << _INDEX_BITS:
        raise ValueError(
            f"select_blocks ranks at most {1 << _INDEX_BITS} blocks per row, got "
            f"N_k / block_size = {nb}"
        )
    dev = q.device
    kmean = mean_pool(k, block_size)  # (B, H_kv, nb, d)
    qg = q.float().view(B, H_kv, H // H_kv, N_q, d).sum(2)  # (B, H_kv, N_q, d)
    kk = min(topk, nb)
    out = torch.full((B, H_kv, N_q, topk), -1, dtype=torch.int32, device=dev)
    blocks = torch.arange(nb, device=dev)
    starts = blocks * block_size
    rows = max(1, CHUNK_ELEMENTS // max(1, B * H_kv * nb))
    for lo in range(0, N_q, rows):
        hi = min(N_q, lo + rows)
        s = torch.matmul(qg[:, :, lo:hi], kmean.transpose(-1, -2)) * scale
        tier = torch.where(torch.isnan(s), 2, 1)
        if causal:
            pos = torch.arange(lo, hi, device=dev)[:, None] + (N_k - N_q)
            eligible = starts[None, :] <= pos
            forced = starts[None, :] == (pos // block_size) * block_size
            tier = torch.where(forced, 3, torch.where(eligible, tier, 0))
        out[:, :, lo:hi, :kk] = rank(s, tier, kk)
    return out


def rank(s: torch.Tensor, tier: torch.Tensor, kk: int) -> torch.Tensor:
    """The top ``kk`` indices of the last axis of fp32 scores ``s``, best first, int32:
    by ``tier`` (3 forced, 2 NaN, 1 by score, 0 never chosen: -1), then by score,
    ties to the lower index, through one int64 key per entry (exact, no equal
    keys). float64 scores are ranked in float64 (two stable sorts)."""
    n = s.shape[-1]
    if n >= 1 << _INDEX_BITS:
        raise ValueError(f"at most {1 << _INDEX_BITS} entries per row, got {n}")
    if s.dtype == torch.float64:  # 64 score bits leave none for the index: sort
        return _rank_sorted(s, tier, kk)
    rank_low = (1 << _INDEX_BITS) - 1 - torch.arange(n, device=s.device)
    score = torch.where(tier == 1, _ordered(s), 0)
    key = ((tier.to(torch.int64) << 32) + score << _INDEX_BITS) + rank_low
    top = torch.topk(key, kk, dim=-1, sorted=True).indices
    chosen = torch.gather(tier, -1, top) > 0
    return torch.where(chosen, top, -1).to(torch.int32)


def _rank_sorted(s: torch.Tensor, tier: torch.Tensor, kk: int) -> torch.Tensor:
    """``rank`` for float64 scores, in float64: two stable sorts, by score (descending,
    ties to the lower index, -0 = +0) and then by tier."""
    score = torch.where(tier == 1, s + 0.0, 0.0)
    by_score = torch.sort(score, dim=-1, descending=True, stable=True).indices
    tiers = torch.gather(tier, -1, by_score)
    by_tier = torch.sort(tiers, dim=-1, descending=True, stable=True).indices
    top = torch.gather(by_score, -1, by_tier)[..., :kk]
    chosen = torch.gather(tier, -1, top) > 0
    return torch.where(chosen, top, -1).to(torch.int32)


__all__ = ["mean_pool", "rank", "select_blocks"]
