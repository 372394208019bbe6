"""NumPy FlashAttention: online softmax,
FA1/FA2 forwards and the backwards, exact in fp64."""

import numpy as np
import pytest
import torch

from attention import core, flash

pytestmark = pytest.mark.xdist_group("memory_flash")

TOL = 1e-12


def _qkv(rng, lead, n_q, n_k, d, d_v=None, scale=1.0):
    q = rng.standard_normal((*lead, n_q, d)) * scale
    k = rng.standard_normal((*lead, n_k, d)) * scale
    v = rng.standard_normal((*lead, n_k, d_v or d))
    return q, k, v


def _close(a, b, tol=TOL):
    np.testing.assert_allclose(a, b, rtol=tol, atol=tol)


# ----------------------------------------------------------------------- online softmax


@pytest.mark.parametrize("block", [1, 3, 16, 1000])
def test_softmax_passes_equal_plain_softmax(block):
    rng = np.random.default_rng(0)
    # large logits: the max subtraction matters
    x = rng.standard_normal((4, 5, 37)) * 20
    ref = core.softmax(x)
    _close(flash.softmax_3pass(x, block), ref)
    _close(flash.softmax_2pass(x, block), ref)
    v = rng.standard_normal((4, 37, 6))
    _close(flash.softmax_1pass_attention(x, v, block), ref @ v)


def test_online_softmax_survives_overflow():
    x = np.array([[1000.0, 1001.0, 999.0]])
    assert np.all(np.isfinite(flash.softmax_2pass(x)))
    _close(flash.softmax_2pass(x), core.softmax(x))
    with pytest.raises(ValueError, match="block"):
        flash.softmax_3pass(x, block=0)
    with pytest.raises(ValueError, match="v must have"):
        flash.softmax_1pass_attention(x, np.ones((2, 2)))


# ------------------------------------------------------------------------------ forward


CASES = [  # lead, n_q, n_k, d, d_v, Br, Bc
    ((), 64, 64, 16, None, 16, 16),
    ((2, 3), 50, 50, 8, None, 16, 16),  # ragged last blocks
    ((2,), 37, 91, 12, 5, 8, 32),  # cross lengths, d_v != d
    ((1, 2), 91, 37, 12, None, 32, 8),  # more queries than keys (causal: empty rows)
    ((), 7, 5, 4, None, 64, 64),  # blocks larger than the sequence
    ((), 33, 33, 4, None, 1, 1),  # one element per tile
]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("lead,n_q,n_k,d,d_v,Br,Bc", CASES)
def test_flash_forwards_equal_standard(lead, n_q, n_k, d, d_v, Br, Bc, causal):
    rng = np.random.default_rng(n_q * 1000 + n_k)
    q, k, v = _qkv(rng, lead, n_q, n_k, d, d_v, scale=3.0)
    o_ref, lse_ref, _ = flash.standard_forward(q, k, v, causal=causal)
    _close(o_ref, core.scaled_dot_product_attention(q, k, v, causal=causal))
    for fwd in (flash.flash1_forward, flash.flash2_forward):
        o, lse = fwd(q, k, v, Br=Br, Bc=Bc, causal=causal)
        assert o.shape == o_ref.shape and lse.shape == lse_ref.shape
        assert not np.isnan(o).any()
        _close(o, o_ref)
        np.testing.assert_array_equal(np.isinf(lse), np.isinf(lse_ref))
        fin = np.isfinite(lse_ref)
        _close(lse[fin], lse_ref[fin])


def test_fully_masked_rows_are_zero_not_nan():
    rng = np.random.default_rng(1)
    # causal, 10 queries over 4 keys: rows 0..5 see nothing
    q, k, v = _qkv(rng, (), 10, 4, 8)
    for fwd in (flash.flash1_forward, flash.flash2_forward):
        o, lse = fwd(q, k, v, Br=4, Bc=2, causal=True)
        assert np.all(o[:6] == 0) and np.all(np.isneginf(lse[:6]))
        assert np.all(np.isfinite(lse[6:]))


def test_fp32_inputs_stay_fp32():
    rng = np.random.default_rng(2)
    q, k, v = (t.astype(np.float32) for t in _qkv(rng, (), 40, 40, 8))
    o, lse = flash.flash2_forward(q, k, v, Br=16, Bc=16)
    assert o.dtype == np.float32
    np.testing.assert_allclose(
        o, flash.standard_forward(q, k, v)[0], rtol=1e-5, atol=1e-6
    )


def test_bad_inputs_raise():
    q = np.zeros((4, 8))
    with pytest.raises(ValueError, match="head dim"):
        flash.flash2_forward(q, np.zeros((4, 7)), np.zeros((4, 7)))
    with pytest.raises(ValueError, match="same length"):
        flash.flash1_forward(q, np.zeros((4, 8)), np.zeros((5, 8)))
    with pytest.raises(ValueError, match="at least 2-D"):
        flash.flash2_forward(np.zeros(8), q, q)
    with pytest.raises(ValueError, match="Br"):
        flash.flash2_forward(q, q, q, Br=0)
    with pytest.raises(TypeError, match="floating"):
        flash.flash2_forward(q.astype(int), q, q)


# ----------------------------------------------------------------------------- backward


def _torch_grads(q, k, v, do, causal):
    tq, tk, tv = (torch.tensor(t, requires_grad=True) for t in (q, k, v))
    s = tq @ tk.transpose(-1, -2) / np.sqrt(q.shape[-1])
    if causal:
        keep = torch.tensor(core.causal_mask(q.shape[-2], k.shape[-2]))
        s = s.masked_fill(~keep, float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)  # fully masked rows: 0, as the kernels
    (p @ tv).backward(torch.tensor(do))
    return tq.grad.numpy(), tk.grad.numpy(), tv.grad.numpy()


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("lead,n_q,n_k,d,d_v,Br,Bc", CASES[:5])
def test_backwards_equal_autograd(lead, n_q, n_k, d, d_v, Br, Bc, causal):
    rng = np.random.default_rng(7 + n_q)
    q, k, v = _qkv(rng, lead, n_q, n_k, d, d_v, scale=2.0)
    o, lse, p = flash.standard_forward(q, k, v, causal=causal)
    do = rng.standard_normal(o.shape)
    ref = _torch_grads(q, k, v, do, causal)
    std = flash.standard_backward(q, k, v, p, do)
    fa2 = flash.flash2_backward(q, k, v, o, lse, do, Br=Br, Bc=Bc, causal=causal)
    for a, b, r in zip(std, fa2, ref):
        assert a.shape == r.shape and b.shape == r.shape
        _close(a, r, 1e-11)
        _close(b, r, 1e-11)
        _close(a, b)


def test_backward_matches_finite_differences():
    rng = np.random.default_rng(3)
    q, k, v = _qkv(rng, (), 6, 5, 3)
    do = rng.standard_normal((6, 3))
    o, lse, _ = flash.standard_forward(q, k, v, causal=True)
    grads = flash.flash2_backward(q, k, v, o, lse, do, Br=4, Bc=2, causal=True)
    loss = lambda q_, k_, v_: float(
        (flash.standard_forward(q_, k_, v_, causal=True)[0] * do).sum()
    )
    eps = 1e-6
    for idx, (t, g) in enumerate(zip((q, k, v), grads)):
        num = np.zeros_like(t)
        for pos in np.ndindex(t.shape):
            args = [q.copy(), k.copy(), v.copy()]
            args[idx][pos] += eps
            up = loss(*args)
            args[idx][pos] -= 2 * eps
            num[pos] = (up - loss(*args)) / (2 * eps)
        np.testing.assert_allclose(g, num, rtol=1e-6, atol=1e-8)


# -------------------------------------------------------------- no silent wrong answers


@pytest.mark.parametrize("Br,Bc", [(1, 1), (3, 2), (4, 8), (64, 64)])
def test_nan_rows_and_hidden_nan_values_do_not_depend_on_tiles(Br, Bc):
    # items 1 and 2: a NaN in q row 2 makes row 2 NaN (o and lse), never the "no key"
    # row; a NaN in v row 7 reaches query 7 only, whatever the tiles
    rng = np.random.default_rng(0)
    q, k, v = (rng.normal(size=(10, 4)) for _ in range(3))
    k, v = k[:8], v[:8]
    q[4, 1] = np.nan  # causal N_q = 10 > N_k = 8: rows 0, 1 see no key
    v[7, 0] = np.nan
    o_s, lse_s, _ = flash.standard_forward(q, k, v, causal=True)
    for f in (flash.flash1_forward, flash.flash2_forward):
        o, lse = f(q, k, v, Br=Br, Bc=Bc, causal=True)
        assert np.array_equal(np.isnan(o), np.isnan(o_s))
        assert np.array_equal(np.isnan(lse), np.isnan(lse_s))
        np.testing.assert_allclose(
            o[~np.isnan(o_s)], o_s[~np.isnan(o_s)], rtol=1e-12, atol=1e-14
        )
    assert np.isnan(lse_s[4]) and np.isnan(o_s[4]).all()
    assert np.all(o_s[:2] == 0) and np.isneginf(lse_s[:2]).all()
    assert np.isnan(o_s[9, 0]) and np.isfinite(o_s[[2, 3, 5, 6, 7, 8]]).all()


def test_integer_input_to_softmax_passes_is_computed_in_float():
    # item 7
    x = np.array([[1, 2, 3], [0, 0, 0]])
    for f in (flash.softmax_2pass, flash.softmax_3pass):
        y = f(x, block=2)
        assert y.dtype == np.float64
        np.testing.assert_allclose(y, core.softmax(x.astype(float)), rtol=1e-15)
        assert np.all(f(np.full((1, 3), -np.inf)) == 0)  # nothing visible: 0, not NaN


def test_backward_checks_shapes_and_takes_dlse():
    # item 6: a wrongly shaped lse or p used to broadcast into wrong gradients
    rng = np.random.default_rng(3)
    q, k, v, do = (rng.normal(size=(2, 6, 4)) for _ in range(4))
    o, lse = flash.flash2_forward(q, k, v)
    _, _, p = flash.standard_forward(q, k, v)
    with pytest.raises(ValueError, match="lse"):
        flash.flash2_backward(q, k, v, o, lse[:, :1], do)
    with pytest.raises(ValueError, match="lse"):
        flash.flash2_backward(q, k, v, o, lse[..., None], do)
    with pytest.raises(ValueError, match="p"):
        flash.standard_backward(q, k, v, p[:1], do)
    with pytest.raises(ValueError, match="do"):
        flash.standard_backward(q, k, v, p, do[..., :3])
    with pytest.raises(TypeError, match="causal"):
        flash.flash2_forward(q, k, v, causal="False")
    with pytest.raises(TypeError, match="Br"):
        flash.flash2_forward(q, k, v, Br=2.5)
    # d lse / d S = P: the dlse path against float64 autograd
    dlse = rng.normal(size=(2, 6))
    dq, dk, dv = flash.flash2_backward(q, k, v, o, lse, do, Br=4, Bc=4, dlse=dlse)
    qt, kt, vt = (torch.tensor(t, requires_grad=True) for t in (q, k, v))
    s = qt @ kt.transpose(-1, -2) / 2.0
    ot = torch.softmax(s, -1) @ vt
    loss = (ot * torch.tensor(do)).sum() + (
        torch.logsumexp(s, -1) * torch.tensor(dlse)
    ).sum()
    for g, r in zip((dq, dk, dv), torch.autograd.grad(loss, (qt, kt, vt))):
        np.testing.assert_allclose(g, r.numpy(), rtol=1e-10, atol=1e-12)


# ------------------------------------- backward against gradients from the definition


def _definition_grads(q, k, v, do, causal):
    """dQ, dK, dV of o_i = sum_j p_ij v_j, p_i = softmax over the visible keys of
    s_ij = q_i . k_j / sqrt(d), derived entry by entry with no autograd and none of the
    backward's shortcuts: dL/dp_ij = do_i . v_j; the softmax Jacobian
    dp_ij/ds_il = p_ij (delta_jl - p_il), built in full; then the chain rule."""
    n_q, n_k, d = q.shape[-2], k.shape[-2], q.shape[-1]
    s = np.einsum("...id,...jd->...ij", q, k) / np.sqrt(d)  # (..., N_q, N_k)
    keep = core.causal_mask(n_q, n_k) if causal else np.ones((n_q, n_k), dtype=bool)
    m = np.where(keep, s, -np.inf).max(axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)  # a row with no visible key
    e = np.where(keep, np.exp(np.where(keep, s - m, 0.0)), 0.0)
    tot = e.sum(axis=-1, keepdims=True)
    p = np.divide(e, tot, out=np.zeros_like(e), where=tot > 0)  # a row with no key: 0
    eye = np.eye(n_k)
    jac = p[..., :, :, None] * (eye - p[..., :, None, :])  # (..., N_q, N_k j, N_k l)
    g = np.einsum("...ie,...je->...ij", do, v)  # dL/dp: (..., N_q, N_k)
    ds = np.einsum("...ij,...ijl->...il", g, jac)  # (..., N_q, N_k)
    dq = np.einsum("...il,...ld->...id", ds, k) / np.sqrt(d)
    dk = np.einsum("...il,...id->...ld", ds, q) / np.sqrt(d)
    dv = np.einsum("...ij,...ie->...je", p, do)
    return dq, dk, dv


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(
    "lead,n_q,n_k,d,d_v,Br,Bc",
    [
        ((), 1, 1, 1, 1, 1, 1),
        ((), 13, 13, 5, 3, 4, 3),
        ((2,), 7, 19, 6, 9, 3, 5),
        (
            (2, 3),
            17,
            11,
            8,
            8,
            16,
            4,
        ),  # N_q > N_k: causal hides the first rows entirely
        ((1, 2), 23, 29, 4, 7, 5, 7),
    ],
)
def test_tiled_backward_equals_gradients_from_the_definition(
    lead, n_q, n_k, d, d_v, Br, Bc, causal
):
    rng = np.random.default_rng(100 + n_q + n_k)
    q, k, v = _qkv(rng, lead, n_q, n_k, d, d_v, scale=1.5)
    o, lse = flash.flash2_forward(q, k, v, Br=Br, Bc=Bc, causal=causal)
    do = rng.standard_normal(o.shape)
    ref = _definition_grads(q, k, v, do, causal)
    got = flash.flash2_backward(q, k, v, o, lse, do, Br=Br, Bc=Bc, causal=causal)
    for name, a, r in zip(("dq", "dk", "dv"), got, ref):
        assert a.shape == r.shape, name
        # fp64 on O(1) values, sums of at most a few hundred terms: 1e-12 is ~1e4 ulp
        np.testing.assert_allclose(a, r, rtol=1e-12, atol=1e-12, err_msg=name)
    if causal and n_q > n_k:  # rows with no visible key: no gradient flows through
        hidden = n_q - n_k
        assert np.all(got[0][..., :hidden, :] == 0)
