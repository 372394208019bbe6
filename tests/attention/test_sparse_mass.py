"""attention.sparse_mass: block mass, mass kept and the curves, against loops."""

import numpy as np
import pytest

from attention import sparse, sparse_mass
from attention.core import softmax

RNG = np.random.default_rng(81)


def maps(h_q=2, h_kv=1, n=70, d=8):
    q = RNG.standard_normal((1, h_q, n, d))
    k = RNG.standard_normal((1, h_kv, n, d))
    s = np.einsum("bhid,bhjd->bhij", q, np.repeat(k, h_q // h_kv, 1)) / np.sqrt(d)
    return q, k, softmax(s)


def test_mass_kept_matches_loop():
    _, _, p = maps()
    idx = np.full((1, 2, 70, 3), -1)
    idx[..., 0] = RNG.integers(0, 5, (1, 2, 70))
    idx[..., 1] = (idx[..., 0] + 2) % 5
    got = sparse_mass.mass_kept(p, idx, 16)
    for h, i in np.ndindex(2, 70):
        want = sum(p[0, h, i, c * 16 : (c + 1) * 16].sum() for c in idx[0, h, i, :2])
        assert got[0, h, i] == pytest.approx(want, rel=1e-12)
    with pytest.raises(ValueError, match="kv_indices"):
        sparse_mass.mass_kept(p, idx[..., :5, :], 16)


def test_oracle_is_an_upper_bound_and_all_blocks_keep_everything():
    q, k, p = maps()
    curves = sparse_mass.mass_curves(p, q, k, (16, 32), (1, 2, 3, 5))
    for m in ("moba", "nsa", "quest"):
        assert (curves[m] <= curves["oracle"] + 1e-12).all()
    # 5 blocks of 16 cover 70 keys: every rule keeps all the mass
    for m in sparse_mass.METHODS:
        assert curves[m][0, -1] == pytest.approx(1.0, abs=1e-12)
        assert (np.diff(curves[m], axis=1) >= -1e-12).all()  # more blocks, more mass
    want = np.mean(
        sparse_mass.mass_kept(
            p, np.repeat(sparse.select_blocks(q, k, 32, 2, False), 2, 1), 32
        )
    )
    assert curves["moba"][1, 1] == pytest.approx(want, rel=1e-12)


def test_oracle_causal_eligibility():
    _, _, p = maps(1, 1, 40)
    o = sparse_mass.oracle_blocks(p, 16, 3, causal=True)
    assert (o[0, 0, :16, 1:] == -1).all() and (o[0, 0, :16, 0] == 0).all()
    assert sorted(o[0, 0, 39]) == [0, 1, 2]


def test_minilm_qkp_gives_the_model_maps():
    pytest.importorskip("safetensors")
    pytest.importorskip("tokenizers")
    from attention import pretrained

    try:
        model = pretrained.load_minilm()
    except (FileNotFoundError, ModuleNotFoundError, ImportError) as e:
        pytest.skip(f"the pretrained model is not installed: {e}")
    q, k, p = sparse_mass.minilm_qkp("Sparse attention picks blocks.", model)
    assert q.shape[:2] == (6, 12) and p.shape[-1] == q.shape[2]
    s = np.einsum("lhid,lhjd->lhij", q, k) / np.sqrt(q.shape[-1])
    np.testing.assert_allclose(p, softmax(s), atol=2e-6)
    np.testing.assert_allclose(
        p, model.attentions("Sparse attention picks blocks."), atol=0
    )
