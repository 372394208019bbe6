"""Issue 50, the kernel side: block masks of per-head and per-batch mods that torch
broadcasts (item 2), ``BlockMask.sparsity`` beside PyTorch's own (item 13),
``topk_tokens`` on float64 scores (item 8), the meta device (item 10) and block sizes
far past the sequence (item 5)."""

from __future__ import annotations

import math
import time

import pytest
import torch

from kernels.flex import (
    and_masks,
    causal_mask,
    create_block_mask,
    dense_mask,
    document_mask,
    flex_attention,
)

N, BS = 40, 16


def brute(vis: torch.Tensor, bs: int) -> torch.Tensor:
    """(..., nq, nk) 0 empty / 1 partial / 2 full from an explicit (..., N, N) mask."""
    *lead, n_q, n_k = vis.shape
    nq, nk = -(-n_q // bs), -(-n_k // bs)
    out = torch.empty(*lead, nq, nk, dtype=torch.int8)
    for i in range(nq):
        for j in range(nk):
            t = vis[..., i * bs : (i + 1) * bs, j * bs : (j + 1) * bs]
            t = t.reshape(*lead, -1)
            out[..., i, j] = torch.where(t.all(-1), 2, torch.where(t.any(-1), 1, 0))
    return out


# ---------------------------------------------------------------------------------
# 2. Per-head dense masks with B given; a per-batch document mask and a per-head dense
#    mask combined (torch broadcasts both)
# ---------------------------------------------------------------------------------


@pytest.mark.parametrize("B", [None, 1, 2])
def test_a_per_head_dense_mask_with_b_given(B):
    g = torch.Generator().manual_seed(0)
    m = torch.rand(3, N, N, generator=g) > 0.5
    m[1] = True  # one head all full, one with empty tiles
    m[2, :, 16:] = False
    bm = create_block_mask(dense_mask(m), B, 3, N, N, BLOCK_SIZE=BS)
    want = brute(m, BS).expand(B or 1, 3, -1, -1)
    assert torch.equal(bm.state.cpu(), want)


@pytest.mark.parametrize("B, H", [(2, 3), (None, None), (2, None), (None, 3)])
def test_and_masks_of_a_per_batch_document_and_a_per_head_dense_mask(B, H):
    g = torch.Generator().manual_seed(1)
    ids = torch.tensor([[0] * 10 + [1] * 30, [0] * 25 + [2] * 15])  # (2, N), sorted
    m = torch.rand(3, N, N, generator=g) > 0.3
    m[0] = True
    got = create_block_mask(
        and_masks(document_mask(ids), dense_mask(m)), B, H, N, N, BLOCK_SIZE=BS
    )
    vis = (ids[:, None, :, None] == ids[:, None, None, :]) & m[None]  # (2, 3, N, N)
    # "some" of an and is conservative (a tile may be partial where it is empty);
    # "every" and the visited pairs are exact
    want = brute(vis, BS)
    s = got.state.cpu()
    assert s.shape == (2, 3, 3, 3)
    assert torch.equal(s == 2, want == 2)
    assert ((s == 0) <= (want == 0)).all()
    # a mixed extent the mods do not share is refused by name
    with pytest.raises(ValueError, match="batch"):
        create_block_mask(
            and_masks(document_mask(ids), dense_mask(m.expand(3, 3, N, N))),
            None, None, N, N, BLOCK_SIZE=BS,
        )  # fmt: skip


# ---------------------------------------------------------------------------------
# 13. sparsity() beside PyTorch's own, on ragged lengths
# ---------------------------------------------------------------------------------


def _torch_causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


@pytest.mark.parametrize(
    "q_len, kv_len, bs, B, H",
    [(100, 100, 128, None, None), (200, 200, 128, None, None), (256, 256, 128, 1, 1),
     (130, 70, 64, None, None), (40, 40, 16, 2, 3), (64, 64, 16, 2, 1)],
)  # fmt: skip
def test_sparsity_beside_pytorchs(q_len, kv_len, bs, B, H):
    from torch.nn.attention import flex_attention as tfa

    from attention import masks as M
    from kernels.flex import causal_mask

    theirs = tfa.create_block_mask(
        _torch_causal, B, H, q_len, kv_len, device="cpu", BLOCK_SIZE=bs
    )
    ours = create_block_mask(causal_mask, B, H, q_len, kv_len, BLOCK_SIZE=bs)
    assert ours.sparsity(torch_formula=True) == pytest.approx(theirs.sparsity())
    nq, nk = -(-q_len // bs), -(-kv_len // bs)
    visited = sum(min(nk, (min(q_len, (i + 1) * bs) - 1) // bs + 1) for i in range(nq))
    assert ours.sparsity() == pytest.approx(100 * (1 - visited / (nq * nk)))
    assert 0 <= ours.sparsity() <= 100
    if q_len % bs == 0 and kv_len % bs == 0:
        assert ours.sparsity() == pytest.approx(theirs.sparsity())
    # the NumPy twin: the same two numbers
    np_bm = M.block_mask(M.causal_mask, q_len, kv_len, bs)
    assert np_bm.sparsity() == pytest.approx(ours.sparsity())
    if B is None and H is None:
        assert np_bm.sparsity(torch_formula=True) == pytest.approx(theirs.sparsity())
    with pytest.raises(TypeError, match="^torch_formula must be a bool"):
        ours.sparsity(torch_formula="yes")


# ---------------------------------------------------------------------------------
# 8. topk_tokens ranks float64 scores in float64, as its NumPy twin
# ---------------------------------------------------------------------------------


def test_topk_tokens_ranks_float64_in_float64():
    from attention import sparse as np_sparse
    from kernels.sparse import topk_tokens

    inf = float("inf")
    s = torch.tensor(
        [
            [[1.0, 1.0 + 1e-12, 1.0 - 1e-12, -inf, 0.5]],  # equal in fp32
            [[1e300, 1e301, -1e300, 2.0, float("nan")]],  # past fp32's range
            [[0.0, -0.0, 1e-320, -inf, -inf]],  # -0 == +0; a subnormal above both
        ],
        dtype=torch.float64,
    )
    for k in (1, 3, 5, 7):
        got = topk_tokens(s, k, h_kv=2)
        want = np_sparse.topk_tokens(s.numpy(), k, h_kv=2)
        assert got.dtype == torch.int32 and got.shape == (3, 2, 1, k)
        assert got.numpy().tolist() == want.tolist(), k
    assert topk_tokens(s, 2)[0, 0, 0].tolist() == [1, 0]
    assert topk_tokens(s, 3)[1, 0, 0].tolist() == [4, 1, 0]  # NaN first
    assert topk_tokens(s, 3)[2, 0, 0].tolist() == [2, 0, 1]
    # float32 scores keep their ranking
    s32 = s[:1].float()
    assert topk_tokens(s32, 3)[0, 0, 0].tolist() == [0, 1, 2]


# ---------------------------------------------------------------------------------
# 10. The meta device: refused by name, not a raw error from .item()
# ---------------------------------------------------------------------------------


def test_the_meta_device_is_refused_by_name():
    from kernels.flash import flash_attention
    from kernels.flex import causal_mask, flex_attention
    from kernels.sparse import sparse_attention

    q = torch.empty(1, 1, 16, 16, device="meta")
    idx = torch.zeros(1, 1, 16, 1, dtype=torch.int32, device="meta")
    for call, name in (
        (lambda: flex_attention(q, q, q), "q, k, v"),
        (lambda: flash_attention(q, q, q), "q, k, v"),
        (lambda: sparse_attention(q, q, q, idx, 16), "q, k, v"),
        (
            lambda: create_block_mask(
                causal_mask, None, None, 16, 16, device="meta", BLOCK_SIZE=16
            ),
            "device",
        ),
    ):
        with pytest.raises(ValueError, match=rf"^{name} must be on a CPU or CUDA"):
            call()


# ---------------------------------------------------------------------------------
# 5. A block size far past the sequence: the kernels walk the keys (and, in the dK/dV
#    pass, the queries) there are, not BLOCK_SIZE // BLOCK_N steps of a tile that
#    holds 30 keys (2^20 at N = 30 took ~100 s under the interpreter)
# ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "block_size", [2**20, (16, 2**20), (2**20, 16)], ids=["both", "keys", "queries"]
)
def test_a_block_size_far_past_the_sequence_costs_what_the_sequence_costs(block_size):
    n = 30
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 2, n, 16, generator=g).requires_grad_() for _ in "qkv")
    start = time.perf_counter()
    bm = create_block_mask(causal_mask, None, None, n, n, BLOCK_SIZE=block_size)
    o, lse = flex_attention(q, k, v, block_mask=bm, return_lse=True)
    do = torch.randn(o.shape, generator=g)
    got = torch.autograd.grad((o * do).sum() + lse.sum(), (q, k, v))
    took = time.perf_counter() - start
    assert took < 10.0, took  # ~0.3 s; a walk of BLOCK_SIZE takes minutes
    qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
    s = (qd @ kd.transpose(-1, -2) / math.sqrt(16)).masked_fill(
        ~torch.ones(n, n, dtype=torch.bool).tril(), -math.inf
    )
    rl = torch.logsumexp(s, -1)
    ro = torch.softmax(s, -1) @ vd
    assert (o.double() - ro).abs().max() < 2e-5
    assert (lse.double() - rl).abs().max() < 2e-5
    want = torch.autograd.grad((ro * do).sum() + rl.sum(), (qd, kd, vd))
    for name, a, b in zip("qkv", got, want):
        assert (a.double() - b).abs().max() < 2e-5, name
