"""attention.decode against an independent fp64 reference (attention.core): decoding
step by step equals causal attention over the whole sequence, the log-sum-exp merge is
exact (empty chunks, all empty, NaN), split-KV and paged caches equal contiguous ones,
the waste counts equal a brute-force page allocation, arguments are checked."""

import numpy as np
import pytest

from attention import core, decode
from attention.flash import standard_forward

TOL = 1e-12


def _qkv(rng, B, H_q, H_kv, N, d):
    return (
        rng.standard_normal((B, H_q, N, d)),
        rng.standard_normal((B, H_kv, N, d)),
        rng.standard_normal((B, H_kv, N, d)),
    )


def _ref(q, k, v, causal=True):
    g = q.shape[1] // k.shape[1]
    return core.scaled_dot_product_attention(
        q, decode.repeat_kv(k, g), decode.repeat_kv(v, g), causal=causal
    )


@pytest.mark.parametrize("H_q,H_kv", [(4, 4), (8, 2), (6, 1)])
@pytest.mark.parametrize("step", [1, 2, 5, 16])
def test_generate_equals_causal_attention_over_the_sequence(H_q, H_kv, step):
    rng = np.random.default_rng(H_q * 100 + step)
    for N, n_prefill in ((1, 1), (23, 1), (41, 17), (40, 40)):
        q, k, v = _qkv(rng, 2, H_q, H_kv, N, 8)
        got = decode.generate(q, k, v, n_prefill, tokens_per_step=step)
        np.testing.assert_allclose(got, _ref(q, k, v), atol=TOL, rtol=0)


def _lse_ref(q, k, v, causal):
    """o and lse from the materialising forward (attention.flash.standard_forward)."""
    o, lse, _ = standard_forward(q, k, v, causal=causal)
    return o, lse


@pytest.mark.parametrize("causal", [False, True])
def test_split_kv_equals_one_pass_for_every_split_count(causal):
    rng = np.random.default_rng(1)
    for N_q, N_k in ((1, 1), (1, 97), (7, 64), (16, 33), (5, 3)):
        q, k, v = (rng.standard_normal((2, 3, n, 16)) for n in (N_q, N_k, N_k))
        o_ref, lse_ref = _lse_ref(q, k, v, causal)
        for S in (1, 2, 3, 8, 200):
            for block in (1, 4, 16):
                o, lse = decode.split_kv_attention(
                    q, k, v, S, causal=causal, block=block
                )
                np.testing.assert_allclose(o, o_ref, atol=TOL, rtol=0)
                np.testing.assert_allclose(lse, lse_ref, atol=TOL, rtol=0)


def test_merge_of_two_partials_is_attention_over_their_union():
    rng = np.random.default_rng(2)
    q, k, v = (
        rng.standard_normal((4, 8)),
        rng.standard_normal((30, 8)),
        rng.standard_normal((30, 5)),
    )
    o1, l1 = decode.partial_attention(q, k[:11], v[:11])
    o2, l2 = decode.partial_attention(q, k[11:], v[11:])
    o, lse = decode.merge_partials([o1, o2], [l1, l2])
    o_ref, lse_ref = _lse_ref(q, k, v, False)
    np.testing.assert_allclose(o, o_ref, atol=TOL, rtol=0)
    np.testing.assert_allclose(lse, lse_ref, atol=TOL, rtol=0)
    # order does not matter
    o_b, lse_b = decode.merge_partials([o2, o1], [l2, l1])
    np.testing.assert_allclose(o_b, o, atol=TOL, rtol=0)


def test_merge_edge_cases():
    o = np.arange(6.0).reshape(3, 1, 2)  # three partials of one row, d = 2
    # an empty chunk (lse -inf) contributes nothing, even with garbage in its o
    garbage = np.array([[np.nan, np.inf]])
    out, lse = decode.merge_partials(
        [o[0], garbage, o[1]], [np.zeros(1), np.full(1, -np.inf), np.zeros(1)]
    )
    np.testing.assert_allclose(out, (o[0] + o[1]) / 2)
    np.testing.assert_allclose(lse, [np.log(2.0)])
    # every chunk empty: o 0, lse -inf
    out, lse = decode.merge_partials(o, np.full((3, 1), -np.inf))
    assert (out == 0).all() and np.isneginf(lse).all()
    # a NaN lse or a NaN in a seen o stays NaN; other rows are untouched
    o2 = np.zeros((2, 2, 3))
    o2[1, 0, 0] = np.nan
    out, lse = decode.merge_partials(o2, np.zeros((2, 2)))
    assert np.isnan(out[0, 0]) and np.isfinite(out[0, 1:]).all()  # as in p @ v
    assert np.isfinite(out[1]).all()
    out, lse = decode.merge_partials(np.zeros((2, 2, 3)), [[0.0, np.nan], [0.0, 1.0]])
    assert np.isnan(lse[1]) and np.isnan(out[1]).all() and np.isfinite(out[0]).all()
    # huge lse values do not overflow
    out, lse = decode.merge_partials(o[:2], np.array([[1000.0], [1000.0]]))
    np.testing.assert_allclose(lse, [1000 + np.log(2.0)])


def test_partial_attention_rows_that_see_nothing_and_nan():
    rng = np.random.default_rng(3)
    q, k, v = (
        rng.standard_normal((5, 4)),
        rng.standard_normal((3, 4)),
        rng.standard_normal((3, 4)),
    )
    o, lse = decode.partial_attention(q, k, v, causal=True, q_offset=-2)
    assert (o[:2] == 0).all() and np.isneginf(lse[:2]).all()
    assert np.isfinite(lse[2:]).all()
    o, lse = decode.partial_attention(q, k[:0], v[:0])
    assert o.shape == (5, 4) and (o == 0).all() and np.isneginf(lse).all()
    k_nan = k.copy()
    k_nan[2, 0] = np.nan  # key 2: seen by rows 2.. only (offset -2 + i >= 2 -> i >= 4)
    o, lse = decode.partial_attention(q, k_nan, v, causal=True, q_offset=-2)
    assert np.isnan(o[4]).all() and np.isnan(lse[4])
    assert np.isfinite(o[:4]).all()


def _paged_from(rng, k, v, lens, page_size, n_pages):
    """Write each sequence's cache into a shuffled pool through PagedKVCache."""
    B, _, H_kv, d = k.shape
    cache = decode.PagedKVCache(n_pages, page_size, H_kv, d)
    rng.shuffle(cache.pool.free_list)  # pages land anywhere in the pool
    for _ in range(B):
        cache.add_sequence()
    for t in range(max(lens)):  # interleaved, as a server appends
        for b in range(B):
            if t < lens[b]:
                cache.append(b, k[b, t : t + 1], v[b, t : t + 1])
    return cache


@pytest.mark.parametrize("page_size", [1, 3, 16])
@pytest.mark.parametrize("H_q,H_kv", [(4, 4), (8, 2), (4, 1)])
def test_paged_equals_contiguous_equals_reference(page_size, H_q, H_kv):
    rng = np.random.default_rng(page_size * 10 + H_q)
    B, N_max, d = 3, 40, 8
    lens = [40, 1, 17]
    k = rng.standard_normal((B, N_max, H_kv, d))  # (B, N_max, H_kv, d)
    v = rng.standard_normal((B, N_max, H_kv, d))
    cache = _paged_from(rng, k, v, lens, page_size, 64)
    for b in range(B):
        kb, vb = cache.gather(b)
        np.testing.assert_array_equal(kb, k[b, : lens[b]])
    table = cache.block_table()
    for N_q in (1, 4):
        q = rng.standard_normal((B, N_q, H_q, d))  # (B, N_q, H_q, d)
        # a sequence holds its N_q queries (length 1 is an empty slot, 0, at N_q = 4)
        lens = [n if n >= N_q else 0 for n in lens]
        for causal in (True, False):
            flat, lse = decode.attention_with_kvcache(
                q, k, v, np.array(lens), causal=causal, return_lse=True
            )
            paged = decode.attention_with_kvcache(
                q,
                cache.k,
                cache.v,
                np.array(lens, dtype=np.int32),
                table,
                causal=causal,
                num_splits=3,
            )
            np.testing.assert_allclose(paged, flat, atol=TOL, rtol=0)
            for b in range(B):
                qb = q[b].transpose(1, 0, 2)[None]  # (1, H_q, N_q, d)
                kb = k[b, : lens[b]].transpose(1, 0, 2)[None]  # (1, H_kv, n, d)
                vb = v[b, : lens[b]].transpose(1, 0, 2)[None]
                ref = _ref(qb, kb, vb, causal)[0].transpose(1, 0, 2)
                np.testing.assert_allclose(flat[b], ref, atol=TOL, rtol=0)


def test_kvcache_lengths_shorter_than_the_queries_are_refused_and_0_is_empty():
    # as kernels.decode: the queries are a sequence's last N_q positions, so a length
    # below N_q names no sequence; 0 is an empty slot (out 0, lse -inf)
    rng = np.random.default_rng(5)
    q = rng.standard_normal((1, 4, 2, 8))
    k = rng.standard_normal((1, 10, 2, 8))
    with pytest.raises(ValueError, match="cache_seqlens"):
        decode.attention_with_kvcache(q, k, k, np.array([2]), return_lse=True)
    out, lse = decode.attention_with_kvcache(q, k, k, np.array([4]), return_lse=True)
    assert np.isfinite(lse).all()
    out, lse = decode.attention_with_kvcache(q, k, k, np.array([0]), return_lse=True)
    assert (out == 0).all() and np.isneginf(lse).all()


def test_allocator_free_list_and_release():
    cache = decode.PagedKVCache(4, 2, 1, 1)
    a, b = cache.add_sequence(), cache.add_sequence()
    cache.append(a, np.ones((3, 1, 1)), np.ones((3, 1, 1)))  # 2 pages
    cache.append(b, np.ones((4, 1, 1)), np.ones((4, 1, 1)))  # 2 pages
    assert cache.pool.num_free == 0
    with pytest.raises(MemoryError, match="all 4 pages"):
        cache.append(a, np.ones((2, 1, 1)), np.ones((2, 1, 1)))
    cache.release(b)
    assert cache.pool.num_free == 2
    with pytest.raises(ValueError, match="not an allocated page"):
        cache.pool.free([cache.pool.free_list[0]])


def test_waste_equals_a_brute_force_allocation():
    rng = np.random.default_rng(6)
    lens = decode.request_lengths(rng, 50, 300)
    for P in (1, 16, 32, 128):
        cache = decode.PagedKVCache(int(sum(-(-lens // P))), P, 1, 1)
        for n in lens:
            s = cache.add_sequence()
            cache.append(s, np.zeros((int(n), 1, 1)), np.zeros((int(n), 1, 1)))
        slots = (cache.pool.num_pages - cache.pool.num_free) * P
        w = decode.paged_waste(lens, P)
        assert w["reserved"] == slots and w["used"] == int(lens.sum())
        assert w["wasted"] == slots - int(lens.sum()) < P * len(lens)
        assert decode.block_table_bytes(lens, P) == 4 * sum(
            len(t) for t in cache.tables
        )
    c = decode.contiguous_waste(lens, 300)
    assert c["reserved"] == 50 * 300 and c["wasted"] == 50 * 300 - int(lens.sum())


def test_validation_names_the_argument():
    q, k = np.zeros((1, 1, 4, 8)), np.zeros((1, 5, 2, 8))
    lens = np.array([3])
    cases = [
        (dict(q=np.zeros((1, 4, 8))), ValueError, "^q must be 4-D"),
        (
            dict(k_cache=np.zeros((1, 5, 3, 8)), v_cache=np.zeros((1, 5, 3, 8))),
            ValueError,
            "^H_q must be a multiple of H_kv",
        ),
        (dict(v_cache=np.zeros((1, 5, 2, 4))), ValueError, "^k_cache and v_cache"),
        (dict(cache_seqlens=np.array([3.0])), TypeError, "^cache_seqlens"),
        (dict(cache_seqlens=np.array([6])), ValueError, "^cache_seqlens must be in"),
        (
            dict(cache_seqlens=np.array([3, 3])),
            ValueError,
            r"^cache_seqlens must be \(B",
        ),
        (dict(causal="yes"), TypeError, "^causal"),
        (dict(num_splits=-1), ValueError, "^num_splits"),
        (dict(num_splits=1.5), TypeError, "^num_splits"),
        (dict(scale="x"), TypeError, "^scale"),
        (dict(block_table=np.array([[0.0]])), TypeError, "^block_table"),
        (dict(block_table=np.array([[7]])), ValueError, "points outside the pool"),
        (dict(block_table=np.array([[-1]])), ValueError, "points outside the pool"),
        (dict(q=np.array([[[["a"] * 8] * 4]])), TypeError, "^q must be a real"),
    ]
    base = dict(q=q, k_cache=k, v_cache=k, cache_seqlens=lens)
    for change, err, match in cases:
        with pytest.raises(err, match=match):
            decode.attention_with_kvcache(**{**base, **change})
    with pytest.raises(ValueError, match="^H_q must be a multiple"):
        decode.kv_group(6, 4)
    with pytest.raises(ValueError, match="^num_splits"):
        decode.split_chunks(10, 0)
    with pytest.raises(TypeError, match="^rng"):
        decode.request_lengths(0, 3, 10)
    with pytest.raises(ValueError, match="^lengths must be <= max_len"):
        decode.contiguous_waste([5, 11], 10)
    with pytest.raises(ValueError, match="^page_size"):
        decode.paged_waste([5], 0)
    with pytest.raises(ValueError, match="^n_prefill"):
        decode.generate(
            np.zeros((1, 1, 3, 2)), np.zeros((1, 1, 3, 2)), np.zeros((1, 1, 3, 2)), 4
        )
    cache = decode.KVCache(1, 1, 4, 2)
    with pytest.raises(ValueError, match="max_len=4"):
        cache.append(np.zeros((1, 1, 5, 2)), np.zeros((1, 1, 5, 2)))
    with pytest.raises(ValueError, match="^k_new must be"):
        cache.append(np.zeros((1, 2, 1, 2)), np.zeros((1, 2, 1, 2)))
