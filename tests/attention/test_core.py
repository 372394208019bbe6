"""attention/core.py against fp64 definitions written out here and against PyTorch."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from attention import core

pytestmark = pytest.mark.xdist_group("ch1_core")

RNG_SEED = 1234


@pytest.fixture
def rng():
    return np.random.default_rng(RNG_SEED)


def ref_attention(q, k, v, keep=None, scale=None):
    """fp64 attention by the definition, one query row at a time
    (no shared code with core)."""
    q, k, v = (np.asarray(t, dtype=np.float64) for t in (q, k, v))
    *batch, n_q, d = q.shape
    n_k = k.shape[-2]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    keep = np.ones((n_q, n_k), bool) if keep is None else keep
    keep = np.broadcast_to(keep, (*batch, n_q, n_k))
    o = np.zeros((*batch, n_q, v.shape[-1]))
    p = np.zeros((*batch, n_q, n_k))
    for idx in np.ndindex(*batch):
        for i in range(n_q):
            cols = np.flatnonzero(keep[idx][i])
            if cols.size == 0:
                continue  # fully masked row: weights 0, output 0
            s = np.array([scale * float(q[idx][i] @ k[idx][j]) for j in cols])
            w = np.exp(s - s.max())
            w /= w.sum()
            p[idx][i, cols] = w
            o[idx][i] = w @ v[idx][cols]
    return o, p


def torch_sdpa(q, k, v, keep=None, scale=None):
    """PyTorch's reference in fp64 (boolean attn_mask: True = may attend)."""
    t = [torch.from_numpy(np.asarray(x, dtype=np.float64)) for x in (q, k, v)]
    mask = None if keep is None else torch.from_numpy(np.ascontiguousarray(keep))
    return F.scaled_dot_product_attention(*t, attn_mask=mask, scale=scale).numpy()


# ------------------------------------------------------------------------------ softmax


def test_softmax_matches_definition_and_torch(rng):
    x = rng.normal(size=(3, 5, 7)) * 4
    e = np.exp(x)
    want = e / e.sum(-1, keepdims=True)
    np.testing.assert_allclose(core.softmax(x), want, rtol=1e-12)
    np.testing.assert_allclose(
        core.softmax(x), torch.softmax(torch.from_numpy(x), -1).numpy(), rtol=1e-12
    )
    np.testing.assert_allclose(
        core.softmax(x, axis=0), torch.softmax(torch.from_numpy(x), 0), rtol=1e-12
    )
    np.testing.assert_allclose(core.softmax(x).sum(-1), 1.0, rtol=1e-12)


def test_softmax_is_shift_invariant(rng):
    x = rng.normal(size=(4, 9))
    np.testing.assert_allclose(core.softmax(x + 123.0), core.softmax(x), rtol=1e-10)


def test_naive_softmax_overflows_stable_does_not():
    x = np.array([[10.0, 50.0, 100.0], [1000.0, 1001.0, 1002.0]], dtype=np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        naive = core.naive_softmax(x)
    assert np.isnan(naive).any(), (
        "exp(100) overflows float32, so the naive softmax gives inf/inf"
    )
    stable = core.softmax(x)
    assert stable.dtype == np.float32
    assert np.isfinite(stable).all()
    want = torch.softmax(torch.tensor(x, dtype=torch.float64), -1).numpy()
    np.testing.assert_allclose(stable, want, rtol=1e-6, atol=1e-7)
    # Largest exponent is exactly exp(0) = 1 after subtracting the max.
    e = np.exp([-2.0, -1.0, 0.0])
    np.testing.assert_allclose(stable[1], e / e.sum(), rtol=1e-6)


def test_naive_softmax_agrees_where_it_does_not_overflow(rng):
    x = rng.normal(size=(6, 8))
    np.testing.assert_allclose(core.naive_softmax(x), core.softmax(x), rtol=1e-12)


def test_softmax_mask_and_fully_masked_row():
    x = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = np.array([[True, False, True], [False, False, False]])
    p = core.softmax(x, mask=mask)
    e = np.exp([1.0, 3.0])
    np.testing.assert_allclose(p[0], [e[0] / e.sum(), 0.0, e[1] / e.sum()], rtol=1e-12)
    np.testing.assert_array_equal(p[1], 0.0)
    assert not np.isnan(p).any()


def test_logsumexp(rng):
    x = rng.normal(size=(3, 11)) * 50
    want = torch.logsumexp(torch.from_numpy(x), -1).numpy()
    np.testing.assert_allclose(core.logsumexp(x), want, rtol=1e-12)
    big = np.array([1000.0, 1000.0])
    np.testing.assert_allclose(core.logsumexp(big), 1000.0 + np.log(2.0), rtol=1e-12)
    assert core.logsumexp(np.full(4, -np.inf)) == -np.inf


# -------------------------------------------------------------------------------- masks


@pytest.mark.parametrize("n_q,n_k", [(5, 5), (3, 7), (7, 3), (1, 4), (4, 1)])
def test_causal_mask_is_bottom_right(n_q, n_k):
    m = core.causal_mask(n_q, n_k)
    assert m.shape == (n_q, n_k) and m.dtype == bool
    for i in range(n_q):
        for j in range(n_k):
            # The last query sees every key; each earlier query one key fewer.
            assert m[i, j] == (j <= i + n_k - n_q)
    assert m[-1].all()
    # PyTorch's is_causal is top-left; bottom-right is its flip for the non-square case.
    tl = torch.ones(n_q, n_k, dtype=torch.bool).tril(diagonal=n_k - n_q).numpy()
    np.testing.assert_array_equal(m, tl)
    if n_q == n_k:
        np.testing.assert_array_equal(m, np.tril(np.ones((n_q, n_q), bool)))


def test_causal_mask_default_square():
    np.testing.assert_array_equal(core.causal_mask(4), np.tril(np.ones((4, 4), bool)))


def test_padding_mask():
    m = core.padding_mask([3, 1, 0], 4)
    assert m.shape == (3, 1, 4)
    np.testing.assert_array_equal(m[:, 0], [[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]])


# ---------------------------------------------------------------------------- attention


@pytest.mark.parametrize(
    "shape_q,shape_k,d_v",
    [
        ((7, 8), (7, 8), 8),  # self, single head
        ((3, 16), (11, 16), 5),  # cross, d_v != d
        ((2, 3, 13, 8), (2, 3, 9, 8), 8),  # (B, H, N_q, d) vs (B, H, N_k, d)
    ],
)
def test_sdpa_matches_reference_and_torch(rng, shape_q, shape_k, d_v):
    q = rng.normal(size=shape_q)
    k = rng.normal(size=shape_k)
    v = rng.normal(size=(*shape_k[:-1], d_v))
    o, p = core.scaled_dot_product_attention(q, k, v, return_weights=True)
    assert o.shape == (*shape_q[:-1], d_v)
    assert p.shape == (*shape_q[:-1], shape_k[-2])
    o_ref, p_ref = ref_attention(q, k, v)
    np.testing.assert_allclose(o, o_ref, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(p, p_ref, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(o, torch_sdpa(q, k, v), rtol=1e-10, atol=1e-12)


def test_scale_default_and_explicit(rng):
    q, k, v = (rng.normal(size=(5, 32)) for _ in range(3))
    o_default = core.scaled_dot_product_attention(q, k, v)
    o_explicit = core.scaled_dot_product_attention(q, k, v, scale=1 / math.sqrt(32))
    np.testing.assert_allclose(o_default, o_explicit, rtol=1e-14)
    o_one = core.scaled_dot_product_attention(q, k, v, scale=1.0)
    np.testing.assert_allclose(o_one, ref_attention(q, k, v, scale=1.0)[0], rtol=1e-10)
    np.testing.assert_allclose(o_one, torch_sdpa(q, k, v, scale=1.0), rtol=1e-10)
    assert not np.allclose(o_one, o_default)


def test_float32_stays_float32(rng):
    q, k, v = (rng.normal(size=(2, 6, 16)).astype(np.float32) for _ in range(3))
    o = core.scaled_dot_product_attention(q, k, v, causal=True)
    assert o.dtype == np.float32
    np.testing.assert_allclose(
        o, ref_attention(q, k, v, core.causal_mask(6))[0], rtol=1e-5, atol=1e-6
    )


def test_large_scores_do_not_overflow(rng):
    q = rng.normal(size=(4, 8)) * 300  # scores of order 1e5
    k = rng.normal(size=(6, 8)) * 300
    v = rng.normal(size=(6, 8))
    o, p = core.scaled_dot_product_attention(q, k, v, return_weights=True)
    assert np.isfinite(o).all()
    np.testing.assert_allclose(p.sum(-1), 1.0, rtol=1e-12)
    np.testing.assert_allclose(o, torch_sdpa(q, k, v), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("n_q,n_k", [(6, 6), (4, 9), (9, 4)])
def test_causal_attention_bottom_right(rng, n_q, n_k):
    q = rng.normal(size=(2, 2, n_q, 8))
    k = rng.normal(size=(2, 2, n_k, 8))
    v = rng.normal(size=(2, 2, n_k, 8))
    keep = core.causal_mask(n_q, n_k)
    o, p = core.scaled_dot_product_attention(q, k, v, causal=True, return_weights=True)
    o_ref, p_ref = ref_attention(q, k, v, keep)
    np.testing.assert_allclose(o, o_ref, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(p, p_ref, rtol=1e-10, atol=1e-12)
    assert (p[..., ~keep] == 0).all()
    if n_q <= n_k:  # every row sees at least one key: PyTorch agrees
        np.testing.assert_allclose(o, torch_sdpa(q, k, v, keep), rtol=1e-10, atol=1e-12)
    else:  # the first n_q - n_k rows see nothing: output exactly 0, never NaN
        assert not np.isnan(o).any()
        np.testing.assert_array_equal(o[..., : n_q - n_k, :], 0.0)
        np.testing.assert_array_equal(p[..., : n_q - n_k, :], 0.0)
        rows = slice(n_q - n_k, None)
        np.testing.assert_allclose(
            o[..., rows, :],
            torch_sdpa(q[..., rows, :], k, v, keep[rows]),
            rtol=1e-10,
            atol=1e-12,
        )


def test_padding_mask_attention(rng):
    b, n, d = 3, 6, 8
    lengths = [6, 4, 1]
    q, k, v = (rng.normal(size=(b, n, d)) for _ in range(3))
    keep = core.padding_mask(lengths, n)  # (B, 1, n)
    o, p = core.scaled_dot_product_attention(q, k, v, mask=keep, return_weights=True)
    for bi, length in enumerate(lengths):
        np.testing.assert_array_equal(p[bi, :, length:], 0.0)
        o_ref, _ = ref_attention(q[bi], k[bi, :length], v[bi, :length])
        np.testing.assert_allclose(o[bi], o_ref, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(
        o, torch_sdpa(q, k, v, np.broadcast_to(keep, (b, n, n))), rtol=1e-10, atol=1e-12
    )


def test_padding_and_causal_combine(rng):
    b, n, d = 2, 5, 4
    q, k, v = (rng.normal(size=(b, n, d)) for _ in range(3))
    pad = core.padding_mask([5, 3], n)
    o = core.scaled_dot_product_attention(q, k, v, mask=pad, causal=True)
    keep = pad & core.causal_mask(n)  # (B, n, n)
    np.testing.assert_allclose(
        o, ref_attention(q, k, v, keep)[0], rtol=1e-10, atol=1e-12
    )


def test_fully_masked_rows_are_zero_not_nan(rng):
    q, k, v = (rng.normal(size=(4, 8)) for _ in range(3))
    keep = np.ones((4, 4), bool)
    keep[1] = False
    keep[3] = False
    o, p = core.scaled_dot_product_attention(q, k, v, mask=keep, return_weights=True)
    assert not np.isnan(o).any() and not np.isnan(p).any()
    np.testing.assert_array_equal(o[[1, 3]], 0.0)
    np.testing.assert_array_equal(p[[1, 3]], 0.0)
    o_all = core.scaled_dot_product_attention(q, k, v, mask=np.zeros((4, 4), bool))
    np.testing.assert_array_equal(o_all, 0.0)


def test_sdpa_validates_shapes(rng):
    q = rng.normal(size=(4, 8))
    with pytest.raises(ValueError, match="head dim"):
        core.scaled_dot_product_attention(
            q, rng.normal(size=(4, 7)), rng.normal(size=(4, 8))
        )
    with pytest.raises(ValueError, match="same length"):
        core.scaled_dot_product_attention(
            q, rng.normal(size=(5, 8)), rng.normal(size=(4, 8))
        )
    with pytest.raises(ValueError, match="2-D"):
        core.scaled_dot_product_attention(np.ones(8), q, q)


# ------------------------------------------------------------------------- self / cross


def test_self_attention(rng):
    n, d_model, d = 7, 12, 4
    x = rng.normal(size=(n, d_model))
    w_q, w_k, w_v = (rng.normal(size=(d_model, d)) for _ in range(3))
    o, p = core.self_attention(x, w_q, w_k, w_v, return_weights=True)
    assert o.shape == (n, d) and p.shape == (n, n)
    o_ref, p_ref = ref_attention(x @ w_q, x @ w_k, x @ w_v)
    np.testing.assert_allclose(o, o_ref, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(p, p_ref, rtol=1e-10, atol=1e-12)
    oc = core.self_attention(x, w_q, w_k, w_v, causal=True)
    np.testing.assert_allclose(
        oc,
        ref_attention(x @ w_q, x @ w_k, x @ w_v, core.causal_mask(n))[0],
        rtol=1e-10,
        atol=1e-12,
    )
    # Causal: the first query sees only itself, so its output is its own value.
    np.testing.assert_allclose(oc[0], (x @ w_v)[0], rtol=1e-12)


def test_cross_attention(rng):
    m, n, d_model, d = 3, 8, 10, 6
    x_dec = rng.normal(size=(m, d_model))
    x_enc = rng.normal(size=(n, d_model))
    w_q, w_k, w_v = (rng.normal(size=(d_model, d)) for _ in range(3))
    o, p = core.cross_attention(x_dec, x_enc, w_q, w_k, w_v, return_weights=True)
    assert o.shape == (m, d) and p.shape == (m, n)
    o_ref, p_ref = ref_attention(x_dec @ w_q, x_enc @ w_k, x_enc @ w_v)
    np.testing.assert_allclose(o, o_ref, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(p, p_ref, rtol=1e-10, atol=1e-12)
    # Every output row is a convex combination of the encoder's values.
    np.testing.assert_allclose(p.sum(-1), 1.0, rtol=1e-12)
    keep = np.zeros((m, n), bool)
    keep[:, :5] = True
    o_pad = core.cross_attention(x_dec, x_enc, w_q, w_k, w_v, mask=keep)
    np.testing.assert_allclose(
        o_pad,
        ref_attention(x_dec @ w_q, x_enc @ w_k, x_enc @ w_v, keep)[0],
        rtol=1e-10,
        atol=1e-12,
    )


# --------------------------------------------------------------------------- multi-head


def test_split_merge_heads_roundtrip(rng):
    x = rng.normal(size=(2, 5, 12))
    h = core.split_heads(x, 3)
    assert h.shape == (2, 3, 5, 4)
    np.testing.assert_array_equal(h[:, 1], x[:, :, 4:8])  # head 1 owns columns 4..7
    np.testing.assert_array_equal(core.merge_heads(h), x)
    with pytest.raises(ValueError, match="n_heads"):
        core.split_heads(x, 5)


def _torch_mha(x_q, x_kv, w_q, w_k, w_v, w_o, n_heads, attn_mask=None):
    """torch.nn.MultiheadAttention (fp64) loaded with the same weights.

    PyTorch computes x @ W^T, so our (d_model, d_model) right-multiplied weights go in
    transposed; its attn_mask is True where attention is *not* allowed.
    """
    d_model = w_q.shape[0]
    mha = torch.nn.MultiheadAttention(
        d_model, n_heads, bias=False, batch_first=True, dtype=torch.float64
    )
    with torch.no_grad():
        mha.in_proj_weight.copy_(
            torch.from_numpy(np.concatenate([w_q.T, w_k.T, w_v.T]))
        )
        mha.out_proj.weight.copy_(torch.from_numpy(w_o.T))
    out, w = mha(
        torch.from_numpy(x_q),
        torch.from_numpy(x_kv),
        torch.from_numpy(x_kv),
        attn_mask=attn_mask,
        need_weights=True,
        average_attn_weights=False,
    )
    return out.detach().numpy(), w.detach().numpy()


@pytest.mark.parametrize("n_q,n_k", [(6, 6), (4, 9)])
def test_multi_head_matches_torch_mha(rng, n_q, n_k):
    b, d_model, h = 2, 16, 4
    x_q = rng.normal(size=(b, n_q, d_model))
    x_kv = x_q if n_q == n_k else rng.normal(size=(b, n_k, d_model))
    w_q, w_k, w_v, w_o = (rng.normal(size=(d_model, d_model)) / 4 for _ in range(4))
    out, p = core.multi_head_attention(
        x_q, x_kv, w_q, w_k, w_v, w_o, h, return_weights=True
    )
    assert out.shape == (b, n_q, d_model) and p.shape == (b, h, n_q, n_k)
    want, w_torch = _torch_mha(x_q, x_kv, w_q, w_k, w_v, w_o, h)
    np.testing.assert_allclose(out, want, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(p, w_torch, rtol=1e-9, atol=1e-12)


def test_multi_head_causal_and_padding(rng):
    b, n, d_model, h = 2, 5, 8, 2
    x = rng.normal(size=(b, n, d_model))
    w_q, w_k, w_v, w_o = (rng.normal(size=(d_model, d_model)) / 3 for _ in range(4))
    out = core.multi_head_attention(x, x, w_q, w_k, w_v, w_o, h, causal=True)
    want, _ = _torch_mha(
        x, x, w_q, w_k, w_v, w_o, h, attn_mask=~torch.from_numpy(core.causal_mask(n))
    )
    np.testing.assert_allclose(out, want, rtol=1e-9, atol=1e-12)
    # (B, 1, 1, n): broadcasts over heads and queries
    pad = core.padding_mask([5, 2], n)[:, None]
    out_pad, p = core.multi_head_attention(
        x, x, w_q, w_k, w_v, w_o, h, mask=pad, return_weights=True
    )
    assert (p[1, :, :, 2:] == 0).all()
    # Batch 1 with its padded keys dropped is the same as attending over its
    # first 2 keys only.
    o1 = core.multi_head_attention(x[1:], x[1:, :2], w_q, w_k, w_v, w_o, h)
    np.testing.assert_allclose(out_pad[1:], o1, rtol=1e-10, atol=1e-12)


def test_multi_head_is_per_head_sdpa(rng):
    b, n, d_model, h = 1, 4, 8, 2
    x = rng.normal(size=(b, n, d_model))
    w_q, w_k, w_v = (rng.normal(size=(d_model, d_model)) for _ in range(3))
    eye = np.eye(d_model)
    out = core.multi_head_attention(x, x, w_q, w_k, w_v, eye, h)
    d = d_model // h
    for head in range(h):
        cols = slice(head * d, (head + 1) * d)
        o_ref, _ = ref_attention(
            (x @ w_q)[0, :, cols], (x @ w_k)[0, :, cols], (x @ w_v)[0, :, cols]
        )
        np.testing.assert_allclose(out[0, :, cols], o_ref, rtol=1e-10, atol=1e-12)


def test_attention_flops():
    assert core.attention_flops(128, 256, 64) == 4 * 128 * 256 * 64
    assert core.attention_flops(128, 128, 64, causal=True) == 2 * 128 * 128 * 64


# -------------------------------------------------------------- no silent wrong answers


def test_nan_row_is_nan_never_the_empty_row():
    # item 1: a NaN gives a NaN row; a row with nothing visible gives 0 (and lse -inf)
    p = core.softmax(np.array([[1.0, np.nan, 0.0], [1.0, 2.0, 3.0]]))
    assert np.isnan(p[0]).all() and np.isfinite(p[1]).all()
    p = core.softmax(
        np.array([[1.0, np.nan, 0.0]]), mask=np.array([[True, False, True]])
    )
    assert np.isfinite(p).all()  # the NaN is hidden: the row is fine
    assert np.all(
        core.softmax(np.array([[1.0, 2.0]]), mask=np.zeros((1, 2), bool)) == 0
    )
    assert np.isnan(core.logsumexp(np.array([1.0, np.nan])))
    assert core.logsumexp(np.array([-np.inf, -np.inf])) == -np.inf
    assert core.logsumexp(np.zeros((2, 0))).tolist() == [-np.inf, -np.inf]
    q, k, v = (np.random.default_rng(0).normal(size=(6, 4)) for _ in range(3))
    q[2, 1] = np.nan
    o = core.scaled_dot_product_attention(q, k, v)
    assert np.isnan(o[2]).all() and np.isfinite(np.delete(o, 2, 0)).all()


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_causal_mask_shields_earlier_rows_from_hidden_value_rows(bad):
    # item 2: v[7] is seen by query 7 only; 0 * NaN must not reach queries 0..6
    rng = np.random.default_rng(1)
    q, k, v = (rng.normal(size=(8, 4)) for _ in range(3))
    v[7, 2] = bad
    o = core.scaled_dot_product_attention(q, k, v, causal=True)
    assert np.isfinite(o[:7]).all()
    assert not np.isfinite(o[7, 2]) and np.isfinite(np.delete(o[7], 2)).all()


@pytest.mark.parametrize(
    "call,exc",
    [
        (
            lambda: core.scaled_dot_product_attention(
                np.ones((4, 8)), np.ones((4, 8)), np.ones((4, 8)), causal="False"
            ),
            TypeError,
        ),
        (
            lambda: core.scaled_dot_product_attention(
                np.ones((4, 0)), np.ones((4, 0)), np.ones((4, 3))
            ),
            ValueError,
        ),  # d = 0
        (
            lambda: core.scaled_dot_product_attention(
                np.ones((2, 4, 8)), np.ones((3, 4, 8)), np.ones((3, 4, 8))
            ),
            ValueError,
        ),  # batch
        (
            lambda: core.scaled_dot_product_attention(
                np.ones((4, 8)), np.ones((4, 8)), np.ones((4, 8)), scale=np.inf
            ),
            ValueError,
        ),
        (
            lambda: core.scaled_dot_product_attention(
                np.ones((4, 8)), np.ones((4, 8)), np.ones((4, 8)), mask=np.ones((4, 4))
            ),
            TypeError,
        ),
        (
            lambda: core.scaled_dot_product_attention(
                np.ones((4, 8)),
                np.ones((4, 8)),
                np.ones((4, 8)),
                mask=np.ones((3, 4), bool),
            ),
            ValueError,
        ),
        (lambda: core.softmax(np.ones(3), axis=1), ValueError),
        (lambda: core.softmax(np.array(["a"])), TypeError),
        (lambda: core.causal_mask(2.5), TypeError),
        (lambda: core.split_heads(np.ones((1, 4, 8)), 3), ValueError),
        (lambda: core.split_heads(np.ones((4, 8)), 2), ValueError),
        (
            lambda: core.multi_head_attention(
                np.ones((1, 4, 8)), np.ones((2, 4, 8)), *[np.eye(8)] * 4, n_heads=2
            ),
            ValueError,
        ),
    ],
)
def test_bad_arguments_raise_clear_errors(call, exc):
    with pytest.raises(exc):
        call()
