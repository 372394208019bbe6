"""Decoding in NumPy (chapter 5): a KV cache filled by prefill and grown a token a step,
partial softmaxes merged by their log-sum-exp (FlashDecoding's split-KV), a paged cache
with a block table, and the memory a batch of requests wastes with and without pages.
The math of ``kernels/decode``.

Every function here is exact in float64: decoding token by token equals causal attention
over the whole sequence to ~1e-15 (the tests hold 1e-12), whatever the split count or
the page size. Per-head arrays are ``(B, H, N, d)``; ``attention_with_kvcache`` and
``mla_with_kvcache`` (defined in ``attention.kvcache``, with their window, softcap,
ALiBi, sink and fp8 keywords, and re-exported here) take
the kernel's (flash-attn's) layout instead, ``q (B, N_q, H_q, d)`` against a cache
``(B, N_max, H_kv, d)`` or pages ``(num_pages, page_size, H_kv, d)`` with a block table.
H_q is a multiple of H_kv (grouped-query attention, GQA; H_kv = 1 is multi-query, MQA):
query head h reads KV head ``h // (H_q // H_kv)``.

The rules of ``attention.core`` hold: a query row that sees no key gets output 0 and
lse -inf; a NaN in a row's inputs gives NaN in that row's output (and lse, when the NaN
is in a score) and only there; a chunk with no visible key contributes nothing to a
merge. Arguments are checked first (ValueError or TypeError naming the argument).
"""

from __future__ import annotations

import numpy as np

from .checks import as_real_array, check_bool, check_int, check_scale
from .core import logsumexp, merge_partials, softmax, weighted_sum
from .flash import standard_forward
from .kvcache import (  # noqa: F401 (re-exported: the kernel's calls live there)
    E4M3_MAX,
    _int_array,
    attention_with_kvcache,
    cascade_attention,
    kv_group,
    mla_with_kvcache,
    quantize_e4m3,
    repeat_kv,
    round_e4m3,
)

# ---------------------------------------------------------------------------------
# Partial softmaxes, merged by attention.core.merge_partials (chapters 2, 5 and 6)
# ---------------------------------------------------------------------------------


def partial_attention(
    q,
    k,
    v,
    scale: float | None = None,
    causal: bool = False,
    q_offset: int | None = None,
):
    """Attention of ``q (..., N_q, d)`` over one chunk of keys ``k, v (..., n, d)``:
    returns (o, lse), o normalised within the chunk and lse its log-sum-exp (..., N_q).

    ``causal``: query i sits at absolute position ``q_offset + i`` and the chunk's keys
    at ``0 .. n-1`` relative to where the chunk starts, so pass ``q_offset`` = the
    query's position minus the chunk's first key position; it sees key j when
    j <= q_offset + i (default q_offset = n - N_q: bottom-right). An empty chunk, or a
    row that sees no key of it, gives o = 0 and lse = -inf: it adds nothing to a merge.
    """
    q, k, v = (as_real_array(n, t, 2) for n, t in (("q", q), ("k", k), ("v", v)))
    causal = check_bool("causal", causal)
    scale = check_scale("scale", scale, q.shape[-1])
    n_q, n = q.shape[-2], k.shape[-2]
    if q_offset is not None:
        q_offset = check_int("q_offset", q_offset)
    if n == 0:
        lead = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
        return (np.zeros((*lead, n_q, v.shape[-1])), np.full((*lead, n_q), -np.inf))
    if not causal:
        o, lse, _ = standard_forward(q, k, v, scale=scale)
    else:
        off = n - n_q if q_offset is None else q_offset
        keep = np.arange(n)[None, :] <= np.arange(n_q)[:, None] + off  # (N_q, n)
        s = (q @ np.swapaxes(k, -1, -2)) * scale  # (..., N_q, n)
        s = np.where(keep, s, -np.inf)
        p = softmax(s, axis=-1)
        lse = logsumexp(s, axis=-1)
        o = weighted_sum(p, v, keep)
    lse = np.where(np.isposinf(lse), np.nan, lse)  # a +inf score: undefined, as NaN
    return o, lse


def split_chunks(n_k: int, num_splits: int, block: int = 1) -> list[tuple[int, int]]:
    """The key ranges [start, stop) of ``num_splits`` splits of ``n_k`` keys, each a
    whole number of ``block``-key tiles (ceil(ceil(n_k / block) / num_splits) tiles), as
    a split-KV kernel cuts them; trailing splits may be empty (start == stop)."""
    n_k, s = check_int("n_k", n_k, 0), check_int("num_splits", num_splits, 1)
    block = check_int("block", block, 1)
    tiles = -(-n_k // block)
    per = max(1, -(-tiles // s)) * block
    return [(min(i * per, n_k), min((i + 1) * per, n_k)) for i in range(s)]


def split_kv_attention(
    q,
    k,
    v,
    num_splits: int = 1,
    causal: bool = False,
    scale: float | None = None,
    block: int = 1,
):
    """FlashDecoding in NumPy: keys cut into ``num_splits`` chunks (``split_chunks``),
    one partial (o_s, lse_s) per chunk, merged by ``merge_partials``.

    q (..., N_q, d), k, v (..., N_k, d); causal aligns bottom-right. Returns (o, lse).
    """
    q, k, v = (as_real_array(n, t, 2) for n, t in (("q", q), ("k", k), ("v", v)))
    n_q, n_k = q.shape[-2], k.shape[-2]
    parts = [
        partial_attention(
            q,
            k[..., a:b, :],
            v[..., a:b, :],
            scale=scale,
            causal=causal,
            q_offset=n_k - n_q - a,
        )
        for a, b in split_chunks(n_k, num_splits, block)
    ]
    return merge_partials([o for o, _ in parts], [lse for _, lse in parts])


# ---------------------------------------------------------------------------------
# A contiguous KV cache: prefill, then one token (or a few) per step
# ---------------------------------------------------------------------------------


class KVCache:
    """A contiguous cache pre-allocated to ``max_len`` tokens per sequence:
    ``k, v (B, H_kv, max_len, d)`` and the number of valid tokens of each sequence."""

    def __init__(self, batch: int, n_heads_kv: int, max_len: int, d: int):
        shape = (
            check_int("batch", batch, 1),
            check_int("n_heads_kv", n_heads_kv, 1),
            check_int("max_len", max_len, 1),
            check_int("d", d, 1),
        )
        self.k = np.zeros(shape)  # (B, H_kv, max_len, d)
        self.v = np.zeros(shape)
        self.length = 0

    def append(self, k_new, v_new) -> None:
        """Write ``k_new, v_new (B, H_kv, n, d)`` after the cached tokens."""
        want = (*self.k.shape[:2], None, self.k.shape[3])
        for name, t in (("k_new", k_new), ("v_new", v_new)):
            t = as_real_array(name, t, 4)
            if t.ndim != 4 or t.shape[:2] + t.shape[3:] != want[:2] + want[3:]:
                raise ValueError(
                    f"{name} must be (B, H_kv, n, d) = "
                    f"({want[0]}, {want[1]}, n, {want[3]}), got {t.shape}"
                )
        n = np.shape(k_new)[2]
        if np.shape(v_new)[2] != n:
            raise ValueError(
                f"k_new and v_new must hold as many tokens: "
                f"{np.shape(k_new)} vs {np.shape(v_new)}"
            )
        if self.length + n > self.k.shape[2]:
            raise ValueError(
                f"the cache holds max_len={self.k.shape[2]} tokens; "
                f"{self.length} + {n} do not fit"
            )
        self.k[:, :, self.length : self.length + n] = k_new
        self.v[:, :, self.length : self.length + n] = v_new
        self.length += n

    def attend(self, q, scale: float | None = None):
        """The new queries ``q (B, H_q, N_q, d)`` (the last N_q cached positions)
        against the cache, causal among themselves: returns (o, lse)."""
        q = as_real_array("q", q, 4)
        group = kv_group(q.shape[1], self.k.shape[1])
        if q.shape[2] > self.length:
            raise ValueError(
                f"q holds {q.shape[2]} new tokens but the cache only "
                f"{self.length}; append their keys first"
            )
        k = repeat_kv(self.k[:, :, : self.length], group)  # (B, H_q, L, d)
        v = repeat_kv(self.v[:, :, : self.length], group)
        return partial_attention(q, k, v, scale=scale, causal=True)


def generate(
    q, k, v, n_prefill: int, tokens_per_step: int = 1, scale: float | None = None
):
    """Prefill the first ``n_prefill`` tokens (causal attention over them, their K and
    V written to the cache), then decode the rest ``tokens_per_step`` at a time (1:
    ordinary decoding; 2..16: speculative decoding's verification step), each step
    appending its keys and attending to the whole cache.

    q (B, H_q, N, d), k, v (B, H_kv, N, d) are the projections of the whole sequence, as
    if produced one step at a time. Returns o (B, H_q, N, d): equal to causal attention
    over all N tokens.
    """
    q, k, v = (as_real_array(n, t, 4) for n, t in (("q", q), ("k", k), ("v", v)))
    n = q.shape[2]
    n_prefill = check_int("n_prefill", n_prefill, 1)
    step = check_int("tokens_per_step", tokens_per_step, 1)
    if n_prefill > n or k.shape[2] != n or v.shape[2] != n:
        raise ValueError(
            f"n_prefill must be <= N and k, v must hold N tokens: "
            f"n_prefill={n_prefill}, q {q.shape}, k {k.shape}, v "
            f"{v.shape}"
        )
    cache = KVCache(k.shape[0], k.shape[1], n, k.shape[3])
    out = np.empty(q.shape[:3] + (v.shape[3],))
    for a in [0, *range(n_prefill, n, step)]:
        b = n_prefill if a == 0 else min(a + step, n)
        cache.append(k[:, :, a:b], v[:, :, a:b])
        out[:, :, a:b] = cache.attend(q[:, :, a:b], scale=scale)[0]
    return out


# ---------------------------------------------------------------------------------
# The paged cache: a pool of physical pages, a block table per sequence
# ---------------------------------------------------------------------------------


class PageAllocator:
    """Physical pages 0 .. num_pages-1, handed out from a free list; ``alloc`` and
    ``free`` cost O(1) a page (a set beside the list answers "is it free?")."""

    def __init__(self, num_pages: int):
        self.num_pages = check_int("num_pages", num_pages, 1)
        self.free_list = list(range(self.num_pages - 1, -1, -1))  # pop() gives 0 first
        self._free = set(self.free_list)

    @property
    def num_free(self) -> int:
        return len(self.free_list)

    def alloc(self) -> int:
        if not self.free_list:
            raise MemoryError(f"all {self.num_pages} pages are in use")
        page = self.free_list.pop()
        self._free.discard(page)
        return page

    def free(self, pages) -> None:
        """Give ``pages`` (an iterable of allocated page numbers, e.g. a sequence's
        block table) back to the free list; nothing changes if one of them is not an
        allocated page of this pool (ValueError)."""
        if isinstance(pages, (str, bytes)) or not hasattr(pages, "__iter__"):
            raise TypeError(
                f"pages must be an iterable of page numbers (e.g. a block table), "
                f"got {type(pages).__name__} {pages!r}"
            )
        pages = [check_int("pages", p, 0) for p in pages]
        seen = set()
        for p in pages:
            if p >= self.num_pages or p in self._free or p in seen:
                raise ValueError(
                    f"pages: page {p} is not an allocated page of this pool"
                )
            seen.add(p)
        self.free_list.extend(pages)
        self._free.update(pages)


class PagedKVCache:
    """K and V pages ``(num_pages, page_size, H_kv, d)`` shared by every sequence;
    sequence b's logical page i lives at physical page ``tables[b][i]``."""

    def __init__(self, num_pages: int, page_size: int, n_heads_kv: int, d: int):
        self.page_size = check_int("page_size", page_size, 1)
        self.pool = PageAllocator(num_pages)
        shape = (
            num_pages,
            self.page_size,
            check_int("n_heads_kv", n_heads_kv, 1),
            check_int("d", d, 1),
        )
        self.k = np.zeros(shape)  # (num_pages, page_size, H_kv, d)
        self.v = np.zeros(shape)
        self.tables: list[list[int]] = []
        self.lengths: list[int] = []

    def add_sequence(self) -> int:
        self.tables.append([])
        self.lengths.append(0)
        return len(self.tables) - 1

    def _seq(self, seq) -> int:
        seq = check_int("seq", seq, 0)
        if seq >= len(self.tables):
            raise ValueError(f"seq must be one of 0..{len(self.tables) - 1}, got {seq}")
        return seq

    def append(self, seq: int, k_new, v_new) -> None:
        """Write ``k_new, v_new (n, H_kv, d)`` after sequence ``seq``'s tokens,
        taking a new page from the free list whenever the last one is full."""
        seq = self._seq(seq)
        k_new = as_real_array("k_new", k_new, 3)
        v_new = as_real_array("v_new", v_new, 3)
        if k_new.shape != v_new.shape or k_new.shape[1:] != self.k.shape[2:]:
            raise ValueError(
                f"k_new and v_new must be (n, H_kv, d) with (H_kv, d) = "
                f"{self.k.shape[2:]}, got {k_new.shape}, {v_new.shape}"
            )
        for t in range(k_new.shape[0]):
            pos = self.lengths[seq]
            if pos % self.page_size == 0:
                self.tables[seq].append(self.pool.alloc())
            page = self.tables[seq][pos // self.page_size]
            self.k[page, pos % self.page_size] = k_new[t]
            self.v[page, pos % self.page_size] = v_new[t]
            self.lengths[seq] = pos + 1

    def release(self, seq: int) -> None:
        """The sequence finished: its pages go back to the free list."""
        seq = self._seq(seq)
        self.pool.free(self.tables[seq])
        self.tables[seq], self.lengths[seq] = [], 0

    def block_table(self, max_pages: int | None = None) -> np.ndarray:
        """The kernel's block table (B, max_pages) int32; unused entries are 0 (never
        read: a kernel reads the first ceil(length / page_size) entries)."""
        need = max((len(t) for t in self.tables), default=0)
        max_pages = need if max_pages is None else check_int("max_pages", max_pages, 1)
        if max_pages < need:
            raise ValueError(f"max_pages={max_pages} < {need}, the longest table")
        out = np.zeros((len(self.tables), max_pages), dtype=np.int32)
        for b, t in enumerate(self.tables):
            out[b, : len(t)] = t
        return out

    def gather(self, seq: int):
        """Sequence ``seq``'s cache as contiguous ``k, v (length, H_kv, d)``."""
        seq = self._seq(seq)
        n = self.lengths[seq]
        pages = self.tables[seq]
        k = self.k[pages].reshape(-1, *self.k.shape[2:])[:n]  # (length, H_kv, d)
        v = self.v[pages].reshape(-1, *self.v.shape[2:])[:n]
        return k, v


# ---------------------------------------------------------------------------------
# A batch of requests: memory reserved and wasted, contiguous vs paged
# ---------------------------------------------------------------------------------


def request_lengths(rng, batch: int, max_len: int, min_len: int = 1) -> np.ndarray:
    """``batch`` final lengths drawn uniformly from min_len..max_len (a stand-in for a
    server's mix of short and long requests)."""
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy Generator, got {type(rng).__name__}")
    batch, max_len = check_int("batch", batch, 1), check_int("max_len", max_len, 1)
    min_len = check_int("min_len", min_len, 1)
    if min_len > max_len:
        raise ValueError(f"min_len={min_len} > max_len={max_len}")
    return rng.integers(min_len, max_len + 1, size=batch)


def _lengths(lengths) -> np.ndarray:
    a = _int_array("lengths", lengths, 1)
    if a.size and a.min() < 0:
        raise ValueError(f"lengths must be >= 0, got {a.tolist()}")
    return a


def contiguous_waste(lengths, max_len: int) -> dict:
    """Token slots of a cache pre-allocated to ``max_len`` per sequence:
    {"reserved", "used", "wasted"} (wasted = reserved - used)."""
    a, max_len = _lengths(lengths), check_int("max_len", max_len, 1)
    if a.size and a.max() > max_len:
        raise ValueError(f"lengths must be <= max_len={max_len}, got {a.max()}")
    reserved, used = a.size * max_len, int(a.sum())
    return {"reserved": reserved, "used": used, "wasted": reserved - used}


def paged_waste(lengths, page_size: int) -> dict:
    """Token slots of a paged cache: each sequence holds ceil(length / page_size) pages,
    so only its last page is partly empty (internal fragmentation, < page_size slots
    per sequence). {"reserved", "used", "wasted", "pages"}."""
    a, p = _lengths(lengths), check_int("page_size", page_size, 1)
    pages = int((-(-a // p)).sum())
    used = int(a.sum())
    return {
        "reserved": pages * p,
        "used": used,
        "wasted": pages * p - used,
        "pages": pages,
    }


def block_table_bytes(
    lengths, page_size: int, index_bytes: int = 4, readers: int = 1
) -> int:
    """Bytes of block table one decode step reads: each of ``readers`` programs per
    sequence (e.g. KV heads x splits, with no L2 to share them) reads the
    ceil(length / page_size) entries of its sequence."""
    pages = paged_waste(lengths, page_size)["pages"]
    return (
        pages
        * check_int("index_bytes", index_bytes, 1)
        * check_int("readers", readers, 1)
    )
