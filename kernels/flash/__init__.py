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
    ``forward_path="tma"`` / ``"tma-ws"``: the forward of
    :mod:`kernels.flash.forward_tma`, K/V tiles by TMA descriptors on sm_90 (the second
    with a warp-specialised key loop).
    ``deterministic=False``: :mod:`kernels.flash.backward_fused`, the backward in one
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
    once when the flag is clear. The scores q k^T * softmax_scale are fp32: a row whose
    top score overflows fp32 (or whose visible scores are all -inf) has no fp32
    softmax and reads NaN, never a finite guess or the empty-row answer.
    softmax_scale * log2(e) itself must fit fp32 (ValueError).
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
    cores with small FMA tiles, slower than PyTorch's cuBLAS-based attention there. Tile
    configs are chosen per architecture class and head dim (``configs``), and autotuned
    among at most three per kernel (key: head dim, causal, dtypes; the forward also keys
    on N_k rounded up to a power of two, ``n_bucket``). ``python -m
    kernels.flash.compile_check`` compiles every shipped config for
    sm_75/80/89/90 ahead of time on a CPU and checks shared memory and register spills.
    On a CPU machine the kernels run under the Triton interpreter with one fixed 64 x 64
    tile.
Known limits
    No dropout, no attention bias/ALiBi, no sliding window, no variable-length (packed)
    batches, no paged KV cache, no FP8. The default path leaves wgmma to Triton (it
    picks it on sm_90 by itself) and loads by pointers; the TMA path is opt-in (above).
    The FlashAttention-3 CUDA kernels (warp-specialised pingpong schedules, FP8) are
    faster on H100.
    Head dims that are not powers of two waste the padded part of each tile. On sm_75
    the backward pass refuses head dims above 128 (ValueError): with FMA dot products
    every tile of at least 16 x 16 spills registers there.

Lent to the other families (public, so no family imports another's private names):
``check_inputs`` (the q/k/v and scale checks), ``forward_lse`` / ``backward_lse``
(one block's forward returning o and the base-2 lse, and the backward from them: what
ring attention calls per step), and the ``@triton.jit`` pieces of :mod:`.blocks`:
``softmax_pv_step`` (one key tile of the online softmax), ``finite_dot`` (the masked
P V tile that keeps a hidden NaN/inf value row out), ``load_tile`` (a row tile with
its edge masks), ``masked_row_max``, ``finish_rows`` and ``key_range``.
"""

from .api import attention_probs, flash_attention
from .backward import backward_lse
from .blocks import (
    finish_rows,
    finite_dot,
    key_range,
    load_tile,
    masked_row_max,
    softmax_pv_step,
)
from .checks import check_inputs
from .forward import forward_lse, forward_with_tiles
from .tiles import FORWARD_PATHS, MAX_HEAD_DIM

__all__ = [
    "FORWARD_PATHS",
    "MAX_HEAD_DIM",
    "attention_probs",
    "backward_lse",
    "check_inputs",
    "finish_rows",
    "finite_dot",
    "flash_attention",
    "forward_lse",
    "forward_with_tiles",
    "key_range",
    "load_tile",
    "masked_row_max",
    "softmax_pv_step",
]
