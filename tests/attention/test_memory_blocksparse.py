"""attention.memory.blocksparse: the simulator over a block mask equals the closed
forms of window, document, prefix and causal masks (ragged blocks, Br != Bc, d_v != d);
the counts are the model's (Q once, K/V per visited tile, O/L once, 2 (d + d_v) FLOPs
per score, the mask in partial tiles only); the size guard names the closed forms."""

from __future__ import annotations

import numpy as np
import pytest

from attention import masks as M
from attention.memory import blocksparse as bs

CASES = [
    ("causal", None),
    ("window", 1),
    ("window", 37),
    ("window", 128),
    ("document", 50),
    ("document", 64),
    ("prefix", 1),
    ("prefix", 70),
]


@pytest.mark.parametrize("kind,value", CASES)
def test_simulator_equals_closed_form(kind, value):
    rng = np.random.default_rng(abs(hash((kind, value))) % 2**32)
    shapes = [(1, 16, 16), (257, 16, 16), (300, 64, 16), (129, 7, 5), (256, 32, 64)]
    shapes += [tuple(int(x) for x in rng.integers(1, 400, 3)) for _ in range(3)]
    for N, Br, Bc in shapes:
        bm = M.block_mask(bs.mask_for(kind, N, value), N, block_size=(Br, Bc))
        sim = bs.simulate_block_sparse(bm, 8, d_v=4)
        closed = bs.closed_work(kind, N, 8, value, Br, Bc, 4)
        assert sim == closed, (N, Br, Bc)
        assert (sim.full, sim.partial, sim.empty) == (bm.full, bm.partial, bm.empty)
        assert closed.sparsity() == pytest.approx(bm.sparsity())


def test_counts_are_the_model():
    """A window of 2 tiles at N = 4 tiles of 16: by hand."""
    bm = M.block_mask(M.sliding_window(32), 64, block_size=16)
    # row blocks visit 1, 2, 3, 3 tiles: the diagonal (partial), one full, the far edge
    assert (bm.visited, bm.full, bm.partial) == (9, 3, 6)
    w = bs.simulate_block_sparse(bm, d=8, d_v=4, keep_trace=True)
    t = w.traffic
    assert t.per_tensor == {
        "Q": (64 * 8, 0),
        "K": (9 * 16 * 8, 0),
        "V": (9 * 16 * 4, 0),
        "O": (0, 64 * 4),
        "L": (0, 64),
    }
    assert w.scores == 9 * 16 * 16 and w.mask_evals == 6 * 16 * 16
    assert w.flops == 2 * (8 + 4) * w.scores
    assert w.bytes(2) == 2 * t.total and t.events == len(t.trace) == 3 * 4 + 3 * 9
    assert [x.tensor for x in t.trace[:5]] == ["Q", "K", "V", "S", "O"]


def test_window_leading_form_and_large_n():
    """B | window, B | N: T = N/B row blocks, row block i visits min(i, w/B) + 1 tiles,
    two partial once i >= w/B (one before); the closed form at 128k runs at once."""
    N, B, w, d = 131072, 128, 4096, 128
    T, k = N // B, w // B
    tiles = sum(min(i, k) + 1 for i in range(T))
    work = bs.window_work(N, d, w, B, B)
    assert work.visited == tiles and work.partial == 2 * T - k
    assert work.traffic.per_tensor["K"] == (tiles * B * d, 0)
    causal = bs.causal_work(N, d, B, B)
    assert causal.visited == T * (T + 1) // 2 and causal.partial == T
    assert 0.06 < work.flops / causal.flops < 0.07


def test_size_guard_and_arguments():
    bm = M.block_mask(M.causal_mask, 1024, block_size=16)
    with pytest.raises(ValueError, match="window_work"):
        bs.simulate_block_sparse(bm, 8, max_events=100)
    assert bs.simulate_block_sparse(bm, 8, max_events=None).visited == 64 * 65 // 2
    with pytest.raises(TypeError, match="^block_mask"):
        bs.simulate_block_sparse(np.ones((2, 2)), 8)
    with pytest.raises(ValueError, match="^window"):
        bs.window_work(64, 8, 0)
    with pytest.raises(TypeError, match="^doc_len"):
        bs.document_work(64, 8, 2.0)
    with pytest.raises(ValueError, match="^kind"):
        bs.closed_work("diagonal", 64, 8)
    with pytest.raises(TypeError, match="^causal"):
        bs.document_work(64, 8, 16, causal=1)
    # non-causal documents: block-diagonal, full tiles where documents align
    w = bs.document_work(64, 8, 32, 16, 16, causal=False)
    assert (w.full, w.partial) == (8, 0)
    ids = np.arange(64) // 32
    bm = M.block_mask(M.document_mask(ids), 64, block_size=16)
    assert bs.simulate_block_sparse(bm, 8) == w


@pytest.mark.parametrize("kind,value", CASES)
def test_closed_block_mask_equals_the_evaluated_one(kind, value):
    for N, Br, Bc in ((1, 16, 16), (257, 16, 32), (300, 7, 5), (512, 64, 64)):
        want = M.block_mask(bs.mask_for(kind, N, value), N, block_size=(Br, Bc))
        got = bs.closed_block_mask(kind, N, value, Br, Bc)
        np.testing.assert_array_equal(got.kinds, want.kinds)
    big = bs.closed_block_mask(kind, 2**17, value or 4096, 128, 128)  # 128k: at once
    assert big.visited == bs.closed_work(kind, 2**17, 64, value or 4096).visited
