"""Chapter 6's backward communication and all-gather context parallelism: the
backward ring's simulator against its closed form (exact integers), the byte, FLOP and
crossover ratios from the counts, the final dK/dV hop, all-gather's volume against the
ring's, and the NumPy all-gather forward and backward against dense fp64 attention."""

from __future__ import annotations

import numpy as np
import pytest

from attention import core, flash, ring
from attention.memory import ring as mring


@pytest.mark.parametrize("seed", range(6))
def test_backward_simulator_equals_closed_form(seed):
    rng = np.random.default_rng(seed)
    P = int(rng.integers(1, 7))
    N = int(rng.integers(2 * P, 70))
    H_kv = int(rng.choice([1, 2]))
    H = H_kv * int(rng.integers(1, 4))
    cfg = dict(
        N=N, P=P, H=H, d=int(rng.integers(1, 9)), H_kv=H_kv,
        B=int(rng.integers(1, 3)), causal=bool(rng.integers(2)),
        layout=str(rng.choice(ring.LAYOUTS)),
    )  # fmt: skip
    assert mring.simulate_ring_backward(**cfg) == mring.ring_backward_closed_form(**cfg)


def test_backward_moves_three_times_the_bytes_for_two_and_a_half_the_flops():
    cfg = dict(N=4096, P=8, H=32, d=128, H_kv=8, causal=True, layout="zigzag")
    fwd, bwd = mring.ring_closed_form(**cfg), mring.ring_backward_closed_form(**cfg)
    b = mring.DTYPE_BYTES["bfloat16"]
    fwd_bytes = fwd.received.sum() * b
    steps = slice(0, cfg["P"] - 1)  # the steps with K/V in flight
    bwd_bytes = (bwd.kv_received[steps] * b + bwd.dkv_received[steps] * 4).sum()
    assert bwd_bytes == 3 * fwd_bytes  # (2 + 4) / 2
    assert bwd.flops.sum() * 2 == 5 * fwd.flops.sum()  # 10 / 4
    # the last step moves no K/V but brings each device its own finished dK/dV
    assert not bwd.kv_received[-1].any()
    np.testing.assert_array_equal(
        bwd.dkv_received[-1], bwd.shard_len * 2 * cfg["H_kv"] * cfg["d"]
    )
    for link in mring.LINKS:
        f = mring.pass_threshold("H100", link, "bfloat16", 32, 8)
        g = mring.pass_threshold("H100", link, "bfloat16", 32, 8, backward=True)
        assert g == pytest.approx(1.2 * f, rel=1e-12)
        assert f == mring.overlap_threshold("H100", link, "bfloat16", 32, 8)


def test_allgather_volume_against_the_ring():
    cfg = dict(N=4099, P=8, H=64, d=128, H_kv=8)
    ag = mring.allgather_closed_form(**cfg)
    fwd = mring.ring_closed_form(**cfg)
    bwd = mring.ring_backward_closed_form(**cfg)
    np.testing.assert_array_equal(ag["kv_received"], fwd.received.sum(axis=0))
    own = fwd.shard_len * 2 * cfg["H_kv"] * cfg["d"]  # the ring's extra final hop
    np.testing.assert_array_equal(ag["dkv_received"] + own, bwd.dkv_received.sum(0))
    # GQA 64 / 8: all of K/V is a quarter of Q's size for every token
    assert (ag["kv_held"] * 4 == cfg["N"] * cfg["H"] * cfg["d"]).all()


def test_backward_simulator_is_size_guarded():
    with pytest.raises(ValueError, match="ring_backward_closed_form"):
        mring.simulate_ring_backward(2**22, 8, 1, 1)
    with pytest.raises(TypeError, match="backward"):
        mring.step_bytes("bfloat16", backward=1)


def _dense(q, k, v, do, causal):
    rep = q.shape[-3] // k.shape[-3]
    kk, vv = np.repeat(k, rep, -3), np.repeat(v, rep, -3)
    o = core.scaled_dot_product_attention(q, kk, vv, causal=causal)
    s = q @ np.swapaxes(kk, -1, -2) / np.sqrt(q.shape[-1])
    mask = core.causal_mask(q.shape[-2]) if causal else None
    p = core.softmax(s, mask=mask)
    dq, dk, dv = flash.standard_backward(q, kk, vv, p, do)
    fold = (*k.shape[:-3], k.shape[-3], rep, *k.shape[-2:])
    return o, dq, dk.reshape(fold).sum(-3), dv.reshape(fold).sum(-3)


@pytest.mark.parametrize("layout", ring.LAYOUTS)
@pytest.mark.parametrize(
    "N,P,H,H_kv,causal", [(22, 4, 2, 2, True), (13, 3, 4, 2, True), (9, 2, 2, 1, False)]
)
def test_allgather_forward_and_backward_equal_dense_fp64(layout, N, P, H, H_kv, causal):
    rng = np.random.default_rng(N * P)
    q = rng.standard_normal((2, H, N, 8))
    k, v = rng.standard_normal((2, 2, H_kv, N, 8))
    do = rng.standard_normal((2, H, N, 8))
    o_ref, *grads_ref = _dense(q, k, v, do, causal)
    o, lse = ring.allgather_attention_numpy(q, k, v, P, causal, layout, return_lse=True)
    np.testing.assert_allclose(o, o_ref, rtol=1e-12, atol=1e-12)
    _, lse_ring = ring.ring_attention_numpy(q, k, v, P, causal, layout, return_lse=True)
    np.testing.assert_allclose(lse, lse_ring, rtol=1e-12, atol=1e-12)
    grads = ring.allgather_attention_backward_numpy(q, k, v, do, P, causal, layout)
    for got, want in zip(grads, grads_ref):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


def test_allgather_bad_arguments():
    x = np.ones((4, 2))
    with pytest.raises(ValueError, match="same length"):
        ring.allgather_attention_numpy(x, np.ones((5, 2)), np.ones((5, 2)), 2)
    with pytest.raises(ValueError, match="do"):
        ring.allgather_attention_backward_numpy(x, x, x, np.ones((3, 2)), 2)
    with pytest.raises(ValueError, match="layout"):
        ring.allgather_attention_numpy(x, x, x, 2, layout="diagonal")


def test_collective_pictures_move_the_right_chunks():
    from attention.plots import collectives

    P = 4
    b, a, _ = collectives._collective_cells("all-to-all", P)
    assert all(a[(j, r)][1] == b[(r, j)][1] for r in range(P) for j in range(P))
    b, a, _ = collectives._collective_cells("send/recv", P)
    assert [a[(r, 0)][1] for r in range(P)] == [
        b[((r - 1) % P, 0)][1] for r in range(P)
    ]
    b, a, _ = collectives._collective_cells("reduce-scatter", P)
    assert sorted(a) == [(r, r) for r in range(P)] and len(b) == P * P
    with pytest.raises(ValueError, match="kind"):
        collectives._collective_cells("broadcast", P)
    with pytest.raises(ValueError, match="divide"):
        collectives.ulysses_figure(P=4, H=6)


def test_chapter_6_figures_draw():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from attention.plots import collectives
    from attention.plots import ring as ring_plots

    collectives.collectives_figure()
    collectives.layouts_figure()
    collectives.ulysses_figure()
    ax = ring_plots.ring_schedule_figure(P=3, N=12, causal=True)
    assert len(ax.patches) == 3 * 3 + 2 * 3  # compute boxes and the sends under them
    plt.close("all")
