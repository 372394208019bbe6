"""Hard and top-k attention calls: validation, launches, autograd.

``hard_attention`` and ``topk_attention`` (validate -> allocate -> grid -> launch; the
backward is a gather/scatter in PyTorch).
"""

from __future__ import annotations

import torch
import triton

from ..common import block_d, check_int, dot_precision, renamed_scale, upcast
from ..naive import repeat_kv
from .checks import check_inputs
from .forward import (
    NAN_INDEX_BLOCK,
    _hard_attn_fwd,
    _hard_nan_index,
    _topk_attn_fwd,
)
from .tiles import MAX_TOPK

# ---------------------------------------------------------------------------------
# Wrappers: validate -> allocate -> grid -> launch
# ---------------------------------------------------------------------------------


def _strides(t):
    return t.stride(0), t.stride(1), t.stride(2), t.stride(3)


def _common(q, k):
    B, H, N_q, d = q.shape
    return {
        "H": H,
        "N_Q": N_q,
        "N_K": k.shape[2],
        "GROUP": H // k.shape[1],
        "HEAD_DIM": d,
        "BLOCK_D": block_d(d),
        "UPCAST": upcast(q.dtype, q.device),
        "DOT_PRECISION": dot_precision(q.dtype),
    }


def _hard_forward(q, k, v, causal, scale, sample, seed):
    B, H, N_q, d = q.shape
    o = torch.empty((B, H, N_q, d), dtype=q.dtype, device=q.device)
    idx = torch.empty((B, H, N_q), dtype=torch.int64, device=q.device)
    grid = lambda meta: (triton.cdiv(N_q, meta["BLOCK_M"]), B * H)  # noqa: E731
    _hard_attn_fwd[grid](
        q,
        k,
        v,
        o,
        idx,
        scale,
        seed,
        *_strides(q),
        *_strides(k),
        *_strides(v),
        *_strides(o),
        IS_CAUSAL=causal,
        SAMPLE=sample,
        **_common(q, k),
    )
    # NaN rows (marked -2) get their first NaN key; a program without one stops at once
    nan_rows = idx == -2  # (B, H, N_q): a NaN among the row's visible scores
    common = _common(q, k)
    del common["BLOCK_D"], common["N_Q"], common["N_K"], common["H"]
    _hard_nan_index[(triton.cdiv(N_q, NAN_INDEX_BLOCK), B * H)](
        q,
        k,
        idx,
        scale,
        *_strides(q),
        *_strides(k),
        H,
        N_q,
        k.shape[2],
        common.pop("GROUP"),
        BLOCK_D=block_d(d),
        IS_CAUSAL=causal,
        BLOCK_M=NAN_INDEX_BLOCK,
        BLOCK_N=NAN_INDEX_BLOCK,
        num_warps=4,
        **common,
    )
    return o, idx, nan_rows


def _topk_forward(q, k, v, topk, causal, scale):
    B, H, N_q, d = q.shape
    o = torch.empty((B, H, N_q, d), dtype=q.dtype, device=q.device)
    idx = torch.empty((B, H, N_q, topk), dtype=torch.int64, device=q.device)
    lse = torch.empty((B, H, N_q), dtype=torch.float32, device=q.device)
    grid = lambda meta: (triton.cdiv(N_q, meta["BLOCK_M"]), B * H)  # noqa: E731
    _topk_attn_fwd[grid](
        q,
        k,
        v,
        o,
        idx,
        lse,
        scale,
        *_strides(q),
        *_strides(k),
        *_strides(v),
        *_strides(o),
        TOPK=topk,
        TOPK_PAD=max(16, triton.next_power_of_2(topk)),
        IS_CAUSAL=causal,
        **_common(q, k),
    )
    return o, idx, lse


def _no_keys(q, T: int | None):
    """The answer when N_k = 0: every row is empty, o = 0 and idx -1 (no launch)."""
    o = torch.zeros_like(q)  # (B, H, N_q, d)
    shape = q.shape[:3] if T is None else q.shape[:3] + (T,)
    return o, torch.full(shape, -1, dtype=torch.int64, device=q.device)


def _expand_kv(t, H):
    """(B, H_kv, N_k, d) -> (B, H, N_k, d).

    Query head h reads K/V head h // (H // H_kv).
    """
    return repeat_kv(t, H // t.shape[1])  # (B, H, N_k, d)


def _reduce_kv(g, H_kv):
    """Sum a (B, H, N_k, d) gradient over the query heads that share each K/V head."""
    B, H, N_k, d = g.shape
    return g.view(B, H_kv, H // H_kv, N_k, d).sum(2)  # (B, H_kv, N_k, d)


def _gather_rows(t, idx):
    """t (B, H, N_k, d), idx (B, H, N_q, T) with -1 = none -> (B, H, N_q, T, d).

    Slots with idx -1 gather 0.
    """
    B, H, N_q, T = idx.shape
    d = t.shape[-1]
    # (B, H, N_q*T, d)
    flat = idx.clamp(min=0).reshape(B, H, N_q * T, 1).expand(B, H, N_q * T, d)
    rows = torch.gather(t, 2, flat).view(B, H, N_q, T, d)  # (B, H, N_q, T, d)
    return rows * (idx >= 0).unsqueeze(-1).to(rows.dtype)


def _scatter_rows(values, idx, N_k):
    """Inverse of _gather_rows: sum values (B, H, N_q, T, d) into rows idx of a
    (B, H, N_k, d)."""
    B, H, N_q, T, d = values.shape
    out = torch.zeros((B, H, N_k, d), dtype=values.dtype, device=values.device)
    vals = values * (idx >= 0).unsqueeze(-1).to(values.dtype)
    flat = idx.clamp(min=0).reshape(B, H, N_q * T, 1).expand(B, H, N_q * T, d)
    return out.scatter_add_(2, flat, vals.reshape(B, H, N_q * T, d))  # (B, H, N_k, d)


class _HardAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, scale, sample, seed):
        o, idx, nan_rows = _hard_forward(q, k, v, causal, scale, sample, seed)
        ctx.save_for_backward(idx, nan_rows)
        ctx.shapes = (q.shape, k.shape)
        ctx.mark_non_differentiable(idx)
        return o, idx

    @staticmethod
    def backward(ctx, do, _didx):
        idx, nan_rows = ctx.saved_tensors
        q_shape, k_shape = ctx.shapes
        H_kv, N_k = k_shape[1], k_shape[2]
        # a NaN row's output is NaN by the rule, not v[idx]: as soft attention's NaN P,
        # it sends NaN to the value row it points at (its NaN key), never a finite dO
        dtype = do.dtype
        do = torch.where(nan_rows.unsqueeze(-1), float("nan"), do.float())
        # (B, H, N_k, d)
        dv = _scatter_rows(do.unsqueeze(3), idx.unsqueeze(3), N_k)
        dv = _reduce_kv(dv, H_kv).to(dtype)
        # o = v[argmax(q k^T)] is piecewise constant in q and k: zero gradient
        # almost everywhere
        dq = torch.zeros(q_shape, dtype=dtype, device=do.device)
        dk = torch.zeros(k_shape, dtype=dtype, device=do.device)
        return dq, dk, dv, None, None, None, None


class _TopkAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, topk, causal, scale):
        o, idx, lse = _topk_forward(q, k, v, topk, causal, scale)
        ctx.save_for_backward(q, k, v, o, idx, lse)
        ctx.scale = scale
        ctx.mark_non_differentiable(idx)
        return o, idx

    @staticmethod
    def backward(ctx, do, _didx):
        q, k, v, o, idx, lse = ctx.saved_tensors
        scale = ctx.scale
        H, H_kv, N_k = q.shape[1], k.shape[1], k.shape[2]
        qf, dof = q.float(), do.float()
        k_sel = _gather_rows(_expand_kv(k, H).float(), idx)  # (B, H, N_q, T, d)
        v_sel = _gather_rows(_expand_kv(v, H).float(), idx)  # (B, H, N_q, T, d)
        # (B, H, N_q, T) kept scores
        s = torch.einsum("bhqd,bhqtd->bhqt", qf, k_sel) * scale
        lse_safe = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
        p = torch.exp(s - lse_safe.unsqueeze(-1)) * (idx >= 0)  # (B, H, N_q, T)
        # a NaN row (lse NaN) has NaN weights on the keys it kept, as soft attention's
        # P: NaN reaches the gradients of exactly those keys, never a finite guess
        p = torch.where(torch.isnan(lse).unsqueeze(-1) & (idx >= 0), float("nan"), p)
        dp = torch.einsum("bhqd,bhqtd->bhqt", dof, v_sel)
        delta = (dof * o.float()).sum(-1, keepdim=True)  # rowsum(dO * O) = <p, dp>
        ds = p * (dp - delta)  # softmax backward over the kept scores
        dq = torch.einsum("bhqt,bhqtd->bhqd", ds, k_sel) * scale
        dk = _scatter_rows(ds.unsqueeze(-1) * qf.unsqueeze(3) * scale, idx, N_k)
        dv = _scatter_rows(p.unsqueeze(-1) * dof.unsqueeze(3), idx, N_k)
        dk, dv = _reduce_kv(dk, H_kv), _reduce_kv(dv, H_kv)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None


def hard_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    softmax_scale: float | None = None,
    sample: bool = False,
    seed: int | None = None,
    return_index: bool = False,
    *,
    sm_scale: float | None = None,
):
    """o[b, h, i] = v[b, h_kv, idx[b, h, i]]: one key per query, by argmax or sampled.

    q: (B, H, N_q, d); k, v: (B, H_kv, N_k, d) with H % H_kv == 0. ``softmax_scale``
    defaults to 1/sqrt(d) (``sm_scale=``, its old name, is deprecated).
    ``sample=False``: idx = argmax_j of the scaled scores (lowest index on ties).
    ``sample=True``: idx ~ softmax(scaled scores) by the Gumbel-max trick in the kernel;
    ``seed`` (an int; drawn from torch's generator when None) fixes the draw. A query
    that sees no key (or N_k = 0) returns o = 0 and idx = -1; a query whose visible
    scores hold a NaN returns o = NaN and idx = its first NaN key (the spec sheet's NaN
    rule). Returns o (B, H, N_q, d) and, with ``return_index``, idx (B, H, N_q) int64.
    Differentiable in v only (dq = dk = 0).
    """
    softmax_scale = renamed_scale(softmax_scale, sm_scale, "softmax_scale")
    scale = check_inputs(q, k, v, causal, softmax_scale)
    if seed is None:
        seed = int(torch.randint(0, 2**31 - 1, ()).item()) if sample else 0
    elif not isinstance(seed, int) or not 0 <= seed < 2**63:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    if k.shape[2] == 0:
        o, idx = _no_keys(q, None)
    else:
        o, idx = _HardAttention.apply(q, k, v, causal, scale, bool(sample), seed)
    return (o, idx) if return_index else o


def topk_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    topk: int,
    causal: bool = False,
    softmax_scale: float | None = None,
    return_index: bool = False,
    *,
    sm_scale: float | None = None,
):
    """Softmax over each row's ``topk`` largest scaled scores, times the kept rows of V.

    q: (B, H, N_q, d); k, v: (B, H_kv, N_k, d). When fewer than ``topk`` keys are
    visible all of them are kept (idx slots beyond them are -1); a row with none gives
    o = 0; a row with NaN scores gives o = NaN and keeps its NaN keys first (ranked as
    +inf). 1 <= topk <= MAX_TOPK (128). Differentiable in q, k and v through the kept
    scores. Returns o (B, H, N_q, d) and, with ``return_index``, the kept key indices
    (B, H, N_q, topk) int64, in no particular order.
    """
    softmax_scale = renamed_scale(softmax_scale, sm_scale, "softmax_scale")
    scale = check_inputs(q, k, v, causal, softmax_scale)
    check_int("topk", topk)
    if not 1 <= topk <= MAX_TOPK:
        raise ValueError(f"topk must be in [1, {MAX_TOPK}], got {topk}")
    if k.shape[2] == 0:
        o, idx = _no_keys(q, topk)
    else:
        o, idx = _TopkAttention.apply(q, k, v, topk, causal, scale)
    return (o, idx) if return_index else o
