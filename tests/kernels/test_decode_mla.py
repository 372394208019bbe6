"""kernels.decode.mla_with_kvcache (absorbed MLA decode: one latent row a token, V its
first head_dim_v columns) against the fp64 reference of test_decode_features and the
NumPy twin; the window's NaN rule and split count; every bad keyword named.
Small shapes under the Triton interpreter."""

import math

import numpy as np
import pytest
import torch

from kernels import runtime
from kernels.decode import (
    attention_with_kvcache,
    checks,
    mla_with_kvcache,
    prepare,
    prepare_mla,
)
from tests.kernels.test_decode import U, compare, make_cache
from tests.kernels.test_decode_features import gather, reference

pytestmark = pytest.mark.xdist_group("decode")

DEVICE = runtime.DEVICE
FP8 = torch.float8_e4m3fn


def latent_cache(lens, n_q, h_q, D, page, dtype, seed):
    """q (B, N_q, H_q, D) and a latent cache (pages of (page, 1, D) through a table,
    or (B, N_max, 1, D) when page is 0), stale slots NaN."""
    q, kv, _, sl, bt = make_cache(lens, n_q, h_q, 1, D, page or 16, dtype, seed)
    if page:
        return q, kv, sl, bt
    rows = gather(kv, sl, bt)
    kc = torch.full((len(lens), max(lens) + 5, 1, D), float("nan"))
    for b, n in enumerate(lens):
        kc[b, :n] = rows[b]
    return q, kc.to(DEVICE, dtype), sl, None


@pytest.mark.parametrize(
    "lens, n_q, h_q, D, dv, page, dtype, causal",
    [
        ([45, 0, 17], 2, 8, 80, 64, 16, torch.float16, True),
        ([21, 30], 3, 4, 48, 32, 0, torch.bfloat16, False),
        ([20], 1, 4, 576, 512, 16, torch.bfloat16, True),  # DeepSeek-V3's row
    ],
    ids=["paged-d80-dv64", "contig-noncausal-bf16", "paged-d576-dv512"],
)
def test_mla_matches_fp64_and_the_twin(lens, n_q, h_q, D, dv, page, dtype, causal):
    from attention import decode as npd

    q, kv, sl, bt = latent_cache(lens, n_q, h_q, D, page, dtype, D)
    got = mla_with_kvcache(q, kv, sl, bt, dv, causal=causal, return_lse=True)
    assert got[0].shape == (len(lens), n_q, h_q, dv) and got[0].dtype == dtype
    rows = gather(kv, sl, bt)
    want = reference(
        q, rows, [r[..., :dv] for r in rows], sl, causal, (-1, -1), 0, None, None,
        U[dtype],
    )  # fmt: skip
    compare(got, want)
    if page:  # three splits and the merge
        compare(
            prepare_mla(q, kv, sl, bt, dv, None, causal, True, num_splits=3)(), want
        )
    tw_o, tw_l = npd.mla_with_kvcache(
        q.double().cpu().numpy(), kv.double().cpu().numpy(), sl.cpu().numpy(),
        None if bt is None else bt.cpu().numpy(), dv, causal=causal, return_lse=True,
    )  # fmt: skip
    assert np.allclose(got[0].double().cpu().numpy(), tw_o, atol=8 * U[dtype])
    fin = np.isfinite(tw_l)
    assert np.array_equal(np.isneginf(got[1].cpu().numpy()), np.isneginf(tw_l))
    assert np.allclose(got[1].cpu().numpy()[fin], tw_l[fin], atol=1e-4)


def test_nan_outside_the_window_is_never_seen():
    # N_q = 4 at positions 36..39 under window (3, -1), causal: query i sees
    # i - 3 .. i. A NaN value at key 34 reaches tokens 0 and 1 (positions 36, 37)
    # of KV head 0's heads only; a NaN key at 5 lies in a tile the window skips.
    lens, n_q, page = [40], 4, 16
    q, k, v, sl, bt = make_cache(lens, n_q, 4, 2, 32, page, torch.float32, seed=9)

    def slot(j):
        return int(bt[0, j // page]), j % page

    v[slot(34)][0] = float("nan")
    k[slot(5)][:] = float("nan")
    for splits in (1, 2):
        out = attention_with_kvcache(
            q, k, v, sl, bt, num_splits=splits, window_size=(3, -1)
        )
        nan = torch.isnan(out).all(-1)
        assert torch.equal(nan, torch.isnan(out).any(-1))
        want = torch.zeros_like(nan)
        want[0, :2, :2] = True
        assert torch.equal(nan, want)


def test_the_split_count_sees_only_the_window():
    q, k, v, sl, bt = make_cache([4000, 3000], 1, 2, 1, 16, 64, seed=1)
    full = prepare(q, k, v, sl, bt, num_splits=16)
    win = prepare(q, k, v, sl, bt, num_splits=16, window_size=(8, -1))
    # interpreter tiles of 16 keys: 9 visible keys straddle at most 2 tiles
    assert full.splits == 16 and win.splits == 2
    assert checks.visible_span(4000, 1, 8) == 9
    assert checks.visible_span(4000, 2, -1) == 4000
    assert checks.choose_splits(1, 9, 132) == 1  # the heuristic counts only those


def _bad_calls():
    q, k, v, sl, bt = make_cache([20, 7], 1, 4, 2, 16, 16, seed=4)
    k8, v8 = k.nan_to_num().to(FP8), v.nan_to_num().to(FP8)
    d2 = torch.ones(2, 2, device=DEVICE)
    f32 = dict(dtype=torch.float32, device=DEVICE)
    kv = make_cache([20, 7], 1, 4, 1, 24, 16, seed=5)[1]
    qm = torch.randn(2, 1, 4, 24, device=DEVICE, dtype=torch.float16)
    a = (q, k, v, sl, bt)
    return [
        (a, dict(window_size=(-2, 0)), ValueError, "window_size"),
        (a, dict(window_size=(1.5, 0)), TypeError, "window_size"),
        (a, dict(window_size=4), TypeError, "window_size"),
        (a, dict(softcap=-1.0), ValueError, "softcap"),
        (a, dict(softcap=math.inf), ValueError, "softcap"),
        (a, dict(softcap="x"), TypeError, "softcap"),
        (a, dict(alibi_slopes=torch.ones(3, **f32)), ValueError, "alibi_slopes"),
        (a, dict(alibi_slopes=torch.ones(4, device=DEVICE)), None, None),
        (a, dict(alibi_slopes=torch.ones(4, device=DEVICE).double()), TypeError,
         "alibi_slopes"),
        (a, dict(sinks=torch.ones(2, 4, **f32)), ValueError, "sinks"),
        (a, dict(sinks=torch.ones(5, **f32)), ValueError, "sinks"),
        (a, dict(k_descale=d2, v_descale=d2), ValueError, "k_descale"),
        ((q, k8, v8, sl, bt), dict(k_descale=d2), ValueError, "v_descale"),
        ((q, k8, v8, sl, bt), dict(k_descale=torch.ones(2, **f32),
         v_descale=d2), ValueError, "k_descale"),
        ((q, k8, v8, sl, bt), dict(k_descale=d2, v_descale=d2.t()[:1]), ValueError,
         "v_descale"),
        ((q.to(FP8), k8, v8, sl, bt), {}, TypeError, "q"),
        ((q.float(), k8, v8, sl, bt), {}, TypeError, "q"),
        ((q, k8, v, sl, bt), {}, TypeError, "v_cache"),
        ((qm, kv, sl, bt), dict(head_dim_v=32), ValueError, "head_dim_v"),
        ((qm, kv, sl, bt), dict(head_dim_v=0), ValueError, "head_dim_v"),
        ((q, k, sl, bt), dict(head_dim_v=8), ValueError, "kv_cache"),
        ((qm, kv.float(), sl, bt), dict(head_dim_v=8), TypeError, "kv_cache"),
    ]  # fmt: skip


def test_every_bad_keyword_is_named():
    for args, kw, exc, name in _bad_calls():
        call = mla_with_kvcache if len(args) == 4 else prepare
        if exc is None:
            call(*args, **kw)
            continue
        with pytest.raises(exc, match=name):
            call(*args, **kw)
