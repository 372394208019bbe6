"""Deformable attention in Triton: Deformable DETR's multi-scale op (MSDA) and a
fused DAT attention whose keys and values are bilinear samples gathered inside the
attention loop.

Spec sheet
----------
``ms_deform_attn(value, spatial_shapes, level_start_index, sampling_locations,
                 attention_weights)``
    Drop-in for Deformable DETR's ``MSDeformAttnFunction`` (and its PyTorch reference
    ``ms_deform_attn_core_pytorch``): value (B, S, H, D_h) with S = sum_l H_l W_l;
    spatial_shapes (L, 2) int64 as (H_l, W_l); level_start_index (L,) int64;
    sampling_locations (B, L_q, H, L, P, 2) as (x, y) in [0, 1]; attention_weights
    (B, L_q, H, L, P). Returns (B, L_q, H * D_h) in value's dtype. ``im2col_step`` is
    accepted and ignored; ``MSDeformAttnFunction.apply`` has the CUDA op's signature.
    The level tensors are checked against S on every call (a small device-to-host
    copy); the kernel reads the checked copy, so no in-place edit can make it read out
    of bounds.
    Algorithm: one program per (block of ``BLOCK_Q`` queries, batch x head); the
    (BLOCK_Q, D_h) accumulator stays in registers while the program walks the L x P
    samples of each query, gathering four corner rows of D_h contiguous values each
    (bilinear, zero padding, ``align_corners=False``: pixel = loc * W_l - 0.5, the same
    as grid_sample on 2 * loc - 1). Backward: the same walk recomputes each sample and
    writes d(weights) and d(locations) directly (each program owns its queries), and
    scatters d(value) to the four corners with ``tl.atomic_add`` into an fp32 buffer
    (so d(value) is not bit-reproducible run to run, like the CUDA op).
``deformable_attention(q, k_map, v_map, points, softmax_scale=None,``
``align_corners=True)``
    q (B, H, N_q, d); k_map, v_map (B, H, H_f, W_f, d) projected key/value maps; points
    (B, G, N_s, 2) as (x, y) in [-1, 1], shared by the H / G heads of each offset group.
    Returns softmax(q k̃^T * softmax_scale) ṽ, (B, H, N_q, d), where k̃, ṽ are the maps
    sampled bilinearly (zero padding) at the points. Algorithm: FlashAttention-2 forward
    in which each ``BLOCK_N`` tile of sampled keys and values is built in registers from
    four corner gathers of the maps, so k̃ and ṽ never exist in HBM. Backward:
    ``delta = rowsum(dO * O)`` (PyTorch), ``_dat_bwd_dkdv`` (one program per sample
    block: accumulates dk̃, dṽ over every query block, then scatters them to the maps'
    corners with ``tl.atomic_add`` and writes the point gradient of its head) and
    ``_dat_bwd_dq`` (one program per query block). Point gradients of the heads in a
    group are summed in PyTorch (deterministic).
Dtypes
    float16, bfloat16, float32; MSDA also float64 (computed in fp64: Deformable DETR's
    own float64 tests and gradcheck pass). MSDA's value, locations and weights may
    differ in dtype (the output follows value); DAT's q, k_map and v_map share one
    (points may differ).
    Bilinear weights, sums and softmax statistics are fp32. Dot products run in the
    input dtype on tensor cores for fp16/bf16 and in IEEE fp32 (no TF32) for fp32;
    under the Triton interpreter, and for bf16 below sm_80, tiles are upcast to fp32.
Head dims
    DAT: d from 1 to 128, padded to the next power of two (at least 16) and masked.
    MSDA: any D_h (Deformable DETR tests 30 ... 3096): the kernels loop over channel
    blocks of at most 128 (one block up to 128).
Devices
    CUDA GPUs sm_75 ... sm_90 with Triton 3.6 / 3.7 (only long-stable Triton APIs:
    masked pointer loads/stores, tl.dot, tl.atomic_add; no block pointers or TMA). On a
    CPU, the Triton interpreter (``TRITON_INTERPRET=1``, set by ``kernels.runtime``)
    with CPU tensors.
Tiles
    Per architecture (``msda_config``, ``dat_config``), not autotuned, and no software
    pipelining (``NUM_STAGES = 1``). Within shared memory and without register spills
    for aligned contiguous inputs on sm_80 and sm_90 up to d = 128, on sm_75 up to
    d = 64 (at d = 128 its DAT backward spills: correct, slower); the tests compile a
    representative subset ahead of time.
Known limits
    No GPU timing has been recorded in this repository yet:
    ``kernels/deformable/timing.py`` records it on a CUDA machine (``make bench``).
    The fused DAT kernel re-gathers the four corners of every sample once per query
    block (served by L2 when the maps fit there), and the gathers are not coalesced
    across samples. ``deformable_attention`` has no attention bias (DAT's relative
    position bias is not included) and no mask. MSDA's ``im2col_step`` argument of the
    CUDA op is not needed (accepted and ignored). DAT does not take float64 (use the
    reference below). A NaN/inf sampling location gives a NaN sample. A softmax_scale
    whose product with log2(e) overflows float32 is refused (``sm_scale=``, its old
    name, still works with a DeprecationWarning).

``ms_deform_attn_reference`` and ``deformable_attention_reference`` (PyTorch-style:
``scale=``) are the naive PyTorch versions built on ``grid_sample`` that the tests and
benchmarks compare against.
"""

from .api import (
    MSDeformAttnFunction,
    deformable_attention,
    deformable_attention_reference,
    ms_deform_attn,
    ms_deform_attn_reference,
    sample_maps,
)
from .tiles import MAX_HEAD_DIM, dat_config, msda_config

__all__ = [
    "MAX_HEAD_DIM",
    "MSDeformAttnFunction",
    "dat_config",
    "deformable_attention",
    "deformable_attention_reference",
    "ms_deform_attn",
    "ms_deform_attn_reference",
    "msda_config",
    "sample_maps",
]
