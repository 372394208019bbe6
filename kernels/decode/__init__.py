"""Decode attention in Triton: split-KV (FlashDecoding) over a paged, GQA-packed cache,
with flash-attn's window, softcap, ALiBi, sinks and fp8 cache, and MLA decode.

Spec sheet
----------
Call
    ``attention_with_kvcache(q, k_cache, v_cache, cache_seqlens, block_table=None,
    causal=True, softmax_scale=None, num_splits=0, return_lse=False, *,
    window_size=(-1, -1), softcap=0.0, alibi_slopes=None, sinks=None, k_descale=None,
    v_descale=None)``, a drop-in for flash-attn's paged ``flash_attn_with_kvcache``
    (without appending new keys: the caller writes them into the cache first), in the
    argument order of the NumPy twin ``attention.decode.attention_with_kvcache``.
    q (B, N_q, H_q, d): the N_q new tokens of each sequence. k_cache, v_cache
    (num_pages, page_size, H_kv, d) with block_table (B, max_pages) int32 mapping each
    sequence's logical pages to physical ones (vLLM's PagedAttention), or (B, N_max,
    H_kv, d) without one (a contiguous cache). cache_seqlens (B,) int32: the valid
    keys of each sequence, the N_q new tokens included, so the queries sit at
    positions i = seqlen - N_q ... seqlen - 1. Returns out (B, N_q, H_q, d) in q's
    dtype, and with ``return_lse`` lse (B, H_q, N_q) float32 (natural log).
    ``mla_with_kvcache(q, kv_cache, cache_seqlens, block_table=None, head_dim_v=512,
    softmax_scale=None, causal=True, return_lse=False)``: FlashMLA's absorbed MLA
    decode in this book's order (FlashMLA's ``flash_mla_with_kvcache`` takes the table
    before the lengths, needs its scheduler's metadata and defaults to causal=False).
    kv_cache (num_pages, page_size, 1, D) or (B, N_max, 1, D): one latent row a token,
    D = head_dim_v + rope dim (DeepSeek-V3: 512 + 64 = 576); the keys are the rows,
    the values their first head_dim_v columns; q (B, N_q, H_q, D); out (B, N_q, H_q,
    head_dim_v); softmax_scale defaults to 1/sqrt(D).
Keywords (flash-attn's semantics, the twin's order of operations)
    Score s = scale q.k; ``softcap`` c > 0: s = c tanh(s / c); ``alibi_slopes`` (H_q,)
    or (B, H_q) float32: s -= slope |i - j|; ``window_size`` (left, right): key j is
    visible when i - left <= j <= i + right (-1: unbounded; ``causal`` sets right =
    0); ``sinks`` (H_q,) float32 (gpt-oss's learned sink): the softmax's denominator
    gains exp(sink), lse includes it, and a row with no visible key (an empty slot)
    gets 0 and lse = sink (the twin's rule: the sink is a key of value 0).
    ``k_descale``, ``v_descale`` (B, H_kv) float32 with a float8_e4m3fn cache
    (FlashAttention-3's names: the cache holds K / descale): the key descale
    multiplies the scale, the value descale the output; an fp8 cache without them
    reads descale 1 (FA3's default). ``mla_with_kvcache`` has no keywords.
Algorithm
    Kernel 1 (``forward._decode_split``), grid (H_kv x row blocks, num_splits, B): a
    program holds every query row that reads one KV head, the G = H_q / H_kv heads of
    the group times the N_q tokens, as one tile of BLOCK_M = next power of two of
    G N_q (16 ... 64 rows, 32 for CUDA-core dots at d > 128, 16 for MLA, whose H_q
    heads all read the one latent row; more rows take more programs that read the
    same tiles, from L2), so each K/V tile crosses HBM once per group, not once per
    head (GQA packing). It streams its split of the sequence's visible keys in
    BLOCK_N tiles, each found through the block table (one entry per tile when
    BLOCK_N divides the page size, else one per key), with the online softmax of
    :mod:`kernels.flash` in base 2 (exp2, log2(e) folded into the scale; softcap and
    ALiBi in base 2 too; the softcap's tanh keeps a few ulps relative at every cap,
    a series where e^(-2|x|) would cancel), and writes a normalised partial output
    o_s and its log-sum-exp lse_s in fp32. Split 0 starts from the sink (m = sink,
    l = 1). Kernel 2 (``blocks._decode_merge``), one program per (sequence, head, token,
    128 columns): o = sum_s exp(lse_s - lse) o_s with lse = log sum_s exp(lse_s), the
    merge rule of chapter 2's online softmax applied across programs (FlashDecoding).
    With one split kernel 1 writes the output directly and there is no merge.
Window
    Under a left window the programs visit only the key tiles from
    max(0, seqlen - N_q - left) (rounded down to a tile) to seqlen: the tiles before
    it are never loaded (at 128k context and a 4k window, 1/32 of the keys). Each
    program's visible range is cut into tiles of three kinds: the masked tiles at the
    window's start, the unmasked middle (keys every query row sees) and the masked
    tiles at the end (the causal diagonal, the length). The split heuristic counts
    only the visible keys (``checks.visible_span``: N_q + left at most).
MLA
    The K tile is the latent row: BLOCK_D = next power of two of head_dim_v columns,
    loaded once and used as both K and V (V = its first head_dim_v columns), and the
    rope columns as a second tile BLOCK_R = next power of two of D - head_dim_v (at
    576: 512 + 64, no padding): q k = q[:dv] k[:dv] + q[dv:] k[dv:], two dots into one
    fp32 score tile. head_dim_v <= 512, rope <= 128.
Splits
    ``num_splits=0`` picks ``api.choose_splits``: one split when the B x H_kv x row
    blocks programs reach two per SM; otherwise enough splits to reach two programs
    per SM, at least 256 visible keys each, at most 64 (under the interpreter at
    most 2). Any num_splits gives the same answer up to fp32 rounding; it is capped at
    the number of visible key tiles of the longest sequence.
Causal
    Bottom-right: token t of a sequence of length L (query position L - N_q + t) sees
    keys j <= L - N_q + t; with ``causal=False`` every token sees all L keys (or its
    window). Only the tiles at the ends of the visible range carry masks.
Lengths
    cache_seqlens[b] = 0 is an empty slot: its rows give out 0 and lse -inf (lse =
    sink with ``sinks``). Otherwise N_q <= cache_seqlens[b] <= capacity (N_max, or
    max_pages x page_size), else ValueError. Entries of block_table past a sequence's
    last page are never read; the entries it uses must lie in 0 .. num_pages - 1
    (checked on the host).
NaN and inf
    A NaN in a cached key or value row reaches exactly the query rows that see that
    key: their output (and lse, for a key) is NaN; rows that do not see it (other
    sequences, earlier tokens under the causal mask, queries whose window excludes it,
    other KV heads) are unchanged and never read as "no key". Slots past
    cache_seqlens in a page (stale data of a freed sequence) and keys before a
    window's first tile are never loaded. In the masked tiles of a causal or windowed
    call the value tile's non-finite entries are zeroed for the product P V and the
    rows that see one are set to NaN (an inf in V therefore gives NaN, not inf, in
    those rows). As in kernels.flash, scores are fp32: a row whose visible scores are
    all -inf or overflow fp32 reads NaN, never the empty-row answer (with a sink, a
    row whose scores are all -inf reads the sink's answer, as the twin does).
Dtypes
    float16, bfloat16, float32 (q and caches alike); fp32 accumulation and partials;
    out in q's dtype. float32 runs on CUDA cores (IEEE dots) with 16-row blocks and,
    on a GPU, head dims up to 128 (ValueError above: its tiles spill there). Under
    the interpreter and on sm_75 bf16 tiles are upcast to fp32.
    fp8 cache: float8_e4m3fn k_cache and v_cache under float16 or bfloat16 q (fp8 or
    fp32 q: TypeError). Each tile is upcast to q's dtype after loading (exact: every
    e4m3 value is an fp16 and a bf16 value) and the dots run as for a 16-bit cache:
    the win is the bytes (half of bf16's), not fp8 tensor cores, and it runs on every
    target. On sm_89/90 Triton's conversion does it; on sm_75/80 (no e4m3 conversion
    instruction) and under the interpreter (whose conversion reads the NaN bytes as
    +-480) the kernel loads the raw bytes and decodes them with integer ops (shifted
    into an fp16's fields: value x 2^-8 for normals and subnormals alike; S.1111.111
    is NaN). The tiles are the 16-bit cache's. MLA: float16, bfloat16 (and float32
    under the interpreter), no fp8.
Head dims
    1 ... 256 (float32 on a GPU: 1 ... 128); the tile is padded to BLOCK_D = next
    power of two (at least 16) and the tail masked (d = 80 runs at d = 128's cost).
    MLA: D up to 640, head_dim_v up to 512.
Devices and tiles
    CUDA sm_75/80/86/89/90 (``tiles.tiles``: BLOCK_N, warps, stages per architecture
    class and padded head dim; CUDA-core dots on sm_75 and for fp32; 64-row blocks
    with softcap or ALiBi halve the key tile; MLA ``tiles.MLA_TILES``: 32 keys, 8
    warps, 16 rows), checked ahead of time by ``kernels.decode.compile_check``
    (no spills on sm_75/80/89/90, the window, softcap + ALiBi + sinks, fp8 and MLA at
    576/512 included). MLA needs sm_80 or newer: on sm_75 every tile tried needs
    more than its 64 KB of shared memory, and the call raises ValueError. On a CPU
    the kernels run under the Triton interpreter with 16-key tiles.
Known limits
    No appending of new keys into the cache, no rotary embedding, no backward, no fp8
    MLA cache, no MLA on sm_75, no fp8 tensor-core dots (the fp8 tiles are upcast). The
    window's skipping works per program: a sequence's visible tiles are shared among its
    splits, and rows of one program span the N_q new tokens, so a program reads the
    union of their windows. ``attention_with_kvcache`` validates on the host (one
    synchronisation per call); ``api.prepare`` / ``api.prepare_mla`` validate once and
    return a launcher that only launches. No GPU run is recorded yet: the tiles are
    chosen to fit (compile check) and to keep K/V bytes in flight, not tuned on
    hardware; the fp8, MLA and window goals of ``kernels/decode/timing.py`` are
    unmeasured.
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
