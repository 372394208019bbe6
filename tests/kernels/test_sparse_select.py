"""kernels.sparse.select_blocks against the NumPy twin attention.sparse.select_blocks,
index for index and in the same order: small-integer inputs, power-of-two blocks and
scale, so every score is exact in fp32 and fp64 alike and the many ties must go to the
lower block index in both; random inputs at a block size that is not a power of two;
causal (the own block first, later blocks never) and not; GQA group sums; N_q != N_k;
topk past the eligible blocks (-1 padding); NaN blocks ranked first; MoBA end to end
(select, then sparse_attention) against the twin's moba_attention; the errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attention import sparse as twin
from kernels.sparse import (
    index_topk,
    lightning_indexer,
    mean_pool,
    select_blocks,
    sparse_attention,
    topk_tokens,
)
from tests.kernels.sparse_tools import DEVICE, inputs, max_err


def small_integers(shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-2, 3, shape, generator=g).to(DEVICE, torch.float32)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize(
    "B, H, H_kv, N_q, N_k, d, bs, topk",
    [
        (1, 4, 2, 12, 56, 8, 16, 3),  # ragged last block of 8, decode-like
        (2, 2, 1, 30, 30, 4, 4, 5),  # many ties (d = 4)
        (1, 1, 1, 9, 40, 8, 8, 9),  # topk > blocks: -1 padding
        (1, 2, 2, 20, 8, 8, 4, 2),  # N_q > N_k: early rows see no block
    ],
)
def test_equal_to_twin_ties_included(causal, B, H, H_kv, N_q, N_k, d, bs, topk):
    q = small_integers((B, H, N_q, d), seed=N_q)
    k = small_integers((B, H_kv, N_k, d), seed=N_k)
    got = select_blocks(q, k, bs, topk, causal=causal, scale=0.5)
    want = twin.select_blocks(q.numpy(), k.numpy(), bs, topk, causal, 0.5)
    assert got.dtype == torch.int32 and got.shape == (B, H_kv, N_q, topk)
    assert np.array_equal(got.numpy(), want)
    if causal:  # the own block first, wherever a query sees a key
        pos = torch.arange(N_q) + N_k - N_q
        own = torch.where(pos >= 0, pos // bs, -1).to(torch.int32)
        assert torch.equal(got[..., 0], own.expand(B, H_kv, N_q))


def test_random_floats_odd_block_size():
    q, k, _ = inputs(1, 6, 2, 16, 47, 12, seed=21)
    for causal in (True, False):
        got = select_blocks(q, k, 5, 4, causal=causal)
        want = twin.select_blocks(q.numpy(), k.numpy(), 5, 4, causal)
        assert np.array_equal(got.numpy(), want)


def test_nan_block_ranks_first_and_mean_pool():
    q, k, _ = inputs(1, 2, 1, 6, 32, 8, seed=22)
    k[0, 0, 3, 0] = float("nan")  # block 0 of 8 keys
    got = select_blocks(q, k, 8, 2, causal=False)
    want = twin.select_blocks(q.numpy(), k.numpy(), 8, 2, False)
    assert np.array_equal(got.numpy(), want) and (got[..., 0] == 0).all()
    x, _, _ = inputs(2, 3, 1, 7, 1, 5, seed=23)
    assert (
        max_err(mean_pool(x, 3), torch.from_numpy(twin.mean_pool(x.numpy(), 3))) < 1e-6
    )


def test_moba_end_to_end():
    q, k, v = inputs(1, 4, 2, 10, 48, 16, seed=24)
    idx = select_blocks(q, k, 16, 2)
    o = sparse_attention(q, k, v, idx, 16)
    o_np = twin.moba_attention(q.numpy(), k.numpy(), v.numpy(), 16, 2)
    assert np.abs(o.numpy() - o_np).max() < 2e-4


@pytest.mark.parametrize(
    "change, exc, word",
    [
        (dict(topk=0), ValueError, "topk"),
        (dict(topk=1.5), TypeError, "topk"),
        (dict(block_size=0), ValueError, "block_size"),
        (dict(block_size=-1), ValueError, "block_size"),
        (dict(causal="yes"), TypeError, "causal"),
        (dict(scale="x"), TypeError, "scale"),
        (dict(k=torch.zeros(1, 3, 8, 4)), ValueError, "multiple"),
        (dict(k=torch.zeros(2, 1, 8, 4)), ValueError, "batch"),
        (dict(k=torch.zeros(1, 1, 8, 4, dtype=torch.float16)), TypeError, "dtype"),
    ],
)
def test_errors_name_the_argument(change, exc, word):
    kw = dict(
        q=torch.zeros(1, 2, 4, 4), k=torch.zeros(1, 1, 8, 4), block_size=4, topk=2
    )
    kw.update(change)
    with pytest.raises(exc, match=word):
        select_blocks(**kw)


def _indexer_inputs(B, N_q, N_k, h_i, d_i, seed, integers=False):
    g = torch.Generator().manual_seed(seed)
    if integers:  # exact scores in fp32 and fp64: ties must break alike
        draw = lambda *s: torch.randint(-2, 3, s, generator=g).float()  # noqa: E731
    else:
        draw = lambda *s: torch.randn(s, generator=g)  # noqa: E731
    return draw(B, N_q, h_i, d_i), draw(B, N_k, d_i), draw(B, N_q, h_i)


@pytest.mark.parametrize("integers", [False, True])
@pytest.mark.parametrize("causal", [True, False])
def test_lightning_indexer_and_topk_equal_twin(integers, causal):
    qi, ki, w = _indexer_inputs(2, 9, 21, 3, 4, seed=int(integers), integers=integers)
    got = lightning_indexer(qi, ki, w, causal=causal)
    want = twin.lightning_indexer(qi.numpy(), ki.numpy(), w.numpy(), causal)
    assert got.dtype == torch.float32
    assert np.array_equal(np.isneginf(got.numpy()), np.isneginf(want))
    fin = np.isfinite(want)
    assert np.abs(got.numpy()[fin] - want[fin]).max() < 1e-5
    idx = topk_tokens(got, 15, h_kv=2)  # more than the early rows see: -1 padding
    want_idx = twin.topk_tokens(want, 15, 2)
    assert idx.dtype == torch.int32 and np.array_equal(idx.numpy(), want_idx)
    assert torch.equal(index_topk(qi, ki, w, 15, causal, h_kv=2), idx)


def test_indexer_nan_and_errors_then_dsa_end_to_end():
    qi, ki, w = _indexer_inputs(1, 6, 12, 2, 8, seed=5)
    ki[0, 3, 0] = float("nan")  # token 3: NaN for every query that sees it
    s = lightning_indexer(qi, ki, w)
    idx = topk_tokens(s, 4)
    want = twin.topk_tokens(
        twin.lightning_indexer(qi.numpy(), ki.numpy(), w.numpy()), 4
    )
    assert np.array_equal(idx.numpy(), want) and (idx[0, 0, :, 0] == 3).all()
    q, k, v = inputs(1, 2, 1, 6, 12, 8, seed=6)
    o = sparse_attention(q, k, v, index_topk(qi, ki * 0 + 1, w, 5), 1)
    o_np = twin.sparse_attention(
        q.numpy(), k.numpy(), v.numpy(), index_topk(qi, ki * 0 + 1, w, 5).numpy(), 1
    )
    assert np.abs(o.numpy() - o_np).max() < 2e-4
    with pytest.raises(ValueError, match="weights"):
        lightning_indexer(qi, ki, w[..., :1])
    with pytest.raises(ValueError, match="d_I"):
        lightning_indexer(qi, ki[..., :3], w)
    with pytest.raises(ValueError, match="topk"):
        topk_tokens(s, 0)
    with pytest.raises(TypeError, match="causal"):
        index_topk(qi, ki, w, 2, causal=None)
