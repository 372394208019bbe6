"""Timing of the hard (argmax, sampled) and top-k kernels: chapter 3's timing cell and
``benchmarks/suite_hard.py`` both measure through ``time_hard`` (re-exported as
``kernels.timing.bench.time_hard``).

At each head dim d and sequence length N = N_q = N_k, forward only (no autograd graph),
non-causal, it times the book's ``flash_attention`` forward (the yardstick, op "flash"),
``hard_attention`` (op "hard"; with ``sample=True`` op "hard-sample", Gumbel-max in the
kernel) and ``topk_attention`` (op "topk<k>" for each k), all impl "triton", then the
naive PyTorch versions (impl "naive": S materialised in HBM, then argmax or topk and a
gather) where S and its top-k copies fit ``naive_max_bytes``. One ``bench.Record`` per
case; shape ``{"B", "H", "N", "d", "causal", "topk" (top-k only)}``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

import torch

from .. import runtime
from .bench import measure, random_qkv, torch_dtype
from .records import Record

#: Naive shapes whose S (and the top-k copies: 3 S-sized tensors) would exceed this
#: are not timed.
NAIVE_MAX_BYTES = 40 * 2**30


def hard_cases(
    q, k, v, topks: Iterable[int] = (16, 64), naive: bool = True
) -> list[tuple[str, str, Callable[[], object], float, dict | None]]:
    """(op, impl, fn, FLOPs, extra shape keys) for one input shape, in timing order.

    FLOPs count S = q k^T (2 B H N_q N_k d) for the selection kernels, twice that for
    the flash forward (S and P V)."""
    from ..flash import flash_attention
    from ..hard import hard_attention, topk_attention
    from ..naive import naive_hard_attention, naive_topk_attention

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
