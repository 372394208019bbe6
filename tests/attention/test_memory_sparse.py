"""attention.memory.sparse: the closed forms equal the simulator; the cost claims."""

import numpy as np
import pytest

from attention import sparse
from attention.memory import sparse as ms

RNG = np.random.default_rng(88)


@pytest.mark.parametrize(
    "n_q, n_k, bs, topk, g",
    [(50, 50, 16, 3, 2), (7, 90, 16, 2, 1), (33, 33, 1, 5, 3), (64, 64, 64, 2, 1),
     (100, 70, 16, 4, 2), (129, 129, 16, 32, 1)],
)  # fmt: skip
def test_closed_form_equals_simulator(n_q, n_k, bs, topk, g):
    q = RNG.standard_normal((2, 2 * g, n_q, 4))
    k = RNG.standard_normal((2, 2, n_k, 4))
    idx = sparse.select_blocks(q, k, bs, topk)
    sim = ms.simulate_selected(idx, n_k, bs, 4, 6, g)
    closed = ms.selected_work(n_q, n_k, bs, topk, 4, 6, g, batch=2, heads=2)
    assert sim.counts() == closed.counts() and sim.flops == closed.flops
    # the scores counted are the visible-or-not keys of the chosen blocks, per head
    keys = sum(
        min(bs, n_k - c * bs) for c in idx.ravel() if c >= 0
    )  # fmt: skip
    assert sim.scores == g * keys


def test_dsa_selection_matches_closed_form():
    s = sparse.lightning_indexer(
        RNG.standard_normal((1, 40, 2, 4)),
        RNG.standard_normal((1, 40, 4)),
        RNG.random((1, 40, 2)),
    )
    idx = sparse.topk_tokens(s, 8)
    sim = ms.simulate_selected(idx, 40, 1, 8, 8, 4)
    assert sim.counts() == ms.selected_work(40, 40, 1, 8, 8, 8, 4).counts()


def test_cost_per_query_is_constant_and_selection_grows():
    a = ms.selected_work(1 << 16, 1 << 16, 64, 16, 128).flops
    b = ms.selected_work(1 << 17, 1 << 17, 64, 16, 128).flops
    assert 2.0 <= b / a < 2.01  # linear in N (the first rows choose fewer blocks)
    d1, d2 = ms.dense_causal_flops(1 << 16, 128), ms.dense_causal_flops(1 << 17, 128)
    assert 3.99 < d2 / d1 <= 4.0
    g1 = ms.gate_cost(1 << 16, 1 << 16, 64, 16, 128)["flops"]
    g2 = ms.gate_cost(1 << 17, 1 << 17, 64, 16, 128)["flops"]
    assert 3.9 < g2 / g1 < 4.0  # O(N^2 / block)
    i1 = ms.indexer_cost(1 << 12, 1 << 12, 2048)["flops"]
    assert i1 == (2 * 128 + 2) * 64 * (4096 * 4097 // 2)


def test_indexer_crossover_is_where_the_curves_meet():
    n = ms.indexer_crossover()
    D = ms.DSA

    def gap(m):
        att = ms.selected_work(m, m, 1, D["topk"], D["d"], D["d_v"], D["heads"]).flops
        return ms.indexer_cost(m, m, D["topk"])["flops"] - att

    assert gap(n) >= 0 > gap(n - 1)
    assert ms.indexer_crossover(n_max=n - 1) is None


def test_guards_and_errors():
    idx = np.zeros((1, 1, 4, 1), np.int32)
    with pytest.raises(ValueError, match="max_events"):
        ms.simulate_selected(idx, 16, 16, 4, max_events=5)
    with pytest.raises(ValueError, match="kv_indices"):
        ms.simulate_selected(idx + 3, 16, 16, 4)
    with pytest.raises(ValueError, match="block_size"):
        ms.selected_work(8, 8, 0, 1, 4)
    with pytest.raises(TypeError, match="topk"):
        ms.selected_work(8, 8, 4, 1.5, 4)


def test_selection_costs_count_the_eligible_pairs():
    n_q, n_k, bs, d, g = 37, 50, 16, 8, 4
    pairs = sum(
        1 for i in range(n_q) for c in range(4) if c * bs <= i + n_k - n_q
    )  # fmt: skip
    gate = ms.gate_cost(n_q, n_k, bs, 3, d, g, Br=16)
    assert gate["flops"] == 2 * d * pairs + (g - 1) * d * n_q + n_k * d
    # per query tile of 16 rows, the pooled keys its last row may see
    tiles = [min(15 + 16 * t, n_q - 1) + n_k - n_q for t in range(3)]
    assert gate["traffic"].per_tensor["K_pooled"] == (
        sum(p // bs + 1 for p in tiles) * d, 4 * d
    )  # fmt: skip
    assert ms.gate_cost(n_q, n_k, bs, 3, d, g, causal=False)["flops"] == (
        2 * d * n_q * 4 + (g - 1) * d * n_q + n_k * d
    )  # fmt: skip
    idx = ms.indexer_cost(n_q, n_k, 5, 3, 4)
    visible = sum(i + n_k - n_q + 1 for i in range(n_q))
    assert idx["flops"] == (2 * 4 + 2) * 3 * visible
    assert idx["traffic"].per_tensor["idx"] == (0, n_q * 5)
