"""The flex forward: one program per (BLOCK_M query rows, batch x q head), walking only
the key tiles its block mask lists.

``_flex_fwd`` reads the full tiles of its query tile (``full_kv_num_blocks`` /
``full_kv_indices``: no mask evaluated, only the score mod) and then the partial ones
(``kv_num_blocks`` / ``kv_indices``: the mask mod evaluated pair by pair, hidden pairs
-inf), each mask tile in BLOCK_N-key steps (``_fwd_tile``: the online softmax of
kernels.flash, with the score mod applied to the natural-unit score before the switch
to base 2). The epilogue adds the sink logit to the denominator and writes o and the
base-2 lse. ``forward`` launches it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import runtime
from ..common import LOG2E_JIT, dot_precision, upcast
from ..flash import finite_dot, load_tile
from .tiles import block_d, tiles


@triton.jit
def _fwd_tile(
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
    start_n,
    offs_m,
    offs_d,
    offs_dv,
    b,
    h,
    scale,
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
    PARTIAL: tl.constexpr,
    HAS_SCORE: tl.constexpr,
    EVEN_N: tl.constexpr,
    EVEN_D: tl.constexpr,
    UPCAST: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """One BLOCK_N-key step of the online softmax (acc, l_i, m_i in base 2)."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    k_ptrs = k_base + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd
    v_ptrs = v_base + offs_n[:, None] * stride_vn + offs_dv[None, :] * stride_vd
    # (inline, not load_tile: under the interpreter every nested call costs)
    if EVEN_N and EVEN_D:
        k = tl.load(k_ptrs)
        v = tl.load(v_ptrs)
    else:
        rows = offs_n[:, None] < N_K
        k = tl.load(k_ptrs, mask=rows & (offs_d[None, :] < HEAD_DIM), other=0.0)
        v = tl.load(v_ptrs, mask=rows & (offs_dv[None, :] < HEAD_DIM_V), other=0.0)
    if UPCAST:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
    if HAS_SCORE:
        s = SCORE_FN(qk * scale, b, h, offs_m[:, None], offs_n[None, :], SMI, SMF)
        s = s * LOG2E_JIT
    else:
        s = qk * (scale * LOG2E_JIT)
    visible = offs_n[None, :] < N_K
    if PARTIAL:
        visible = visible & MASK_FN(b, h, offs_m[:, None], offs_n[None, :], MI, MF)
        s = tl.where(visible, s, float("-inf"))
    elif not EVEN_N:
        s = tl.where(visible, s, float("-inf"))
    m_ij = tl.maximum(m_i, tl.max(s, 1))
    if not HAS_SCORE:
        # a row that sees a key here but has only -inf scores (an input inf, an fp32
        # overflow) has no softmax: NaN, never "no visible key" (kernels.flash's rule)
        if PARTIAL:
            sees = tl.max(visible.to(tl.int32), 1) > 0
        else:
            sees = start_n < N_K
        m_ij = tl.where(sees & (m_ij == float("-inf")), float("nan"), m_ij)
    m_safe = tl.where(m_ij == float("-inf"), 0.0, m_ij)
    p = tl.exp2(s - m_safe[:, None])
    alpha = tl.exp2(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    if PARTIAL:
        # a hidden value row holding NaN/inf must not reach the row through 0 * NaN
        if SHIELD:
            acc = finite_dot(acc, p, v, visible, True, DOT_PRECISION)
        else:
            acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)
    else:
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)
    return acc, l_i, m_ij


@triton.jit
def _flex_fwd(
    Q,
    K,
    V,
    Out,
    LSE2,
    SINKS,
    V_BAD,
    KV_NUM,
    KV_IDX,
    FKV_NUM,
    FKV_IDX,
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
    stride_oz,
    stride_oh,
    stride_om,
    stride_od,
    bm_sz,
    bm_sh,
    NQB,
    NKB,
    H,
    GROUP,
    N_Q,
    N_K,
    HEAD_DIM,
    HEAD_DIM_V,
    MASK_FN: tl.constexpr,
    SCORE_FN: tl.constexpr,
    HAS_SCORE: tl.constexpr,
    HAS_SINKS: tl.constexpr,
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
    # SHIELD: the second launch, which recomputes (and overwrites) the rows only when
    # V holds NaN/inf, summing partial tiles through finite_dot; otherwise it stops
    start_m = tl.program_id(0)
    off_hz = tl.program_id(1)
    b = off_hz // H
    h = off_hz % H
    h_kv = h // GROUP
    q_base = Q + b.to(tl.int64) * stride_qz + h.to(tl.int64) * stride_qh
    k_base = K + b.to(tl.int64) * stride_kz + h_kv.to(tl.int64) * stride_kh
    v_base = V + b.to(tl.int64) * stride_vz + h_kv.to(tl.int64) * stride_vh
    o_base = Out + b.to(tl.int64) * stride_oz + h.to(tl.int64) * stride_oh
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
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
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    if SHIELD:
        go = tl.load(V_BAD) != 0
    else:
        go = True
    # this query tile's row of the block mask (B and H broadcast by stride 0)
    row = b * bm_sz + h * bm_sh + (start_m * BLOCK_M) // SQ
    # the full tiles first (no mask evaluated), then the partial ones (the mask
    # evaluated pair by pair): one loop, unrolled twice at compile time
    for PARTIAL in tl.static_range(2):
        if PARTIAL:
            n_tiles = tl.load(KV_NUM + row)
            idx = KV_IDX
        else:
            n_tiles = tl.load(FKV_NUM + row)
            idx = FKV_IDX
        if SHIELD:
            n_tiles = tl.where(go, n_tiles, 0)
        for i in range(0, n_tiles * (SK // BLOCK_N)):
            kb = tl.load(idx + row * NKB + i // (SK // BLOCK_N))
            sub = i % (SK // BLOCK_N)
            acc, l_i, m_i = _fwd_tile(
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
                kb * SK + sub * BLOCK_N,
                offs_m,
                offs_d,
                offs_dv,
                b,
                h,
                scale,
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
                PARTIAL,
                HAS_SCORE,
                EVEN_N,
                EVEN_D,
                UPCAST,
                DOT_PRECISION,
                BLOCK_N,
            )
    # the sink: exp(sink) joins the denominator (base 2: sink * log2 e), not the sum
    if HAS_SINKS:
        sink = tl.load(SINKS + h).to(tl.float32) * LOG2E_JIT
        m_new = tl.maximum(m_i, sink)
        m_new = tl.where(m_i != m_i, m_i, m_new)  # a NaN row stays NaN
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.exp2(sink - m_safe)
        acc = acc * alpha[:, None]
        m_i = m_new
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    acc = acc / l_safe[:, None]
    lse2 = tl.where(empty, float("-inf"), m_i + tl.log2(l_safe))
    # l = 0 with a finite max: the top score overflowed fp32, no softmax: NaN
    overflow = empty & (m_i != float("-inf"))
    acc = tl.where(overflow[:, None], float("nan"), acc)
    lse2 = tl.where(overflow, float("nan"), lse2)
    lse_ptrs = LSE2 + off_hz.to(tl.int64) * N_Q + offs_m
    if SHIELD:
        tl.store(lse_ptrs, lse2, mask=(offs_m < N_Q) & go)
    elif EVEN_M:
        tl.store(lse_ptrs, lse2)
    else:
        tl.store(lse_ptrs, lse2, mask=offs_m < N_Q)
    o_ptrs = o_base + offs_m[:, None] * stride_om + offs_dv[None, :] * stride_od
    o = acc.to(Out.dtype.element_ty)
    if SHIELD:
        inside = (offs_m[:, None] < N_Q) & (offs_dv[None, :] < HEAD_DIM_V)
        tl.store(o_ptrs, o, mask=inside & go)
    elif EVEN_M and EVEN_D:
        tl.store(o_ptrs, o)
    else:
        tl.store(
            o_ptrs, o, mask=(offs_m[:, None] < N_Q) & (offs_dv[None, :] < HEAD_DIM_V)
        )


def mask_strides(block_mask, B: int, H: int) -> tuple[int, int]:
    """Offsets of one (batch, head) row list in the (Bm, Hm, n) count arrays: 0 along a
    broadcast axis."""
    Bm, Hm, n = block_mask.kv_num_blocks.shape
    return (Hm * n if Bm > 1 else 0), (n if Hm > 1 else 0)


def launch_flags(q, v, block_mask, kernel: str):
    """Tile, padded head dims and dtype flags of a launch."""
    d, dv = q.shape[-1], v.shape[-1]
    bd, bdv = block_d(d), block_d(dv)
    cap = (0, 0) if runtime.INTERPRET else torch.cuda.get_device_capability(q.device)
    tile = tiles(
        kernel, cap, max(bd, bdv), q.dtype, block_mask.BLOCK_SIZE, runtime.INTERPRET
    )
    return tile, bd, bdv


def walk_sizes(block_mask, N_q: int, N_k: int, bm: int, bn: int) -> tuple[int, int]:
    """The (SQ, SK) a launch with tile (bm, bn) walks: BLOCK_SIZE, or, on a side where
    one mask tile holds the whole sequence, the sequence's length rounded up to a power
    of two (at least the tile), so that the kernels step over the queries and keys
    there are, not BLOCK_SIZE // BLOCK_N steps of a tile holding 30 keys. The same
    visits: that side has one mask tile, at 0, and every row or column index
    (position // size) stays 0."""
    SQ, SK = block_mask.BLOCK_SIZE
    sq = min(SQ, max(bm, triton.next_power_of_2(max(N_q, 1))))
    sk = min(SK, max(bn, triton.next_power_of_2(max(N_k, 1))))
    return sq, sk


def forward(q, k, v, scale, block_mask, mask_pack, score_pack, sinks):
    """o (B, H, N_q, d_v) in q's dtype and the base-2 lse (B, H, N_q) float32: the
    main launch, then (when the block mask has partial tiles) the NaN/inf launch, whose
    programs stop at once unless V holds NaN/inf."""
    B, H, N_q, d = q.shape
    H_kv, N_k, dv = k.shape[1], k.shape[2], v.shape[-1]
    o = torch.empty((B, H, N_q, dv), dtype=q.dtype, device=q.device)
    lse2 = torch.empty((B, H, N_q), dtype=torch.float32, device=q.device)
    mask_fn, mi, mf = mask_pack
    has_score = score_pack is not None
    score_fn, smi, smf = score_pack[:3] if has_score else (mask_fn, mi, mf)
    if block_mask.has_partial:  # read by the NaN/inf launch only
        v_bad = ~torch.isfinite(v.sum(dtype=torch.float32))
        v_bad = v_bad.to(torch.int32).reshape(1)
    else:
        v_bad = torch.zeros(1, dtype=torch.int32, device=q.device)
    bm_sz, bm_sh = mask_strides(block_mask, B, H)
    args = (
        q,
        k,
        v,
        o,
        lse2,
        sinks if sinks is not None else lse2,
        v_bad,
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
        *o.stride(),
        bm_sz,
        bm_sh,
        block_mask.kv_num_blocks.shape[-1],
        block_mask.kv_indices.shape[-1],
        H,
        H // H_kv,
        N_q,
        N_k,
        d,
        dv,
    )
    for shield in (False, True) if block_mask.has_partial else (False,):
        if shield and runtime.INTERPRET and not int(v_bad):
            break  # on the CPU the flag is read on the host: no device to wait for
        kernel = "fwd-shield" if shield else "fwd"
        (bm, bn, warps, stages), bd, bdv = launch_flags(q, v, block_mask, kernel)
        SQ, SK = walk_sizes(block_mask, N_q, N_k, bm, bn)
        _flex_fwd[(triton.cdiv(N_q, bm), B * H)](
            *args,
            MASK_FN=mask_fn,
            SCORE_FN=score_fn,
            HAS_SCORE=has_score,
            HAS_SINKS=sinks is not None,
            BLOCK_D=bd,
            BLOCK_DV=bdv,
            UPCAST=upcast(q.dtype, q.device),
            DOT_PRECISION=dot_precision(q.dtype),
            BLOCK_M=bm,
            BLOCK_N=bn,
            SQ=SQ,
            SK=SK,
            EVEN_M=N_q % bm == 0,
            EVEN_N=N_k % SK == 0,
            EVEN_D=(d == bd) and (dv == bdv),
            SHIELD=shield,
            num_warps=warps,
            num_stages=stages,
        )
    return o, lse2
