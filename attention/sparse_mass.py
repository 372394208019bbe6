"""How much attention mass a block budget keeps: for rows of softmax probabilities, the
share of each row's mass inside the blocks a selection rule picks (chapter 8).

Three rules pick k blocks of ``block_size`` keys per query (``attention.sparse``):

``moba``    the gate on mean-pooled keys, q . mean(k[block]) (``select_blocks``), the
            query's own block forced under causal;
``nsa``     NSA's selection from the compressed branch (``nsa_select``: softmax over
            mean-pooled compressed keys, 1 initial and 2 local blocks forced); with a
            learned compression it would differ, mean pooling is the learning-free
            stand-in;
``quest``   Quest's pages ranked by the upper bound of q . k from each page's
            per-channel min and max key (``quest_select``), an inference-time rule
            beside the two trained ones;
``oracle``  the k blocks of largest mass in the map itself (the best any rule can do
            with k blocks: an upper bound).

Each rule's k blocks are the first k of its ranking, so one top-``max(ks)`` ranking per
block size gives every budget. ``minilm_qkp(text)`` reads the pretrained model's
queries, keys and attention maps of every layer (``attention.pretrained``), so the
curves are measured on a real model's maps, bidirectional (causal=False).
"""

from __future__ import annotations

import numpy as np

from . import sparse
from .checks import as_block_indices, as_real_array, check_bool, check_int

__all__ = [
    "METHODS",
    "block_mass",
    "mass_curves",
    "mass_kept",
    "minilm_qkp",
    "oracle_blocks",
]

METHODS = ("moba", "nsa", "quest", "oracle")


def block_mass(p, block_size: int) -> np.ndarray:
    """(..., N_q, N_k) -> (..., N_q, ceil(N_k / block_size)): each block's share."""
    p = as_real_array("p", p, 2)
    block_size = check_int("block_size", block_size, 1)
    starts = np.arange(0, p.shape[-1], block_size)
    return np.add.reduceat(p.astype(np.float64), starts, axis=-1)


def mass_kept(p, kv_indices, block_size: int) -> np.ndarray:
    """The share of each row's mass inside its chosen blocks, (..., N_q).

    p (..., N_q, N_k) probabilities (rows need not sum to 1: the share is of the row's
    own total; a row of total 0 gives NaN), kv_indices (..., N_q, S) integers in [-1,
    n_blocks), -1 skipped, distinct within a row (``checks.as_block_indices``)."""
    bm = block_mass(p, block_size)
    # integers in [-1, n_blocks), distinct in a row: what the kernel takes
    idx = as_block_indices("kv_indices", kv_indices, bm.shape[-1], bm.shape[:-1])
    pad = np.concatenate([bm, np.zeros(bm.shape[:-1] + (1,))], axis=-1)
    kept = np.take_along_axis(pad, np.where(idx < 0, bm.shape[-1], idx), -1).sum(-1)
    total = bm.sum(-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total > 0, kept / total, np.nan)


def oracle_blocks(p, block_size: int, topk: int, causal: bool = False) -> np.ndarray:
    """The ``topk`` blocks of largest mass per row (..., N_q, topk), best first; under
    causal only blocks starting at or before the query (bottom-right aligned)."""
    bm = block_mass(p, block_size)
    causal = check_bool("causal", causal)
    eligible = None
    if causal:
        n_q, n_k = p.shape[-2], p.shape[-1]
        pos = np.arange(n_q)[:, None] + n_k - n_q
        eligible = np.broadcast_to(
            np.arange(bm.shape[-1]) * block_size <= pos, bm.shape
        )
    return sparse.rank_topk(bm, topk, eligible)


def mass_curves(
    p,
    q,
    k,
    block_sizes=(16, 32, 64, 128),
    ks=tuple(range(1, 33)),
    methods=METHODS,
    causal=False,
) -> dict:
    """Mean mass kept over every row and head, per method (all of ``METHODS`` unless
    ``methods``): {method: (len(block_sizes),
    len(ks)) array}. p (B, H, N_q, N_k) the maps that q (B, H, N_q, d) and k (B, H_kv,
    N_k, d) produced (MoBA and NSA read q and k; the oracle reads p)."""
    p = as_real_array("p", p, 4)
    for name, values in (("ks", ks), ("block_sizes", block_sizes),
                         ("methods", methods)):  # fmt: skip
        if len(values) == 0:
            raise ValueError(f"{name} must hold at least one entry, got {values!r}")
    ks = [check_int("ks", x, 1) for x in ks]
    for m in methods:
        if m not in METHODS:
            raise ValueError(f"methods must be drawn from {METHODS}, got {m!r}")
    top = max(ks)
    h_q, h_kv = p.shape[1], np.shape(k)[1]
    out = {m: np.zeros((len(block_sizes), len(ks))) for m in methods}
    for a, bs in enumerate(block_sizes):
        bs = check_int("block_sizes", bs, 1)
        bm = block_mass(p, bs)
        pad = np.concatenate([bm, np.zeros(bm.shape[:-1] + (1,))], axis=-1)
        total = bm.sum(-1, keepdims=True)
        for m in methods:
            if m == "oracle":
                order = oracle_blocks(p, bs, top, causal)
            else:
                pick = {"moba": sparse.select_blocks, "nsa": sparse.nsa_select,
                        "quest": sparse.quest_select}[m]  # fmt: skip
                order = np.repeat(pick(q, k, bs, top, causal), h_q // h_kv, axis=1)
            # the first kk of one ranking are the kk-block choice: a cumulative sum
            # of the chosen blocks' mass gives every budget at once (= mass_kept)
            kept = np.take_along_axis(
                pad, np.where(order < 0, bm.shape[-1], order), -1
            ).cumsum(-1)
            with np.errstate(invalid="ignore", divide="ignore"):
                share = np.where(total > 0, kept / total, np.nan)
            for b, kk in enumerate(ks):
                out[m][a, b] = np.nanmean(share[..., kk - 1])
    return out


def minilm_qkp(text: str, model=None):
    """q, k (L, H, N, d) and the maps p (L, H, N, N) of every layer of the pretrained
    MiniLM (``attention.pretrained.load_minilm``) on ``text``, in float64."""
    from . import pretrained

    model = pretrained.load_minilm() if model is None else model
    qs, ks = [], []

    def attend(q, k, v):
        qs.append(q[0])
        ks.append(k[0])
        return pretrained.numpy_attend(q, k, v)

    _, p = model.forward(text, attend)
    return (
        np.stack(qs).astype(np.float64),
        np.stack(ks).astype(np.float64),
        p.astype(np.float64),
    )
