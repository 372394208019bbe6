"""FlashAttention-2 in Triton: fused forward and backward, causal or not, GQA/MQA.

Spec sheet
----------
Algorithm
    Forward: one program per (query block of ``BLOCK_M`` rows, batch x head). The query
    tile stays on chip while the program streams ``BLOCK_N``-key tiles of K and V from
    HBM, keeping a running row maximum ``m_i``, row sum ``l_i`` and unnormalised output
    ``acc`` (the online softmax). S and P exist only as on-chip tiles; HBM sees q, k, v
    read once per query block and o, lse written once. Scores are kept in base 2
    (``LOG2E`` is folded into the scale, so the kernel uses ``exp2``); the log-sum-exp
    is saved for the backward in base 2 and returned to the caller in natural log.
    Backward (FlashAttention-2): ``delta = rowsum(dO * O)`` (``_attn_bwd_preprocess``),
    then ``_attn_bwd_dkdv`` (one program per key block; loops over the query blocks of
    every q head that shares this k/v head) and ``_attn_bwd_dq`` (one program per query
    block; loops over key blocks). Both recompute ``P = exp(S - lse)`` tile by tile from
    the saved lse: no N_q x N_k tensor is ever stored and no atomics are needed.
Options (not the defaults until a GPU run has checked them)
    ``forward_path="tma"`` / ``"tma-ws"``: the forward of :mod:`kernels.flash_tma`,
    K/V tiles by TMA descriptors on sm_90 (the second with a warp-specialised key
    loop). ``deterministic=False``: :mod:`kernels.flash_bwd_fused`, the backward in one
    kernel per key block with five matmuls per tile and dQ summed by relaxed fp32
    atomics (its rounding then varies from run to run).
Shapes
    q: (B, H, N_q, d); k, v: (B, H_kv, N_k, d) with H a multiple of H_kv (GQA; H_kv = 1
    is MQA). Any N_q, N_k >= 1 (ragged edges are masked); N_q != N_k is fine.
Causal
    Bottom-right aligned (FlashAttention-2 convention): query i sees key j iff
    ``j <= i + N_k - N_q``. When N_q > N_k the first N_q - N_k rows see no key: their
    output and gradients are 0 and their lse is -inf (never NaN).
NaN and inf
    A NaN in a row's inputs gives NaN in that row's output and lse; a row with no
    visible key gives 0 and -inf; the two are never confused. A NaN/inf hidden by the
    causal mask reaches nothing: when an input holds one (a flag computed on the device
    beside each causal launch, no host sync), the masked diagonal tiles sum P V
    (forward) and P^T dO, dS^T Q, dS K (backward) pair by pair, selecting the visible
    pairs, instead of through ``tl.dot`` (where a hidden pair weighs 0 and 0 * NaN =
    NaN); the backward does this in a second launch per kernel, whose programs stop at
    once when the flag is clear. The scores q k^T * sm_scale are fp32: a row whose top
    score overflows fp32 (or whose visible scores are all -inf) has no fp32 softmax and
    reads NaN, never a finite guess or the empty-row answer. sm_scale * log2(e) itself
    must fit fp32 (ValueError).
Head dims
    1 ... 256, powers of two or not: the tile is padded to ``BLOCK_D`` = next power of
    two (at least 16) and the tail is masked, so d = 80 runs at d = 128's cost.
Dtypes
    float16, bfloat16, float32 in; o in the input dtype, lse float32; fp32 accumulation
    everywhere. float32 inputs use IEEE fp32 dot products (no TF32), matching PyTorch's
    default, with smaller tiles (they run on CUDA cores). Under the Triton interpreter
    and on sm_75, bf16 tiles are upcast to fp32 inside the kernel (correct, slower).
Devices
    CUDA GPUs sm_80 (A100), sm_86/sm_89 (A10/L4/RTX 30xx/40xx), sm_90 (H100/H200), and
    sm_75 (Colab's T4) with a caveat: Triton >= 3.2 no longer uses tensor cores below
    sm_80 (``tl.dot`` lowers to FMA), so on a T4 the kernel is correct but runs on CUDA
    cores with small FMA tiles, slower than PyTorch's cuBLAS-based attention there.
    Tile configs are chosen per architecture class and head dim (``configs``), and
    autotuned among at most three per kernel (key: head dim, causal, dtypes; the forward
    also keys on N_k rounded up to a power of two, ``n_bucket``).
    ``python -m kernels.compile_check`` compiles every shipped config for sm_75/80/89/90
    ahead of time on a CPU and checks shared memory and register spills. On a CPU
    machine the kernels run under the Triton interpreter with one fixed 64 x 64 tile.
Known limits
    No dropout, no attention bias/ALiBi, no sliding window, no variable-length (packed)
    batches, no paged KV cache, no FP8. The default path leaves wgmma to Triton (it
    picks it on sm_90 by itself) and loads by pointers; the TMA path is opt-in (above).
    The FlashAttention-3 CUDA kernels (warp-specialised pingpong schedules, FP8) are
    faster on H100.
    Head dims that are not powers of two waste the padded part of each tile. On sm_75
    the backward pass refuses head dims above 128 (ValueError): with FMA dot products
    every tile of at least 16 x 16 spills registers there.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import runtime
from .naive import check_causal, kernel_scale

LOG2E = 1.4426950408889634  # log2(e): exp(x) = exp2(x * LOG2E)
LN2 = 0.6931471805599453  # ln(2): log(x) = log2(x) * LN2
MAX_HEAD_DIM = 256
#: flash_attention's forward paths: pointer loads (the default), TMA descriptors, TMA
#: with a warp-specialised key loop (kernels.flash_tma; sm_90 only)
FORWARD_PATHS = ("pointer", "tma", "tma-ws")
_LOG2E: tl.constexpr = tl.constexpr(LOG2E)


# --------------------------------------------------------------------------------------
# Tile configurations. (BLOCK_M, BLOCK_N, num_warps, num_stages) per kernel,
# architecture and padded head dim; fp32 inputs (no tensor-core dot) get smaller tiles.
# --------------------------------------------------------------------------------------
INTERPRET_CONFIG = (64, 64, 4, 1)  # the one config used under the Triton interpreter

# fp16/bf16 tiles, by architecture class and BLOCK_D; autotuning picks among them. Each
# entry is checked by `python -m kernels.compile_check`: it fits the target's shared
# memory and ptxas reports no register spills.
_TABLES: dict[str, dict[str, dict[int, list[tuple[int, int, int, int]]]]] = {
    "fwd": {
        "sm90": {16: [(128, 64, 4, 3)], 32: [(128, 64, 4, 3)],
                 64: [(128, 64, 8, 3), (64, 64, 4, 3)],
                 128: [(128, 128, 8, 2), (128, 64, 8, 3)],
                 256: [(128, 64, 8, 2)]},
        "sm80": {16: [(128, 64, 4, 3)], 32: [(128, 64, 4, 3)],
                 64: [(128, 64, 4, 3), (128, 128, 8, 3)],
                 128: [(128, 32, 8, 3), (64, 64, 8, 2)],
                 256: [(64, 32, 8, 2)]},
        "sm89": {16: [(128, 64, 4, 2)], 32: [(128, 64, 4, 2)],
                 64: [(128, 64, 8, 3), (128, 128, 8, 2)],
                 128: [(64, 64, 8, 2), (64, 64, 4, 2)],
                 256: [(64, 32, 8, 2)]},
    },
    "dkdv": {  # BLOCK_M = query rows per inner step, BLOCK_N = keys held by the program
        "sm90": {16: [(32, 128, 8, 2)], 32: [(32, 128, 8, 2)],
                 64: [(32, 128, 8, 2), (32, 64, 4, 2)],
                 128: [(64, 64, 8, 2), (32, 128, 8, 2)],
                 256: [(64, 32, 8, 2), (16, 64, 8, 2)]},
        "sm80": {16: [(32, 128, 8, 2)], 32: [(32, 128, 8, 2)],
                 64: [(32, 128, 8, 2), (32, 64, 4, 2)],
                 128: [(64, 64, 8, 2), (32, 64, 8, 2)],
                 256: [(64, 32, 8, 2), (32, 32, 8, 2)]},
        "sm89": {16: [(32, 128, 8, 2)], 32: [(32, 128, 8, 2)],
                 64: [(32, 128, 8, 2), (32, 64, 4, 2)],
                 128: [(64, 64, 8, 2), (32, 64, 8, 2)],
                 256: [(32, 32, 8, 2), (16, 64, 8, 2)]},
    },
    "dq": {  # BLOCK_M = query rows held by the program, BLOCK_N = keys per inner step
        "sm90": {16: [(128, 64, 8, 2)], 32: [(128, 64, 8, 2)],
                 64: [(128, 64, 8, 2), (128, 32, 4, 3)],
                 128: [(128, 64, 8, 2), (128, 32, 8, 2)],
                 256: [(128, 32, 8, 2), (64, 32, 4, 2)]},
        "sm80": {16: [(128, 64, 8, 2)], 32: [(128, 64, 8, 2)],
                 64: [(128, 64, 8, 2), (128, 32, 4, 3)],
                 128: [(128, 32, 8, 2), (64, 64, 8, 2)],
                 256: [(64, 32, 4, 2)]},
        "sm89": {16: [(128, 64, 8, 2)], 32: [(128, 64, 8, 2)],
                 64: [(128, 64, 8, 2), (128, 32, 4, 3)],
                 128: [(128, 32, 8, 2), (64, 64, 8, 2)],
                 256: [(64, 32, 4, 1)]},
    },
}
# (d = 256 forward on sm80/sm89 uses 8 warps: with 4, ptxas under triton 3.6 spills a
# few bytes at 255 registers; fp32 dq at d = 128 uses 32 x 16 with 8 warps: with 4 warps
# it spills on sm_90 under triton 3.6, and 16 x 16 with 4 warps spills on sm_89. The
# causal forward's masked stage keeps a key-by-key path for value rows holding NaN/inf;
# with it 128 x 64 tiles at BLOCK_D = 128 spill on sm_80/89, and 4-warp 128 x 64 or
# 3-stage 128 x 128 tiles at d = 64/128 spill on sm_89/90: those entries use the tiles
# above, each checked by `make compile-check`. The causal backward's masked stage keeps
# a path for inputs holding NaN/inf too (``_finite_dot``): with it the 4-warp 64 x 64
# dQ tile at BLOCK_D = 128 spills on sm_80 (8 warps now), and so does the fp32 dK/dV
# tile 32 x 32 at d <= 64 (16 x 32 now).)
# Tiles for dot products on CUDA cores (FMA): float32 inputs everywhere (IEEE fp32
# dots) and every dtype on sm_75, where Triton >= 3.2 has no tensor-core path. FMA dots
# hold whole operand rows in registers, so the tiles are small. On sm_75 the backward
# has no config for BLOCK_D = 256: every tile of at least 16 x 16 spills there, so it
# is refused.
_FMA_TABLES: dict[str, dict[str, dict[int, list[tuple[int, int, int, int]]]]] = {
    "fp32": {
        "fwd": {16: [(64, 32, 8, 2)], 32: [(64, 32, 8, 2)], 64: [(64, 32, 8, 2)],
                128: [(32, 16, 4, 2)], 256: [(16, 16, 4, 1)]},
        "dkdv": {16: [(16, 32, 8, 1)], 32: [(16, 32, 8, 1)], 64: [(16, 32, 8, 1)],
                 128: [(16, 16, 4, 1)], 256: [(16, 16, 4, 1)]},
        "dq": {16: [(32, 32, 8, 1)], 32: [(32, 32, 8, 1)], 64: [(32, 32, 8, 1)],
               128: [(32, 16, 8, 1)], 256: [(16, 16, 4, 1)]},
    },
    "sm75": {
        "fwd": {16: [(64, 32, 8, 2)], 32: [(64, 32, 8, 2)], 64: [(64, 32, 8, 2)],
                128: [(32, 32, 8, 1)], 256: [(16, 16, 4, 1)]},
        "dkdv": {16: [(16, 32, 8, 1)], 32: [(16, 32, 8, 1)], 64: [(16, 32, 8, 1)],
                 128: [(16, 16, 8, 1)], 256: []},
        "dq": {16: [(32, 32, 8, 1)], 32: [(32, 32, 8, 1)], 64: [(32, 32, 8, 1)],
               128: [(16, 16, 8, 1)], 256: []},
    },
}
# The causal backward's second launch (SHIELD): it works only when an input holds
# NaN/inf, so its small tiles, one per padded head dim and dot path, are chosen to fit
# with its select-and-count path, not for speed. With CUDA-core (FMA) dots, fp32 dK/dV
# at BLOCK_D >= 128 spills even at 16 x 16 (a few hundred bytes on sm_80/90): the
# compile check reports it and accepts it for this slow path only.
_SHIELD_TABLE: dict[str, dict[int, tuple[int, int, int, int]]] = {
    "tensor-core": {16: (32, 32, 4, 1), 32: (32, 32, 4, 1), 64: (32, 32, 4, 1),
                    128: (16, 32, 4, 1), 256: (16, 16, 8, 1)},
    "fma": {bd: (16, 16, 8, 1) for bd in (16, 32, 64, 128, 256)},
}
#: Architectures the configs are written for, with their shared memory per block (bytes,
#: the opt-in maximum from the CUDA programming guide's compute-capability table).
ARCHS: dict[str, tuple[tuple[int, int], int]] = {
    "sm75": ((7, 5), 64 * 1024),
    "sm80": ((8, 0), 163 * 1024),
    "sm89": ((8, 9), 99 * 1024),
    "sm90": ((9, 0), 227 * 1024),
}


def arch_class(capability: tuple[int, int]) -> str:
    """Which config table a GPU uses: (7, 5) -> 'sm75', (8, 6)/(8, 9) -> 'sm89', ..."""
    major, minor = capability
    if major < 8:
        return "sm75"
    if major == 8:
        return "sm80" if minor == 0 else "sm89"
    if major == 12:  # consumer Blackwell: ~99 KB shared memory, like sm_89
        return "sm89"
    return "sm90"


def block_d(head_dim: int) -> int:
    """Padded head dim: the next power of two, at least 16 (the smallest tl.dot tile).
    """
    return max(16, triton.next_power_of_2(head_dim))


def configs(kernel: str, capability: tuple[int, int], head_dim: int,
            dtype: torch.dtype = torch.float16) -> list[tuple[int, int, int, int]]:
    """Shipped (BLOCK_M, BLOCK_N, num_warps, num_stages) for ``kernel`` in fwd/dkdv/dq,
    or dkdv-shield/dq-shield (the causal backward's NaN/inf launch).

    Empty when the kernel is not supported there (the sm_75 backward at head dim > 128).
    """
    bd = block_d(head_dim)
    arch = arch_class(capability)
    if kernel.endswith("-shield"):
        if not configs(kernel.removesuffix("-shield"), capability, head_dim, dtype):
            return []
        path = "fma" if arch == "sm75" or dtype == torch.float32 else "tensor-core"
        return [_SHIELD_TABLE[path][bd]]
    if arch == "sm75":
        return list(_FMA_TABLES["sm75"][kernel][bd])
    if dtype == torch.float32:
        return list(_FMA_TABLES["fp32"][kernel][bd])
    return list(_TABLES[kernel][arch][bd])


def _all_configs(kernel: str) -> list[triton.Config]:
    """Every config any architecture ships (autotune prunes to the current GPU's list).
    """
    if runtime.INTERPRET:
        bm, bn, w, s = INTERPRET_CONFIG
        return [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w,
                              num_stages=s)]
    seen = {c for table in _TABLES[kernel].values() for cs in table.values()
            for c in cs}
    seen |= {c for t in _FMA_TABLES.values() for cs in t[kernel].values() for c in cs}
    return [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s)
            for bm, bn, w, s in sorted(seen)]


def _pruner(kernel: str):
    def prune(configs_, named_args, **kwargs):
        q = named_args["Q"]
        head_dim = kwargs.get("HEAD_DIM", named_args.get("HEAD_DIM"))
        cap = torch.cuda.get_device_capability(q.device)
        allowed = set(configs(kernel, cap, head_dim, q.dtype))
        return [c for c in configs_
                if (c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps,
                    c.num_stages) in allowed]
    return {"early_config_prune": prune}


_HEURISTICS = {
    "EVEN_M": lambda a: a["N_CTX_Q"] % a["BLOCK_M"] == 0,
    "EVEN_N": lambda a: a["N_CTX_K"] % a["BLOCK_N"] == 0,
    "EVEN_D": lambda a: a["HEAD_DIM"] == a["BLOCK_D"],
}


# --------------------------------------------------------------------------------------
# Forward
# --------------------------------------------------------------------------------------
@triton.jit
def _load_tile(ptrs, offs_r, offs_d, n_rows, HEAD_DIM, EVEN_R: tl.constexpr,
               EVEN_D: tl.constexpr):
    """Load a (rows, BLOCK_D) tile; rows >= n_rows and columns >= HEAD_DIM read as 0.
    """
    if EVEN_R and EVEN_D:
        return tl.load(ptrs)
    elif EVEN_R:
        return tl.load(ptrs, mask=offs_d[None, :] < HEAD_DIM, other=0.0)
    elif EVEN_D:
        return tl.load(ptrs, mask=offs_r[:, None] < n_rows, other=0.0)
    else:
        return tl.load(ptrs,
                       mask=(offs_r[:, None] < n_rows) & (offs_d[None, :] < HEAD_DIM),
                       other=0.0)


@triton.jit
def _store_tile(ptrs, value, offs_r, offs_d, n_rows, HEAD_DIM, EVEN_R: tl.constexpr,
                EVEN_D: tl.constexpr):
    """Store a (rows, BLOCK_D) tile, skipping rows >= n_rows and columns >= HEAD_DIM.
    """
    if EVEN_R and EVEN_D:
        tl.store(ptrs, value)
    elif EVEN_R:
        tl.store(ptrs, value, mask=offs_d[None, :] < HEAD_DIM)
    elif EVEN_D:
        tl.store(ptrs, value, mask=offs_r[:, None] < n_rows)
    else:
        tl.store(ptrs, value,
                 mask=(offs_r[:, None] < n_rows) & (offs_d[None, :] < HEAD_DIM))


@triton.jit
def _select_dot(acc, a, visible, b_base, stride_br, stride_bd, start, offs, offs_d,
                n_rows, HEAD_DIM, BLOCK: tl.constexpr):
    """acc += where(visible, a, 0) @ B[start : start + BLOCK], one column of ``a`` (one
    row of B, read from global memory) at a time: rank-1 updates selected by
    ``visible``, so a hidden pair's row of B never enters a product (in ``tl.dot`` a
    hidden pair weighs 0, and 0 * NaN = NaN). ``offs`` numbers a's columns (= B's rows);
    B rows >= n_rows read as 0. The slow path of the causal masked tiles, taken only
    when V holds NaN/inf: the forward's P V."""
    for jj in range(0, BLOCK):
        col = offs == start + jj  # (BLOCK,)
        a_j = tl.sum(tl.where(col[None, :], a, 0.0), 1)  # column jj of a
        vis_j = tl.sum(tl.where(col[None, :] & visible, 1, 0), 1) > 0
        b_j = tl.load(b_base + (start + jj) * stride_br + offs_d * stride_bd,
                      mask=(offs_d < HEAD_DIM) & (start + jj < n_rows),
                      other=0.0).to(tl.float32)  # (BLOCK_D,)
        acc += tl.where(vis_j[:, None], a_j[:, None] * b_j[None, :], 0.0)
    return acc


@triton.jit
def _key_range(start_m, N_CTX_Q, N_CTX_K, IS_CAUSAL: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The keys of query block ``start_m``: (hi, full_end). Causal (bottom-right): row
    i sees keys j <= i + N_k - N_q, so the block needs keys < hi, and keys < full_end
    (a multiple of BLOCK_N) are visible to every row of the block: no mask there.
    Shared by the forwards, the dQ kernel and kernels.hard."""
    if IS_CAUSAL:
        causal_offset = N_CTX_K - N_CTX_Q
        hi = tl.maximum(tl.minimum(N_CTX_K, (start_m + 1) * BLOCK_M + causal_offset), 0)
        first_row_sees = tl.maximum(start_m * BLOCK_M + causal_offset + 1, 0)
        full_end = tl.minimum((first_row_sees // BLOCK_N) * BLOCK_N,
                              (N_CTX_K // BLOCK_N) * BLOCK_N)
    else:
        hi = N_CTX_K
        full_end = (N_CTX_K // BLOCK_N) * BLOCK_N
    return hi, full_end


@triton.jit
def _query_range(start_n, N_CTX_Q, N_CTX_K, IS_CAUSAL: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The query blocks of key block ``start_n``: (lo, full_start, end_m). Causal: key
    j is seen by rows i >= j - (N_k - N_q); rows [lo, full_start) see some keys of the
    block (masked), rows [full_start, end_m) every key. Shared by the dK/dV kernel and
    kernels.flash_bwd_fused."""
    end_m = tl.cdiv(N_CTX_Q, BLOCK_M) * BLOCK_M
    if IS_CAUSAL:
        causal_offset = N_CTX_K - N_CTX_Q
        lo = (tl.maximum(start_n - causal_offset, 0) // BLOCK_M) * BLOCK_M
        full_start = tl.cdiv(tl.maximum(start_n + BLOCK_N - 1 - causal_offset, 0),
                             BLOCK_M) * BLOCK_M
        full_start = tl.minimum(full_start, end_m)
        lo = tl.minimum(lo, full_start)
    else:
        lo = 0
        full_start = 0
    return lo, full_start, end_m


@triton.jit
def _masked_row_max(m_i, s, start_n, offs_m, N_CTX_K, causal_offset,
                    IS_CAUSAL: tl.constexpr):
    """The running row max after a masked tile of base-2 scores ``s`` (hidden pairs
    -inf), and the value to subtract from the scores (0 for a row with no visible key
    yet, whose max stays -inf).

    A row that sees a key of this tile but whose scores are all -inf (an input inf, or
    q k^T * scale overflowing fp32) has no softmax: NaN, never read as "no visible
    key". (The tile's first key is visible to a row iff any of its keys is.)
    """
    m_ij = tl.maximum(m_i, tl.max(s, 1))
    sees = start_n < N_CTX_K
    if IS_CAUSAL:
        sees = sees & (start_n <= offs_m + causal_offset)
    m_ij = tl.where(sees & (m_ij == float("-inf")), float("nan"), m_ij)
    return m_ij, tl.where(m_ij == float("-inf"), 0.0, m_ij)


@triton.jit
def _finish_rows(acc, l_i, m_i):
    """The forward's epilogue: o = acc / l and the base-2 lse (on the same fp32 grid
    as the scores the backward recomputes). A row that saw no key has l = 0: o = 0, lse
    = -inf. l = 0 with a max other than -inf means the row's top score overflowed fp32
    (q k^T * scale beyond 3.4e38; otherwise its own key adds exp2(0) = 1): no fp32
    softmax exists, so NaN, never the "no visible key" answer."""
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    acc = acc / l_safe[:, None]
    lse2 = tl.where(empty, float("-inf"), m_i + tl.log2(l_safe))
    overflow = empty & (m_i != float("-inf"))
    acc = tl.where(overflow[:, None], float("nan"), acc)
    return acc, tl.where(overflow, float("nan"), lse2)


@triton.jit
def _softmax_pv_step(acc, l_i, m_i, qk, v, v_base, stride_vn, stride_vd, start_n,
                     offs_n, offs_m, offs_d, qk_scale, N_CTX_K, HEAD_DIM, causal_offset,
                     v_bad, BLOCK_N: tl.constexpr, MASKED: tl.constexpr,
                     IS_CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
                     NEG_SCALE: tl.constexpr):
    """One key block of the online softmax, from the raw scores qk = q k^T of the
    block and its value tile v: the new running max, row sum and accumulator.
    (Shared by the pointer forward here and the TMA forward of kernels.flash_tma,
    which differ only in how k and v reach SRAM.)

    MASKED=False: every (query, key) pair in range is visible, no mask is computed, and
    the scale is folded into one FFMA per score: m = max(m, rowmax(qk) * scale) and p =
    exp2(qk * scale - m) (rowmin when the scale is negative, NEG_SCALE).
    MASKED=True: the diagonal blocks (causal) and the ragged last key block; there the
    scores are scaled first and then masked with -inf (the order the sign needs).
    """
    if MASKED:
        # scores in base 2: s = q k^T * scale * log2(e), hidden pairs -inf
        s = qk * qk_scale
        visible = offs_n[None, :] < N_CTX_K
        if IS_CAUSAL:
            visible = visible & (offs_n[None, :] <= offs_m[:, None] + causal_offset)
        s = tl.where(visible, s, float("-inf"))
        # -- online softmax: new running max, rescale what was accumulated so far --
        m_ij, m_ij_safe = _masked_row_max(m_i, s, start_n, offs_m, N_CTX_K,
                                          causal_offset, IS_CAUSAL)
        p = tl.exp2(s - m_ij_safe[:, None])
    else:
        # max of qk * scale without scaling every score: the scale is one number
        if NEG_SCALE:
            m_ij = tl.maximum(m_i, tl.min(qk, 1) * qk_scale)
        else:
            m_ij = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        m_ij_safe = m_ij
        p = tl.exp2(qk * qk_scale - m_ij[:, None])  # one FFMA per score
    alpha = tl.exp2(m_i - m_ij_safe)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    if MASKED and IS_CAUSAL:
        # A hidden key has p = 0, but 0 * NaN = NaN: a NaN/inf in a value row hidden
        # from a query would reach it through the dot. When V holds a non-finite
        # value anywhere (v_bad: one flag computed beside the launch), the causal
        # tiles are summed key by key instead, selecting only the visible terms, so
        # no result depends on the tiles. (The keys past N_CTX_K of a ragged tile
        # load as 0 and need no care. Scanning each tile for non-finite values
        # instead costs a float32 copy of it in registers: ptxas spills.)
        if v_bad != 0:
            acc = _select_dot(acc, p, visible, v_base, stride_vn, stride_vd,
                              start_n, offs_n, offs_d, N_CTX_K, HEAD_DIM, BLOCK_N)
        else:
            acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)
    else:
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)
    return acc, l_i, m_ij


@triton.jit
def _attn_fwd_inner(acc, l_i, m_i, q, k_base, v_base,
                    stride_kn, stride_kd, stride_vn, stride_vd,
                    offs_m, offs_n0, offs_d, lo, hi, qk_scale, N_CTX_K, HEAD_DIM,
                    causal_offset, v_bad,
                    BLOCK_N: tl.constexpr, MASKED: tl.constexpr,
                    IS_CAUSAL: tl.constexpr,
                    EVEN_N: tl.constexpr, EVEN_D: tl.constexpr, UPCAST: tl.constexpr,
                    DOT_PRECISION: tl.constexpr, NEG_SCALE: tl.constexpr):
    """Stream key blocks [lo, hi) past the resident query tile, updating the
    online softmax.

    The k/v tile pointers are formed from the base pointers at every step. (Hoisting a
    BLOCK_N x BLOCK_D tensor of 64-bit pointers out of the loop saves integer work on
    sm_90 but keeps it in registers for the whole loop: on sm_80/89 and several sm_90
    configs ptxas then spills, so the full compile check refuses it.)
    MASKED: the diagonal blocks (causal) and the ragged last key block
    (``_softmax_pv_step``).
    """
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        offs_n = start_n + offs_n0
        # -- k, v tiles: HBM -> SRAM --
        k_ptrs = k_base + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd
        v_ptrs = v_base + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd
        k = _load_tile(k_ptrs, offs_n, offs_d, N_CTX_K, HEAD_DIM, EVEN_N or not MASKED,
                       EVEN_D)
        v = _load_tile(v_ptrs, offs_n, offs_d, N_CTX_K, HEAD_DIM, EVEN_N or not MASKED,
                       EVEN_D)
        if UPCAST:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        # -- raw scores q k^T, (BLOCK_M, BLOCK_N), on chip --
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
        acc, l_i, m_i = _softmax_pv_step(
            acc, l_i, m_i, qk, v, v_base, stride_vn, stride_vd, start_n, offs_n,
            offs_m, offs_d, qk_scale, N_CTX_K, HEAD_DIM, causal_offset, v_bad, BLOCK_N,
            MASKED, IS_CAUSAL, DOT_PRECISION, NEG_SCALE)
    return acc, l_i, m_i


def n_bucket(n_ctx_k: int) -> int:
    """The forward's autotune key for the key length: the next power of two, from 256
    up to 65536, so a choice tuned at N = 512 is not reused at N = 65536 (nor retuned
    per N)."""
    return min(max(triton.next_power_of_2(n_ctx_k), 256), 65536)


@triton.autotune(configs=_all_configs("fwd"), key=["HEAD_DIM", "IS_CAUSAL", "N_BUCKET"],
                 prune_configs_by=_pruner("fwd"))
@triton.heuristics({**_HEURISTICS, "NEG_SCALE": lambda a: a["sm_scale"] < 0})
@triton.jit
def _attn_fwd(Q, K, V, Out, LSE2, V_BAD, sm_scale,
              stride_qz, stride_qh, stride_qm, stride_qd,
              stride_kz, stride_kh, stride_kn, stride_kd,
              stride_vz, stride_vh, stride_vn, stride_vd,
              stride_oz, stride_oh, stride_om, stride_od,
              H, GROUP, N_CTX_Q, N_CTX_K, HEAD_DIM, N_BUCKET,
              IS_CAUSAL: tl.constexpr, BLOCK_D: tl.constexpr, UPCAST: tl.constexpr,
              DOT_PRECISION: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              EVEN_M: tl.constexpr, EVEN_N: tl.constexpr, EVEN_D: tl.constexpr,
              NEG_SCALE: tl.constexpr):
    # N_BUCKET (n_bucket(N_CTX_K)) is only the autotuner's key; NEG_SCALE: sm_scale < 0
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
    qk_scale = sm_scale * _LOG2E  # exp(x * scale) = exp2(x * scale * log2(e))

    # running row max (base 2), row sum and unnormalised output: on chip, in fp32
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    # q stays in SRAM for the whole inner loop
    q = _load_tile(q_base + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd,
                   offs_m, offs_d, N_CTX_Q, HEAD_DIM, EVEN_M, EVEN_D)
    if UPCAST:
        q = q.to(tl.float32)

    # key range: keys < hi for this block, keys < full_end seen by every row
    causal_offset = N_CTX_K - N_CTX_Q
    hi, full_end = _key_range(start_m, N_CTX_Q, N_CTX_K, IS_CAUSAL, BLOCK_M, BLOCK_N)
    offs_n0 = tl.arange(0, BLOCK_N)  # key offsets within a block
    v_bad = tl.load(V_BAD)  # does V hold a NaN/inf anywhere? (causal launches set it)
    # stage 1: blocks every row sees in full, no masks
    acc, l_i, m_i = _attn_fwd_inner(
        acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
        offs_m, offs_n0, offs_d, 0, full_end, qk_scale, N_CTX_K, HEAD_DIM,
        causal_offset, v_bad, BLOCK_N, False, IS_CAUSAL, EVEN_N, EVEN_D, UPCAST,
        DOT_PRECISION, NEG_SCALE)
    # stage 2: the diagonal (causal) and the ragged last key block, masked
    if IS_CAUSAL or not EVEN_N:
        acc, l_i, m_i = _attn_fwd_inner(
            acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_kd, stride_vn,
            stride_vd, offs_m, offs_n0, offs_d, full_end, hi, qk_scale, N_CTX_K,
            HEAD_DIM, causal_offset, v_bad, BLOCK_N, True, IS_CAUSAL, EVEN_N, EVEN_D,
            UPCAST, DOT_PRECISION, NEG_SCALE)

    acc, lse2 = _finish_rows(acc, l_i, m_i)
    lse_ptrs = LSE2 + off_hz.to(tl.int64) * N_CTX_Q + offs_m  # contiguous (B, H, N_q)
    if EVEN_M:
        tl.store(lse_ptrs, lse2)
    else:
        tl.store(lse_ptrs, lse2, mask=offs_m < N_CTX_Q)
    _store_tile(o_base + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od,
                acc.to(Out.dtype.element_ty), offs_m, offs_d, N_CTX_Q, HEAD_DIM,
                EVEN_M, EVEN_D)


# --------------------------------------------------------------------------------------
# Wrappers: validate -> allocate -> grid -> launch
# --------------------------------------------------------------------------------------
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _validate(q, k, v, sm_scale) -> float:
    """Check q (B, H, N_q, d), k/v (B, H_kv, N_k, d); return the softmax scale."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.ndim != 4:
            raise ValueError(f"{name} must be 4-D (B, H, N, d), "
                             f"got shape {tuple(t.shape)}")
        if t.dtype not in _DTYPES:
            raise TypeError(f"{name} must be float16, bfloat16 or float32, "
                            f"got dtype {t.dtype}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share a dtype, got q {q.dtype}, k {k.dtype}, "
                        f"v {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got q {q.device}, "
                         f"k {k.device}, v {v.device}")
    if not runtime.INTERPRET and q.device.type != "cuda":
        raise ValueError(f"q, k, v must be CUDA tensors for the compiled kernels, "
                         f"got device {q.device} (set TRITON_INTERPRET=1 before "
                         f"importing kernels to run on the CPU)")
    B, H, N_q, d = q.shape
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got k {tuple(k.shape)} "
                         f"and v {tuple(v.shape)}")
    Bk, H_kv, N_k, dk = k.shape
    if Bk != B:
        raise ValueError(f"k batch {Bk} (shape {tuple(k.shape)}) does not match "
                         f"q batch {B} (shape {tuple(q.shape)})")
    if dk != d:
        raise ValueError(f"k head dim {dk} (shape {tuple(k.shape)}) does not match "
                         f"q head dim {d} (shape {tuple(q.shape)})")
    if not 1 <= d <= MAX_HEAD_DIM:
        raise ValueError(f"head dim d must be in 1..{MAX_HEAD_DIM}, "
                         f"got q shape {tuple(q.shape)}")
    if N_q < 1 or N_k < 1:
        raise ValueError(f"sequence lengths must be >= 1, got q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}")
    if B < 1 or H_kv < 1 or H % H_kv != 0:
        raise ValueError(f"q heads H={H} must be a positive multiple of k/v heads "
                         f"H_kv={H_kv} (q {tuple(q.shape)}, k {tuple(k.shape)})")
    # finite, and sm_scale * log2(e) (folded into the kernels' exp2 scores) within fp32
    return kernel_scale(sm_scale, d)


def _upcast(dtype: torch.dtype, device: torch.device) -> bool:
    """bf16 tiles go through fp32 under the interpreter and on GPUs without bf16
    tensor cores."""
    if dtype != torch.bfloat16:
        return False
    return runtime.INTERPRET or torch.cuda.get_device_capability(device) < (8, 0)


def _dot_precision(dtype: torch.dtype) -> str:
    # tf32 is ignored for fp16/bf16 dots
    return "ieee" if dtype == torch.float32 else "tf32"


def _nonfinite_flag(causal, *tensors, nan_only=()) -> torch.Tensor:
    """(1,) int32 on the tensors' device: 1 if one of ``tensors`` holds a NaN or inf,
    or one of ``nan_only`` a NaN (read by causal launches only, which then sum the
    masked tiles pair by pair; computed on the device, no host sync).

    One float32 sum per tensor instead of an elementwise test: a NaN or inf makes the
    sum non-finite. A sum of finite values that overflows fp32 also sets the flag: the
    kernels then take the slow, equally exact path.
    """
    device = tensors[0].device
    if not causal:
        return torch.zeros(1, dtype=torch.int32, device=device)
    total = sum(t.sum(dtype=torch.float32) for t in tensors)
    bad = ~torch.isfinite(total)
    for t in nan_only:  # lse: -inf marks an empty row, only NaN matters
        bad = bad | torch.isnan(t.sum(dtype=torch.float32))
    return bad.to(torch.int32).reshape(1)


def _grad_flag(causal, q, k, v, do, lse2, dlse=None) -> torch.Tensor:
    """The backward's flag: a NaN/inf in q, k, v, dO or dlse, or a NaN in lse (its -inf
    marks an empty row)."""
    return _nonfinite_flag(causal, q, k, v, do, *(() if dlse is None else (dlse,)),
                           nan_only=(lse2,))


def _v_bad(v: torch.Tensor, causal) -> torch.Tensor:
    """The forward's flag: a NaN/inf in v (a hidden k row is masked by selection)."""
    return _nonfinite_flag(causal, v)


def _forward(q, k, v, causal: bool, scale: float):
    B, H, N_q, d = q.shape
    H_kv, N_k = k.shape[1], k.shape[2]
    o = torch.empty((B, H, N_q, d), dtype=q.dtype, device=q.device)  # (B, H, N_q, d)
    # (B, H, N_q), base 2
    lse2 = torch.empty((B, H, N_q), dtype=torch.float32, device=q.device)
    grid = lambda META: (triton.cdiv(N_q, META["BLOCK_M"]), B * H)
    _attn_fwd[grid](
        q, k, v, o, lse2, _v_bad(v, causal), scale,
        *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        H, H // H_kv, N_q, N_k, d, n_bucket(N_k),
        IS_CAUSAL=causal, BLOCK_D=block_d(d), UPCAST=_upcast(q.dtype, q.device),
        DOT_PRECISION=_dot_precision(q.dtype),
    )
    return o, lse2


# --------------------------------------------------------------------------------------
# Backward (FlashAttention-2): delta, then dK/dV per key block, then dQ per query block
# --------------------------------------------------------------------------------------
def preprocess_block_m(head_dim: int) -> int:
    """Rows per program of the delta kernel: 64 x BLOCK_D fp32 tiles fit in registers.
    """
    return min(64, 4096 // block_d(head_dim))


PREPROCESS_NUM_WARPS = 4


@triton.heuristics({"EVEN_M": lambda a: a["N_CTX_Q"] % a["BLOCK_M"] == 0,
                    "EVEN_D": lambda a: a["HEAD_DIM"] == a["BLOCK_D"]})
@triton.jit
def _attn_bwd_preprocess(O, DO, Delta,
                         stride_oz, stride_oh, stride_om, stride_od,
                         stride_doz, stride_doh, stride_dom, stride_dod,
                         H, N_CTX_Q, HEAD_DIM,
                         BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
                         EVEN_M: tl.constexpr, EVEN_D: tl.constexpr):
    """delta_i = sum_d dO[i, d] * O[i, d] (= rowsum(dP * P)).

    One (B, H, N_q) float per row.
    """
    start_m = tl.program_id(0)
    off_hz = tl.program_id(1)
    off_z = off_hz // H
    off_h = off_hz % H
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    o = _load_tile(O + off_z.to(tl.int64) * stride_oz + off_h.to(tl.int64) * stride_oh
                   + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od,
                   offs_m, offs_d, N_CTX_Q, HEAD_DIM, EVEN_M, EVEN_D)
    do = _load_tile(DO + off_z.to(tl.int64) * stride_doz
                    + off_h.to(tl.int64) * stride_doh
                    + offs_m[:, None] * stride_dom + offs_d[None, :] * stride_dod,
                    offs_m, offs_d, N_CTX_Q, HEAD_DIM, EVEN_M, EVEN_D)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)
    # contiguous (B, H, N_q)
    delta_ptrs = Delta + off_hz.to(tl.int64) * N_CTX_Q + offs_m
    if EVEN_M:
        tl.store(delta_ptrs, delta)
    else:
        tl.store(delta_ptrs, delta, mask=offs_m < N_CTX_Q)


@triton.jit
def _load_query_rows(q_base, do_base, lse_base, delta_base, offs_m, offs_d,
                     stride_qm, stride_qd, stride_dom, stride_dod, N_CTX_Q, HEAD_DIM,
                     EVEN_M: tl.constexpr, EVEN_D: tl.constexpr, UPCAST: tl.constexpr):
    """The backward's per-query-row inputs for rows ``offs_m``: q and dO tiles, the
    base-2 lse and delta. Rows past N_q read lse = +inf (P = 0), and a row with no
    visible key (lse = -inf) gets +inf too, so its P is 0, not inf. Shared by both
    backward kernels and kernels.flash_bwd_fused."""
    q = _load_tile(q_base + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd,
                   offs_m, offs_d, N_CTX_Q, HEAD_DIM, EVEN_M, EVEN_D)
    do = _load_tile(do_base + offs_m[:, None] * stride_dom
                    + offs_d[None, :] * stride_dod,
                    offs_m, offs_d, N_CTX_Q, HEAD_DIM, EVEN_M, EVEN_D)
    if UPCAST:
        q = q.to(tl.float32)
        do = do.to(tl.float32)
    if EVEN_M:
        lse2 = tl.load(lse_base + offs_m)
        delta = tl.load(delta_base + offs_m)
    else:
        lse2 = tl.load(lse_base + offs_m, mask=offs_m < N_CTX_Q, other=float("inf"))
        delta = tl.load(delta_base + offs_m, mask=offs_m < N_CTX_Q, other=0.0)
    lse2 = tl.where(lse2 == float("-inf"), float("inf"), lse2)
    return q, do, lse2, delta


@triton.jit
def _finite_dot(acc, a, b, visible, COUNT: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """acc += a @ b, where ``a`` is 0 at the hidden pairs (``visible`` False) and no
    non-finite entry of b may reach acc through a hidden pair (in a plain dot it weighs
    0, and 0 * NaN = NaN). The slow path of the causal masked tiles, taken only when an
    input holds NaN/inf.

    b's non-finite entries are zeroed for the product. Where a VISIBLE pair meets one,
    the output must still turn NaN: for dS^T Q and dS K it does by itself (a NaN in q
    or k makes that row's scores, lse and so its dS NaN, and a NaN dS spreads through
    the product); for P^T dO (COUNT) a second dot counts, per output entry, the visible
    non-finite entries of b that feed it, and those outputs become NaN.
    """
    finite = tl.abs(b.to(tl.float32)) < float("inf")  # NaN compares False
    acc = tl.dot(a.to(b.dtype), tl.where(finite, b, 0.0).to(b.dtype), acc,
                 input_precision=DOT_PRECISION)
    if COUNT:
        hits = tl.dot(visible.to(tl.float16), (~finite).to(tl.float16))
        acc = tl.where(hits > 0, float("nan"), acc)
    return acc


@triton.jit
def _dkdv_dots(dk, dv, pT, v, q, do, delta, DOT_PRECISION: tl.constexpr):
    """dV += P^T dO;  dP^T = V dO^T;  dS^T = P^T * (dP^T - delta);  dK += dS^T Q
    (dK times sm_scale once, at the end)."""
    dv = tl.dot(pT.to(do.dtype), do, dv, input_precision=DOT_PRECISION)
    dpT = tl.dot(v, tl.trans(do), input_precision=DOT_PRECISION)
    dsT = pT * (dpT - delta[None, :])
    dk = tl.dot(dsT.to(q.dtype), q, dk, input_precision=DOT_PRECISION)
    return dk, dv


@triton.jit
def _attn_bwd_dkdv_inner(dk, dv, k, v, q_base, do_base, lse_base, delta_base,
                         stride_qm, stride_qd, stride_dom, stride_dod,
                         offs_n, offs_d, lo, hi, qk_scale, N_CTX_Q, N_CTX_K, HEAD_DIM,
                         causal_offset,
                         BLOCK_M: tl.constexpr, MASKED: tl.constexpr,
                         SHIELD: tl.constexpr,
                         EVEN_M: tl.constexpr, EVEN_N: tl.constexpr,
                         EVEN_D: tl.constexpr, UPCAST: tl.constexpr,
                         DOT_PRECISION: tl.constexpr):
    """Accumulate dK, dV of the resident key block over query blocks [lo, hi).

    Works with transposed tiles (keys along rows): pT = P^T, (BLOCK_N, BLOCK_M).
    MASKED=True applies the causal mask (the diagonal blocks). Query rows past N_q load
    lse = +inf, so their P is exactly 0 and they contribute nothing. Key rows past N_k
    (a ragged last key block, EVEN_N=False) get s = -inf, so exp2 never sees them: with
    a strongly negative lse their exp2(0 - lse) would overflow. SHIELD (the second
    launch, which runs only when an input holds NaN/inf): the masked tiles sum dV and
    dK over the visible pairs only (``_finite_dot``), so a hidden query row's NaN in q,
    dO, lse or delta never reaches a key it cannot see.
    """
    for start_m in range(lo, hi, BLOCK_M):
        start_m = tl.multiple_of(start_m, BLOCK_M)
        offs_m = start_m + tl.arange(0, BLOCK_M)
        q, do, lse2, delta = _load_query_rows(
            q_base, do_base, lse_base, delta_base, offs_m, offs_d, stride_qm,
            stride_qd, stride_dom, stride_dod, N_CTX_Q, HEAD_DIM, EVEN_M, EVEN_D,
            UPCAST)
        # recompute P^T = exp2(K Q^T * scale * log2(e) - lse2),
        # (BLOCK_N, BLOCK_M), on chip
        sT = tl.dot(k, tl.trans(q), input_precision=DOT_PRECISION) * qk_scale
        if MASKED:  # hidden pairs get s = -inf, so P = 0 exactly
            visT = offs_n[:, None] <= offs_m[None, :] + causal_offset
            sT = tl.where(visT, sT, float("-inf"))
        # padded key rows of the ragged last block: P = 0, never exp2(-lse)
        if not EVEN_N:
            sT = tl.where(offs_n[:, None] < N_CTX_K, sT, float("-inf"))
        pT = tl.exp2(sT - lse2[None, :])
        if MASKED:
            if SHIELD:  # NaN/inf somewhere: only visible pairs enter the sums
                pT = tl.where(visT, pT, 0.0)  # 0 even where lse is NaN
                dpT = tl.dot(v, tl.trans(do), input_precision=DOT_PRECISION)
                dsT = tl.where(visT, pT * (dpT - delta[None, :]), 0.0)
                dv = _finite_dot(dv, pT, do, visT, True, DOT_PRECISION)
                dk = _finite_dot(dk, dsT, q, visT, False, DOT_PRECISION)
            else:
                dk, dv = _dkdv_dots(dk, dv, pT, v, q, do, delta, DOT_PRECISION)
        else:
            dk, dv = _dkdv_dots(dk, dv, pT, v, q, do, delta, DOT_PRECISION)
    return dk, dv


@triton.autotune(configs=_all_configs("dkdv"), key=["HEAD_DIM", "IS_CAUSAL"],
                 prune_configs_by=_pruner("dkdv"))
@triton.heuristics(_HEURISTICS)
@triton.jit
def _attn_bwd_dkdv(Q, K, V, DO, LSE2, Delta, DK, DV, BAD, sm_scale,
                   stride_qz, stride_qh, stride_qm, stride_qd,
                   stride_kz, stride_kh, stride_kn, stride_kd,
                   stride_vz, stride_vh, stride_vn, stride_vd,
                   stride_doz, stride_doh, stride_dom, stride_dod,
                   stride_dkz, stride_dkh, stride_dkn, stride_dkd,
                   H_KV, GROUP, N_CTX_Q, N_CTX_K, HEAD_DIM,
                   IS_CAUSAL: tl.constexpr, BLOCK_D: tl.constexpr, UPCAST: tl.constexpr,
                   DOT_PRECISION: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   EVEN_M: tl.constexpr, EVEN_N: tl.constexpr, EVEN_D: tl.constexpr,
                   SHIELD: tl.constexpr):
    # SHIELD: the second, slow launch of a causal backward. It does nothing unless an
    # input holds NaN/inf (BAD, set on the device); then it recomputes this program's
    # gradients keeping hidden pairs out of every sum, and overwrites them.
    if SHIELD:
        go = tl.load(BAD) != 0
    else:
        go = True
    if go:
        start_n = tl.program_id(0) * BLOCK_N  # first key of this program's block
        off_hz = tl.program_id(1)  # which (batch, k/v head)
        off_z = off_hz // H_KV
        off_hkv = off_hz % H_KV
        offs_n = start_n + tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, BLOCK_D)
        k_base = K + off_z.to(tl.int64) * stride_kz + off_hkv.to(tl.int64) * stride_kh
        v_base = V + off_z.to(tl.int64) * stride_vz + off_hkv.to(tl.int64) * stride_vh
        # k and v stay in SRAM while every query block of every q head in the
        # group streams by
        k = _load_tile(k_base + offs_n[:, None] * stride_kn
                       + offs_d[None, :] * stride_kd,
                       offs_n, offs_d, N_CTX_K, HEAD_DIM, EVEN_N, EVEN_D)
        v = _load_tile(v_base + offs_n[:, None] * stride_vn
                       + offs_d[None, :] * stride_vd,
                       offs_n, offs_d, N_CTX_K, HEAD_DIM, EVEN_N, EVEN_D)
        if UPCAST:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
        dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
        qk_scale = sm_scale * _LOG2E

        # query range: rows [lo, full_start) masked, [full_start, end_m) see every key
        causal_offset = N_CTX_K - N_CTX_Q
        lo, full_start, end_m = _query_range(start_n, N_CTX_Q, N_CTX_K, IS_CAUSAL,
                                             BLOCK_M, BLOCK_N)

        # the q heads that share this k/v head (GQA); 1 for plain MHA
        for g in range(GROUP):
            off_h = off_hkv * GROUP + g
            off_bh = off_z * (H_KV * GROUP) + off_h
            q_base = Q + off_z.to(tl.int64) * stride_qz + off_h.to(tl.int64) * stride_qh
            do_base = (DO + off_z.to(tl.int64) * stride_doz
                       + off_h.to(tl.int64) * stride_doh)
            lse_base = LSE2 + off_bh.to(tl.int64) * N_CTX_Q
            delta_base = Delta + off_bh.to(tl.int64) * N_CTX_Q
            if IS_CAUSAL:  # diagonal blocks, masked
                dk, dv = _attn_bwd_dkdv_inner(
                    dk, dv, k, v, q_base, do_base, lse_base, delta_base,
                    stride_qm, stride_qd, stride_dom, stride_dod,
                    offs_n, offs_d, lo, full_start, qk_scale, N_CTX_Q,
                    N_CTX_K, HEAD_DIM, causal_offset, BLOCK_M, True, SHIELD,
                    EVEN_M, EVEN_N, EVEN_D, UPCAST, DOT_PRECISION)
            dk, dv = _attn_bwd_dkdv_inner(
                dk, dv, k, v, q_base, do_base, lse_base, delta_base,
                stride_qm, stride_qd, stride_dom, stride_dod,
                offs_n, offs_d, full_start, end_m, qk_scale, N_CTX_Q,
                N_CTX_K, HEAD_DIM, causal_offset, BLOCK_M, False, SHIELD,
                EVEN_M, EVEN_N, EVEN_D, UPCAST, DOT_PRECISION)

        dk = dk * sm_scale  # S = scale * Q K^T  =>  dK = scale * dS^T Q
        kv_off = off_z.to(tl.int64) * stride_dkz + off_hkv.to(tl.int64) * stride_dkh
        dk_base = DK + kv_off
        dv_base = DV + kv_off
        tile = offs_n[:, None] * stride_dkn + offs_d[None, :] * stride_dkd
        _store_tile(dk_base + tile, dk.to(DK.dtype.element_ty), offs_n, offs_d, N_CTX_K,
                    HEAD_DIM, EVEN_N, EVEN_D)
        _store_tile(dv_base + tile, dv.to(DV.dtype.element_ty), offs_n, offs_d, N_CTX_K,
                    HEAD_DIM, EVEN_N, EVEN_D)


@triton.jit
def _attn_bwd_dq_inner(dq, q, do, lse2, delta, k_base, v_base,
                       stride_kn, stride_kd, stride_vn, stride_vd,
                       offs_m, offs_d, lo, hi, qk_scale, N_CTX_K, HEAD_DIM,
                       causal_offset,
                       BLOCK_N: tl.constexpr, MASKED: tl.constexpr,
                       SHIELD: tl.constexpr,
                       IS_CAUSAL: tl.constexpr,
                       EVEN_N: tl.constexpr, EVEN_D: tl.constexpr, UPCAST: tl.constexpr,
                       DOT_PRECISION: tl.constexpr):
    """Accumulate dQ of the resident query block over key blocks [lo, hi).

    SHIELD (the second launch, which runs only when an input holds NaN/inf): the
    causal masked tiles sum dS K over the visible keys only (``_finite_dot``), so a
    hidden key's NaN in k or v never reaches a query that cannot see it.
    """
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k = _load_tile(k_base + offs_n[:, None] * stride_kn
                       + offs_d[None, :] * stride_kd,
                       offs_n, offs_d, N_CTX_K, HEAD_DIM, EVEN_N or not MASKED, EVEN_D)
        v = _load_tile(v_base + offs_n[:, None] * stride_vn
                       + offs_d[None, :] * stride_vd,
                       offs_n, offs_d, N_CTX_K, HEAD_DIM, EVEN_N or not MASKED, EVEN_D)
        if UPCAST:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        # recompute P = exp2(Q K^T * scale * log2(e) - lse2),
        # (BLOCK_M, BLOCK_N), on chip
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
        if MASKED:  # hidden pairs and keys past N_k get s = -inf, so P = 0 exactly
            visible = offs_n[None, :] < N_CTX_K
            if IS_CAUSAL:
                visible = visible & (offs_n[None, :] <= offs_m[:, None] + causal_offset)
            s = tl.where(visible, s, float("-inf"))
        p = tl.exp2(s - lse2[:, None])
        # dP = dO V^T;  dS = P * (dP - delta);  dQ += dS K
        dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)
        ds = p * (dp - delta[:, None])
        if MASKED and IS_CAUSAL:
            if SHIELD:  # NaN/inf somewhere: only visible keys enter the sum
                ds = tl.where(visible, ds, 0.0)
                dq = _finite_dot(dq, ds, k, visible, False, DOT_PRECISION)
            else:
                dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=DOT_PRECISION)
        else:
            dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=DOT_PRECISION)
    return dq


@triton.autotune(configs=_all_configs("dq"), key=["HEAD_DIM", "IS_CAUSAL"],
                 prune_configs_by=_pruner("dq"))
@triton.heuristics(_HEURISTICS)
@triton.jit
def _attn_bwd_dq(Q, K, V, DO, LSE2, Delta, DQ, BAD, sm_scale,
                 stride_qz, stride_qh, stride_qm, stride_qd,
                 stride_kz, stride_kh, stride_kn, stride_kd,
                 stride_vz, stride_vh, stride_vn, stride_vd,
                 stride_doz, stride_doh, stride_dom, stride_dod,
                 stride_dqz, stride_dqh, stride_dqm, stride_dqd,
                 H, GROUP, N_CTX_Q, N_CTX_K, HEAD_DIM,
                 IS_CAUSAL: tl.constexpr, BLOCK_D: tl.constexpr, UPCAST: tl.constexpr,
                 DOT_PRECISION: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 EVEN_M: tl.constexpr, EVEN_N: tl.constexpr, EVEN_D: tl.constexpr,
                 SHIELD: tl.constexpr):
    # SHIELD: the second, slow launch of a causal backward. It does nothing unless an
    # input holds NaN/inf (BAD, set on the device); then it recomputes this program's
    # gradients keeping hidden pairs out of every sum, and overwrites them.
    if SHIELD:
        go = tl.load(BAD) != 0
    else:
        go = True
    if go:
        start_m = tl.program_id(0)
        off_hz = tl.program_id(1)  # which (batch, q head)
        off_z = off_hz // H
        off_h = off_hz % H
        off_hkv = off_h // GROUP
        offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, BLOCK_D)
        q_base = Q + off_z.to(tl.int64) * stride_qz + off_h.to(tl.int64) * stride_qh
        do_base = DO + off_z.to(tl.int64) * stride_doz + off_h.to(tl.int64) * stride_doh
        k_base = K + off_z.to(tl.int64) * stride_kz + off_hkv.to(tl.int64) * stride_kh
        v_base = V + off_z.to(tl.int64) * stride_vz + off_hkv.to(tl.int64) * stride_vh
        # q, dO, lse and delta stay on chip while the key blocks stream by
        row_base = off_hz.to(tl.int64) * N_CTX_Q
        q, do, lse2, delta = _load_query_rows(
            q_base, do_base, LSE2 + row_base, Delta + row_base, offs_m, offs_d,
            stride_qm, stride_qd, stride_dom, stride_dod, N_CTX_Q, HEAD_DIM, EVEN_M,
            EVEN_D, UPCAST)
        dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        qk_scale = sm_scale * _LOG2E

        causal_offset = N_CTX_K - N_CTX_Q
        # the same key ranges as the forward pass
        hi, full_end = _key_range(start_m, N_CTX_Q, N_CTX_K, IS_CAUSAL, BLOCK_M,
                                  BLOCK_N)
        dq = _attn_bwd_dq_inner(dq, q, do, lse2, delta, k_base, v_base,
                                stride_kn, stride_kd, stride_vn, stride_vd,
                                offs_m, offs_d, 0, full_end, qk_scale, N_CTX_K,
                                HEAD_DIM,
                                causal_offset, BLOCK_N, False, SHIELD, IS_CAUSAL,
                                EVEN_N, EVEN_D, UPCAST, DOT_PRECISION)
        if IS_CAUSAL or not EVEN_N:
            dq = _attn_bwd_dq_inner(dq, q, do, lse2, delta, k_base, v_base,
                                    stride_kn, stride_kd, stride_vn, stride_vd,
                                    offs_m, offs_d, full_end, hi, qk_scale, N_CTX_K,
                                    HEAD_DIM, causal_offset, BLOCK_N, True, SHIELD,
                                    IS_CAUSAL, EVEN_N, EVEN_D, UPCAST, DOT_PRECISION)
        dq = dq * sm_scale  # S = scale * Q K^T  =>  dQ = scale * dS K
        _store_tile(DQ + off_z.to(tl.int64) * stride_dqz
                    + off_h.to(tl.int64) * stride_dqh
                    + offs_m[:, None] * stride_dqm + offs_d[None, :] * stride_dqd,
                    dq.to(DQ.dtype.element_ty), offs_m, offs_d, N_CTX_Q, HEAD_DIM,
                    EVEN_M, EVEN_D)


def forward_with_tiles(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_m: int,
                       block_n: int, causal: bool = False,
                       sm_scale: float | None = None, num_warps: int = 4,
                       num_stages: int = 2) -> torch.Tensor:
    """The forward kernel at a tile size of your choice, bypassing the autotuner.

    For tile-size experiments (the benchmark suite's BLOCK_M x BLOCK_N sweep): q (B, H,
    N_q, d), k/v (B, H_kv, N_k, d) as in :func:`flash_attention`; returns o (B, H, N_q,
    d), not differentiable. ``block_m`` and ``block_n`` must be powers of two >= 16. A
    tile that does not fit the GPU raises Triton's out-of-resources error.
    """
    scale = _validate(q, k, v, sm_scale)
    check_causal(causal)
    for name, b in (("block_m", block_m), ("block_n", block_n)):
        if not isinstance(b, int) or b < 16 or b & (b - 1):
            raise ValueError(f"{name} must be a power of two >= 16, got {b!r}")
    B, H, N_q, d = q.shape
    H_kv, N_k = k.shape[1], k.shape[2]
    o = torch.empty((B, H, N_q, d), dtype=q.dtype, device=q.device)  # (B, H, N_q, d)
    lse2 = torch.empty((B, H, N_q), dtype=torch.float32, device=q.device)  # (B, H, N_q)
    grid = (triton.cdiv(N_q, block_m), B * H)
    _attn_fwd.fn[grid](  # .fn: the @heuristics-wrapped kernel under the @autotune
        q, k, v, o, lse2, _v_bad(v, causal), scale,
        *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        H, H // H_kv, N_q, N_k, d, n_bucket(N_k),
        IS_CAUSAL=bool(causal), BLOCK_D=block_d(d), UPCAST=_upcast(q.dtype, q.device),
        DOT_PRECISION=_dot_precision(q.dtype), BLOCK_M=block_m, BLOCK_N=block_n,
        num_warps=num_warps, num_stages=num_stages,
    )
    return o


def _backward(do, q, k, v, o, lse2, causal: bool, scale: float, dlse=None):
    B, H, N_q, d = q.shape
    if not runtime.INTERPRET:
        cap = torch.cuda.get_device_capability(q.device)
        if not configs("dq", cap, d, q.dtype):
            raise ValueError(f"the backward pass does not support head dim {d} "
                             f"(q shape {tuple(q.shape)}) on sm_{cap[0]}{cap[1]}: "
                             f"without tensor cores every tile spills registers; "
                             f"use d <= 128 or an sm_80+ GPU")
    H_kv, N_k = k.shape[1], k.shape[2]
    group = H // H_kv
    bd = block_d(d)
    upcast, precision = _upcast(q.dtype, q.device), _dot_precision(q.dtype)
    delta = torch.empty_like(lse2)  # (B, H, N_q) float32
    dq = torch.empty((B, H, N_q, d), dtype=q.dtype, device=q.device)  # (B, H, N_q, d)
    # (B, H_kv, N_k, d)
    dk = torch.empty((B, H_kv, N_k, d), dtype=k.dtype, device=k.device)
    # same layout as dk: the kernel uses dk's strides for both
    dv = torch.empty_like(dk)

    block_m_pre = preprocess_block_m(d)
    _attn_bwd_preprocess[(triton.cdiv(N_q, block_m_pre), B * H)](
        o, do, delta, *o.stride(), *do.stride(), H, N_q, d,
        BLOCK_M=block_m_pre, BLOCK_D=bd, num_warps=PREPROCESS_NUM_WARPS)
    if dlse is not None:
        # lse_i = log sum_j exp(S_ij): d lse_i / d S_ij = P_ij, so a gradient dL_i on
        # the lse adds dL_i * P_ij to dS_ij = P_ij (dP_ij - delta_i):
        # delta_i <- delta_i - dL_i
        delta = (delta - dlse.to(torch.float32)).contiguous()
    # NaN/inf in an input (computed on the device, no host sync): read by the causal
    # backward's second launch only
    bad = _grad_flag(causal, q, k, v, do, lse2, dlse)
    dkdv_args = (q, k, v, do, lse2, delta, dk, dv, bad, scale,
                 *q.stride(), *k.stride(), *v.stride(), *do.stride(), *dk.stride(),
                 H_kv, group, N_q, N_k, d)
    dq_args = (q, k, v, do, lse2, delta, dq, bad, scale,
               *q.stride(), *k.stride(), *v.stride(), *do.stride(), *dq.stride(),
               H, group, N_q, N_k, d)
    flags = dict(IS_CAUSAL=causal, BLOCK_D=bd, UPCAST=upcast, DOT_PRECISION=precision)
    grid_kv = lambda META: (triton.cdiv(N_k, META["BLOCK_N"]), B * H_kv)
    grid_q = lambda META: (triton.cdiv(N_q, META["BLOCK_M"]), B * H)
    _attn_bwd_dkdv[grid_kv](*dkdv_args, **flags, SHIELD=False)
    _attn_bwd_dq[grid_q](*dq_args, **flags, SHIELD=False)
    if causal:
        # A hidden pair weighs 0 in the tiles above, and 0 * NaN = NaN. If an input
        # holds NaN/inf, these launches recompute dK, dV and dQ keeping the hidden pairs
        # out of every sum (and overwrite them); otherwise each program reads the flag
        # and stops.
        bm, bn, w, st = (INTERPRET_CONFIG if runtime.INTERPRET else configs(
            "dq-shield", torch.cuda.get_device_capability(q.device), d, q.dtype)[0])
        tiles = dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=w, num_stages=st)
        # .fn: the @heuristics-wrapped kernel under the @autotune
        _attn_bwd_dkdv.fn[(triton.cdiv(N_k, bn), B * H_kv)](
            *dkdv_args, **flags, SHIELD=True, **tiles)
        _attn_bwd_dq.fn[(triton.cdiv(N_q, bm), B * H)](
            *dq_args, **flags, SHIELD=True, **tiles)
    return dq, dk, dv


class _FlashAttention(torch.autograd.Function):
    """Autograd glue: saves q, k, v, o, lse (B, H, N_q) -- never the N_q x N_k matrix P.

    The saved lse is in base 2 (the kernels' units, so the backward's recomputed scores
    and lse sit on the same fp32 grid); the lse handed to the caller is converted to
    natural log. That lse is differentiable: its gradient enters the FA2 backward as
    delta <- delta - dlse.
    """

    @staticmethod
    def forward(ctx, q, k, v, causal, sm_scale, return_lse, forward_path,
                deterministic):
        if forward_path == "pointer":
            o, lse2 = _forward(q, k, v, causal, sm_scale)
        else:  # TMA descriptors (sm_90), kernels.flash_tma
            from .flash_tma import forward_tma

            o, lse2 = forward_tma(q, k, v, causal, sm_scale,
                                  warp_specialize=forward_path == "tma-ws")
        ctx.save_for_backward(q, k, v, o, lse2)
        ctx.causal, ctx.sm_scale, ctx.deterministic = causal, sm_scale, deterministic
        if not return_lse:
            return o
        lse = lse2 * LN2  # (B, H, N_q) natural log; -inf stays -inf
        return o, lse

    @staticmethod
    def backward(ctx, do, dlse=None):
        q, k, v, o, lse2 = ctx.saved_tensors
        from . import flash_bwd_fused as fused

        if ctx.deterministic or not (runtime.INTERPRET or fused.configs(
                torch.cuda.get_device_capability(q.device), q.shape[-1], q.dtype)):
            # (the fused kernel has no tile for this GPU and head dim: the two-kernel
            # backward, deterministic as well)
            dq, dk, dv = _backward(do, q, k, v, o, lse2, ctx.causal, ctx.sm_scale, dlse)
        else:  # one fused kernel, dQ by fp32 atomics: kernels.flash_bwd_fused
            bad = _grad_flag(ctx.causal, q, k, v, do, lse2, dlse)
            dq, dk, dv = fused.backward_fused(do, q, k, v, o, lse2, ctx.causal,
                                              ctx.sm_scale, dlse=dlse, bad=bad)
        return dq, dk, dv, None, None, None, None, None


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    causal: bool = False, sm_scale: float | None = None,
                    return_lse: bool = False, forward_path: str = "pointer",
                    deterministic: bool = True):
    """softmax(q k^T * sm_scale) v without ever storing the N_q x N_k scores.

    Args:
        q: (B, H, N_q, d) float16, bfloat16 or float32.
        k, v: (B, H_kv, N_k, d), same dtype and device; H must be a multiple of H_kv.
        causal: mask aligned bottom-right: query i sees key j iff j <= i + N_k - N_q.
        sm_scale: softmax scale, default 1 / sqrt(d).
        return_lse: also return the natural log-sum-exp of each row.
        forward_path: "pointer" (the default), or "tma" / "tma-ws" (sm_90 only: the
            forward of :mod:`kernels.flash_tma`, K/V tiles by TMA descriptors, the
            second with a warp-specialised key loop). Not the default until a GPU run
            has checked them (``make bench`` records which paths passed).
        deterministic: True (the default): the two-kernel FlashAttention-2 backward,
            the same bits on every run. False: one fused kernel
            (:mod:`kernels.flash_bwd_fused`, five matmuls per tile) that accumulates dQ
            with fp32 atomics, so dQ's rounding varies from run to run. Where it has
            no tile (sm_75; see ``kernels.flash_bwd_fused.configs``) the two-kernel
            backward runs instead.

    Returns:
        o: (B, H, N_q, d) in q's dtype (0 for a row with no visible key), and with
        ``return_lse`` also lse: (B, H, N_q) float32 (-inf for such a row).
        Differentiable with respect to q, k and v, through o and through lse (so partial
        attentions can be merged by their lse, as in split-K or ring attention).
    """
    scale = _validate(q, k, v, sm_scale)
    check_causal(causal)
    for name, flag in (("return_lse", return_lse), ("deterministic", deterministic)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be a bool, got {type(flag).__name__}")
    if forward_path not in FORWARD_PATHS:
        raise ValueError(f"forward_path must be one of {FORWARD_PATHS}, "
                         f"got {forward_path!r}")
    return _FlashAttention.apply(q, k, v, causal, scale, return_lse, forward_path,
                                 deterministic)


def attention_probs(q: torch.Tensor, k: torch.Tensor, lse: torch.Tensor,
                    causal: bool = False, sm_scale: float | None = None,
                    rows=None) -> torch.Tensor:
    """Recompute softmax probabilities P = exp(S * scale - lse) for chosen query rows.

    The kernel never stores P; this rebuilds it exactly from q, k and the lse the
    forward pass saved (what the backward kernels do tile by tile), so a reader can
    draw the map. Plain PyTorch in float32.

    Args:
        q: (B, H, N_q, d); k: (B, H_kv, N_k, d); lse: (B, H, N_q) from
            ``flash_attention(..., return_lse=True)``.
        rows: None for every query row, or a sequence / 1-D tensor of row indices.

    Returns:
        (B, H, len(rows), N_k) float32; masked entries and rows with lse = -inf are 0.
    """
    scale = _validate(q, k, k, sm_scale)
    check_causal(causal)
    B, H, N_q, d = q.shape
    H_kv, N_k = k.shape[1], k.shape[2]
    if not isinstance(lse, torch.Tensor) or tuple(lse.shape) != (B, H, N_q):
        shape = (tuple(lse.shape) if isinstance(lse, torch.Tensor)
                 else type(lse).__name__)
        raise ValueError(f"lse must be (B, H, N_q) = {(B, H, N_q)}, got {shape}")
    if rows is None:
        idx = torch.arange(N_q, device=q.device)
    else:
        idx = torch.as_tensor(rows, device=q.device).reshape(-1)
        if idx.dtype.is_floating_point or idx.dtype == torch.bool:
            raise TypeError(f"rows must hold integer indices, got dtype {idx.dtype}")
        if idx.numel() and (int(idx.min()) < -N_q or int(idx.max()) >= N_q):
            raise ValueError(f"rows must index 0..{N_q - 1}, got {rows!r}")
        idx = idx.long() % N_q
    kk = k.float().repeat_interleave(H // H_kv, dim=1)  # (B, H, N_k, d)
    # (B, H, R, N_k)
    s = torch.matmul(q.float()[:, :, idx], kk.transpose(-2, -1)) * scale
    row_lse = lse.float()[:, :, idx]  # (B, H, R)
    visible = torch.isfinite(row_lse)[..., None].expand_as(s)  # (B, H, R, N_k)
    if causal:
        visible = visible & (torch.arange(N_k, device=q.device)[None, :]
                             <= idx[:, None] + (N_k - N_q))
    p = torch.exp(s - torch.where(torch.isfinite(row_lse), row_lse, 0.0)[..., None])
    return torch.where(visible, p, 0.0)
