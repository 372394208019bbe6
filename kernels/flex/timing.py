"""The flex family's timing (FlexAttention in Triton) on a CUDA GPU: suite "flex" of
``make bench`` and chapter 7's timing section.

``check()`` holds ``flex_attention`` against an fp64 reference written from the mask
definitions on this GPU (causal, window, causal & document, softcap + sinks; bf16 and
fp32; forward and the gradients). ``goal()`` times, in bfloat16, B = 1, H = 16,
d = 128, through ``kernels.timing.bench``'s one path (``measure`` / ``time_fn``):

* op "flex-causal", N = 16384, fwd and fwd+bwd: ``flex_attention`` with
  ``causal_mask`` vs ``kernels.flash`` causal (goal: flex >= 0.9x flash's speed), vs
  ``torch.compile(flex_attention)`` with torch's own causal block mask (forward; goal:
  ahead of it), and SDPA (PyTorch's fused causal kernel);
* op "flex-window", N = 32768, fwd: ``sliding_window(4096)`` vs the dense causal
  ``flex_attention`` and ``kernels.flash`` causal at the same N (goal: >= 5x faster
  than dense causal), and ``torch.compile(flex_attention)`` on the same window.

``run()`` sweeps N in {4k, 8k, 16k} forward for causal / window 1024 / documents of
2048 through flex. The goals are checked against the records afterwards, never
assumed. torch.compile is timed forward only (compiling its backward too would double
the suite's time). Sized for about 90 s on an H200, Triton's ~30 compilations and
torch.compile's two included (an estimate: no GPU run of this suite is recorded yet).
"""

from __future__ import annotations

import math
import time

import torch

from kernels import runtime
from kernels.flash import flash_attention
from kernels.flex import (
    and_masks,
    causal_mask,
    create_block_mask,
    document_mask,
    flex_attention,
    sliding_window,
    softcap,
)
from kernels.timing import bench
from kernels.timing.bench import measure
from kernels.timing.records import Record, fwd_bwd_check

SUITE = "flex"
H, D = 16, 128
GOAL = {"causal_vs_flash": 0.9, "window_vs_dense_causal": 5.0}


def _visible(kind, n, ids=None, window=None):
    qi, ki = torch.arange(n)[:, None], torch.arange(n)[None, :]
    if kind == "causal":
        return qi >= ki
    if kind == "window":
        return (qi - ki >= 0) & (qi - ki < window)
    return (qi >= ki) & (ids[:, None] == ids[None, :])


def _reference(q, k, v, vis, cap=None, sinks=None):
    q, k, v = q.double(), k.double(), v.double()
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if cap is not None:
        s = cap * torch.tanh(s / cap)
    s = s.masked_fill(~vis.to(s.device), -math.inf)
    parts = s
    if sinks is not None:
        sk = sinks.double()[None, :, None, None].expand(*s.shape[:3], 1)
        parts = torch.cat([s, sk], -1)
    lse = torch.logsumexp(parts, -1)
    return torch.exp(s - lse[..., None]).nan_to_num(0.0) @ v


def check(dry: bool = False) -> list[dict]:
    """flex_attention against fp64 on this device: forward and dq/dk/dv (and dsinks).
    bf16 for every instantiation, fp32 for causal; d = 128 and an aligned N = 1024, so
    the goal and the sweep reuse these compilations (ragged lengths and other head
    dims are the CPU tests' part)."""
    out = []
    n, heads, d, bs = (48, 2, 16, 16) if dry else (1024, 4, D, 128)
    ids = torch.arange(n) // (n // 3 + 1)
    cases = [
        ("causal", causal_mask, _visible("causal", n), None),
        ("window", sliding_window(n // 4), _visible("window", n, window=n // 4), None),
        (
            "document",
            and_masks(causal_mask, document_mask(ids.to(runtime.DEVICE))),
            _visible("document", n, ids=ids),
            None,
        ),
        ("softcap-sink", causal_mask, _visible("causal", n), 20.0),
    ]
    runs = (
        [(torch.float32, c) for c in cases]
        if dry
        else ([(torch.bfloat16, c) for c in cases] + [(torch.float32, cases[0])])
    )
    for dtype, (name, mod, vis, cap) in runs:
        q, k, v = bench.random_qkv(
            1, heads, n, d, dtype=dtype, device=runtime.DEVICE, seed=2, grad=True
        )
        sinks = None
        if cap is not None:
            sinks = torch.linspace(-1, 1, heads, device=runtime.DEVICE)
            sinks.requires_grad_(True)
        bm = create_block_mask(mod, None, None, n, n, BLOCK_SIZE=bs)
        o = flex_attention(
            q,
            k,
            v,
            block_mask=bm,
            sinks=sinks,
            score_mod=None if cap is None else softcap(cap),
        )
        ref = _reference(q, k, v, vis, cap, sinks)
        wrt = (q, k, v) + ((sinks,) if sinks is not None else ())
        tag = f"{name}-{str(dtype)[6:]}"
        out.append(fwd_bwd_check(f"flex {tag}", o, ref, wrt))
    return out


def _torch_flex(kind, n, window=None):
    """torch.compile(flex_attention) with torch's own block mask, or an error string."""
    try:
        from torch.nn.attention import flex_attention as tf

        if kind == "causal":

            def mask(b, h, qi, ki):
                return qi >= ki
        else:

            def mask(b, h, qi, ki):
                return (qi >= ki) & (qi - ki < window)

        bm = tf.create_block_mask(mask, None, None, n, n, device="cuda")
        compiled = torch.compile(tf.flex_attention)
        return lambda q, k, v, causal: compiled(q, k, v, block_mask=bm)
    except Exception as e:  # noqa: BLE001 - recorded as the case's detail
        return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


def visible_pairs(n: int, window: int | None = None, doc: int | None = None) -> int:
    """Visible (query, key) pairs of causal (neither), a causal window, or causal
    documents of ``doc`` keys at N = n: the FLOPs count only these."""
    if window is not None:
        return (
            n * window - window * (window - 1) // 2 if window <= n else n * (n + 1) // 2
        )
    if doc is not None:
        full, rest = divmod(n, doc)
        return full * doc * (doc + 1) // 2 + rest * (rest + 1) // 2
    return n * (n + 1) // 2


def _time(rec, attn, mode, q, k, v, do, flops, timer):
    if isinstance(attn, str):  # could not be built here: recorded, not timed
        rec.error, rec.detail = "unsupported", attn
        return rec
    fn = bench.attention_step(attn, mode, q, k, v, True, do)
    measure(rec, fn, flops=flops, timer=timer, warmup=5, rep=20)
    ms = f"{rec.ms:.3f} ms" if rec.ms is not None else f"{rec.error} {rec.detail}"
    print(
        f"[{SUITE}] {rec.op} N={rec.shape['N']} {mode:7s} {rec.impl:14s} {ms}",
        flush=True,
    )
    return rec


def _impls(kind, n, dry, mode, window=None):
    dev = runtime.DEVICE
    causal_bm = create_block_mask(causal_mask, None, None, n, n, device=dev)
    impls = {
        "flex-causal": lambda q, k, v, c: flex_attention(q, k, v, block_mask=causal_bm),
        "flash-causal": lambda q, k, v, c: flash_attention(q, k, v, causal=True),
    }
    if kind == "window":
        wbm = create_block_mask(sliding_window(window), None, None, n, n, device=dev)
        impls = {
            "flex-window": lambda q, k, v, c: flex_attention(q, k, v, block_mask=wbm),
            **impls,
        }
    if dry:  # no torch.compile timing on the CPU: recorded as such
        impls["torch-compile-flex"] = "dry run: torch.compile is not timed on a CPU"
    elif mode == "fwd":  # forward only: its backward's compilation would double the
        impls["torch-compile-flex"] = _torch_flex(kind, n, window)  # suite's time
    if kind == "causal":
        sdpa = torch.nn.functional.scaled_dot_product_attention
        impls["sdpa"] = lambda q, k, v, c: sdpa(q, k, v, is_causal=True)
    return impls


def goal(timer=None, dry: bool = False, **_) -> list[Record]:
    """The goal shapes (module docstring)."""
    records = []
    plan = [
        ("causal", 64 if dry else 16384, "fwd", None),
        ("causal", 64 if dry else 16384, "fwd+bwd", None),
        ("window", 128 if dry else 32768, "fwd", 32 if dry else 4096),
    ]
    b, heads, d = (1, 2, 16) if dry else (1, H, D)
    for kind, n, mode, window in plan:
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
        for impl, attn in _impls(kind, n, dry, mode, window).items():
            w = window if impl in ("flex-window", "torch-compile-flex") else None
            flops = 4.0 * b * heads * d * visible_pairs(n, window=w)
            flops *= 3.5 if mode == "fwd+bwd" else 1.0
            shape = {"B": b, "H": heads, "N": n, "d": d, "causal": True}
            if window:
                shape["window"] = window
            rec = Record(
                SUITE, f"flex-{kind}", impl, mode, "bfloat16", shape, stage="goal"
            )
            records.append(_time(rec, attn, mode, q, k, v, do, flops, timer))
    return records


def run(
    quick: bool = False, deadline: float = float("inf"), timer=None, dry: bool = False
) -> list[Record]:
    """Forward sweep through flex: causal, window 1024, causal documents of 2048."""
    ns = [64] if dry else [8192] if quick else [4096, 8192, 16384]
    b, heads, d = (1, 2, 16) if dry else (1, H, D)
    records = []
    for n in ns:
        ids = torch.arange(n, device=runtime.DEVICE) // (32 if dry else 2048)
        w, doc = (16, 32) if dry else (1024, 2048)
        masks = {
            "causal": (causal_mask, {}),
            "window-1024": (sliding_window(w), {"window": w}),
            "documents-2048": (
                and_masks(causal_mask, document_mask(ids)),
                {"doc": doc},
            ),
        }
        q, k, v = bench.random_qkv(
            b, heads, n, d, dtype="bfloat16", device=runtime.DEVICE, seed=0
        )
        for name, (mod, kw) in masks.items():
            if time.monotonic() > deadline:
                return records
            bm = create_block_mask(mod, None, None, n, n, device=runtime.DEVICE)
            shape = {"B": b, "H": heads, "N": n, "d": d, "causal": True, "mask": name}
            shape["visited_tiles"] = bm.counts()["partial"] + bm.counts()["full"]
            rec = Record(
                SUITE, f"flex-{name}", "flex", "fwd", "bfloat16", shape, stage="sweep"
            )

            def attn(q, k, v, causal, bm=bm):
                return flex_attention(q, k, v, block_mask=bm)

            flops = 4.0 * b * heads * d * visible_pairs(n, **kw)
            records.append(_time(rec, attn, "fwd", q, k, v, None, flops, timer))
    return records
