"""The public calls ``sparse_attention`` (and its autograd Function) and
``prepare`` (validate once, return a launcher: what the timing path times)."""

from __future__ import annotations

import torch

from ..common import LN2, check_bool
from .backward import backward
from .checks import check_inputs, check_kv_indices
from .forward import forward
from .tiles import Plan


class _SparseAttention(torch.autograd.Function):
    """Saves q, k, v, kv_indices, o and the base-2 lse; never an N_q x N_k tensor."""

    @staticmethod
    def forward(ctx, q, k, v, idx, block_size, scale, causal, plan):
        o, lse2 = forward(q, k, v, idx, block_size, scale, causal, plan)
        ctx.save_for_backward(q, k, v, idx, o, lse2)
        ctx.args = (block_size, scale, causal, plan)
        return o, lse2 * LN2

    @staticmethod
    def backward(ctx, do, dlse):
        q, k, v, idx, o, lse2 = ctx.saved_tensors
        if do is None:
            do = torch.zeros_like(o)
        dq, dk, dv = backward(do.contiguous(), q, k, v, o, lse2, dlse, idx, *ctx.args)
        return dq, dk, dv, None, None, None, None, None


def prepare(
    q,
    k,
    v,
    kv_indices,
    block_size=64,
    scale=None,
    causal=True,
    return_lse=False,
    check_indices=True,
):
    """Validate every argument (one host synchronisation: the index range and
    distinctness) and return ``launch()``, which runs ``sparse_attention`` on these
    tensors without checking them again (their values may change, not their shapes,
    and the indices must stay valid). ``check_indices=False`` checks the indices'
    shape, dtype and device only, with no synchronisation: for indices valid by
    construction (``select_blocks``'s); an index out of range then reads memory
    outside k and v."""
    block_size, scale = check_inputs(q, k, v, block_size, scale, causal, return_lse)
    B, H_kv, N_k = k.shape[:3]
    n_blocks = -(-N_k // block_size)
    idx = check_kv_indices(
        kv_indices,
        (B, H_kv, q.shape[2], q.device),
        n_blocks,
        check_bool("check_indices", check_indices),
    )
    plan = Plan(q, k, v)
    if not plan.backward_ok and any(t.requires_grad for t in (q, k, v)):
        raise ValueError(
            f"the sparse backward supports head dims up to 128 on sm_75, got "
            f"d = {q.shape[3]}, d_v = {v.shape[3]} (its tiles spill there): pass "
            f"tensors that do not require grad, or use an sm_80+ GPU"
        )

    def launch():
        o, lse = _SparseAttention.apply(q, k, v, idx, block_size, scale, causal, plan)
        return (o, lse) if return_lse else o

    return launch


def sparse_attention(
    q, k, v, kv_indices, block_size=64, scale=None, causal=True, return_lse=False
):
    """Softmax attention of every query over the key blocks ``kv_indices`` names.

    Args:
        q: (B, H_q, N_q, d) float16, bfloat16 or float32.
        k: (B, H_kv, N_k, d); v: (B, H_kv, N_k, d_v), q's dtype and device; H_q a
            multiple of H_kv (query head h reads KV head h // (H_q // H_kv)).
        kv_indices: (B, H_kv, N_q, S) int32 (int64 accepted): for each query token
            and KV head (shared by the head's query-head group) the indices of the
            key blocks it reads, blocks of ``block_size`` keys (the last may be
            shorter); -1 is padding; the indices of one row distinct, in any order.
        block_size: keys per block, >= 1 (1: single tokens, DeepSeek's DSA).
        scale: the softmax scale, default 1 / sqrt(d).
        causal: mask the keys after the query's position inside the chosen blocks,
            bottom-right aligned (query i sits at i + N_k - N_q), as kernels.flash.
        return_lse: also return the natural log-sum-exp (B, H_q, N_q) float32.

    Returns:
        o (B, H_q, N_q, d_v) in q's dtype and, with ``return_lse``, lse. A row with
        no visible chosen key gives o = 0 and lse = -inf. Differentiable in q, k, v.
    """
    return prepare(q, k, v, kv_indices, block_size, scale, causal, return_lse)()


__all__ = ["prepare", "sparse_attention"]
