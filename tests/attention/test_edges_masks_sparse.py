"""Issue 50, the NumPy side: the edges of attention.masks, attention.sparse*,
attention.memory.{sparse,serving}, the sparse explorer and MiniLM. Each test is
written from a case the issue describes; each refusal names the argument."""

import numpy as np

from attention import masks as M

# ---------------------------------------------------------------------------------
# 1. Hidden keys reach nothing: an inf in v at a key a row cannot see
# ---------------------------------------------------------------------------------


def test_an_inf_value_at_a_hidden_key_reaches_no_row():
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 2, 6, 4)) for _ in range(3))
    v[0, :, 4, 1] = np.inf  # key 4: hidden from rows 0..3 under causal
    v[0, :, 5, 2] = -np.inf
    o, lse = M.masked_attention(q, k, v, M.causal_mask)
    clean = v.copy()
    clean[0, :, 4:] = 0.0
    want, want_lse = M.masked_attention(q[:, :, :4], k[:, :, :4], clean[:, :, :4],
                                        M.causal_mask)  # fmt: skip
    np.testing.assert_allclose(o[:, :, :4], want, rtol=1e-13)
    np.testing.assert_allclose(lse[:, :, :4], want_lse, rtol=1e-13)
    # the rows that see the inf get it (p > 0 times inf), the others stay finite
    assert np.isposinf(o[0, :, 4, 1]).all() and np.isposinf(o[0, :, 5, 1]).all()
    assert np.isneginf(o[0, :, 5, 2]).all() and np.isfinite(o[0, :, 4, 2]).all()
    # a bool-array mask and a window: the same rule
    vis = np.tril(np.ones((6, 6), bool))
    o2, _ = M.masked_attention(q, k, v, vis)
    np.testing.assert_array_equal(o2, o)
    o3, _ = M.masked_attention(q, k, v, M.sliding_window(1))  # only the own key
    np.testing.assert_allclose(o3[0, :, :4], v[0, :, :4], rtol=1e-13)


def test_a_visible_inf_and_minus_inf_in_one_column_give_nan_a_nan_stays():
    q = np.zeros((1, 1, 2, 2))
    k = np.zeros((1, 1, 2, 2))
    v = np.array([[[[np.inf, np.nan], [-np.inf, 1.0]]]])
    o, _ = M.masked_attention(q, k, v, M.causal_mask)
    assert np.isposinf(o[0, 0, 0, 0]) and np.isnan(o[0, 0, 0, 1])
    assert np.isnan(o[0, 0, 1]).all()  # inf - inf, and the NaN value it sees
