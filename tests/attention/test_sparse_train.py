"""attention.sparse_train: the task's needle is unique, MoBA's keep mask in torch is
attention.sparse.select_blocks's, a tiny run learns above chance in seconds, bad
configs are refused by name, and the committed record loads with its provenance."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from attention import sparse  # noqa: E402
from attention import sparse_train as st  # noqa: E402

TINY = dict(n=32, n_keys=8, n_values=4, d=16, block_size=8, budgets=[1, 2],
            steps=120, batch=32, lr=1e-2, n_test=512)  # fmt: skip


def test_the_needle_is_the_only_token_with_the_querys_key():
    b = st.recall_batch(64, 40, 5, 3, np.random.default_rng(0))
    rows = np.arange(64)
    ctx = b["keys"][:, :-1]
    assert ((ctx == b["keys"][:, -1:]).sum(1) == 1).all()
    assert (ctx[rows, b["needle"]] == b["keys"][:, -1]).all()
    assert (b["target"] == b["values"][rows, b["needle"]]).all()
    assert b["keys"].max() < 5 and b["values"].max() < 3


@pytest.mark.parametrize("n, block, topk", [(64, 16, 2), (70, 16, 3), (50, 8, 7)])
def test_moba_keep_is_select_blocks_for_the_last_query(n, block, topk):
    rng = np.random.default_rng(n)
    q, k = rng.normal(size=(5, 8)), rng.normal(size=(5, n, 8))
    k[:, :block] = k[:, block : 2 * block]  # equal block means: ties to the lower
    keep = st.moba_keep(torch.from_numpy(np.einsum("bd,bnd->bn", q, k)), block, topk)
    idx = sparse.select_blocks(q[:, None, None], k[:, None], block, topk, True)
    want = sparse.block_keep(idx, n, block, True)[:, 0, 0]
    np.testing.assert_array_equal(keep.numpy(), want)
    assert st.moba_keep(torch.zeros(2, n), block, None).all()


def test_a_tiny_run_learns_above_chance():
    rec = st.run(TINY, seed=0)
    chance = 1 / TINY["n_values"]
    assert rec["dense"]["accuracy"] > 2.5 * chance and rec["dense"]["hit"] == 1.0
    assert rec["selected"]["2"]["accuracy"] > 1.5 * chance
    for k in ("1", "2"):
        assert 0 <= rec["dense_selected"][k]["hit"] <= 1
    # one block of four: the needle is chosen only when it sits in the query's own
    assert rec["selected"]["1"]["hit"] == pytest.approx(7 / 31, abs=0.06)


def test_bad_configs_are_refused_by_name():
    for cfg, name in (
        (dict(budgets=[17]), "^budgets"),
        (dict(steps=-1), "^steps"),
        (dict(lr=0.0), "^lr"),
        (dict(n_keys=1), "^n_keys"),
        (dict(width=3), "unknown config keys"),
    ):
        with pytest.raises(ValueError, match=name):
            st.run(cfg)


def test_the_record_loads_with_its_provenance():
    rec = st.load_record()
    assert set(st.RECORD_KEYS) <= set(rec)
    assert rec["config"] == st.CONFIG and rec["command"].startswith(
        "python -m attention.sparse_train --record"
    )
    assert (
        sorted(rec["selected"]) == st.CONFIG["budgets"] == sorted(rec["dense_selected"])
    )
    for row in [rec["dense"], *rec["selected"].values()]:
        assert 0 <= row["accuracy"] <= 1 and 0 <= row["hit"] <= 1
    assert rec["dense"]["accuracy"] > 0.9 and rec["wall_s"] > 0
    assert len(rec["date"]) == 10 and rec["versions"]["torch"]


def test_load_record_refuses_another_file(tmp_path):
    p = tmp_path / "x.json"
    p.write_text('{"config": {}}')
    with pytest.raises(ValueError, match="missing"):
        st.load_record(p)
