"""kernels.flex.flex_attention under the Triton interpreter against an fp64 reference
written here from the definitions (the visible-pair matrix of each mask, the score mod,
the sink in the denominator), forward, lse and backward (q, k, v and sinks).

Tolerances: fp32 inputs, fp32 accumulation over <= 256 keys of O(1) terms: relative
errors of a few 1e-6 (each score and each sum carries ~sqrt(N) * 6e-8 rounding, the
exp2 and the tanh of softcap a few ulps); 2e-4 absolute on O(1) outputs and gradients
bounds that with a wide margin, and still fails any wrong mask, tile or formula (those
err by O(1e-2) or more).
"""

from __future__ import annotations

import math

import pytest
import torch
import triton
import triton.language as tl

from kernels.flex import (
    alibi,
    and_masks,
    causal_mask,
    create_block_mask,
    dense_mask,
    document_mask,
    flex_attention,
    or_masks,
    prefix_lm,
    sliding_window,
    softcap,
)

TOL = 2e-4


def visible(name, n_q, n_k, **kw):
    """The (N_q, N_k) (or (B, N_q, N_k)) visible pairs of a mask, by its definition."""
    qi = torch.arange(n_q)[:, None]
    ki = torch.arange(n_k)[None, :]
    if name == "causal":
        return qi >= ki
    if name == "window":
        return (qi - ki >= 0) & (qi - ki < kw["window"])
    if name == "prefix":
        return (ki < kw["prefix"]) | (qi >= ki)
    if name == "document":
        ids = kw["ids"]
        return ids[..., :n_q, None] == ids[..., None, :n_k]
    raise ValueError(name)


def reference(q, k, v, vis, score=None, sinks=None, scale=None):
    """(o, lse) in fp64: softmax over the visible pairs (+ the sink), o = 0 and lse =
    -inf (or the sink) for a row with none."""
    q, k, v = q.double(), k.double(), v.double()
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = q @ k.transpose(-1, -2) * scale
    if score is not None:
        s = score(s)
    vis = vis.reshape((-1, 1) + tuple(vis.shape[-2:])) if vis.ndim == 3 else vis
    s = s.masked_fill(~vis, -math.inf)
    parts = s
    if sinks is not None:
        sk = sinks.double()[None, :, None, None].expand(s.shape[0], -1, s.shape[2], 1)
        parts = torch.cat([s, sk], -1)
    lse = torch.logsumexp(parts, -1)
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)
    return p @ v, lse


def inputs(B, H, H_kv, n_q, n_k, d, dv, seed=0, grad=True):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, n_q, d, generator=g)
    k = torch.randn(B, H_kv, n_k, d, generator=g)
    v = torch.randn(B, H_kv, n_k, dv, generator=g)
    return [t.requires_grad_(grad) for t in (q, k, v)]


def check(q, k, v, bm, vis, score_mod=None, score=None, sinks=None, bwd=True, **kw):
    o, lse = flex_attention(
        q,
        k,
        v,
        score_mod=score_mod,
        block_mask=bm,
        return_lse=True,
        sinks=sinks,
        enable_gqa=q.shape[1] != k.shape[1],
        **kw,
    )
    ro, rl = reference(q, k, v, vis, score, sinks, kw.get("scale"))
    assert o.shape == ro.shape and o.dtype == q.dtype and lse.dtype == torch.float32
    assert (o.double() - ro).abs().max() < TOL
    fin = torch.isfinite(rl)
    assert torch.equal(fin, torch.isfinite(lse))
    assert (lse.double()[fin] - rl[fin]).abs().max() < TOL
    if not bwd:
        return o, lse
    gen = torch.Generator().manual_seed(7)
    do = torch.randn(o.shape, generator=gen)
    dl = torch.randn(lse.shape, generator=gen)
    wrt = [q, k, v] + ([sinks] if sinks is not None else [])
    got = torch.autograd.grad(
        (o * do).sum() + (lse.nan_to_num(0, 0, 0) * dl).sum(), wrt
    )
    rl_f = rl.masked_fill(~fin, 0.0)
    want = torch.autograd.grad((ro * do).sum() + (rl_f * dl).sum(), wrt)
    for name, a, b in zip("qkvs", got, want):
        err = (a.double() - b).abs().max().item()
        assert err < TOL * max(1.0, b.abs().max().item()), (name, err)
    return o, lse


# ---- every ready-made mask, with GQA, d_v != d, N_q != N_k and ragged partial tiles
CASES = [
    ("causal", causal_mask, {}),
    ("window", sliding_window(24), {"window": 24}),
    ("prefix", prefix_lm(40), {"prefix": 40}),
]


@pytest.mark.parametrize("name, mod, kw", CASES, ids=[c[0] for c in CASES])
def test_ready_made_masks_forward_and_backward(name, mod, kw):
    # N_q = 100 and N_k = 90: ragged last tiles; GQA 4 / 2; d = 32, d_v = 16
    q, k, v = inputs(1, 4, 2, 100, 90, 32, 16, seed=1)
    bm = create_block_mask(mod, None, None, 100, 90, BLOCK_SIZE=32)
    assert bm.counts()["partial"] > 0
    check(q, k, v, bm, visible(name, 100, 90, **kw))


def test_document_mask_per_batch_and_with_causal():
    ids = torch.tensor(
        [[0] * 30 + [1] * 50 + [2] * 48, [0] * 70 + [1] * 58]
    )  # (2, 128)
    q, k, v = inputs(2, 2, 2, 128, 128, 16, 16, seed=2)
    mod = and_masks(causal_mask, document_mask(ids))
    bm = create_block_mask(mod, 2, None, 128, 128, BLOCK_SIZE=32)
    vis = visible("document", 128, 128, ids=ids) & visible("causal", 128, 128)
    check(q, k, v, bm, vis)


def test_or_of_masks_and_one_dimensional_document_ids():
    ids = torch.arange(96) // 40  # (N,): documents of 40, 40, 16
    mod = or_masks(document_mask(ids), sliding_window(8))
    q, k, v = inputs(1, 2, 1, 96, 96, 16, 32, seed=3)
    bm = create_block_mask(mod, None, None, 96, 96, BLOCK_SIZE=16)
    vis = visible("document", 96, 96, ids=ids) | visible("window", 96, 96, window=8)
    check(q, k, v, bm, vis, bwd=False)


def test_softcap_and_sinks_forward_backward():
    # Gemma 2's softcap with gpt-oss's per-head sinks, a local (window) layer
    q, k, v = inputs(1, 2, 2, 64, 64, 16, 16, seed=4)
    q.data *= 3.0  # scores big enough for the cap to bend them
    sinks = torch.tensor([0.5, -1.0], requires_grad=True)
    bm = create_block_mask(sliding_window(20), None, None, 64, 64, BLOCK_SIZE=16)
    vis = visible("window", 64, 64, window=20)
    check(
        q,
        k,
        v,
        bm,
        vis,
        score_mod=softcap(2.0),
        sinks=sinks,
        score=lambda s: 2.0 * torch.tanh(s / 2.0),
    )


def test_alibi_and_a_custom_scale():
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625])
    q, k, v = inputs(1, 4, 4, 48, 80, 16, 16, seed=5)
    bm = create_block_mask(causal_mask, None, None, 48, 80, BLOCK_SIZE=16)
    rel = (torch.arange(80)[None, :] - torch.arange(48)[:, None]).double()
    check(
        q,
        k,
        v,
        bm,
        visible("causal", 48, 80),
        score_mod=alibi(slopes),
        score=lambda s: s + slopes.double()[None, :, None, None] * rel,
        scale=0.3,
    )


@triton.jit
def checker_mask(b, h, q_idx, kv_idx):  # a user's own mod: torch's signature
    return ((q_idx // 16 + kv_idx // 16 + h) % 2 == 0) | (q_idx == kv_idx)


@triton.jit
def relative_bias(score, b, h, q_idx, kv_idx):  # a user's own score mod (T5-like)
    return score - 0.05 * tl.abs(q_idx - kv_idx).to(tl.float32) * (h + 1)


def test_custom_jit_mods_per_head_block_mask():
    q, k, v = inputs(1, 2, 2, 64, 64, 16, 16, seed=6)
    bm = create_block_mask(checker_mask, None, 2, 64, 64, BLOCK_SIZE=32)
    qi, ki = torch.arange(64)[:, None], torch.arange(64)[None, :]
    heads = torch.arange(2)[:, None, None]
    vis = ((qi // 16 + ki // 16 + heads) % 2 == 0) | (qi == ki)  # (H, N, N)
    dist = (qi - ki).abs().double()
    check(
        q,
        k,
        v,
        bm,
        vis[None],
        score_mod=relative_bias,
        score=lambda s: s - 0.05 * dist * (heads.double() + 1),
    )


def test_random_block_patterns_match_the_reference():
    # a random mask made of random 16 x 16 blocks (empty / full) plus random pairs in
    # some blocks (partial): the kernel must visit exactly what the block mask lists
    g = torch.Generator().manual_seed(8)
    blocks = torch.randint(0, 3, (5, 6), generator=g)  # 0 empty, 1 random, 2 full
    pairs = torch.rand(80, 96, generator=g) < 0.5
    table = blocks.repeat_interleave(16, 0).repeat_interleave(16, 1)
    mask = (table == 2) | ((table == 1) & pairs)
    bm = create_block_mask(dense_mask(mask), None, None, 80, 96, BLOCK_SIZE=16)
    want = {"empty": int((blocks == 0).sum()), "full": int((blocks == 2).sum())}
    assert {k: bm.counts()[k] for k in want} == want
    q, k, v = inputs(1, 1, 1, 80, 96, 16, 16, seed=9)
    check(q, k, v, bm, mask)


def test_no_block_mask_is_dense_and_matches_torch_flex():
    from torch.nn.attention import flex_attention as torch_flex

    q, k, v = inputs(1, 2, 2, 40, 56, 16, 16, seed=10, grad=False)
    ours = flex_attention(q, k, v, score_mod=softcap(3.0))
    theirs = torch_flex.flex_attention(
        q, k, v, score_mod=lambda s, b, h, qi, ki: 3.0 * torch.tanh(s / 3.0)
    )
    assert (ours - theirs).abs().max() < TOL
    # document + causal through torch's own block mask machinery, eager on the CPU
    ids = torch.arange(40) // 13

    def doc_causal(b, h, qi, ki):
        return (ids[qi] == ids[ki]) & (qi >= ki)

    tbm = torch_flex.create_block_mask(doc_causal, None, None, 40, 40, device="cpu")
    q2, k2, v2 = (t[:, :, :40] for t in (q, k, v))
    mod = and_masks(causal_mask, document_mask(ids))
    bm = create_block_mask(mod, None, None, 40, 40, BLOCK_SIZE=16)
    diff = flex_attention(q2, k2, v2, block_mask=bm) - torch_flex.flex_attention(
        q2, k2, v2, block_mask=tbm
    )
    assert diff.abs().max() < TOL


def test_empty_rows_give_zero_and_minus_inf_or_the_sink():
    # N_q > N_k with torch's top-left causal: every row sees key 0; a window of 1 past
    # the keys' end leaves rows 32.. with no key
    q, k, v = inputs(1, 2, 2, 64, 32, 16, 16, seed=11)
    bm = create_block_mask(sliding_window(1), None, None, 64, 32, BLOCK_SIZE=16)
    o, lse = check(q, k, v, bm, visible("window", 64, 32, window=1))
    assert torch.all(o[:, :, 32:] == 0) and torch.all(lse[:, :, 32:] == -math.inf)
    sinks = torch.tensor([1.5, -0.5], requires_grad=True)
    o, lse = check(q, k, v, bm, visible("window", 64, 32, window=1), sinks=sinks)
    assert torch.all(o[:, :, 32:] == 0)
    assert torch.equal(lse[0, :, 40], sinks.detach())


def selected_reference(q, k, v, do, vis):
    """fp64 o, lse and gradients with every sum over the VISIBLE pairs only (selected
    before multiplying), so a NaN reaches exactly what depends on it (autograd would
    multiply a hidden NaN by 0); as tests/kernels/test_flash.py's, for any mask."""
    q, k, v, do = (t.detach().double() for t in (q, k, v, do))
    scale = 1 / math.sqrt(q.shape[-1])
    s = torch.where(vis, q @ k.transpose(-2, -1) * scale, float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.where(
        vis & ~torch.isneginf(lse)[..., None], (s - lse[..., None]).exp(), 0
    )

    def vsum(coef, rows, axis):
        if axis == "j":
            return torch.where(
                vis[..., None], coef[..., None] * rows[..., None, :, :], 0
            ).sum(-2)
        return torch.where(
            vis[..., None], coef[..., None] * rows[..., :, None, :], 0
        ).sum(-3)

    o = vsum(p, v, "j")
    dp = torch.where(vis, do @ v.transpose(-2, -1), 0.0)
    ds = torch.where(vis, p * (dp - (do * o).sum(-1)[..., None]), 0.0)
    return (
        o,
        lse,
        (vsum(ds, k, "j") * scale, vsum(ds, q, "i") * scale, vsum(p, do, "i")),
    )


def same_nans_and_close(got, ref):
    got, ref = got.double(), ref.double()
    assert torch.equal(torch.isnan(got), torch.isnan(ref))
    ok = torch.isfinite(ref)
    assert torch.equal(torch.isfinite(got), ok)
    assert (got[ok] - ref[ok]).abs().max() < TOL * max(1.0, ref[ok].abs().max().item())


@pytest.mark.parametrize("which, pos", [("q", 37), ("k", 20), ("v", 50), ("do", 9)])
def test_nan_reaches_only_what_sees_it(which, pos):
    # a window mask (partial tiles on both sides of the band): a NaN in one row of q /
    # dO (a query) or k / v (a key) reaches the outputs and gradients of the pairs that
    # see it, and nothing through a hidden pair (the NaN/inf launches, SHIELD)
    q, k, v = inputs(1, 1, 1, 64, 64, 16, 16, seed=12)
    do = torch.randn(1, 1, 64, 16, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        {"q": q, "k": k, "v": v, "do": do}[which][0, 0, pos, 3] = float("nan")
    bm = create_block_mask(sliding_window(12), None, None, 64, 64, BLOCK_SIZE=16)
    o, lse = flex_attention(q, k, v, block_mask=bm, return_lse=True)
    grads = torch.autograd.grad(o, (q, k, v), do)
    o_ref, lse_ref, refs = selected_reference(
        q, k, v, do, visible("window", 64, 64, window=12)
    )
    same_nans_and_close(o, o_ref)
    same_nans_and_close(lse, lse_ref)
    for g, r in zip(grads, refs):
        same_nans_and_close(g, r)
    assert any(torch.isnan(r).any() for r in refs)  # not vacuous
    assert all((~torch.isnan(r)).any() for r in refs)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_forward_and_backward(dtype):
    # inputs rounded to 8 / 11 bits, P rounded before the P V dot: relative errors of
    # ~2^-8 (bf16) on O(1) outputs; 3e-2 bounds it
    q, k, v = (
        t.detach().to(dtype).requires_grad_() for t in inputs(1, 2, 1, 80, 80, 32, 32)
    )
    bm = create_block_mask(prefix_lm(20), None, None, 80, 80, BLOCK_SIZE=32)
    o = flex_attention(q, k, v, block_mask=bm, enable_gqa=True)
    ro, _ = reference(q, k, v, visible("prefix", 80, 80, prefix=20))
    assert o.dtype == dtype and (o.double() - ro).abs().max() < 3e-2
    g = torch.autograd.grad(o.float().sum(), (q, k, v))
    rg = torch.autograd.grad(ro.sum(), (q, k, v))
    for a, b in zip(g, rg):
        assert (a.double() - b).abs().max() < 3e-2 * max(1.0, b.abs().max().item())


def test_mask_tiles_larger_than_the_kernel_tile():
    # the default BLOCK_SIZE = 128 with the interpreter's 64 x 64 kernel tile: each
    # mask tile is walked in two kernel steps per side, ragged ends included
    q, k, v = inputs(1, 2, 1, 200, 160, 16, 16, seed=13)
    ids = torch.arange(200) // 50
    mod = or_masks(document_mask(ids), sliding_window(70))
    bm = create_block_mask(mod, None, None, 200, 160)
    assert bm.BLOCK_SIZE == (128, 128) and bm.counts()["partial"] > 0
    qi, ki = torch.arange(200)[:, None], torch.arange(160)[None, :]
    vis = (ids[:, None] == ids[None, :160]) | ((qi - ki >= 0) & (qi - ki < 70))
    check(q, k, v, bm, vis)
