"""Issue 50, the NumPy side: the edges of attention.masks, attention.sparse*,
attention.memory.{sparse,serving}, the sparse explorer and MiniLM. Each test is
written from a case the issue describes; each refusal names the argument."""

import numpy as np
import pytest

from attention import masks as M
from attention import sparse, sparse_train

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


# ---------------------------------------------------------------------------------
# 3. moba_keep keeps the query's own block whatever another block scores
# ---------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [np.nan, np.inf])
@pytest.mark.parametrize("topk", [1, 2])
def test_moba_keep_keeps_the_own_block_against_nan_and_inf(bad, topk):
    torch = pytest.importorskip("torch")
    n, bs = 10, 4  # blocks 0..3 | 4..7 | 8, 9 (the own, ragged)
    scores = torch.arange(n, dtype=torch.float64)[None].repeat(2, 1) / 10
    scores[0, 1] = bad  # block 0 scores NaN / +inf
    keep = sparse_train.moba_keep(scores, bs, topk)
    assert keep[:, 8:].all()  # the own block, always
    assert int(keep[0].sum()) == 2 + 4 * (topk - 1)
    if topk == 2:  # NaN and +inf rank first among the rest, as select_blocks
        assert keep[0, :4].all() and not keep[0, 4:8].any()
    # equal to attention.sparse.select_blocks for the last query (its docstring)
    q = np.ones((1, 1, 1, 1))
    for row in range(2):
        k = scores[row].numpy()[None, None, :, None]  # q . k_t = the score
        idx = sparse.select_blocks(q, k, bs, topk, True, scale=1.0)[0, 0, 0]
        want = np.zeros(3, bool)
        want[idx[idx >= 0]] = True
        assert keep[row].numpy().tolist() == np.repeat(want, bs)[:n].tolist()


def test_moba_keep_and_train_refuse_a_budget_below_one():
    torch = pytest.importorskip("torch")
    scores = torch.zeros(1, 8)
    for bad in (0, -1):
        with pytest.raises(ValueError, match=r"^topk must be >= 1, got"):
            sparse_train.moba_keep(scores, 4, bad)
        with pytest.raises(ValueError, match=r"^topk must be >= 1, got"):
            sparse_train.train(
                {"steps": 1, "n": 8, "block_size": 4, "budgets": [1]}, bad
            )
        with pytest.raises(ValueError, match=r"^topk must be >= 1, got"):
            sparse_train.evaluate(None, {"n_test": 1}, topk=bad)
    with pytest.raises(TypeError, match=r"^topk must be an int"):
        sparse_train.moba_keep(scores, 4, 1.0)
    with pytest.raises(ValueError, match=r"^block_size must be >= 1, got 0"):
        sparse_train.moba_keep(scores, 0, 1)
    with pytest.raises(ValueError, match=r"^scores must be a 2-D \(B, N\)"):
        sparse_train.moba_keep(torch.zeros(8), 4, 1)


def test_recall_batch_refuses_counts_it_cannot_draw():
    rng = np.random.default_rng(0)
    for kw, match in (
        (dict(batch=0), r"^batch must be >= 1, got 0"),
        (dict(n=1), r"^n must be >= 2, got 1"),
        (dict(n_keys=1), r"^n_keys must be >= 2, got 1"),
        (dict(n_values=0), r"^n_values must be >= 1, got 0"),
    ):
        args = {**dict(batch=2, n=8, n_keys=4, n_values=3), **kw}
        with pytest.raises(ValueError, match=match):
            sparse_train.recall_batch(**args, rng=rng)
    with pytest.raises(TypeError, match=r"^n must be an int"):
        sparse_train.recall_batch(2, 8.0, 4, 3, rng)


# ---------------------------------------------------------------------------------
# 6. Block indices: what the kernel refuses, the NumPy helpers refuse too
# ---------------------------------------------------------------------------------


def test_mass_kept_and_simulate_selected_refuse_indices_the_kernel_refuses():
    from attention import sparse_mass
    from attention.memory import sparse as msparse

    p = np.full((1, 1, 2, 8), 1 / 8)  # 4 blocks of 2
    ok = np.array([[[[0, -1], [1, 2]]]])
    np.testing.assert_allclose(sparse_mass.mass_kept(p, ok, 2), [[[0.25, 0.5]]])
    cases = [
        (np.array([[[[0, 4], [1, 2]]]]), ValueError, r"holds 4, outside .*\[0, 4\)"),
        (np.array([[[[0, -2], [1, 2]]]]), ValueError, r"holds -2, outside"),
        (np.array([[[[1, 1], [1, 2]]]]), ValueError, r"repeats block 1 within a row"),
        (np.array([[[[9, 0], [1, 2]]]]), ValueError, r"holds 9, outside"),
        (np.array([[[[0.0, 1.0], [1, 2]]]]), TypeError, r"must be an integer array"),
    ]
    for idx, err, match in cases:
        with pytest.raises(err, match=r"^kv_indices " + match):
            sparse_mass.mass_kept(p, idx, 2)
        with pytest.raises(err, match=r"^kv_indices " + match):
            msparse.simulate_selected(idx, 8, 2, 4)
    # the repeated block counted twice read 1.0 where the truth is 0.5
    w = msparse.simulate_selected(ok, 8, 2, 4)
    assert w.scores == 2 * 3
    with pytest.raises(ValueError, match=r"^kv_indices holds 5, outside"):
        sparse.block_keep(np.array([[[[5]]]]), 8, 2, True)


# ---------------------------------------------------------------------------------
# 7. Cost models check every argument, not only the counts
# ---------------------------------------------------------------------------------


def test_cost_models_refuse_what_they_would_misuse():
    from attention.memory import decode as mdecode
    from attention.memory import serving
    from attention.memory import sparse as msparse

    with pytest.raises(TypeError, match=r"^heads must be a positive int, got str"):
        msparse.dense_causal_flops(64, 16, heads="8")
    with pytest.raises(ValueError, match=r"^heads must be a positive int, got 0"):
        msparse.dense_causal_flops(64, 16, heads=0)
    for f, args in ((msparse.gate_cost, (64, 64, 16, 2, 8)),
                    (msparse.indexer_cost, (64, 64, 2))):  # fmt: skip
        with pytest.raises(TypeError, match=r"^causal must be a bool, got str 'no'"):
            f(*args, causal="no")
    step = serving.step_roofline(1e6, 1000.0, 100.0, 2, 128)
    nan, inf = float("nan"), float("inf")
    for kw in (dict(hbm_bytes_per_s=0), dict(hbm_bytes_per_s=-1.0),
               dict(flops_per_s=nan), dict(flops_per_s=inf)):  # fmt: skip
        args = {"hbm_bytes_per_s": 1e12, "flops_per_s": 1e15, **kw}
        name = next(iter(kw))
        with pytest.raises(ValueError, match=rf"^{name} must be a finite number > 0"):
            serving.step_time(step, **args)
    with pytest.raises(TypeError, match=r"^hbm_bytes_per_s must be a real number"):
        serving.step_time(step, "1e12", 1e15)
    good = dict(params=1e6, kv_bytes_per_token=1000.0, attn_flops_per_token=100.0)
    for name, bad in (("params", -1.0), ("params", 0), ("kv_bytes_per_token", 0.0),
                      ("attn_flops_per_token", float("nan")),
                      ("weight_bytes", -2.0)):  # fmt: skip
        with pytest.raises(ValueError, match=rf"^{name} must be a finite number"):
            serving.step_roofline(**{**good, name: bad}, B=2, context=128)
    with pytest.raises(ValueError, match=r"^kv_bytes_per_token must be a finite"):
        serving.cascade_bytes(2, 10, 5, -1.0)
    cfg = mdecode.MODELS[next(iter(mdecode.MODELS))]
    with pytest.raises(ValueError, match=r"^block must be >= 0, got -1"):
        serving.fp8_bytes_per_token(cfg, -1)
    # what they return is unchanged on good arguments
    t = serving.step_time(step, 1e12, 1e15)
    assert t["total"] == pytest.approx(t["weights"] + t["attention"])


# ---------------------------------------------------------------------------------
# 9. Explorer settings: a float is not an int option; every public point is checked
# ---------------------------------------------------------------------------------


def test_a_float_is_not_an_int_choice_and_points_are_checked():
    from attention.explorers import settings
    from attention.explorers import sparse as ex

    with pytest.raises(ValueError, match=r"^N must be one of \[.*\], got 512\.0"):
        ex.sparse_explorer(N=512.0)
    assert not settings.Choice((1, 2)).contains(2.0)
    assert settings.Choice((1, 2)).contains(np.int64(2))
    assert settings.Choice((0.5, 1.0)).contains(1.0)
    assert not settings.Choice(("a", "b")).contains(np.str_("c"))
    N, B = ex.CONTEXT[0], ex.BLOCKS[0]
    q = ex.query_rows(N)[0]
    for call, match in (
        (lambda: ex.row_point("moba", N, B, q + 1), r"^query must be one of"),
        (lambda: ex.row_point("moba", float(N), B, q), r"^N must be one of"),
        (lambda: ex.row_point("dense", N, B, q), r"^method must be one of"),
        (lambda: ex.row_point("moba", N, 7, q), r"^block_size must be one of"),
        (lambda: ex.cost_point(N, B, 0), r"^topk must be one of"),
        (lambda: ex.map_thumbnail(float(N)), r"^N must be one of"),
    ):
        with pytest.raises(ValueError, match=match):
            call()
    assert ex.row_point("moba", N, B, q)["order"]


# ---------------------------------------------------------------------------------
# 10. A clear refusal where an obscure error was
# ---------------------------------------------------------------------------------


def test_masks_refuse_by_name_what_raised_obscurely():
    q = np.zeros((1, 1, 4, 0))
    with pytest.raises(ValueError, match=r"^the head dim d must be >= 1"):
        M.masked_attention(q, q, np.zeros((1, 1, 4, 2)))
    x = np.zeros((1, 1, 4, 2))

    def wrong_shape(b, h, q_idx, kv_idx):
        return np.ones(3, bool)

    with pytest.raises(ValueError, match=r"^mask returned shape \(3,\)"):
        M.masked_attention(x, x, x, wrong_shape)
    with pytest.raises(ValueError, match=r"^mask returned shape \(3,\)"):
        M.mask_matrix(wrong_shape, 4)
    with pytest.raises(ValueError, match=r"^mask returned shape \(3,\)"):
        M.block_mask(wrong_shape, 4, block_size=2)
    with pytest.raises(ValueError, match=r"^score_mod returned shape \(3,\)"):
        M.masked_attention(x, x, x, score_mod=lambda s, b, h, i, j: np.ones(3))
    short = M.document_mask(np.array([0, 0, 1]))
    x5 = np.zeros((1, 1, 5, 2))
    for call in (lambda: M.mask_matrix(short, 5), lambda: M.block_mask(short, 5),
                 lambda: M.masked_attention(x5, x5, x5, short)):  # fmt: skip
        with pytest.raises(ValueError, match=r"^document_ids has length 3, shorter"):
            call()
    ids2 = M.document_mask(np.zeros((2, 4), int))
    with pytest.raises(ValueError, match=r"^document_ids holds 2 batches, b"):
        M.masked_attention(np.zeros((3, 1, 4, 2)), *[np.zeros((3, 1, 4, 2))] * 2, ids2)


def test_sparse_helpers_refuse_by_name_what_raised_obscurely():
    from attention import sparse_mass

    s = np.zeros((2, 5))
    with pytest.raises(ValueError, match=r"^eligible of shape \(3,\) does not"):
        sparse.rank_topk(s, 2, eligible=np.ones(3, bool))
    with pytest.raises(ValueError, match=r"^forced of shape \(2, 4\) does not"):
        sparse.rank_topk(s, 2, forced=np.ones((2, 4), bool))
    with pytest.raises(TypeError, match=r"^eligible must be a boolean array"):
        sparse.rank_topk(s, 2, eligible=np.ones((2, 5)))
    p = np.full((1, 1, 4, 4), 0.25)
    q = np.zeros((1, 1, 4, 2))
    for kw, name in ((dict(ks=()), "ks"), (dict(block_sizes=()), "block_sizes"),
                     (dict(methods=()), "methods")):  # fmt: skip
        with pytest.raises(ValueError, match=rf"^{name} must hold at least one"):
            sparse_mass.mass_curves(p, q, q, **kw)


def test_minilm_refuses_by_name_what_raised_obscurely():
    from attention import pretrained

    try:
        model = pretrained.load_minilm()
    except (ModuleNotFoundError, FileNotFoundError) as e:  # pragma: no cover
        pytest.skip(str(e))
    with pytest.raises(ValueError, match=r"^texts must hold at least one text"):
        model.embed([])
    with pytest.raises(TypeError, match=r"^text must be a str, got list"):
        model.attentions(["a", "b"])
    with pytest.raises(TypeError, match=r"^texts\[1\] must be a str, got int"):
        model.embed(["a", 3])
