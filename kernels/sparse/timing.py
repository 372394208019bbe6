"""The sparse family's timing (attention over chosen blocks) on a CUDA GPU: suite
"sparse" of ``make bench`` and chapter 8's timing.

``check()`` holds ``sparse_attention`` against an fp64 reference written here from
the definition (the keys of the chosen blocks, causal bottom-right; forward and
gradients, bf16 and fp32) and ``select_blocks`` against the NumPy twin
``attention.sparse.select_blocks`` (index for index, on small-integer inputs whose
scores are exact, ties included). ``goal()`` times, in bfloat16, B = 1, H_q = 16,
H_kv = 1 (one GQA group of 16, NSA's layout), d = 128, causal, through
``kernels.timing.bench``'s one path (``measure`` / ``time_fn``):

* op "sparse-goal", N = 65536, fwd: ``select_blocks`` (16 blocks of 64: MoBA's gate,
  timed on its own), ``sparse_attention`` over its choice (``prepare``: validated
  once, the launches timed), the two together (``prepare(..., check_indices=False)``:
  select_blocks' indices are valid by construction, so no host synchronisation is
  timed), and ``kernels.flash`` dense causal.
  Goals: select + sparse >= 6x faster than dense flash, the selection <= 20% of the
  total (``speedups`` reads both from the records afterwards, never assumed);
* the same with fwd+bwd for sparse_attention and flash at N = 16384.

``run()`` sweeps N in {8k, 16k, 32k, 64k} at the fixed budget (16 blocks of 64): the
sparse forward, the selection and flash causal (sparse linear in N, dense
quadratic), and DSA's shape (block_size = 1, 2,048 tokens per query, strided) at 16k
and 32k. Sized for well under a minute on an H200 (an estimate: no GPU run of this
suite is recorded yet).
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch

from attention import sparse as twin
from kernels import runtime
from kernels.flash import flash_attention
from kernels.sparse import prepare, select_blocks, sparse_attention
from kernels.timing import bench
from kernels.timing.bench import measure
from kernels.timing.records import Record, fwd_bwd_check

SUITE = "sparse"
H, H_KV, D = 16, 1, 128
BLOCK, TOPK = 64, 16
GOAL = {"vs_dense_flash": 6.0, "selection_share": 0.2}


def keep_mask(idx, n_k, block_size, causal):
    """(B, H_kv, N_q, N_k) bool: the keys each row reads (the definition)."""
    n_q = idx.shape[2]
    blk = torch.arange(n_k, device=idx.device) // block_size
    keep = (idx[..., :, None] == blk).any(-2)
    if causal:
        pos = torch.arange(n_q, device=idx.device)[:, None] + (n_k - n_q)
        keep &= torch.arange(n_k, device=idx.device)[None, :] <= pos
    return keep


def reference(q, k, v, idx, block_size, causal=True):
    """fp64 softmax attention over the kept keys (0 for a row with none)."""
    g = q.shape[1] // k.shape[1]
    keep = keep_mask(idx, k.shape[2], block_size, causal).repeat_interleave(g, 1)
    q, k, v = q.double(), k.double(), v.double()
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = (q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])).masked_fill(~keep, -math.inf)
    m = s.amax(-1, keepdim=True).detach()
    e = torch.exp(s - torch.where(torch.isfinite(m), m, torch.zeros_like(m)))
    l = e.sum(-1, keepdim=True)
    return (e / torch.where(l > 0, l, torch.ones_like(l))) @ v


def visible_keys(idx, n_k, block_size, causal=True) -> int:
    """Keys read summed over (batch, KV head, query), from the indices (chunked over
    queries so no N_q x N_k tensor is built at 64k)."""
    n_q, total = idx.shape[2], 0
    for lo in range(0, n_q, 4096):
        part = idx[:, :, lo : lo + 4096].long()
        ends = torch.clamp((part + 1) * block_size, max=n_k)
        if causal:
            pos = torch.arange(lo, lo + part.shape[2], device=idx.device) + n_k - n_q
            ends = torch.minimum(ends, pos[:, None] + 1)
        total += int(
            torch.where(part >= 0, ends - part * block_size, 0).clamp(min=0).sum()
        )
    return total


def check(dry: bool = False) -> list[dict]:
    """sparse_attention (forward and gradients) against fp64 at N = 1024 (dry: 32),
    bf16 and fp32, block sizes 64 and 1; select_blocks against the NumPy twin."""
    dev, out = runtime.DEVICE, []
    n, heads, d = (32, 2, 16) if dry else (1024, 4, D)
    runs = [
        (torch.float32, 16 if dry else BLOCK, 2),
        (torch.float32, 1, 8 if dry else 24),
    ]
    if not dry:
        runs += [(torch.bfloat16, BLOCK, 4), (torch.bfloat16, 1, 128)]
    for dtype, bs, topk in runs:
        q, k, v = bench.random_qkv(
            1, heads, n, d, H_kv=1, dtype=dtype, device=dev, seed=3, grad=True
        )
        if bs == 1:  # a strided set of earlier tokens per query (DSA's shape)
            idx = strided_tokens(1, 1, n, n, topk, dev)
        else:
            idx = select_blocks(q.detach(), k.detach(), bs, topk)
        o = sparse_attention(q, k, v, idx, bs)
        ref = reference(q, k, v, idx, bs)
        tag = f"bs{bs}-{str(dtype)[6:]}"
        out.append(fwd_bwd_check(f"sparse {tag}", o, ref, (q, k, v)))
    g = torch.Generator().manual_seed(4)
    qi = torch.randint(-2, 3, (1, heads, n, 8), generator=g).float()
    ki = torch.randint(-2, 3, (1, 1, n, 8), generator=g).float()
    got = select_blocks(qi.to(dev), ki.to(dev), 16, 4, scale=0.5).cpu().numpy()
    want = twin.select_blocks(qi.numpy(), ki.numpy(), 16, 4, True, 0.5)
    same = float(np.mean(got == want))
    out.append(
        {
            "name": "select_blocks = twin",
            "max_err": 1 - same,
            "tol": 1e-9,
            "ok": same == 1,
        }
    )
    return out


def strided_tokens(b, h_kv, n_q, n_k, topk, device):
    """(B, H_kv, N_q, topk) int32 token indices: for each query the ``topk`` tokens
    pos, pos - s, pos - 2s, ... with stride s = max(1, pos // topk) (-1 below 0):
    distinct, visible, spread over the whole context as DSA's choice can be."""
    pos = torch.arange(n_q, device=device) + (n_k - n_q)
    stride = torch.clamp(pos // topk, min=1)
    j = pos[:, None] - stride[:, None] * torch.arange(topk, device=device)
    j = torch.where(j >= 0, j, -1).to(torch.int32)
    return j.expand(b, h_kv, n_q, topk).contiguous()


def _time(rec, fn, flops, timer):
    measure(rec, fn, flops=flops, timer=timer, warmup=5, rep=20)
    ms = f"{rec.ms:.3f} ms" if rec.ms is not None else f"{rec.error} {rec.detail}"
    print(
        f"[{SUITE}] {rec.op} N={rec.shape['N']} {rec.mode:7s} {rec.impl:14s} {ms}",
        flush=True,
    )
    return rec


def _cases(n, mode, bs, topk, dry, op, stage, timer, impls):
    """Time ``impls`` (subset of select, sparse, select+sparse, flash-causal) at one
    shape; records in that order."""
    b, heads, h_kv, d = (1, 2, 1, 16) if dry else (1, H, H_KV, D)
    grad = mode == "fwd+bwd"
    q, k, v = bench.random_qkv(
        b,
        heads,
        n,
        d,
        H_kv=h_kv,
        dtype="bfloat16",
        device=runtime.DEVICE,
        seed=0,
        grad=grad,
    )
    with torch.no_grad():
        if bs == 1:
            idx = strided_tokens(b, h_kv, n, n, topk, q.device)
        else:
            idx = select_blocks(q, k, bs, topk)
    launch = prepare(q, k, v, idx, bs)
    pairs = visible_keys(idx, n, bs) * (heads // h_kv)
    fl = 4.0 * d * pairs * (3.5 if grad else 1.0)
    do = torch.randn_like(q)
    steps = {
        "select": lambda q, k, v, c: select_blocks(q, k, bs, topk),
        "sparse": lambda q, k, v, c: launch(),
        "select+sparse": lambda q, k, v, c: prepare(
            q, k, v, select_blocks(q, k, bs, topk), bs, check_indices=False
        )(),
        "flash-causal": lambda q, k, v, c: flash_attention(q, k, v, causal=True),
    }
    flops = {
        "select": 2.0 * b * h_kv * n * (n // bs) * d,
        "sparse": fl,
        "select+sparse": fl,
        "flash-causal": bench.attention_flops(b, heads, n, n, d, True, mode),
    }
    shape = {"B": b, "H": heads, "H_kv": h_kv, "N": n, "d": d, "causal": True}
    shape.update(block_size=bs, topk=topk, visible_pairs=pairs)
    out = []
    for impl in impls:
        rec = Record(SUITE, op, impl, mode, "bfloat16", dict(shape), stage=stage)
        fn = bench.attention_step(steps[impl], mode, q, k, v, True, do)
        if impl == "select" and mode != "fwd":
            continue
        out.append(_time(rec, fn, flops[impl], timer))
    return out


def goal(timer=None, dry: bool = False, **_) -> list[Record]:
    """The goal shapes (module docstring)."""
    n_fwd, n_bwd = (32, 16) if dry else (65536, 16384)
    bs, topk = (16, 4) if dry else (BLOCK, TOPK)
    every = ("select", "sparse", "select+sparse", "flash-causal")
    return _cases(n_fwd, "fwd", bs, topk, dry, "sparse-goal", "goal", timer, every) + (
        _cases(
            n_bwd,
            "fwd+bwd",
            bs,
            topk,
            dry,
            "sparse-goal",
            "goal",
            timer,
            ("sparse", "flash-causal"),
        )
    )


def run(
    quick: bool = False, deadline: float = float("inf"), timer=None, dry: bool = False
) -> list[Record]:
    """The sweep over N at the fixed budget, then DSA's token shape."""
    ns = [16, 32] if dry else [16384] if quick else [8192, 16384, 32768, 65536]
    bs, topk = (16, 4) if dry else (BLOCK, TOPK)
    records = []
    for n in ns:
        if time.monotonic() > deadline:
            return records
        records += _cases(
            n,
            "fwd",
            bs,
            topk,
            dry,
            "sparse-blocks",
            "sweep",
            timer,
            ("select", "sparse", "flash-causal"),
        )
    for n in [] if quick else [16] if dry else [16384, 32768]:
        if time.monotonic() > deadline:
            return records
        records += _cases(
            n,
            "fwd",
            1,
            8 if dry else 2048,
            dry,
            "sparse-tokens",
            "sweep",
            timer,
            ("sparse",),
        )
    return records


def speedups(records) -> dict:
    """The goal ratios from goal records (dicts or Records): dense flash time over
    select + sparse time, and the selection's share of select + sparse, at the
    forward goal shape; None where a record is missing or failed."""
    rows = [r if isinstance(r, dict) else r.to_dict() for r in records]
    ms = {
        r["impl"]: r["ms"]
        for r in rows
        if r["op"] == "sparse-goal" and r["mode"] == "fwd" and r.get("ms")
    }
    total = ms.get("select+sparse")
    return {
        "vs_dense_flash": ms["flash-causal"] / total
        if total and "flash-causal" in ms
        else None,
        "selection_share": ms["select"] / total if total and "select" in ms else None,
    }
