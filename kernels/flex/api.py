"""The public call ``flex_attention`` and its autograd Function."""

from __future__ import annotations

import torch

from ..common import LN2
from .backward import backward
from .block_mask import full_block_mask
from .checks import validate
from .forward import forward
from .mods import pack


class _FlexAttention(torch.autograd.Function):
    """Saves q, k, v, o and the base-2 lse (B, H, N_q); never an N_q x N_k tensor."""

    @staticmethod
    def forward(ctx, q, k, v, sinks, scale, block_mask, mask_pack, score_pack):
        sinks32 = None if sinks is None else sinks.detach().float().contiguous()
        o, lse2 = forward(q, k, v, scale, block_mask, mask_pack, score_pack, sinks32)
        ctx.save_for_backward(q, k, v, o, lse2, sinks32)
        ctx.scale, ctx.block_mask = scale, block_mask
        ctx.mask_pack, ctx.score_pack = mask_pack, score_pack
        ctx.sinks_dtype = None if sinks is None else sinks.dtype
        return o, lse2 * LN2

    @staticmethod
    def backward(ctx, do, dlse):
        q, k, v, o, lse2, sinks32 = ctx.saved_tensors
        dq, dk, dv, delta = backward(
            do.contiguous(),
            q,
            k,
            v,
            o,
            lse2,
            dlse,
            ctx.scale,
            ctx.block_mask,
            ctx.mask_pack,
            ctx.score_pack,
        )
        dsinks = None
        if sinks32 is not None and ctx.needs_input_grad[3]:
            # lse = log(sum_j e^{s_j} + e^{sink}); o = sum_j p_j v_j with p_j =
            # e^{s_j - lse}: dL/dsink = sum_rows p_sink (dlse - dO.o) = -p_sink delta
            p_sink = torch.exp(sinks32[None, :, None] - lse2 * LN2)
            dsinks = -(p_sink * delta).sum(dim=(0, 2)).to(ctx.sinks_dtype)
        return dq, dk, dv, dsinks, None, None, None, None


def flex_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    score_mod=None,
    block_mask=None,
    scale: float | None = None,
    enable_gqa: bool = False,
    return_lse: bool = False,
    sinks: torch.Tensor | None = None,
):
    """softmax(score_mod(q k^T * scale) restricted to block_mask's mask) v, visiting
    only the tiles the block mask lists (PyTorch's FlexAttention call shape).

    Args:
        q: (B, H_q, N_q, d) float16, bfloat16 or float32.
        k: (B, H_kv, N_k, d); v: (B, H_kv, N_k, d_v), same dtype and device; d_v may
            differ from d. H_q != H_kv needs ``enable_gqa=True`` (H_q a multiple).
        score_mod: None, a kernels.flex score mod (``softcap``, ``alibi``) or a
            ``@triton.jit`` ``(score, b, h, q_idx, kv_idx) -> score``, applied to the
            scaled score.
        block_mask: ``create_block_mask(...)`` for (Q_LEN, KV_LEN) = (N_q, N_k), or
            None (dense: every key visible).
        scale: default 1 / sqrt(d).
        return_lse: also return the natural log-sum-exp (B, H_q, N_q) float32.
        sinks: None or (H_q,): a learned sink logit per head (gpt-oss): exp(sinks[h])
            joins every row's softmax denominator, and the lse.

    Returns:
        o (B, H_q, N_q, d_v) in q's dtype, and with ``return_lse`` the lse. A row
        with no visible key gives o = 0 and lse = -inf (with a sink: lse = the sink).
        Differentiable in q, k, v and sinks (through o and the lse).
    """
    scale, mod = validate(
        q, k, v, score_mod, block_mask, scale, enable_gqa, return_lse, sinks
    )
    N_q, N_k = q.shape[2], k.shape[2]
    if block_mask is None:
        block_mask = full_block_mask(N_q, N_k, q.device)
    mask_pack = pack(block_mask.mask_mod, q.device)
    score_pack = None if mod is None else pack(mod, q.device)
    o, lse = _FlexAttention.apply(
        q, k, v, sinks, scale, block_mask, mask_pack, score_pack
    )
    return (o, lse) if return_lse else o


__all__ = ["flex_attention"]
