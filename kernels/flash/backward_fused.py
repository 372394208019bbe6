"""FlashAttention backward with the five matmuls in one kernel; dQ through fp32 atomics.

Spec sheet
----------
Algorithm
    The non-deterministic alternative to :mod:`kernels.flash`'s two-kernel backward
    (``flash_attention(..., deterministic=False)``). ``delta = rowsum(dO * O)`` comes
    from :mod:`kernels.flash`'s preprocess kernel (or the caller), then
    ``_attn_bwd_fused`` runs one program per (key block of ``BLOCK_N`` keys, batch x k/v
    head). The program keeps K, V and the fp32 accumulators dK, dV on chip and streams
    the query blocks of every q head of its GQA group past them; for each it computes

        S^T = K Q^T (recomputed), P^T = exp2(S^T * scale * log2 e - lse2),
        dV += P^T dO,  dP^T = V dO^T,  dS^T = P^T * (dP^T - delta),
        dK += dS^T Q,  dQ_partial = dS K,

    and adds ``dQ_partial`` into a zeroed float32 (B, H, N_q, d) buffer with
    ``tl.atomic_add(..., sem="relaxed")`` (a ``RED`` without a fence per tile: no
    ordering is needed, only the sum). The buffer is scaled by ``sm_scale`` and cast to
    q's dtype at the end; dK is scaled once before it is stored. Against the two-kernel
    version this reads Q, dO, lse and delta once instead of twice and recomputes S and
    dP once instead of twice, at the price of the atomics' traffic to L2 and a dQ whose
    last bits depend on the order in which programs add (run to run, not reproducible).
Semantics
    As :mod:`kernels.flash`: causal bottom-right mask (full blocks unmasked, diagonal
    blocks masked), GQA/MQA (the group's q heads are looped inside the program), ragged
    N_q and N_k (padded key rows are masked before ``exp2``; padded query rows load as
    0 with lse = +inf and their atomics are masked off), rows with no visible key
    (lse = -inf) contribute nothing, a gradient on the lse enters as
    ``delta <- delta - dlse``.
NaN/inf shield
    ``bad`` is a (1,) int32 device flag, nonzero when q, k, v or dO holds a NaN/inf (the
    caller computes it, causal launches only). When it is set, the masked (diagonal)
    tiles compute dV, dK and the dQ partial query row by query row, selecting only the
    visible (query, key) pairs, so a non-finite value in a row or key hidden by the mask
    never reaches a gradient as 0 * NaN. Otherwise those tiles use ``tl.dot``.
Tiles
    ``configs`` (per architecture class, like :func:`kernels.flash.configs`): BLOCK_N
    keys held per program, BLOCK_M query rows per step. On tensor cores every shipped
    tile holds at least 64 keys (BLOCK_N >= 64, d <= 128). ``wgmma``'s N is BLOCK_M for
    S^T and dP^T and BLOCK_D for the other three (halved when 8 warps share a 64-row
    product): on sm_90 at d <= 64 the 64 x 64, 4-warp tile is n64 throughout; at
    d = 128 only 16 x 128 fits without spilling (S^T, dP^T n16; see the table notes).
Known limits
    No determinism (use the two-kernel backward for that); the dQ buffer costs
    4 x B x H x N_q x d bytes of extra memory. On sm_75 head dims above 128 are refused
    (as in the two-kernel backward).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import runtime
from ..common import LOG2E_JIT, dot_precision, upcast
from .backward import PREPROCESS_NUM_WARPS, _attn_bwd_preprocess, preprocess_block_m
from .backward_fused_blocks import _attn_bwd_fused_inner
from .blocks import _query_range, load_tile
from .checks import (
    _nonfinite_flag as nonfinite_flag,  # (1,) int32 NaN/inf flag: the same as flash's
)
from .tiles import _HEURISTICS, ARCHS, arch_class, block_d

__all__ = ["ARCHS", "backward_fused", "configs", "nonfinite_flag"]

# --------------------------------------------------------------------------------------
# Tile configurations: (BLOCK_M, BLOCK_N, num_warps, num_stages). BLOCK_N = keys held
# by the program (rows of dK/dV), BLOCK_M = query rows per inner step. Each entry is
# compiled for its target by tests/kernels/test_flash_bwd_fused.py's compile check
# (shared memory within ARCHS, no register spills).
# --------------------------------------------------------------------------------------
INTERPRET_CONFIG = (64, 64, 4, 1)

_TABLE: dict[str, dict[int, list[tuple[int, int, int, int]]]] = {
    "sm90": {
        16: [(64, 64, 4, 2), (64, 128, 8, 2)],
        32: [(64, 64, 4, 2), (64, 128, 8, 2)],
        64: [(64, 64, 4, 2), (64, 128, 8, 2)],
        128: [(16, 64, 8, 1)],
        256: [(16, 32, 8, 1)],
    },
    "sm80": {
        16: [(32, 64, 8, 2), (32, 128, 8, 1)],
        32: [(32, 64, 8, 2), (32, 128, 8, 1)],
        64: [(32, 64, 8, 2), (32, 128, 8, 1)],
        128: [(32, 64, 8, 2)],
        256: [(16, 32, 8, 1)],
    },
    "sm89": {
        16: [(32, 64, 8, 2), (32, 128, 8, 1)],
        32: [(32, 64, 8, 2), (32, 128, 8, 1)],
        64: [(32, 64, 8, 2), (32, 128, 8, 1)],
        128: [(32, 64, 8, 2)],
        256: [(16, 64, 8, 1), (16, 32, 8, 1)],
    },
}
# (From the full `make compile-check` matrix, triton 3.7.1: sm_75/80/89/90, d = 64, 80,
# 128, 256, fp16/bf16/fp32, causal or not, N = 4096 and 4000. The 64-row tiles first
# shipped on sm_80/89 spill in the causal aligned (N = 4096) variant; at d = 128 on
# sm_90 every tile with BLOCK_M >= 32 spills, and 16 x 128 spills at d = 80 (the padded
# head dim), so sm_90 ships 16 x 64 there: S^T and dP^T are n16 wgmmas. The pair-by-pair
# NaN path is what costs the registers.)
# CUDA-core (FMA) dots: fp32 inputs everywhere, every dtype on sm_75. No tile is free of
# spills on every architecture under both triton 3.7.1 and 3.6 (the GPU image's): at
# BLOCK_D >= 128 none under 3.7.1, and 32 x 32 at d = 64 spills 252 bytes on sm_90
# under 3.6. The table is empty, and flash_attention(deterministic=False) runs the
# two-kernel backward for fp32 and on sm_75.
_FMA_TABLE: dict[str, dict[int, list[tuple[int, int, int, int]]]] = {
    "fp32": {16: [], 32: [], 64: [], 128: [], 256: []},
    "sm75": {16: [], 32: [], 64: [], 128: [], 256: []},
}


def configs(
    capability: tuple[int, int], head_dim: int, dtype: torch.dtype = torch.float16
) -> list[tuple[int, int, int, int]]:
    """Shipped (BLOCK_M, BLOCK_N, num_warps, num_stages) of the fused backward.

    Empty where it is not supported (sm_75 at head dim > 128).
    """
    bd = block_d(head_dim)
    arch = arch_class(capability)
    if arch == "sm75":
        return list(_FMA_TABLE["sm75"][bd])
    if dtype == torch.float32:
        return list(_FMA_TABLE["fp32"][bd])
    return list(_TABLE[arch][bd])


def _all_configs() -> list[triton.Config]:
    if runtime.INTERPRET:
        bm, bn, w, s = INTERPRET_CONFIG
        return [
            triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s)
        ]
    seen = {
        c
        for t in (*_TABLE.values(), *_FMA_TABLE.values())
        for cs in t.values()
        for c in cs
    }
    return [
        triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s)
        for bm, bn, w, s in sorted(seen)
    ]


def _prune(configs_, named_args, **kwargs):
    q = named_args["Q"]
    head_dim = kwargs.get("HEAD_DIM", named_args.get("HEAD_DIM"))
    cap = torch.cuda.get_device_capability(q.device)
    allowed = set(configs(cap, head_dim, q.dtype))
    return [
        c
        for c in configs_
        if (c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages)
        in allowed
    ]


# --------------------------------------------------------------------------------------
# Kernel
# --------------------------------------------------------------------------------------
@triton.autotune(
    configs=_all_configs(),
    key=["HEAD_DIM", "IS_CAUSAL"],
    prune_configs_by={"early_config_prune": _prune},
    reset_to_zero=["DQ"],
)  # the tuner's trial runs add into DQ too
@triton.heuristics(_HEURISTICS)
@triton.jit
def _attn_bwd_fused(
    Q,
    K,
    V,
    DO,
    LSE2,
    Delta,
    DQ,
    DK,
    DV,
    BAD,
    sm_scale,
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
    stride_dqz,
    stride_dqh,
    stride_dqm,
    stride_dqd,
    stride_dkz,
    stride_dkh,
    stride_dkn,
    stride_dkd,
    H_KV,
    GROUP,
    N_Q,
    N_K,
    HEAD_DIM,
    IS_CAUSAL: tl.constexpr,
    BLOCK_D: tl.constexpr,
    UPCAST: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    EVEN_M: tl.constexpr,
    EVEN_N: tl.constexpr,
    EVEN_D: tl.constexpr,
):
    start_n = tl.program_id(0) * BLOCK_N  # first key of this program's block
    off_hz = tl.program_id(1)  # which (batch, k/v head)
    off_z = off_hz // H_KV
    off_hkv = off_hz % H_KV
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    k_base = K + off_z.to(tl.int64) * stride_kz + off_hkv.to(tl.int64) * stride_kh
    v_base = V + off_z.to(tl.int64) * stride_vz + off_hkv.to(tl.int64) * stride_vh
    k = load_tile(
        k_base + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd,
        offs_n,
        offs_d,
        N_K,
        HEAD_DIM,
        EVEN_N,
        EVEN_D,
    )
    v = load_tile(
        v_base + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd,
        offs_n,
        offs_d,
        N_K,
        HEAD_DIM,
        EVEN_N,
        EVEN_D,
    )
    if UPCAST:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    qk_scale = sm_scale * LOG2E_JIT
    bad = tl.load(BAD)  # q, k, v or dO holds a NaN/inf (set by causal launches only)

    # Query range, as kernels.flash's dK/dV kernel: key j is seen by rows
    # i >= j - causal_offset; rows from full_start on see every key of the block.
    causal_offset = N_K - N_Q
    lo, full_start, end_m = _query_range(start_n, N_Q, N_K, IS_CAUSAL, BLOCK_M, BLOCK_N)

    for g in range(GROUP):  # the q heads that share this k/v head (GQA)
        off_h = off_hkv * GROUP + g
        off_bh = off_z * (H_KV * GROUP) + off_h
        q_base = Q + off_z.to(tl.int64) * stride_qz + off_h.to(tl.int64) * stride_qh
        do_base = DO + off_z.to(tl.int64) * stride_doz + off_h.to(tl.int64) * stride_doh
        dq_base = DQ + off_z.to(tl.int64) * stride_dqz + off_h.to(tl.int64) * stride_dqh
        lse_base = LSE2 + off_bh.to(tl.int64) * N_Q
        delta_base = Delta + off_bh.to(tl.int64) * N_Q
        if IS_CAUSAL:  # diagonal blocks, masked
            dk, dv = _attn_bwd_fused_inner(
                dk,
                dv,
                k,
                v,
                q_base,
                do_base,
                k_base,
                v_base,
                dq_base,
                lse_base,
                delta_base,
                stride_qm,
                stride_qd,
                stride_dom,
                stride_dod,
                stride_kn,
                stride_kd,
                stride_vn,
                stride_vd,
                stride_dqm,
                stride_dqd,
                start_n,
                offs_n,
                offs_d,
                lo,
                full_start,
                qk_scale,
                N_Q,
                N_K,
                HEAD_DIM,
                causal_offset,
                bad,
                BLOCK_M,
                BLOCK_N,
                BLOCK_D,
                True,
                EVEN_M,
                EVEN_N,
                EVEN_D,
                UPCAST,
                DOT_PRECISION,
            )
        dk, dv = _attn_bwd_fused_inner(
            dk,
            dv,
            k,
            v,
            q_base,
            do_base,
            k_base,
            v_base,
            dq_base,
            lse_base,
            delta_base,
            stride_qm,
            stride_qd,
            stride_dom,
            stride_dod,
            stride_kn,
            stride_kd,
            stride_vn,
            stride_vd,
            stride_dqm,
            stride_dqd,
            start_n,
            offs_n,
            offs_d,
            full_start,
            end_m,
            qk_scale,
            N_Q,
            N_K,
            HEAD_DIM,
            causal_offset,
            bad,
            BLOCK_M,
            BLOCK_N,
            BLOCK_D,
            False,
            EVEN_M,
            EVEN_N,
            EVEN_D,
            UPCAST,
            DOT_PRECISION,
        )

    dk = dk * sm_scale  # S = scale * Q K^T  =>  dK = scale * dS^T Q
    dk_base = DK + off_z.to(tl.int64) * stride_dkz + off_hkv.to(tl.int64) * stride_dkh
    dv_base = DV + off_z.to(tl.int64) * stride_dkz + off_hkv.to(tl.int64) * stride_dkh
    tile = offs_n[:, None] * stride_dkn + offs_d[None, :] * stride_dkd
    if EVEN_N and EVEN_D:
        tl.store(dk_base + tile, dk.to(DK.dtype.element_ty))
        tl.store(dv_base + tile, dv.to(DV.dtype.element_ty))
    else:
        mask = (offs_n[:, None] < N_K) & (offs_d[None, :] < HEAD_DIM)
        tl.store(dk_base + tile, dk.to(DK.dtype.element_ty), mask=mask)
        tl.store(dv_base + tile, dv.to(DV.dtype.element_ty), mask=mask)


# --------------------------------------------------------------------------------------
# Wrapper
# --------------------------------------------------------------------------------------
def backward_fused(
    do,
    q,
    k,
    v,
    o,
    lse2,
    causal: bool,
    scale: float,
    dlse=None,
    delta=None,
    bad=None,
    *,
    tiles=None,
):
    """dq, dk, dv of the FlashAttention forward in one fused kernel (dQ by atomics).

    Args as :func:`kernels.flash.backward_lse`: do, q, o (B, H, N_q, d); k, v (B, H_kv,
    N_k, d); lse2 the forward's base-2 lse, contiguous float32 (B, H, N_q); dlse an
    optional gradient on the natural lse. ``delta`` optionally the precomputed
    rowsum(dO * O), contiguous float32 (B, H, N_q) (dlse is still applied here); None
    computes it with kernels.flash's preprocess kernel. ``bad`` the (1,) int32 NaN/inf
    flag (:func:`nonfinite_flag`); None means zeros. ``tiles`` = (BLOCK_M, BLOCK_N[,
    num_warps, num_stages]) bypasses the autotuner (tests, tile experiments).

    Returns (dq, dk, dv) in the dtypes of q, k, v.
    """
    B, H, N_q, d = q.shape
    if not runtime.INTERPRET:
        cap = torch.cuda.get_device_capability(q.device)
        if not configs(cap, d, q.dtype):
            raise ValueError(
                f"the fused backward has no tile for head dim {d}, "
                f"dtype {q.dtype} (q shape {tuple(q.shape)}) on "
                f"sm_{cap[0]}{cap[1]}: every tile tried spills registers; "
                f"use the two-kernel backward (kernels.flash.backward_lse, "
                f"flash_attention's default)"
            )
    H_kv, N_k = k.shape[1], k.shape[2]
    bd = block_d(d)
    if delta is None:
        delta = torch.empty_like(lse2)  # (B, H, N_q) float32
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
    if dlse is not None:  # d lse_i / d S_ij = P_ij: delta_i <- delta_i - dlse_i
        delta = delta - dlse.to(torch.float32)
    delta = delta.contiguous()
    if bad is None:
        bad = torch.zeros(1, dtype=torch.int32, device=q.device)
    dq = torch.zeros((B, H, N_q, d), dtype=torch.float32, device=q.device)
    dk = torch.empty((B, H_kv, N_k, d), dtype=k.dtype, device=k.device)
    dv = torch.empty_like(dk)  # dk's layout: the kernel uses dk's strides for both
    args = (
        q,
        k,
        v,
        do,
        lse2,
        delta,
        dq,
        dk,
        dv,
        bad,
        scale,
        *q.stride(),
        *k.stride(),
        *v.stride(),
        *do.stride(),
        *dq.stride(),
        *dk.stride(),
        H_kv,
        H // H_kv,
        N_q,
        N_k,
        d,
    )
    meta = dict(
        IS_CAUSAL=bool(causal),
        BLOCK_D=bd,
        UPCAST=upcast(q.dtype, q.device),
        DOT_PRECISION=dot_precision(q.dtype),
    )
    if tiles is None:
        grid = lambda META: (triton.cdiv(N_k, META["BLOCK_N"]), B * H_kv)
        _attn_bwd_fused[grid](*args, **meta)
    else:
        bm, bn, w, s = (*tiles, 4, 1)[:4] if len(tiles) == 2 else tiles
        _attn_bwd_fused.fn[(triton.cdiv(N_k, bn), B * H_kv)](
            *args, **meta, BLOCK_M=bm, BLOCK_N=bn, num_warps=w, num_stages=s
        )
    dq.mul_(scale)  # S = scale * Q K^T  =>  dQ = scale * dS K, once, in fp32
    return dq.to(q.dtype), dk, dv
