"""kernels.sparse.sparse_attention under the Triton interpreter against an fp64
reference written from the definition (tests/kernels/sparse_tools.py) and against the
NumPy twin attention.sparse: random budgets (padding), block sizes 1 / 16 / 64 and
ones that are not powers of two, GQA groups, causal and not, N_q != N_k, forward,
lse and backward; the NaN and empty-row rules; the argument errors.

Tolerances: fp32 inputs, fp32 accumulation over at most a few hundred keys of O(1)
terms: each score and sum carries ~sqrt(n) * 6e-8 relative rounding, exp2 a few ulps,
so errors are a few 1e-6; 2e-4 absolute on O(1) outputs and gradients bounds that
widely and still fails a wrong mask, index or formula (those err by 1e-2 or more).
fp16/bf16: the inputs' and P's rounding, 2^-11 / 2^-8 relative, bounded by 1e-2 /
4e-2.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attention import sparse as twin
from kernels.sparse import sparse_attention
from tests.kernels.sparse_tools import (
    inputs,
    max_err,
    random_indices,
    ref_grads,
    reference,
)

TOL = 2e-4

# (B, H_q, H_kv, N_q, N_k, d, block_size, S, causal)
FORWARD_CASES = [
    (1, 2, 1, 12, 30, 16, 1, 9, True),  # DSA tokens, decode-like N_q < N_k, G = 2
    (2, 2, 2, 9, 50, 20, 16, 2, False),  # MHA, odd head dim
    (1, 4, 1, 10, 150, 32, 64, 2, True),  # G = 4, ragged last block
    (1, 3, 1, 20, 12, 8, 5, 3, True),  # N_q > N_k: empty rows; block size 5
]


@pytest.mark.parametrize("case", FORWARD_CASES, ids=lambda c: f"bs{c[6]}-c{c[8]}")
def test_forward_matches_fp64_and_twin(case):
    B, H, H_kv, N_q, N_k, d, bs, S, causal = case
    q, k, v = inputs(B, H, H_kv, N_q, N_k, d, seed=len(case) + bs)
    idx = random_indices(B, H_kv, N_q, -(-N_k // bs), S, seed=bs)
    o, lse = sparse_attention(q, k, v, idx, bs, causal=causal, return_lse=True)
    o_ref, lse_ref = reference(q.double(), k.double(), v.double(), idx, bs, causal)
    assert o.dtype == q.dtype and lse.dtype == torch.float32
    assert max_err(o, o_ref) < TOL
    empty = torch.isneginf(lse_ref)
    assert torch.equal(torch.isneginf(lse), empty)
    assert max_err(lse[~empty], lse_ref[~empty]) < TOL
    assert (o[empty] == 0).all()
    o_np, lse_np = twin.sparse_attention(
        q.numpy(),
        k.numpy(),
        v.numpy(),
        idx.numpy(),
        bs,
        causal=causal,
        return_lse=True,
    )
    assert np.abs(o.numpy() - o_np).max() < TOL
    assert np.array_equal(np.isneginf(lse_np), empty.numpy())


@pytest.mark.parametrize(
    "case",
    [
        (1, 4, 2, 10, 40, 16, 16, 2, True),  # GQA, decode-like, causal
        (1, 2, 1, 8, 20, 12, 1, 7, False),  # tokens, not causal, odd head dim
    ],
    ids=["bs16-causal", "bs1"],
)
def test_backward_matches_fp64(case):
    B, H, H_kv, N_q, N_k, d, bs, S, causal = case
    q, k, v = inputs(B, H, H_kv, N_q, N_k, d, seed=3)
    idx = random_indices(B, H_kv, N_q, -(-N_k // bs), S, seed=4)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    o, lse = sparse_attention(q, k, v, idx, bs, causal=causal, return_lse=True)
    g = torch.Generator().manual_seed(5)
    do = torch.randn(o.shape, generator=g)
    dlse = torch.randn(lse.shape, generator=g)
    finite = torch.isfinite(lse.detach())
    loss = (o * do).sum() + torch.where(finite, lse * dlse, 0).sum()
    grads = torch.autograd.grad(loss, (q, k, v))
    o_ref, _, grads_ref = ref_grads(q, k, v, idx, bs, causal, do, dlse)
    assert max_err(o.detach(), o_ref) < TOL
    for name, a, b in zip("qkv", grads, grads_ref):
        assert a.dtype == torch.float32
        assert max_err(a, b) < TOL, name


def test_half_precision():
    q, k, v = inputs(1, 2, 1, 6, 40, 16, seed=7)
    idx = random_indices(1, 1, 6, 3, 2, seed=8, pad=0.0)
    o_ref, _ = reference(q.double(), k.double(), v.double(), idx, 16, True)
    for dtype, tol in ((torch.float16, 1e-2), (torch.bfloat16, 4e-2)):
        qh, kh, vh = (t.to(dtype) for t in (q, k, v))
        o = sparse_attention(qh, kh, vh, idx, 16)
        assert o.dtype == dtype and max_err(o, o_ref) < tol


def test_nan_reaches_only_the_rows_that_read_it():
    B, H, H_kv, N_q, N_k, d, bs = 1, 2, 1, 6, 32, 16, 16
    q, k, v = inputs(B, H, H_kv, N_q, N_k, d, seed=9)
    idx = torch.tensor([[[[0, -1], [1, 0], [0, -1], [-1, -1], [1, -1], [0, 1]]]])
    idx = idx.to(torch.int32)
    base, base_lse = sparse_attention(q, k, v, idx, bs, causal=True, return_lse=True)
    # row 3 chose nothing: 0 and -inf, never NaN
    assert (base[:, :, 3] == 0).all() and torch.isneginf(base_lse[:, :, 3]).all()
    qn, kn, vn = q.clone(), k.clone(), v.clone()
    qn[0, 1, 2, 0] = float("nan")  # head 1, row 2: its own row only
    kn[0, 0, 31, 3] = float("nan")  # key 31 (block 1): hidden from every row but 5
    vn[0, 0, 31, 0] = float("nan")  # (row 5 sits at 5 + 26 = 31: it sees key 31)
    o, lse = sparse_attention(qn, kn, vn, idx, bs, causal=True, return_lse=True)
    nan = torch.zeros(o.shape[:3], dtype=torch.bool)
    nan[0, 1, 2] = True
    nan[0, :, 5] = True
    assert torch.equal(torch.isnan(o).any(-1), nan)
    assert torch.equal(torch.isnan(lse), nan)
    assert torch.equal(o[~nan], base[~nan]) and torch.isneginf(lse[0, :, 3]).all()
    # the gradients: the NaN row's and the read key's, nothing else; empty row 0
    qg, kg, vg = (t.requires_grad_() for t in (qn, kn, vn))
    out = sparse_attention(qg, kg, vg, idx, bs, causal=True)
    dq, dk, dv = torch.autograd.grad(out.sum(), (qg, kg, vg))
    assert torch.equal(torch.isnan(dq).any(-1), nan)
    assert (dq[0, :, 3] == 0).all()
    read = keys_read(idx, N_k, bs, rows=[2, 5])
    assert torch.equal(torch.isnan(dk[0, 0]).any(-1), read)
    assert torch.equal(torch.isnan(dv[0, 0]).any(-1), read)


def keys_read(idx, N_k, bs, rows):
    """Keys that any of ``rows`` (causal, N_q = 6 at positions 26 ... 31) reads."""
    read = torch.zeros(N_k, dtype=torch.bool)
    for i in rows:
        for c in idx[0, 0, i].tolist():
            if c >= 0:
                j = torch.arange(c * bs, min((c + 1) * bs, N_k))
                read[j[j <= i + N_k - idx.shape[2]]] = True
    return read


def test_all_padding_and_empty_selection():
    q, k, v = inputs(1, 2, 2, 4, 20, 16, seed=11)
    for S in (0, 3):
        idx = torch.full((1, 2, 4, S), -1, dtype=torch.int32)
        o, lse = sparse_attention(q, k, v, idx, 4, causal=False, return_lse=True)
        assert (o == 0).all() and torch.isneginf(lse).all()


def test_int64_indices_and_order_do_not_matter():
    q, k, v = inputs(1, 2, 1, 5, 40, 16, seed=12)
    idx = random_indices(1, 1, 5, 5, 4, seed=13)
    a = sparse_attention(q, k, v, idx, 8, causal=False)
    b = sparse_attention(q, k, v, idx.flip(-1).long(), 8, causal=False)
    assert max_err(a, b) < 1e-6


def _args():
    q, k, v = inputs(1, 2, 1, 4, 32, 16, seed=14)
    return q, k, v, torch.zeros((1, 1, 4, 2), dtype=torch.int32)


@pytest.mark.parametrize(
    "change, exc, word",
    [
        (dict(block_size=0), ValueError, "block_size"),
        (dict(block_size=-4), ValueError, "block_size"),
        (dict(block_size=2.0), TypeError, "block_size"),
        (dict(causal=1), TypeError, "causal"),
        (dict(return_lse=None), TypeError, "return_lse"),
        (dict(scale=float("inf")), ValueError, "scale"),
        (dict(kv_indices="x"), TypeError, "kv_indices"),
        (dict(kv_indices=torch.zeros((1, 1, 4, 2))), TypeError, "kv_indices"),
        (
            dict(kv_indices=torch.zeros((1, 2, 4, 2), dtype=torch.int32)),
            ValueError,
            "kv_indices",
        ),
        (
            dict(kv_indices=torch.full((1, 1, 4, 2), 2, dtype=torch.int32)),
            ValueError,
            "outside",
        ),
        (
            dict(kv_indices=torch.full((1, 1, 4, 2), -2, dtype=torch.int32)),
            ValueError,
            "outside",
        ),
        (
            dict(kv_indices=torch.ones((1, 1, 4, 2), dtype=torch.int32)),
            ValueError,
            "repeats",
        ),
        (dict(k=torch.zeros(1, 3, 32, 16)), ValueError, "multiple"),
        (dict(k=torch.zeros(1, 1, 32, 8)), ValueError, "head dim"),
        (dict(v=torch.zeros(1, 1, 31, 16)), ValueError, "v"),
        (dict(v=torch.zeros(1, 1, 32, 16, dtype=torch.float16)), TypeError, "v"),
        (dict(q=torch.zeros(2, 4, 16)), ValueError, "q"),
        (dict(q=torch.zeros(1, 2, 4, 16, dtype=torch.float64)), TypeError, "q"),
    ],
)
def test_errors_name_the_argument(change, exc, word):
    q, k, v, idx = _args()
    kw = dict(q=q, k=k, v=v, kv_indices=idx, block_size=16)
    kw.update(change)
    with pytest.raises(exc, match=word):
        sparse_attention(**kw)
