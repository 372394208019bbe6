"""The flex backward (FlashAttention-2): dK/dV per key tile, dQ per query tile, each
walking only the tiles of the block mask.

``_flex_dkdv``: one program per (BLOCK_N keys, batch x k/v head); for each q head of
its GQA group it walks the query tiles of the transposed lists (``full_q_*`` then
``q_*``, the mask evaluated in partial tiles only) and accumulates dV += P^T dO and
dK += dS^T Q. ``_flex_dq`` (:mod:`.backward_dq`): one program per (BLOCK_M queries,
batch x q head), walking the kv lists as the forward does, dQ += dS K. Both recompute
P from the saved base-2 lse (which includes the sink), so no N_q x N_k tensor is
stored and no atomics are needed. With a score mod f, dS = P (dP - delta) f'(x) at
the natural score x = q.k * scale: f' from the mod's exact derivative, or a central
difference for a user's mod (``kernels.flex.mods``). delta = rowsum(dO * O) - dlse
is computed in torch. When an input holds NaN/inf (a flag computed on the device),
the partial tiles sum through kernels.flash's ``finite_dot`` so a hidden pair's NaN
reaches no visible gradient.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import runtime
from ..common import LOG2E_JIT, dot_precision, upcast
from ..flash import finite_dot, load_tile
from .backward_dq import _flex_dq, _score_and_grad
from .forward import launch_flags, mask_strides, walk_sizes


@triton.jit
def _dkdv_tile(
    dk,
    dv,
    k,
    v,
    q_base,
    do_base,
    lse_base,
    delta_base,
    stride_qm,
    stride_qd,
    stride_dom,
    stride_dod,
    start_m,
    offs_n,
    offs_d,
    offs_dv,
    b,
    h,
    scale,
    N_Q,
    N_K,
    HEAD_DIM,
    HEAD_DIM_V,
    MI,
    MF,
    SMI,
    SMF,
    SHIELD: tl.constexpr,
    MASK_FN: tl.constexpr,
    SCORE_FN: tl.constexpr,
    GRAD_FN: tl.constexpr,
    PARTIAL: tl.constexpr,
    HAS_SCORE: tl.constexpr,
    HAS_GRAD: tl.constexpr,
    EVEN_M: tl.constexpr,
    EVEN_N: tl.constexpr,
    EVEN_D: tl.constexpr,
    UPCAST: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
):
    offs_m = start_m + tl.arange(0, BLOCK_M)
    q = load_tile(
        q_base + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd,
        offs_m,
        offs_d,
        N_Q,
        HEAD_DIM,
        EVEN_M,
        EVEN_D,
    )
    do = load_tile(
        do_base + offs_m[:, None] * stride_dom + offs_dv[None, :] * stride_dod,
        offs_m,
        offs_dv,
        N_Q,
        HEAD_DIM_V,
        EVEN_M,
        EVEN_D,
    )
    if UPCAST:
        q = q.to(tl.float32)
        do = do.to(tl.float32)
    if EVEN_M:
        lse2 = tl.load(lse_base + offs_m)
        delta = tl.load(delta_base + offs_m)
    else:
        lse2 = tl.load(lse_base + offs_m, mask=offs_m < N_Q, other=float("inf"))
        delta = tl.load(delta_base + offs_m, mask=offs_m < N_Q, other=0.0)
    lse2 = tl.where(lse2 == float("-inf"), float("inf"), lse2)  # empty row: P = 0
    xT = tl.dot(k, tl.trans(q), input_precision=DOT_PRECISION) * scale  # (BN, BM)
    sT, gT = _score_and_grad(
        xT,
        b,
        h,
        offs_m[None, :],
        offs_n[:, None],
        SMI,
        SMF,
        SCORE_FN,
        GRAD_FN,
        HAS_SCORE,
        HAS_GRAD,
    )
    sT = sT * LOG2E_JIT
    visT = offs_n[:, None] < N_K
    if PARTIAL:
        visT = visT & MASK_FN(b, h, offs_m[None, :], offs_n[:, None], MI, MF)
    if PARTIAL or not EVEN_N:
        sT = tl.where(visT, sT, float("-inf"))
    pT = tl.exp2(sT - lse2[None, :])
    if PARTIAL:
        pT = tl.where(visT, pT, 0.0)  # 0 even where lse is NaN
    dpT = tl.dot(v, tl.trans(do), input_precision=DOT_PRECISION)
    dsT = pT * (dpT - delta[None, :])
    if HAS_SCORE:
        dsT = dsT * gT
    if PARTIAL or not EVEN_N:
        dsT = tl.where(visT, dsT, 0.0)
    if PARTIAL:
        if SHIELD:  # NaN/inf somewhere: only visible pairs enter the sums
            dv = finite_dot(dv, pT, do, visT, True, DOT_PRECISION)
            dk = finite_dot(dk, dsT, q, visT, False, DOT_PRECISION)
        else:
            dv = tl.dot(pT.to(do.dtype), do, dv, input_precision=DOT_PRECISION)
            dk = tl.dot(dsT.to(q.dtype), q, dk, input_precision=DOT_PRECISION)
    else:
        dv = tl.dot(pT.to(do.dtype), do, dv, input_precision=DOT_PRECISION)
        dk = tl.dot(dsT.to(q.dtype), q, dk, input_precision=DOT_PRECISION)
    return dk, dv


@triton.jit
def _flex_dkdv(
    Q,
    K,
    V,
    DO,
    LSE2,
    Delta,
    DKP,
    DVP,
    BAD,
    Q_NUM,
    Q_IDX,
    FQ_NUM,
    FQ_IDX,
    MI,
    MF,
    SMI,
    SMF,
    scale,
    stride_qz,
    stride_qh,
    stride_qm,
    stride_qd,
    stride_kz,
    stride_kh,
    stride_kn,
    stride_kd,
    stride_vz,
    stride_vh,
    stride_vn,
    stride_vd,
    stride_doz,
    stride_doh,
    stride_dom,
    stride_dod,
    stride_dkz,
    stride_dkh,
    stride_dkn,
    stride_dkd,
    stride_dvz,
    stride_dvh,
    stride_dvn,
    stride_dvd,
    bm_sz,
    bm_sh,
    NQB,
    H_KV,
    GROUP,
    N_Q,
    N_K,
    HEAD_DIM,
    HEAD_DIM_V,
    MASK_FN: tl.constexpr,
    SCORE_FN: tl.constexpr,
    GRAD_FN: tl.constexpr,
    HAS_SCORE: tl.constexpr,
    HAS_GRAD: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    UPCAST: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SQ: tl.constexpr,
    SK: tl.constexpr,
    EVEN_M: tl.constexpr,
    EVEN_N: tl.constexpr,
    EVEN_D: tl.constexpr,
    SHIELD: tl.constexpr,
):
    # SHIELD: the second launch (only when an input holds NaN/inf: it stops otherwise)
    start_n = tl.program_id(0) * BLOCK_N
    off_hz = tl.program_id(1)
    b = off_hz // H_KV
    h_kv = off_hz % H_KV
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    k = load_tile(
        K
        + b.to(tl.int64) * stride_kz
        + h_kv.to(tl.int64) * stride_kh
        + offs_n[:, None] * stride_kn
        + offs_d[None, :] * stride_kd,
        offs_n,
        offs_d,
        N_K,
        HEAD_DIM,
        EVEN_N,
        EVEN_D,
    )
    v = load_tile(
        V
        + b.to(tl.int64) * stride_vz
        + h_kv.to(tl.int64) * stride_vh
        + offs_n[:, None] * stride_vn
        + offs_dv[None, :] * stride_vd,
        offs_n,
        offs_dv,
        N_K,
        HEAD_DIM_V,
        EVEN_N,
        EVEN_D,
    )
    if UPCAST:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_DV], dtype=tl.float32)
    if SHIELD:
        go = tl.load(BAD) != 0
    else:
        go = True
    for g in range(GROUP):  # the q heads sharing this k/v head
        h = h_kv * GROUP + g
        bh = b * (H_KV * GROUP) + h
        q_base = Q + b.to(tl.int64) * stride_qz + h.to(tl.int64) * stride_qh
        do_base = DO + b.to(tl.int64) * stride_doz + h.to(tl.int64) * stride_doh
        lse_base = LSE2 + bh.to(tl.int64) * N_Q
        delta_base = Delta + bh.to(tl.int64) * N_Q
        col = b * bm_sz + h * bm_sh + start_n // SK  # this key tile's q-side lists
        # the full tiles first (no mask evaluated), then the partial ones (the mask
        # evaluated pair by pair): one loop, unrolled twice at compile time
        for PARTIAL in tl.static_range(2):
            if PARTIAL:
                n_tiles = tl.load(Q_NUM + col)
                idx = Q_IDX
            else:
                n_tiles = tl.load(FQ_NUM + col)
                idx = FQ_IDX
            if SHIELD:
                n_tiles = tl.where(go, n_tiles, 0)
            for i in range(0, n_tiles * (SQ // BLOCK_M)):
                qb = tl.load(idx + col * NQB + i // (SQ // BLOCK_M))
                sub = i % (SQ // BLOCK_M)
                dk, dv = _dkdv_tile(
                    dk,
                    dv,
                    k,
                    v,
                    q_base,
                    do_base,
                    lse_base,
                    delta_base,
                    stride_qm,
                    stride_qd,
                    stride_dom,
                    stride_dod,
                    qb * SQ + sub * BLOCK_M,
                    offs_n,
                    offs_d,
                    offs_dv,
                    b,
                    h,
                    scale,
                    N_Q,
                    N_K,
                    HEAD_DIM,
                    HEAD_DIM_V,
                    MI,
                    MF,
                    SMI,
                    SMF,
                    SHIELD,
                    MASK_FN,
                    SCORE_FN,
                    GRAD_FN,
                    PARTIAL,
                    HAS_SCORE,
                    HAS_GRAD,
                    EVEN_M,
                    EVEN_N,
                    EVEN_D,
                    UPCAST,
                    DOT_PRECISION,
                    BLOCK_M,
                )
    dk = dk * scale
    inside_k = (offs_n[:, None] < N_K) & (offs_d[None, :] < HEAD_DIM)
    inside_v = (offs_n[:, None] < N_K) & (offs_dv[None, :] < HEAD_DIM_V)
    tl.store(
        DKP
        + b.to(tl.int64) * stride_dkz
        + h_kv.to(tl.int64) * stride_dkh
        + offs_n[:, None] * stride_dkn
        + offs_d[None, :] * stride_dkd,
        dk.to(DKP.dtype.element_ty),
        mask=inside_k & go,
    )
    tl.store(
        DVP
        + b.to(tl.int64) * stride_dvz
        + h_kv.to(tl.int64) * stride_dvh
        + offs_n[:, None] * stride_dvn
        + offs_dv[None, :] * stride_dvd,
        dv.to(DVP.dtype.element_ty),
        mask=inside_v & go,
    )


def backward(do, q, k, v, o, lse2, dlse, scale, block_mask, mask_pack, score_pack):
    """(dq, dk, dv, delta): the gradients and delta = rowsum(dO * O) - dlse (B, H,
    N_q) float32 (the sinks' gradient is built from it)."""
    B, H, N_q, d = q.shape
    H_kv, N_k, dv_dim = k.shape[1], k.shape[2], v.shape[-1]
    delta = (do.float() * o.float()).sum(-1)
    if dlse is not None:
        delta = delta - dlse.float()
    delta = delta.contiguous()
    # NaN/inf in an input (on the device, no host sync): read by the NaN/inf launches,
    # which run only when the block mask has partial tiles
    bad = torch.zeros(1, dtype=torch.int32, device=q.device)
    if block_mask.has_partial:
        total = q.sum(dtype=torch.float32) + k.sum(dtype=torch.float32)
        total = total + v.sum(dtype=torch.float32) + do.sum(dtype=torch.float32)
        if dlse is not None:
            total = total + dlse.sum(dtype=torch.float32)
        bad = ~torch.isfinite(total) | torch.isnan(lse2.sum())
        bad = bad.to(torch.int32).reshape(1)
    mask_fn, mi, mf = mask_pack
    has_score = score_pack is not None
    if has_score:
        score_fn, smi, smf, grad_fn = score_pack
    else:
        score_fn, smi, smf, grad_fn = mask_fn, mi, mf, None
    has_grad = grad_fn is not None
    grad_fn = grad_fn if has_grad else score_fn
    flags = dict(
        MASK_FN=mask_fn,
        SCORE_FN=score_fn,
        GRAD_FN=grad_fn,
        HAS_SCORE=has_score,
        HAS_GRAD=has_grad,
        UPCAST=upcast(q.dtype, q.device),
        DOT_PRECISION=dot_precision(q.dtype),
    )
    dq = torch.empty_like(q)
    dk = torch.empty_like(k)
    dv = torch.empty_like(v)
    bm_sz, bm_sh = mask_strides(block_mask, B, H)
    nq_sz = (block_mask.q_num_blocks.shape[1] * block_mask.q_num_blocks.shape[2]) * (
        bm_sz != 0
    )
    nq_sh = block_mask.q_num_blocks.shape[2] * (bm_sh != 0)
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
        block_mask.q_num_blocks,
        block_mask.q_indices,
        block_mask.full_q_num_blocks,
        block_mask.full_q_indices,
        mi,
        mf,
        smi,
        smf,
        scale,
        *q.stride(),
        *k.stride(),
        *v.stride(),
        *do.stride(),
        *dk.stride(),
        *dv.stride(),
        nq_sz,
        nq_sh,
        block_mask.q_indices.shape[-1],
        H_kv,
        H // H_kv,
        N_q,
        N_k,
        d,
        dv_dim,
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
        block_mask.kv_num_blocks,
        block_mask.kv_indices,
        block_mask.full_kv_num_blocks,
        block_mask.full_kv_indices,
        mi,
        mf,
        smi,
        smf,
        scale,
        *q.stride(),
        *k.stride(),
        *v.stride(),
        *do.stride(),
        *dq.stride(),
        bm_sz,
        bm_sh,
        block_mask.kv_indices.shape[-1],
        H,
        H // H_kv,
        N_q,
        N_k,
        d,
        dv_dim,
    )
    for shield in (False, True) if block_mask.has_partial else (False,):
        if shield and runtime.INTERPRET and not int(bad):
            break  # on the CPU the flag is read on the host: no device to wait for
        sfx = "-shield" if shield else ""
        (bm, bn, w, st), bd, bdv = launch_flags(q, v, block_mask, "dkdv" + sfx)
        even_d = (d == bd) and (dv_dim == bdv)
        SQ, SK = walk_sizes(block_mask, N_q, N_k, bm, bn)
        _flex_dkdv[(triton.cdiv(N_k, bn), B * H_kv)](
            *dkdv_args,
            BLOCK_D=bd,
            BLOCK_DV=bdv,
            BLOCK_M=bm,
            BLOCK_N=bn,
            SQ=SQ,
            SK=SK,
            EVEN_M=N_q % SQ == 0,
            EVEN_N=N_k % bn == 0,
            EVEN_D=even_d,
            SHIELD=shield,
            num_warps=w,
            num_stages=st,
            **flags,
        )
        (bm, bn, w, st), bd, bdv = launch_flags(q, v, block_mask, "dq" + sfx)
        SQ, SK = walk_sizes(block_mask, N_q, N_k, bm, bn)
        _flex_dq[(triton.cdiv(N_q, bm), B * H)](
            *dq_args,
            BLOCK_D=bd,
            BLOCK_DV=bdv,
            BLOCK_M=bm,
            BLOCK_N=bn,
            SQ=SQ,
            SK=SK,
            EVEN_M=N_q % bm == 0,
            EVEN_N=N_k % SK == 0,
            EVEN_D=even_d,
            SHIELD=shield,
            num_warps=w,
            num_stages=st,
            **flags,
        )
    return dq, dk, dv, delta
