"""Chapter 6's NumPy side: shards, the (o, lse) merge, ring attention against the fp64
reference, the causal work per device and step, and the communication model's
simulator against its closed forms (exact integer equality)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from attention import core, ring  # noqa: E402
from attention.memory import ring as mring  # noqa: E402


def _qkv(rng, B, H, H_kv, N, d):
    return (
        rng.standard_normal((B, H, N, d)),
        rng.standard_normal((B, H_kv, N, d)),
        rng.standard_normal((B, H_kv, N, d)),
    )


def _reference(q, k, v, causal):
    rep = q.shape[1] // k.shape[1]
    return core.scaled_dot_product_attention(
        q, np.repeat(k, rep, 1), np.repeat(v, rep, 1), causal=causal
    )


# ---------------------------------------------------------------------------------
# Shards.
# ---------------------------------------------------------------------------------


@pytest.mark.parametrize("N,n", [(10, 3), (7, 7), (3, 5), (0, 2), (64, 8)])
def test_chunk_bounds_follow_array_split(N, n):
    got = [e - s for s, e in ring.chunk_bounds(N, n)]
    assert got == [len(c) for c in np.array_split(np.arange(N), n)]


@pytest.mark.parametrize("layout", ring.LAYOUTS)
@pytest.mark.parametrize("N,P", [(16, 4), (13, 3), (5, 4), (31, 2), (9, 1)])
def test_shards_partition_the_sequence(layout, N, P):
    pos = [ring.shard_positions(N, r, P, layout) for r in range(P)]
    assert sorted(np.concatenate(pos).tolist()) == list(range(N))
    x = np.arange(2 * N * 3).reshape(2, N, 3)
    shards = [ring.shard(x, r, P, layout) for r in range(P)]
    np.testing.assert_array_equal(ring.unshard(shards, layout), x)
    lens = mring.shard_lengths(N, P, layout)
    assert lens.tolist() == [len(p) for p in pos]


def test_zigzag_is_chunks_r_and_2p_minus_1_minus_r():
    c = np.array_split(np.arange(22), 8)  # N = 22, P = 4: uneven, larger chunks first
    for r in range(4):
        want = np.concatenate([c[r], c[7 - r]])
        np.testing.assert_array_equal(ring.shard_positions(22, r, 4, "zigzag"), want)


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="layout"):
        ring.shard_positions(8, 0, 2, "diagonal")
    with pytest.raises(TypeError, match="layout"):
        ring.shard_positions(8, 0, 2, None)
    with pytest.raises(ValueError, match="rank"):
        ring.shard_positions(8, 2, 2, "zigzag")
    with pytest.raises(TypeError, match="P"):
        ring.ring_attention_numpy(
            np.ones((4, 2)), np.ones((4, 2)), np.ones((4, 2)), 2.0
        )
    with pytest.raises(ValueError, match="same length"):
        ring.ring_attention_numpy(np.ones((4, 2)), np.ones((5, 2)), np.ones((5, 2)), 2)
    with pytest.raises(ValueError, match="H_kv"):
        mring.simulate_ring(16, 2, 4, 8, H_kv=3)
    with pytest.raises(ValueError, match="divide"):
        mring.ulysses_closed_form(16, 8, 4, 8)


# ---------------------------------------------------------------------------------
# Blocks and the merge.
# ---------------------------------------------------------------------------------


def test_merging_blocks_in_any_order_is_exact():
    rng = np.random.default_rng(0)
    q, k, v = (
        rng.standard_normal((5, 8)),
        rng.standard_normal((23, 8)),
        rng.standard_normal((23, 3)),
    )
    ref = core.scaled_dot_product_attention(q, k, v)
    parts = [
        ring.block_attention(q, k[s:e], v[s:e]) for s, e in ring.chunk_bounds(23, 4)
    ]
    for order in ([0, 1, 2, 3], [3, 1, 0, 2]):
        o, lse = parts[order[0]]
        for i in order[1:]:
            o, lse = core.merge_partials([o, parts[i][0]], [lse, parts[i][1]])
        np.testing.assert_allclose(o, ref, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(
            lse, core.logsumexp(q @ k.T / np.sqrt(8)), rtol=1e-12
        )


def test_merge_rules_for_empty_and_nan_parts():
    o = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    lse = np.array([0.5, -np.inf, np.nan])
    junk = np.full((3, 2), 7.0)  # an empty part's o is never read
    m_o, m_lse = core.merge_partials([junk, o], [np.full(3, -np.inf), lse])
    np.testing.assert_array_equal(m_o[0], o[0])
    assert m_lse[0] == 0.5
    np.testing.assert_array_equal(m_o[1], [0.0, 0.0])  # both empty: 0, -inf
    assert np.isneginf(m_lse[1])
    assert np.isnan(m_o[2]).all() and np.isnan(m_lse[2])  # NaN stays NaN


def test_block_with_no_visible_key_gives_zero_and_minus_inf():
    rng = np.random.default_rng(1)
    q, k, v = (
        rng.standard_normal((3, 4)),
        rng.standard_normal((5, 4)),
        rng.standard_normal((5, 4)),
    )
    o, lse = ring.block_attention(q, k, v, np.arange(3), np.arange(10, 15), causal=True)
    assert (o == 0).all() and np.isneginf(lse).all()


def test_nan_reaches_only_the_rows_that_see_it():
    rng = np.random.default_rng(2)
    N, P = 12, 3
    q, k, v = (rng.standard_normal((1, 1, N, 4)) for _ in range(3))
    v[..., 7, :] = np.nan  # key 7: visible to queries 7..11 only (causal)
    q[..., 2, 0] = np.nan  # query 2: its own row
    for layout in ring.LAYOUTS:
        o, lse = ring.ring_attention_numpy(q, k, v, P, True, layout, return_lse=True)
        bad = np.isnan(o[0, 0]).any(-1)
        assert bad.tolist() == [i == 2 or i >= 7 for i in range(N)], layout
        assert np.isnan(lse[0, 0]).tolist() == [i == 2 for i in range(N)]


# ---------------------------------------------------------------------------------
# Ring attention equals attention.
# ---------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ring.LAYOUTS)
@pytest.mark.parametrize("causal", [False, True])
def test_ring_attention_is_exact(layout, causal):
    rng = np.random.default_rng(3)
    for _ in range(6):
        P = int(rng.integers(1, 7))
        N = int(rng.integers(1, 50))
        H_kv = int(rng.choice([1, 2]))
        H = H_kv * int(rng.integers(1, 3))
        d = int(rng.integers(1, 17))
        q, k, v = _qkv(rng, 2, H, H_kv, N, d)
        o, lse = ring.ring_attention_numpy(q, k, v, P, causal, layout, return_lse=True)
        ref = _reference(q, k, v, causal)
        np.testing.assert_allclose(o, ref, rtol=1e-12, atol=1e-12)
        s = q @ np.repeat(k, H // H_kv, 1).swapaxes(-1, -2) / np.sqrt(d)
        if causal:
            s = np.where(core.causal_mask(N), s, -np.inf)
        np.testing.assert_allclose(lse, core.logsumexp(s), rtol=1e-12)


def test_ring_holds_rotates_by_one_device_per_step():
    h = ring.ring_holds(5)
    assert h[0].tolist() == list(range(5))
    for t in range(4):
        np.testing.assert_array_equal(h[t + 1], np.roll(h[t], 1))
    assert all(sorted(col) == list(range(5)) for col in h.T)  # each sees every shard


# ---------------------------------------------------------------------------------
# Causal work.
# ---------------------------------------------------------------------------------


def test_causal_work_contiguous_and_zigzag():
    N, P = 64, 4
    n = N // P
    w = ring.work_matrix(N, P, "contiguous", True)
    assert (w[0] == n * (n + 1) // 2).all()  # the diagonal blocks
    for t in range(1, P):  # device r has work only for shards <= r
        assert w[t].tolist() == [n * n if r >= t else 0 for r in range(P)]
    assert w.sum() == N * (N + 1) // 2
    z = ring.work_matrix(N, P, "zigzag", True)
    assert z.sum() == N * (N + 1) // 2
    assert (z[1:] == z[1, 0]).all() and z[1, 0] == n * n // 2  # balanced
    assert ring.idle_fraction(z[1:]) == 0
    # contiguous: steps 1..P-1 have P-1, ..., 1 busy devices, exactly half idle; with
    # the diagonal step the idle share is (P-1)/(2P-1) as n grows (3/7 at P = 4)
    assert ring.idle_fraction(w[1:]) == 0.5
    big = ring.work_matrix(4096, P, "contiguous", True)
    assert ring.idle_fraction(big) == pytest.approx((P - 1) / (2 * P - 1), rel=1e-3)
    assert ring.idle_fraction(ring.work_matrix(N, P, "contiguous", False)) == 0


# ---------------------------------------------------------------------------------
# The communication model: simulator == closed forms, exactly.
# ---------------------------------------------------------------------------------


def test_ring_simulator_equals_closed_form():
    rng = np.random.default_rng(4)
    for _ in range(150):
        P, N = int(rng.integers(1, 10)), int(rng.integers(1, 300))
        H_kv = int(rng.choice([1, 2, 4]))
        H, d, B = (
            H_kv * int(rng.integers(1, 4)),
            int(rng.integers(1, 200)),
            int(rng.integers(1, 3)),
        )
        layout, causal = str(rng.choice(ring.LAYOUTS)), bool(rng.integers(2))
        sim = mring.simulate_ring(N, P, H, d, H_kv, B, causal, layout)
        closed = mring.ring_closed_form(N, P, H, d, H_kv, B, causal, layout)
        assert sim == closed, (N, P, H, H_kv, d, B, causal, layout)
        np.testing.assert_array_equal(sim.pairs, ring.work_matrix(N, P, layout, causal))


def test_ring_volume_and_flops_formulas():
    N, P, H, H_kv, d = 4096, 8, 16, 4, 64
    c = mring.ring_closed_form(N, P, H, d, H_kv)
    n = N // P
    assert (c.sent[:-1] == 2 * n * H_kv * d).all() and (c.sent[-1] == 0).all()
    assert c.sent.sum() == c.received.sum() == (P - 1) * P * 2 * n * H_kv * d
    assert (c.flops == 4 * n * n * H * d).all()
    assert c.flops.sum() == core.attention_flops(N, N, d) * H
    cz = mring.ring_closed_form(N, P, H, d, H_kv, causal=True, layout="zigzag")
    assert cz.pairs.sum() == N * (N + 1) // 2


def test_ulysses_simulator_equals_closed_form():
    rng = np.random.default_rng(5)
    for _ in range(60):
        P = int(rng.choice([1, 2, 4, 8]))
        H_kv = P * int(rng.integers(1, 3))
        H = H_kv * int(rng.integers(1, 3))
        N, d, B = (
            int(rng.integers(1, 500)),
            int(rng.integers(1, 129)),
            int(rng.integers(1, 3)),
        )
        sim = mring.simulate_ulysses(N, P, H, d, H_kv, B)
        closed = mring.ulysses_closed_form(N, P, H, d, H_kv, B)
        for key in sim:
            np.testing.assert_array_equal(sim[key], closed[key])
        assert sim["sent"].sum() == sim["received"].sum()


def test_overlap_threshold_is_where_compute_meets_transfer():
    for link in mring.LINKS:
        for H, H_kv in ((32, 32), (32, 8)):
            n = mring.overlap_threshold("H100", link, "bfloat16", H, H_kv)
            F = mring.peak_flops("H100", "bfloat16")
            compute = 4 * n * n * H * 128 / F
            transfer = 2 * n * H_kv * 128 * 2 / (mring.LINKS[link].gbps * 1e9)
            assert compute == pytest.approx(transfer, rel=1e-12)
    # NVLink 4: 450 GB/s per direction; n* = b F / (2 BW) for MHA
    assert mring.overlap_threshold("H100", "NVLink 4", "bfloat16", 8) == pytest.approx(
        2 * 989.4e12 / (2 * 450e9)
    )


def test_ring_times_hide_transfer_above_the_threshold():
    n_star = mring.overlap_threshold("H100", "PCIe 5 x16", "bfloat16", 8)
    for n, hidden in ((int(n_star) // 2, False), (int(n_star) * 2, True)):
        c = mring.ring_closed_form(4 * n, 4, 8, 64)
        t = mring.ring_times(c, "H100", "PCIe 5 x16", "bfloat16")
        assert (t["hidden"] == 1.0) is hidden
        assert t["total_s"] <= t["serial_s"]


def test_memory_per_device():
    N, P, H, H_kv, d = 8192, 4, 8, 8, 64
    n = N // P
    assert (
        mring.memory_per_device(N, P, H, d, H_kv)
        == n * d * (2 * H + 6 * H_kv) * 2 + H * n * 4
    )
    with pytest.raises(ValueError, match="scheme"):
        mring.memory_per_device(N, P, H, d, scheme="tree")


def test_load_balance_draws_one_collection_not_two_patches_per_cell():
    """Issue 33: the live explorer redraws P = 32 at once; the cells are one collection
    (shaded by the work) and one hatched path, not 2 P^2 patches; the heights are the
    closed form's work over each step's busiest device."""
    from attention.plots import ring as rp

    N, P = 1 << 20, 32
    (ax,) = rp.load_balance_figure(N, P, layouts=("zigzag",), causal=True)
    assert len(ax.collections) == 1 and len(ax.patches) == 1
    work = mring.pairs_matrix(N, P, "zigzag", True)
    cells = ax.collections[0].get_paths()
    assert len(cells) == P * P
    heights = np.array([np.ptp(c.vertices[:, 1]) for c in cells]).reshape(P, P)
    np.testing.assert_allclose(heights, 0.9 * work / work.max(axis=1, keepdims=True))
    # 32 labels a side ran together: every fourth one is labelled
    assert [t.get_text() for t in ax.get_xticklabels()] == [
        str(r) for r in range(0, 32, 4)
    ]
    plt.close(ax.figure)


def test_the_live_faces_legend_lies_inside_its_canvas():
    """The live face's picture is cut to its drawn pixels in one draw: its legend sits
    inside the canvas, under the panel, clear of the device labels."""
    from attention.explorers.ring import work_figure

    fig = work_figure(1 << 14, 32, "zigzag", True)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    legend = fig.legends[0].get_window_extent(renderer)
    w, h = fig.canvas.get_width_height()
    assert 0 <= legend.x0 and legend.x1 <= w and 0 <= legend.y0
    (ax,) = fig.axes
    assert legend.y1 < ax.get_tightbbox(renderer).y0
    plt.close(fig)


def test_figures_draw():
    from attention.plots import ring as rp

    rp.ring_schedule_figure(4, causal=True, layout="contiguous")
    axes = rp.load_balance_figure(32, 4)
    assert "idle" in axes[0].get_title()
    rp.overlap_figure()
    spans = [
        {
            "rank": r,
            "step": s,
            "kind": kind,
            "start": s + r * 0.1 + o,
            "end": s + r * 0.1 + o + 0.4,
        }
        for r in range(2)
        for s in range(2)
        for kind, o in (("compute", 0.0), ("send", 0.0), ("wait", 0.4))
    ]
    ax = rp.timeline_figure(spans, title="CPU run")
    assert len(ax.get_yticks()) == 2
    with pytest.raises(ValueError, match="empty"):
        rp.timeline_figure([])
    import matplotlib.pyplot as plt

    plt.close("all")
