"""The backward loop of ring attention: K/V travel the ring again with fp32 dK/dV
accumulators one step behind; each step runs the FlashAttention-2 backward of one block
from the global o and lse, so after P steps every rank holds its own shard's dK/dV.
"""

from __future__ import annotations

import torch

from ..flash import backward_lse
from .blocks import _TAG_DKV, _TAG_KV, Ring, _span, _Transfer


def ring_backward(do, dlse, q, k, v, o, lse2, ring: Ring, scale: float):
    """(dq, dk, dv) of this rank's shards: K/V travel the ring again; each rank adds
    its queries' contribution to the travelling fp32 dK/dV of the shard it holds and
    passes it on one step behind K/V, so after P steps dK/dV are home."""
    B, H, n, d = q.shape
    H_kv = k.shape[1]
    dq = torch.zeros((B, H, n, d), dtype=torch.float32, device=q.device)  # (B,H,n,d)
    kv = torch.stack((k, v))  # (2, B, H_kv, n_src, d)
    P = ring.world_size
    dkv_transfer = None
    for step in range(P):
        src = ring.src(step)
        kv_transfer = None
        if step < P - 1:
            nxt = ring.length(ring.src(step + 1))
            kv_transfer = _Transfer(
                ring, kv, (2, B, H_kv, nxt, d), _TAG_KV, step, "backward"
            )
        block = ring.plan(step)
        grads = None
        if block is not None:
            with _span("compute", step, "backward", ring, q.device):
                rows = slice(block.q0, block.q1)
                keys = slice(block.k0, block.k1)
                # the kernels index lse (and delta) as contiguous (B, H, N) rows
                grads = backward_lse(
                    do[:, :, rows],
                    q[:, :, rows],
                    kv[0, :, :, keys],
                    kv[1, :, :, keys],
                    o[:, :, rows],
                    lse2[:, :, rows].contiguous(),
                    block.causal,
                    scale,
                    None if dlse is None else dlse[:, :, rows].contiguous(),
                )
                dq[:, :, rows] += grads[0].float()
        # the accumulator of shard `src`: fresh at step 0, else from the previous rank
        dkv = (
            torch.zeros(
                (2, B, H_kv, ring.length(src), d), dtype=torch.float32, device=q.device
            )
            if dkv_transfer is None
            else dkv_transfer.wait(step)
        )
        if grads is not None:
            dkv[0, :, :, keys] += grads[1].float()
            dkv[1, :, :, keys] += grads[2].float()
        # pass it on (after the last step it goes to its owner, rank + 1's shard)
        dkv_transfer = _Transfer(
            ring,
            dkv,
            (2, B, H_kv, ring.length(ring.src(step + 1)), d),
            _TAG_DKV,
            step,
            "backward",
        )
        if kv_transfer is not None:
            kv = kv_transfer.wait(step)
    dkv = dkv_transfer.wait(P - 1)  # (2, B, H_kv, n, d): this rank's own dK, dV
    return dq.to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype)
