"""A block-sparse FlashAttention forward (FlexAttention's, ``kernels.flex``'s), tile by
tile over a block mask and in closed form: HBM traffic, FLOPs and mask evaluations of
the tiles a mask lets the kernel visit (chapter 7).

The model is ``flash2``'s (``attention.memory.forward``) with the key loop restricted to
the visited tiles of an ``attention.masks.BlockMask``:

    for each query block i: load Q_i once; O_i, l_i, m_i start on chip
      for each key block j with tile (i, j) FULL or PARTIAL:
        load K_j, V_j; S_ij = Q_i K_j^T (the mask evaluated here if PARTIAL); update
      write O_i and L_i once (a row block with no visited tile writes 0 and -inf)

* Traffic, in elements (``Traffic``, ``Traffic.bytes``): Q read N_q d; K and V read
  (sum over visited tiles of their key block's length) x d and x d_v; O written
  N_q d_v, L written N_q. Nothing is counted for the block mask's index lists (an int
  per visited tile: a few KiB beside MiBs of K and V).
* FLOPs: 2 (d + d_v) per score of every visited tile (S = Q K^T and O = P V; 4 d when
  d_v = d), masked pairs of partial tiles included: the tile is computed whole.
* Mask evaluations: every pair of a PARTIAL tile; FULL tiles skip the mask.

``simulate_block_sparse(block_mask, d, d_v=None)`` walks the tiles with ``HBMSim``;
``window_work``, ``document_work`` (equal lengths), ``prefix_work`` and ``causal_work``
give the same ``Work`` from formulas for self-attention (N_q = N_k = N) at any length:
each row block's visible keys are one interval whose ends move monotonically with the
query, so its visited and full tiles are two ranges of key blocks, counted per row
block without enumerating a tile. ``simulate_block_sparse`` refuses schedules of more
than ``MAX_EVENTS`` events and points to them.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from attention import masks as _masks
from attention.checks import check_bool

from .sim import MAX_EVENTS, HBMSim, Traffic, cdiv, check_count, traffic


@dataclasses.dataclass(frozen=True)
class Work:
    """What a block-sparse forward does over one head: traffic (elements), tiles by
    kind, scores computed and mask evaluations. Equal when every count is equal."""

    traffic: Traffic
    full: int
    partial: int
    empty: int
    scores: int  # pairs computed: every pair of every visited tile
    mask_evals: int  # pairs of partial tiles
    d: int
    d_v: int

    @property
    def visited(self) -> int:
        return self.full + self.partial

    @property
    def tiles(self) -> int:
        return self.full + self.partial + self.empty

    @property
    def flops(self) -> int:
        """Matrix-multiply FLOPs: 2 d per score for S, 2 d_v for O = P V."""
        return 2 * (self.d + self.d_v) * self.scores

    def sparsity(self) -> float:
        """Percent of tiles skipped (``BlockMask.sparsity``)."""
        return 100.0 * self.empty / self.tiles

    def bytes(self, bytes_per_elem: int = 2) -> int:
        return self.traffic.bytes(bytes_per_elem)

    def counts(self) -> tuple:
        t = self.traffic
        return (t.reads, t.writes, t.per_tensor, t.events, self.full, self.partial)

    def __eq__(self, other) -> bool:
        if not isinstance(other, Work):
            return NotImplemented
        return self.counts() + (self.empty, self.scores, self.mask_evals) == (
            other.counts() + (other.empty, other.scores, other.mask_evals)
        ) and (self.d, self.d_v) == (other.d, other.d_v)


def simulate_block_sparse(
    block_mask: _masks.BlockMask,
    d: int,
    d_v: int | None = None,
    keep_trace: bool = False,
    max_events: int | None = MAX_EVENTS,
) -> Work:
    """Walk ``block_mask``'s visited tiles as the kernel does and count every load and
    store (``HBMSim``), the scores computed and the pairs where the mask is evaluated.
    Refuses more than ``max_events`` events (None: no limit) before it runs."""
    if not isinstance(block_mask, _masks.BlockMask):
        raise TypeError(
            "block_mask must be an attention.masks.BlockMask, got "
            f"{type(block_mask).__name__}"
        )
    d = check_count("d", d)
    d_v = d if d_v is None else check_count("d_v", d_v)
    bm, kinds = block_mask, block_mask.kinds
    events = 3 * kinds.shape[0] + 3 * bm.visited
    if max_events is not None and events > check_count("max_events", max_events):
        raise ValueError(
            f"simulate_block_sparse would record {events:,} events, more than "
            f"max_events = {max_events:,}: too slow in Python. window_work, "
            "document_work, prefix_work and causal_work give the same counts at once "
            "(or pass max_events=None to insist)"
        )
    sim = HBMSim(None, keep_trace)
    rows, cols = (
        [min(bm.Br, bm.N_q - i * bm.Br) for i in range(kinds.shape[0])],
        [min(bm.Bc, bm.N_k - j * bm.Bc) for j in range(kinds.shape[1])],
    )
    scores = evals = 0
    for i, br in enumerate(rows):
        sim.load("Q", br * d, (i,))  # Q_i stays on chip for the whole key loop
        for j in np.flatnonzero(kinds[i]):  # visited tiles only: FULL or PARTIAL
            bc = cols[j]
            sim.load("K", bc * d, (int(j),))
            sim.load("V", bc * d_v, (int(j),))
            sim.compute("S", (i, int(j)))
            sim.next_step()
            scores += br * bc
            if kinds[i, j] == _masks.PARTIAL:
                evals += br * bc  # the mask runs on every pair of a partial tile
        sim.store("O", br * d_v, (i,))
        sim.store("L", br, (i,))
    t = sim.result()
    t = Traffic(t.reads, t.writes, t.per_tensor, t.trace, None, None, t.events)
    return Work(t, bm.full, bm.partial, bm.empty, scores, evals, d, d_v)


# ---------------------------------------------------------------------------------
# Closed forms: one visible interval [lo(q), hi(q)] per query, both ends nondecreasing
# ---------------------------------------------------------------------------------


def _ranges(N, Br, Bc, lo, hi):
    """Per row block of a mask whose row q sees keys lo(q)..hi(q) (inclusive), lo and
    hi nondecreasing, lo(q+1) <= hi(q) + 1: the rows of a block then see one interval
    of keys together, lo(first)..hi(last), and every row sees lo(last)..hi(first).
    Returns (row sizes, first and last visited key block, first and last full key
    block; no full block where first > last)."""
    t_r, t_c = cdiv(N, Br), cdiv(N, Bc)
    a = np.arange(t_r, dtype=np.int64) * Br  # first row of each block
    last = np.minimum(a + Br, N) - 1
    j_lo, j_hi = lo(a) // Bc, hi(last) // Bc
    i_lo, i_hi = lo(last), hi(a)  # keys every row of the block sees
    f_lo = -(-i_lo // Bc)
    f_hi = np.where(i_hi >= N - 1, t_c - 1, (i_hi + 1) // Bc - 1)
    return last - a + 1, j_lo, j_hi, f_lo, np.maximum(f_hi, f_lo - 1)


def _interval_work(N, d, d_v, Br, Bc, lo, hi) -> Work:
    """Tiles and traffic from ``_ranges``: the visited and the full key blocks of each
    row block are two ranges, so their counts and key extents are differences."""
    t_r, t_c = cdiv(N, Br), cdiv(N, Bc)
    br, j_lo, j_hi, f_lo, f_hi = _ranges(N, Br, Bc, lo, hi)
    vis = j_hi - j_lo + 1
    ext = np.minimum((j_hi + 1) * Bc, N) - j_lo * Bc  # keys in the visited tiles
    full = f_hi - f_lo + 1
    f_ext = np.where(full > 0, np.minimum((f_hi + 1) * Bc, N) - f_lo * Bc, 0)
    n_vis, n_full = int(vis.sum()), int(full.sum())
    keys = int(ext.sum())
    t = traffic(
        {
            "Q": (N * d, 0),
            "K": (keys * d, 0),
            "V": (keys * d_v, 0),
            "O": (0, N * d_v),
            "L": (0, N),
        },
        events=3 * t_r + 3 * n_vis,
    )
    scores = int((br * ext).sum())
    evals = int((br * (ext - f_ext)).sum())
    return Work(t, n_full, n_vis - n_full, t_r * t_c - n_vis, scores, evals, d, d_v)


def _bounds(kind: str, N: int, value):
    """(lo, hi) of a ready-made mask kind (see ``mask_for``)."""
    if kind == "causal":
        return (lambda q: 0 * q), (lambda q: q)
    if kind == "window":
        w = check_count("window", value)
        return (lambda q: np.maximum(q - w + 1, 0)), (lambda q: q)
    if kind == "document":
        L = check_count("doc_len", value)
        return (lambda q: (q // L) * L), (lambda q: q)
    if kind == "prefix":
        p = check_count("prefix", value)
        return (lambda q: 0 * q), (lambda q: np.minimum(np.maximum(q, p - 1), N - 1))
    raise ValueError(
        f"kind must be one of ['causal', 'window', 'document', 'prefix'], got {kind!r}"
    )


def tile_ranges(kind: str, N: int, value=None, Br: int = 128, Bc: int = 128):
    """Per row block of ``mask_for(kind, N, value)``: (first visited, first full, last
    full, last visited) key block, an int array (T_r, 4), from the closed form (no pair
    evaluated). A row block without full tiles has last full = first full - 1."""
    N, Br, Bc = check_count("N", N), check_count("Br", Br), check_count("Bc", Bc)
    _, j_lo, j_hi, f_lo, f_hi = _ranges(N, Br, Bc, *_bounds(kind, N, value))
    return np.stack([j_lo, f_lo, f_hi, j_hi], axis=1)


def closed_block_mask(kind: str, N: int, value=None, Br: int = 128, Bc: int = 128):
    """The ``BlockMask`` of ``mask_for(kind, N, value)`` from ``tile_ranges``: equal to
    ``attention.masks.block_mask`` of it, at lengths it refuses to evaluate."""
    r = tile_ranges(kind, N, value, Br, Bc)
    j = np.arange(cdiv(N, Bc))[None, :]
    visited = (j >= r[:, :1]) & (j <= r[:, 3:])
    full = (j >= r[:, 1:2]) & (j <= r[:, 2:3])
    kinds = np.where(full, _masks.FULL, np.where(visited, _masks.PARTIAL, _masks.EMPTY))
    return _masks.BlockMask(kinds.astype(np.int8), N, N, Br, Bc)


def _dims(N, d, d_v, Br, Bc):
    N, d = check_count("N", N), check_count("d", d)
    d_v = d if d_v is None else check_count("d_v", d_v)
    return N, d, d_v, check_count("Br", Br), check_count("Bc", Bc)


def window_work(
    N: int, d: int, window: int, Br: int = 128, Bc: int = 128, d_v: int | None = None
) -> Work:
    """``sliding_window(window)`` over N tokens: row q sees max(0, q - window + 1)..q.
    With Br = Bc = B dividing N and window: a row block past the first window / B
    visits window / B + 1 tiles, two of them partial (the diagonal, the far edge)."""
    N, d, d_v, Br, Bc = _dims(N, d, d_v, Br, Bc)
    return _interval_work(N, d, d_v, Br, Bc, *_bounds("window", N, window))


def causal_work(
    N: int, d: int, Br: int = 128, Bc: int = 128, d_v: int | None = None
) -> Work:
    """``causal_mask``: the dense causal kernel, empty tiles above the diagonal
    skipped (what ``kernels.flash`` does)."""
    return window_work(N, d, N, Br, Bc, d_v)


def document_work(
    N: int,
    d: int,
    doc_len: int,
    Br: int = 128,
    Bc: int = 128,
    d_v: int | None = None,
    causal: bool = True,
) -> Work:
    """Packed documents of ``doc_len`` tokens each (the last one shorter if doc_len
    does not divide N): ``and_masks(causal_mask, document_mask(ids))``, or the
    document mask alone with ``causal=False``."""
    N, d, d_v, Br, Bc = _dims(N, d, d_v, Br, Bc)
    L = check_count("doc_len", doc_len)
    causal = check_bool("causal", causal)

    def hi(q):
        return q if causal else np.minimum((q // L + 1) * L, N) - 1

    return _interval_work(N, d, d_v, Br, Bc, lambda q: (q // L) * L, hi)


def prefix_work(
    N: int, d: int, prefix: int, Br: int = 128, Bc: int = 128, d_v: int | None = None
) -> Work:
    """``prefix_lm(prefix)``: row q sees 0..max(q, prefix - 1) (the prefix both ways,
    causal after it)."""
    N, d, d_v, Br, Bc = _dims(N, d, d_v, Br, Bc)
    p = check_count("prefix", prefix)
    return _interval_work(
        N,
        d,
        d_v,
        Br,
        Bc,
        lambda q: 0 * q,
        lambda q: np.minimum(np.maximum(q, p - 1), N - 1),
    )


def mask_for(kind: str, N: int, value: int | None = None):
    """The ``attention.masks`` mask mod behind a closed form: kind "causal", "window"
    (value = window), "document" (value = doc_len, causal) or "prefix" (value =
    prefix), at length N."""
    if kind == "causal":
        return _masks.causal_mask
    if kind == "window":
        return _masks.sliding_window(value)
    if kind == "document":
        ids = np.arange(N) // check_count("doc_len", value)
        return _masks.and_masks(_masks.causal_mask, _masks.document_mask(ids))
    if kind == "prefix":
        return _masks.prefix_lm(value)
    raise ValueError(
        f"kind must be one of ['causal', 'window', 'document', 'prefix'], got {kind!r}"
    )


def closed_work(
    kind: str, N: int, d: int, value: int | None = None, Br=128, Bc=128, d_v=None
) -> Work:
    """The closed form of ``mask_for(kind, N, value)``."""
    if kind == "causal":
        return causal_work(N, d, Br, Bc, d_v)
    fn = {"window": window_work, "document": document_work, "prefix": prefix_work}
    if kind not in fn:
        raise ValueError(
            f"kind must be one of ['causal', 'window', 'document', 'prefix'], got "
            f"{kind!r}"
        )
    return fn[kind](N, d, value, Br, Bc, d_v)


__all__ = [
    "Work",
    "causal_work",
    "closed_work",
    "document_work",
    "mask_for",
    "prefix_work",
    "simulate_block_sparse",
    "window_work",
]
