"""kernels.flash: no silent wrong answers. A NaN stays in its row (the causal shields
of the forward and both backwards), an overflowing score reads NaN, never an empty
row, and bad arguments raise naming them; the opt-in paths agree with the defaults.

Runs under the Triton interpreter on a CPU (small shapes), and on a CUDA GPU unchanged.
"""

import math

import pytest
import torch

from kernels import runtime
from kernels.flash import flash_attention, tiles
from kernels.naive import reference_attention
from tests.kernels.flash_tools import max_err, qkv, ref_grads

pytestmark = pytest.mark.xdist_group("flash")

DEVICE = runtime.DEVICE


# --------------------------------------------------------------------------------------
# No silent wrong answers (issue 10): NaN stays in its row, bad arguments raise
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [8, 77, 130])
def test_causal_mask_shields_earlier_rows_from_a_nan_value_row(n):
    # item 2: v[..., n-1, :] = NaN is seen only by the last query; masked probabilities
    # must not multiply the hidden row (0 * NaN = NaN), whatever the tile size
    q, k, v = qkv(1, 2, 2, n, n, 16, seed=3)
    v[..., n - 1, 3] = float("nan")
    v[..., n - 2, 5] = float("inf")  # an inf hidden from all rows before n - 2 as well
    o, lse = flash_attention(q, k, v, causal=True, return_lse=True)
    o_ref, lse_ref = reference_attention(q, k, v, causal=True)
    assert torch.equal(torch.isnan(o), torch.isnan(o_ref))
    assert torch.isnan(o[..., n - 1, 3]).all()
    assert not torch.isnan(o[..., : n - 1, :]).any()
    finite = torch.isfinite(o_ref)
    assert torch.equal(torch.isfinite(o), finite)
    assert max_err(o[finite], o_ref[finite]) < 2e-5
    assert torch.all(torch.isfinite(lse))  # lse depends on the scores only


def test_nan_query_row_gives_nan_row_not_empty_row():
    # item 1 for the kernel and its reference: NaN row -> NaN o and lse; empty row
    # -> 0, -inf
    q, k, v = qkv(1, 1, 1, 6, 4, 16)
    q[0, 0, 4, 0] = float("nan")
    for fn in (
        lambda: flash_attention(q, k, v, causal=True, return_lse=True),
        lambda: reference_attention(q, k, v, causal=True),
    ):
        o, lse = fn()
        assert torch.isnan(o[0, 0, 4]).all() and torch.isnan(lse[0, 0, 4])
        assert torch.all(o[0, 0, :2] == 0) and torch.isneginf(lse[0, 0, :2]).all()
        assert torch.isfinite(o[0, 0, [2, 3, 5]]).all()


@pytest.mark.parametrize(
    "sm_scale", [1e300, -1e300, 2.4e38, float("inf"), float("nan")]
)
def test_scale_overflowing_fp32_is_refused(sm_scale):
    # item 3: sm_scale * log2(e) is folded into the kernel's fp32 scores
    q, k, v = qkv(1, 1, 1, 8, 8, 16)
    with pytest.raises(ValueError, match="softmax_scale"):
        flash_attention(q, k, v, softmax_scale=sm_scale)
    with pytest.raises(ValueError, match="scale"):
        reference_attention(q, k, v, scale=sm_scale)
    flash_attention(
        q, k, v, softmax_scale=2.3e38
    )  # the largest finite product is accepted


@pytest.mark.parametrize(
    "kw,exc",
    [
        ({"causal": "False"}, TypeError),
        ({"causal": 1}, TypeError),
        ({"return_lse": "yes"}, TypeError),
        ({"softmax_scale": "0.5"}, TypeError),
    ],
)
def test_flags_are_checked_as_bools(kw, exc):
    q, k, v = qkv(1, 1, 1, 8, 8, 16)
    with pytest.raises(exc):
        flash_attention(q, k, v, **kw)


@pytest.mark.parametrize(
    "causal,n_q,n_k", [(False, 37, 37), (True, 37, 53), (True, 60, 20)]
)
def test_lse_is_differentiable(causal, n_q, n_k):
    # item 12: o and lse both carry gradients; float64 autograd through
    # reference_attention is the reference. A gradient dL on lse enters the FA2 backward
    # as delta <- delta - dL.
    q, k, v = qkv(1, 2, 1, n_q, n_k, 16, seed=5, grad=True)
    o, lse = flash_attention(q, k, v, causal=causal, return_lse=True)
    go, gl = torch.randn_like(o), torch.randn_like(lse)
    visible = torch.isfinite(lse)
    loss = (o * go).sum() + (torch.where(visible, lse, 0.0) * gl).sum()
    grads = torch.autograd.grad(loss, (q, k, v))
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    o_r, lse_r = reference_attention(q64, k64, v64, causal=causal)
    loss_r = (o_r * go.double()).sum() + (
        torch.where(visible, lse_r, 0.0) * gl.double()
    ).sum()
    refs = torch.autograd.grad(loss_r, (q64, k64, v64))
    for g, r in zip(grads, refs):
        assert torch.all(torch.isfinite(g))
        # fp32 kernels vs fp64: sums of N terms of size |P||dO||V|, |dlse||K|: a
        # few 1e-6
        assert max_err(g, r) < 1e-4 * max(1.0, r.abs().max().item())


def test_dkdv_padded_key_rows_never_reach_exp2(recwarn):
    # item 13: N_k = 40 is ragged against the 64-key tile; a strongly negative lse made
    # the padded rows' exp2(0 - lse) overflow (numpy warns under the interpreter).
    # Masked now.
    import numpy as np

    g = torch.Generator().manual_seed(0)
    kdir = torch.randn(1, 1, 1, 16, generator=g)
    # all keys alike, all scores ~ -1e3
    k = (kdir + 0.01 * torch.randn(1, 1, 40, 16, generator=g)).to(DEVICE)
    q = (-300.0 * kdir.expand(1, 1, 24, 16)).contiguous().to(DEVICE)
    v = torch.randn(1, 1, 40, 16, generator=g).to(DEVICE)
    q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
    o, lse = flash_attention(q, k, v, return_lse=True)
    assert lse.max() < -500
    with np.errstate(over="raise", invalid="raise"):
        dq, dk, dv = torch.autograd.grad(o.sum(), (q, k, v))
    for t in (dq, dk, dv):
        assert torch.all(torch.isfinite(t))
    assert not [w for w in recwarn if "overflow" in str(w.message)]


@pytest.mark.parametrize("sm_scale", [-0.125, -2.0, 0.0])
@pytest.mark.parametrize("causal,n", [(False, 128), (True, 128), (False, 77)])
def test_negative_and_zero_scale_match_fp64(sm_scale, causal, n):
    # The unmasked main loop folds the scale into one FFMA per score and takes the row
    # max of the raw scores times the scale: with a negative scale that is the row MIN
    # (the NEG_SCALE heuristic). N = 128 runs the unmasked loop only (non-causal), both
    # loops (causal), or the unmasked loop then a ragged tail (N = 77).
    q, k, v = qkv(1, 2, 2, n, n, 32, grad=True, seed=3)
    o, lse = flash_attention(
        q, k, v, causal=causal, softmax_scale=sm_scale, return_lse=True
    )
    do = torch.randn_like(o)
    o.backward(do)
    o_ref, lse_ref, grads = ref_grads(q, k, v, do, causal, sm_scale)
    assert max_err(o, o_ref) < 2e-5
    assert max_err(lse, lse_ref) < 2e-5 * max(1.0, lse_ref.abs().max().item())
    for t, ref in zip((q, k, v), grads):
        assert max_err(t.grad, ref) < 1e-4 * max(1.0, ref.abs().max().item())


def test_n_bucket_separates_short_and_long_sequences():
    # the forward's autotune key: a choice tuned at N = 512 is not reused at N = 65536
    assert tiles.n_bucket(1) == tiles.n_bucket(256) == 256
    assert tiles.n_bucket(512) == 512 and tiles.n_bucket(513) == 1024
    assert tiles.n_bucket(65536) == tiles.n_bucket(10**6) == 65536


def _selected_reference(q, k, v, do, causal, sm_scale=None):
    """float64 o, lse and gradients written with every sum over the VISIBLE pairs only
    (selected before multiplying): a NaN reaches exactly the outputs that depend on it.
    autograd cannot give this: the gradient of where(mask, p * v, 0) still multiplies
    a hidden NaN by 0."""
    q, k, v, do = (t.detach().double() for t in (q, k, v, do))
    group = q.shape[1] // k.shape[1]
    k, v = (t.repeat_interleave(group, dim=1) for t in (k, v))
    N_q, N_k, d = q.shape[2], k.shape[2], q.shape[3]
    scale = 1 / math.sqrt(d) if sm_scale is None else sm_scale
    vis = torch.ones(N_q, N_k, dtype=torch.bool)
    if causal:  # bottom-right: query i sees key j <= i + N_k - N_q
        vis = torch.arange(N_k)[None, :] <= torch.arange(N_q)[:, None] + (N_k - N_q)
    vis = vis.to(q.device)
    s = torch.where(vis, q @ k.transpose(-2, -1) * scale, float("-inf"))
    lse = torch.logsumexp(s, -1)  # NaN if a visible score is NaN, -inf if none
    p = torch.where(
        vis & ~torch.isneginf(lse)[..., None], torch.exp(s - lse[..., None]), 0.0
    )

    def vsum(coef, rows, axis):  # sum over visible pairs of coef_ij * rows
        if axis == "j":  # (.., N_q, N_k) x (.., N_k, d) -> (.., N_q, d)
            t = coef[..., None] * rows[..., None, :, :]
            return torch.where(vis[..., None], t, 0.0).sum(-2)
        t = coef[..., None] * rows[..., :, None, :]  # over i: -> (.., N_k, d)
        return torch.where(vis[..., None], t, 0.0).sum(-3)

    o = vsum(p, v, "j")
    dv = vsum(p, do, "i")
    dp = torch.where(vis, do @ v.transpose(-2, -1), 0.0)
    ds = torch.where(vis, p * (dp - (do * o).sum(-1)[..., None]), 0.0)
    dq, dk = vsum(ds, k, "j") * scale, vsum(ds, q, "i") * scale
    B, H_kv = k.shape[0], k.shape[1] // group
    dk, dv = (t.view(B, H_kv, group, N_k, d).sum(2) for t in (dk, dv))
    return o, lse, (dq, dk, dv)


def _assert_same_nans_and_close(got, ref, rtol):
    got, ref = got.double(), ref.double()
    assert torch.equal(torch.isnan(got), torch.isnan(ref))
    fin = ~torch.isnan(ref)
    assert torch.equal(torch.isfinite(got[fin]), torch.isfinite(ref[fin]))
    ok = torch.isfinite(ref)
    if ok.any():
        assert max_err(got[ok], ref[ok]) < rtol * max(1.0, ref[ok].abs().max().item())


@pytest.mark.parametrize(
    "which,pos", [("do", 70), ("q", 70), ("v", 80), ("k", 80), ("do", 5)]
)
@pytest.mark.parametrize(
    "n_q,n_k,h,h_kv", [(100, 100, 2, 2), (90, 100, 2, 1), (100, 40, 1, 1)]
)
def test_causal_backward_keeps_nan_out_of_hidden_pairs(which, pos, n_q, n_k, h, h_kv):
    # A NaN in row `pos` of q or dO (a query) or k or v (a key) reaches only the
    # gradients of pairs that see it; in the causal masked tiles a hidden pair weighs 0,
    # and 0 * NaN = NaN through tl.dot, so those tiles select pair by pair when an input
    # holds NaN/inf. (100, 40): 60 query rows see no key; ("do", 5) puts the NaN in one.
    q, k, v = qkv(1, h, h_kv, n_q, n_k, 16, seed=11, grad=True)
    do = torch.randn(1, h, n_q, 16, generator=torch.Generator().manual_seed(2))
    do = do.to(DEVICE)
    t = {"q": q, "k": k, "v": v, "do": do}[which]
    with torch.no_grad():
        t[0, 0, min(pos, t.shape[2] - 1), 3] = float("nan")
    o, lse = flash_attention(q, k, v, causal=True, return_lse=True)
    grads = torch.autograd.grad(o, (q, k, v), do)
    o_ref, lse_ref, refs = _selected_reference(q, k, v, do, True)
    _assert_same_nans_and_close(o, o_ref, 2e-5)
    _assert_same_nans_and_close(lse, lse_ref, 2e-5)
    for g, r in zip(grads, refs):
        _assert_same_nans_and_close(g, r, 1e-4)
    if which == "do" and pos < n_q - n_k:  # a row that sees no key: nothing to reach
        assert all(torch.isfinite(g).all() for g in grads)
    else:  # not vacuous: the NaN reaches some gradient and spares another
        assert any(torch.isnan(r).any() for r in refs)
        assert any((~torch.isnan(r)).any() for r in refs)


def test_selected_reference_matches_autograd_without_nan():
    q, k, v = qkv(1, 2, 1, 37, 53, 16, seed=4, grad=True)
    do = torch.randn(1, 2, 37, 16, generator=torch.Generator().manual_seed(1))
    o_r, lse_r, grads_r = ref_grads(q, k, v, do, True)
    o_s, lse_s, grads_s = _selected_reference(q, k, v, do, True)
    assert max_err(o_s, o_r) < 1e-12 and max_err(lse_s, lse_r) < 1e-12
    for a, b in zip(grads_s, grads_r):
        assert max_err(a, b) < 1e-12


@pytest.mark.parametrize("path", ["pointer", "tma"])
@pytest.mark.parametrize(
    "causal,n", [(False, 128), (True, 128), (True, 8), (False, 77)]
)
@pytest.mark.parametrize("sm_scale", [1e38, -1e38])
def test_scores_overflowing_fp32_give_nan_rows_never_empty_rows(
    causal, n, sm_scale, path
):
    # sm_scale = 1e38 is accepted (sm_scale * log2(e) fits fp32) but q k^T * scale does
    # not: no fp32 softmax exists. Every such row must read NaN (o and lse), never
    # the "no visible key" answer (0, -inf) nor a finite guess. q and k point the same
    # way, so every score is positive and overflows: to +inf with a positive scale
    # (unmasked loop: the row max overflows), to -inf with a negative one (N = 8: only
    # the masked tile runs, where all -inf used to read as an empty row).
    q, k, v = qkv(1, 1, 1, n, n, 16, seed=1)
    q, k = q.abs() + 0.5, k.abs() + 0.5
    o, lse = flash_attention(
        q,
        k,
        v,
        causal=causal,
        softmax_scale=sm_scale,
        return_lse=True,
        forward_path=path,
    )
    assert torch.isnan(o).all() and torch.isnan(lse).all()


@pytest.mark.parametrize(
    "causal,n_q,n_k", [(False, 77, 77), (True, 90, 130), (True, 100, 40)]
)
def test_forward_paths_and_fused_backward_agree_with_the_defaults(causal, n_q, n_k):
    # flash_attention(forward_path=, deterministic=): the TMA forwards give the
    # pointer path's o and lse, and the fused one-kernel backward (dQ by atomics) the
    # two-kernel backward's gradients within fp32 rounding, lse gradient included
    q, k, v = qkv(1, 2, 1, n_q, n_k, 32, seed=9, grad=True)
    g = torch.Generator().manual_seed(3)
    go = torch.randn(1, 2, n_q, 32, generator=g).to(DEVICE)
    gl = torch.randn(1, 2, n_q, generator=g).to(DEVICE)

    def run(**kw):
        o, lse = flash_attention(q, k, v, causal=causal, return_lse=True, **kw)
        loss = (o * go).sum() + (torch.where(torch.isfinite(lse), lse, 0.0) * gl).sum()
        return (o, lse, *torch.autograd.grad(loss, (q, k, v)))

    base = run()
    for kw in (
        {"forward_path": "tma"},
        {"forward_path": "tma-ws"},
        {"deterministic": False},
    ):
        for a, b in zip(run(**kw), base):
            assert torch.equal(torch.isfinite(a), torch.isfinite(b))
            fin = torch.isfinite(b)
            assert max_err(a[fin], b[fin]) < 1e-5 * max(1.0, b[fin].abs().max().item())


@pytest.mark.slow
def test_fused_backward_keeps_hidden_nan_out():
    q, k, v = qkv(1, 2, 2, 67, 67, 16, seed=11, grad=True)
    do = torch.randn(1, 2, 67, 16, generator=torch.Generator().manual_seed(2))
    do = do.to(DEVICE)
    do[0, 0, 47, 3] = float("nan")  # head 1 stays clean
    o = flash_attention(q, k, v, causal=True, deterministic=False)
    grads = torch.autograd.grad(o, (q, k, v), do)
    _, _, refs = _selected_reference(q, k, v, do, True)
    for g, r in zip(grads, refs):
        _assert_same_nans_and_close(g, r, 1e-4)


@pytest.mark.parametrize(
    "kw,exc",
    [({"forward_path": "cuda"}, ValueError), ({"deterministic": 0}, TypeError)],
)
def test_path_switches_are_checked(kw, exc):
    q, k, v = qkv(1, 1, 1, 8, 8, 16)
    with pytest.raises(exc, match=next(iter(kw))):
        flash_attention(q, k, v, **kw)
