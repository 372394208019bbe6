"""kernels.naive: the naive PyTorch baseline and the fp64 reference the kernels are
held to."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from attention import core
from kernels.naive import causal_mask, naive_attention, reference_attention

pytestmark = pytest.mark.xdist_group("flash")


def _qkv(B, H, H_kv, N_q, N_k, d, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, N_q, d, generator=g, dtype=torch.float64).to(dtype)
    k = torch.randn(B, H_kv, N_k, d, generator=g, dtype=torch.float64).to(dtype)
    v = torch.randn(B, H_kv, N_k, d, generator=g, dtype=torch.float64).to(dtype)
    return q, k, v


def _numpy_attention(q, k, v, causal, scale):
    """Per-head NumPy twin (attention.core softmax/mask), GQA by repeating k/v heads."""
    group = q.shape[1] // k.shape[1]
    k = np.repeat(k.numpy(), group, axis=1)  # (B, H, N_k, d)
    v = np.repeat(v.numpy(), group, axis=1)  # (B, H, N_k, d)
    s = q.numpy() @ np.swapaxes(k, -1, -2) * scale  # (B, H, N_q, N_k)
    mask = core.causal_mask(q.shape[2], k.shape[2]) if causal else None
    return core.softmax(s, mask=mask) @ v


@pytest.mark.parametrize("n_q,n_k", [(5, 5), (3, 7), (7, 3)])
def test_causal_mask_matches_numpy_twin(n_q, n_k):
    np.testing.assert_array_equal(
        causal_mask(n_q, n_k).numpy(), core.causal_mask(n_q, n_k)
    )


@pytest.mark.parametrize(
    "B,H,H_kv,N_q,N_k,d,causal",
    [
        (2, 2, 2, 9, 9, 8, False),
        (1, 4, 2, 6, 11, 4, True),
        (1, 3, 1, 12, 5, 16, True),
        (2, 2, 1, 7, 7, 5, True),
    ],
)
def test_naive_and_reference_match_numpy(B, H, H_kv, N_q, N_k, d, causal):
    q, k, v = _qkv(B, H, H_kv, N_q, N_k, d)
    expected = _numpy_attention(q, k, v, causal, 1 / math.sqrt(d))
    o_ref, lse = reference_attention(q, k, v, causal)
    np.testing.assert_allclose(
        naive_attention(q, k, v, causal).numpy(), expected, atol=1e-12
    )
    np.testing.assert_allclose(o_ref.numpy(), expected, atol=1e-12)
    assert lse.shape == (B, H, N_q) and lse.dtype == torch.float64


def test_reference_lse_is_logsumexp_of_scores():
    q, k, v = _qkv(1, 2, 2, 6, 9, 4)
    _, lse = reference_attention(q, k, v, causal=True, scale=0.3)
    s = (q @ k.transpose(-1, -2)) * 0.3  # (B, H, N_q, N_k)
    s = s.masked_fill(~causal_mask(6, 9), float("-inf"))
    torch.testing.assert_close(lse, torch.logsumexp(s, -1), atol=1e-12, rtol=0)


def test_matches_torch_sdpa():
    q, k, v = _qkv(2, 3, 3, 10, 10, 8, dtype=torch.float32)
    for causal in (False, True):
        torch.testing.assert_close(
            naive_attention(q, k, v, causal),
            F.scaled_dot_product_attention(q, k, v, is_causal=causal),
            atol=1e-5,
            rtol=1e-5,
        )


def test_fully_masked_rows_are_zero_and_grads_finite():
    # causal with N_q > N_k: the first N_q - N_k queries see no key at all
    q, k, v = (t.requires_grad_() for t in _qkv(1, 2, 2, 8, 3, 4))
    o = naive_attention(q, k, v, causal=True)
    o_ref, lse = reference_attention(q, k, v, causal=True)
    assert torch.all(o[:, :, :5] == 0) and torch.all(o_ref[:, :, :5] == 0)
    assert torch.all(torch.isneginf(lse[:, :, :5]))
    assert torch.all(torch.isfinite(lse[:, :, 5:]))
    (o.sum() + o_ref.sum()).backward()
    for t in (q, k, v):
        assert torch.all(torch.isfinite(t.grad))
    assert torch.all(q.grad[:, :, :5] == 0)


def test_reference_is_differentiable_and_matches_naive_grads():
    q, k, v = (t.requires_grad_() for t in _qkv(1, 4, 2, 5, 7, 3))
    do = torch.randn(1, 4, 5, 3, dtype=torch.float64)
    g_naive = torch.autograd.grad(
        (naive_attention(q, k, v, True) * do).sum(), (q, k, v)
    )
    g_ref = torch.autograd.grad(
        (reference_attention(q, k, v, True)[0] * do).sum(), (q, k, v)
    )
    for a, b in zip(g_naive, g_ref):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=0)


@pytest.mark.parametrize(
    "args,exc,match",
    [
        (
            (torch.zeros(2, 3, 4), torch.zeros(2, 3, 4, 5), torch.zeros(2, 3, 4, 5)),
            ValueError,
            "q",
        ),
        (
            (torch.zeros(1, 4, 3, 8), torch.zeros(1, 3, 3, 8), torch.zeros(1, 3, 3, 8)),
            ValueError,
            "multiple",
        ),
        (
            (torch.zeros(1, 2, 3, 8), torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4)),
            ValueError,
            "k",
        ),
        (
            (torch.zeros(1, 2, 3, 8), torch.zeros(1, 2, 3, 8), torch.zeros(1, 2, 4, 8)),
            ValueError,
            "v",
        ),
        ((torch.zeros(1, 2, 3, 8, dtype=torch.long),) * 3, TypeError, "dtype"),
    ],
)
def test_bad_inputs(args, exc, match):
    with pytest.raises(exc, match=match):
        naive_attention(*args)
    with pytest.raises(exc, match=match):
        reference_attention(*args)
