"""attention.masks: the ready-made mask and score mods against their definitions, block
masks against the dense matrix, and masked_attention against an fp64 reference written
here row by row (Python loops over visible keys, math.exp), with the edge rules: a row
with no visible key gives 0 and -inf (with a sink: the sink), NaN stays in its row."""

from __future__ import annotations

import math

import numpy as np
import pytest

from attention import masks as M


def reference(q, k, v, visible, score=None, sinks=None, scale=None):
    """Row by row in Python floats: the visible keys' softmax, the sink in the sum."""
    B, H, N_q, d = q.shape
    N_k, d_v = k.shape[2], v.shape[3]
    group = H // k.shape[1]
    scale = 1 / math.sqrt(d) if scale is None else scale
    o = np.zeros((B, H, N_q, d_v))
    lse = np.zeros((B, H, N_q))
    for b in range(B):
        for h in range(H):
            for i in range(N_q):
                js = [j for j in range(N_k) if visible[b, h, i, j]]
                s = {}
                for j in js:
                    x = float(np.dot(q[b, h, i], k[b, h // group, j])) * scale
                    s[j] = score(x, b, h, i, j) if score else x
                terms = list(s.values()) + (
                    [float(sinks[h])] if sinks is not None else []
                )
                if not terms:
                    o[b, h, i], lse[b, h, i] = 0.0, -math.inf
                    continue
                mx = max(terms)
                tot = sum(math.exp(t - mx) for t in terms)
                lse[b, h, i] = mx + math.log(tot)
                for j, x in s.items():
                    o[b, h, i] += math.exp(x - lse[b, h, i]) * v[b, h // group, j]
    return o, lse


def _qkv(rng, B=2, H=2, H_kv=2, N_q=13, N_k=13, d=8, d_v=8):
    return (
        rng.standard_normal((B, H, N_q, d)),
        rng.standard_normal((B, H_kv, N_k, d)),
        rng.standard_normal((B, H_kv, N_k, d_v)),
    )


def _visible(mask, B, H, N_q, N_k):
    return np.array(
        [
            [
                [[bool(mask(b, h, i, j)) for j in range(N_k)] for i in range(N_q)]
                for h in range(H)
            ]
            for b in range(B)
        ]
    )


def test_ready_made_masks_are_their_definitions():
    ids = np.array([0, 0, 0, 1, 1, 2, 2, 2, 2, 3])
    for i in range(10):
        for j in range(10):
            assert M.causal_mask(0, 0, i, j) == (i >= j)
            assert M.sliding_window(3)(0, 0, i, j) == (0 <= i - j < 3)
            assert M.document_mask(ids)(0, 0, i, j) == (ids[i] == ids[j])
            assert M.prefix_lm(4)(0, 0, i, j) == (j < 4 or i >= j)
            both = M.and_masks(M.causal_mask, M.document_mask(ids))
            assert both(0, 0, i, j) == (i >= j and ids[i] == ids[j])
            either = M.or_masks(M.sliding_window(2), M.document_mask(ids))
            assert either(0, 0, i, j) == (0 <= i - j < 2 or ids[i] == ids[j])
    assert M.mask_matrix(M.and_masks(), 3).all()
    assert not M.mask_matrix(M.or_masks(), 3).any()
    per_batch = M.document_mask(np.array([[0, 0, 1], [0, 1, 1]]))
    assert (
        M.mask_matrix(per_batch, 3, b=1)[1, 2] and not M.mask_matrix(per_batch, 3)[1, 2]
    )


def test_score_mods_are_their_definitions():
    s = np.linspace(-200, 200, 9)
    np.testing.assert_allclose(M.softcap(50.0)(s, 0, 0, 0, 0), 50 * np.tanh(s / 50))
    assert np.abs(M.softcap(50.0)(s, 0, 0, 0, 0)).max() < 50
    np.testing.assert_allclose(M.alibi_slopes(8), [2 ** (-i) for i in range(1, 9)])
    # not a power of two: the 4 slopes of 4, then slopes 1, 3 of 8 (the paper's rule)
    np.testing.assert_allclose(
        M.alibi_slopes(6), [2**-2, 2**-4, 2**-6, 2**-8, 2**-1, 2**-3]
    )
    assert M.alibi([0.5, 0.25])(1.0, 0, 1, 5, 1) == 1.0 + 0.25 * (1 - 5)
    # T5 buckets: exact near, log-spaced far, one bucket beyond max_distance
    rel = np.arange(-200, 201)
    bk = M.t5_bucket(rel)
    assert bk[rel == 0] == 0 and bk[rel == 1] == 17 and bk[rel == -1] == 1
    assert bk.min() == 0 and bk.max() == 31
    assert (bk[rel <= -128] == 15).all() and (bk[rel >= 128] == 31).all()
    assert (np.diff(bk[rel >= 0]) >= 0).all() and (np.diff(bk[rel <= 0]) <= 0).all()
    uni = M.t5_bucket(rel, bidirectional=False)
    assert (uni[rel > 0] == 0).all() and uni.max() == 31
    table = np.arange(64.0).reshape(2, 32)
    assert M.relative_position_bias(table)(0.0, 0, 1, 3, 4) == table[1, 17]


@pytest.mark.parametrize("block", [4, (3, 5), 16])
def test_block_mask_classes_tiles_from_the_dense_matrix(block):
    ids = np.repeat(np.arange(5), [7, 3, 9, 2, 9])
    Br, Bc = block if isinstance(block, tuple) else (block, block)
    for mask in (
        M.causal_mask,
        M.sliding_window(5),
        M.and_masks(M.causal_mask, M.document_mask(ids)),
        M.prefix_lm(11),
    ):
        dense = M.mask_matrix(mask, 30)
        bm = M.block_mask(mask, 30, block_size=block)
        for i in range(bm.kinds.shape[0]):
            for j in range(bm.kinds.shape[1]):
                tile = dense[i * Br : (i + 1) * Br, j * Bc : (j + 1) * Bc]
                want = M.FULL if tile.all() else M.PARTIAL if tile.any() else M.EMPTY
                assert bm.kinds[i, j] == want
        assert bm.full + bm.partial + bm.empty == bm.tiles
        assert bm.sparsity() == pytest.approx(100 * bm.empty / bm.tiles)
    # cross lengths, and a chunked evaluation (many row blocks per chunk boundary)
    bm = M.block_mask(M.causal_mask, 300, 7000, block_size=(64, 128))
    assert bm.kinds.shape == (5, 55) and bm.kinds[4, 2] == M.PARTIAL
    assert bm.kinds[0, 0] == M.PARTIAL and bm.kinds[2, 0] == M.FULL
    assert (bm.kinds[4, 3:] == M.EMPTY).all() and bm.visited == 1 + 1 + 2 + 2 + 3


@pytest.mark.parametrize("case", ["causal", "window", "doc", "prefix", "gqa", "cross"])
def test_masked_attention_against_fp64_reference(case):
    rng = np.random.default_rng(hash(case) % 2**32)
    ids = np.array([0] * 5 + [1] * 4 + [2] * 4)
    kw = {}
    shape = dict(N_q=13, N_k=13)
    mask = {
        "causal": M.causal_mask,
        "window": M.sliding_window(4),
        "doc": M.and_masks(M.causal_mask, M.document_mask(ids)),
        "prefix": M.prefix_lm(5),
        "gqa": M.or_masks(M.sliding_window(2), M.document_mask(ids)),
        "cross": M.causal_mask,
    }[case]
    if case == "gqa":
        shape.update(H=4, H_kv=2, d_v=5)
        kw["enable_gqa"] = True
    if case == "cross":
        shape.update(N_q=7, N_k=11, d=6, d_v=3)
    q, k, v = _qkv(rng, **shape)
    B, H, N_q, N_k = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    vis = _visible(mask, B, H, N_q, N_k)
    o, lse = M.masked_attention(q, k, v, mask=mask, **kw)
    ro, rl = reference(q, k, v, vis)
    # float64 sums of <= 13 terms: a few ulps of the largest term
    np.testing.assert_allclose(o, ro, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lse, rl, rtol=1e-12, atol=1e-12)


def test_score_mods_and_sinks_against_reference():
    rng = np.random.default_rng(7)
    q, k, v = _qkv(rng, N_q=9, N_k=9, d=16)
    q *= 6  # large logits, so the cap matters
    slopes = M.alibi_slopes(2)
    table = rng.standard_normal((2, 32))
    sinks = np.array([0.5, -1.0])
    vis = _visible(M.sliding_window(3), 2, 2, 9, 9)
    mods = {
        "softcap": (M.softcap(5.0), lambda x, b, h, i, j: 5 * math.tanh(x / 5)),
        "alibi": (M.alibi(slopes), lambda x, b, h, i, j: x + slopes[h] * (j - i)),
        "t5": (
            M.relative_position_bias(table),
            lambda x, b, h, i, j: x + table[h, int(M.t5_bucket(j - i))],
        ),
    }
    for mod, ref in mods.values():
        for snk in (None, sinks):
            o, lse = M.masked_attention(
                q, k, v, M.sliding_window(3), mod, sinks=snk, scale=0.3
            )
            ro, rl = reference(q, k, v, vis, ref, snk, scale=0.3)
            np.testing.assert_allclose(o, ro, rtol=1e-11, atol=1e-12)
            np.testing.assert_allclose(lse, rl, rtol=1e-11, atol=1e-12)


def test_empty_rows_and_nan_rows():
    rng = np.random.default_rng(3)
    q, k, v = _qkv(rng, B=1, H=2, N_q=6, N_k=6)
    # rows 0 and 1 see nothing: keys start at 2 (a mask of absolute positions)
    late = M.and_masks(M.causal_mask, lambda b, h, i, j: j >= 2)
    o, lse = M.masked_attention(q, k, v, late)
    assert (o[:, :, :2] == 0).all() and np.isneginf(lse[:, :, :2]).all()
    assert np.isfinite(lse[:, :, 2:]).all()
    sinks = np.array([0.25, -2.0])
    o, lse = M.masked_attention(q, k, v, late, sinks=sinks)
    assert (o[:, :, :2] == 0).all()
    np.testing.assert_array_equal(lse[0, :, 0], sinks)
    # a NaN query: its row only; a NaN key: the rows that see it; a masked NaN: nothing
    qn, kn, vn = q.copy(), k.copy(), v.copy()
    qn[0, 0, 3, 1] = np.nan
    o, lse = M.masked_attention(qn, k, v, M.causal_mask)
    assert np.isnan(o[0, 0, 3]).all() and np.isnan(lse[0, 0, 3])
    assert np.isfinite(np.delete(o[0, 0], 3, 0)).all() and np.isfinite(o[0, 1]).all()
    kn[0, 1, 4, 0] = np.nan
    o, lse = M.masked_attention(q, kn, v, M.causal_mask)
    assert np.isnan(lse[0, 1, 4:]).all() and np.isfinite(lse[0, 1, :4]).all()
    vn[0, 0, 2, 1] = np.nan
    o, _ = M.masked_attention(q, k, vn, M.causal_mask)
    assert np.isnan(o[0, 0, 2:, 1]).all() and np.isfinite(o[0, 0, :2]).all()
    assert np.isfinite(o[0, 0, :, 0]).all()
    # a NaN query in a row that sees no key is still "no key": nothing was computed
    qn = q.copy()
    qn[0, 0, 0] = np.nan
    o, lse = M.masked_attention(qn, k, v, late)
    assert (o[0, 0, 0] == 0).all() and np.isneginf(lse[0, 0, 0])


def test_arguments_are_checked_by_name():
    rng = np.random.default_rng(0)
    q, k, v = _qkv(rng, N_q=4, N_k=4)
    cases = [
        (lambda: M.sliding_window(0), ValueError, "^window"),
        (lambda: M.sliding_window(2.0), TypeError, "^window"),
        (lambda: M.prefix_lm(-1), ValueError, "^prefix_length"),
        (lambda: M.softcap(0.0), ValueError, "^cap"),
        (lambda: M.softcap(math.inf), ValueError, "^cap"),
        (lambda: M.document_mask(np.zeros((2, 2, 2), int)), ValueError, "^document"),
        (lambda: M.document_mask([0.5, 1.5]), TypeError, "^document_ids"),
        (lambda: M.alibi([]), ValueError, "^slopes"),
        (lambda: M.and_masks(M.causal_mask, 3), TypeError, r"^masks\[1\]"),
        (lambda: M.block_mask(M.causal_mask, 8, block_size=0), ValueError, "^block"),
        (lambda: M.block_mask(M.causal_mask, 2**15, 2**14), ValueError, "closed"),
        (lambda: M.masked_attention(q[0], k, v), ValueError, "^q"),
        (lambda: M.masked_attention(q, k, v.astype(int)), TypeError, "^v"),
        (lambda: M.masked_attention(q, k[:, :1], v[:, :1]), ValueError, "enable_gqa"),
        (lambda: M.masked_attention(q, k, v, scale=-1.0), ValueError, "^scale"),
        (lambda: M.masked_attention(q, k, v, sinks=[0.0]), ValueError, "^sinks"),
        (lambda: M.masked_attention(q, k, v, score_mod=1), TypeError, "^score_mod"),
        (lambda: M.masked_attention(q, k, v, np.ones(3)), TypeError, "^mask"),
        (lambda: M.masked_attention(q, k, v, np.ones(3, bool)), ValueError, "^mask"),
    ]
    for call, err, match in cases:
        with pytest.raises(err, match=match):
            call()
