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
    j <= i + N_k - N_q); a query that sees no key (N_k = 0 included: no launch) gets
    o = 0 and index -1, never NaN, and -1 means nothing else. A scale whose product
    with log2(e) overflows fp32 is refused (ValueError).
NaN rule
    One rule, soft attention's: a NaN in a row's inputs gives NaN in that row only.
    A NaN score ranks above every number, as ``torch.argmax`` does: a query whose
    visible scores hold a NaN gets o = NaN, and its index names its first NaN key
    (``sample=True`` too: the noised score is NaN there), never -1. Top-k ranks a NaN
    score as +inf (``torch.topk`` also puts NaN first): such a row keeps its NaN keys
    first, lowest index first (tied with any +inf score), and gets o = NaN and lse NaN;
    its backward sends NaN to exactly the keys it kept (hard attention's, to the value
    row of the NaN key it names). So a NaN in q reaches only that
    query's row; a NaN in k every row that sees that key (a causal mask that hides the
    key keeps the row clean); a NaN in v only the rows that select (top-k: keep) that
    value row. Whatever the tile sizes: the index of a NaN row comes from a second pass
    over the keys that only a program holding such a row makes, so the main loop (and
    its registers) are unchanged.
dtypes / head dims
    float16, bfloat16, float32 (scores accumulate in float32; float32 inputs use IEEE
    dot products so the argmax matches an fp64 reference away from exact ties).
    1 <= d <= 128 (padded to a power of two >= 16). 1 <= topk <= MAX_TOPK = 128.
Devices
    CUDA GPUs sm_75 (T4), sm_80, sm_86/89, sm_90 with triton 3.6 / 3.7; on a CPU the
    Triton interpreter (TRITON_INTERPRET=1, CPU tensors), where tiles are upcast to
    float32 because the interpreter's tl.dot mishandles bf16 (so are bf16 tiles on
    sm_75, which lacks bf16 tensor cores).
    Input checks are flash_attention's (``kernels.flash.check_inputs``, in
    :mod:`kernels.hard.checks`).
Known limits
    No dropout, no key-padding masks (only causal), no fused backward kernel for top-k
    (PyTorch gathers: memory O(N_q * topk * d) in the backward). Top-k's merge cost
    grows with the number of buffer insertions: ~topk * (1 + ln(N_k / topk)) per row for
    random scores, but every key for adversarial (increasing) scores; a program runs as
    many insertion steps per key block as its busiest row needs. Sampling draws one
    philox number per (query, key), so ``sample=True`` costs more than argmax.
    Tile configs (``configs``) were chosen by compiling each for sm_75/80/89/90 ahead of
    time (shared memory, registers, spills), not by timing: no GPU timed these kernels
    while they were written. ``kernels/hard/timing.py`` records their speed.
"""

from .api import hard_attention, topk_attention
from .tiles import MAX_HEAD_DIM, MAX_TOPK, configs

__all__ = ["MAX_HEAD_DIM", "MAX_TOPK", "configs", "hard_attention", "topk_attention"]
