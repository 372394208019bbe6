"""Suite "decode": the split-KV decode kernel (kernels.decode) on a CUDA GPU.

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
``kernels.timing.decode.decode_summary``, the percent of the GPU's peak HBM bandwidth.
The timing is ``kernels.timing.decode.time_decode``, chapter 5's path too. Goals of the
issue (checked against the records, never assumed): >= 80% of peak HBM bandwidth on
an H200 at context >= 8k and batch >= 8; >= 3x the naive version; faster than SDPA at
B = 1, context >= 8k. Sized for about 1.5 minutes on an H200 (a budget: no GPU run of
this suite is recorded yet); ``run`` stops at its deadline.
"""

from __future__ import annotations

import torch

from kernels import runtime
from kernels.decode import attention_with_kvcache
from kernels.timing.decode import (
    decode_summary,
    naive_decode,
    reference_decode,
    time_decode,
)
from kernels.timing.records import Record

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
