"""What the decode timing builds and checks against: the paged cache
(``make_paged_cache``), the naive and fp64 references, the bytes a decode step must
read (``decode_bytes``, ``percent_of_peak``), and the new paths' goals (issue 29),
which ``kernels.decode.timing`` times through ``time_paths``.

Goals (op, impls; every case one Record of stage "goal", mode "fwd", N_q = 1):

* "decode-fp8": the same paged cache in bf16 ("triton-bf16") and in float8_e4m3fn with
  descales ("triton-fp8"), bf16 q, at context 32k: the fp8 cache moves half the bytes
  (goal: >= 1.7x the bf16 cache's speed);
* "decode-mla": ``mla_with_kvcache`` (DeepSeek-V3's latent row, 576 = 512 + 64, 128
  query heads, 64-token pages, bf16) at B >= 16, context >= 8k; GB/s counts the
  latent rows once (goal: >= 80% of peak HBM bandwidth);
* "decode-window": a 4k sliding window ("triton-window") against the full context
  ("triton-full") at 128k (goal: >= 10x: the window reads 4k of the 128k keys).

``bytes`` in a record's shape is the traffic its step cannot avoid (the keys it must
read once, at the cache's element size, plus q and o); ``paths_summary`` turns the
records into the goals' ratios and percent of peak, from measured records only.
``reference_paths`` / ``reference_mla`` are fp64 references (per-sequence gathers,
torch) of the keywords and of MLA for the suite's correctness check.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import torch

from kernels import runtime
from kernels.decode import api
from kernels.flash import flash_attention
from kernels.timing.bench import measure
from kernels.timing.records import Record

IMPLS = ("triton", "naive", "sdpa", "flash")


def make_paged_cache(
    B: int,
    L: int,
    h_q: int,
    h_kv: int,
    d: int,
    page_size: int,
    dtype=torch.float16,
    device=None,
    seed: int = 0,
):
    """q (B, 1, H_q, d) and paged k, v (B * pages, page_size, H_kv, d), standard
    normal, cache_seqlens = L and a block table that is a random permutation of the
    pages (as an allocator serving many requests leaves them)."""
    device = runtime.DEVICE if device is None else device
    g = torch.Generator(device=device).manual_seed(seed)
    pages = -(-L // page_size)
    k = torch.randn(
        B * pages, page_size, h_kv, d, generator=g, device=device, dtype=dtype
    )
    v = torch.randn(
        B * pages, page_size, h_kv, d, generator=g, device=device, dtype=dtype
    )
    q = torch.randn(B, 1, h_q, d, generator=g, device=device, dtype=dtype)
    perm = torch.randperm(B * pages, generator=g, device=device)
    bt = perm.reshape(B, pages).to(torch.int32)
    lens = torch.full((B,), L, dtype=torch.int32, device=device)
    return q, k, v, lens, bt


def contiguous_cache(k, v, bt, L: int):
    """The same keys and values in a contiguous (B, L, H_kv, d) cache (a gathered
    copy), returned as (B, H_kv, L, d) views of it."""
    B, h_kv, d = bt.shape[0], k.shape[2], k.shape[3]
    kc = k[bt.long()].reshape(B, -1, h_kv, d)[:, :L].transpose(1, 2)
    vc = v[bt.long()].reshape(B, -1, h_kv, d)[:, :L].transpose(1, 2)
    return kc, vc


def naive_decode(q, k, v, lens, bt, causal=True):
    """Gather each sequence's pages into a contiguous (B, L, H_kv, d) copy, materialise
    the scores (B, H_kv, G x N_q, L), softmax, P V (all sequences of one length L =
    lens[0], the benchmark's case)."""
    B, n_q, h_q, d = q.shape
    h_kv = k.shape[2]
    G = h_q // h_kv
    L = int(lens[0])
    kk, vv = contiguous_cache(k, v, bt, L)  # (B, H_kv, L, d) each
    qq = q.reshape(B, n_q, h_kv, G, d).permute(0, 2, 3, 1, 4).reshape(B, h_kv, -1, d)
    s = (qq @ kk.transpose(-1, -2)).float() / math.sqrt(d)  # (B, H_kv, G N_q, L)
    if causal and n_q > 1:
        t = torch.arange(n_q, device=q.device).repeat(G)
        s = s.masked_fill(
            torch.arange(L, device=q.device) > (L - n_q + t)[:, None], float("-inf")
        )
    o = torch.softmax(s, -1).to(q.dtype) @ vv  # (B, H_kv, G N_q, d)
    return o.reshape(B, h_kv, G, n_q, d).permute(0, 3, 1, 2, 4).reshape(B, n_q, h_q, d)


def reference_decode(q, k, v, lens, bt, causal=True):
    """fp64 out (B, N_q, H_q, d) through a per-sequence gather (any lengths)."""
    B, n_q, h_q, d = q.shape
    h_kv, page = k.shape[2], k.shape[1]
    G = h_q // h_kv
    out = torch.zeros(B, n_q, h_q, d, dtype=torch.float64, device=q.device)
    for b in range(B):
        L = int(lens[b])
        if L == 0:
            continue
        pages = bt[b, : -(-L // page)].long()
        kk = k[pages].reshape(-1, h_kv, d)[:L].double().repeat_interleave(G, 1)
        vv = v[pages].reshape(-1, h_kv, d)[:L].double().repeat_interleave(G, 1)
        s = torch.einsum("thd,jhd->htj", q[b].double(), kk) / math.sqrt(d)
        if causal:
            pos = L - n_q + torch.arange(n_q, device=q.device)
            s = s.masked_fill(
                torch.arange(L, device=q.device)[None, None, :] > pos[None, :, None],
                float("-inf"),
            )
        out[b] = torch.einsum("htj,jhd->thd", torch.softmax(s, -1), vv)
    return out


def decode_bytes(
    B: int, L: int, h_q: int, h_kv: int, d: int, n_q: int, elem: int
) -> int:
    """The unavoidable HBM traffic of one decode step: K and V of B x L keys once, q
    and o."""
    return 2 * B * L * h_kv * d * elem + 2 * B * n_q * h_q * d * elem


def peak_hbm_tbps(gpu_name: str | None) -> float | None:
    """The published HBM bandwidth (TB/s) of a GPU the book's roofline knows, by name
    (``attention.memory.roofline.GPUS``), or None."""
    from attention.memory.roofline import GPUS

    if not gpu_name:
        return None
    name = gpu_name.upper()
    for key, spec in GPUS.items():
        if key in name:
            return spec.hbm_tbps
    return None


def percent_of_peak(gbps: float | None, gpu_name: str | None) -> float | None:
    peak = peak_hbm_tbps(gpu_name)
    if gbps is None or peak is None:
        return None
    return 100.0 * gbps / (peak * 1e3)


def footprints(B, L, h_q, h_kv, d, page, elem) -> dict[str, int]:
    """Bytes each impl needs beyond the paged cache (itself under "cache")."""
    Lp = -(-L // page) * page
    cache = 2 * B * Lp * h_kv * d * elem
    scores = B * h_q * L * (4 + 4 + elem)  # fp32 scores, softmax, cast
    contiguous = 2 * B * L * h_kv * d * elem
    return {
        "cache": cache,
        "triton": 0,
        "naive": cache + scores,
        "sdpa": contiguous + scores,
        "flash": contiguous,
    }


def decode_cases(q, k, v, lens, bt, kc=None, vc=None, impls=IMPLS):
    """(impl, fn) for one cache, in timing order; "sdpa" and "flash" need the
    contiguous (B, H_kv, L, d) copies kc, vc."""
    import torch.nn.functional as F

    h_q, h_kv = q.shape[2], k.shape[2]
    out = []
    if "triton" in impls:
        out.append(("triton", api.prepare(q, k, v, lens, bt)))
    if "naive" in impls:
        out.append(("naive", lambda: naive_decode(q, k, v, lens, bt)))
    qh = q.transpose(1, 2)  # (B, H_q, 1, d)
    if "sdpa" in impls:
        out.append(
            (
                "sdpa",
                lambda: F.scaled_dot_product_attention(
                    qh, kc, vc, enable_gqa=h_q != h_kv
                ),
            )
        )
    if "flash" in impls:
        out.append(("flash", lambda: flash_attention(qh, kc, vc, causal=True)))
    return out


FP8 = torch.float8_e4m3fn
#: The goals' layers: Llama-3-8B-like GQA for fp8 and the window; DeepSeek-V3's MLA.
LAYER = {"h_q": 32, "h_kv": 8, "d": 128, "page_size": 256}
MLA = {"h_q": 128, "d": 576, "dv": 512, "page_size": 64}
GOALS = {"fp8_speedup": 1.7, "mla_percent_of_peak": 80.0, "window_speedup": 10.0}


def reference_paths(
    q, k, v, lens, bt, causal=True, window=(-1, -1), softcap=0.0, alibi=None,
    sinks=None, k_descale=None, v_descale=None,
):  # fmt: skip
    """fp64 out (B, N_q, H_q, d_v) of flash-attn's semantics (kernels.decode's spec
    sheet): K = cache * k_descale, capped scores, ALiBi, the window, the sink."""
    B, n_q, h_q, d = q.shape
    h_kv, page, d_v = k.shape[2], k.shape[1], v.shape[3]
    G = h_q // h_kv
    left, right = window
    right = 0 if causal else right
    out = torch.zeros(B, n_q, h_q, d_v, dtype=torch.float64, device=q.device)
    for b in range(B):
        L = int(lens[b])
        if L == 0:
            continue
        if bt is None:
            kk, vv = k[b, :L].double(), v[b, :L].double()
        else:
            pages = bt[b, : -(-L // page)].long()
            kk = k[pages].double().reshape(-1, h_kv, d)[:L]
            vv = v[pages].double().reshape(-1, h_kv, d_v)[:L]
        if k_descale is not None:
            kk = kk * k_descale[b].double()[:, None]
            vv = vv * v_descale[b].double()[:, None]
        kk, vv = kk.repeat_interleave(G, 1), vv.repeat_interleave(G, 1)
        s = torch.einsum("thd,jhd->htj", q[b].double(), kk) / math.sqrt(d)
        if softcap > 0:
            s = softcap * torch.tanh(s / softcap)
        i = (L - n_q + torch.arange(n_q, device=q.device))[:, None]
        j = torch.arange(L, device=q.device)[None, :]
        if alibi is not None:
            sl = alibi.double().expand(B, h_q)[b]
            s = s - sl[:, None, None] * (i - j).abs()
        seen = torch.ones(n_q, L, dtype=torch.bool, device=q.device)
        if left >= 0:
            seen &= j >= i - left
        if right >= 0:
            seen &= j <= i + right
        s = s.masked_fill(~seen, -math.inf)
        if sinks is not None:
            sk = sinks.double()[:, None, None].expand(h_q, n_q, 1)
            p = torch.softmax(torch.cat([s, sk], -1), -1)[..., :L]
        else:
            p = torch.softmax(s, -1)
        out[b] = torch.einsum("htj,jhd->thd", p.nan_to_num(0.0), vv)
    return out


def reference_mla(q, kv, lens, bt, dv, causal=True):
    """fp64 MLA decode: the latent rows as keys, their first ``dv`` columns values."""
    return reference_paths(q, kv, kv[..., :dv], lens, bt, causal)


def quantize_pages(k, bt, lens):
    """An e4m3 copy of a paged cache with a descale per (sequence, KV head): amax /
    448 over the sequence's keys (FlashAttention-3's per-head descale). Returns (k8,
    descale (B, H_kv) float32)."""
    B, h_kv = bt.shape[0], k.shape[2]
    desc = torch.ones(B, h_kv, dtype=torch.float32, device=k.device)
    k8 = torch.zeros(k.shape, dtype=FP8, device=k.device)
    for b in range(B):
        n = int(lens[b])
        pages = bt[b, : -(-n // k.shape[1])].long()
        if n == 0:
            continue
        amax = k[pages].float().abs().amax(dim=(0, 1, 3))
        desc[b] = torch.where(amax > 0, amax / 448.0, 1.0)
        k8[pages] = (k[pages].float() / desc[b][None, None, :, None]).to(FP8)
    return k8, desc


def _shape(**kw) -> dict:
    return {"N_q": 1, "causal": True, **kw}


def goal_cases(dry: bool):
    """(op, impl, shape, build) of each goal; build() returns (fn, bytes)."""
    if dry:
        B, L, lay, win = 2, 96, {"h_q": 4, "h_kv": 2, "d": 16, "page_size": 16}, 16
        mla_b, mla_l, mla = 2, 64, {"h_q": 4, "d": 48, "dv": 32, "page_size": 16}
        long_l = 160
    else:
        B, L, lay, win = 8, 32768, LAYER, 4096
        mla_b, mla_l, mla, long_l = 32, 8192, MLA, 131072
    h_q, h_kv, d, page = lay["h_q"], lay["h_kv"], lay["d"], lay["page_size"]
    io = 2 * h_q * d * 2  # q and o of one sequence, bf16

    def fp8_case(quantised):
        def build():
            q, k, v, lens, bt = make_paged_cache(
                B, L, h_q, h_kv, d, page, torch.bfloat16
            )
            elem = 2
            kw = {}
            if quantised:
                (k, kd), (v, vd) = (
                    quantize_pages(k, bt, lens),
                    quantize_pages(v, bt, lens),
                )
                kw, elem = {"k_descale": kd, "v_descale": vd}, 1
            fn = api.prepare(q, k, v, lens, bt, **kw)
            return fn, 2 * B * L * h_kv * d * elem + B * io

        return build

    def window_case(window):
        def build():
            q, k, v, lens, bt = make_paged_cache(
                1, long_l, h_q, h_kv, d, page, torch.bfloat16
            )
            fn = api.prepare(q, k, v, lens, bt, window_size=(window, -1))
            keys = long_l if window < 0 else min(long_l, window + 1)
            return fn, 2 * keys * h_kv * d * 2 + io

        return build

    def mla_case():
        mq, D, dv, mp = mla["h_q"], mla["d"], mla["dv"], mla["page_size"]
        q, kv, _, lens, bt = make_paged_cache(
            mla_b, mla_l, mq, 1, D, mp, torch.bfloat16
        )
        fn = api.prepare_mla(q, kv, lens, bt, dv)
        return fn, mla_b * mla_l * D * 2 + mla_b * mq * (D + dv) * 2

    lay_shape = dict(H_q=h_q, H_kv=h_kv, d=d, page_size=page)
    return [
        ("decode-fp8", "triton-bf16", _shape(B=B, L=L, **lay_shape), fp8_case(False)),
        ("decode-fp8", "triton-fp8", _shape(B=B, L=L, **lay_shape), fp8_case(True)),
        ("decode-mla", "triton", _shape(B=mla_b, L=mla_l, H_q=mla["h_q"], H_kv=1,
         d=mla["d"], d_v=mla["dv"], page_size=mla["page_size"]), mla_case),
        ("decode-window", "triton-full", _shape(B=1, L=long_l, window=-1,
         **lay_shape), window_case(-1)),
        ("decode-window", "triton-window", _shape(B=1, L=long_l, window=win,
         **lay_shape), window_case(win)),
    ]  # fmt: skip


def mla_runs() -> bool:
    """Whether this device runs ``mla_with_kvcache`` (not on sm_75)."""
    from kernels.decode import tiles

    if runtime.INTERPRET or runtime.DEVICE.type != "cuda":
        return True
    return tiles.mla_supported(torch.cuda.get_device_capability())


def time_paths(
    dry: bool = False,
    suite: str = "decode",
    timer: Callable[..., dict] | None = None,
    deadline: float | None = None,
    log: Callable[[Record], None] | None = None,
    **timing,
) -> list[Record]:
    """One "goal" Record per case of ``goal_cases``; past ``deadline`` none starts."""
    records = []
    for op, impl, shape, build in goal_cases(dry):
        if deadline is not None and time.monotonic() > deadline:
            break
        rec = Record(suite, op, impl, "fwd", "bfloat16", dict(shape), stage="goal")
        if op == "decode-mla" and not mla_runs():
            rec.error, rec.detail = "unsupported", "mla_with_kvcache needs sm_80+"
            records.append(rec)
            continue
        try:
            fn, nbytes = build()
        except torch.cuda.OutOfMemoryError:
            rec.error, rec.detail = "OOM", "building the cache ran out of memory"
            records.append(rec)
            continue
        rec.shape["bytes"] = nbytes
        rec.shape["num_splits"] = fn.splits
        with torch.no_grad():
            measure(rec, fn, bytes_moved=nbytes, timer=timer, **timing)
        records.append(rec)
        if log is not None:
            log(rec)
        fn = None
        if runtime.DEVICE.type == "cuda":
            torch.cuda.empty_cache()
    return records


def paths_summary(records, gpu_name: str | None) -> dict:
    """The goals from measured records: fp8's speed-up over bf16, MLA's percent of
    peak HBM bandwidth, the window's speed-up over the full context (None where a
    record is missing), each beside its goal."""
    ms, gbps = {}, {}
    for r in records:
        r = r.to_dict() if isinstance(r, Record) else r
        if r.get("ms") and r.get("op", "").startswith("decode-"):
            ms[(r["op"], r["impl"])] = r["ms"]
            gbps[(r["op"], r["impl"])] = r.get("gbps")

    def ratio(op, slow, fast):
        a, b = ms.get((op, slow)), ms.get((op, fast))
        return a / b if a and b else None

    return {
        "fp8_speedup": ratio("decode-fp8", "triton-bf16", "triton-fp8"),
        "mla_gbps": gbps.get(("decode-mla", "triton")),
        "mla_percent_of_peak": percent_of_peak(
            gbps.get(("decode-mla", "triton")), gpu_name
        ),
        "window_speedup": ratio("decode-window", "triton-full", "triton-window"),
        "goals": dict(GOALS),
    }
