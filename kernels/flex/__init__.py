"""FlexAttention in Triton: mask mods, score mods, sinks and block-sparse tiles.

Spec sheet
----------
Call
    ``flex_attention(q, k, v, score_mod=None, block_mask=None, scale=None,
    enable_gqa=False, return_lse=False, sinks=None)``, PyTorch's FlexAttention call
    shape; ``create_block_mask(mask_mod, B, H, Q_LEN, KV_LEN, device=None,
    BLOCK_SIZE=128)`` -> ``BlockMask`` (``.sparsity()``: percent of tiles skipped).
Algorithm
    FlashAttention-2 over a block mask. The mask is classified once per tile
    (``create_block_mask``): empty tiles are never visited, full tiles are visited
    without evaluating the mask, partial tiles evaluate it pair by pair. Forward: one
    program per (BLOCK_M query rows, batch x q head), walking the full then partial key
    tiles of its row of the block mask with the online softmax (base 2, the score mod
    applied to the natural-unit score first). The sink logit joins the denominator in
    the epilogue. Backward: delta = rowsum(dO O) - dlse (torch), then a dK/dV kernel
    (one program per key tile, walking the transposed q-side lists of every q head in
    its GQA group) and a dQ kernel (the forward's lists), both recomputing P from the
    saved lse; no N_q x N_k tensor, no atomics.
    dsinks = -sum over rows of exp(sink - lse) delta.
Mods
    ``mask_mod(b, h, q_idx, kv_idx) -> bool`` and ``score_mod(score, b, h, q_idx,
    kv_idx) -> score`` are ``@triton.jit`` functions with torch's signatures; q_idx and
    kv_idx are absolute positions from 0 in their own sequences (torch's convention:
    causal is q_idx >= kv_idx, top-left aligned, unlike kernels.flash's bottom-right
    causal). Ready-made: ``causal_mask``, ``sliding_window(window)``,
    ``document_mask(document_ids)``, ``prefix_lm(prefix_length)``, ``dense_mask(mask)``,
    ``and_masks``, ``or_masks``, ``softcap(cap)``, ``alibi(slopes)`` (``kernels.flex.
    mods``: each carries its numbers/tensors, a closed-form tile classifier, and for
    score mods the exact derivative; softcap's tanh and its derivative keep a few ulps
    relative at every cap). A user's own score mod can carry its exact derivative,
    ``score_mod_with_grad(score_mod, grad)`` (dq, dk then within 2x PyTorch's own
    fp32 error); a bare one is differentiated by a five-point difference in fp32
    whose step follows |score| and what the mod adds to it: within 4x PyTorch's
    error for a bias (even ``score + 1000``), about 13x for a curved mod (a
    user-written softcap at cap 2), measured in ``tests/kernels/
    test_flex_user_grad.py``).
Shapes
    q (B, H_q, N_q, d); k (B, H_kv, N_k, d); v (B, H_kv, N_k, d_v), d and d_v in
    1 ... 256, independent (DeepSeek MLA prefill: 192 / 128), padded to powers of two
    >= 16 and masked. GQA as torch's (``enable_gqa=True``, H_q a multiple of H_kv).
    Any N_q, N_k >= 1; the block mask must be made for (N_q, N_k), its B / H either 1
    (broadcast) or q's. Output o (B, H_q, N_q, d_v) in q's dtype; lse (B, H_q, N_q)
    float32, natural log. ``sinks`` (H_q,) float.
NaN and inf
    As kernels.flash: a NaN in a row's inputs gives NaN in that row; a row with no
    visible key gives o = 0 and lse = -inf (with a sink, lse = the sink), never NaN.
    A NaN/inf in a pair the mask hides reaches nothing: skipped tiles are never read,
    and when an input holds one (a flag computed on the device, no host sync) partial
    tiles sum P V, P^T dO, dS^T Q and dS K through kernels.flash's ``finite_dot``
    (in second launches, SHIELD, whose programs stop at once when the flag is clear).
    Without a score mod, a row that sees a key but whose scores are all -inf (an input
    inf, fp32 overflow) reads NaN; with a score mod a -inf score is the mod's own mask
    (weight 0).
Tiles
    The kernel tile is the shipped table's (``kernels.flex.tiles``) capped by the block
    mask's BLOCK_SIZE (powers of two >= 16, so the kernel tile divides the mask tile).
    Under the Triton interpreter: 64 x 64 capped the same way. A BLOCK_SIZE past the
    sequence is walked only as far as the sequence (rounded up to a power of two):
    the work follows N, not BLOCK_SIZE.
Dtypes and devices
    float16, bfloat16, float32 (IEEE fp32 dots); fp32 accumulation. CUDA sm_75 ...
    sm_90 (``python -m kernels.flex.compile_check`` compiles causal, window,
    document and softcap + sink instantiations ahead of time and checks spills), and
    the Triton interpreter on a CPU.
Known limits
    A block mask made with B or H None is classified at b = 0 / h = 0 and reused for
    every batch / head (torch's rule): a mask_mod that depends on b or h needs B / H
    given. The sm_75 backward is refused above d, d_v = 64 (its tiles spill). No
    dropout, no paged KV cache, no FP8. Score mods: one per call (compose your own
    ``@triton.jit`` for several); a user's bare score mod gets a numerical derivative.
    ``and_masks`` classifies tiles conservatively (a tile may be taken for partial
    when it is empty; results are exact, it only costs time). One tile config per
    kernel, head dim and GPU class (no autotuning).
"""

from .api import flex_attention
from .block_mask import BlockMask, create_block_mask
from .mods import (
    Mod,
    alibi,
    and_masks,
    causal_mask,
    dense_mask,
    document_mask,
    noop_mask,
    or_masks,
    prefix_lm,
    score_mod_with_grad,
    sliding_window,
    softcap,
)

__all__ = [
    "BlockMask",
    "Mod",
    "alibi",
    "and_masks",
    "causal_mask",
    "create_block_mask",
    "dense_mask",
    "document_mask",
    "flex_attention",
    "noop_mask",
    "or_masks",
    "prefix_lm",
    "score_mod_with_grad",
    "sliding_window",
    "softcap",
]
