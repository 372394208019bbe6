"""attention.pretrained.decoder_heads: the scores on hand-built maps (exact values),
the repeated sequences, the two copies' losses, and one small run of SmolLM2."""

from __future__ import annotations

import numpy as np
import pytest

from attention.pretrained import decoder_heads as dh


def _one_hot_maps(n, key_of_row):
    """(1, 1, n, n): row i puts all its weight on key_of_row(i)."""
    p = np.zeros((1, 1, n, n))
    for i in range(n):
        p[0, 0, i, key_of_row(i)] = 1.0
    return p


def test_repeated_sequences_repeat_uniform_draws():
    s = dh.repeated_sequences(4, 6, seed=3, low=17, high=40)
    assert s.shape == (4, 12) and s.dtype == np.int64
    np.testing.assert_array_equal(s[:, :6], s[:, 6:])
    want = np.random.default_rng(3).integers(17, 40, size=(4, 6))
    np.testing.assert_array_equal(s[:, :6], want)
    b = dh.repeated_sequences(2, 5, seed=0, low=0, high=9, bos=1)
    assert b.shape == (2, 11) and (b[:, 0] == 1).all()
    np.testing.assert_array_equal(b[:, 1:6], b[:, 6:])
    with pytest.raises(ValueError, match="low"):
        dh.repeated_sequences(2, 5, seed=0, low=9, high=9)


def test_scores_of_hand_built_maps():
    n, length = 8, 4
    # an induction head: the second copy's query i looks at i - length + 1
    ind = _one_hot_maps(n, lambda i: i - length + 1 if i >= length else 0)
    prev = _one_hot_maps(n, lambda i: max(i - 1, 0))
    sink = _one_hot_maps(n, lambda i: 0)
    maps = np.concatenate([ind, prev, sink], axis=1)  # (1, 3, n, n)
    np.testing.assert_array_equal(dh.induction_scores(maps, length), [[1, 0, 0]])
    # previous: rows 1..7; of the induction map only row 1 (on key 0) is previous
    np.testing.assert_array_equal(dh.previous_token_scores(maps), [[1 / 7, 1, 1 / 7]])
    # sink: rows 1..7 on key 0; the induction map's rows 1, 2, 3 sit there
    np.testing.assert_array_equal(dh.sink_scores(maps), [[3 / 7, 1 / 7, 1]])


def test_uniform_causal_map_and_a_leading_bos():
    n, length = 7, 3  # a BOS, then two copies of 3
    p = np.tril(np.ones((n, n)))
    p /= p.sum(-1, keepdims=True)  # row i: 1 / (i + 1) on each visible key
    maps = p[None, None]
    # second-copy queries 4, 5, 6 on keys 2, 3, 4
    np.testing.assert_allclose(
        dh.induction_scores(maps, length), [[(1 / 5 + 1 / 6 + 1 / 7) / 3]]
    )
    want = np.mean([1 / (i + 1) for i in range(1, n)])
    np.testing.assert_allclose(dh.previous_token_scores(maps), [[want]])
    np.testing.assert_allclose(dh.sink_scores(maps), [[want]])
    with pytest.raises(ValueError, match="two copies"):
        dh.induction_scores(maps, 4)
    with pytest.raises(ValueError, match="layers, heads"):
        dh.sink_scores(p)


def test_copy_losses_split_the_copies():
    length = 4
    loss = np.arange(7.0)  # 8 tokens: entry t is the loss of token t + 1
    first, second = dh.copy_losses(loss, length)
    np.testing.assert_array_equal(first, [0, 1, 2])  # tokens 1, 2, 3
    np.testing.assert_array_equal(second, [4, 5, 6])  # tokens 5, 6, 7
    first, second = dh.copy_losses(np.arange(8.0)[None], length)  # after a BOS
    np.testing.assert_array_equal(first, [[1, 2, 3]])
    np.testing.assert_array_equal(second, [[5, 6, 7]])


@pytest.mark.slow
@pytest.mark.xdist_group("smollm2")
def test_smollm2_copies_the_second_copy():
    """Two short repeated sequences through SmolLM2: the second copy's loss far
    below the first's, an induction head, and the statistics equal to those of
    ``model.attentions`` and ``model.loss``."""
    try:
        from attention.pretrained import load_smollm2

        model = load_smollm2()
    except ModuleNotFoundError as e:
        pytest.skip(f"SmolLM2 is not installed: {e}")
    length = 12
    seqs = dh.repeated_sequences(2, length, seed=0, low=17, high=model.vocab_size)
    r = dh.measure(model, seqs, length)
    assert r["induction"].shape == (2, 30, 9) and r["loss"].shape == (2, 2 * length - 1)
    np.testing.assert_allclose(r["loss"][0], model.loss(seqs[0]), rtol=1e-5, atol=1e-4)
    maps = model.attentions(seqs[1])
    np.testing.assert_allclose(r["sink"][1], dh.sink_scores(maps), atol=1e-6)
    first, second = dh.copy_losses(r["loss"], length)
    assert second.mean() < first.mean() - 5
    assert r["induction"].mean(0).max() > 0.5
