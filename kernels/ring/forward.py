"""The forward loop of ring attention: each step one flash block against the K/V shard
held, merged into the running (o, lse), while the next shard travels (rank+1 <- rank,
rank-1 -> rank, posted before the block's compute so the transfer overlaps it).
"""

from __future__ import annotations

import torch

from ..flash import forward_lse
from .blocks import _TAG_KV, Ring, _span, _Transfer, merge_partials


def ring_forward(q, k, v, ring: Ring, scale: float):
    """(o in q's dtype, lse2 (B, H, N) float32 base 2) of this rank's queries against
    the whole sequence."""
    B, H, n, d = q.shape
    o = torch.zeros((B, H, n, d), dtype=torch.float32, device=q.device)  # (B,H,n,d)
    lse2 = torch.full((B, H, n), float("-inf"), device=q.device)  # (B, H, n)
    kv = torch.stack((k, v))  # (2, B, H_kv, n_src, d): one message per step
    P = ring.world_size
    for step in range(P):
        transfer = None
        if step < P - 1:  # the next shard moves while this one computes
            nxt = ring.length(ring.src(step + 1))
            transfer = _Transfer(
                ring, kv, (2, B, k.shape[1], nxt, d), _TAG_KV, step, "forward"
            )
        block = ring.plan(step)
        if block is not None:
            with _span("compute", step, "forward", ring, q.device):
                rows = slice(block.q0, block.q1)
                o_b, l_b = forward_lse(
                    q[:, :, rows],
                    kv[0, :, :, block.k0 : block.k1],
                    kv[1, :, :, block.k0 : block.k1],
                    block.causal,
                    scale,
                )
                o[:, :, rows], lse2[:, :, rows] = merge_partials(
                    torch.stack((o[:, :, rows], o_b.float())),
                    torch.stack((lse2[:, :, rows], l_b)),
                    base2=True,
                )
        if transfer is not None:
            kv = transfer.wait(step)
    return o.to(q.dtype), lse2
