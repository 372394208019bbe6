"""Hard (argmax or sampled) and top-k attention as streaming Triton kernels.

Spec sheet
----------
Algorithm
    FlashAttention-style streaming: one program owns BLOCK_M query rows, keeps its Q
    tile in SRAM and makes ONE pass over the keys in blocks of BLOCK_N; the N_q x N_k
    score matrix is never written to HBM. Instead of an online softmax the pass keeps a
    running selection per row:

    * ``hard_attention``: the running (max score, argmax) pair, m_i and idx_i. With
      ``sample=True`` each score first gets Gumbel noise -log(-log u), u = tl.rand(seed,
      offset) with one offset per (b, h, i, j), so the argmax is an exact sample from
      softmax(scores) (the Gumbel-max trick): same seed, same samples, whatever the
      block sizes. After the pass the program reads the ONE selected row of V per query.
    * ``topk_attention``: a running buffer of the TOPK best (score, index) pairs per row
      (TOPK_PAD slots, a power of two, in registers). Each key block is merged into it
      by repeated max-extraction of the block's scores that beat the buffer's minimum;
      blocks with no such score cost one comparison. Then a softmax over the kept scores
      and a gather of TOPK rows of V per query.
    The backward of top-k attention (gradient through the kept scores to q and k, and to
    the kept rows of v) uses the saved indices and log-sum-exp with PyTorch gathers and
    scatter-adds; the backward of hard attention scatters dO into dV (dQ = dK = 0: the
    argmax is piecewise constant, its gradient is zero almost everywhere).
Ties
    Deterministic: the lowest key index wins (argmax), and top-k keeps the order
    (score descending, index ascending).
Shapes
    q (B, H, N_q, d), k and v (B, H_kv, N_k, d) with H % H_kv == 0 (grouped-query
    attention); any strides. Causal masks align bottom-right (query i sees keys
    j <= i + N_k - N_q); a query that sees no key gets o = 0 and index -1, never NaN;
    a query whose visible scores hold a NaN has no valid choice: o = NaN and index -1
    (top-k: every slot -1, lse NaN), never mistaken for the empty row. A scale whose
    product with log2(e) overflows fp32 is refused (ValueError).
dtypes / head dims
    float16, bfloat16, float32 (scores accumulate in float32; float32 inputs use IEEE
    dot products so the argmax matches an fp64 reference away from exact ties).
    1 <= d <= 128 (padded to a power of two >= 16). 1 <= topk <= MAX_TOPK = 128.
Devices
    CUDA GPUs sm_75 (T4), sm_80, sm_86/89, sm_90 with triton 3.6 / 3.7; on a CPU the
    Triton interpreter (TRITON_INTERPRET=1, CPU tensors), where tiles are upcast to
    float32 because the interpreter's tl.dot mishandles bf16 (so are bf16 tiles on
    sm_75, which lacks bf16 tensor cores).
    Input checks are flash_attention's (``kernels.flash._validate``).
Known limits
    No dropout, no key-padding masks (only causal), no fused backward kernel for top-k
    (PyTorch gathers: memory O(N_q * topk * d) in the backward). Top-k's merge cost
    grows with the number of buffer insertions: ~topk * (1 + ln(N_k / topk)) per row for
    random scores, but every key for adversarial (increasing) scores; a program runs as
    many insertion steps per key block as its busiest row needs. Sampling draws one
    philox number per (query, key), so ``sample=True`` costs more than argmax.
    Tile configs (``configs``) were chosen by compiling each for sm_75/80/89/90 ahead of
    time (shared memory, registers, spills), not by timing: no GPU timed these kernels
    while they were written. ``benchmarks/suite_hard.py`` records their speed.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import runtime
from .flash import _key_range, arch_class, block_d
from .flash import _validate as _flash_validate
from .naive import repeat_kv

LOG2E = tl.constexpr(1.4426950408889634)  # log2(e): exp(x) = exp2(x * LOG2E)
MAX_HEAD_DIM = 128
MAX_TOPK = 128


# (BLOCK_M, BLOCK_N, num_warps, num_stages) per architecture class
# (kernels.flash.arch_class) and padded head dim. Each was compiled ahead of time for
# its target (triton.compile with GPUTarget, as kernels.compile_check does): shared
# memory within the limit and no register spills. Top-k uses the first entry for
# float32 tiles.
_HARD_TABLE: dict[str, dict[int, list[tuple[int, int, int, int]]]] = {
    "sm90": {64: [(64, 64, 4, 2), (128, 64, 8, 2), (128, 32, 4, 3)],
             128: [(64, 64, 4, 2), (128, 64, 8, 2), (128, 32, 4, 3)]},
    "sm80": {64: [(64, 64, 4, 2), (128, 64, 8, 2), (128, 32, 4, 3)],
             128: [(64, 64, 4, 2), (128, 64, 8, 2)]},
    "sm89": {64: [(64, 64, 4, 2), (128, 64, 8, 2), (128, 32, 4, 3)],
             128: [(64, 64, 4, 2)]},
    "sm75": {64: [(64, 64, 4, 2), (128, 64, 8, 2)], 128: [(32, 32, 4, 2)]},
}
# Argmax only (SAMPLE=False): no Philox draws or logs in the loop, so its registers
# leave room for 128 x 128 tiles, which halve the per-score loop overhead of 128 x 64 on
# sm_90 (0.0187 vs 0.0228 SASS instructions per score at d = 128, bf16). Sampling at
# 128 x 128 spills (about 1 KB per thread), so those tiles are argmax's alone; on sm_80
# at d = 128 the causal argmax spills too.
_ARGMAX_EXTRA: dict[str, dict[int, list[tuple[int, int, int, int]]]] = {
    "sm90": {64: [(128, 128, 8, 2)], 128: [(128, 128, 8, 2)]},
    "sm80": {64: [(128, 128, 8, 2)], 128: []},
}
# float32 inputs (IEEE FMA dot products need the most registers), every architecture
_HARD_FP32: dict[int, tuple[int, int, int, int]] = {64: (64, 64, 4, 2),
                                                    128: (32, 32, 4, 2)}
# top-k, by TOPK_PAD (<= 64 or 128): the (BLOCK_M, TOPK_PAD) buffer lives in registers
_TOPK_TABLE: dict[str, dict[int, list[tuple[int, int, int, int]]]] = {
    "sm90": {64: [(32, 64, 4, 2), (64, 64, 4, 2), (64, 32, 4, 2)],
             128: [(32, 64, 4, 2)]},
    "sm80": {64: [(32, 64, 4, 2), (64, 64, 4, 2), (64, 32, 4, 2)],
             128: [(32, 64, 4, 2)]},
    "sm89": {64: [(32, 64, 4, 2), (64, 64, 4, 2), (64, 32, 4, 2)],
             128: [(32, 64, 4, 2)]},
    "sm75": {64: [(32, 64, 4, 2), (64, 32, 4, 2)], 128: [(32, 64, 4, 2)]},
}
INTERPRET_CONFIG = (64, 64, 4, 1)  # the one config used under the Triton interpreter


def configs(kind: str, capability: tuple[int, int], head_dim: int, dtype=torch.float16,
            topk: int = 16, sample: bool = False) -> list[tuple[int, int, int, int]]:
    """Shipped (BLOCK_M, BLOCK_N, num_warps, num_stages) for kind "hard" (argmax, or
    Gumbel sampling with ``sample``) or "topk"."""
    arch = arch_class(capability)
    # float32 tiles: float32 inputs, and bf16 on sm_75 (upcast: no bf16 tensor cores)
    fp32_tiles = dtype == torch.float32 or (dtype == torch.bfloat16
                                            and tuple(capability) < (8, 0))
    if kind == "hard":
        d_class = 64 if block_d(head_dim) <= 64 else 128
        if fp32_tiles:
            return [_HARD_FP32[d_class]]
        extra = [] if sample else _ARGMAX_EXTRA.get(arch, {}).get(d_class, [])
        return list(_HARD_TABLE[arch][d_class]) + extra
    table = _TOPK_TABLE[arch][64 if triton.next_power_of_2(topk) <= 64 else 128]
    return list(table[:1] if fp32_tiles else table)


def _all_configs(kind: str) -> list[triton.Config]:
    """Every config any architecture ships (the pruner keeps the current GPU's list)."""
    if runtime.INTERPRET:
        tables = [[INTERPRET_CONFIG]]
    else:
        tables = (_HARD_TABLE if kind == "hard" else _TOPK_TABLE).values()
        tables = [cs for t in tables for cs in t.values()]
        if kind == "hard":
            tables.append(list(_HARD_FP32.values()))
            tables += [cs for t in _ARGMAX_EXTRA.values() for cs in t.values()]
    seen = sorted({c for cs in tables for c in cs})
    return [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=st)
            for bm, bn, w, st in seen]


def _pruner(kind: str):
    def prune(configs_, named_args, **kwargs):
        if runtime.INTERPRET:
            return configs_
        q = named_args["Q"]
        args = {**named_args, **kwargs}
        allowed = set(configs(kind, torch.cuda.get_device_capability(q.device),
                              args["HEAD_DIM"], q.dtype, args.get("TOPK_PAD", 16),
                              bool(args.get("SAMPLE", False))))
        return [c for c in configs_
                if (c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps,
                    c.num_stages) in allowed]
    return {"early_config_prune": prune}


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
        return tl.inline_asm_elementwise("lg2.approx.f32 $0, $1;", "=r,r", [x],
                                         dtype=tl.float32, is_pure=True, pack=1)
    else:
        return tl.log2(x)
GUMBEL_T_MIN = tl.constexpr(8.6e-8)  # -log2(u) for the largest u < 1 that tl.rand gives


@triton.jit
def _hard_inner(m_t, j_t, q, k_ptrs, stride_kn, offs_m, offs_n, offs_d, lo, hi,
                sm_scale, seed, rnd_row, N_Q, N_K,
                HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
                MASKED: tl.constexpr,
                CAUSAL: tl.constexpr, SIGN: tl.constexpr, SAMPLE: tl.constexpr,
                UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
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
            u = tl.reshape(tl.join(tl.join(u0, u2), tl.join(u1, u3)),
                           (BLOCK_M, BLOCK_N))
            # -log2(u) > 0; u = 0 gives +inf
            t = tl.maximum(-_log2_fast(u), GUMBEL_T_MIN)
            s = qk * (sm_scale * LOG2E) - _log2_fast(t)
        elif SIGN > 0:
            s = qk
        elif SIGN < 0:
            s = -qk
        else:  # sm_scale = 0: every finite score ties at 0 (lowest index wins)
            s = qk * sm_scale
        if MASKED:
            visible = cols[None, :] < N_K
            if CAUSAL:
                visible = visible & (cols[None, :] <= offs_m[:, None] + (N_K - N_Q))
            s = tl.where(visible, s, float("-inf"))
        better = s > m_t  # strict: an earlier key keeps a tie
        j_t = tl.where(better, cols[None, :], j_t)
        m_t = tl.maximum(m_t, s, propagate_nan=_NAN_MAX)  # a NaN score sticks
    return m_t, j_t


@triton.autotune(configs=_all_configs("hard"),
                 key=["N_Q", "N_K", "HEAD_DIM", "CAUSAL", "SAMPLE"],
                 prune_configs_by=_pruner("hard"))
@triton.heuristics({"SIGN": lambda a: (a["sm_scale"] > 0) - (a["sm_scale"] < 0)})
@triton.jit(do_not_specialize=["seed"])  # a new seed must not recompile the kernel
def _hard_attn_fwd(
    Q, K, V, O, IDX, sm_scale, seed,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_om, stride_od,
    H, N_Q, N_K, GROUP,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    CAUSAL: tl.constexpr, SAMPLE: tl.constexpr, UPCAST: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SIGN: tl.constexpr,
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
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    mask_d = offs_d < HEAD_DIM

    # q stays in SRAM for the whole pass over K
    q_ptrs = Q + off_b * stride_qb + off_h * stride_qh \
        + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd
    q = tl.load(q_ptrs, mask=(offs_m[:, None] < N_Q) & mask_d[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    k_ptrs = K + off_b * stride_kb + off_hk * stride_kh \
        + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd  # key block 0
    rnd_row = (off_bh.to(tl.int64) * N_Q + offs_m) * tl.cdiv(N_K, 4)  # Philox offsets

    # best per element
    m_t = tl.full([BLOCK_M, BLOCK_N], float("-inf"), dtype=tl.float32)
    j_t = tl.full([BLOCK_M, BLOCK_N], -1, dtype=tl.int32)  # its key index
    # causal, bottom-right: row i sees keys j <= i + N_K - N_Q; keys < full_end are seen
    # by every row of the block (no mask), keys < hi by some row
    hi, full_end = _key_range(start_m, N_Q, N_K, CAUSAL, BLOCK_M, BLOCK_N)
    m_t, j_t = _hard_inner(m_t, j_t, q, k_ptrs, stride_kn, offs_m, offs_n, offs_d,
                           0, full_end, sm_scale, seed, rnd_row, N_Q, N_K,
                           HEAD_DIM, HEAD_DIM_PAD, False, CAUSAL, SIGN, SAMPLE, UPCAST,
                           DOT_PRECISION, BLOCK_M, BLOCK_N)
    m_t, j_t = _hard_inner(m_t, j_t, q, k_ptrs, stride_kn, offs_m, offs_n, offs_d,
                           full_end, hi, sm_scale, seed, rnd_row, N_Q, N_K,
                           HEAD_DIM, HEAD_DIM_PAD, True, CAUSAL, SIGN, SAMPLE, UPCAST,
                           DOT_PRECISION, BLOCK_M, BLOCK_N)
    # the row's choice: the lowest key index among the per-element maxima
    is_nan = m_t != m_t
    nan_i = tl.max(is_nan.to(tl.int32), 1)  # 1 where a visible score was NaN
    m_t = tl.where(is_nan, float("-inf"), m_t)
    m_i = tl.max(m_t, 1)
    idx_i = tl.min(tl.where((m_t == m_i[:, None]) & (j_t >= 0), j_t, 2147483647), 1)
    idx_i = tl.where((m_i == float("-inf")) | (idx_i == 2147483647), -1, idx_i)

    # one row of V per query: a gather, not a stream
    idx_i = tl.where(nan_i > 0, -1, idx_i)
    has = (idx_i >= 0) & (offs_m < N_Q)
    v_ptrs = V + off_b * stride_vb + off_hk * stride_vh \
        + idx_i[:, None] * stride_vn + offs_d[None, :] * stride_vd
    o = tl.load(v_ptrs, mask=has[:, None] & mask_d[None, :], other=0.0).to(tl.float32)
    o = tl.where(nan_i[:, None] > 0, float("nan"), o)
    o_ptrs = O + off_b * stride_ob + off_h * stride_oh \
        + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od
    tl.store(o_ptrs, o.to(O.dtype.element_ty),
             mask=(offs_m[:, None] < N_Q) & mask_d[None, :])
    tl.store(IDX + off_bh.to(tl.int64) * N_Q + offs_m, idx_i.to(tl.int64),
             mask=offs_m < N_Q)


# ---------------------------------------------------------------------------------
# Top-k attention: a running top-k buffer, then softmax over it and TOPK gathered rows.
# ---------------------------------------------------------------------------------


@triton.autotune(configs=_all_configs("topk"),
                 key=["N_Q", "N_K", "HEAD_DIM", "CAUSAL", "TOPK_PAD"],
                 prune_configs_by=_pruner("topk"))
@triton.heuristics({"SIGN": lambda a: (a["sm_scale"] > 0) - (a["sm_scale"] < 0)})
@triton.jit
def _topk_attn_fwd(
    Q, K, V, O, IDX, LSE, sm_scale,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_om, stride_od,
    H, N_Q, N_K, GROUP, TOPK,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, TOPK_PAD: tl.constexpr,
    CAUSAL: tl.constexpr, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SIGN: tl.constexpr,
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
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    mask_d = offs_d < HEAD_DIM
    slots = tl.arange(0, TOPK_PAD)

    q_ptrs = Q + off_b * stride_qb + off_h * stride_qh \
        + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd
    q = tl.load(q_ptrs, mask=(offs_m[:, None] < N_Q) & mask_d[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    k_base = K + off_b * stride_kb + off_hk * stride_kh

    # The buffer: TOPK real slots start empty (-inf); padding slots hold +inf so they
    # are never the minimum. Empty slots carry distinct placeholder ids >= N_K.
    real = slots[None, :] < TOPK  # (1, TOPK_PAD)
    buf_s = (tl.where(real, float("-inf"), float("inf"))
             + tl.zeros([BLOCK_M, TOPK_PAD], tl.float32))
    buf_j = (N_K + slots)[None, :] + tl.zeros([BLOCK_M, TOPK_PAD], tl.int32)
    thr = tl.min(buf_s, 1)  # the k-th best score so far: a key must beat it to get in
    nan_i = tl.zeros([BLOCK_M], dtype=tl.int32)  # 1 once a visible score is NaN

    hi = N_K
    if CAUSAL:
        hi = tl.minimum(N_K, (start_m + 1) * BLOCK_M + N_K - N_Q)
    for start_n in range(0, hi, BLOCK_N):
        cols = start_n + offs_n
        k_ptrs = k_base + cols[:, None] * stride_kn + offs_d[None, :] * stride_kd
        k = tl.load(k_ptrs, mask=(cols[:, None] < N_K) & mask_d[None, :],
                    other=0.0)  # (BLOCK_N, d)
        if UPCAST:
            k = k.to(tl.float32)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)  # (BLOCK_M, BLOCK_N)
        if SIGN < 0:
            s = -s
        elif SIGN == 0:
            s = s * sm_scale  # every finite score ties at 0
        visible = cols[None, :] < N_K
        if CAUSAL:
            visible = visible & (cols[None, :] <= offs_m[:, None] + (N_K - N_Q))
        nan_i = tl.maximum(nan_i, tl.max(tl.where(visible & (s != s), 1, 0), 1))
        # NaN rows are flagged, not kept
        s = tl.where(visible & (s == s), s, float("-inf"))
        # strict >: a later key that ties the k-th best loses to it (lowest index wins)
        n_cand = tl.max(tl.sum((s > thr[:, None]).to(tl.int32), 1), 0)
        # candidates enter best-first, so a block inserts at most TOPK of them
        # usually 0 once the buffer is warm
        for _ in range(0, tl.minimum(n_cand, TOPK)):
            # the best remaining score of each row (consumed ones are -inf), lowest
            # index on ties
            c_max = tl.max(s, 1)
            c_j = tl.min(tl.where(s == c_max[:, None], cols[None, :],
                                  N_K + TOPK_PAD), 1)
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
    # keeps nothing
    valid = real & (buf_s > float("-inf")) & (nan_i[:, None] == 0)
    if SIGN != 0:  # back to scaled scores: buf * |scale| = q k^T * scale
        buf_s = buf_s * tl.abs(sm_scale)
    m_i = tl.max(tl.where(valid, buf_s, float("-inf")), 1)
    m_safe = tl.where(m_i > float("-inf"), m_i, 0.0)
    # (BLOCK_M, TOPK_PAD)
    p = tl.where(valid, tl.exp2((buf_s - m_safe[:, None]) * LOG2E), 0.0)
    l_i = tl.sum(p, 1)

    # TOPK gathered rows of V per query, accumulated in fp32
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], dtype=tl.float32)
    v_base = V + off_b * stride_vb + off_hk * stride_vh
    for t in range(0, TOPK):
        pick = slots[None, :] == t
        j_t = tl.sum(tl.where(pick, buf_j, 0), 1)
        p_t = tl.sum(tl.where(pick, p, 0.0), 1)
        ok = (p_t > 0) & (offs_m < N_Q)
        v_t = tl.load(v_base + j_t[:, None] * stride_vn + offs_d[None, :] * stride_vd,
                      mask=ok[:, None] & mask_d[None, :], other=0.0)
        acc += p_t[:, None] * v_t.to(tl.float32)

    has = l_i > 0
    o = acc / tl.where(has, l_i, 1.0)[:, None]
    lse = tl.where(has, m_safe + tl.log(tl.where(has, l_i, 1.0)), float("-inf"))
    o = tl.where(nan_i[:, None] > 0, float("nan"), o)
    lse = tl.where(nan_i > 0, float("nan"), lse)
    row = offs_m < N_Q
    o_ptrs = O + off_b * stride_ob + off_h * stride_oh \
        + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od
    tl.store(o_ptrs, o.to(O.dtype.element_ty), mask=row[:, None] & mask_d[None, :])
    tl.store(LSE + off_bh.to(tl.int64) * N_Q + offs_m, lse, mask=row)
    idx_ptrs = (IDX + (off_bh.to(tl.int64) * N_Q + offs_m[:, None]) * TOPK
                + slots[None, :])
    tl.store(idx_ptrs, tl.where(valid, buf_j, -1).to(tl.int64),
             mask=row[:, None] & real)


# ---------------------------------------------------------------------------------
# Wrappers: validate -> allocate -> grid -> launch
# ---------------------------------------------------------------------------------


def _validate(q, k, v, causal, sm_scale) -> float:
    """The checks of ``flash_attention`` (kernels/flash.py), plus this module's head-dim
    limit."""
    scale = _flash_validate(q, k, v, sm_scale)
    if q.shape[-1] > MAX_HEAD_DIM:
        raise ValueError(f"head dim d must be in 1..{MAX_HEAD_DIM}, "
                         f"got q shape {tuple(q.shape)}")
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    return scale


def _upcast(dtype: torch.dtype, device: torch.device) -> bool:
    """Tiles go through fp32 under the interpreter, and bf16 on GPUs without bf16
    tensor cores."""
    if runtime.INTERPRET:
        return True
    return dtype == torch.bfloat16 and torch.cuda.get_device_capability(device) < (8, 0)


def _strides(t):
    return t.stride(0), t.stride(1), t.stride(2), t.stride(3)


def _common(q, k):
    B, H, N_q, d = q.shape
    return {
        "H": H, "N_Q": N_q, "N_K": k.shape[2], "GROUP": H // k.shape[1], "HEAD_DIM": d,
        "HEAD_DIM_PAD": block_d(d), "UPCAST": _upcast(q.dtype, q.device),
        "DOT_PRECISION": "ieee" if q.dtype == torch.float32 else "tf32",
    }


def _hard_forward(q, k, v, causal, sm_scale, sample, seed):
    B, H, N_q, d = q.shape
    o = torch.empty((B, H, N_q, d), dtype=q.dtype, device=q.device)
    idx = torch.empty((B, H, N_q), dtype=torch.int64, device=q.device)
    grid = lambda meta: (triton.cdiv(N_q, meta["BLOCK_M"]), B * H)  # noqa: E731
    _hard_attn_fwd[grid](
        q, k, v, o, idx, sm_scale, seed,
        *_strides(q), *_strides(k), *_strides(v), *_strides(o),
        CAUSAL=causal, SAMPLE=sample, **_common(q, k),
    )
    return o, idx


def _topk_forward(q, k, v, topk, causal, sm_scale):
    B, H, N_q, d = q.shape
    o = torch.empty((B, H, N_q, d), dtype=q.dtype, device=q.device)
    idx = torch.empty((B, H, N_q, topk), dtype=torch.int64, device=q.device)
    lse = torch.empty((B, H, N_q), dtype=torch.float32, device=q.device)
    grid = lambda meta: (triton.cdiv(N_q, meta["BLOCK_M"]), B * H)  # noqa: E731
    _topk_attn_fwd[grid](
        q, k, v, o, idx, lse, sm_scale,
        *_strides(q), *_strides(k), *_strides(v), *_strides(o),
        TOPK=topk, TOPK_PAD=max(16, triton.next_power_of_2(topk)), CAUSAL=causal,
        **_common(q, k),
    )
    return o, idx, lse


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
    def forward(ctx, q, k, v, causal, sm_scale, sample, seed):
        o, idx = _hard_forward(q, k, v, causal, sm_scale, sample, seed)
        ctx.save_for_backward(idx)
        ctx.shapes = (q.shape, k.shape)
        ctx.mark_non_differentiable(idx)
        return o, idx

    @staticmethod
    def backward(ctx, do, _didx):
        (idx,) = ctx.saved_tensors
        q_shape, k_shape = ctx.shapes
        H_kv, N_k = k_shape[1], k_shape[2]
        # (B, H, N_k, d)
        dv = _scatter_rows(do.float().unsqueeze(3), idx.unsqueeze(3), N_k)
        dv = _reduce_kv(dv, H_kv).to(do.dtype)
        # o = v[argmax(q k^T)] is piecewise constant in q and k: zero gradient
        # almost everywhere
        dq = torch.zeros(q_shape, dtype=do.dtype, device=do.device)
        dk = torch.zeros(k_shape, dtype=do.dtype, device=do.device)
        return dq, dk, dv, None, None, None, None


class _TopkAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, topk, causal, sm_scale):
        o, idx, lse = _topk_forward(q, k, v, topk, causal, sm_scale)
        ctx.save_for_backward(q, k, v, o, idx, lse)
        ctx.sm_scale = sm_scale
        ctx.mark_non_differentiable(idx)
        return o, idx

    @staticmethod
    def backward(ctx, do, _didx):
        q, k, v, o, idx, lse = ctx.saved_tensors
        scale = ctx.sm_scale
        H, H_kv, N_k = q.shape[1], k.shape[1], k.shape[2]
        qf, dof = q.float(), do.float()
        k_sel = _gather_rows(_expand_kv(k, H).float(), idx)  # (B, H, N_q, T, d)
        v_sel = _gather_rows(_expand_kv(v, H).float(), idx)  # (B, H, N_q, T, d)
        # (B, H, N_q, T) kept scores
        s = torch.einsum("bhqd,bhqtd->bhqt", qf, k_sel) * scale
        lse_safe = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
        p = torch.exp(s - lse_safe.unsqueeze(-1)) * (idx >= 0)  # (B, H, N_q, T)
        dp = torch.einsum("bhqd,bhqtd->bhqt", dof, v_sel)
        delta = (dof * o.float()).sum(-1, keepdim=True)  # rowsum(dO * O) = <p, dp>
        ds = p * (dp - delta)  # softmax backward over the kept scores
        dq = torch.einsum("bhqt,bhqtd->bhqd", ds, k_sel) * scale
        dk = _scatter_rows(ds.unsqueeze(-1) * qf.unsqueeze(3) * scale, idx, N_k)
        dv = _scatter_rows(p.unsqueeze(-1) * dof.unsqueeze(3), idx, N_k)
        dk, dv = _reduce_kv(dk, H_kv), _reduce_kv(dv, H_kv)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None


def hard_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   causal: bool = False, sm_scale: float | None = None,
                   sample: bool = False, seed: int | None = None,
                   return_index: bool = False):
    """o[b, h, i] = v[b, h_kv, idx[b, h, i]]: one key per query, by argmax or sampled.

    q: (B, H, N_q, d); k, v: (B, H_kv, N_k, d) with H % H_kv == 0. ``sm_scale``
    defaults to 1/sqrt(d). ``sample=False``: idx = argmax_j of the scaled scores
    (lowest index on ties). ``sample=True``: idx ~ softmax(scaled scores) by the
    Gumbel-max trick in the kernel; ``seed`` (an int; drawn from torch's generator when
    None) fixes the draw. A query that sees no key returns o = 0 and idx = -1. Returns
    o (B, H, N_q, d) and, with ``return_index``, idx (B, H, N_q) int64. Differentiable
    in v only (dq = dk = 0).
    """
    scale = _validate(q, k, v, causal, sm_scale)
    if seed is None:
        seed = int(torch.randint(0, 2**31 - 1, ()).item()) if sample else 0
    elif not isinstance(seed, int) or not 0 <= seed < 2**63:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    o, idx = _HardAttention.apply(q, k, v, causal, scale, bool(sample), seed)
    return (o, idx) if return_index else o


def topk_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, topk: int,
                   causal: bool = False, sm_scale: float | None = None,
                   return_index: bool = False):
    """Softmax over each row's ``topk`` largest scaled scores, times the kept rows of V.

    q: (B, H, N_q, d); k, v: (B, H_kv, N_k, d). When fewer than ``topk`` keys are
    visible all of them are kept (idx slots beyond them are -1); a row with none gives
    o = 0. 1 <= topk <= MAX_TOPK (128). Differentiable in q, k and v through the kept
    scores. Returns o (B, H, N_q, d) and, with ``return_index``, the kept key indices
    (B, H, N_q, topk) int64, in no particular order.
    """
    scale = _validate(q, k, v, causal, sm_scale)
    if isinstance(topk, bool) or not isinstance(topk, int):
        raise TypeError(f"topk must be an int, got {type(topk).__name__}")
    if not 1 <= topk <= MAX_TOPK:
        raise ValueError(f"topk must be in [1, {MAX_TOPK}], got {topk}")
    o, idx = _TopkAttention.apply(q, k, v, topk, causal, scale)
    return (o, idx) if return_index else o
