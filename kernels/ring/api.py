"""The public call ``ring_attention`` and its autograd Function; the spec sheet is
:mod:`kernels.ring`'s.
"""

from __future__ import annotations

import torch

from ..common import LN2, check_bool, renamed_scale
from ..flash import check_inputs, flash_attention
from .backward import ring_backward
from .blocks import group_size, make_ring
from .forward import ring_forward
from .layout import check_layout


class _RingAttention(torch.autograd.Function):
    """Saves this rank's q, k, v, the final o and the global lse (base 2); the
    backward reruns the ring (no N x N tensor, no per-step state kept)."""

    @staticmethod
    def forward(ctx, q, k, v, ring, scale):
        o, lse2 = ring_forward(q, k, v, ring, scale)
        ctx.save_for_backward(q, k, v, o, lse2)
        ctx.ring, ctx.scale = ring, scale
        ctx.set_materialize_grads(False)
        return o, lse2 * LN2  # natural-log lse; -inf stays -inf

    @staticmethod
    def backward(ctx, do, dlse):
        q, k, v, o, lse2 = ctx.saved_tensors
        if do is None:  # only the lse was used
            do = torch.zeros_like(o)
        dq, dk, dv = ring_backward(do, dlse, q, k, v, o, lse2, ctx.ring, ctx.scale)
        return dq, dk, dv, None, None


def ring_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    group=None,
    layout: str = "contiguous",
    return_lse: bool = False,
    softmax_scale: float | None = None,
    *,
    sm_scale: float | None = None,
):
    """Attention of this rank's query shard over the whole sequence, K/V on a ring.

    Args:
        q: (B, H, N_local, d) this rank's queries (float16, bfloat16, float32).
        k, v: (B, H_kv, N_local, d), the same positions as q; H a multiple of H_kv.
        causal: the global causal mask (query at position i sees keys j <= i).
        group: the process group (None: the default group; with no process group
            initialised, a single process, P = 1).
        layout: "contiguous" or "zigzag": which positions each rank holds
            (:func:`kernels.ring.shard`).
        return_lse: also return the natural-log log-sum-exp (B, H, N_local).
        softmax_scale: softmax scale, default 1 / sqrt(d) (``sm_scale=``, its old
            name, still works with a DeprecationWarning).

    Returns:
        o (B, H, N_local, d) in q's dtype, and with ``return_lse`` lse (B, H, N_local)
        float32. Differentiable in q, k, v (through o and lse).
    """
    softmax_scale = renamed_scale(softmax_scale, sm_scale, "softmax_scale")
    scale = check_inputs(q, k, v, softmax_scale)
    check_bool("causal", causal)
    check_layout(layout)
    check_bool("return_lse", return_lse)
    if k.shape[2] != q.shape[2]:
        raise ValueError(
            f"k and v must hold the same positions as q: q has "
            f"N_local={q.shape[2]}, k {k.shape[2]} (q {tuple(q.shape)}, "
            f"k {tuple(k.shape)})"
        )
    if group_size(group)[0] == 1:  # one rank: one flash call, nothing else
        return flash_attention(q, k, v, causal, scale, return_lse)
    ring = make_ring(q, k, causal, group, layout, scale)
    o, lse = _RingAttention.apply(q, k, v, ring, scale)
    return (o, lse) if return_lse else o
