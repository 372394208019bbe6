"""The cost of selected attention (chapter 8): HBM traffic and FLOPs of an attention
that reads only the key blocks ``kv_indices`` names (``attention.sparse``), simulated
and in closed form, and the selection's own cost (MoBA's gate, DSA's lightning indexer).

The attention's model (NSA's group-centric kernel, ``kernels.sparse``'s plan):

    for each batch b, KV head g, query token i:
      load the G = H_q / H_kv query rows of g's group at i (G d), kept on chip
      for each chosen block c >= 0: load its keys and values (len_c d, len_c d_v),
        compute the G x len_c scores whole (causal masks inside), update the softmax
      write O (G d_v) and L (G)

len_c is the block's length (the last block may be ragged). FLOPs: 2 (d + d_v) per score
(S = Q K^T, O = P V). So per query the work is fixed by the budget, not by N: the
attention is linear in N, where the dense causal attention is quadratic.

``simulate_selected(kv_indices, n_k, block_size, d, ...)`` walks the rows with
``HBMSim``; ``selected_work(n_q, n_k, block_size, topk, d, ...)`` gives the same counts
from a formula for what ``select_blocks`` (or ``topk_tokens``, block_size = 1) picks
under causal attention: row i at position p_i chooses min(topk, p_i // bs + 1) blocks,
its own (ragged only if it is the last) and full earlier ones.

The selection, counted in closed form (ESTIMATES of a model, no kernel timed):

``gate_cost``     MoBA's gate shared by a GQA group (``select_blocks``): mean-pool K
                  (read N_k d, write the n_b pooled keys), sum the group's G query
                  rows, score every eligible block: 2 d FLOPs per (query, block),
                  O(N^2 / block); the pooled keys are re-read per query tile.
``indexer_cost``  DSA's indexer: H_I heads of width d_I score every visible key,
                  (2 d_I + 2) H_I FLOPs per (query, key) (the dot, the weight and the
                  sum), O(N^2) at its small width; k_I re-read per query tile.

The top-k itself (comparisons) is not counted. ``indexer_crossover`` finds the context
length from which the indexer's FLOPs exceed the selected attention's.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..checks import as_block_indices, check_bool
from .sim import MAX_EVENTS, HBMSim, Traffic, cdiv, check_count, traffic

__all__ = [
    "DSA",
    "SelectedWork",
    "dense_causal_flops",
    "gate_cost",
    "indexer_cost",
    "indexer_crossover",
    "selected_work",
    "simulate_selected",
]

#: DeepSeek-V3.2-Exp's sparse attention as its config states it: 128 query heads
#: reading one latent KV head (MLA in MQA form: keys of 576 = 512 + 64 RoPE, values of
#: 512), top 2,048 tokens, an indexer of 64 heads of 128.
DSA = dict(heads=128, d=576, d_v=512, topk=2048, heads_index=64, d_index=128)


@dataclasses.dataclass(frozen=True)
class SelectedWork:
    """Traffic (elements) and the scores computed by a selected attention."""

    traffic: Traffic
    scores: int  # (query head, key) pairs computed
    d: int
    d_v: int

    @property
    def flops(self) -> int:
        return 2 * (self.d + self.d_v) * self.scores

    def counts(self) -> tuple:
        t = self.traffic
        return (t.reads, t.writes, t.per_tensor, t.events, self.scores)


def _dims(d, d_v, group, batch, heads):
    d = check_count("d", d)
    d_v = d if d_v is None else check_count("d_v", d_v)
    return d, d_v, check_count("group", group), check_count("batch", batch), heads


def simulate_selected(
    kv_indices, n_k, block_size, d, d_v=None, group=1, max_events=MAX_EVENTS
) -> SelectedWork:
    """Walk every (b, g, i) row of ``kv_indices`` (B, H_kv, N_q, S) as the kernel does
    and count each load and store. The indices are the kernel's: integers in [-1,
    n_blocks), distinct within a row (``attention.checks.as_block_indices``). Refuses
    more than ``max_events`` events."""
    n_k, bs = check_count("n_k", n_k), check_count("block_size", block_size)
    d, d_v, g, _, _ = _dims(d, d_v, group, 1, 1)
    n_blocks = cdiv(n_k, bs)
    idx = as_block_indices("kv_indices", kv_indices, n_blocks)
    if idx.ndim != 4:
        raise ValueError(f"kv_indices must be (B, H_kv, N_q, S), got {idx.shape}")
    events = 3 * int(np.prod(idx.shape[:3])) + 2 * int((idx >= 0).sum())
    if max_events is not None and events > check_count("max_events", max_events):
        raise ValueError(
            f"simulate_selected would record {events:,} events, more than "
            f"max_events = {max_events:,}; selected_work gives the counts at once"
        )
    sim = HBMSim(None, keep_trace=False)
    scores = 0
    for row in np.ndindex(idx.shape[:3]):
        sim.load("Q", g * d, row)  # the group's query rows stay on chip
        for c in idx[row]:
            if c < 0:
                continue  # padding: skipped, nothing loaded
            n = min(bs, n_k - int(c) * bs)
            sim.load("K", n * d, (*row, int(c)))
            sim.load("V", n * d_v, (*row, int(c)))
            scores += g * n
        sim.store("O", g * d_v, row)
        sim.store("L", g, row)
    t = sim.result()
    t = Traffic(t.reads, t.writes, t.per_tensor, [], None, None, t.events)
    return SelectedWork(t, scores, d, d_v)


def _rows_per_block(n_q, n_k, bs):
    """Query rows whose bottom-right position falls in each key block, (n_b,)."""
    n_b = cdiv(n_k, bs)
    lo = np.arange(n_b, dtype=np.int64) * bs  # first position of each block
    hi = np.minimum(lo + bs, n_k)  # one past the last
    first = n_k - n_q  # position of query row 0
    return np.clip(hi, first, None) - np.clip(lo, first, None), hi - lo


def selected_work(
    n_q, n_k, block_size, topk, d, d_v=None, group=1, batch=1, heads=1
) -> SelectedWork:
    """``simulate_selected``'s counts for ``select_blocks(..., causal=True)`` (or
    ``topk_tokens`` with block_size = 1) over ``batch`` x ``heads`` KV heads, from a
    formula: O(N / block) work, any length."""
    n_q, n_k = check_count("n_q", n_q), check_count("n_k", n_k)
    bs, topk = check_count("block_size", block_size), check_count("topk", topk)
    heads = check_count("heads", heads)
    d, d_v, g, batch, heads = _dims(d, d_v, group, batch, heads)
    rows, length = _rows_per_block(n_q, n_k, bs)  # rows whose own block is c
    c = np.arange(rows.size, dtype=np.int64)
    chosen = np.minimum(topk, c + 1)  # own block + earlier full ones
    keys_per_row = (chosen - 1) * bs + length
    keys = int((rows * keys_per_row).sum())
    blocks_read = int((rows * chosen).sum())
    rep = batch * heads
    per = {
        "Q": (rep * n_q * g * d, 0),
        "K": (rep * keys * d, 0),
        "V": (rep * keys * d_v, 0),
        "O": (0, rep * n_q * g * d_v),
        "L": (0, rep * n_q * g),
    }
    t = traffic(per, events=rep * (3 * n_q + 2 * blocks_read))
    return SelectedWork(t, rep * g * keys, d, d_v)


def _visible(n_q, n_k, Br, width, causal):
    """Per query tile of ``Br`` rows: rows, and the key units (blocks of ``width``
    keys) visible to its last row (all of them without causal)."""
    t_r = cdiv(n_q, Br)
    last = np.minimum((np.arange(t_r) + 1) * Br, n_q) - 1 + (n_k - n_q)
    n_u = cdiv(n_k, width)
    units = np.clip(last // width + 1, 0, n_u) if causal else np.full(t_r, n_u)
    return t_r, units


def _pairs(n_q, n_k, width, causal):
    """(query, unit) pairs scored: every query with each unit starting at or before
    its position (causal), or every unit."""
    n_u = cdiv(n_k, width)
    if not causal:
        return n_q * n_u
    pos = np.arange(n_q, dtype=np.int64) + (n_k - n_q)
    return int(np.clip(pos // width + 1, 0, n_u).sum())


def gate_cost(n_q, n_k, block_size, topk, d, group=1, causal=True, Br=64) -> dict:
    """MoBA's gate per KV head: {"flops", "traffic"} (elements). Pools K, sums the
    ``group`` query heads' rows, scores every eligible block (2 d FLOPs each)."""
    n_q, n_k = check_count("n_q", n_q), check_count("n_k", n_k)
    bs, topk, d = (check_count(*a) for a in (("block_size", block_size),
                                             ("topk", topk), ("d", d)))  # fmt: skip
    g, Br = check_count("group", group), check_count("Br", Br)
    causal = check_bool("causal", causal)
    n_b = cdiv(n_k, bs)
    _, units = _visible(n_q, n_k, Br, bs, causal)
    # the group's queries summed first ((G - 1) d adds per query), one 2 d dot per
    # (query, eligible block), and the pooling sums (d per key)
    flops = 2 * d * _pairs(n_q, n_k, bs, causal) + (g - 1) * d * n_q + n_k * d
    t = traffic(
        {
            "K": (n_k * d, 0),
            "K_pooled": (int(units.sum()) * d, n_b * d),
            "Q": (n_q * g * d, 0),
            "idx": (0, n_q * topk),
        }
    )
    return {"flops": int(flops), "traffic": t}


def indexer_cost(
    n_q, n_k, topk, heads_index=64, d_index=128, causal=True, Br=64
) -> dict:
    """DSA's lightning indexer (one for all heads): {"flops", "traffic"} (elements;
    fp8 in DeepSeek-V3.2, so 1 byte each). (2 d_I + 2) H_I FLOPs per visible pair."""
    n_q, n_k = check_count("n_q", n_q), check_count("n_k", n_k)
    topk, h, w = (check_count(*a) for a in (("topk", topk), ("heads_index",
                  heads_index), ("d_index", d_index)))  # fmt: skip
    Br = check_count("Br", Br)
    causal = check_bool("causal", causal)
    _, units = _visible(n_q, n_k, Br, 1, causal)
    flops = (2 * w + 2) * h * _pairs(n_q, n_k, 1, causal)
    t = traffic(
        {
            "q_index": (n_q * h * w, 0),
            "weights": (n_q * h, 0),
            "k_index": (int(units.sum()) * w, 0),
            "idx": (0, n_q * topk),
        }
    )
    return {"flops": int(flops), "traffic": t}


def dense_causal_flops(n, d, d_v=None, heads=1) -> int:
    """Dense causal attention's FLOPs over ``heads`` query heads (visible pairs only,
    as a kernel that skips the hidden tiles): 2 (d + d_v) n (n + 1) / 2."""
    n, d = check_count("n", n), check_count("d", d)
    d_v = d if d_v is None else check_count("d_v", d_v)
    heads = check_count("heads", heads)
    return 2 * (d + d_v) * heads * (n * (n + 1) // 2)


def indexer_crossover(
    topk=DSA["topk"],
    d=DSA["d"],
    d_v=DSA["d_v"],
    heads=DSA["heads"],
    heads_index=DSA["heads_index"],
    d_index=DSA["d_index"],
    n_max=1 << 20,
) -> int:
    """The shortest causal prefill length N at which the indexer's FLOPs reach those
    of the selected attention it feeds (one KV head shared by ``heads`` query heads,
    block_size = 1), found by bisection on the closed forms; None if not by n_max."""

    def gap(n):
        att = selected_work(n, n, 1, topk, d, d_v, heads).flops
        return indexer_cost(n, n, topk, heads_index, d_index)["flops"] - att

    lo, hi = 1, check_count("n_max", n_max)
    if gap(hi) < 0:
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if gap(mid) < 0 else (lo, mid)
    return lo
