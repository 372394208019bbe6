"""Attention as models mask it, in NumPy: masks and score mods as functions of absolute
positions, their dense matrices and block masks, and attention under them (chapter 7).

The signatures are PyTorch FlexAttention's, so a mod written here reads like one written
for ``kernels.flex``:

* a **mask mod** ``mask(b, h, q_idx, kv_idx) -> bool`` says whether query ``q_idx`` may
  see key ``kv_idx`` (batch ``b``, head ``h``); indices are absolute positions counted
  from 0 in their own sequences, and are NumPy integer arrays that broadcast, so one
  call gives a whole matrix;
* a **score mod** ``score_mod(score, b, h, q_idx, kv_idx) -> score`` changes the scaled
  score ``q . k * scale`` before the softmax.

Ready-made masks: ``causal_mask`` (q_idx >= kv_idx), ``sliding_window(window)``
(0 <= q_idx - kv_idx < window), ``document_mask(document_ids)`` (equal ids; (N,) or
(B, N)), ``prefix_lm(prefix_length)`` (kv_idx < prefix_length, or causal), and their
combinations ``and_masks(*masks)`` and ``or_masks(*masks)`` (no mask: all True and all
False, as torch's). Score mods: ``softcap(cap)`` (cap * tanh(score / cap), Gemma 2),
``alibi(slopes)`` (score + slopes[h] (kv_idx - q_idx); ``alibi_slopes(H)`` gives the
paper's slopes 2^(-8h/H)), ``relative_position_bias(table, ...)`` (T5's bucketed bias,
``t5_bucket``). A learned sink logit per head is the ``sinks`` argument of
``masked_attention``: the softmax denominator gains exp(sinks[h]).

``mask_matrix`` draws a mask as its N_q x N_k matrix; ``block_mask`` cuts it into tiles
of ``block_size`` and classes each tile as ``FULL`` (every pair visible: no mask to
evaluate), ``PARTIAL`` (some visible: the mask is evaluated inside) or ``EMPTY`` (none:
the tile is skipped). ``BlockMask.sparsity()`` is the percent of tiles skipped
(torch's number when the lengths are multiples of the tile; ``torch_formula=True``
gives torch's for any length).

``masked_attention(q, k, v, mask=None, score_mod=None, sinks=None, scale=None,
enable_gqa=False)`` returns ``(o, lse)`` for q (B, H_q, N_q, d), k (B, H_kv, N_k, d),
v (B, H_kv, N_k, d_v), computed in float64: a row that sees no key gives o = 0 and
lse = -inf (with a sink, lse = the sink); a NaN in a row's inputs gives NaN in that row
only (a NaN value in v poisons the rows that see its key, and only those); a hidden key
reaches nothing, whatever its value (an inf in v at a key a row cannot see leaves that
row finite: the mask is applied before the P V product, as the kernels apply it).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Callable

import numpy as np

from .checks import check_bool, check_scale
from .core import weighted_sum

#: Tile classes of a block mask.
EMPTY, PARTIAL, FULL = 0, 1, 2
#: Most (query, key) pairs ``block_mask`` evaluates; beyond it, the closed forms of
#: ``attention.memory.blocksparse`` count the tiles without drawing them.
MAX_PAIRS = 2**28

MaskMod = Callable[..., np.ndarray]
ScoreMod = Callable[..., np.ndarray]


# ---------------------------------------------------------------------------------
# Argument checks
# ---------------------------------------------------------------------------------


def _int(name: str, value, low: int) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(
        value, (numbers.Integral, np.integer)
    ):
        raise TypeError(
            f"{name} must be an int >= {low}, got {type(value).__name__} {value!r}"
        )
    if value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {int(value)}")
    return int(value)


def _positive_float(name: str, value) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(
        value, (numbers.Real, np.floating, np.integer)
    ):
        raise TypeError(
            f"{name} must be a positive finite number, got "
            f"{type(value).__name__} {value!r}"
        )
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return float(value)


def _callable(name: str, fn) -> None:
    if not callable(fn):
        raise TypeError(f"{name} must be a function, got {type(fn).__name__}")


def _mod_output(name: str, out, shape: tuple) -> np.ndarray:
    """A mod's result broadcast to ``shape``: ValueError naming the mod otherwise
    (a mod returns one value per (b, h, q_idx, kv_idx) it is given)."""
    out = np.asarray(out)
    try:
        return np.broadcast_to(out, shape)
    except ValueError:
        raise ValueError(
            f"{name} returned shape {out.shape}, which does not broadcast to the "
            f"{tuple(shape)} pairs it was asked for (a mod maps broadcast index "
            "arrays (b, h, q_idx, kv_idx) to one value per pair)"
        ) from None


# ---------------------------------------------------------------------------------
# Mask mods
# ---------------------------------------------------------------------------------


def causal_mask(b, h, q_idx, kv_idx):
    """Query q_idx sees keys kv_idx <= q_idx (absolute positions: top-left aligned)."""
    return q_idx >= kv_idx


def sliding_window(window: int) -> MaskMod:
    """Causal with the last ``window`` keys only: 0 <= q_idx - kv_idx < window
    (Mistral's 4,096, Gemma 3's 1,024, gpt-oss's 128). ``window`` >= 1."""
    w = _int("window", window, 1)

    def sliding_window_mask(b, h, q_idx, kv_idx):
        diff = q_idx - kv_idx
        return (diff >= 0) & (diff < w)

    sliding_window_mask.window = w
    return sliding_window_mask


def document_mask(document_ids) -> MaskMod:
    """Packed sequences: a query sees the keys of its own document only (equal ids).

    ``document_ids`` is (N,) (one packing for the batch) or (B, N) (one per sequence),
    integers; combine with ``causal_mask`` for causal training:
    ``and_masks(causal_mask, document_mask(ids))``.
    """
    ids = np.asarray(document_ids)
    if ids.ndim not in (1, 2) or ids.size == 0:
        raise ValueError(
            f"document_ids must be a non-empty (N,) or (B, N) array, got shape "
            f"{ids.shape}"
        )
    if not np.issubdtype(ids.dtype, np.integer):
        raise TypeError(f"document_ids must hold integers, got dtype {ids.dtype}")

    def document(b, h, q_idx, kv_idx):
        n = max(int(np.max(q_idx, initial=0)), int(np.max(kv_idx, initial=0))) + 1
        if n > ids.shape[-1]:
            raise ValueError(
                f"document_ids has length {ids.shape[-1]}, shorter than the "
                f"{n} positions asked for"
            )
        if ids.ndim == 1:
            return ids[q_idx] == ids[kv_idx]
        if int(np.max(b, initial=0)) >= ids.shape[0]:
            raise ValueError(
                f"document_ids holds {ids.shape[0]} batches, b = "
                f"{int(np.max(b))} asked for"
            )
        return ids[b, q_idx] == ids[b, kv_idx]

    document.document_ids = ids
    return document


def prefix_lm(prefix_length: int) -> MaskMod:
    """A prefix that sees both ways, causal after it: kv_idx < prefix_length or
    q_idx >= kv_idx (PaliGemma, T5-style prefix LMs). ``prefix_length`` >= 0."""
    p = _int("prefix_length", prefix_length, 0)

    def prefix(b, h, q_idx, kv_idx):
        return (kv_idx < p) | (q_idx >= kv_idx)

    prefix.prefix_length = p
    return prefix


def and_masks(*masks: MaskMod) -> MaskMod:
    """A pair is visible when every mask says so (no mask: every pair)."""
    for i, m in enumerate(masks):
        _callable(f"masks[{i}]", m)

    def both(b, h, q_idx, kv_idx):
        out = np.asarray(True)
        for m in masks:
            out = out & m(b, h, q_idx, kv_idx)
        return out

    return both


def or_masks(*masks: MaskMod) -> MaskMod:
    """A pair is visible when any mask says so (no mask: no pair)."""
    for i, m in enumerate(masks):
        _callable(f"masks[{i}]", m)

    def either(b, h, q_idx, kv_idx):
        out = np.asarray(False)
        for m in masks:
            out = out | m(b, h, q_idx, kv_idx)
        return out

    return either


# ---------------------------------------------------------------------------------
# Score mods
# ---------------------------------------------------------------------------------


def softcap(cap: float) -> ScoreMod:
    """Gemma 2's logit soft-capping: cap * tanh(score / cap), smooth, |score| < cap."""
    c = _positive_float("cap", cap)

    def capped(score, b, h, q_idx, kv_idx):
        return c * np.tanh(score / c)

    capped.cap = c
    return capped


def alibi_slopes(H: int) -> np.ndarray:
    """ALiBi's head slopes: 2^(-8h/H) for h = 1..H when H is a power of two; otherwise
    the paper's rule, the slopes of the power of two n below H and every other slope of
    2n for the rest."""
    H = _int("H", H, 1)

    def powers(n):
        return [2.0 ** (-8.0 * (i + 1) / n) for i in range(n)]

    n = 2 ** int(math.floor(math.log2(H)))
    slopes = powers(n)
    if n < H:
        slopes += powers(2 * n)[0::2][: H - n]
    return np.array(slopes)


def alibi(slopes) -> ScoreMod:
    """ALiBi: score + slopes[h] * (kv_idx - q_idx): a linear penalty on distance, one
    slope per head, no position embedding."""
    s = np.asarray(slopes, dtype=np.float64)
    if s.ndim != 1 or s.size == 0:
        raise ValueError(f"slopes must be a non-empty (H,) array, got shape {s.shape}")

    def biased(score, b, h, q_idx, kv_idx):
        return score + s[h] * (kv_idx - q_idx)

    biased.slopes = s
    return biased


def t5_bucket(relative_position, bidirectional=True, num_buckets=32, max_distance=128):
    """T5's bucket of relative_position = kv_idx - q_idx: exact buckets for the
    num_buckets / 4 nearest distances (per direction when bidirectional), log-spaced
    ones up to max_distance, one bucket for everything further (as HF's T5)."""
    num_buckets = _int("num_buckets", num_buckets, 4)
    max_distance = _int("max_distance", max_distance, 1)
    rel = np.asarray(relative_position)
    buckets = np.zeros(rel.shape, dtype=np.int64)
    if bidirectional:
        num_buckets //= 2
        buckets += (rel > 0) * num_buckets
        n = np.abs(rel)
    else:
        n = -np.minimum(rel, 0)
    max_exact = num_buckets // 2
    small = n < max_exact
    with np.errstate(divide="ignore"):
        large = max_exact + (
            np.log(np.maximum(n, 1) / max_exact)
            / math.log(max_distance / max_exact)
            * (num_buckets - max_exact)
        ).astype(np.int64)
    large = np.minimum(large, num_buckets - 1)
    return buckets + np.where(small, n, large)


def relative_position_bias(
    table, bidirectional: bool = True, max_distance: int = 128
) -> ScoreMod:
    """T5's relative position bias: score + table[h, t5_bucket(kv_idx - q_idx)];
    ``table`` is (H, num_buckets), learned in T5."""
    t = np.asarray(table, dtype=np.float64)
    if t.ndim != 2 or t.shape[1] < 4:
        raise ValueError(
            f"table must be (H, num_buckets) with num_buckets >= 4, got shape {t.shape}"
        )

    def biased(score, b, h, q_idx, kv_idx):
        bucket = t5_bucket(kv_idx - q_idx, bidirectional, t.shape[1], max_distance)
        return score + t[h, bucket]

    return biased


# ---------------------------------------------------------------------------------
# Dense and block masks
# ---------------------------------------------------------------------------------


def mask_matrix(
    mask: MaskMod, N_q: int, N_k: int | None = None, b: int = 0, h: int = 0
):
    """The mask as its (N_q, N_k) bool matrix, for batch ``b`` and head ``h``."""
    _callable("mask", mask)
    N_q = _int("N_q", N_q, 1)
    N_k = N_q if N_k is None else _int("N_k", N_k, 1)
    if N_q * N_k > MAX_PAIRS:
        raise ValueError(
            f"mask_matrix: N_q * N_k = {N_q * N_k:,} pairs is more than MAX_PAIRS = "
            f"{MAX_PAIRS:,}; count tiles with attention.memory.blocksparse's closed "
            "forms instead"
        )
    q = np.arange(N_q)[:, None]
    kv = np.arange(N_k)[None, :]
    return _mod_output("mask", mask(b, h, q, kv), (N_q, N_k)).astype(bool)


def _block_size(block_size) -> tuple[int, int]:
    if isinstance(block_size, tuple):
        if len(block_size) != 2:
            raise ValueError(f"block_size must be an int or (Br, Bc), got {block_size}")
        return _int("block_size[0]", block_size[0], 1), _int(
            "block_size[1]", block_size[1], 1
        )
    bs = _int("block_size", block_size, 1)
    return bs, bs


@dataclasses.dataclass(frozen=True)
class BlockMask:
    """A mask cut into Br x Bc tiles: ``kinds[i, j]`` is EMPTY, PARTIAL or FULL for
    query block i and key block j (the last block of each axis may be ragged)."""

    kinds: np.ndarray  # (T_r, T_c) int8
    N_q: int
    N_k: int
    Br: int
    Bc: int

    @property
    def tiles(self) -> int:
        return int(self.kinds.size)

    @property
    def full(self) -> int:
        return int((self.kinds == FULL).sum())

    @property
    def partial(self) -> int:
        return int((self.kinds == PARTIAL).sum())

    @property
    def empty(self) -> int:
        return int((self.kinds == EMPTY).sum())

    @property
    def visited(self) -> int:
        """Tiles the kernel computes: full and partial ones."""
        return self.full + self.partial

    def sparsity(self, torch_formula: bool = False) -> float:
        """Percent of tiles skipped, 100 empty / tiles, in [0, 100].

        PyTorch's ``BlockMask.sparsity`` counts each visited tile at its full Br x Bc
        area against the N_q N_k pairs instead, 100 (1 - visited Br Bc / (N_q N_k)):
        the same when N_q and N_k are multiples of the tile, lower for ragged lengths
        (the last tiles' padding counted as work), even negative (causal at N = 100,
        tiles of 128: 0% here, -63.84% in torch). ``torch_formula=True`` gives
        torch's number (as ``kernels.flex.BlockMask.sparsity``)."""
        if check_bool("torch_formula", torch_formula):
            area = self.visited * self.Br * self.Bc
            return 100.0 * (1.0 - area / (self.N_q * self.N_k))
        return 100.0 * self.empty / self.tiles

    def __repr__(self) -> str:
        return (
            f"BlockMask(N_q={self.N_q}, N_k={self.N_k}, block=({self.Br}, {self.Bc}), "
            f"full={self.full}, partial={self.partial}, empty={self.empty}, "
            f"sparsity={self.sparsity():.1f}%)"
        )


def block_mask(
    mask: MaskMod,
    N_q: int,
    N_k: int | None = None,
    block_size=128,
    b: int = 0,
    h: int = 0,
) -> BlockMask:
    """Evaluate ``mask`` at every pair and class each tile of ``block_size`` (an int or
    (Br, Bc)) as FULL, PARTIAL or EMPTY. Refuses more than ``MAX_PAIRS`` pairs."""
    _callable("mask", mask)
    N_q = _int("N_q", N_q, 1)
    N_k = N_q if N_k is None else _int("N_k", N_k, 1)
    Br, Bc = _block_size(block_size)
    if N_q * N_k > MAX_PAIRS:
        raise ValueError(
            f"block_mask: N_q * N_k = {N_q * N_k:,} pairs is more than MAX_PAIRS = "
            f"{MAX_PAIRS:,}; attention.memory.blocksparse's closed forms "
            "(window_work, document_work, prefix_work) count the tiles of the "
            "ready-made masks at any length"
        )
    t_r, t_c = -(-N_q // Br), -(-N_k // Bc)
    kinds = np.empty((t_r, t_c), dtype=np.int8)
    pad_k = t_c * Bc - N_k
    kv = np.arange(N_k)[None, :]
    rows = max(1, (2**22 // max(N_k, 1)) // Br) * Br  # rows per chunk, whole blocks
    for start in range(0, N_q, rows):
        stop = min(start + rows, N_q)
        q = np.arange(start, stop)[:, None]
        m = _mod_output("mask", mask(b, h, q, kv), (stop - start, N_k)).astype(bool)
        # ragged edges: pad with the tile's own kind-neutral values
        n_blk = -(-(stop - start) // Br)
        pad_q = n_blk * Br - (stop - start)
        any_ = np.pad(m, ((0, pad_q), (0, pad_k)), constant_values=False)
        all_ = np.pad(m, ((0, pad_q), (0, pad_k)), constant_values=True)
        any_ = any_.reshape(n_blk, Br, t_c, Bc).any(axis=(1, 3))
        all_ = all_.reshape(n_blk, Br, t_c, Bc).all(axis=(1, 3))
        i0 = start // Br
        kinds[i0 : i0 + n_blk] = np.where(all_, FULL, np.where(any_, PARTIAL, EMPTY))
    return BlockMask(kinds, N_q, N_k, Br, Bc)


# ---------------------------------------------------------------------------------
# Attention under a mask, a score mod and sinks
# ---------------------------------------------------------------------------------


def _array(name: str, x) -> np.ndarray:
    a = np.asarray(x)
    if a.ndim != 4:
        raise ValueError(f"{name} must be (B, H, N, d), got shape {a.shape}")
    if not np.issubdtype(a.dtype, np.floating):
        raise TypeError(f"{name} must hold floats, got dtype {a.dtype}")
    return a


def masked_attention(
    q,
    k,
    v,
    mask=None,
    score_mod: ScoreMod | None = None,
    sinks=None,
    scale: float | None = None,
    enable_gqa: bool = False,
):
    """Attention under a mask mod (or a bool array broadcastable to (B, H_q, N_q, N_k)),
    a score mod and per-head sink logits, in float64. Returns (o (B, H_q, N_q, d_v),
    lse (B, H_q, N_q)), natural log, the sink included in lse."""
    q, k, v = _array("q", q), _array("k", k), _array("v", v)
    B, H_q, N_q, d = q.shape
    if k.shape[0] != B or v.shape[0] != B:
        raise ValueError(f"batch sizes differ: q {B}, k {k.shape[0]}, v {v.shape[0]}")
    if k.shape[3] != d:
        raise ValueError(f"k's head dim {k.shape[3]} differs from q's {d}")
    if k.shape[:3] != v.shape[:3]:
        raise ValueError(
            f"k (B, H_kv, N_k) = {k.shape[:3]} and v's {v.shape[:3]} differ"
        )
    H_kv, N_k = k.shape[1], k.shape[2]
    if H_q != H_kv:
        if not enable_gqa:
            raise ValueError(
                f"q has {H_q} heads and k {H_kv}: set enable_gqa=True for GQA"
            )
        if H_q % H_kv:
            raise ValueError(f"H_q = {H_q} must be a multiple of H_kv = {H_kv}")
    if score_mod is not None:
        _callable("score_mod", score_mod)
    if scale is None:
        scale = check_scale("scale", None, d)  # refuses d = 0 by name
    else:
        scale = _positive_float("scale", scale)
    group = H_q // H_kv
    q64 = q.astype(np.float64)
    k64 = np.repeat(k.astype(np.float64), group, axis=1)  # (B, H_q, N_k, d)
    v64 = np.repeat(v.astype(np.float64), group, axis=1)  # (B, H_q, N_k, d_v)
    b = np.arange(B)[:, None, None, None]
    h = np.arange(H_q)[None, :, None, None]
    qi = np.arange(N_q)[None, None, :, None]
    ki = np.arange(N_k)[None, None, None, :]
    s = np.einsum("bhqd,bhkd->bhqk", q64, k64) * scale  # (B, H_q, N_q, N_k)
    if score_mod is not None:
        s = _mod_output("score_mod", score_mod(s, b, h, qi, ki), s.shape)
        s = s.astype(np.float64)
    if mask is None:
        visible = np.ones(s.shape, dtype=bool)
    elif callable(mask):
        visible = _mod_output("mask", mask(b, h, qi, ki), s.shape).astype(bool)
    else:
        m = np.asarray(mask)
        if m.dtype != bool:
            raise TypeError(
                f"mask must be a mask mod or a bool array, got dtype {m.dtype}"
            )
        try:
            visible = np.broadcast_to(m, s.shape)
        except ValueError:
            raise ValueError(
                f"mask of shape {m.shape} does not broadcast to (B, H_q, N_q, N_k) = "
                f"{s.shape}"
            ) from None
    sink = None
    if sinks is not None:
        sink = np.asarray(sinks, dtype=np.float64)
        if sink.shape != (H_q,):
            raise ValueError(f"sinks must be (H_q,) = ({H_q},), got shape {sink.shape}")
        sink = sink[None, :, None]  # (1, H_q, 1)
    s = np.where(visible, s, -np.inf)
    m = s.max(axis=-1) if N_k else np.full(s.shape[:3], -np.inf)  # (B, H_q, N_q)
    if sink is not None:
        m = np.maximum(m, sink)  # NaN stays NaN
    m_safe = np.where(np.isneginf(m), 0.0, m)
    e = np.exp(s - m_safe[..., None])  # masked keys: exp(-inf) = 0
    denom = e.sum(axis=-1)
    if sink is not None:
        denom = denom + np.exp(sink - m_safe)
    with np.errstate(divide="ignore", invalid="ignore"):
        lse = np.log(denom) + m_safe
        p = np.where(denom[..., None] > 0, e / denom[..., None], 0.0)
    p = np.where(np.isnan(denom)[..., None], np.nan, p)
    # P V over the visible keys only: a hidden key's value (inf, NaN) reaches nothing
    with np.errstate(invalid="ignore"):  # inf - inf: NaN, as IEEE sums
        return weighted_sum(p, v64, visible), lse


__all__ = [
    "EMPTY",
    "FULL",
    "MAX_PAIRS",
    "PARTIAL",
    "BlockMask",
    "alibi",
    "alibi_slopes",
    "and_masks",
    "block_mask",
    "causal_mask",
    "mask_matrix",
    "document_mask",
    "masked_attention",
    "or_masks",
    "prefix_lm",
    "relative_position_bias",
    "sliding_window",
    "softcap",
    "t5_bucket",
]
