"""The hard family's timing: suite "hard" of ``make bench`` (``check``, ``run``) and
``time_hard``, which chapter 3's timing cell and the suite both measure through (the
one timing path, ``kernels.timing.bench``, underneath).

At each head dim d and sequence length N = N_q = N_k, forward only (no autograd graph),
non-causal, it times the book's ``flash_attention`` forward (the yardstick, op "flash"),
``hard_attention`` (op "hard"; with ``sample=True`` op "hard-sample", Gumbel-max in the
kernel) and ``topk_attention`` (op "topk<k>" for each k), all impl "triton", then the
naive PyTorch versions (impl "naive": S materialised in HBM, then argmax or topk and a
gather) where S and its top-k copies fit ``naive_max_bytes``. One ``bench.Record`` per
case; shape ``{"B", "H", "N", "d", "causal", "topk" (top-k only)}``.

The suite, on a CUDA GPU:

``check()`` holds kernels/hard.py against fp64 references on this GPU; ``run()`` times,
in float16, non-causal, B = 2, H = 16, d in {64, 128}, N = N_q = N_k from 1k to 16k:

* op "hard":        triton ``hard_attention`` vs naive (materialise S, argmax, gather)
* op "hard-sample": triton ``hard_attention(sample=True)`` (Gumbel-max in the kernel)
* op "topk16", "topk64": triton ``topk_attention`` vs naive
  (S, torch.topk, softmax, gather)
* op "flash":       the book's ``flash_attention`` forward on the same shape
  (the yardstick)

The timing is ``time_hard``, the path chapter 3's timing cell takes
too. Targets (stated in the chapter, checked against these records, never assumed): hard
>= 1.5x faster than the flash forward and >= 20x faster than naive at N = 8k; top-k (k
<= 64) at most 2x the flash forward's time. Designed for ~1.5 minutes on an H200.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable

import numpy as np
import torch

from kernels import runtime
from kernels.hard import hard_attention, topk_attention
from kernels.naive import naive_topk_attention, reference_attention
from kernels.timing import bench
from kernels.timing.bench import measure, random_qkv, torch_dtype
from kernels.timing.records import Record

#: Naive shapes whose S (and the top-k copies: 3 S-sized tensors) would exceed this
#: are not timed.
NAIVE_MAX_BYTES = 40 * 2**30


def hard_cases(
    q, k, v, topks: Iterable[int] = (16, 64), naive: bool = True
) -> list[tuple[str, str, Callable[[], object], float, dict | None]]:
    """(op, impl, fn, FLOPs, extra shape keys) for one input shape, in timing order.

    FLOPs count S = q k^T (2 B H N_q N_k d) for the selection kernels, twice that for
    the flash forward (S and P V)."""
    from kernels.flash import flash_attention
    from kernels.hard import hard_attention, topk_attention
    from kernels.naive import naive_hard_attention, naive_topk_attention

    b, h, n_q, d = q.shape
    qk = 2.0 * b * h * n_q * k.shape[-2] * d  # FLOPs of S = q k^T
    cases = [
        ("flash", "triton", lambda: flash_attention(q, k, v), 2 * qk, None),
        ("hard", "triton", lambda: hard_attention(q, k, v), qk, None),
        (
            "hard-sample",
            "triton",
            lambda: hard_attention(q, k, v, sample=True, seed=1),
            qk,
            None,
        ),
        *(
            (
                f"topk{t}",
                "triton",
                lambda t=t: topk_attention(q, k, v, t),
                qk,
                {"topk": t},
            )
            for t in topks
        ),
    ]
    if naive:
        cases += [
            ("hard", "naive", lambda: naive_hard_attention(q, k, v), qk, None),
            *(
                (
                    f"topk{t}",
                    "naive",
                    lambda t=t: naive_topk_attention(q, k, v, t),
                    qk,
                    {"topk": t},
                )
                for t in topks
            ),
        ]
    return cases


def time_hard(
    lengths: Iterable[int],
    dims: Iterable[int] = (64,),
    *,
    batch: int = 2,
    heads: int = 16,
    topks: Iterable[int] = (16, 64),
    dtype="float16",
    naive_max_bytes: float = NAIVE_MAX_BYTES,
    suite: str = "live",
    stage: str | None = None,
    device=None,
    seed: int = 0,
    timer: Callable[..., dict] | None = None,
    deadline: float | None = None,
    log: Callable[[Record], None] | None = None,
    progress: bool = False,
    **timing,
) -> list[Record]:
    """Time ``hard_cases`` at each (d in ``dims``, N in ``lengths``): one Record each.

    q, k, v are standard normal (``bench.random_qkv``, ``seed``), (batch, heads, N, d)
    in ``dtype``. ``timer`` defaults to ``bench.time_fn`` (CUDA only; ``timing`` passes
    warmup and rep to it). Past ``deadline`` (``time.monotonic()``) no new case starts.
    ``log(record)`` is called after each case; ``progress`` shows a bar over the
    lengths.
    """
    dt, dt_name = torch_dtype(dtype)
    device = runtime.DEVICE if device is None else device
    topks = tuple(topks)
    records: list[Record] = []
    for d in dims:
        ns = list(lengths)
        if progress:
            from tqdm.auto import tqdm

            ns = tqdm(ns, desc=f"timing, d = {d}")
        for N in ns:
            if deadline is not None and time.monotonic() > deadline:
                return records
            q, k, v = random_qkv(batch, heads, N, d, dtype=dt, device=device, seed=seed)
            s_bytes = batch * heads * N * N * q.element_size()
            for op, impl, fn, flops, extra in hard_cases(
                q, k, v, topks, naive=3 * s_bytes <= naive_max_bytes
            ):
                if deadline is not None and time.monotonic() > deadline:
                    return records
                shape = {
                    "B": batch,
                    "H": heads,
                    "N": N,
                    "d": d,
                    "causal": False,
                    **(extra or {}),
                }
                rec = Record(suite, op, impl, "fwd", dt_name, shape, stage=stage)
                with torch.no_grad():
                    records.append(measure(rec, fn, flops=flops, timer=timer, **timing))
                if log is not None:
                    log(rec)
            q = k = v = None
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    return records


def speedups(
    records: Iterable[dict], lengths: Iterable[int] = (8192, 4096), d: int = 64
) -> tuple[int | None, dict[str, float]]:
    """Chapter 3's target ratios, from measured records (dicts) only, never estimated:
    at the first N of ``lengths`` with any forward time at head dim ``d``, flash time /
    hard time, naive hard time / Triton hard time and, per k, top-k time / flash time.
    Returns ``(N, {name: ratio})``, or ``(None, {})`` where none can be formed."""
    records = list(records)
    for n in lengths:
        ms = {
            (r["op"], r["impl"]): r["ms"]
            for r in records
            if r["shape"].get("N") == n and r["shape"].get("d") == d and r.get("ms")
        }
        flash, hard, out = ms.get(("flash", "triton")), ms.get(("hard", "triton")), {}
        if flash and hard:
            out["hard: flash time / hard time"] = flash / hard
        if hard and ("hard", "naive") in ms:
            out["hard: naive time / Triton time"] = ms[("hard", "naive")] / hard
        for (op, impl), t in ms.items():
            if flash and op.startswith("topk") and impl == "triton":
                out[f"top-{op[4:]}: its time / flash time"] = t / flash
        if out:
            return n, out
    return None, {}


SUITE = "hard"
B, H = 2, 16


def _inputs(N, d, dtype=torch.float16, seed=0, N_k=None, heads=H):
    return bench.random_qkv(
        B, heads, N, d, N_k=N_k, dtype=dtype, device=runtime.DEVICE, seed=seed
    )


def _ref_scores(q, k):
    return (q.double() @ k.double().transpose(-1, -2)) / math.sqrt(q.shape[-1])


def check(dry: bool = False) -> list[dict]:
    """Correctness on this GPU (fp16 and fp32, causal and not, cross lengths); ``dry``:
    the same checks at shapes the Triton interpreter runs at once (fewer sampling draws,
    so a looser total-variation tolerance)."""
    out = []
    n_q, n_k, d, heads, kk = (30, 47, 16, 2, 4) if dry else (300, 517, 64, H, 16)
    for dtype in (torch.float16, torch.float32):
        for causal in (False, True):
            q, k, v = _inputs(n_q, d, dtype, seed=1, N_k=n_k, heads=heads)
            tag = f"{str(dtype)[6:]}{'-causal' if causal else ''}"
            # argmax: indices must match fp64 wherever the top two scores are
            # clearly apart
            o, idx = hard_attention(q, k, v, causal=causal, return_index=True)
            s = _ref_scores(q, k)
            if causal:
                keep = torch.ones(
                    n_q, n_k, dtype=torch.bool, device=runtime.DEVICE
                ).tril(n_k - n_q)
                s = s.masked_fill(~keep, float("-inf"))
            top2 = s.topk(2, dim=-1).values
            clear = (top2[..., 0] - top2[..., 1]) > 1e-2
            wrong = ((idx != s.argmax(-1)) & clear).float().mean().item()
            out.append(
                {
                    "name": f"hard argmax {tag}",
                    "max_err": wrong,
                    "tol": 0.0,
                    "ok": wrong == 0.0,
                }
            )
            # top-k: |kernel - fp64| <= 2 |naive(dtype) - fp64| + atol on clear rows
            o_t = topk_attention(q, k, v, kk, causal=causal).double()
            vals = s.topk(kk + 1, dim=-1).values
            clear = (vals[..., kk - 1] - vals[..., kk]) > 1e-2
            masked = s.masked_fill(s < vals[..., kk - 1 : kk], float("-inf"))
            p = torch.softmax(masked, -1)
            o_ref = p @ v.double()
            o_pt = naive_topk_attention(q, k, v, kk, causal=causal).double()
            err = (o_t - o_ref).abs()[clear].max().item()
            tol = 2 * (o_pt - o_ref).abs()[clear].max().item() + 1e-3
            out.append(
                {
                    "name": f"topk{kk} {tag}",
                    "max_err": err,
                    "tol": tol,
                    "ok": err <= tol,
                }
            )
    # sampled: frequencies of one repeated query within a small total variation
    # of softmax
    draws, tv_tol = (4096, 0.08) if dry else (65536, 0.02)
    q1, k, v = bench.random_qkv(
        1, 1, 1, 64, N_k=16, dtype=torch.float32, device=runtime.DEVICE, seed=4
    )  # the same every run
    q = q1.expand(1, 1, draws, 64)
    _, idx = hard_attention(q, k, v, sample=True, seed=3, return_index=True)
    p = torch.softmax(_ref_scores(q1, k)[0, 0, 0], -1).cpu().numpy()
    freq = np.bincount(idx.flatten().cpu().numpy(), minlength=16) / idx.numel()
    tv = 0.5 * float(np.abs(freq - p).sum())
    out.append(
        {
            "name": f"hard sample TV ({draws} draws)",
            "max_err": tv,
            "tol": tv_tol,
            "ok": tv <= tv_tol,
        }
    )
    # reference_attention keeps the import honest: soft attention is the k = N_k limit
    n_k = 8 if dry else 100
    q, k, v = _inputs(
        16 if dry else 128, 64, torch.float32, seed=2, N_k=n_k, heads=heads
    )
    err = (
        (topk_attention(q, k, v, n_k).double() - reference_attention(q, k, v)[0])
        .abs()
        .max()
    )
    out.append(
        {
            "name": "topk k = N_k equals soft (fp32)",
            "max_err": float(err),
            "tol": 1e-4,
            "ok": float(err) <= 1e-4,
        }
    )
    return out


def run(
    quick: bool = False, deadline: float = float("inf"), timer=None, dry: bool = False
) -> list[Record]:
    """Time every (op, impl) at each (d, N) through ``kernels.hard.timing.time_hard``;
    stops cleanly at ``deadline``. ``timer``: ``kernels.timing.bench.time_fn`` unless
    given; ``dry``: tiny shapes (the interpreter)."""
    ns = [32] if dry else [1024, 4096] if quick else [1024, 2048, 4096, 8192, 16384]
    ds = [16] if dry else [64] if quick else [64, 128]
    heads, topks = (2, (2, 4)) if dry else (H, (16, 64))

    def log(rec):
        ms = f"{rec.ms:.3f} ms" if rec.ms is not None else rec.error
        print(
            f"[{SUITE}] d={rec.shape['d']} N={rec.shape['N']} {rec.op:12s} "
            f"{rec.impl:7s} {ms}",
            flush=True,
        )

    return time_hard(
        ns,
        ds,
        batch=B,
        heads=heads,
        topks=topks,
        dtype="float16",
        naive_max_bytes=NAIVE_MAX_BYTES,
        suite=SUITE,
        stage="sweep",
        device=runtime.DEVICE,
        timer=timer,
        deadline=deadline,
        log=log,
        warmup=10,
        rep=40,
    )
