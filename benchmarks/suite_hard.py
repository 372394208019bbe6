"""Suite "hard": hard (argmax / sampled) and top-k attention kernels on a CUDA GPU.

``check()`` holds kernels/hard.py against fp64 references on this GPU; ``run()`` times,
in float16, non-causal, B = 2, H = 16, d in {64, 128}, N = N_q = N_k from 1k to 16k:

* op "hard":        triton ``hard_attention`` vs naive (materialise S, argmax, gather)
* op "hard-sample": triton ``hard_attention(sample=True)`` (Gumbel-max in the kernel)
* op "topk16", "topk64": triton ``topk_attention`` vs naive
  (S, torch.topk, softmax, gather)
* op "flash":       the book's ``flash_attention`` forward on the same shape
  (the yardstick)

The timing is ``kernels.timing.bench.time_hard``, the path chapter 3's timing cell takes
too. Targets (stated in the chapter, checked against these records, never assumed): hard
>= 1.5x faster than the flash forward and >= 20x faster than naive at N = 8k; top-k (k
<= 64) at most 2x the flash forward's time. Designed for ~1.5 minutes on an H200.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from kernels import runtime
from kernels.hard import hard_attention, topk_attention
from kernels.naive import naive_topk_attention, reference_attention
from kernels.timing import bench
from kernels.timing.hard import NAIVE_MAX_BYTES, time_hard
from kernels.timing.records import Record

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
    """Time every (op, impl) at each (d, N) through ``kernels.timing.hard.time_hard``;
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
