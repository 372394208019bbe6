"""Ring attention on torch.distributed: the sequence split over ranks, K/V on a ring.

Spec sheet
----------
Algorithm
    Ring Attention (Liu, Zaharia & Abbeel 2023, arXiv:2310.01889) over the blockwise
    attention of Blockwise Parallel Transformer (Liu & Abbeel 2023). Each
    of P ranks holds a shard of the sequence's queries, keys and values. For P steps a
    rank computes attention of its queries against the K/V shard it holds with the
    book's flash kernel (``kernels.flash``'s forward, which returns (o, lse)), merges
    the partial into its running (o, lse) by the log-sum-exp rule
    (:func:`merge_partials`, the online-softmax merge of chapter 2 across ranks), and
    passes the shard on:
    ``torch.distributed.batch_isend_irecv`` sends it to rank+1 and receives the next
    from rank-1, posted before the block's compute so the transfer overlaps it (the
    received shard lands in a second buffer: double buffering). The backward reruns
    the ring with the FlashAttention-2 backward per block, fed the *global* o and lse
    (so delta = rowsum(dO * O) and P = exp(S - lse) are the whole row's, and each
    block's dq, dk, dv are exact); fp32 dK/dV accumulators travel with the K/V shards,
    one step behind, and after P steps each rank holds its own shard's dK/dV. An
    autograd Function: a loss through ``ring_attention`` trains.
Layouts
    ``"contiguous"`` (rank r holds chunk r of P) and ``"zigzag"`` (chunks r and
    2P-1-r of 2P: the zig-zag balancing used for causal ring attention, PyTorch's
    "head-tail"; Striped Attention, Brandon et al. 2023, stripes single positions
    instead and is not implemented here), see
    :func:`shard_intervals` for the uneven split rule (the first N mod n chunks are
    one longer). :func:`shard` / :func:`unshard` cut and rebuild a full sequence;
    they are exact inverses. Contiguous accepts any positive shard lengths (positions
    follow the ranks); zigzag requires the split rule's lengths.
Causal
    The global mask (query at position i sees keys j <= i). Per (query shard, key
    shard) block, :func:`block_plan` decides from the shards' global positions: fully
    visible blocks run the non-causal kernel, the shard against itself runs the causal
    kernel (its N_q == N_k, so the kernel's bottom-right mask is the global one), a
    block no query sees is skipped without compute; zigzag blocks against other ranks
    are one half of the queries or keys, fully visible. Contiguous causal leaves rank
    r idle for P-1-r of the P steps; zigzag gives every rank the same work.
Shapes and dtypes
    q (B, H, N_local, d); k, v (B, H_kv, N_local, d), H a multiple of H_kv (GQA,
    MQA); head dims and dtypes as ``kernels.flash`` (fp16, bf16, fp32; d <= 256).
    o in q's dtype, lse float32 natural log. The merge and the dQ/dK/dV sums are fp32;
    each block's gradients come out of the flash backward in the input dtype before
    the fp32 sum (P roundings instead of one, for fp16/bf16).
NaN and empty rows
    As ``kernels.flash``: a NaN in a row's inputs gives NaN in that row; a row with no
    visible key gives 0 and lse -inf; a block with no visible key contributes nothing
    (exactly), and a NaN hidden by the causal mask reaches nothing (such blocks are
    skipped, the diagonal block uses the kernel's own shield).
Process groups
    ``group`` is any process group (default: the world); with no process group
    initialised, or a group of one rank, ``ring_attention`` is one ``flash_attention``
    call and nothing else. The same code runs on gloo (CPU tensors; the Triton
    interpreter computes the blocks) and NCCL (CUDA tensors, one GPU per rank). One
    small all_gather per call agrees on shapes, dtype, scale, causal and layout across
    the ranks (ValueError on every rank on a mismatch, so no rank is left waiting) and
    on the shard lengths. Transfers wait at most the group's timeout
    (``init_process_group(timeout=...)``): on the CPU each wait is given it
    explicitly (gloo's bare ``Work.wait()`` is not bounded by it), on CUDA NCCL's
    watchdog enforces it (a timed wait would block the host).
    :func:`kernels.ring.launch.run_local` adds a watchdog per rank and in the parent.
Traffic per step
    One message of 2 N_local H_kv d elements (K and V stacked) in the forward; in the
    backward K/V again plus the fp32 dK/dV accumulator (2 N_local H_kv d fp32 values).
Beside the ring
    :mod:`kernels.ring.allgather`: ``allgather_attention`` (all-gather context
    parallelism, Llama 3's: K/V gathered once, one flash call per query run, dK/dV
    summed back by an fp32 all_reduce and a slice) and ``sharded_decode`` (a KV cache
    sharded over the ranks: ``kernels.decode`` per slice, one all-gather of (o, lse),
    one ``merge_partials``).
Known limits
    No sliding window, no document masks/varlen, no dropout; one ring (no 2-D
    ring x all-to-all hybrid, no Ulysses head split); K/V of one rank's shard must fit
    beside the running output. The forward saves the final o and lse per rank (no
    per-step state). The per-step kernels are the two-kernel FA2 backward (the
    deterministic one). On the CPU, gloo's P2P and the interpreter make timings a
    picture of the schedule only. The family has no Triton kernel of its own, so no
    ``compile_check``: its launches are ``kernels.flash``'s, compiled ahead of time by
    ``kernels.flash.compile_check``; ``timing`` is suite "ring" of ``make bench``.
PyTorch's own context parallelism
    ``torch.distributed.tensor.experimental.context_parallel`` (prototype) patches
    ``F.scaled_dot_product_attention`` inside a context and rotates K/V by all-gather
    (default) or all-to-all; it balances causal work with the head-tail layout (this
    package's zigzag) when N is a multiple of 2P, else it shards contiguously. Its
    ring dispatches the CUDA SDPA backends (flash, memory-efficient, cuDNN).
    :func:`kernels.ring.torch_cp.compare_context_parallel` runs it beside
    ``ring_attention`` on gloo. With the CPU SDPA op its causal path has no sharding
    strategy registered (``NotImplementedError``), and its non-causal path does not
    run as a ring: it goes through DTensor's generic sharding propagation over the
    op's decomposition, and its first call is far slower than later ones.
"""

from .allgather import allgather_attention, sharded_decode
from .api import ring_attention
from .blocks import Block, block_plan, merge_partials
from .layout import (
    LAYOUTS,
    local_length,
    positions,
    shard,
    shard_intervals,
    unshard,
)

__all__ = [
    "LAYOUTS",
    "Block",
    "allgather_attention",
    "block_plan",
    "local_length",
    "merge_partials",
    "positions",
    "ring_attention",
    "shard",
    "shard_intervals",
    "sharded_decode",
    "unshard",
]
