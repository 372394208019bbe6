"""attention.sparse against loops written from the papers' rules: a dense fp64
attention restricted to the chosen keys, and selections ranked one row at a time."""

import math

import numpy as np
import pytest

from attention import sparse

RNG = np.random.default_rng(8)
TOL = dict(rtol=1e-12, atol=1e-12)


def qkv(b, h_q, h_kv, n_q, n_k, d, rng=RNG):
    return (
        rng.standard_normal((b, h_q, n_q, d)),
        rng.standard_normal((b, h_kv, n_k, d)),
        rng.standard_normal((b, h_kv, n_k, d)),
    )


def reference(q, k, v, idx, bs, scale, causal):
    """One row at a time: gather the chosen keys, dense softmax in fp64."""
    b, h_q, n_q, _ = q.shape
    h_kv, n_k = k.shape[1], k.shape[2]
    o = np.zeros(q.shape[:3] + (v.shape[-1],))
    lse = np.full(q.shape[:3], -np.inf)
    for bi in range(b):
        for h in range(h_q):
            g = h // (h_q // h_kv)
            for i in range(n_q):
                keys = [
                    j
                    for c in idx[bi, g, i]
                    if c >= 0
                    for j in range(c * bs, min((c + 1) * bs, n_k))
                    if not causal or j <= i + n_k - n_q
                ]
                if not keys:
                    continue
                s = np.array([q[bi, h, i] @ k[bi, g, j] * scale for j in keys])
                m = s.max()
                p = np.exp(s - m)
                o[bi, h, i] = p @ v[bi, g, keys] / p.sum()
                lse[bi, h, i] = m + math.log(p.sum())
    return o, lse


def random_indices(b, h_kv, n_q, n_blocks, s, rng=RNG):
    idx = np.full((b, h_kv, n_q, s), -1)
    for pos in np.ndindex(b, h_kv, n_q):
        m = rng.integers(0, min(s, n_blocks) + 1)
        idx[pos][:m] = rng.permutation(n_blocks)[:m]
        rng.shuffle(idx[pos])
    return idx.astype(np.int32)


@pytest.mark.parametrize("bs", [1, 16, 64])
@pytest.mark.parametrize("causal", [True, False])
def test_sparse_attention_matches_reference(bs, causal):
    for _ in range(2):
        h_kv = int(RNG.integers(1, 3))
        h_q = h_kv * int(RNG.integers(1, 4))
        n_q, n_k = (int(x) for x in RNG.integers(1, 90, 2))
        q, k, v = qkv(1, h_q, h_kv, n_q, n_k, 8)
        nb = -(-n_k // bs)
        idx = random_indices(1, h_kv, n_q, nb, int(RNG.integers(1, 5)))
        o, lse = sparse.sparse_attention(q, k, v, idx, bs, 0.4, causal, True)
        ro, rl = reference(q, k, v, idx, bs, 0.4, causal)
        np.testing.assert_allclose(o, ro, **TOL)
        np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(rl))
        fin = np.isfinite(rl)
        np.testing.assert_allclose(lse[fin], rl[fin], **TOL)
        assert (o[~fin] == 0).all()


def test_nan_rules():
    q, k, v = qkv(1, 2, 1, 6, 32, 4)
    idx = np.array([[[[0, -1]] * 3 + [[1, -1]] * 3]], dtype=np.int32)
    k[0, 0, 20] = np.nan  # in block 1: rows 3..5 read it
    v[0, 0, 3] = np.nan  # in block 0: rows 0..2 read it (causal: 3 <= position)
    q[0, 1, 4] = np.nan
    o, lse = sparse.sparse_attention(q, k, v, idx, 16, None, False, True)
    assert np.isnan(o[0, :, :3]).all() and np.isfinite(lse[0, :, :3]).all()
    assert np.isnan(o[0, :, 3:]).all() and np.isnan(lse[0, :, 3:]).all()
    k[0, 0, 20] = 0.0
    o, lse = sparse.sparse_attention(q, k, v, idx, 16, None, False, True)
    assert np.isfinite(o[0, 0, 3:]).all() and np.isnan(o[0, 1, 4]).all()
    assert np.isfinite(o[0, 1, [3, 5]]).all()
    # a hidden NaN (causal, beyond the query) never reaches the row
    q, k, v = qkv(1, 1, 1, 16, 16, 4)
    v[0, 0, 5] = np.nan
    o = sparse.sparse_attention(q, k, v, np.zeros((1, 1, 16, 1), int), 16)
    assert np.isfinite(o[0, 0, :5]).all() and np.isnan(o[0, 0, 5:]).all()


def test_argument_errors():
    q, k, v = qkv(1, 2, 1, 4, 20, 4)
    ok = np.zeros((1, 1, 4, 1), np.int32)
    with pytest.raises(ValueError, match="kv_indices holds 2"):
        sparse.sparse_attention(q, k, v, ok + 2, 16)
    with pytest.raises(ValueError, match="repeats"):
        sparse.sparse_attention(q, k, v, np.zeros((1, 1, 4, 2), int), 16)
    with pytest.raises(TypeError, match="kv_indices"):
        sparse.sparse_attention(q, k, v, ok.astype(float), 16)
    with pytest.raises(ValueError, match="block_size"):
        sparse.sparse_attention(q, k, v, ok, -1)
    with pytest.raises(ValueError, match="topk"):
        sparse.select_blocks(q, k, 16, 0)
    with pytest.raises(ValueError, match="multiple"):
        sparse.select_blocks(q[:, :1], np.concatenate([k, k], 1), 16, 1)
    with pytest.raises(TypeError, match="causal"):
        sparse.select_blocks(q, k, 16, 1, causal="yes")


def select_loop(q, k, bs, topk, causal, scale):
    b, h_q, n_q, _ = q.shape
    h_kv, n_k = k.shape[1], k.shape[2]
    g = h_q // h_kv
    nb = -(-n_k // bs)
    out = np.full((b, h_kv, n_q, topk), -1)
    for bi, kv, i in np.ndindex(b, h_kv, n_q):
        pos = i + n_k - n_q
        scores = []
        for c in range(nb):
            if causal and c * bs > pos:
                continue
            mk = k[bi, kv, c * bs : (c + 1) * bs].mean(0)
            s = sum(q[bi, kv * g + j, i] @ mk for j in range(g)) * scale
            own = causal and c == pos // bs
            scores.append((not own, -s, c))
        chosen = [c for _, _, c in sorted(scores)][:topk]
        out[bi, kv, i, : len(chosen)] = chosen
    return out


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("bs", [1, 16, 64])
def test_select_blocks_matches_loop(causal, bs):
    for _ in range(2):
        h_kv = int(RNG.integers(1, 3))
        h_q = h_kv * int(RNG.integers(1, 4))
        n_q, n_k = (int(x) for x in RNG.integers(1, 140, 2))
        q, k, _ = qkv(2, h_q, h_kv, n_q, n_k, 8)
        topk = int(RNG.integers(1, 6))
        got = sparse.select_blocks(q, k, bs, topk, causal, 0.3)
        assert got.dtype == np.int32 and got.shape == (2, h_kv, n_q, topk)
        np.testing.assert_array_equal(got, select_loop(q, k, bs, topk, causal, 0.3))


def test_select_ties_and_nan():
    q = np.ones((1, 1, 1, 2))
    k = np.zeros((1, 1, 8, 2))  # every block scores 0: ties to the lower index
    assert sparse.select_blocks(q, k, 2, 3, causal=False).tolist() == [[[[0, 1, 2]]]]
    k[0, 0, 5] = np.nan  # block 2's mean is NaN: ranked first, the row keeps its NaN
    assert sparse.select_blocks(q, k, 2, 2, causal=False).tolist() == [[[[2, 0]]]]
    # causal, query at position 7 (N_q = 1, N_k = 8): own block 3 first
    assert sparse.select_blocks(q, k, 2, 2)[0, 0, 0, 0] == 3


def test_moba_attention_is_select_then_attend():
    q, k, v = qkv(1, 4, 2, 40, 70, 8)
    idx = sparse.select_blocks(q, k, 16, 2)
    ro, _ = reference(q, k, v, idx, 16, 1 / math.sqrt(8), True)
    np.testing.assert_allclose(sparse.moba_attention(q, k, v, 16, 2), ro, **TOL)


def test_nsa_select_and_branches():
    q, k, v = qkv(1, 4, 2, 50, 50, 8)
    bs, topk, scale = 8, 4, 0.35
    idx = sparse.nsa_select(q, k, bs, topk, True, scale)
    kc = sparse.mean_pool(k, bs)
    for kv, i in np.ndindex(2, 50):
        own = i // bs
        complete = [c for c in range(7) if min((c + 1) * bs, 50) - 1 <= i]
        p = np.zeros(7)
        for h in (2 * kv, 2 * kv + 1):
            s = np.array([q[0, h, i] @ kc[0, kv, c] * scale for c in complete])
            if complete:
                p[complete] += np.exp(s - s.max()) / np.exp(s - s.max()).sum()
        forced = {0} | {c for c in (own, own - 1) if c >= 0}
        rest = sorted((-p[c], c) for c in range(own + 1) if c not in forced)
        want = sorted(forced, key=lambda c: (-p[c], c)) + [c for _, c in rest]
        want = (want + [-1] * topk)[:topk]
        assert idx[0, kv, i].tolist() == want
    o, (oc, osl, ow), _ = sparse.nsa_attention(
        q, k, v, bs, topk, 12, gates=np.full((1, 4, 50, 3), 0.5), scale=scale,
        return_parts=True,
    )  # fmt: skip
    np.testing.assert_allclose(o, 0.5 * (oc + osl + ow), **TOL)
    np.testing.assert_allclose(osl, reference(q, k, v, idx, bs, scale, True)[0], **TOL)
    win = np.broadcast_to(sparse.window_indices(50, 50, 12), (1, 2, 50, 12))
    np.testing.assert_allclose(ow, reference(q, k, v, win, 1, scale, True)[0], **TOL)
    vc = sparse.mean_pool(v, bs)
    i, h = 30, 3  # compressed blocks 0..2 end at or before position 30
    s = kc[0, 1, :3] @ q[0, h, i] * scale
    p = np.exp(s - s.max()) / np.exp(s - s.max()).sum()
    np.testing.assert_allclose(oc[0, h, i], p @ vc[0, 1, :3], **TOL)


def test_lightning_indexer_and_topk_tokens():
    rng = np.random.default_rng(3)
    qi, ki = rng.standard_normal((1, 9, 3, 4)), rng.standard_normal((1, 12, 4))
    w = rng.standard_normal((1, 9, 3))
    s = sparse.lightning_indexer(qi, ki, w)
    for t, j in np.ndindex(9, 12):
        want = sum(w[0, t, h] * max(qi[0, t, h] @ ki[0, j], 0) for h in range(3))
        if j <= t + 3:
            assert s[0, t, j] == pytest.approx(want, rel=1e-12, abs=1e-12)
        else:
            assert s[0, t, j] == -np.inf
    idx = sparse.topk_tokens(s, 5, h_kv=2)
    assert idx.shape == (1, 2, 9, 5)
    for t in range(9):
        order = sorted(range(t + 4), key=lambda j: (-s[0, t, j], j))[:5]
        assert idx[0, 0, t].tolist() == (order + [-1] * 5)[:5]
    q, k, v = qkv(1, 4, 2, 9, 12, 4)
    o = sparse.sparse_attention(q, k, v, idx, 1, None, True)
    np.testing.assert_allclose(o, reference(q, k, v, idx, 1, 0.5, True)[0], **TOL)


def test_quest_bound_and_selection():
    q, k, _ = qkv(1, 2, 1, 20, 45, 6)
    u = sparse.quest_bounds(q, k, 16, 1.0)  # (1, 1, 20, 3)
    for i, c in np.ndindex(20, 3):
        page = k[0, 0, c * 16 : (c + 1) * 16]
        exact = max(sum(q[0, h, i] @ kk for h in range(2)) for kk in page)
        assert u[0, 0, i, c] >= exact - 1e-12
        m, M = page.min(0), page.max(0)
        want = sum(np.maximum(q[0, h, i] * m, q[0, h, i] * M).sum() for h in range(2))
        assert u[0, 0, i, c] == pytest.approx(want, rel=1e-12)
    idx = sparse.quest_select(q, k, 16, 2, causal=True, scale=1.0)
    for i in range(20):
        pos = i + 25
        ok = [c for c in range(3) if c * 16 <= pos]
        want = sorted(ok, key=lambda c: (-u[0, 0, i, c], c))[:2]
        assert idx[0, 0, i].tolist() == (want + [-1])[:2]


def test_empty_rows_and_decode():
    q, k, v = qkv(1, 1, 1, 5, 3, 4)  # N_q > N_k: the first two rows see no key
    idx = np.zeros((1, 1, 5, 1), np.int32)
    o, lse = sparse.sparse_attention(q, k, v, idx, 4, None, True, True)
    assert (o[0, 0, :2] == 0).all() and np.isneginf(lse[0, 0, :2]).all()
    assert np.isfinite(lse[0, 0, 2:]).all()
    assert (sparse.select_blocks(q, k, 4, 2)[0, 0, :2] == -1).all()


def test_nsa_without_forced_blocks_ranks_as_moba_for_one_head_per_group():
    # softmax is monotone: with one query head per KV head and no forced blocks, the
    # compressed branch's probabilities rank blocks as the mean-pooled scores do
    q, k, _ = qkv(2, 3, 3, 30, 75, 8)
    want = sparse.select_blocks(q, k, 16, 3, causal=False)
    got = sparse.nsa_select(q, k, 16, 3, False, n_initial=0, n_local=0)
    np.testing.assert_array_equal(got, want)
