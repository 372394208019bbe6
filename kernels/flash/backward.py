"""The FlashAttention-2 backward in two kernels: delta, dK/dV, dQ.

``_attn_bwd_preprocess`` (delta = rowsum(dO * O), here), ``_attn_bwd_dkdv`` (one
program per key block, :mod:`.backward_dkdv`), ``_attn_bwd_dq`` (one program per query
block, :mod:`.backward_dq`), each recomputing P from the saved lse, and
``backward_lse``, which launches them (and their NaN-shield launches on causal
problems).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import runtime
from ..common import dot_precision, upcast
from .backward_dkdv import _attn_bwd_dkdv
from .backward_dq import _attn_bwd_dq
from .blocks import (
    load_tile,
)
from .checks import _grad_flag
from .tiles import (
    INTERPRET_CONFIG,
    block_d,
    configs,
)


def preprocess_block_m(head_dim: int) -> int:
    """Rows per program of the delta kernel: 64 x BLOCK_D fp32 tiles fit in
    registers."""
    return min(64, 4096 // block_d(head_dim))


PREPROCESS_NUM_WARPS = 4


@triton.heuristics(
    {
        "EVEN_M": lambda a: a["N_Q"] % a["BLOCK_M"] == 0,
        "EVEN_D": lambda a: a["HEAD_DIM"] == a["BLOCK_D"],
    }
)
@triton.jit
def _attn_bwd_preprocess(
    O,
    DO,
    Delta,
    stride_oz,
    stride_oh,
    stride_om,
    stride_od,
    stride_doz,
    stride_doh,
    stride_dom,
    stride_dod,
    H,
    N_Q,
    HEAD_DIM,
    BLOCK_M: tl.constexpr,
    BLOCK_D: tl.constexpr,
    EVEN_M: tl.constexpr,
    EVEN_D: tl.constexpr,
):
    """delta_i = sum_d dO[i, d] * O[i, d] (= rowsum(dP * P)).

    One (B, H, N_q) float per row.
    """
    start_m = tl.program_id(0)
    off_hz = tl.program_id(1)
    off_z = off_hz // H
    off_h = off_hz % H
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    o = load_tile(
        O
        + off_z.to(tl.int64) * stride_oz
        + off_h.to(tl.int64) * stride_oh
        + offs_m[:, None] * stride_om
        + offs_d[None, :] * stride_od,
        offs_m,
        offs_d,
        N_Q,
        HEAD_DIM,
        EVEN_M,
        EVEN_D,
    )
    do = load_tile(
        DO
        + off_z.to(tl.int64) * stride_doz
        + off_h.to(tl.int64) * stride_doh
        + offs_m[:, None] * stride_dom
        + offs_d[None, :] * stride_dod,
        offs_m,
        offs_d,
        N_Q,
        HEAD_DIM,
        EVEN_M,
        EVEN_D,
    )
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)
    # contiguous (B, H, N_q)
    delta_ptrs = Delta + off_hz.to(tl.int64) * N_Q + offs_m
    if EVEN_M:
        tl.store(delta_ptrs, delta)
    else:
        tl.store(delta_ptrs, delta, mask=offs_m < N_Q)


def backward_lse(do, q, k, v, o, lse2, causal: bool, scale: float, dlse=None):
    B, H, N_q, d = q.shape
    if not runtime.INTERPRET:
        cap = torch.cuda.get_device_capability(q.device)
        if not configs("dq", cap, d, q.dtype):
            raise ValueError(
                f"the backward pass does not support head dim {d} "
                f"(q shape {tuple(q.shape)}) on sm_{cap[0]}{cap[1]}: "
                f"without tensor cores every tile spills registers; "
                f"use d <= 128 or an sm_80+ GPU"
            )
    H_kv, N_k = k.shape[1], k.shape[2]
    group = H // H_kv
    bd = block_d(d)
    up, precision = upcast(q.dtype, q.device), dot_precision(q.dtype)
    delta = torch.empty_like(lse2)  # (B, H, N_q) float32
    dq = torch.empty((B, H, N_q, d), dtype=q.dtype, device=q.device)  # (B, H, N_q, d)
    # (B, H_kv, N_k, d)
    dk = torch.empty((B, H_kv, N_k, d), dtype=k.dtype, device=k.device)
    # same layout as dk: the kernel uses dk's strides for both
    dv = torch.empty_like(dk)

    block_m_pre = preprocess_block_m(d)
    _attn_bwd_preprocess[(triton.cdiv(N_q, block_m_pre), B * H)](
        o,
        do,
        delta,
        *o.stride(),
        *do.stride(),
        H,
        N_q,
        d,
        BLOCK_M=block_m_pre,
        BLOCK_D=bd,
        num_warps=PREPROCESS_NUM_WARPS,
    )
    if dlse is not None:
        # lse_i = log sum_j exp(S_ij): d lse_i / d S_ij = P_ij, so a gradient dL_i on
        # the lse adds dL_i * P_ij to dS_ij = P_ij (dP_ij - delta_i):
        # delta_i <- delta_i - dL_i
        delta = (delta - dlse.to(torch.float32)).contiguous()
    # NaN/inf in an input (computed on the device, no host sync): read by the causal
    # backward's second launch only
    bad = _grad_flag(causal, q, k, v, do, lse2, dlse)
    dkdv_args = (
        q,
        k,
        v,
        do,
        lse2,
        delta,
        dk,
        dv,
        bad,
        scale,
        *q.stride(),
        *k.stride(),
        *v.stride(),
        *do.stride(),
        *dk.stride(),
        H_kv,
        group,
        N_q,
        N_k,
        d,
    )
    dq_args = (
        q,
        k,
        v,
        do,
        lse2,
        delta,
        dq,
        bad,
        scale,
        *q.stride(),
        *k.stride(),
        *v.stride(),
        *do.stride(),
        *dq.stride(),
        H,
        group,
        N_q,
        N_k,
        d,
    )
    flags = dict(IS_CAUSAL=causal, BLOCK_D=bd, UPCAST=up, DOT_PRECISION=precision)
    grid_kv = lambda META: (triton.cdiv(N_k, META["BLOCK_N"]), B * H_kv)
    grid_q = lambda META: (triton.cdiv(N_q, META["BLOCK_M"]), B * H)
    _attn_bwd_dkdv[grid_kv](*dkdv_args, **flags, SHIELD=False)
    _attn_bwd_dq[grid_q](*dq_args, **flags, SHIELD=False)
    if causal:
        # A hidden pair weighs 0 in the tiles above, and 0 * NaN = NaN. If an input
        # holds NaN/inf, these launches recompute dK, dV and dQ keeping the hidden pairs
        # out of every sum (and overwrite them); otherwise each program reads the flag
        # and stops.
        bm, bn, w, st = (
            INTERPRET_CONFIG
            if runtime.INTERPRET
            else configs(
                "dq-shield", torch.cuda.get_device_capability(q.device), d, q.dtype
            )[0]
        )
        tiles = dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=w, num_stages=st)
        # .fn: the @heuristics-wrapped kernel under the @autotune
        _attn_bwd_dkdv.fn[(triton.cdiv(N_k, bn), B * H_kv)](
            *dkdv_args, **flags, SHIELD=True, **tiles
        )
        _attn_bwd_dq.fn[(triton.cdiv(N_q, bm), B * H)](
            *dq_args, **flags, SHIELD=True, **tiles
        )
    return dq, dk, dv
