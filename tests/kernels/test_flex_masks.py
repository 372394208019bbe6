"""kernels.flex block masks: tile classification against closed forms and brute force,
sparsity, mask creation time at 32k, block skipping under the interpreter, and the
argument checks of create_block_mask, the mods and flex_attention."""

from __future__ import annotations

import math
import time

import pytest
import torch
import triton
import triton.language as tl  # noqa: F401  (the interpreter looks it up beside a jit fn)

from kernels.flex import (
    BlockMask,
    alibi,
    and_masks,
    causal_mask,
    create_block_mask,
    document_mask,
    flex_attention,
    or_masks,
    prefix_lm,
    sliding_window,
    softcap,
)
from tests.kernels.interpreter_work import count_dots


def brute_state(vis, bs):
    """(nq, nk) 0 empty / 1 partial / 2 full from an explicit (N_q, N_k) mask."""
    n_q, n_k = vis.shape
    nq, nk = -(-n_q // bs), -(-n_k // bs)
    out = torch.empty(nq, nk, dtype=torch.int8)
    for i in range(nq):
        for j in range(nk):
            t = vis[i * bs : (i + 1) * bs, j * bs : (j + 1) * bs]
            out[i, j] = 2 if t.all() else (1 if t.any() else 0)
    return out


def pairs(n_q, n_k):
    return torch.arange(n_q)[:, None], torch.arange(n_k)[None, :]


@pytest.mark.parametrize("n_q, n_k", [(256, 256), (200, 136), (96, 250)])
def test_closed_forms_classify_exactly_as_brute_force(n_q, n_k):
    qi, ki = pairs(n_q, n_k)
    ids = torch.arange(max(n_q, n_k)) // 50
    cases = [
        (causal_mask, qi >= ki),
        (sliding_window(40), (qi - ki >= 0) & (qi - ki < 40)),
        (prefix_lm(70), (ki < 70) | (qi >= ki)),
        (document_mask(ids), ids[:n_q, None] == ids[None, :n_k]),
        (or_masks(prefix_lm(20), sliding_window(5)), (ki < 20) | (qi >= ki)),
    ]
    for mod, vis in cases:
        bm = create_block_mask(mod, None, None, n_q, n_k, BLOCK_SIZE=32)
        assert torch.equal(bm.state[0, 0], brute_state(vis, 32)), mod


@triton.jit
def my_window(b, h, q_idx, kv_idx):  # a user's mod: classified by the Triton kernel
    return (q_idx - kv_idx >= 0) & (q_idx - kv_idx < 40)


def test_a_user_mod_is_classified_tile_by_tile_on_the_device():
    bm = create_block_mask(my_window, None, None, 200, 136, BLOCK_SIZE=32)
    qi, ki = pairs(200, 136)
    assert torch.equal(bm.state[0, 0], brute_state((qi - ki >= 0) & (qi - ki < 40), 32))
    both = create_block_mask(
        and_masks(my_window, causal_mask), 1, 1, 200, 136, BLOCK_SIZE=32
    )
    assert torch.equal(both.state, bm.state)


def test_and_masks_is_conservative_never_wrong():
    # and: "full" only where every mod is full; "some" may over-approximate
    ids = torch.arange(256) // 100
    qi, ki = pairs(256, 256)
    vis = (qi >= ki) & (ids[:, None] == ids[None, :])
    bm = create_block_mask(
        and_masks(causal_mask, document_mask(ids)), 1, 1, 256, 256, BLOCK_SIZE=32
    )
    exact = brute_state(vis, 32)
    state = bm.state[0, 0]
    assert torch.equal(state == 2, exact == 2)
    assert torch.all((state != 0) >= (exact != 0))


def test_lists_and_their_transpose():
    bm = create_block_mask(sliding_window(50), None, None, 128, 128, BLOCK_SIZE=16)
    st = bm.state[0, 0]
    for i in range(8):
        n = int(bm.kv_num_blocks[0, 0, i])
        assert (
            bm.kv_indices[0, 0, i, :n].tolist()
            == torch.nonzero(st[i] == 1)[:, 0].tolist()
        )
        n = int(bm.full_q_num_blocks[0, 0, i])
        got = bm.full_q_indices[0, 0, i, :n].tolist()
        assert got == torch.nonzero(st[:, i] == 2)[:, 0].tolist()


@pytest.mark.parametrize("n, bs", [(1024, 64), (4096, 128)])
def test_sparsity_matches_the_closed_form(n, bs):
    t = n // bs  # tiles per side
    assert create_block_mask(
        causal_mask, None, None, n, n, BLOCK_SIZE=bs
    ).sparsity() == (pytest.approx(100 * (1 - (t * (t + 1) / 2) / t**2)))
    for w in (64, 3 * bs, 1000):
        # tile row i visits tiles i - ceil((w - 1) / bs) ... i (clipped at 0)
        back = -(-(w - 1) // bs)
        visited = sum(min(i, back) + 1 for i in range(t))
        got = create_block_mask(sliding_window(w), None, None, n, n, BLOCK_SIZE=bs)
        assert got.sparsity() == pytest.approx(100 * (1 - visited / t**2)), w
    doc = 256  # documents of 256 keys: block-diagonal
    ids = torch.arange(n) // doc
    got = create_block_mask(document_mask(ids), None, None, n, n, BLOCK_SIZE=bs)
    assert got.sparsity() == pytest.approx(
        100 * (1 - (n // doc) * (doc / bs) ** 2 / t**2)
    )


def test_ready_made_block_masks_at_32k_take_under_two_seconds():
    n = 32768
    ids = torch.arange(n) // 2048
    mods = [
        causal_mask,
        sliding_window(4096),
        prefix_lm(1024),
        document_mask(ids),
        and_masks(causal_mask, document_mask(ids)),
        or_masks(prefix_lm(512), sliding_window(128)),
    ]
    for mod in mods:
        t0 = time.perf_counter()
        bm = create_block_mask(mod, None, None, n, n)
        assert time.perf_counter() - t0 < 2.0, mod
        assert bm.kv_indices.shape == (1, 1, 256, 256)


def test_block_skipping_is_real_under_the_interpreter():
    # window 64 visits 31 of the 136 causal tiles at N = 1024, 64 x 64 tiles: the
    # forward runs two dots (QK^T, PV) per tile it visits, none for a tile it skips
    # (counted, tests/kernels/interpreter_work.py: exact, where CPU time drifts)
    n = 1024
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, n, 16, generator=g) for _ in range(3))
    causal = create_block_mask(causal_mask, None, None, n, n, BLOCK_SIZE=64)
    window = create_block_mask(sliding_window(64), None, None, n, n, BLOCK_SIZE=64)
    tiles = [
        sum(bm.counts()[c] for c in ("partial", "full")) for bm in (causal, window)
    ]
    assert tiles == [136, 31]
    dots = [
        count_dots(lambda m=m: flex_attention(q, k, v, block_mask=m))
        for m in (causal, window)
    ]
    assert dots == [2 * t for t in tiles], (dots, tiles)


def test_bad_arguments_are_refused_by_name():
    q = torch.randn(1, 2, 64, 16)
    k = v = torch.randn(1, 2, 64, 16)
    bm = create_block_mask(causal_mask, None, None, 64, 64, BLOCK_SIZE=16)
    with pytest.raises(ValueError, match="window"):
        sliding_window(0)
    with pytest.raises(TypeError, match="window"):
        sliding_window(2.5)
    with pytest.raises(ValueError, match="cap"):
        softcap(0.0)
    with pytest.raises(ValueError, match="cap"):
        softcap(-1)
    with pytest.raises(ValueError, match="prefix_length"):
        prefix_lm(-1)
    with pytest.raises(TypeError, match="document_ids"):
        document_mask(torch.zeros(8))
    with pytest.raises(ValueError, match="document_ids"):
        create_block_mask(
            document_mask(torch.zeros(32, dtype=torch.long)), 1, 1, 64, 64
        )
    with pytest.raises(ValueError, match="BLOCK_SIZE"):
        create_block_mask(causal_mask, 1, 1, 64, 64, BLOCK_SIZE=24)
    with pytest.raises(TypeError, match="mask_mod"):
        create_block_mask(lambda b, h, qi, ki: qi >= ki, 1, 1, 64, 64)
    with pytest.raises(ValueError, match="block_mask"):
        flex_attention(q[:, :, :32], k, v, block_mask=bm)  # made for 64 x 64
    with pytest.raises(TypeError, match="block_mask"):
        flex_attention(q, k, v, block_mask="causal")
    with pytest.raises(ValueError, match="sinks"):
        flex_attention(q, k, v, block_mask=bm, sinks=torch.zeros(3))
    with pytest.raises(ValueError, match="enable_gqa"):
        flex_attention(q, k[:, :1], v[:, :1])
    with pytest.raises(ValueError, match="v must be"):
        flex_attention(q, k, v[:, :, :32])
    with pytest.raises(ValueError, match="scale"):
        flex_attention(q, k, v, scale=math.inf)
    with pytest.raises(TypeError, match="score_mod"):
        flex_attention(q, k, v, score_mod=causal_mask)
    with pytest.raises(ValueError, match="score_mod"):
        flex_attention(q, k, v, score_mod=alibi(torch.ones(3)))
    with pytest.raises(TypeError, match="return_lse"):
        flex_attention(q, k, v, return_lse=1)
    assert isinstance(bm, BlockMask) and "sparsity" in repr(bm)


def test_sm75_backward_above_d64_is_refused_by_the_tile_table():
    from kernels.flex import tiles

    assert tiles.configs("fwd", (7, 5), 128, torch.float16) is not None
    assert tiles.configs("dkdv", (7, 5), 64, torch.float16) is not None
    assert tiles.configs("dq", (7, 5), 128, torch.float16) is None
    with pytest.raises(ValueError, match="head dims above 64"):
        tiles.tiles("dkdv", (7, 5), 256, torch.float16, (128, 128), False)
    with pytest.raises(ValueError, match="kernel"):
        tiles.configs("bwd", (9, 0), 64, torch.float16)
