"""Issue 33, the NumPy side: the edges of attention.decode, attention.ring,
attention.memory.ring/decode, attention.hard, attention.deformable and attention.plots
refuse what they cannot do by name, the position-walking counts refuse sizes their
closed forms answer at once, and the page allocator frees in O(pages)."""

import time
import warnings

import numpy as np
import pytest

from attention import core, decode, hard, plots, ring
from attention import deformable as adf
from attention.memory import decode as mdecode
from attention.memory import ring as mring

# ---------------------------------------------------------------------------------
# The merge and the names of the scale and the shard bounds
# ---------------------------------------------------------------------------------


def test_merge_of_a_ragged_list_names_the_argument():
    o, lse = np.zeros((3, 4)), np.zeros(3)
    with pytest.raises(ValueError, match=r"^o_parts must hold parts of one shape"):
        decode.merge_partials([o, np.zeros((2, 4))], [lse, lse])
    with pytest.raises(ValueError, match=r"^lse_parts must hold parts of one shape"):
        decode.merge_partials([o, o], [lse, np.zeros(2)])
    with pytest.raises(ValueError, match=r"^o_parts must hold at least one part"):
        decode.merge_partials([], [])
    with pytest.raises(TypeError, match=r"^o_parts\[1\] must be a real"):
        decode.merge_partials([o, np.full((3, 4), "a")], [lse, lse])


def test_one_merge_for_decode_ring_and_core():
    assert decode.merge_partials is core.merge_partials
    assert ring.merge_partials is core.merge_partials
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal(s) for s in ((2, 3, 8), (2, 20, 8), (2, 20, 5)))
    parts = [
        decode.partial_attention(q, k[:, a:b], v[:, a:b])
        for a, b in ((0, 7), (7, 7), (7, 20))
    ]  # the middle chunk is empty: o = 0, lse = -inf
    o, lse = core.merge_partials([p[0] for p in parts], [p[1] for p in parts])
    np.testing.assert_allclose(
        o, core.scaled_dot_product_attention(q, k, v), rtol=1e-12, atol=1e-12
    )
    stacked = core.merge_partials(
        np.stack([p[0] for p in parts]), [p[1] for p in parts]
    )
    np.testing.assert_array_equal(stacked[0], o)


def test_kvcache_twin_takes_scale_and_deprecates_softmax_scale():
    rng = np.random.default_rng(1)
    q = rng.standard_normal((1, 1, 2, 4))  # (B, N_q, H_q, d)
    k = rng.standard_normal((1, 5, 1, 4))  # (B, N_max, H_kv, d)
    lens = np.array([5])
    want = decode.attention_with_kvcache(q, k, k, lens, scale=0.3)
    with pytest.warns(DeprecationWarning, match="softmax_scale"):
        old = decode.attention_with_kvcache(q, k, k, lens, softmax_scale=0.3)
    np.testing.assert_array_equal(old, want)
    assert not np.allclose(want, decode.attention_with_kvcache(q, k, k, lens))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with pytest.raises(TypeError, match="^softmax_scale must be a real"):
            decode.attention_with_kvcache(q, k, k, lens, softmax_scale="x")
        with pytest.raises(TypeError, match="not both"):
            decode.attention_with_kvcache(q, k, k, lens, scale=1.0, softmax_scale=1.0)


def test_shard_intervals_take_kernels_ring_order():
    # (n, rank, world_size, layout), as kernels.ring.shard_intervals
    assert ring.shard_intervals(22, 1, 4, "zigzag") == [(3, 6), (18, 20)]
    assert ring.shard_intervals(10, 2, 4, "striped") == [(2, 3), (6, 7)]
    np.testing.assert_array_equal(ring.shard_positions(10, 2, 4, "striped"), [2, 6])
    with pytest.raises(ValueError, match="^rank must be < world_size=4"):
        ring.shard_intervals(22, 4, 4, "zigzag")
    with pytest.raises(TypeError, match="^world_size must be an int"):
        ring.shard_intervals(22, 0, 4.0, "zigzag")


# ---------------------------------------------------------------------------------
# The paged cache and the model table
# ---------------------------------------------------------------------------------


def test_free_refuses_a_non_iterable_and_leaves_the_pool_unchanged():
    pool = decode.PageAllocator(8)
    a, b = pool.alloc(), pool.alloc()
    with pytest.raises(TypeError, match="^pages must be an iterable"):
        pool.free(1)
    with pytest.raises(TypeError, match="^pages must be an iterable"):
        pool.free("01")
    with pytest.raises(TypeError, match="^pages must be an int"):
        pool.free([1.0])
    with pytest.raises(ValueError, match="^pages: page 1 is not an allocated"):
        pool.free([b, b])  # twice in one call
    with pytest.raises(ValueError, match="^pages: page 5 is not an allocated"):
        pool.free([a, 5])  # 5 is free: nothing is freed, a stays allocated
    assert pool.num_free == 6
    pool.free(np.array([a, b]))  # NumPy integers are page numbers too
    assert pool.num_free == 8 and sorted(pool.free_list) == list(range(8))


def _free_seconds(num_pages: int, n: int = 1000, repeats: int = 5) -> float:
    """Best of ``repeats`` timings of freeing ``n`` pages from a pool of ``num_pages``
    (the pages allocated afresh before each timing)."""
    pool = decode.PageAllocator(num_pages)
    best = np.inf
    for _ in range(repeats):
        pages = [pool.alloc() for _ in range(n)]
        t = time.perf_counter()
        pool.free(pages)
        best = min(best, time.perf_counter() - t)
    return best


def test_free_is_linear_in_the_pages_freed_not_the_pool():
    # the same 1000 pages freed from a pool 100x larger: O(pages) takes about as long,
    # a scan of the free list per page (the old allocator) about 100x longer
    small, large = _free_seconds(10**4), _free_seconds(10**6)
    assert large < 10 * small, (small, large)


def test_allocation_order_is_unchanged():
    pool = decode.PageAllocator(4)
    assert [pool.alloc() for _ in range(3)] == [0, 1, 2]
    pool.free([1])
    assert pool.alloc() == 1 and pool.alloc() == 3
    with pytest.raises(MemoryError):
        pool.alloc()


def test_model_config_refuses_kv_heads_that_do_not_divide_query_heads():
    with pytest.raises(ValueError, match="^H_kv must divide H_q.*H_q=32, H_kv=5"):
        mdecode.ModelConfig("x", 1, 32, 5, 64, "k")
    with pytest.raises(TypeError, match="^layers must be a positive int"):
        mdecode.ModelConfig("x", 1.5, 32, 8, 64, "k")
    with pytest.raises(ValueError, match="^d must be a positive int"):
        mdecode.ModelConfig("x", 1, 32, 8, 0, "k")
    assert mdecode.ModelConfig("x", 1, 32, 8, 64, "k").group == 4
    assert all(m.H_q % m.H_kv == 0 for m in mdecode.MODELS.values())


# ---------------------------------------------------------------------------------
# attention.ring: shard, unshard, idle_fraction, the size guard
# ---------------------------------------------------------------------------------


def test_shard_refuses_an_axis_out_of_range_and_a_0d_array():
    x = np.arange(24).reshape(2, 3, 4)
    with pytest.raises(ValueError, match="^axis=5 is out of range"):
        ring.shard(x, 0, 2, axis=5)
    with pytest.raises(ValueError, match="^axis=-4 is out of range"):
        ring.shard(x, 0, 2, axis=-4)
    with pytest.raises(ValueError, match="^x must have a sequence axis"):
        ring.shard(np.float64(3.0), 0, 2)
    np.testing.assert_array_equal(ring.shard(x, 1, 2, axis=2), x[..., 2:])


def test_unshard_refuses_mismatched_shards_by_name():
    x = np.arange(2 * 6 * 3).reshape(2, 6, 3)
    parts = [ring.shard(x, r, 2, "zigzag") for r in range(2)]
    with pytest.raises(ValueError, match="^shards must agree on every axis"):
        ring.unshard([parts[0], parts[1][:, :, :2]], "zigzag")
    with pytest.raises(ValueError, match="^shards must agree on every axis"):
        ring.unshard([parts[0], parts[1][0]], "zigzag")
    with pytest.raises(ValueError, match=r"^shards\[0\] holds 1 positions"):
        ring.unshard([parts[0][:, :1], parts[1]], "zigzag")  # 4 tokens: 2 each
    with pytest.raises(TypeError, match="^shards must be a list"):
        ring.unshard(x, "zigzag")
    with pytest.raises(ValueError, match="^shards must hold at least one"):
        ring.unshard([], "zigzag")
    with pytest.raises(ValueError, match="^layout must be one of"):
        ring.unshard(parts, "diagonal")
    np.testing.assert_array_equal(ring.unshard(parts, "zigzag"), x)


def test_idle_fraction_wants_a_steps_by_devices_matrix():
    with pytest.raises(ValueError, match=r"^work must be 2-D \(steps, devices\)"):
        ring.idle_fraction(np.ones(4))
    with pytest.raises(ValueError, match="^work must hold at least one"):
        ring.idle_fraction(np.ones((0, 4)))
    with pytest.raises(TypeError, match="^work must be a real"):
        ring.idle_fraction([["a"]])
    assert ring.idle_fraction([[1, 3], [2, 2]]) == 1 - 8 / 10


@pytest.mark.parametrize("N,P", [(10**7, 8), (10**6, 32), (4096, 512)])
def test_position_walks_refuse_sizes_the_closed_form_answers(N, P):
    with pytest.raises(ValueError, match=r"pairs_matrix\(N, P, layout, causal\)"):
        ring.work_matrix(N, P, "striped")
    with pytest.raises(ValueError, match=r"ring_closed_form\(N, P, H, d"):
        mring.simulate_ring(N, P, 8, 64, causal=True, layout="striped")
    with pytest.raises(ValueError, match=r"ulysses_closed_form"):
        mring.simulate_ulysses(N, 512, 512, 64)  # 512 devices: 262k messages
    if P == 8:  # the closed forms answer the refused sizes at once
        counts = mring.ring_closed_form(N, P, 8, 64, causal=True, layout="striped")
        assert counts.pairs.sum() == N * (N + 1) // 2


def test_position_walks_equal_the_closed_form_within_budget():
    N, P = 2**21, 8  # P * N at the budget
    w = ring.work_matrix(N, P, "striped", True)
    np.testing.assert_array_equal(w, mring.pairs_matrix(N, P, "striped", True))


# ---------------------------------------------------------------------------------
# attention.memory.ring: names refused with their options
# ---------------------------------------------------------------------------------


def test_ring_model_refuses_unknown_names_listing_the_options():
    counts = mring.ring_closed_form(64, 4, 8, 64)
    with pytest.raises(ValueError, match=r"^gpu must be one of \['A100'"):
        mring.peak_flops("V100", "bfloat16")
    with pytest.raises(ValueError, match=r"for dtype='float32', gpu must be one of"):
        mring.peak_flops("L4", "float32")
    with pytest.raises(ValueError, match=r"^dtype must be one of \['bfloat16'"):
        mring.peak_flops("H100", "float8")
    with pytest.raises(ValueError, match=r"^link must be one of \['NVLink 4'"):
        mring.ring_times(counts, "H100", "NVLink 9", "bfloat16")
    with pytest.raises(ValueError, match=r"^dtype must be one of"):
        mring.memory_per_device(64, 4, 8, 64, dtype="float8")
    with pytest.raises(ValueError, match=r"^scheme must be one of \['ring', 'ulysses'"):
        mring.memory_per_device(64, 4, 8, 64, scheme="tree")
    assert mring.peak_flops("L4", "bfloat16") > 0


@pytest.mark.parametrize("work", [0, -1, 1.5, float("nan")])
def test_overlap_threshold_wants_a_visible_fraction(work):
    with pytest.raises(ValueError, match=r"^work must be the visible fraction"):
        mring.overlap_threshold("H100", "NVLink 4", "bfloat16", 32, 8, work=work)


def test_overlap_threshold_scales_with_one_over_work():
    full = mring.overlap_threshold("H100", "NVLink 4", "bfloat16", 32, 8)
    half = mring.overlap_threshold("H100", "NVLink 4", "bfloat16", 32, 8, work=0.5)
    assert half == pytest.approx(2 * full, rel=1e-15)
    with pytest.raises(TypeError, match="^work must be a real number"):
        mring.overlap_threshold("H100", "NVLink 4", "bfloat16", 32, 8, work="1")


# ---------------------------------------------------------------------------------
# attention.hard: +inf and NaN in sampling
# ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "special,want",
    [({3: np.inf}, 3), ({1: np.inf, 4: np.inf}, 1), ({2: np.nan}, 2)]
    + [({0: -np.inf, 2: np.inf}, 2), ({1: np.nan, 3: np.inf}, 1)],
)
def test_stochastic_hard_attention_takes_the_key_argmax_takes(special, want):
    # one query q = [1] against keys k_j: the score of key j is k_j itself
    v = np.random.default_rng(2).standard_normal((5, 2))
    k = np.zeros((5, 1))
    for j, x in special.items():
        k[j] = x
    q = np.ones((2, 1))  # two equal rows: both draw
    assert hard.argmax_index((q @ k.T)[0]) == want
    for seed in range(4):
        o, idx = hard.stochastic_hard_attention(
            q, k, v, np.random.default_rng(seed), scale=1.0, return_index=True
        )
        assert idx.tolist() == [want, want]
        if any(np.isnan(x) for x in special.values()):
            assert np.isnan(o).all()  # a NaN row: NaN output, its first NaN key
        else:
            np.testing.assert_array_equal(o, v[[want, want]])


def test_sample_index_follows_the_nan_rule():
    rng = np.random.default_rng(3)
    p = np.array([[0.2, np.nan, 0.8, np.nan], [0.5, 0.0, 0.5, 0.0], [0, 0, 0, 0.0]])
    for _ in range(5):
        idx = hard.sample_index(p, rng)
        assert idx[0] == 1  # a NaN row draws its first NaN position, never a number
        assert idx[1] in (0, 2) and idx[2] == -1
    with pytest.raises(ValueError, match="^p must be non-negative"):
        hard.sample_index(np.array([0.5, -0.1, 0.6]), rng)


# ---------------------------------------------------------------------------------
# attention.deformable and attention.plots
# ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "change,err,match",
    [
        (dict(height=-8), ValueError, "^height must be >= 1"),
        (dict(width=0), ValueError, "^width must be >= 1"),
        (dict(d_model=64.0), TypeError, "^d_model must be an int"),
        (dict(r=0), ValueError, "^r must be >= 1"),
        (dict(n_levels=True), TypeError, "^n_levels must be an int"),
        (dict(n_points=-1), ValueError, "^n_points must be >= 1"),
    ],
)
def test_attention_cost_refuses_bad_sizes(change, err, match):
    with pytest.raises(err, match=match):
        adf.attention_cost(**{"height": 8, "width": 8, "d_model": 64, **change})


def test_attention_cost_counts_keys():
    c = adf.attention_cost(8, 12, 64, r=4)
    assert c["dense"]["keys"] == 96 and c["dat"]["keys"] == 2 * 3
    assert c["msda"]["keys"] == 16


@pytest.mark.parametrize(
    "kw,match",
    [(dict(n=100.5), "^n must be an int"), (dict(m=3.0), "^m must be an int")]
    + [(dict(d=64.0), "^d must be an int"), (dict(Br="64"), "^Br must be an int")],
)
def test_naive_traffic_figure_refuses_non_integer_sizes(kw, match):
    with pytest.raises(TypeError, match=match):
        plots.naive_traffic_figure(**kw)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_power_law_fit_refuses_non_finite_samples_by_name(bad):
    with pytest.raises(ValueError, match="^y must be finite"):
        plots.power_law_fit([1, 2, 4], [1.0, bad, 16.0])
    with pytest.raises(ValueError, match="^x must be finite"):
        plots.power_law_fit([1, bad, 4], [1.0, 4.0, 16.0])
    slope, c = plots.power_law_fit([1, 2, 4], [3.0, 12.0, 48.0])
    assert slope == pytest.approx(2) and c == pytest.approx(3)


def test_human_bytes_reaches_pebibytes():
    assert plots.human_bytes(2**50) == "1 PiB"
    assert plots.human_bytes(1.5 * 2**50) == "1.5 PiB"
    assert plots.human_bytes(2**50 - 2**40) == "1020 TiB"
    assert plots.human_bytes(3 * 2**60) == "3 EiB"
    assert plots.human_bytes(1536) == "1.5 KiB" and plots.human_bytes(0) == "0 B"
    for bad in (-1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="^n must be a finite byte count"):
            plots.human_bytes(bad)
