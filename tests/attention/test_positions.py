"""attention.positions: the sinusoidal table and RoPE, whose rotated scores depend on
the query and key positions only through their offset."""

from __future__ import annotations

import numpy as np
import pytest

from attention import positions

pytestmark = pytest.mark.xdist_group("positions")


def test_sinusoidal_table_is_the_papers_formula():
    pe = positions.sinusoidal_table(50, 16)
    assert pe.shape == (50, 16)
    for t in (0, 7, 49):
        for i in range(8):
            w = 10000.0 ** (-2 * i / 16)
            assert pe[t, 2 * i] == pytest.approx(np.sin(t * w), abs=1e-15)
            assert pe[t, 2 * i + 1] == pytest.approx(np.cos(t * w), abs=1e-15)
    # each (sin, cos) pair is a point on the unit circle
    np.testing.assert_allclose(pe[:, 0::2] ** 2 + pe[:, 1::2] ** 2, 1.0, atol=1e-15)


@pytest.mark.parametrize("d", [2, 8, 64])
def test_rope_is_a_rotation_of_each_pair(d):
    rng = np.random.default_rng(d)
    x = rng.standard_normal((3, 11, d))  # (B, N, d)
    pos = rng.uniform(-50, 500, 11)
    r = positions.rope(x, pos)
    assert r.shape == x.shape
    np.testing.assert_allclose(
        r[..., 0::2] ** 2 + r[..., 1::2] ** 2,
        x[..., 0::2] ** 2 + x[..., 1::2] ** 2,
        rtol=1e-12,
    )
    np.testing.assert_array_equal(positions.rope(x, np.zeros(11)), x)  # position 0
    back = positions.rope(r, -pos)  # R_(-t) R_t = I
    np.testing.assert_allclose(back, x, atol=1e-12)
    np.testing.assert_array_equal(positions.rope(x), positions.rope(x, np.arange(11.0)))


@pytest.mark.parametrize("d", [4, 32, 128])
def test_rope_scores_depend_only_on_the_offset(d):
    rng = np.random.default_rng(100 + d)
    q, k = rng.standard_normal(d), rng.standard_normal(d)
    m = rng.integers(0, 4096, 200).astype(float)
    n = rng.integers(0, 4096, 200).astype(float)
    shift = rng.integers(-1000, 1000, 200).astype(float)
    s = positions.rope_score(q, k, m, n)
    # the same offset at other absolute positions gives the same score
    np.testing.assert_allclose(
        positions.rope_score(q, k, m + shift, n + shift), s, rtol=1e-9, atol=1e-9
    )
    # and it is q^T R_(n - m) k, computed pair by pair with the offset alone
    theta = 10000.0 ** (-np.arange(0, d, 2) / d)
    a = (n - m)[:, None] * theta  # (P, d / 2)
    q1, q2, k1, k2 = q[0::2], q[1::2], k[0::2], k[1::2]
    direct = ((q1 * k1 + q2 * k2) * np.cos(a) + (q2 * k1 - q1 * k2) * np.sin(a)).sum(-1)
    np.testing.assert_allclose(s, direct, rtol=1e-9, atol=1e-9)
    # at offset 0 it is the unrotated dot product
    np.testing.assert_allclose(positions.rope_score(q, k, m, m), q @ k, rtol=1e-9)


def test_bad_arguments_raise_naming_them():
    with pytest.raises(ValueError, match="even"):
        positions.rope(np.ones((4, 3)))
    with pytest.raises(ValueError, match="positions"):
        positions.rope(np.ones((4, 2)), np.arange(3))
    with pytest.raises(ValueError, match="d must be even"):
        positions.sinusoidal_table(4, 5)
    with pytest.raises(ValueError, match="base"):
        positions.frequencies(4, base=1)
    with pytest.raises(ValueError, match="q and k"):
        positions.rope_score(np.ones(4), np.ones(6), 0, 1)
    with pytest.raises((TypeError, ValueError), match="n_positions"):
        positions.sinusoidal_table(0, 4)
