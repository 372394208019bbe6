"""Decode attention in Triton: split-KV (FlashDecoding) over a paged, GQA-packed cache.

Spec sheet
----------
Call
    ``attention_with_kvcache(q, k_cache, v_cache, cache_seqlens, block_table=None,
    causal=True, softmax_scale=None, num_splits=0, return_lse=False)``, a drop-in for
    flash-attn's paged ``flash_attn_with_kvcache`` (without appending new keys: the
    caller writes them into the cache first). q (B, N_q, H_q, d): the N_q new tokens of
    each sequence. k_cache, v_cache (num_pages, page_size, H_kv, d) with block_table
    (B, max_pages) int32 mapping each sequence's logical pages to physical ones
    (vLLM's PagedAttention), or (B, N_max, H_kv, d) without one (a contiguous cache).
    cache_seqlens (B,) int32: the valid keys of each sequence, the N_q new tokens
    included, so the queries sit at positions seqlen - N_q ... seqlen - 1. Returns out
    (B, N_q, H_q, d) in q's dtype, and with ``return_lse`` lse (B, H_q, N_q) float32
    (natural log).
Algorithm
    Kernel 1 (``forward._decode_split``), grid (H_kv x row blocks, num_splits, B): a
    program holds every query row that reads one KV head, the G = H_q / H_kv heads of
    the group times the N_q tokens, as one tile of BLOCK_M = next power of two of
    G N_q (16 ... 64 rows, 32 for CUDA-core dots at d > 128; more rows take more
    programs that read the same tiles, from L2), so each K/V tile crosses
    HBM once per group, not once per head (GQA packing). It streams its split of the
    sequence's keys in BLOCK_N tiles, each found through the block table (one entry
    per tile when BLOCK_N divides the page size, else one per key), with the online
    softmax of :mod:`kernels.flash` in base 2 (exp2, log2(e) folded into the scale),
    and writes a normalised partial output o_s and its log-sum-exp lse_s in fp32.
    Kernel 2 (``forward._decode_merge``), one program per (sequence, head, token):
    o = sum_s exp(lse_s - lse) o_s with lse = log sum_s exp(lse_s), the merge rule of
    chapter 2's online softmax applied across programs (FlashDecoding). With one split
    kernel 1 writes the output directly and there is no merge.
Splits
    ``num_splits=0`` picks ``api.choose_splits``: one split when the B x H_kv x row
    blocks programs reach two per SM; otherwise enough splits to reach two programs
    per SM, at least 256 keys each, at most 64 (under the interpreter at most 2). Any
    num_splits gives the same answer up to fp32 rounding; it is capped at the number
    of key tiles of the longest sequence.
Causal
    Bottom-right: token t of a sequence of length L (query position L - N_q + t) sees
    keys j <= L - N_q + t; with ``causal=False`` every token sees all L keys. Only the
    last key tiles of each sequence carry masks.
Lengths
    cache_seqlens[b] = 0 is an empty slot: its rows give out 0 and lse -inf. Otherwise
    N_q <= cache_seqlens[b] <= capacity (N_max, or max_pages x page_size), else
    ValueError. Entries of block_table past a sequence's last page are never read;
    the entries it uses must lie in 0 .. num_pages - 1 (checked on the host).
NaN and inf
    A NaN in a cached key or value row reaches exactly the query rows that see that
    key: their output (and lse, for a key) is NaN; rows that do not see it (other
    sequences, earlier tokens under the causal mask, other KV heads) are unchanged and
    never read as "no key". Slots past cache_seqlens in a page (stale data of a freed
    sequence) are never loaded. In the causal masked tiles the value tile's non-finite
    entries are zeroed for the product P V and the rows that see one are set to NaN
    (an inf in V therefore gives NaN, not inf, in those rows). As in kernels.flash,
    scores are fp32: a row whose visible scores are all -inf or overflow fp32 reads
    NaN, never the empty-row answer.
Dtypes
    float16, bfloat16, float32 (q and caches alike); fp32 accumulation and partials;
    out in q's dtype. float32 runs on CUDA cores (IEEE dots) with 16-row blocks and,
    on a GPU, head dims up to 128 (ValueError above: its tiles spill there). Under
    the interpreter and on sm_75 bf16 tiles are upcast to fp32.
    No fp8 cache.
Head dims
    1 ... 256 (float32 on a GPU: 1 ... 128); the tile is padded to BLOCK_D = next
    power of two (at least 16) and the tail masked (d = 80 runs at d = 128's cost).
Devices and tiles
    CUDA sm_75/80/86/89/90 (``tiles.tiles``: BLOCK_N, warps, stages per architecture
    class and padded head dim; CUDA-core dots on sm_75 and for fp32), checked ahead of
    time by ``kernels.machine_code.decode_check`` (no spills on sm_75/80/89/90). On a
    CPU the kernels run under the Triton interpreter with 16-key tiles.
Known limits
    No appending of new keys into the cache, no rotary embedding, no sliding window,
    ALiBi or softcap, no fp8 cache, no backward. ``attention_with_kvcache`` validates
    on the host (one synchronisation per call); ``api.prepare`` validates once and
    returns a launcher that only launches. No GPU run is recorded yet: the tiles are
    chosen to fit (compile check) and to keep K/V bytes in flight, not tuned on
    hardware.
"""

from __future__ import annotations

from .. import runtime  # noqa: F401  (first: decides CUDA vs interpreter)
from .api import attention_with_kvcache, mla_with_kvcache, prepare, prepare_mla
from .checks import MAX_HEAD_DIM, choose_splits

__all__ = [
    "attention_with_kvcache",
    "mla_with_kvcache",
    "prepare",
    "prepare_mla",
    "choose_splits",
    "MAX_HEAD_DIM",
]
