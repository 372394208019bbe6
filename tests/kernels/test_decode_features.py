"""kernels.decode: flash-attn's keywords (window_size, softcap, alibi_slopes, sinks)
and the fp8 e4m3 cache with descales, against an independent fp64 reference and the
NumPy twin (attention.decode). Small shapes under the Triton interpreter.

The reference scores in float64: s = scale q.k (K = cache * k_descale for fp8), capped
c tanh(s / c), minus slope |i - j|, hidden outside i - left <= j <= i + right (right =
0 under causal) and past the length; a sink adds exp(sink) to the denominator (lse
includes it; a row with no key gets 0 and lse = sink, the twin's rule); out = P V
(V = cache * v_descale). Tolerance: test_decode's bound with the score error e_s
grown by the transforms' fp32 rounding (the tanh is relative to a few ulps at every
cap: 4 u32 of the largest capped |score|; the bias and the base-2 conversion: 4 u32 of
the largest |score|) and the descales' rounding (u32 relative each).
"""

import math

import numpy as np
import pytest
import torch

from kernels import runtime
from kernels.decode import api, attention_with_kvcache
from tests.kernels.test_decode import U32, U, add_bound, buffers, compare, make_cache

pytestmark = pytest.mark.xdist_group("decode")

DEVICE = runtime.DEVICE
FP8 = torch.float8_e4m3fn


def gather(k, lens, bt):
    """Each sequence's keys (L, H_kv, d) in fp64 on the CPU, through the table."""
    out = []
    for b, n in enumerate(lens.tolist()):
        if bt is None:
            out.append(k[b, :n].double().cpu())
        else:
            pages = bt[b, : -(-n // k.shape[1])].long().cpu()
            out.append(k.cpu()[pages].double().reshape(-1, *k.shape[2:])[:n])
    return out


def reference(q, ks, vs, lens, causal, window, cap, slopes, sinks, u, scale=None):
    """fp64 out (B, N_q, H_q, d_v), lse (B, H_q, N_q) and the module's tolerances;
    ks, vs: per-sequence (L, H_kv, d) fp64 keys and values (already descaled)."""
    B, n_q, h_q, d = q.shape
    d_v = vs[0].shape[-1]
    scale = 1 / math.sqrt(d) if scale is None else scale
    left, right = window
    right = 0 if causal else right
    out, lse, o_tol, l_tol = buffers(B, n_q, h_q, d_v)
    for b in range(B):
        L = int(lens[b])
        sink = None if sinks is None else sinks.double().cpu()[:, None]  # (H_q, 1)
        if L == 0:
            if sink is not None:
                lse[b] = sink
            continue
        G = h_q // ks[b].shape[1]
        kk = ks[b].repeat_interleave(G, 1)  # (L, H_q, d)
        vv = vs[b].repeat_interleave(G, 1)
        qb = q[b].double().cpu()
        s = torch.einsum("thd,jhd->htj", qb, kk) * scale  # (H_q, N_q, L)
        e_s = (
            abs(scale)
            * (d + 2)
            * U32
            * torch.einsum("thd,jhd->htj", qb.abs(), kk.abs()).amax(-1)
        )
        if cap > 0:
            s = cap * torch.tanh(s / cap)
            e_s = e_s + 4 * U32 * s.abs().amax(-1)
        i = torch.arange(L - n_q, L)[:, None]
        j = torch.arange(L)[None, :]
        if slopes is not None:
            sl = slopes.double().cpu().expand(B, h_q)[b][:, None, None]
            s = s - sl * (i - j).abs()
        seen = torch.ones(n_q, L, dtype=torch.bool)
        if left >= 0:
            seen &= j >= i - left
        if right >= 0:
            seen &= j <= i + right
        s = s.masked_fill(~seen, -math.inf)
        e_s = e_s + 4 * U32 * s.masked_fill(~seen, 0).abs().amax(-1)
        if sink is not None:
            s = torch.cat([s, sink[:, :, None].expand(h_q, n_q, 1)], -1)
            vv = torch.cat([vv, torch.zeros(1, h_q, d_v, dtype=torch.float64)])
        lse[b] = torch.logsumexp(s, -1)
        p = torch.softmax(s, -1).nan_to_num(0.0)  # a row with no key at all: 0
        out[b] = torch.einsum("htj,jhd->thd", p, vv)
        add_bound(o_tol, l_tol, b, out, lse, p, vv, e_s, seen, u, terms=10)
    return out, lse, o_tol, l_tol


# (lens, N_q, H_q, H_kv, d, page (0: contiguous), dtype, causal, splits, window,
#  softcap, alibi ("h": (H_q,), "bh": (B, H_q)), sinks); lengths 0 and short among them
CASES = {
    "window-causal-gqa-paged": (
        [70, 0, 23, 5],
        3,
        8,
        2,
        32,
        16,
        torch.float16,
        True,
        0,
        (20, -1),
        0,
        None,
        0,
    ),
    "window-two-sided-contig": (
        [50, 17],
        4,
        4,
        4,
        64,
        0,
        torch.float16,
        False,
        3,
        (7, 2),
        0,
        None,
        0,
    ),
    "window-diagonal-only": (
        [33, 16],
        2,
        2,
        1,
        16,
        16,
        torch.float16,
        False,
        2,
        (0, 0),
        0,
        None,
        0,
    ),
    "window-wider-than-cache": (
        [40, 9],
        2,
        2,
        2,
        32,
        32,
        torch.bfloat16,
        True,
        2,
        (500, 7),
        0,
        None,
        0,
    ),
    "softcap-alibi-sinks-paged": (
        [40, 0, 19],
        2,
        4,
        1,
        32,
        32,
        torch.float16,
        True,
        2,
        (-1, -1),
        1.5,
        "bh",
        1,
    ),
    "all-under-window-contig": (
        [45, 30],
        5,
        4,
        2,
        32,
        0,
        torch.bfloat16,
        True,
        2,
        (9, -1),
        20.0,
        "h",
        1,
    ),
}


def _keywords(case, B, h_q, g):
    *_, window, cap, alibi, sinks = case
    slopes = None
    if alibi:
        shape = (h_q,) if alibi == "h" else (B, h_q)
        slopes = torch.rand(shape, generator=g).to(DEVICE)
    sink = torch.randn(h_q, generator=g).to(DEVICE) if sinks else None
    return dict(window_size=window, softcap=cap, alibi_slopes=slopes, sinks=sink)


def _cache(lens, n_q, h_q, h_kv, d, page, dtype, seed):
    q, k, v, sl, bt = make_cache(lens, n_q, h_q, h_kv, d, page or 16, dtype, seed)
    if page:
        return q, k, v, sl, bt
    ks, vs = gather(k, sl, bt), gather(v, sl, bt)
    kc = torch.full((len(lens), max(lens) + 3, h_kv, d), float("nan"))
    vc = torch.full_like(kc, float("nan"))  # stale slots past each length: NaN
    for b, n in enumerate(lens):
        kc[b, :n], vc[b, :n] = ks[b], vs[b]
    return q, kc.to(DEVICE, dtype), vc.to(DEVICE, dtype), sl, None


@pytest.mark.parametrize("name", list(CASES))
def test_keywords_match_fp64(name):
    case = CASES[name]
    lens, n_q, h_q, h_kv, d, page, dtype, causal, splits = case[:9]
    g = torch.Generator().manual_seed(len(name))
    q, k, v, sl, bt = _cache(lens, n_q, h_q, h_kv, d, page, dtype, len(name))
    kw = _keywords(case, len(lens), h_q, g)
    got = attention_with_kvcache(
        q, k, v, sl, bt, causal, None, splits, True, **kw
    )  # fmt: skip
    ks, vs = gather(k, sl, bt), gather(v, sl, bt)
    want = reference(
        q, ks, vs, sl, causal, kw["window_size"], kw["softcap"], kw["alibi_slopes"],
        kw["sinks"], U[dtype],
    )  # fmt: skip
    compare(got, want)
    for b in [b for b, n in enumerate(lens) if n == 0]:  # an empty slot
        assert (got[0][b] == 0).all()
        sink = kw["sinks"]
        if sink is None:  # -inf, never NaN
            assert (got[1][b] == -math.inf).all()
        else:  # the sink's own lse (through base 2: a few ulp)
            want_l = sink[:, None].expand(h_q, n_q)
            assert ((got[1][b] - want_l).abs() <= 4 * U32 * want_l.abs()).all()


def fp8_cache(k, lens, bt, seed):
    """(cache / descale) in e4m3 with a descale per (sequence, KV head): each
    sequence's amax / 448 (times a random factor in [1, 2): not all values reach the
    top), and the fp64 keys the cache stands for (cache * descale)."""
    g = torch.Generator().manual_seed(seed)
    B, h_kv = len(lens), k.shape[2]
    ks = gather(k, lens, bt)
    amax = torch.stack(
        [x.abs().amax(dim=(0, 2)) if len(x) else torch.ones(h_kv) for x in ks]
    )
    desc = (amax / 448 * (1 + torch.rand(B, h_kv, generator=g))).float()
    k8 = torch.empty(k.shape, dtype=FP8)
    kk = k.cpu().float()
    for b in range(B):  # a page holds one sequence's keys: its descale applies
        if bt is None:
            k8[b] = (kk[b] / desc[b][None, :, None]).to(FP8)
        else:
            for p in bt[b, : -(-int(lens[b]) // k.shape[1])].long().cpu():
                k8[p] = (kk[p] / desc[b][None, :, None]).to(FP8)
    return k8.to(DEVICE), desc.to(DEVICE)


@pytest.mark.parametrize(
    "page, dtype, kw",
    [
        (16, torch.float16, {}),
        (0, torch.bfloat16, {"window_size": (12, -1), "sinks": "yes"}),
    ],
    ids=["paged-fp16", "contig-bf16-window-sinks"],
)
def test_fp8_cache_matches_fp64_and_the_twin(page, dtype, kw, monkeypatch):
    from attention import decode as npd

    lens, n_q, h_q, h_kv, d = [53, 0, 20], 2, 4, 2, 32
    q, k, v, sl, bt = _cache(lens, n_q, h_q, h_kv, d, page, dtype, 11)
    k8, kd = fp8_cache(k, sl, bt, 1)
    v8, vd = fp8_cache(v, sl, bt, 2)
    kw = dict(kw)
    if "sinks" in kw:
        kw["sinks"] = torch.randn(h_q, generator=torch.Generator().manual_seed(3))
    got = attention_with_kvcache(
        q, k8, v8, sl, bt, num_splits=2, return_lse=True, k_descale=kd,
        v_descale=vd, **kw,
    )  # fmt: skip
    assert got[0].dtype == dtype
    ks = [x * kd[b].double().cpu()[:, None] for b, x in enumerate(gather(k8, sl, bt))]
    vs = [x * vd[b].double().cpu()[:, None] for b, x in enumerate(gather(v8, sl, bt))]
    window = kw.get("window_size", (-1, -1))
    compare(
        got, reference(q, ks, vs, sl, True, window, 0, None, kw.get("sinks"), U[dtype])
    )
    # the twin reads the same e4m3 bytes (on its round_e4m3 grid) and descales
    np_kw = {a: (b.numpy() if torch.is_tensor(b) else b) for a, b in kw.items()}
    table = None if bt is None else bt.cpu().numpy()
    want_o, want_l = npd.attention_with_kvcache(
        q.double().cpu().numpy(), k8.cpu().double().numpy(), v8.cpu().double().numpy(),
        sl.cpu().numpy(), table, return_lse=True, k_descale=kd.double().cpu().numpy(),
        v_descale=vd.double().cpu().numpy(), **np_kw,
    )  # fmt: skip
    tol = 4 * U[dtype] * (1 + np.abs(want_o))
    assert (np.abs(got[0].double().cpu().numpy() - want_o) <= tol).all()
    fin = np.isfinite(want_l)
    assert np.allclose(got[1].cpu().numpy()[fin], want_l[fin], atol=1e-4, rtol=0)
    # the byte decode and the native conversion agree bit for bit on finite bytes
    native = api.fp8_native
    monkeypatch.setattr(api, "fp8_native", lambda cap: not native(cap))
    again = attention_with_kvcache(
        q, k8, v8, sl, bt, num_splits=2, return_lse=True, k_descale=kd,
        v_descale=vd, **kw,
    )  # fmt: skip
    assert torch.equal(again[0], got[0]) and torch.equal(again[1], got[1])


def test_fp8_byte_decode_is_exact_for_every_value(monkeypatch):
    """All 256 e4m3fn bytes as the values of 256 keys, each seen by one query alone
    (N_q = 256, window (0, 0)): query t's output is value t exactly (NaN for the two
    NaN bytes, in their rows only), through the native conversion and the byte
    decode (GPU)."""
    L = 256
    codes = torch.arange(L, dtype=torch.uint8).view(FP8)  # every byte
    v8 = codes.reshape(1, L, 1, 1).expand(1, L, 1, 16).contiguous()
    k8 = torch.zeros(1, L, 1, 16, dtype=FP8)
    q = torch.zeros(1, L, 1, 16, dtype=torch.float16)
    one = torch.ones(1, 1, device=DEVICE)
    args = [x.to(DEVICE) for x in (q, k8, v8, torch.tensor([L], dtype=torch.int32))]
    want = codes.float()
    nan = torch.isnan(want)
    # (the interpreter's own fp8 conversion reads the NaN bytes as +-480: the call
    # decodes the bytes there; the native path is checked on a GPU)
    for native in (False,) + ((True,) if DEVICE.type == "cuda" else ()):
        monkeypatch.setattr(api, "fp8_native", lambda cap, n=native: n)
        o = attention_with_kvcache(
            *args, causal=False, window_size=(0, 0), k_descale=one, v_descale=one
        )
        got = o[0, :, 0].float().cpu()  # (N_q, d)
        assert torch.equal(torch.isnan(got), nan[:, None].expand(L, 16))
        assert torch.equal(got[~nan], want[~nan][:, None].expand(-1, 16))
