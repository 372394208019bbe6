"""Timing of the decode kernel: ``benchmarks/suite_decode.py`` and chapter 5's timing
cell both measure through ``time_decode``.

At each batch B and context length L (every sequence holds L keys, the new token
included; N_q = 1, causal), with H_q query heads over H_kv KV heads (GQA) and head dim
d, one paged cache (pages of ``page_size`` tokens, the block table a random
permutation of the pages) is filled once, and for SDPA and the flash kernel a
contiguous (B, L, H_kv, d) copy of it. Timed, op "decode", mode "fwd":

* impl "triton": ``kernels.decode`` on the paged cache (``api.prepare``: validated once,
  the launches alone timed, num_splits from the heuristic);
* impl "naive": PyTorch gathering the pages into a contiguous copy, then the scores
  q k^T materialised, softmax, P V (GQA by reshaping q, no copy of K/V per head);
* impl "sdpa": ``torch.nn.functional.scaled_dot_product_attention`` on the contiguous
  cache (``enable_gqa=True``; PyTorch picks the backend);
* impl "flash": the book's FlashAttention-2 forward (``kernels.flash``) with N_q = 1 on
  the contiguous cache: one program per (sequence, query head), the starved grid.

``bytes`` in each record's shape is the traffic a decode step cannot avoid: the K/V
cache bytes of the B x L keys read once, plus q and o. GB/s = bytes / time for every
impl (an implementation that reads the cache more than once still gets credit for
one read), and ``percent_of_peak`` relates it to the GPU's published HBM bandwidth
(``attention.memory.roofline.GPUS``) where the GPU is known. A case whose tensors
would not fit ``mem_budget`` bytes is recorded with error "unsupported" and the reason
in ``detail``, never silently dropped.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable

import torch

from .. import runtime
from ..decode import api
from ..flash import flash_attention
from .bench import measure, torch_dtype
from .records import Record

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


def _footprints(B, L, h_q, h_kv, d, page, elem) -> dict[str, int]:
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


def time_decode(
    batches: Iterable[int],
    contexts: Iterable[int],
    *,
    h_q: int = 32,
    h_kv: int = 8,
    d: int = 128,
    page_size: int = 256,
    dtype="float16",
    impls: Iterable[str] = IMPLS,
    mem_budget: float | None = None,
    suite: str = "live",
    stage: str | None = None,
    device=None,
    seed: int = 0,
    timer: Callable[..., dict] | None = None,
    deadline: float | None = None,
    log: Callable[[Record], None] | None = None,
    **timing,
) -> list[Record]:
    """Time each impl at every (B, L): one Record each (shape: B, L, H_q, H_kv, d,
    N_q, page_size, num_splits (triton), bytes). ``mem_budget``: bytes the tensors of
    one case may take (default: 80% of the GPU's free memory; unbounded on a CPU).
    Past ``deadline`` (``time.monotonic()``) no new case starts."""
    dt, dt_name = torch_dtype(dtype)
    device = runtime.DEVICE if device is None else device
    impls = tuple(impls)
    elem = torch.empty(0, dtype=dt).element_size()
    if mem_budget is None and device.type == "cuda":
        mem_budget = 0.8 * torch.cuda.mem_get_info(device)[0]
    records: list[Record] = []
    for B in batches:
        for L in contexts:
            if deadline is not None and time.monotonic() > deadline:
                return records
            nbytes = decode_bytes(B, L, h_q, h_kv, d, 1, elem)
            shape = {
                "B": B,
                "L": L,
                "H_q": h_q,
                "H_kv": h_kv,
                "d": d,
                "N_q": 1,
                "page_size": page_size,
                "causal": True,
                "bytes": nbytes,
            }
            foot = _footprints(B, L, h_q, h_kv, d, page_size, elem)
            if mem_budget is not None and foot["cache"] > mem_budget:
                for impl in impls:
                    records.append(
                        Record(
                            suite,
                            "decode",
                            impl,
                            "fwd",
                            dt_name,
                            dict(shape),
                            error="unsupported",
                            stage=stage,
                            detail=f"skipped: the cache needs "
                            f"{foot['cache'] / 1e9:.1f} GB,"
                            f" the budget is {mem_budget / 1e9:.1f} GB",
                        )
                    )
                continue
            tensors = make_paged_cache(B, L, h_q, h_kv, d, page_size, dt, device, seed)
            contiguous = ()
            if {"sdpa", "flash"} & set(impls) and (
                mem_budget is None or foot["cache"] + foot["flash"] <= mem_budget
            ):
                contiguous = contiguous_cache(*tensors[1:3], tensors[4], L)
            cases = dict(decode_cases(*tensors, *contiguous, impls=impls))
            for impl in impls:
                fn = cases.get(impl)
                if deadline is not None and time.monotonic() > deadline:
                    return records
                sh = dict(shape)
                if impl == "triton":
                    sh["num_splits"] = fn.splits
                rec = Record(suite, "decode", impl, "fwd", dt_name, sh, stage=stage)
                need = foot["cache"] + foot[impl]
                if fn is None or mem_budget is not None and need > mem_budget:
                    rec.error = "unsupported"
                    rec.detail = (
                        f"skipped: needs {need / 1e9:.1f} GB with the cache, "
                        f"the budget is {mem_budget / 1e9:.1f} GB"
                    )
                    records.append(rec)
                    continue
                try:
                    with torch.no_grad():
                        measure(rec, fn, bytes_moved=nbytes, timer=timer, **timing)
                except RuntimeError as e:  # an SDPA backend refusing GQA, ...
                    rec.error = "unsupported"
                    rec.detail = " ".join(str(e).split())[:600]
                records.append(rec)
                if log is not None:
                    log(rec)
            tensors = contiguous = cases = fn = None
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return records


def decode_summary(records: Iterable, gpu_name: str | None) -> list[dict]:
    """Per (B, L): each impl's ms and GB/s, the triton kernel's percent of peak HBM
    bandwidth, and its speed-up over naive, SDPA and the flash kernel (their time /
    its time), from measured records only."""
    groups: dict = {}
    for r in records:
        r = r.to_dict() if isinstance(r, Record) else r
        if r.get("op") != "decode":
            continue
        sh = r["shape"]
        groups.setdefault((r["dtype"], sh["B"], sh["L"]), {})[r["impl"]] = r
    rows = []
    for (dtype, B, L), g in groups.items():
        ms = {i: r["ms"] for i, r in g.items() if r.get("ms")}
        tri = g.get("triton", {})
        row = {
            "dtype": dtype,
            "B": B,
            "L": L,
            "ms": ms,
            "gbps": {i: r["gbps"] for i, r in g.items() if r.get("gbps")},
            "triton_percent_of_peak": percent_of_peak(tri.get("gbps"), gpu_name),
            "skipped": {i: r.get("detail") for i, r in g.items() if r.get("error")},
        }
        for other in ("naive", "sdpa", "flash"):
            row[f"vs_{other}"] = (
                ms[other] / ms["triton"] if "triton" in ms and other in ms else None
            )
        rows.append(row)
    return rows
