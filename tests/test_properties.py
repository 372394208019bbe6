"""Property-based checks (Hypothesis) over the public functions of ``attention`` and
``kernels``.

Every call either matches a float64 reference written here, independently of the package
(explicit per-row loops), or raises ValueError/TypeError. The rules checked everywhere:

* a NaN in a row's (visible) inputs gives NaN in that row's output
  and lse, and only there;
* a row with no visible key gives output 0 and lse -inf;
* a value row hidden from a query (causal mask, top-k) never reaches it: no result
  depends on tile sizes (NumPy Br/Bc, kernel BLOCK_M/BLOCK_N).

Tolerances come from forward error bounds, never from one machine's luck: a score is a
length-d dot product, so |s~ - s| <= kappa = (d + 2) u |scale| sum_c |q_c| |k_c|; P then
moves by at most a relative expm1(2 max kappa), and o = P V adds (N_k + 4) u relative of
P |V| for its own sums (u = 2^-53 in float64, 2^-24 for the fp32 kernels).

Deterministic (``derandomize=True``, no example database) and bounded: small shapes and
example counts keep the whole file well under a minute of interpreter time on 2 cores.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attention import core
from attention import deformable as adf
from attention import flash as aflash
from attention import hard as ahard
from kernels import deformable as kdef
from kernels import runtime
from kernels.flash import flash_attention, forward_with_tiles
from kernels.hard import hard_attention, topk_attention

U64, U32 = 2.0**-53, 2.0**-24
DEV = runtime.DEVICE
FAST = settings(
    max_examples=150,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
SLOW = settings(FAST, max_examples=30)  # Triton interpreter: ~0.1-1 s per call


# --------------------------------------------------------------------------------------
# The float64 reference, written independently: one row at a time
# --------------------------------------------------------------------------------------


def ref_attention(q, k, v, scale, keep):
    """Per-row softmax over the visible keys: o (N_q, d_v),
    lse (N_q) and the error-bound terms kap (N_q,: max_j kappa_ij / u) and mag
    (N_q, d_v: sum_j P_ij |v_jc|)."""
    q, k, v = (np.asarray(t, dtype=np.float64) for t in (q, k, v))
    n_q, n_k, d_v = q.shape[0], k.shape[0], v.shape[1]
    o, lse = np.zeros((n_q, d_v)), np.full(n_q, -np.inf)
    kap, mag = np.zeros(n_q), np.zeros((n_q, d_v))
    for i in range(n_q):
        vis = [j for j in range(n_k) if keep[i, j]]
        if not vis:
            continue  # no visible key: 0 and -inf, whatever the hidden entries hold
        s = [
            math.fsum(q[i, c] * k[j, c] for c in range(q.shape[1])) * scale for j in vis
        ]
        if any(math.isnan(x) for x in s):
            o[i], lse[i] = np.nan, np.nan
            continue
        m = max(s)
        e = [math.exp(x - m) for x in s]
        tot = math.fsum(e)
        lse[i] = m + math.log(tot)
        kap[i] = max(
            (q.shape[1] + 2)
            * abs(scale)
            * math.fsum(abs(q[i, c] * k[j, c]) for c in range(q.shape[1]))
            for j in vis
        )
        for c in range(d_v):
            terms = [e_j / tot * v[j, c] for e_j, j in zip(e, vis)]
            o[i, c] = math.fsum(terms) if all(map(math.isfinite, terms)) else sum(terms)
            mag[i, c] = math.fsum(abs(t) for t in terms if math.isfinite(t))
    return o, lse, (kap, mag)


def assert_rows(o, lse, o_ref, lse_ref, terms, u, n_k, d):
    """Same NaN / inf / -inf pattern as the reference; finite entries within the bound
    |o - o_ref| <= 2 (expm1(2 u kap) + (N_k + d + 8) u) sum_j P_j |v_j| and
    |lse - lse_ref| <= 2 (u kap + (N_k + 8) u (1 + |lse|))."""
    kap, mag = terms
    o, lse = np.asarray(o, dtype=np.float64), np.asarray(lse, dtype=np.float64)
    assert np.array_equal(np.isnan(o), np.isnan(o_ref))
    assert np.array_equal(np.isnan(lse), np.isnan(lse_ref))
    assert np.array_equal(np.isneginf(lse), np.isneginf(lse_ref))
    fin = np.isfinite(o_ref)
    assert np.array_equal(np.isfinite(o), fin)
    assert np.array_equal(
        o[~fin & ~np.isnan(o_ref)], o_ref[~fin & ~np.isnan(o_ref)]
    )  # +-inf
    # plus underflow: each rounding may also lose half the smallest subnormal
    eta = 2.0**-1074 if u == U64 else 2.0**-149
    tol = (
        2 * (np.expm1(2 * u * kap)[:, None] + (n_k + d + 8) * u) * mag
        + (n_k + d + 8) * eta
    )
    assert np.all(np.abs(o[fin] - o_ref[fin]) <= tol[fin])
    lf = np.isfinite(lse_ref)
    ltol = 2 * (u * kap + (n_k + 8) * u * (1 + np.abs(lse_ref)))
    assert np.all(np.abs(lse[lf] - lse_ref[lf]) <= ltol[lf])


# --------------------------------------------------------------------------------------
# Strategies
# --------------------------------------------------------------------------------------

# entries: moderate floats (no overflow of q k^T), a few exact zeros
ENTRY = st.floats(-4.0, 4.0, allow_nan=False, width=64)


@st.composite
def problem(draw, max_n=7, max_d=5, nans=True):
    n_q, n_k = draw(st.integers(0, max_n)), draw(st.integers(0, max_n))
    d, d_v = draw(st.integers(1, max_d)), draw(st.integers(1, 4))
    arr = lambda *shape: np.array(
        draw(
            st.lists(  # noqa: E731
                ENTRY, min_size=math.prod(shape), max_size=math.prod(shape)
            )
        )
    ).reshape(shape)
    q, k, v = arr(n_q, d), arr(n_k, d), arr(n_k, d_v)
    if nans:  # a NaN or inf at a random position of one input
        which = draw(st.sampled_from(["none", "q", "k", "v"]))
        t = {"q": q, "k": k, "v": v}.get(which)
        if t is not None and t.size:
            t.flat[draw(st.integers(0, t.size - 1))] = draw(
                st.sampled_from([np.nan, np.inf, -np.inf] if which == "v" else [np.nan])
            )
    causal = draw(st.booleans())
    mask = None
    if draw(st.booleans()) and n_q and n_k:
        mask = np.array(
            draw(st.lists(st.booleans(), min_size=n_q * n_k, max_size=n_q * n_k))
        ).reshape(n_q, n_k)
    scale = draw(st.one_of(st.none(), st.floats(-2.0, 2.0, allow_nan=False)))
    return q, k, v, causal, mask, scale


def keep_of(n_q, n_k, causal, mask):
    keep = np.ones((n_q, n_k), bool)
    if causal:
        keep &= np.arange(n_k)[None, :] <= np.arange(n_q)[:, None] + n_k - n_q
    if mask is not None:
        keep &= mask
    return keep


def eff_scale(scale, d):
    return 1 / math.sqrt(d) if scale is None else scale


# --------------------------------------------------------------------------------------
# NumPy side
# --------------------------------------------------------------------------------------


@FAST
@given(problem())
def test_numpy_attention_matches_reference(prob):
    q, k, v, causal, mask, scale = prob
    n_q, n_k, d = q.shape[0], k.shape[0], q.shape[1]
    keep = keep_of(n_q, n_k, causal, mask)
    o_ref, lse_ref, terms = ref_attention(q, k, v, eff_scale(scale, d), keep)
    o = core.scaled_dot_product_attention(
        q, k, v, mask=mask, causal=causal, scale=scale
    )
    assert_rows(o, lse_ref, o_ref, lse_ref, terms, U64, n_k, d)
    if mask is None:  # the FlashAttention twins: same values for every tiling
        o_s, lse_s, _ = aflash.standard_forward(q, k, v, causal=causal, scale=scale)
        assert_rows(o_s, lse_s, o_ref, lse_ref, terms, U64, n_k, d)
        for br, bc in ((1, 1), (2, 3), (64, 64)):
            for f in (aflash.flash1_forward, aflash.flash2_forward):
                o_t, lse_t = f(q, k, v, Br=br, Bc=bc, causal=causal, scale=scale)
                assert_rows(o_t, lse_t, o_ref, lse_ref, terms, U64, n_k, d)


@FAST
@given(
    st.lists(
        st.lists(
            st.one_of(ENTRY, st.just(-np.inf), st.just(np.nan)), min_size=1, max_size=6
        ),
        min_size=1,
        max_size=4,
    ).filter(lambda rows: len({len(r) for r in rows}) == 1),
    st.integers(1, 4),
)
def test_softmax_passes_match_core_softmax(rows, block):
    x = np.array(rows)
    ref = core.softmax(x)
    for row, r in zip(x, ref):  # the reference rule, row by row
        if np.isnan(row).any():
            assert np.isnan(r).all()
        elif np.isneginf(row).all():
            assert np.all(r == 0)
        else:
            assert abs(r.sum() - 1) <= 4 * len(row) * U64
    for f in (aflash.softmax_2pass, aflash.softmax_3pass):
        y = f(x, block=block)
        assert np.array_equal(np.isnan(y), np.isnan(ref))
        fin = ~np.isnan(ref)
        assert np.all(np.abs(y - ref)[fin] <= 16 * x.shape[-1] * U64)


@FAST
@given(
    st.integers(1, 6),
    st.integers(1, 6),
    st.integers(1, 3),
    st.integers(1, 8),
    st.booleans(),
    st.data(),
)
def test_numpy_hard_and_topk_pick_the_reference_keys(n_q, n_k, d, topk, causal, data):
    # integer entries and a power-of-two scale: every score is exact,
    # so the choice is too
    ints = st.integers(-3, 3)
    q = np.array(data.draw(st.lists(ints, min_size=n_q * d, max_size=n_q * d)), float)
    k = np.array(data.draw(st.lists(ints, min_size=n_k * d, max_size=n_k * d)), float)
    q, k = q.reshape(n_q, d), k.reshape(n_k, d)
    v = np.arange(n_k * 2, dtype=float).reshape(n_k, 2)
    if data.draw(st.booleans()):
        q[data.draw(st.integers(0, n_q - 1)), 0] = np.nan
    keep = keep_of(n_q, n_k, causal, None)
    o, idx = ahard.hard_attention(q, k, v, scale=0.5, causal=causal, return_index=True)
    o_k, p = ahard.topk_attention(
        q, k, v, topk, scale=0.5, causal=causal, return_weights=True
    )
    for i in range(n_q):
        s = [(-(q[i] @ k[j]), j) for j in range(n_k) if keep[i, j]]
        if np.isnan(q[i]).any() and s:  # every visible score NaN: the first one wins
            assert idx[i] == s[0][1] and np.isnan(o[i]).all() and np.isnan(o_k[i]).all()
            continue
        if not s:
            assert idx[i] == -1 and np.all(o[i] == 0) and np.all(o_k[i] == 0)
            continue
        best = sorted(s)[:topk]  # score descending, index ascending
        assert idx[i] == best[0][1] and np.array_equal(o[i], v[best[0][1]])
        kept = sorted(j for _, j in best)
        assert sorted(np.flatnonzero(p[i] > 0)) == kept


@FAST
@given(st.sampled_from(["scale", "causal", "Br", "topk", "mask"]), st.data())
def test_numpy_bad_arguments_raise_value_or_type_error(arg, data):
    q = np.ones((3, 2))
    bad = {
        "scale": st.sampled_from([np.inf, np.nan, "1", [1.0]]),
        "causal": st.sampled_from(["False", 1, None, 0.0]),
        "Br": st.sampled_from([0, -1, 2.5, "2", True]),
        "topk": st.sampled_from([0, -1, 2.7, "3", None]),
        "mask": st.sampled_from([np.ones((3, 3)), np.ones((2, 3), bool), "yes"]),
    }[arg]
    value = data.draw(bad)
    with pytest.raises((ValueError, TypeError)):
        if arg == "Br":
            aflash.flash2_forward(q, q, q, Br=value)
        elif arg == "topk":
            ahard.topk_attention(q, q, q, value)
        else:
            core.scaled_dot_product_attention(q, q, q, **{arg: value})


# --------------------------------------------------------------------------------------
# Kernels (Triton interpreter on a CPU)
# --------------------------------------------------------------------------------------


@st.composite
def kernel_problem(draw):
    # across the 64-row tile
    n_q, n_k = draw(st.integers(1, 70)), draw(st.integers(1, 70))
    d = draw(st.sampled_from([1, 8, 16, 24]))
    h_kv = draw(st.integers(1, 2))
    h = h_kv * draw(st.integers(1, 2))
    seed = draw(st.integers(0, 2**16))
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, h, n_q, d, generator=g)
    k = torch.randn(1, h_kv, n_k, d, generator=g)
    v = torch.randn(1, h_kv, n_k, d, generator=g)
    which = draw(st.sampled_from(["none", "q", "k", "v"]))
    t = {"q": q, "k": k, "v": v}.get(which)
    if t is not None:
        t.view(-1)[draw(st.integers(0, t.numel() - 1))] = float("nan")
    return (
        q,
        k,
        v,
        draw(st.booleans()),
        draw(st.one_of(st.none(), st.floats(-1.5, 1.5))),
    )


@SLOW
@given(kernel_problem(), st.sampled_from([16, 32, 64]), st.sampled_from([16, 32, 64]))
def test_flash_kernel_matches_reference_for_any_tiles(prob, block_m, block_n):
    q, k, v, causal, scale = prob
    o, lse = flash_attention(
        q.to(DEV),
        k.to(DEV),
        v.to(DEV),
        causal=causal,
        softmax_scale=scale,
        return_lse=True,
    )
    o_t = forward_with_tiles(
        q.to(DEV),
        k.to(DEV),
        v.to(DEV),
        block_m,
        block_n,
        causal=causal,
        softmax_scale=scale,
    )
    group = q.shape[1] // k.shape[1]
    n_q, n_k, d = q.shape[2], k.shape[2], q.shape[3]
    keep = keep_of(n_q, n_k, causal, None)
    for hh in range(q.shape[1]):
        args = (q[0, hh].numpy(), k[0, hh // group].numpy(), v[0, hh // group].numpy())
        o_ref, lse_ref, terms = ref_attention(*args, eff_scale(scale, d), keep)
        assert_rows(
            o[0, hh].cpu(), lse[0, hh].cpu(), o_ref, lse_ref, terms, U32, n_k, d
        )
        assert_rows(o_t[0, hh].cpu(), lse_ref, o_ref, lse_ref, terms, U32, n_k, d)


@SLOW
@given(
    st.integers(1, 40),
    st.integers(1, 70),
    st.integers(1, 5),
    st.booleans(),
    st.integers(0, 2**16),
    st.sampled_from(["none", "q", "k", "v"]),
)
def test_hard_kernels_match_numpy_twin(n_q, n_k, topk, causal, seed, nan):
    g = torch.Generator().manual_seed(seed)
    # small integers: fp32 scores are exact, so the kernel's choice equals the twin's
    q = torch.randint(-3, 4, (1, 1, n_q, 8), generator=g).float()
    k = torch.randint(-3, 4, (1, 1, n_k, 8), generator=g).float()
    v = torch.randn(1, 1, n_k, 8, generator=g)
    if nan != "none":  # a NaN row (q), a NaN key (k) or a NaN value row (v)
        t = {"q": q, "k": k, "v": v}[nan]
        t[0, 0, seed % t.shape[2], seed % 8] = float("nan")
    o, idx = hard_attention(
        q.to(DEV),
        k.to(DEV),
        v.to(DEV),
        causal=causal,
        softmax_scale=0.25,
        return_index=True,
    )
    o_n, idx_n = ahard.hard_attention(
        q[0, 0].numpy(),
        k[0, 0].numpy(),
        v[0, 0].numpy(),
        scale=0.25,
        causal=causal,
        return_index=True,
    )
    assert np.array_equal(idx[0, 0].cpu().numpy(), idx_n)
    assert np.array_equal(o[0, 0].cpu().numpy(), o_n.astype(np.float32), equal_nan=True)
    o_k, idx_k = topk_attention(
        q.to(DEV),
        k.to(DEV),
        v.to(DEV),
        topk,
        causal=causal,
        softmax_scale=0.25,
        return_index=True,
    )
    idx_kn = ahard.topk_index(
        ahard.attention_scores(q[0, 0].numpy(), k[0, 0].numpy(), 0.25, causal), topk
    )
    assert np.array_equal(np.sort(idx_k[0, 0].cpu().numpy(), -1), np.sort(idx_kn, -1))
    o_kn = ahard.topk_attention(
        q[0, 0].numpy().astype(np.float64),
        k[0, 0].numpy(),
        v[0, 0].numpy().astype(np.float64),
        topk,
        scale=0.25,
        causal=causal,
    )
    assert np.array_equal(np.isnan(o_k[0, 0].cpu().numpy()), np.isnan(o_kn))
    fin = np.isfinite(o_kn)
    # fp32 softmax over <= topk kept scores:
    # (topk + 8) u relative of sum p |v| <= max |v|
    v_fin = np.abs(v[0, 0].numpy())  # a NaN value row reaches only rows keeping it
    tol = 4 * (topk + 8) * U32 * np.max(v_fin[np.isfinite(v_fin)], initial=0.0)
    assert np.all(np.abs(o_k[0, 0].cpu().numpy()[fin] - o_kn[fin]) <= tol)


@SLOW
@given(
    st.integers(1, 6),
    st.integers(1, 3),
    st.integers(1, 2),
    st.integers(1, 40),
    st.integers(0, 2**16),
)
def test_msda_kernel_matches_numpy_twin_in_float64(l_q, n_l, n_p, d, seed):
    g = torch.Generator().manual_seed(seed)
    shapes = torch.randint(1, 5, (n_l, 2), generator=g)
    starts = torch.cat([shapes.new_zeros(1), shapes.prod(1).cumsum(0)[:-1]])
    s = int(shapes.prod(1).sum())
    value = torch.randn(1, s, 2, d, generator=g, dtype=torch.float64)
    loc = (
        torch.rand(1, l_q, 2, n_l, n_p, 2, generator=g, dtype=torch.float64) * 1.4 - 0.2
    )
    w = torch.rand(1, l_q, 2, n_l, n_p, generator=g, dtype=torch.float64)
    out = (
        kdef.ms_deform_attn(
            value.to(DEV), shapes.to(DEV), starts.to(DEV), loc.to(DEV), w.to(DEV)
        )
        .cpu()
        .numpy()
    )
    twin = adf.ms_deform_attn(
        value.numpy(), shapes.numpy(), starts.numpy(), loc.numpy(), w.numpy()
    )
    # <= n_l * n_p * 4 products of |w| <= 1,
    # bilinear weights <= 1 and |value|: fp64 sums
    tol = 8 * (4 * n_l * n_p + 8) * U64 * np.abs(value.numpy()).max() * n_l * n_p
    assert np.all(np.abs(out - twin) <= tol)


@SLOW
@given(st.sampled_from(["softmax_scale", "causal", "topk"]), st.data())
def test_kernel_bad_arguments_raise_value_or_type_error(arg, data):
    q = torch.zeros(1, 1, 4, 16, device=DEV)
    value = data.draw(
        {
            "softmax_scale": st.sampled_from([1e300, -3e38, math.inf, math.nan, "1"]),
            "causal": st.sampled_from(["False", 1, None]),
            "topk": st.sampled_from([0, -1, 2.7, "3", 129]),
        }[arg]
    )
    with pytest.raises((ValueError, TypeError)):
        if arg == "topk":
            topk_attention(q, q, q, value)
        else:
            flash_attention(q, q, q, **{arg: value})
    with pytest.raises((ValueError, TypeError)):
        if arg != "topk":
            hard_attention(q, q, q, **{arg: value})
        else:
            raise ValueError
