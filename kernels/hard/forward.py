"""The ``@triton.jit`` kernels of hard and top-k attention.

``_hard_attn_fwd`` (a running (max, argmax) per query, or the Gumbel-max sample, then
one gathered row of V) and ``_topk_attn_fwd`` (a running top-k buffer, a softmax over it
and TOPK gathered rows of V), with their helpers.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .. import runtime
from ..common import LOG2E_JIT
from ..flash import key_range
from .tiles import (
    _all_configs,
    _pruner,
)

# ---------------------------------------------------------------------------------
# Hard attention: running (max, argmax), then one gathered row of V per query.
# ---------------------------------------------------------------------------------


_NAN_MAX = tl.constexpr(tl.PropagateNan.ALL)
_FAST_LOG = tl.constexpr(not runtime.INTERPRET)  # no inline PTX under the interpreter


@triton.jit
def _log2_fast(x):
    """log2 by the SFU (``lg2.approx.f32``: one MUFU.LG2, ~2^-22 absolute error)
    instead of libdevice's polynomial; tl.log2 under the interpreter."""
    if _FAST_LOG:
        return tl.inline_asm_elementwise(
            "lg2.approx.f32 $0, $1;",
            "=r,r",
            [x],
            dtype=tl.float32,
            is_pure=True,
            pack=1,
        )
    else:
        return tl.log2(x)


GUMBEL_T_MIN = tl.constexpr(8.6e-8)  # -log2(u) for the largest u < 1 that tl.rand gives


@triton.jit
def _hard_inner(
    m_t,
    j_t,
    q,
    k_ptrs,
    stride_kn,
    offs_m,
    offs_n,
    offs_d,
    lo,
    hi,
    sm_scale,
    seed,
    rnd_row,
    N_Q,
    N_K,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    MASKED: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    SIGN: tl.constexpr,
    SAMPLE: tl.constexpr,
    UPCAST: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Key blocks [lo, hi): a per-element running max m_t and the key j_t that set it.

    No row reductions in the loop: each score costs a compare, a select and a max.
    Argmax ranks the raw scores q k^T (SIGN = 1) or their negation (SIGN = -1, a
    negative scale): argmax(s * scale) = argmax(s) for scale > 0, so no multiply and no
    overflow for a huge scale. Sampling adds Gumbel noise in base 2:
    s * scale * log2(e) - log2(-log2(u)) (the constant log2(ln 2) drops out of the
    argmax), four uniforms per Philox call.
    MASKED=False: every pair in range is visible (no mask); MASKED=True: the diagonal
    (causal) and the ragged last block.
    ``m_t`` becomes NaN where a visible score is NaN.
    """
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        cols = start_n + offs_n
        if MASKED:
            kmask = (cols[:, None] < N_K) & (offs_d[None, :] < HEAD_DIM)
        else:
            kmask = offs_d[None, :] < HEAD_DIM
        k = tl.load(k_ptrs + start_n * stride_kn, mask=kmask, other=0.0)  # (BLOCK_N, d)
        if UPCAST:
            k = k.to(tl.float32)
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)  # (BLOCK_M, BLOCK_N)
        if SAMPLE:
            # Gumbel-max: argmax(s + g) ~ softmax(s). Key j of row i uses component
            # j % 4 of Philox call (b, h, i, j // 4): the same draw whatever the
            # tile sizes.
            quads = start_n // 4 + tl.arange(0, BLOCK_N // 4)
            u0, u1, u2, u3 = tl.rand4x(seed, rnd_row[:, None] + quads[None, :])
            u = tl.reshape(
                tl.join(tl.join(u0, u2), tl.join(u1, u3)), (BLOCK_M, BLOCK_N)
            )
            # -log2(u) > 0; u = 0 gives +inf
            t = tl.maximum(-_log2_fast(u), GUMBEL_T_MIN)
            s = qk * (sm_scale * LOG2E_JIT) - _log2_fast(t)
        elif SIGN > 0:
            s = qk
        elif SIGN < 0:
            s = -qk
        else:  # sm_scale = 0: every finite score ties at 0 (lowest index wins)
            s = qk * sm_scale
        if MASKED:
            visible = cols[None, :] < N_K
            if IS_CAUSAL:
                visible = visible & (cols[None, :] <= offs_m[:, None] + (N_K - N_Q))
            s = tl.where(visible, s, float("-inf"))
        better = s > m_t  # strict: an earlier key keeps a tie
        j_t = tl.where(better, cols[None, :], j_t)
        m_t = tl.maximum(m_t, s, propagate_nan=_NAN_MAX)  # a NaN score sticks
    return m_t, j_t


@triton.autotune(
    configs=_all_configs("hard"),
    key=["N_Q", "N_K", "HEAD_DIM", "IS_CAUSAL", "SAMPLE"],
    prune_configs_by=_pruner("hard"),
)
@triton.heuristics({"SIGN": lambda a: (a["sm_scale"] > 0) - (a["sm_scale"] < 0)})
@triton.jit(do_not_specialize=["seed"])  # a new seed must not recompile the kernel
def _hard_attn_fwd(
    Q,
    K,
    V,
    O,
    IDX,
    sm_scale,
    seed,
    stride_qb,
    stride_qh,
    stride_qm,
    stride_qd,
    stride_kb,
    stride_kh,
    stride_kn,
    stride_kd,
    stride_vb,
    stride_vh,
    stride_vn,
    stride_vd,
    stride_ob,
    stride_oh,
    stride_om,
    stride_od,
    H,
    N_Q,
    N_K,
    GROUP,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    SAMPLE: tl.constexpr,
    UPCAST: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SIGN: tl.constexpr,
):
    # SIGN: the sign of sm_scale (heuristic), so argmax ranks raw scores or
    # their negation
    start_m = tl.program_id(0)
    off_bh = tl.program_id(1)
    off_b = off_bh // H
    off_h = off_bh % H
    off_hk = off_h // GROUP  # the K/V head this query head reads (GQA)
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM

    # q stays in SRAM for the whole pass over K
    q_ptrs = (
        Q
        + off_b * stride_qb
        + off_h * stride_qh
        + offs_m[:, None] * stride_qm
        + offs_d[None, :] * stride_qd
    )
    q = tl.load(q_ptrs, mask=(offs_m[:, None] < N_Q) & mask_d[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    k_ptrs = (
        K
        + off_b * stride_kb
        + off_hk * stride_kh
        + offs_n[:, None] * stride_kn
        + offs_d[None, :] * stride_kd
    )  # key block 0
    rnd_row = (off_bh.to(tl.int64) * N_Q + offs_m) * tl.cdiv(N_K, 4)  # Philox offsets

    # best per element
    m_t = tl.full([BLOCK_M, BLOCK_N], float("-inf"), dtype=tl.float32)
    j_t = tl.full([BLOCK_M, BLOCK_N], -1, dtype=tl.int32)  # its key index
    # causal, bottom-right: row i sees keys j <= i + N_K - N_Q; keys < full_end are seen
    # by every row of the block (no mask), keys < hi by some row
    hi, full_end = key_range(start_m, N_Q, N_K, IS_CAUSAL, BLOCK_M, BLOCK_N)
    m_t, j_t = _hard_inner(
        m_t,
        j_t,
        q,
        k_ptrs,
        stride_kn,
        offs_m,
        offs_n,
        offs_d,
        0,
        full_end,
        sm_scale,
        seed,
        rnd_row,
        N_Q,
        N_K,
        HEAD_DIM,
        BLOCK_D,
        False,
        IS_CAUSAL,
        SIGN,
        SAMPLE,
        UPCAST,
        DOT_PRECISION,
        BLOCK_M,
        BLOCK_N,
    )
    m_t, j_t = _hard_inner(
        m_t,
        j_t,
        q,
        k_ptrs,
        stride_kn,
        offs_m,
        offs_n,
        offs_d,
        full_end,
        hi,
        sm_scale,
        seed,
        rnd_row,
        N_Q,
        N_K,
        HEAD_DIM,
        BLOCK_D,
        True,
        IS_CAUSAL,
        SIGN,
        SAMPLE,
        UPCAST,
        DOT_PRECISION,
        BLOCK_M,
        BLOCK_N,
    )
    # the row's choice: the lowest key index among the per-element maxima
    is_nan = m_t != m_t
    nan_i = tl.max(is_nan.to(tl.int32), 1)  # 1 where a visible score was NaN
    m_t = tl.where(is_nan, float("-inf"), m_t)
    m_i = tl.max(m_t, 1)
    idx_i = tl.min(tl.where((m_t == m_i[:, None]) & (j_t >= 0), j_t, 2147483647), 1)
    idx_i = tl.where((m_i == float("-inf")) | (idx_i == 2147483647), -1, idx_i)

    # A row whose visible scores hold a NaN: o = NaN, and idx = -2 for now (a marker
    # no caller sees): ``_hard_nan_index`` then writes its first NaN key, never -1
    # (the empty row). A second pass here would keep q alive past the loop and spill.
    idx_i = tl.where(nan_i > 0, -2, idx_i)

    # one row of V per query: a gather, not a stream
    has = (idx_i >= 0) & (offs_m < N_Q)
    v_ptrs = (
        V
        + off_b * stride_vb
        + off_hk * stride_vh
        + idx_i[:, None] * stride_vn
        + offs_d[None, :] * stride_vd
    )
    o = tl.load(v_ptrs, mask=has[:, None] & mask_d[None, :], other=0.0).to(tl.float32)
    o = tl.where(nan_i[:, None] > 0, float("nan"), o)
    o_ptrs = (
        O
        + off_b * stride_ob
        + off_h * stride_oh
        + offs_m[:, None] * stride_om
        + offs_d[None, :] * stride_od
    )
    tl.store(
        o_ptrs, o.to(O.dtype.element_ty), mask=(offs_m[:, None] < N_Q) & mask_d[None, :]
    )
    tl.store(
        IDX + off_bh.to(tl.int64) * N_Q + offs_m, idx_i.to(tl.int64), mask=offs_m < N_Q
    )


NAN_INDEX_BLOCK = 32  # BLOCK_M = BLOCK_N of _hard_nan_index (small: it rarely works)


@triton.jit
def _hard_nan_index(
    Q,
    K,
    IDX,
    sm_scale,
    stride_qb,
    stride_qh,
    stride_qm,
    stride_qd,
    stride_kb,
    stride_kh,
    stride_kn,
    stride_kd,
    H,
    N_Q,
    N_K,
    GROUP,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    UPCAST: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """The index of a NaN row (marked -2 by ``_hard_attn_fwd``): its first visible key
    whose score q k^T * sm_scale is NaN, as ``torch.argmax`` answers. A program
    whose rows hold no marker reads BLOCK_M indices and stops. The Gumbel noise of
    ``sample=True`` is finite except where u = 0 (probability 2^-32 a key), so the
    noised scores are NaN at these same keys; in that corner (an infinite score meets
    u = 0) no NaN key is found and the row gets key 0."""
    start_m = tl.program_id(0)
    off_bh = tl.program_id(1)
    off_b = off_bh // H
    off_h = off_bh % H
    off_hk = off_h // GROUP
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM
    idx_ptrs = IDX + off_bh.to(tl.int64) * N_Q + offs_m
    todo = tl.load(idx_ptrs, mask=offs_m < N_Q, other=0) == -2
    if tl.max(todo.to(tl.int32), 0) > 0:
        q = tl.load(
            Q
            + off_b * stride_qb
            + off_h * stride_qh
            + offs_m[:, None] * stride_qm
            + offs_d[None, :] * stride_qd,
            mask=(offs_m[:, None] < N_Q) & mask_d[None, :],
            other=0.0,
        )
        if UPCAST:
            q = q.to(tl.float32)
        hi = N_K
        if IS_CAUSAL:
            hi = tl.minimum(N_K, (start_m + 1) * BLOCK_M + N_K - N_Q)
        first = tl.full([BLOCK_M], 2147483647, dtype=tl.int32)
        for start_n in range(0, hi, BLOCK_N):
            cols = start_n + offs_n
            k = tl.load(
                K
                + off_b * stride_kb
                + off_hk * stride_kh
                + cols[:, None] * stride_kn
                + offs_d[None, :] * stride_kd,
                mask=(cols[:, None] < N_K) & mask_d[None, :],
                other=0.0,
            )
            if UPCAST:
                k = k.to(tl.float32)
            s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * sm_scale
            nan_s = (s != s) & (cols[None, :] < N_K)
            if IS_CAUSAL:
                nan_s = nan_s & (cols[None, :] <= offs_m[:, None] + (N_K - N_Q))
            first = tl.minimum(
                first, tl.min(tl.where(nan_s, cols[None, :], 2147483647), 1)
            )
        first = tl.where(first < 2147483647, first, 0)
        tl.store(idx_ptrs, first.to(tl.int64), mask=todo & (offs_m < N_Q))


# ---------------------------------------------------------------------------------
# Top-k attention: a running top-k buffer, then softmax over it and TOPK gathered rows.
# ---------------------------------------------------------------------------------


@triton.autotune(
    configs=_all_configs("topk"),
    key=["N_Q", "N_K", "HEAD_DIM", "IS_CAUSAL", "TOPK_PAD"],
    prune_configs_by=_pruner("topk"),
)
@triton.heuristics({"SIGN": lambda a: (a["sm_scale"] > 0) - (a["sm_scale"] < 0)})
@triton.jit
def _topk_attn_fwd(
    Q,
    K,
    V,
    O,
    IDX,
    LSE,
    sm_scale,
    stride_qb,
    stride_qh,
    stride_qm,
    stride_qd,
    stride_kb,
    stride_kh,
    stride_kn,
    stride_kd,
    stride_vb,
    stride_vh,
    stride_vn,
    stride_vd,
    stride_ob,
    stride_oh,
    stride_om,
    stride_od,
    H,
    N_Q,
    N_K,
    GROUP,
    TOPK,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    TOPK_PAD: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    UPCAST: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SIGN: tl.constexpr,
):
    # the buffer ranks raw scores q k^T (SIGN = 1), or -q k^T for a negative scale: no
    # multiply per score; the kept ones are scaled by |sm_scale| for the softmax
    start_m = tl.program_id(0)
    off_bh = tl.program_id(1)
    off_b = off_bh // H
    off_h = off_bh % H
    off_hk = off_h // GROUP
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM
    slots = tl.arange(0, TOPK_PAD)

    q_ptrs = (
        Q
        + off_b * stride_qb
        + off_h * stride_qh
        + offs_m[:, None] * stride_qm
        + offs_d[None, :] * stride_qd
    )
    q = tl.load(q_ptrs, mask=(offs_m[:, None] < N_Q) & mask_d[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    k_base = K + off_b * stride_kb + off_hk * stride_kh

    # The buffer: TOPK real slots start empty (-inf); padding slots hold +inf so they
    # are never the minimum. Empty slots carry distinct placeholder ids >= N_K.
    real = slots[None, :] < TOPK  # (1, TOPK_PAD)
    buf_s = tl.where(real, float("-inf"), float("inf")) + tl.zeros(
        [BLOCK_M, TOPK_PAD], tl.float32
    )
    buf_j = (N_K + slots)[None, :] + tl.zeros([BLOCK_M, TOPK_PAD], tl.int32)
    thr = tl.min(buf_s, 1)  # the k-th best score so far: a key must beat it to get in
    nan_i = tl.zeros([BLOCK_M], dtype=tl.int32)  # 1 once a visible score is NaN

    hi = N_K
    if IS_CAUSAL:
        hi = tl.minimum(N_K, (start_m + 1) * BLOCK_M + N_K - N_Q)
    for start_n in range(0, hi, BLOCK_N):
        cols = start_n + offs_n
        k_ptrs = k_base + cols[:, None] * stride_kn + offs_d[None, :] * stride_kd
        k = tl.load(
            k_ptrs, mask=(cols[:, None] < N_K) & mask_d[None, :], other=0.0
        )  # (BLOCK_N, d)
        if UPCAST:
            k = k.to(tl.float32)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)  # (BLOCK_M, BLOCK_N)
        if SIGN < 0:
            s = -s
        elif SIGN == 0:
            s = s * sm_scale  # every finite score ties at 0
        visible = cols[None, :] < N_K
        if IS_CAUSAL:
            visible = visible & (cols[None, :] <= offs_m[:, None] + (N_K - N_Q))
        nan_i = tl.maximum(nan_i, tl.max(tl.where(visible & (s != s), 1, 0), 1))
        # a NaN score ranks as +inf (torch.topk puts NaN first): its row is flagged
        # (o and lse NaN) and its kept slots name the NaN keys, never -1
        s = tl.where(visible, tl.where(s == s, s, float("inf")), float("-inf"))
        # strict >: a later key that ties the k-th best loses to it (lowest index wins)
        n_cand = tl.max(tl.sum((s > thr[:, None]).to(tl.int32), 1), 0)
        # candidates enter best-first, so a block inserts at most TOPK of them
        # usually 0 once the buffer is warm
        for _ in range(0, tl.minimum(n_cand, TOPK)):
            # the best remaining score of each row (consumed ones are -inf), lowest
            # index on ties
            c_max = tl.max(s, 1)
            c_j = tl.min(
                tl.where(s == c_max[:, None], cols[None, :], N_K + TOPK_PAD), 1
            )
            ins = c_max > thr  # does it beat the weakest kept entry?
            # evict the weakest entry: the minimum score, and among equal scores the
            # largest index
            ev_j = tl.max(tl.where(buf_s == thr[:, None], buf_j, -1), 1)
            sel = (buf_j == ev_j[:, None]) & ins[:, None]
            buf_s = tl.where(sel, c_max[:, None], buf_s)
            buf_j = tl.where(sel, c_j[:, None], buf_j)
            s = tl.where(cols[None, :] == c_j[:, None], float("-inf"), s)  # consumed
            thr = tl.min(buf_s, 1)

    # softmax over the kept scores (padding and empty slots weigh 0); a NaN row
    # weighs nothing (its o and lse are NaN) but reports the keys it kept
    kept = real & (buf_s > float("-inf"))
    valid = kept & (nan_i[:, None] == 0)
    if SIGN != 0:  # back to scaled scores: buf * |scale| = q k^T * scale
        buf_s = buf_s * tl.abs(sm_scale)
    m_i = tl.max(tl.where(valid, buf_s, float("-inf")), 1)
    m_safe = tl.where(m_i > float("-inf"), m_i, 0.0)
    # (BLOCK_M, TOPK_PAD)
    p = tl.where(valid, tl.exp2((buf_s - m_safe[:, None]) * LOG2E_JIT), 0.0)
    l_i = tl.sum(p, 1)

    # TOPK gathered rows of V per query, accumulated in fp32
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    v_base = V + off_b * stride_vb + off_hk * stride_vh
    for t in range(0, TOPK):
        pick = slots[None, :] == t
        j_t = tl.sum(tl.where(pick, buf_j, 0), 1)
        p_t = tl.sum(tl.where(pick, p, 0.0), 1)
        ok = (p_t > 0) & (offs_m < N_Q)
        v_t = tl.load(
            v_base + j_t[:, None] * stride_vn + offs_d[None, :] * stride_vd,
            mask=ok[:, None] & mask_d[None, :],
            other=0.0,
        )
        acc += p_t[:, None] * v_t.to(tl.float32)

    has = l_i > 0
    o = acc / tl.where(has, l_i, 1.0)[:, None]
    lse = tl.where(has, m_safe + tl.log(tl.where(has, l_i, 1.0)), float("-inf"))
    o = tl.where(nan_i[:, None] > 0, float("nan"), o)
    lse = tl.where(nan_i > 0, float("nan"), lse)
    row = offs_m < N_Q
    o_ptrs = (
        O
        + off_b * stride_ob
        + off_h * stride_oh
        + offs_m[:, None] * stride_om
        + offs_d[None, :] * stride_od
    )
    tl.store(o_ptrs, o.to(O.dtype.element_ty), mask=row[:, None] & mask_d[None, :])
    tl.store(LSE + off_bh.to(tl.int64) * N_Q + offs_m, lse, mask=row)
    idx_ptrs = (
        IDX + (off_bh.to(tl.int64) * N_Q + offs_m[:, None]) * TOPK + slots[None, :]
    )
    tl.store(idx_ptrs, tl.where(kept, buf_j, -1).to(tl.int64), mask=row[:, None] & real)
