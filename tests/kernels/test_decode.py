"""kernels.decode: attention_with_kvcache against an independent fp64 reference.

Runs under the Triton interpreter on a CPU (small shapes), and on a CUDA GPU unchanged.
The reference gathers each sequence's pages through the block table, applies the
bottom-right causal mask and takes the softmax in float64.

Tolerance (a forward error bound, not one machine's rounding): with u the unit
roundoff of the input dtype (2^-11 fp16, 2^-8 bf16, 2^-24 fp32) and u32 = 2^-24, the
kernel's scores carry an absolute error e_s <= scale (d + 2) u32 max_j |q_i| . |k_j|
(fp32 dot of exact products); P is rounded to the input dtype for P V (relative u per
term) and the exponentials and sums add (n + 8) u32 relative; the output is rounded
once to the input dtype. So per output element
    |o - o_ref| <= (2 e_s + u + (n + 8) u32) (P |V|) + u |o_ref| + 1e-6,
and |lse - lse_ref| <= e_s + (n + 8) u32 + u32 |lse_ref| + 1e-6, with n the row's
visible keys (both bounds times 2 for the split merge's own rescaling and rounding).
"""

import math

import pytest
import torch

from kernels import runtime
from kernels.decode import attention_with_kvcache, checks, choose_splits

pytestmark = pytest.mark.xdist_group("decode")

DEVICE = runtime.DEVICE
U = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8, torch.float32: 2.0**-24}
U32 = 2.0**-24


def make_cache(
    lens,
    n_q,
    h_q,
    h_kv,
    d,
    page,
    dtype=torch.float16,
    seed=0,
    spare_pages=3,
    max_pages=None,
):
    """Random q and a paged cache holding ``lens`` keys per sequence, on shuffled
    physical pages (with ``spare_pages`` unused ones full of NaN), and the block
    table (entries past a sequence's pages are -1)."""
    g = torch.Generator().manual_seed(seed)
    B = len(lens)
    need = [-(-n // page) for n in lens]
    max_pages = max_pages or max(max(need), 1)
    n_pages = sum(need) + spare_pages
    k = torch.randn(n_pages, page, h_kv, d, generator=g)
    v = torch.randn(n_pages, page, h_kv, d, generator=g)
    q = torch.randn(B, n_q, h_q, d, generator=g)
    perm = torch.randperm(n_pages, generator=g)
    bt = torch.full((B, max_pages), -1, dtype=torch.int32)
    used, i = set(), 0
    for b, n in enumerate(need):
        bt[b, :n] = perm[i : i + n].to(torch.int32)
        used |= set(perm[i : i + n].tolist())
        i += n
    for p in set(range(n_pages)) - used:  # pages no sequence owns
        k[p] = float("nan")
        v[p] = float("nan")
    cast = dict(device=DEVICE, dtype=dtype)
    return (
        q.to(**cast),
        k.to(**cast),
        v.to(**cast),
        torch.tensor(lens, dtype=torch.int32, device=DEVICE),
        bt.to(DEVICE),
    )


def buffers(B, n_q, h_q, d_v):
    """A reference's starting point: out 0 (B, N_q, H_q, d_v), lse -inf (B, H_q, N_q)
    (a row with no key) and their tolerances' floor, 1e-6."""
    out = torch.zeros(B, n_q, h_q, d_v, dtype=torch.float64)
    lse = torch.full((B, h_q, n_q), -math.inf, dtype=torch.float64)
    return out, lse, torch.full_like(out, 1e-6), torch.full_like(lse, 1e-6)


def add_bound(o_tol, l_tol, b, out, lse, p, vv, e_s, seen, u, terms=8):
    """Add sequence b's bound of the module docstring to o_tol[b] and l_tol[b]: p
    (H_q, N_q, L) its probabilities, vv (L, H_q, d_v) its values, e_s (H_q, N_q) the
    score error, seen (N_q, L) the visible pairs; ``terms`` the (n + terms) u32 of
    the exponentials and sums."""
    n = seen.sum(-1).double()[None, :]  # (1, N_q)
    rel = 2 * e_s + u + (n + terms) * U32
    pv = torch.einsum("htj,jhd->thd", p, vv.abs())
    o_tol[b] += 2 * (rel.transpose(0, 1)[..., None] * pv + u * out[b].abs())
    l_tol[b] += 2 * (e_s + (n + terms) * U32 + U32 * lse[b].abs())


def reference(q, k, v, lens, bt, causal=True, scale=None):
    """fp64 out (B, N_q, H_q, d), lse (B, H_q, N_q) and the tolerances of the module
    docstring, from a per-sequence gather of the pages."""
    B, n_q, h_q, d = q.shape
    h_kv = k.shape[2]
    G = h_q // h_kv
    scale = 1 / math.sqrt(d) if scale is None else scale
    u = U[q.dtype]
    out, lse, o_tol, l_tol = buffers(B, n_q, h_q, d)
    for b in range(B):
        L = int(lens[b])
        if L == 0:
            continue
        if bt is None:
            kk, vv = k[b, :L], v[b, :L]
        else:
            pages = bt[b, : -(-L // k.shape[1])].long().cpu()
            kk = k.cpu()[pages].reshape(-1, h_kv, d)[:L]
            vv = v.cpu()[pages].reshape(-1, h_kv, d)[:L]
        kk = kk.double().cpu().repeat_interleave(G, 1)  # (L, H_q, d)
        vv = vv.double().cpu().repeat_interleave(G, 1)
        qb = q[b].double().cpu()  # (N_q, H_q, d)
        s = torch.einsum("thd,jhd->htj", qb, kk) * scale
        seen = torch.ones(n_q, L, dtype=torch.bool)
        if causal:
            seen = torch.arange(L)[None, :] <= (L - n_q + torch.arange(n_q))[:, None]
        s = s.masked_fill(~seen, -math.inf)
        p = torch.softmax(s, -1)  # (H_q, N_q, L)
        lse[b] = torch.logsumexp(s, -1)
        out[b] = torch.einsum("htj,jhd->thd", p, vv)
        qk_abs = torch.einsum("thd,jhd->htj", qb.abs(), kk.abs())
        e_s = abs(scale) * (d + 2) * U32 * qk_abs.amax(-1)  # (H_q, N_q)
        add_bound(o_tol, l_tol, b, out, lse, p, vv, e_s, seen, u)
    return out, lse, o_tol, l_tol


def compare(got, want):
    """Assert got = (out, lse) within want = (out, lse, out tolerance, lse tolerance),
    a reference's; lse -inf exactly where the reference's is."""
    (out, lse), (ro, rl, o_tol, l_tol) = got, want
    err = (out.double().cpu() - ro).abs()
    assert (err <= o_tol).all(), f"max err {err.max():.3g}, over {(err - o_tol).max()}"
    lc = lse.double().cpu()
    assert torch.equal(torch.isneginf(lc), torch.isneginf(rl))
    fin = torch.isfinite(rl)
    assert ((lc - rl).abs()[fin] <= l_tol[fin]).all()


def check(q, k, v, lens, bt, causal=True, num_splits=0, scale=None):
    out, lse = attention_with_kvcache(
        q,
        k,
        v,
        lens,
        bt,
        causal=causal,
        softmax_scale=scale,
        num_splits=num_splits,
        return_lse=True,
    )
    assert out.shape == q.shape and out.dtype == q.dtype
    assert lse.shape == (q.shape[0], q.shape[2], q.shape[1])
    assert lse.dtype == torch.float32
    compare((out, lse), reference(q, k, v, lens, bt, causal, scale))
    return out, lse


# (lens, N_q, H_q, H_kv, d, page, dtype, causal, num_splits): lengths differ per
# sequence (0 and 1 among them), pages 16/32/128, GQA groups 1/4/8, N_q 1..16, head
# dims 64/80/128/256, a handful of combinations so the interpreter stays quick
CASES = {
    "mha-d64-p16": ([37, 0, 5, 1], 1, 2, 2, 64, 16, torch.float16, True, 0),
    "gqa4-d80-p32": ([70, 33], 3, 8, 2, 80, 32, torch.float16, True, 3),
    "gqa8-nq16-p16": ([40, 16], 16, 8, 1, 16, 16, torch.float16, True, 2),
    "gqa4-d128-p128-bf16": ([150, 9], 2, 4, 1, 128, 128, torch.bfloat16, True, 0),
    "d256-p16-noncausal": ([21, 4], 4, 2, 1, 256, 16, torch.float16, False, 2),
    "page48-gather": ([100, 47, 0], 5, 4, 1, 32, 48, torch.float16, True, 2),
    "fp32-p32": ([45, 64], 2, 4, 4, 64, 32, torch.float32, True, 1),
    "gqa8-d128-p32": ([77, 1, 130], 1, 16, 2, 128, 32, torch.float16, True, 0),
    "gqa4-d64-nq8-bf16": ([64, 200], 8, 8, 2, 64, 32, torch.bfloat16, True, 4),
}


@pytest.mark.parametrize("case", list(CASES))
def test_matches_fp64_reference(case):
    lens, n_q, h_q, h_kv, d, page, dtype, causal, splits = CASES[case]
    q, k, v, sl, bt = make_cache(lens, n_q, h_q, h_kv, d, page, dtype, seed=len(case))
    out, lse = check(q, k, v, sl, bt, causal, splits)
    empty = [b for b, n in enumerate(lens) if n == 0]
    for b in empty:  # an empty slot: 0 and -inf, never NaN
        assert (out[b] == 0).all() and (lse[b] == float("-inf")).all()


def test_splits_agree_and_contiguous_equals_paged():
    # 64-token pages: on every target the paged kernel then uses the contiguous
    # cache's key tile (no tile table entry is longer), so the two runs do the same
    # arithmetic in the same order
    lens, n_q, page = [90, 61, 17], 2, 64
    q, k, v, sl, bt = make_cache(lens, n_q, 4, 2, 32, page, torch.float32, seed=3)
    outs = [
        attention_with_kvcache(q, k, v, sl, bt, num_splits=s, return_lse=True)
        for s in (1, 2, 5)
    ]
    for o, lse in outs[1:]:  # fp32: the splits change only the rounding
        torch.testing.assert_close(o, outs[0][0], atol=2e-6, rtol=2e-6)
        torch.testing.assert_close(lse, outs[0][1], atol=2e-6, rtol=2e-6)
    check(q, k, v, sl, bt, num_splits=5)
    # the same keys in a contiguous (B, N_max, H_kv, d) cache: the same bits
    n_max = 96
    kc = torch.zeros(len(lens), n_max, 2, 32, device=DEVICE)
    vc = torch.zeros_like(kc)
    for b, n in enumerate(lens):
        pages = bt[b, : -(-n // page)].long()
        kc[b, :n] = k[pages].reshape(-1, 2, 32)[:n]
        vc[b, :n] = v[pages].reshape(-1, 2, 32)[:n]
    kc[:, 95] = float("nan")  # past every length: never read
    for s in (1, 2):
        o_p = attention_with_kvcache(q, k, v, sl, bt, num_splits=s)
        o_c = attention_with_kvcache(q, kc, vc, sl, num_splits=s)
        assert torch.equal(o_p, o_c)


def test_noncontiguous_inputs():
    q, k, v, sl, bt = make_cache([33, 20], 2, 4, 2, 64, 16, seed=5)
    ref = attention_with_kvcache(q, k, v, sl, bt, num_splits=2)
    # q with heads before tokens in memory; caches with heads outermost
    qn = q.transpose(1, 2).contiguous().transpose(1, 2)
    kn = k.permute(2, 0, 1, 3).contiguous().permute(1, 2, 0, 3)
    vn = v.permute(2, 0, 1, 3).contiguous().permute(1, 2, 0, 3)
    btn = torch.stack([bt, bt], -1).reshape(bt.shape[0], -1)[:, ::2]
    assert not (qn.is_contiguous() or kn.is_contiguous() or btn.is_contiguous())
    out = attention_with_kvcache(qn, kn, vn, sl, btn, num_splits=2)
    assert torch.equal(out, ref)


def test_nan_in_a_cache_row_reaches_only_the_rows_that_see_it():
    lens, n_q, page = [40, 30], 4, 16
    q, k, v, sl, bt = make_cache(lens, n_q, 4, 2, 32, page, torch.float32, seed=7)

    # sequence 0: a NaN value at key 38 (seen by tokens 2 and 3 only, causal), a NaN
    # key at key 5 of KV head 1 (seen by every token of heads 2, 3); a stale NaN past
    # the length in the last page of sequence 1
    def slot(b, j):
        return int(bt[b, j // page]), j % page

    v[slot(0, 38)][0], k[slot(0, 5)][1] = float("nan"), float("nan")
    p, r = slot(1, 30)
    k[p, r:] = float("nan")
    v[p, r:] = float("nan")
    for splits in (1, 3):
        out, lse = attention_with_kvcache(
            q, k, v, sl, bt, num_splits=splits, return_lse=True
        )
        o_nan = torch.isnan(out).all(-1)  # (B, N_q, H_q): whole rows, never partial
        assert torch.equal(o_nan, torch.isnan(out).any(-1))
        want = torch.zeros_like(o_nan)
        want[0, 2:, :2] = True  # KV head 0 (heads 0, 1): the NaN value, tokens 2, 3
        want[0, :, 2:] = True  # KV head 1 (heads 2, 3): the NaN key, every token
        assert torch.equal(o_nan, want)
        # lse is NaN where a NaN key is seen (a NaN value leaves the scores finite)
        want_lse = torch.zeros_like(lse, dtype=torch.bool)
        want_lse[0, 2:] = True
        assert torch.equal(torch.isnan(lse), want_lse)
        assert torch.isfinite(lse[~want_lse]).all()
    # the rows that see no NaN equal the reference computed without the NaNs
    k2, v2 = k.clone(), v.clone()
    v2[slot(0, 38)][0], k2[slot(0, 5)][1] = 0.0, 0.0
    ro, rl, o_tol, _ = reference(q, k2, v2, sl, bt)
    ok = ~want.cpu()
    err = (out.double().cpu() - ro).abs()[ok]
    assert (err <= o_tol[ok]).all()


def test_block_table_outside_the_pool_is_refused():
    q, k, v, sl, bt = make_cache([33, 20], 1, 2, 2, 16, 16, seed=2)
    for bad in (k.shape[0], -1, 10**6):
        bt2 = bt.clone()
        bt2[1, 1] = bad  # sequence 1's second page: used (20 keys > one page)
        with pytest.raises(ValueError, match=r"block_table\[1, 1\].*outside the pool"):
            attention_with_kvcache(q, k, v, sl, bt2)
    bt2 = bt.clone()
    bt2[1, 2:] = 10**6  # past the pages sequence 1 uses: never read, accepted
    assert torch.equal(
        attention_with_kvcache(q, k, v, sl, bt2),
        attention_with_kvcache(q, k, v, sl, bt),
    )


def _bad_calls():
    q, k, v, sl, bt = make_cache([20, 17], 2, 4, 2, 16, 16, seed=1)
    base = dict(q=q, k_cache=k, v_cache=v, cache_seqlens=sl, block_table=bt)
    i32 = torch.int32
    return base, [
        (dict(q=q.tolist()), TypeError, "q must be a torch.Tensor"),
        (dict(q=q[0]), ValueError, "q must be 4-D"),
        (dict(q=q.to(torch.int32)), TypeError, "q must be float16"),
        (dict(k_cache=k.float()), TypeError, "share a dtype"),
        (dict(v_cache=v[:-1]), ValueError, "k_cache and v_cache must have one shape"),
        (dict(q=q[..., :8]), ValueError, "head dim"),
        (dict(q=q[:, :, :3]), ValueError, "H_q=3 must be a positive multiple"),
        (dict(cache_seqlens=sl.long()), TypeError, "cache_seqlens must be int32"),
        (dict(cache_seqlens=sl[:1]), ValueError, r"cache_seqlens must have shape"),
        (
            dict(cache_seqlens=torch.tensor([20, 33], dtype=i32, device=DEVICE)),
            ValueError,
            r"cache_seqlens must lie in 0..32",
        ),
        (
            dict(cache_seqlens=torch.tensor([20, -1], dtype=i32, device=DEVICE)),
            ValueError,
            "cache_seqlens must lie",
        ),
        (
            dict(cache_seqlens=torch.tensor([20, 1], dtype=i32, device=DEVICE)),
            ValueError,
            "counts the N_q = 2 new tokens",
        ),
        (dict(block_table=bt.long()), TypeError, "block_table must be int32"),
        (dict(block_table=bt[:1]), ValueError, r"block_table must be \(B, max_pages\)"),
        (dict(block_table=bt.tolist()), TypeError, "block_table must be a torch"),
        (dict(block_table=None), ValueError, "without block_table"),
        (dict(causal=1), TypeError, "causal must be a bool"),
        (dict(return_lse="yes"), TypeError, "return_lse must be a bool"),
        (dict(num_splits=-1), ValueError, "num_splits must be >= 0"),
        (dict(num_splits=2.0), TypeError, "num_splits must be an int"),
        (dict(softmax_scale=float("nan")), ValueError, "softmax_scale must be finite"),
        (dict(softmax_scale="x"), TypeError, "softmax_scale must be a real number"),
        (
            dict(q=torch.empty(2, 0, 4, 16, dtype=q.dtype, device=DEVICE)),
            ValueError,
            "N_q >= 1",
        ),
        (
            dict(
                q=torch.empty(2, 2, 4, 300, dtype=q.dtype, device=DEVICE),
                k_cache=torch.empty(5, 16, 2, 300, dtype=q.dtype, device=DEVICE),
                v_cache=torch.empty(5, 16, 2, 300, dtype=q.dtype, device=DEVICE),
            ),
            ValueError,
            "head dim d must be in 1..256",
        ),
        (
            dict(v_cache=v.transpose(0, 1).contiguous().transpose(0, 1)),
            ValueError,
            "one memory layout",
        ),
    ]


def test_every_bad_argument_is_named():
    base, cases = _bad_calls()
    for change, exc, match in cases:
        with pytest.raises(exc, match=match):
            attention_with_kvcache(**{**base, **change})
    meta = torch.empty(2, 2, 4, 16, dtype=base["q"].dtype, device="meta")
    with pytest.raises(ValueError, match="one device"):
        attention_with_kvcache(**{**base, "q": meta})


def test_split_heuristic_fills_the_sms():
    # B = 1, 8 KV heads on 132 SMs, 32k keys: 33 splits give 264 programs (2 per SM)
    assert choose_splits(8, 32768, 132) == 33
    assert choose_splits(8, 32768, 132, interpret=True) == checks.INTERPRET_MAX_SPLITS
    assert choose_splits(64 * 8, 32768, 132) == 1  # the grid fills the GPU already
    assert choose_splits(8, 1000, 132) == 4  # at least 256 keys per split
    assert choose_splits(1, 10**7, 132) == checks.MAX_SPLITS
    assert choose_splits(8, 0, 132) == 1


def test_tile_rules():
    from kernels.decode import tiles as K

    assert K.block_m(1, 1) == 16 and K.block_m(4, 3) == 16 and K.block_m(8, 4) == 32
    assert K.block_m(8, 16) == K.MAX_BLOCK_M == 64
    assert K.max_block_m((9, 0), 128, torch.float16) == 64
    assert K.max_block_m((9, 0), 128, torch.float32) == 16
    assert K.max_block_m((7, 5), 256, torch.bfloat16) == 32
    assert not K.supported((9, 0), 256, torch.float32)
    assert K.supported((9, 0), 256, torch.bfloat16) and K.supported(
        None, 256, torch.float32
    )
    # a key tile never straddles two pages of a power-of-two size >= 16
    assert K.block_n((9, 0), 128, 16, torch.float16, 16) == 16
    assert K.block_n((9, 0), 128, 16, torch.float16, 256) == 64
    assert K.block_n((9, 0), 128, 16, torch.float16, 48) == 64  # one entry per key


@pytest.mark.parametrize("causal", [True, False])
def test_matches_the_numpy_twin(causal):
    """kernels.decode against attention.decode.attention_with_kvcache (the chapter's
    NumPy version, float64) on one paged GQA case with N_q = 3 and an empty slot."""
    import numpy as np

    from attention import decode as npd

    g = torch.Generator().manual_seed(7)
    B, n_q, h_q, h_kv, d, page, n_pages = 3, 3, 4, 2, 32, 16, 10
    lens = torch.tensor([37, 0, 20], dtype=torch.int32)
    q = torch.randn(B, n_q, h_q, d, generator=g)  # (B, N_q, H_q, d)
    k, v = (torch.randn(n_pages, page, h_kv, d, generator=g) for _ in range(2))
    table = torch.randperm(n_pages, generator=g)[:9].reshape(3, 3).to(torch.int32)
    want, want_lse = npd.attention_with_kvcache(
        q.double().numpy(),
        k.double().numpy(),
        v.double().numpy(),
        lens.numpy(),
        table.numpy(),
        causal=causal,
        return_lse=True,
    )
    dev = runtime.DEVICE
    got, got_lse = attention_with_kvcache(
        q.to(dev),
        k.to(dev),
        v.to(dev),
        lens.to(dev),
        block_table=table.to(dev),
        causal=causal,
        return_lse=True,
    )
    # float32 inputs: a few ulp of fp32 per accumulated term, at most 37 keys
    np.testing.assert_allclose(got.cpu().double().numpy(), want, atol=2e-5, rtol=0)
    np.testing.assert_array_equal(
        np.isneginf(got_lse.cpu().numpy()), np.isneginf(want_lse)
    )
    fin = np.isfinite(want_lse)
    np.testing.assert_allclose(
        got_lse.cpu().double().numpy()[fin], want_lse[fin], atol=2e-5, rtol=0
    )
