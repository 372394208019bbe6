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
from kernels.sparse import mean_pool, select_blocks, sparse_attention
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
