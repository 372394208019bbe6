"""attention.kvcache (re-exported by attention.decode): the kvcache call's window,
softcap, ALiBi, sinks and fp8 cache, and the MLA call, against an fp64 reference written
here (one (sequence, head) at a time, the sink as an extra score column with value 0);
e4m3 rounding against torch's float8_e4m3fn cast; arguments checked by name."""

import math

import numpy as np
import pytest

from attention import decode

TOL = 1e-12


def _reference(q, k, v, lens, causal, window, cap, slopes, sinks, scale=None):
    """out (B, N_q, H_q, d_v), lse (B, H_q, N_q) of contiguous k, v (B, N, H_kv, .)."""
    B, n_q, h_q, d = q.shape
    g = h_q // k.shape[2]
    scale = 1 / math.sqrt(d) if scale is None else scale
    left, right = window
    if causal:
        right = 0
    out = np.zeros((B, n_q, h_q, v.shape[3]))
    lse = np.full((B, h_q, n_q), -np.inf)
    for b in range(B):
        n = lens[b]
        for h in range(h_q):
            for t in range(n_q):
                i = n - n_q + t
                scores, vals = [], []
                for j in range(n):
                    if (left >= 0 and j < i - left) or (right >= 0 and j > i + right):
                        continue
                    s = scale * float(q[b, t, h] @ k[b, j, h // g])
                    if cap > 0:
                        s = cap * math.tanh(s / cap)
                    if slopes is not None:
                        s -= np.broadcast_to(slopes, (B, h_q))[b, h] * abs(i - j)
                    scores.append(s)
                    vals.append(v[b, j, h // g])
                if sinks is not None:
                    scores.append(float(sinks[h]))
                    vals.append(np.zeros(v.shape[3]))
                if not scores:
                    continue
                s = np.array(scores)
                m = s.max()
                w = np.exp(s - m)
                out[b, t, h] = w @ np.array(vals) / w.sum()
                lse[b, h, t] = m + math.log(w.sum())
    return out, lse


def _paged(rng, k, page):
    """k (B, N, H, d) scattered to a shuffled pool of pages, with its block table."""
    B, N = k.shape[:2]
    per = -(-N // page)
    table = rng.permutation(B * per + 3)[: B * per].reshape(B, per)
    return _scatter(k, table, page, B * per + 3), table


def _scatter(x, table, page, num_pages):
    pool = np.zeros((num_pages, page, *x.shape[2:]))
    for b in range(x.shape[0]):
        for p, phys in enumerate(table[b]):
            chunk = x[b, p * page : (p + 1) * page]
            pool[phys, : len(chunk)] = chunk
    return pool


CASES = [  # causal, window, softcap, alibi, sinks
    (True, (-1, -1), 0.0, False, False),
    (True, (5, -1), 0.0, False, False),
    (False, (4, 2), 0.0, False, False),
    (False, (-1, 0), 2.0, False, False),
    (True, (-1, -1), 1.5, True, False),
    (False, (3, 3), 0.0, True, True),
    (True, (7, -1), 0.0, False, True),
    (True, (0, 0), 3.0, True, True),
]


@pytest.mark.parametrize("causal,window,cap,alibi,sink", CASES)
def test_keywords_equal_the_reference(causal, window, cap, alibi, sink):
    rng = np.random.default_rng(hash((causal, window, cap)) % 2**32)
    for B, n_q, h_q, h_kv, n_max in ((3, 1, 4, 2, 37), (2, 3, 6, 1, 21)):
        d = 8
        q = rng.standard_normal((B, n_q, h_q, d)) * 2
        k = rng.standard_normal((B, n_max, h_kv, d))
        v = rng.standard_normal((B, n_max, h_kv, d))
        lens = rng.integers(n_q, n_max + 1, size=B)
        lens[0] = n_max
        slopes = (
            rng.uniform(0.05, 0.5, (B, h_q) if B == 3 else (h_q,)) if alibi else None
        )
        sinks = rng.standard_normal(h_q) if sink else None
        want = _reference(q, k, v, lens, causal, window, cap, slopes, sinks)
        kw = dict(
            causal=causal, window_size=window, softcap=cap, alibi_slopes=slopes,
            sinks=sinks, return_lse=True,
        )  # fmt: skip
        for splits in (1, 3):
            got = decode.attention_with_kvcache(q, k, v, lens, num_splits=splits, **kw)
            for g, w in zip(got, want, strict=True):
                np.testing.assert_allclose(g, w, atol=TOL, rtol=0)
        kp, table = _paged(rng, k, 4)
        vp = _scatter(v, table, 4, kp.shape[0])
        got = decode.attention_with_kvcache(q, kp, vp, lens, table, **kw)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, atol=TOL, rtol=0)


def test_a_row_that_sees_no_key_gets_zero_and_the_sink_or_minus_inf():
    rng = np.random.default_rng(3)
    q, k = rng.standard_normal((1, 1, 2, 4)), rng.standard_normal((1, 6, 1, 4))
    lens = np.array([0])
    out, lse = decode.attention_with_kvcache(q, k, k, lens, return_lse=True)
    assert (out == 0).all() and np.isneginf(lse).all()
    sinks = np.array([0.5, -1.0])
    out, lse = decode.attention_with_kvcache(
        q, k, k, lens, sinks=sinks, return_lse=True
    )
    assert (out == 0).all()
    np.testing.assert_array_equal(lse[0, :, 0], sinks)


def test_nan_stays_in_its_row_under_a_window():
    rng = np.random.default_rng(4)
    q, k = rng.standard_normal((1, 1, 1, 4)), rng.standard_normal((2, 9, 1, 4))
    q = np.repeat(q, 2, axis=0)
    k[0, 0] = np.nan  # outside the window of sequence 0's query at 8
    k[1, 8] = np.nan  # inside sequence 1's
    out = decode.attention_with_kvcache(q, k, k, np.array([9, 9]), window_size=(3, 0))
    assert np.isfinite(out[0]).all() and np.isnan(out[1]).all()


def test_round_e4m3_equals_torch_cast():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    x = rng.standard_normal(20000) * np.exp2(rng.uniform(-14, 10, 20000))
    edges = [0.0, -0.0, 448, 449, 463.9, 464, 480, 1e6, np.inf, -np.inf, np.nan]
    edges += [2.0**-9, 2.0**-10, 1.01 * 2.0**-10, 3 * 2.0**-11, 1.0625, 1.1875, -1.0625]
    x = np.concatenate([x, edges]).astype(np.float32).astype(np.float64)
    want = (
        torch.tensor(x, dtype=torch.float32)
        .to(torch.float8_e4m3fn)
        .to(torch.float64)
        .numpy()
    )
    np.testing.assert_array_equal(decode.round_e4m3(x), want)


def test_fp8_cache_equals_reference_on_the_dequantised_cache():
    rng = np.random.default_rng(6)
    B, n_q, h_q, h_kv, n, d = 2, 2, 4, 2, 19, 16
    q = rng.standard_normal((B, n_q, h_q, d))
    k, v = (rng.standard_normal((B, n, h_kv, d)) * 3 for _ in range(2))
    k8, kd = decode.quantize_e4m3(k)
    v8, vd = decode.quantize_e4m3(v)
    assert kd.shape == (B, h_kv) and np.abs(k8).max() <= decode.E4M3_MAX
    lens = np.array([n, 11])
    got = decode.attention_with_kvcache(
        q, k8, v8, lens, k_descale=kd, v_descale=vd, return_lse=True
    )
    kq, vq = k8 * kd[:, None, :, None], v8 * vd[:, None, :, None]
    want = _reference(q, kq, vq, lens, True, (-1, -1), 0.0, None, None)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, atol=TOL, rtol=0)
    # e4m3's relative step is 2^-3, so each element is off by at most 2^-4 of itself
    assert np.all(np.abs(kq - k) <= 2.0**-4 * np.abs(k) + kd[:, None, :, None] * 2**-9)


def _mla_reference(q, kv, lens, dv, scale):
    h_q = q.shape[2]
    k = np.repeat(kv, h_q, axis=2)  # every head reads the one latent row
    return _reference(q, k, k[..., :dv], lens, True, (-1, -1), 0.0, None, None, scale)


def test_mla_equals_mqa_over_the_latent_row():
    rng = np.random.default_rng(7)
    B, n_q, h_q, dv, rope, n = 2, 2, 8, 16, 8, 23
    q = rng.standard_normal((B, n_q, h_q, dv + rope))
    kv = rng.standard_normal((B, n, 1, dv + rope))
    lens = np.array([n, 9])
    out, lse = decode.mla_with_kvcache(q, kv, lens, head_dim_v=dv, return_lse=True)
    assert out.shape == (B, n_q, h_q, dv)
    want = _mla_reference(q, kv, lens, dv, 1 / math.sqrt(dv + rope))
    np.testing.assert_allclose(out, want[0], atol=TOL, rtol=0)
    np.testing.assert_allclose(lse, want[1], atol=TOL, rtol=0)
    pool, table = _paged(rng, kv, 4)
    paged = decode.mla_with_kvcache(q, pool, lens, table, head_dim_v=dv)
    np.testing.assert_allclose(paged, want[0], atol=TOL, rtol=0)
    scaled = decode.mla_with_kvcache(q, kv, lens, head_dim_v=dv, scale=0.1)
    np.testing.assert_allclose(
        scaled, _mla_reference(q, kv, lens, dv, 0.1)[0], atol=TOL, rtol=0
    )
    with pytest.warns(DeprecationWarning, match="softmax_scale"):
        old = decode.mla_with_kvcache(q, kv, lens, head_dim_v=dv, softmax_scale=0.1)
    np.testing.assert_array_equal(old, scaled)


def test_arguments_are_checked_by_name():
    q, k = np.zeros((2, 1, 4, 8)), np.zeros((2, 5, 2, 8))
    lens = np.array([3, 3])
    cases = [
        (dict(window_size=(-2, 0)), ValueError, "^window_size"),
        (dict(window_size=3), TypeError, "^window_size"),
        (dict(window_size=(1.5, 0)), TypeError, "^window_size"),
        (dict(softcap=-1.0), ValueError, "^softcap"),
        (dict(softcap="x"), TypeError, "^softcap"),
        (dict(alibi_slopes=np.zeros(3)), ValueError, "^alibi_slopes"),
        (dict(alibi_slopes=np.zeros((3, 4))), ValueError, "^alibi_slopes"),
        (dict(sinks=np.zeros(5)), ValueError, "^sinks"),
        (dict(sinks=np.zeros((2, 4))), ValueError, "^sinks"),
        (dict(k_descale=np.ones((2, 2))), ValueError, "k_descale and v_descale"),
        (
            dict(k_descale=np.ones((2, 3)), v_descale=np.ones((2, 2))),
            ValueError,
            r"^k_descale must be \(B, H_kv\)",
        ),
        (
            dict(k_descale=np.ones((2, 2)), v_descale=-np.ones((2, 2))),
            ValueError,
            "^v_descale must be finite and > 0",
        ),
    ]
    for change, err, match in cases:
        with pytest.raises(err, match=match):
            decode.attention_with_kvcache(q, k, k, lens, **change)
    k_real = np.full((2, 5, 2, 8), 0.3)  # 0.3 is not an e4m3 value
    with pytest.raises(ValueError, match="^k_descale is given but k_cache is not"):
        decode.attention_with_kvcache(
            q, k_real, k, lens, k_descale=np.ones((2, 2)), v_descale=np.ones((2, 2))
        )
    kv = np.zeros((2, 5, 1, 24))
    with pytest.raises(ValueError, match="^kv_cache must be"):
        decode.mla_with_kvcache(np.zeros((2, 1, 4, 24)), k, lens)
    with pytest.raises(ValueError, match="^head_dim_v=32 exceeds"):
        decode.mla_with_kvcache(np.zeros((2, 1, 4, 24)), kv, lens, head_dim_v=32)
    with pytest.raises(ValueError, match="^q and kv_cache must share"):
        decode.mla_with_kvcache(np.zeros((2, 1, 4, 20)), kv, lens, head_dim_v=16)
    with pytest.raises(TypeError, match="^scale"):
        decode.mla_with_kvcache(
            np.zeros((2, 1, 4, 24)), kv, lens, head_dim_v=16, scale="x"
        )
