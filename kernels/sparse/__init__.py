"""Learned sparse attention in Triton: attention over chosen key blocks or tokens
(MoBA, NSA's selected branch, DeepSeek's DSA), and MoBA's block selection.

Spec sheet
----------
Call
    ``sparse_attention(q, k, v, kv_indices, block_size=64, scale=None, causal=True,
    return_lse=False)``: softmax attention of each query over the key blocks its row
    of ``kv_indices`` names (the twin of ``attention.sparse.sparse_attention``).
    ``select_blocks(q, k, block_size, topk, causal=True, scale=None)`` -> kv_indices:
    MoBA's gate with NSA's group sharing (the twin of
    ``attention.sparse.select_blocks``). DSA's selection: ``lightning_indexer(q_index,
    k_index, weights, causal=True)`` -> scores (B, N_q, N_k), ``topk_tokens(scores,
    topk, h_kv=1)`` -> kv_indices for block_size = 1, and ``index_topk(...)``, the
    two chunked over queries (twins of ``attention.sparse``'s). ``prepare(...)``:
    ``sparse_attention``'s checks once, returning a launcher (what
    ``kernels.sparse.timing`` times; ``check_indices=False`` skips the value checks
    and their synchronisation, for indices valid by construction).
Algorithm
    Forward (``forward._sparse_fwd``): one program per (query token, batch x KV head
    x row block); its tile's rows are the G = H_q / H_kv query heads of the GQA group
    (padded to BLOCK_M >= 16), so every selected K/V row crosses HBM once per group,
    not once per head (NSA's kernel design). The program walks its row of kv_indices
    as one flat list of S x block_size keys, gathering BLOCK_N keys per step (any
    block size, 1 included: DSA's tokens; when block_size is a multiple of BLOCK_N a
    step lies in one block: one scalar index, contiguous keys, no per-key division),
    with the online softmax of
    :mod:`kernels.flash` in base 2 (exp2, log2(e) folded into the scale; its
    ``finish_rows`` epilogue). The cost of a query is S x block_size keys whatever
    N_k: doubling N doubles the work (dense causal attention quadruples).
    Backward (``backward._sparse_bwd``): the same programs recompute P from the saved
    lse; dQ is summed in registers, dK = dS^T Q and dV = P^T dO of the gathered keys
    go to fp32 buffers by relaxed atomics (a key is shared by every token that chose
    it; atomics instead of a transposed key -> queries list); delta = rowsum(dO o) -
    dlse in torch. No N_q x N_k tensor anywhere. The two kernels share the pieces of
    their key loop (``blocks``: ``group_rows``, ``chunk_keys``, ``gathered_scores``)
    and their launch's sizes and flags (``blocks.launch_sizes``).
    select_blocks (``select``): torch ops, chunked over queries: the group-summed
    queries against the mean-pooled keys (an fp32 matmul), then an exact top-k on an
    int64 key (tier, order-preserving score bits, complemented index); the indexer
    (``indexer``) likewise, in torch ops.
Shapes
    q (B, H_q, N_q, d); k (B, H_kv, N_k, d); v (B, H_kv, N_k, d_v); d, d_v in
    1 ... 256 (padded to powers of two >= 16 and masked); H_q a multiple of H_kv.
    kv_indices (B, H_kv, N_q, S) int32 (int64 accepted and converted), S >= 0: block c
    is keys [c block_size, min((c + 1) block_size, N_k)); -1 is padding (skipped).
    Output o (B, H_q, N_q, d_v) in q's dtype; lse (B, H_q, N_q) float32 natural log.
Causal
    Bottom-right aligned as kernels.flash: query i sits at position i + N_k - N_q and
    sees the keys j <= that of its chosen blocks (so N_q < N_k decodes). A query
    whose chosen blocks hold no visible key (all padding, N_q > N_k, blocks after it)
    gives o = 0 and lse = -inf, and zero gradients.
NaN and inf
    As kernels.flash: a NaN in q reaches its own row; a NaN in a K or V row reaches
    exactly the rows that chose and see that key (their o and lse, and the gradients
    of what they read); a row with no visible key gives 0 and -inf, never NaN, and a
    NaN row is never read as "no key". Keys not chosen, padding and keys hidden by
    the causal mask are masked out of the loads themselves: a NaN/inf there is never
    read (no NaN shield launch is needed, unlike the dense kernels). Scores are fp32:
    a row that sees a key but whose scores are all -inf (an input inf, or q k^T *
    scale overflowing fp32) reads NaN.
    select_blocks: a NaN score ranks above every number (lowest index first), so a
    NaN row keeps its NaN (the twin's rule).
Checks
    ValueError/TypeError naming the argument: tensors not 4-D, dtypes outside
    fp16/bf16/fp32 or mixed, devices, shapes that disagree, head dims, block_size or
    topk not an int >= 1, a kv_indices entry outside [-1, n_blocks) or repeated within
    a row (both checked on the device, one host synchronisation per call; ``prepare``
    checks once).
Tiles
    ``kernels.sparse.tiles``: BLOCK_M = the group padded to a power of two, 16 ... 64
    (16 for CUDA-core dots, 32 for the backward at d = 256), more heads take several
    programs; BLOCK_N, warps and stages per kernel, architecture class and padded
    head dim (64 rows take 8 warps). On sm_90 a 16-row tile gets mma.sync, not wgmma
    (which needs 64 rows): groups of 64 heads get wgmma. Under the Triton
    interpreter: 64-key steps.
Dtypes and devices
    float16, bfloat16, float32 (IEEE fp32 dots, CUDA cores); fp32 accumulation; under
    the interpreter bf16 tiles are upcast, and on sm_75 fp16 and bf16 tiles both
    (its CUDA-core fp16 dots spill here). The sm_75 backward is refused above d =
    128 (ValueError, when q, k or v requires grad). CUDA sm_75 ... sm_90, checked
    ahead of time by ``python -m kernels.sparse.compile_check`` (registers,
    spills), and the Triton interpreter on a CPU.
Known limits
    dK/dV by atomics: their last bits vary from run to run (dQ and the forward are
    deterministic). One query token per program: with G < 16 (MHA) most rows of the
    16-row tile are padding (the tile is bound by K/V bytes, not by the dot). Gathered
    loads: contiguous along d, no TMA or block pointers. No GPU run is recorded yet:
    the tiles are chosen to compile without spills, not tuned. select_blocks builds an
    int64 key per (query, block): O(N^2 / block_size) work and chunked memory; no
    Triton kernel for it (nor for the indexer, O(N^2) in torch ops) yet. No dropout,
    no sliding-window or compressed branch (NSA's other two branches are
    attention.sparse's NumPy), no paged cache, no fp8.
"""

from .. import runtime  # noqa: F401  (first: decides CUDA vs interpreter)
from .api import prepare, sparse_attention
from .indexer import index_topk, lightning_indexer, topk_tokens
from .select import mean_pool, select_blocks
from .tiles import MAX_HEAD_DIM

__all__ = [
    "MAX_HEAD_DIM",
    "index_topk",
    "lightning_indexer",
    "mean_pool",
    "prepare",
    "select_blocks",
    "sparse_attention",
    "topk_tokens",
]
