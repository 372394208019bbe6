"""Suite "ring": ring attention's degenerate case on one GPU, P = 1, against the book's
flash kernel.

With one rank ``kernels.ring.ring_attention`` must be one ``flash_attention`` call and
nothing else: ``check()`` holds it to the same bits (forward, lse and dq, dk, dv;
causal and not); ``run()`` times both, forward and forward + backward, in bfloat16,
B = 2, H = 16, d = 128, N from 1k to 16k, causal and not. The target: the two times
agree within the timer's spread (checked against the records, never assumed). Several
GPUs (P > 1, NCCL) are not part of ``make bench`` (one GPU per call).

Sized for well under a minute on an H200 (an estimate: no GPU run of this suite is
recorded yet).
"""

from __future__ import annotations

import torch

from kernels import runtime
from kernels.flash import flash_attention
from kernels.ring import ring_attention
from kernels.timing import bench
from kernels.timing.bench import measure
from kernels.timing.records import Record

SUITE = "ring"
B, H, D = 2, 16, 128


def _attn(impl):
    if impl == "flash":
        return lambda q, k, v, causal: flash_attention(q, k, v, causal)
    return lambda q, k, v, causal: ring_attention(q, k, v, causal, layout="zigzag")


def check(dry: bool = False) -> list[dict]:
    """ring_attention with P = 1 against flash_attention on this device: bit for bit."""
    out = []
    n, d, heads = (40, 16, 2) if dry else (1000, 128, H)
    for dtype in (torch.bfloat16, torch.float32):
        for causal in (False, True):
            q, k, v = bench.random_qkv(
                1,
                heads,
                n,
                d,
                H_kv=heads // 2,
                dtype=dtype,
                device=runtime.DEVICE,
                seed=1,
                grad=True,
            )
            do = torch.randn_like(q)
            results = []
            for impl in ("flash", "ring"):
                o = _attn(impl)(q, k, v, causal)
                results.append((o, *torch.autograd.grad(o, (q, k, v), do)))
            err = max(
                (a.double() - b.double()).abs().max().item() for a, b in zip(*results)
            )
            tag = f"{str(dtype)[6:]}{'-causal' if causal else ''}"
            out.append(
                {
                    "name": f"ring P=1 equals flash {tag}",
                    "max_err": err,
                    "tol": 0.0,
                    "ok": err == 0.0,
                }
            )
    return out


def run(
    quick: bool = False, deadline: float = float("inf"), timer=None, dry: bool = False
) -> list[Record]:
    """Time flash_attention and ring_attention (P = 1) at each N; stops at
    ``deadline`` (a ``time.monotonic()``)."""
    import time

    ns = [32] if dry else [4096] if quick else [1024, 4096, 16384]
    b, heads, d = (1, 2, 16) if dry else (B, H, D)
    records = []
    for n in ns:
        for causal in (False, True):
            for mode in ("fwd", "fwd+bwd"):
                q, k, v = bench.random_qkv(
                    b,
                    heads,
                    n,
                    d,
                    dtype="bfloat16",
                    device=runtime.DEVICE,
                    seed=0,
                    grad=mode != "fwd",
                )
                do = torch.randn_like(q)
                flops = bench.attention_flops(b, heads, n, n, d, causal, mode)
                for impl in ("flash", "ring-P1"):
                    if time.monotonic() > deadline:
                        return records
                    rec = Record(
                        SUITE,
                        "attention",
                        impl,
                        mode,
                        "bfloat16",
                        {"B": b, "H": heads, "N": n, "d": d, "causal": causal},
                        stage="sweep",
                    )
                    attn = _attn("flash" if impl == "flash" else "ring")
                    fn = bench.attention_step(attn, mode, q, k, v, causal, do)
                    records.append(
                        measure(rec, fn, flops=flops, timer=timer, warmup=10, rep=40)
                    )
                    ms = f"{rec.ms:.3f} ms" if rec.ms is not None else rec.error
                    print(
                        f"[{SUITE}] N={n} causal={causal} {mode:7s} {impl:7s} {ms}",
                        flush=True,
                    )
    return records
