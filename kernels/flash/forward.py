"""The FlashAttention-2 forward by pointer loads: the kernel and its launches.

``_attn_fwd`` (one program per query block and batch x head; the key loop
``_attn_fwd_inner`` over the online-softmax step of :mod:`.blocks`), ``forward_lse``
(autotuned launch, returns o and the base-2 lse) and ``forward_with_tiles`` (a tile
of your choice, for the benchmark sweep).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..common import LOG2E_JIT, check_bool, dot_precision, renamed_scale, upcast
from .blocks import _store_tile, finish_rows, key_range, load_tile, softmax_pv_step
from .checks import _v_bad, check_inputs
from .tiles import _HEURISTICS, _all_configs, _pruner, block_d, n_bucket


@triton.jit
def _attn_fwd_inner(
    acc,
    l_i,
    m_i,
    q,
    k_base,
    v_base,
    stride_kn,
    stride_kd,
    stride_vn,
    stride_vd,
    offs_m,
    offs_n0,
    offs_d,
    lo,
    hi,
    qk_scale,
    N_K,
    HEAD_DIM,
    causal_offset,
    v_bad,
    BLOCK_N: tl.constexpr,
    MASKED: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    EVEN_N: tl.constexpr,
    EVEN_D: tl.constexpr,
    UPCAST: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    NEG_SCALE: tl.constexpr,
):
    """Stream key blocks [lo, hi) past the resident query tile, updating the
    online softmax.

    The k/v tile pointers are formed from the base pointers at every step. (Hoisting a
    BLOCK_N x BLOCK_D tensor of 64-bit pointers out of the loop saves integer work on
    sm_90 but keeps it in registers for the whole loop: on sm_80/89 and several sm_90
    configs ptxas then spills, so the full compile check refuses it.)
    MASKED: the diagonal blocks (causal) and the ragged last key block
    (``softmax_pv_step``).
    """
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        offs_n = start_n + offs_n0
        # -- k, v tiles: HBM -> SRAM --
        k_ptrs = k_base + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd
        v_ptrs = v_base + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd
        k = load_tile(
            k_ptrs, offs_n, offs_d, N_K, HEAD_DIM, EVEN_N or not MASKED, EVEN_D
        )
        v = load_tile(
            v_ptrs, offs_n, offs_d, N_K, HEAD_DIM, EVEN_N or not MASKED, EVEN_D
        )
        if UPCAST:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        # -- raw scores q k^T, (BLOCK_M, BLOCK_N), on chip --
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
        acc, l_i, m_i = softmax_pv_step(
            acc,
            l_i,
            m_i,
            qk,
            v,
            v_base,
            stride_vn,
            stride_vd,
            start_n,
            offs_n,
            offs_m,
            offs_d,
            qk_scale,
            N_K,
            HEAD_DIM,
            causal_offset,
            v_bad,
            BLOCK_N,
            MASKED,
            IS_CAUSAL,
            DOT_PRECISION,
            NEG_SCALE,
        )
    return acc, l_i, m_i


@triton.autotune(
    configs=_all_configs("fwd"),
    key=["HEAD_DIM", "IS_CAUSAL", "N_BUCKET"],
    prune_configs_by=_pruner("fwd"),
)
@triton.heuristics({**_HEURISTICS, "NEG_SCALE": lambda a: a["sm_scale"] < 0})
@triton.jit
def _attn_fwd(
    Q,
    K,
    V,
    Out,
    LSE2,
    V_BAD,
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
    stride_oz,
    stride_oh,
    stride_om,
    stride_od,
    H,
    GROUP,
    N_Q,
    N_K,
    HEAD_DIM,
    N_BUCKET,
    IS_CAUSAL: tl.constexpr,
    BLOCK_D: tl.constexpr,
    UPCAST: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    EVEN_M: tl.constexpr,
    EVEN_N: tl.constexpr,
    EVEN_D: tl.constexpr,
    NEG_SCALE: tl.constexpr,
):
    # N_BUCKET (n_bucket(N_K)) is only the autotuner's key; NEG_SCALE: sm_scale < 0
    start_m = tl.program_id(0)  # which BLOCK_M query rows
    off_hz = tl.program_id(1)  # which (batch, head)
    off_z = off_hz // H
    off_h = off_hz % H
    off_hkv = off_h // GROUP  # GQA: GROUP consecutive q heads share one k/v head
    q_base = Q + off_z.to(tl.int64) * stride_qz + off_h.to(tl.int64) * stride_qh
    k_base = K + off_z.to(tl.int64) * stride_kz + off_hkv.to(tl.int64) * stride_kh
    v_base = V + off_z.to(tl.int64) * stride_vz + off_hkv.to(tl.int64) * stride_vh
    o_base = Out + off_z.to(tl.int64) * stride_oz + off_h.to(tl.int64) * stride_oh

    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    qk_scale = sm_scale * LOG2E_JIT  # exp(x * scale) = exp2(x * scale * log2(e))

    # running row max (base 2), row sum and unnormalised output: on chip, in fp32
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    # q stays in SRAM for the whole inner loop
    q = load_tile(
        q_base + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd,
        offs_m,
        offs_d,
        N_Q,
        HEAD_DIM,
        EVEN_M,
        EVEN_D,
    )
    if UPCAST:
        q = q.to(tl.float32)

    # key range: keys < hi for this block, keys < full_end seen by every row
    causal_offset = N_K - N_Q
    hi, full_end = key_range(start_m, N_Q, N_K, IS_CAUSAL, BLOCK_M, BLOCK_N)
    offs_n0 = tl.arange(0, BLOCK_N)  # key offsets within a block
    v_bad = tl.load(V_BAD)  # does V hold a NaN/inf anywhere? (causal launches set it)
    # stage 1: blocks every row sees in full, no masks
    acc, l_i, m_i = _attn_fwd_inner(
        acc,
        l_i,
        m_i,
        q,
        k_base,
        v_base,
        stride_kn,
        stride_kd,
        stride_vn,
        stride_vd,
        offs_m,
        offs_n0,
        offs_d,
        0,
        full_end,
        qk_scale,
        N_K,
        HEAD_DIM,
        causal_offset,
        v_bad,
        BLOCK_N,
        False,
        IS_CAUSAL,
        EVEN_N,
        EVEN_D,
        UPCAST,
        DOT_PRECISION,
        NEG_SCALE,
    )
    # stage 2: the diagonal (causal) and the ragged last key block, masked
    if IS_CAUSAL or not EVEN_N:
        acc, l_i, m_i = _attn_fwd_inner(
            acc,
            l_i,
            m_i,
            q,
            k_base,
            v_base,
            stride_kn,
            stride_kd,
            stride_vn,
            stride_vd,
            offs_m,
            offs_n0,
            offs_d,
            full_end,
            hi,
            qk_scale,
            N_K,
            HEAD_DIM,
            causal_offset,
            v_bad,
            BLOCK_N,
            True,
            IS_CAUSAL,
            EVEN_N,
            EVEN_D,
            UPCAST,
            DOT_PRECISION,
            NEG_SCALE,
        )

    acc, lse2 = finish_rows(acc, l_i, m_i)
    lse_ptrs = LSE2 + off_hz.to(tl.int64) * N_Q + offs_m  # contiguous (B, H, N_q)
    if EVEN_M:
        tl.store(lse_ptrs, lse2)
    else:
        tl.store(lse_ptrs, lse2, mask=offs_m < N_Q)
    _store_tile(
        o_base + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od,
        acc.to(Out.dtype.element_ty),
        offs_m,
        offs_d,
        N_Q,
        HEAD_DIM,
        EVEN_M,
        EVEN_D,
    )


def forward_lse(q, k, v, causal: bool, scale: float):
    B, H, N_q, d = q.shape
    H_kv, N_k = k.shape[1], k.shape[2]
    o = torch.empty((B, H, N_q, d), dtype=q.dtype, device=q.device)  # (B, H, N_q, d)
    # (B, H, N_q), base 2
    lse2 = torch.empty((B, H, N_q), dtype=torch.float32, device=q.device)
    grid = lambda META: (triton.cdiv(N_q, META["BLOCK_M"]), B * H)
    _attn_fwd[grid](
        q,
        k,
        v,
        o,
        lse2,
        _v_bad(v, causal),
        scale,
        *q.stride(),
        *k.stride(),
        *v.stride(),
        *o.stride(),
        H,
        H // H_kv,
        N_q,
        N_k,
        d,
        n_bucket(N_k),
        IS_CAUSAL=causal,
        BLOCK_D=block_d(d),
        UPCAST=upcast(q.dtype, q.device),
        DOT_PRECISION=dot_precision(q.dtype),
    )
    return o, lse2


def forward_with_tiles(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    block_m: int,
    block_n: int,
    causal: bool = False,
    softmax_scale: float | None = None,
    num_warps: int = 4,
    num_stages: int = 2,
    *,
    sm_scale: float | None = None,
) -> torch.Tensor:
    """The forward kernel at a tile size of your choice, bypassing the autotuner.

    For tile-size experiments (the benchmark suite's BLOCK_M x BLOCK_N sweep): q (B, H,
    N_q, d), k/v (B, H_kv, N_k, d) as in :func:`flash_attention`; returns o (B, H, N_q,
    d), not differentiable. ``block_m`` and ``block_n`` must be powers of two >= 16. A
    tile that does not fit the GPU raises Triton's out-of-resources error.
    """
    softmax_scale = renamed_scale(softmax_scale, sm_scale, "softmax_scale")
    scale = check_inputs(q, k, v, softmax_scale)
    check_bool("causal", causal)
    for name, b in (("block_m", block_m), ("block_n", block_n)):
        if not isinstance(b, int) or b < 16 or b & (b - 1):
            raise ValueError(f"{name} must be a power of two >= 16, got {b!r}")
    B, H, N_q, d = q.shape
    H_kv, N_k = k.shape[1], k.shape[2]
    o = torch.empty((B, H, N_q, d), dtype=q.dtype, device=q.device)  # (B, H, N_q, d)
    lse2 = torch.empty((B, H, N_q), dtype=torch.float32, device=q.device)  # (B, H, N_q)
    grid = (triton.cdiv(N_q, block_m), B * H)
    _attn_fwd.fn[grid](  # .fn: the @heuristics-wrapped kernel under the @autotune
        q,
        k,
        v,
        o,
        lse2,
        _v_bad(v, causal),
        scale,
        *q.stride(),
        *k.stride(),
        *v.stride(),
        *o.stride(),
        H,
        H // H_kv,
        N_q,
        N_k,
        d,
        n_bucket(N_k),
        IS_CAUSAL=bool(causal),
        BLOCK_D=block_d(d),
        UPCAST=upcast(q.dtype, q.device),
        DOT_PRECISION=dot_precision(q.dtype),
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        num_warps=num_warps,
        num_stages=num_stages,
    )
    return o
