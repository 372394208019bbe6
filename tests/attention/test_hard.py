"""attention/hard.py: hard, sampled and top-k attention, Gumbel tricks, gradient
estimators, and the registered HBM-traffic algorithms (simulated == closed form)."""

import numpy as np
import pytest

from attention import hard as ah
from attention import memory
from attention.core import causal_mask, softmax

pytestmark = pytest.mark.xdist_group("hard")


def _qkv(rng, B=2, H=2, N_q=7, N_k=9, d=5):
    return (
        rng.standard_normal((B, H, N_q, d)),
        rng.standard_normal((B, H, N_k, d)),
        rng.standard_normal((B, H, N_k, d)),
    )


def _tv(samples, p):
    freq = np.bincount(samples, minlength=len(p)) / len(samples)
    return 0.5 * np.abs(freq - p).sum()


def test_hard_is_soft_with_one_hot_weights():
    rng = np.random.default_rng(0)
    q, k, v = _qkv(rng)
    o, idx = ah.hard_attention(q, k, v, return_index=True)
    assert o.shape == (2, 2, 7, 5) and idx.shape == (2, 2, 7)
    np.testing.assert_allclose(o, ah.one_hot(idx, 9) @ v)
    s = ah.attention_scores(q, k)
    np.testing.assert_array_equal(idx, s.argmax(-1))


def test_argmax_ties_lowest_and_masked_rows():
    s = np.array([[1.0, 3.0, 3.0, 0.0], [-np.inf] * 4, [2.0, 2.0, 2.0, 2.0]])
    np.testing.assert_array_equal(ah.argmax_index(s), [1, -1, 0])
    v = np.arange(8.0).reshape(4, 2)
    np.testing.assert_array_equal(
        ah.gather_rows(v, np.array([1, -1, 0])), [[2.0, 3.0], [0.0, 0.0], [0.0, 1.0]]
    )


def test_causal_rows_without_keys():
    rng = np.random.default_rng(1)
    q, k, v = _qkv(rng, N_q=9, N_k=4)
    o, idx = ah.hard_attention(q, k, v, causal=True, return_index=True)
    assert (idx[..., :5] == -1).all() and (o[..., :5, :] == 0).all()
    keep = causal_mask(9, 4)
    assert all(
        keep[i, idx[b, h, i]] for b in range(2) for h in range(2) for i in range(5, 9)
    )
    o_k = ah.topk_attention(q, k, v, 3, causal=True)
    assert np.isfinite(o_k).all() and (o_k[..., :5, :] == 0).all()


def test_topk_limits_and_ties():
    rng = np.random.default_rng(2)
    q, k, v = _qkv(rng)
    np.testing.assert_allclose(
        ah.topk_attention(q, k, v, 9), ah.soft_attention(q, k, v)
    )
    np.testing.assert_allclose(
        ah.topk_attention(q, k, v, 50), ah.soft_attention(q, k, v)
    )
    np.testing.assert_allclose(
        ah.topk_attention(q, k, v, 1), ah.hard_attention(q, k, v)
    )
    o, p = ah.topk_attention(q, k, v, 3, return_weights=True)
    assert ((p > 0).sum(-1) == 3).all()
    np.testing.assert_allclose(p.sum(-1), 1.0)
    s = np.array([[5.0, 1.0, 5.0, 2.0, 2.0, 2.0]])
    np.testing.assert_array_equal(ah.topk_index(s, 4), [[0, 2, 3, 4]])
    np.testing.assert_array_equal(ah.topk_index(s[:, :2], 4), [[0, 1, -1, -1]])
    with pytest.raises(ValueError, match="topk"):
        ah.topk_attention(q, k, v, 0)


def test_gumbel_max_samples_the_softmax():
    rng = np.random.default_rng(3)
    logits = np.array([2.0, 0.5, -1.0, 0.0, 1.0])
    p = softmax(logits)
    n = 40000
    z = ah.gumbel_max_sample(np.broadcast_to(logits, (n, 5)), rng)
    assert _tv(z, p) < 0.015  # E[TV] ~ 0.004 for n = 40000
    z2 = ah.sample_index(np.broadcast_to(p, (n, 5)), rng)
    assert _tv(z2, p) < 0.015
    # zero-probability positions are never sampled
    assert (
        ah.sample_index(np.broadcast_to([0.0, 0.5, 0.0, 0.5], (2000, 4)), rng) % 2 == 1
    ).all()
    np.testing.assert_array_equal(ah.sample_index(np.zeros((3, 4)), rng), [-1, -1, -1])


def test_stochastic_hard_attention_frequencies():
    rng = np.random.default_rng(4)
    q, k, v = _qkv(rng, B=1, H=1, N_q=1, N_k=6)
    p = softmax(ah.attention_scores(q, k))[0, 0, 0]
    qq = np.broadcast_to(q, (1, 1, 20000, 5))
    o, idx = ah.stochastic_hard_attention(qq, k, v, rng, return_index=True)
    assert _tv(idx.ravel(), p) < 0.02
    np.testing.assert_allclose(o[0, 0], v[0, 0, idx[0, 0]])


def test_gumbel_softmax_temperature_limits():
    rng = np.random.default_rng(5)
    logits = rng.standard_normal((4, 8))
    g = ah.gumbel(logits.shape, rng)
    y_cold = ah.gumbel_softmax(logits, 1e-3, noise=g)
    np.testing.assert_allclose(
        y_cold, ah.one_hot(ah.argmax_index(logits + g), 8), atol=1e-6
    )
    y_hot = ah.gumbel_softmax(logits, 1e4, noise=g)
    np.testing.assert_allclose(y_hot, 1 / 8, atol=1e-3)
    y = ah.gumbel_softmax(logits, 0.7, rng)
    np.testing.assert_allclose(y.sum(-1), 1.0)
    y_h = ah.gumbel_softmax(logits, 0.7, noise=g, hard=True)
    np.testing.assert_array_equal(y_h, ah.one_hot(ah.argmax_index(logits + g), 8))
    with pytest.raises(ValueError, match="tau"):
        ah.gumbel_softmax(logits, 0.0, rng)


def _numeric_grad(f, x, eps=1e-6):
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        e = np.zeros_like(x)
        e[i] = eps
        g[i] = (f(x + e) - f(x - e)) / (2 * eps)
    return g


def test_softmax_jacobian_and_backward():
    rng = np.random.default_rng(6)
    s = rng.standard_normal(6)
    p = softmax(s)
    J = ah.softmax_jacobian(p)
    num = np.stack([_numeric_grad(lambda x, a=a: softmax(x)[a], s) for a in range(6)])
    np.testing.assert_allclose(J, num, atol=1e-8)
    assert (np.abs(J) > 0).all()  # every position gets gradient
    gp = rng.standard_normal(6)
    np.testing.assert_allclose(ah.softmax_backward(p, gp), J.T @ gp, atol=1e-12)


def test_expected_loss_grad_and_straight_through():
    rng = np.random.default_rng(7)
    s, f = rng.standard_normal(5), rng.standard_normal(5)
    num = _numeric_grad(lambda x: softmax(x) @ f, s)
    np.testing.assert_allclose(ah.expected_loss_grad(s, f), num, atol=1e-8)
    # straight-through = exact gradient of the relaxed loss <y(s), f>
    # at fixed noise, at y
    g, tau = ah.gumbel(5, rng), 0.5
    num = _numeric_grad(lambda x: ah.gumbel_softmax(x, tau, noise=g) @ f, s)
    y = ah.gumbel_softmax(s, tau, noise=g)
    np.testing.assert_allclose(ah.straight_through_grad(y, f, tau), num, atol=1e-7)


@pytest.mark.parametrize("baseline", [None, 3.0, "loo"])
def test_reinforce_is_unbiased(baseline):
    """The mean of n estimates is within 4.5 standard errors of the exact gradient."""
    rng = np.random.default_rng(8)
    logits = np.array([0.3, -0.5, 1.2, 0.0])
    f = np.array([1.0, 4.0, 2.5, 3.0])
    exact = ah.expected_loss_grad(logits, f)
    n = 20000
    if baseline == "loo":
        # (n/4, N): averages of 4 draws
        g = ah.reinforce_grad(
            np.broadcast_to(logits, (n // 4, 4)), f, rng, n_samples=4, baseline="loo"
        ).mean(axis=0)
    else:
        g = ah.reinforce_grad(
            np.broadcast_to(logits, (n, 4)), f, rng, baseline=baseline
        )[0]
    se = g.std(axis=0, ddof=1) / np.sqrt(len(g))
    assert (np.abs(g.mean(axis=0) - exact) < 4.5 * se).all(), (
        g.mean(axis=0),
        exact,
        se,
    )


def test_baseline_reduces_variance():
    rng = np.random.default_rng(9)
    logits = np.array([0.3, -0.5, 1.2, 0.0])
    # a large common offset: the worst case for b = 0
    f = 10.0 + np.array([1.0, 4.0, 2.5, 3.0])
    n = 5000
    x = np.broadcast_to(logits, (n, 4))
    var0 = ah.reinforce_grad(x, f, rng)[0].var(axis=0).sum()
    b = softmax(logits) @ f  # the expected loss: a good constant baseline
    var_b = ah.reinforce_grad(x, f, rng, baseline=b)[0].var(axis=0).sum()
    assert var_b < var0 / 20
    with pytest.raises(ValueError, match="baseline"):
        ah.reinforce_grad(logits, f, rng, baseline="mean")
    with pytest.raises(ValueError, match="n_samples"):
        ah.reinforce_grad(logits, f, rng, baseline="loo")


@pytest.mark.parametrize("name", ["soft", "hard", "topk"])
@pytest.mark.parametrize(
    "N,d,Br,Bc,N_k",
    [(256, 64, 64, 64, None), (100, 32, 64, 32, 77), (37, 16, 16, 16, 200)],
)
def test_traffic_simulated_equals_closed_form(name, N, d, Br, Bc, N_k):
    assert name in memory.algorithms()
    kw = {"k": 8} if name == "topk" else {}
    sim = memory.simulate(name, N, d, Br=Br, Bc=Bc, N_k=N_k, keep_trace=False, **kw)
    closed = memory.closed_form(name, N, d, Br=Br, Bc=Bc, N_k=N_k, **kw)
    assert sim.per_tensor == closed.per_tensor
    assert sim.total == closed.total


def test_traffic_v_reads_scale_with_k():
    N, d = 1024, 64
    soft = memory.closed_form("soft", N, d)
    hard = memory.closed_form("hard", N, d)
    top8 = memory.closed_form("topk", N, d, k=8)
    t_r = N // 64
    assert soft.per_tensor["V"][0] == t_r * N * d  # every V row once per query block
    assert hard.per_tensor["V"][0] == N * d  # one row per query
    assert top8.per_tensor["V"][0] == 8 * N * d
    assert soft.per_tensor["K"] == hard.per_tensor["K"] == top8.per_tensor["K"]
    assert hard.total < top8.total < soft.total
    # k larger than the keys: every row kept
    assert memory.closed_form("topk", 8, d, k=32).per_tensor["V"][0] == 8 * 8 * d
    with pytest.raises(ValueError, match="SRAM"):
        memory.simulate("topk", 256, 64, k=64, M=4096)


def test_retrieval_soft_gradient_matches_finite_differences():
    rng = np.random.default_rng(10)
    task = ah.retrieval_task(6, n_keys=5, d=4, rng=rng)
    W = 0.3 * rng.standard_normal((4, 4))
    s = ah.retrieval_scores(W, task)
    for method in ("soft", "topk"):
        g, _ = ah.retrieval_score_grad(method, s, task, rng, topk=3)
        num = _numeric_grad(
            lambda x, m=method: ah.retrieval_score_grad(m, x, task, rng, topk=3)[1], s
        )
        np.testing.assert_allclose(g, num, atol=1e-6)
    # chain rule to W
    g, _ = ah.retrieval_score_grad("soft", s, task, rng)
    num_W = _numeric_grad(
        lambda w: ah.retrieval_score_grad(
            "soft", ah.retrieval_scores(w, task), task, rng
        )[1],
        W,
    )
    np.testing.assert_allclose(ah.retrieval_W_grad(g, task), num_W, atol=1e-6)
    np.testing.assert_array_equal(
        ah.retrieval_score_grad("argmax", s, task, rng)[0], 0.0
    )
    with pytest.raises(ValueError, match="method"):
        ah.retrieval_score_grad("sgd", s, task, rng)


def test_training_soft_learns_and_argmax_does_not():
    soft = ah.train_retrieval("soft", steps=60, lr=0.05, eval_every=20)
    argmax = ah.train_retrieval("argmax", steps=60, lr=0.05, eval_every=20)
    assert soft["accuracy"][-1] > 0.8 > soft["accuracy"][0]
    assert len(set(argmax["accuracy"])) == 1  # W never moves from 0


def test_estimator_stats_unbiased_vs_biased():
    task = ah.retrieval_task(16, n_keys=8, rng=np.random.default_rng(11))
    st = ah.estimator_stats(
        1.0 * np.eye(16),
        task,
        n_draws=400,
        methods=("reinforce", "reinforce+baseline", "gumbel-st", "argmax"),
        rng=np.random.default_rng(12),
    )
    # unbiased: bias within sampling error
    for m in ("reinforce", "reinforce+baseline"):
        assert st[m]["rel_bias"] < 2.5 * st[m]["rel_bias_se"], st[m]
    assert st["reinforce+baseline"]["rel_std"] < st["reinforce"]["rel_std"]
    assert st["gumbel-st"]["rel_bias"] > 4 * st["gumbel-st"]["rel_bias_se"]  # biased
    assert st["argmax"]["rel_bias"] == pytest.approx(1.0)


# -------------------------------------------------------------- no silent wrong answers


def test_nan_rows_are_nan_and_hidden_values_never_leak():
    # item 1: NaN score row -> o NaN, idx = its first NaN key (as np.argmax; never
    # -1, the empty row's answer: issue 23), never the empty row's o = 0
    rng = np.random.default_rng(0)
    q, k, v = rng.normal(size=(10, 4)), rng.normal(size=(8, 4)), rng.normal(size=(8, 3))
    q[4, 0] = np.nan
    v[7] = np.nan  # seen only by the queries that select key 7
    o, idx = ah.hard_attention(q, k, v, causal=True, return_index=True)
    assert idx[4] == 0 and np.isnan(o[4]).all()
    assert np.all(idx[:2] == -1) and np.all(o[:2] == 0)
    assert np.array_equal(np.isnan(o).any(-1), (idx == 7) | (np.arange(10) == 4))
    o, p = ah.topk_attention(q, k, v, 3, causal=True, return_weights=True)
    assert np.isnan(o[4]).all() and np.isnan(p[4]).all() and np.all(o[:2] == 0)
    assert ah.topk_index(ah.attention_scores(q, k, causal=True), 3)[4].tolist() == [
        0,
        1,
        2,
    ]
    kept7 = p[:, 7] > 0
    assert np.array_equal(np.isnan(o).any(-1), kept7 | (np.arange(10) == 4))
    o = ah.stochastic_hard_attention(q, k, v, np.random.default_rng(1), causal=True)
    assert np.isnan(o[4]).all() and np.all(o[:2] == 0)


@pytest.mark.parametrize(
    "call,exc",
    [
        (lambda: ah.topk_index(np.zeros((2, 3)), -1), ValueError),
        (lambda: ah.topk_attention(*[np.ones((4, 2))] * 3, 2.7), TypeError),
        (lambda: ah.topk_attention(*[np.ones((4, 2))] * 3, "3"), TypeError),
        (lambda: ah.hard_attention(*[np.ones((4, 2))] * 3, causal="False"), TypeError),
        (lambda: ah.softmax_jacobian(np.ones((1, 3)) / 3), ValueError),
        (lambda: ah.stochastic_hard_attention(*[np.ones((4, 2))] * 3, None), TypeError),
        (
            lambda: ah.reinforce_grad(
                np.zeros(3), np.zeros(3), np.random.default_rng(0), n_samples=0
            ),
            ValueError,
        ),
        (
            lambda: ah.hard_attention(
                np.ones((4, 2)), np.ones((5, 2)), np.ones((4, 2))
            ),
            ValueError,
        ),
        (
            lambda: ah.gumbel_softmax(
                np.zeros(3), 1.0, hard="yes", rng=np.random.default_rng(0)
            ),
            TypeError,
        ),
    ],
)
def test_bad_arguments_raise_clear_errors(call, exc):
    # item 8 and the obscure errors: checked at the top, named
    with pytest.raises(exc):
        call()
