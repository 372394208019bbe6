"""A simulated GPU memory hierarchy: tensors live in HBM, tiles are loaded into an SRAM
of fixed capacity, and every load and store is counted (elements, per tensor, in order).

Each algorithm is written block by block against ``HBMSim`` and has a closed form
beside it that gives exactly the same counts from a formula, for every N, d, Br, Bc
(ragged last blocks included). Counts are in *elements*; multiply by the dtype's size
for bytes (``Traffic.bytes``). Registered algorithms (``algorithms()``):

``standard``          the four steps of standard attention: S and P go to HBM and back.
``flash1``            FlashAttention-1, Algorithm 1: K/V blocks outside, Q blocks
                      inside;
                      O, l, m are read and re-written in HBM for every (j, i).
``flash2``            FlashAttention-2 forward: Q blocks outside; O and L written once.
``standard_bwd``      the standard backward: reads the stored P, writes dP and dS.
``flash2_bwd``        FlashAttention-2, Algorithm 2: recomputes P from Q, K and L;
                      dQ is read-modified-written in HBM for every (j, i).
``flash2_bwd_split``  the two-kernel backward of the Triton tutorial (and
                      kernels.flash): one loop writes dK, dV; a second loop over Q
                      blocks writes dQ once.
``decode_naive``, ``decode_fa2``, ``decode_split``, ``decode_paged``
                      one decode step of a batch against a KV cache (``decode``).

The model, stated once (it is the same for every algorithm, so comparisons are fair):

* N queries attend to N_k keys (``N_k=None``: N_k = N) of head dim d; T_r = ceil(N/Br)
  query blocks, T_c = ceil(N_k/Bc) key blocks; the last block of each may be ragged.
* A matrix product runs the loop order its algorithm states. In a loop nest, the block
  of the outer loop is loaded once per outer step and stays in SRAM; the blocks of the
  inner loop are re-loaded at every inner step. So the standard step S = Q K^T reads Q
  once and K T_r times, exactly as FlashAttention-2 does: the only difference between
  the two forwards is the N x N round trips of S and P.
* Row-wise passes (softmax, dS = P o (dP - rowsum(P o dP))) hold one row (N_k elements)
  at a time and read and write each element once.
* "SRAM" is all on-chip storage (shared memory and registers): a tile is resident while
  the loop that uses it runs. Capacity ``M`` is in elements; ``M=None`` is unbounded.
  Tiles that do not fit raise ValueError saying what they need and what M holds.
* Nothing else is modelled: no caches (L2), no bank conflicts, no causal tile skipping,
  no dropout, no masking kernels, no fp32 accumulator buffers.

With T_r = 1 (all of Q resident) the standard forward moves exactly 4 N d + 4 N^2
elements, the count in the FlashAttention paper's analysis; in general it moves
2 N d + 2 T_r N_k d + 4 N N_k. The flash forwards move
    flash1: 2 N_k d + T_c (3 N d + 4 N) + (N d + 2 N)
            (the last term: O, l, m initialised)
    flash2: 2 N d + N + 2 T_r N_k d.

Chapter modules register their own algorithms with ``register`` (e.g. hard and top-k
attention in ``attention.hard``), so ``simulate(name, ...)`` and ``closed_form(name,
...)`` reach every algorithm in the book. Both check the arguments of every algorithm in
one place (counts are positive ints, NumPy integers included; ValueError or TypeError
naming the argument), and ``closed_form`` gives every field of ``simulate``'s result but
the trace: reads, writes, per-tensor counts, SRAM peak, steps and events, raising as the
simulation does when the tiles do not fit in ``M``; ``sram_need`` works for every
algorithm. ``simulate`` refuses schedules of more than ``MAX_TRACE_EVENTS`` events
(``MAX_EVENTS`` with ``keep_trace=False``) before running them and points to
``closed_form``. The roofline helpers (``GPUS``, ``roofline_ms``) turn counts into time
ESTIMATES from published peak numbers; they measure nothing.

The package: ``sim`` (HBMSim, Traffic, the registry, shared checks), ``forward``
(standard, flash1, flash2), ``backward`` (standard_bwd, flash2_bwd, flash2_bwd_split),
``roofline`` (block sizes, FLOPs, GPU specs), ``decode`` (chapter 5: one decode step
of a batch, naive, FlashAttention-2's grid, split-KV and paged; real models' caches),
``blocksparse`` (chapter 7: a block-sparse forward over a mask's visited tiles,
simulated and in closed form; imported as ``attention.memory.blocksparse``), ``cache``
(what the model leaves out: the
compulsory traffic, each tensor once, and the L2 policy under which a GPU gets near it).
Every public name is re-exported here.
"""

# importing them registers their algorithms
from . import backward, decode, forward, selection  # noqa: F401
from .cache import compulsory, heads_in_flight, kv_fits_in_l2
from .decode import (
    DECODE,
    MODELS,
    ModelConfig,
    decode_bytes,
    decode_flops,
    grid_fill,
    split_tiles,
    splits_to_fill,
)
from .roofline import (
    GPUS,
    GPUSpec,
    arithmetic_intensity,
    fa1_block_sizes,
    matmul_flops,
    roofline_ms,
)
from .sim import (
    MAX_EVENTS,
    MAX_TRACE_EVENTS,
    HBMSim,
    Traffic,
    Transfer,
    algorithms,
    blocks,
    cdiv,
    check_count,
    closed_form,
    fit_tiles,
    register,
    simulate,
    sram_need,
    traffic,
)

__all__ = [
    "DECODE",
    "GPUS",
    "MAX_EVENTS",
    "MAX_TRACE_EVENTS",
    "MODELS",
    "GPUSpec",
    "HBMSim",
    "ModelConfig",
    "Traffic",
    "Transfer",
    "algorithms",
    "arithmetic_intensity",
    "blocks",
    "cdiv",
    "check_count",
    "closed_form",
    "compulsory",
    "decode_bytes",
    "decode_flops",
    "fa1_block_sizes",
    "fit_tiles",
    "grid_fill",
    "heads_in_flight",
    "kv_fits_in_l2",
    "matmul_flops",
    "register",
    "roofline_ms",
    "simulate",
    "split_tiles",
    "splits_to_fill",
    "sram_need",
    "traffic",
]
