"""FlashAttention suite: the Triton kernel against naive PyTorch and every SDPA backend.

``check()`` holds ``kernels.flash.flash_attention`` (forward and backward; causal and not;
fp16 and bf16; GQA, ragged and cross lengths) to the fp64 ``reference_attention`` on this
GPU, with the flash-attn tolerance rule: error at most twice PyTorch's own error in the
same dtype (naive attention vs fp64) plus a small atol.

``run(quick, deadline)`` records, in order of importance (so a deadline cuts the least
important part):

1. forward, fp16: d in {64, 128}, N in {512, ..., 16k}, causal and not;
2. forward + backward, fp16, same shapes;
3. peak memory of one forward against N up to 64k, fp16, d = 64: Triton vs naive
   (naive's out-of-memory is recorded as error "OOM");
4. a BLOCK_M x BLOCK_N sweep of the forward kernel (fp16, d = 64, N = 4096; tiles in the
   shape dict, autotuner bypassed with ``kernels.flash.forward_with_tiles``);
5. and 6. the same as 1 and 2 in bf16.

Implementations: ``triton`` (kernels.flash), ``naive`` (kernels.naive: S and P in HBM), and
``sdpa-flash`` / ``sdpa-efficient`` / ``sdpa-cudnn`` (torch SDPA pinned to one backend with
``torch.nn.attention.sdpa_kernel``; a backend that errors on this GPU/shape is skipped).
Shapes keep B * N = 16k tokens and H * d = 2048 so every point does similar work per
token. FLOPs: 4 B H N^2 d for the forward (two matmuls), halved when causal; forward +
backward counts 3.5x the forward (the backward does 2.5x: five matmuls, one of them the
recomputation of S).
"""

from __future__ import annotations

import math
import time

import torch
import torch.nn.functional as F

from kernels import flash
from kernels.bench import Record, measure
from kernels.flash import flash_attention
from kernels.naive import naive_attention, reference_attention

SUITE = "flash"
TOKENS = 16 * 1024  # B * N per shape
WIDTH = 2048  # H * d
SEQ_LENS = [512, 1024, 2048, 4096, 8192, 16384]
MEM_SEQ_LENS = [1024, 2048, 4096, 8192, 16384, 32768, 65536]
HEAD_DIMS = [64, 128]


def _qkv(B, H, H_kv, N_q, N_k, d, dtype, grad=False, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randn(s, generator=g, device="cuda", dtype=dtype).requires_grad_(grad)
            for s in ((B, H, N_q, d), (B, H_kv, N_k, d), (B, H_kv, N_k, d))]


def _max_err(a, b) -> float:
    return (a.double() - b.double()).abs().max().item()


# (name, B, H, H_kv, N_q, N_k, d, causal)
CHECK_SHAPES = [
    ("mha-1024-d64", 2, 4, 4, 1024, 1024, 64, False),
    ("mha-1024-d128-causal", 2, 4, 4, 1024, 1024, 128, True),
    ("gqa-ragged-d64-causal", 1, 8, 2, 777, 777, 64, True),
    ("cross-d128", 1, 4, 4, 300, 1000, 128, False),
    ("masked-rows-d96-causal", 1, 2, 2, 500, 200, 96, True),
]


def check() -> list[dict]:
    """Kernel vs fp64 reference on this GPU, forward and backward, fp16 and bf16."""
    out = []
    for dtype in (torch.float16, torch.bfloat16):
        atol = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[dtype]
        for name, B, H, H_kv, N_q, N_k, d, causal in CHECK_SHAPES:
            q, k, v = _qkv(B, H, H_kv, N_q, N_k, d, dtype, grad=True)
            o = flash_attention(q, k, v, causal=causal)
            do = torch.randn_like(o)
            grads = torch.autograd.grad(o, (q, k, v), do)
            q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
            o_ref, _ = reference_attention(q64, k64, v64, causal)
            grads_ref = torch.autograd.grad(o_ref, (q64, k64, v64), do.double())
            qs, ks, vs = (t.detach().clone().requires_grad_() for t in (q, k, v))
            o_pt = naive_attention(qs, ks, vs, causal)
            grads_pt = torch.autograd.grad(o_pt, (qs, ks, vs), do)
            for what, x, ref, pt in [("o", o, o_ref, o_pt)] + [
                    (g, x, r, p) for g, x, r, p in zip(("dq", "dk", "dv"), grads, grads_ref,
                                                       grads_pt)]:
                err = _max_err(x, ref)
                tol = 2 * _max_err(pt, ref) + atol
                out.append({"name": f"{name}-{str(dtype)[6:]}-{what}", "max_err": err,
                            "tol": tol, "ok": bool(math.isfinite(err) and err <= tol)})
            del q, k, v, o, grads, q64, k64, v64, o_ref, grads_ref, qs, ks, vs, o_pt, grads_pt
    torch.cuda.empty_cache()
    return out


def _sdpa(backend):
    from torch.nn.attention import sdpa_kernel

    def attn(q, k, v, causal):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return attn


def _impls() -> dict:
    from torch.nn.attention import SDPBackend

    impls = {"triton": lambda q, k, v, causal: flash_attention(q, k, v, causal=causal),
             "naive": lambda q, k, v, causal: naive_attention(q, k, v, causal=causal)}
    for name, attr in (("sdpa-flash", "FLASH_ATTENTION"), ("sdpa-efficient", "EFFICIENT_ATTENTION"),
                       ("sdpa-cudnn", "CUDNN_ATTENTION")):
        if hasattr(SDPBackend, attr):
            impls[name] = _sdpa(getattr(SDPBackend, attr))
    return impls


def flops(B, H, N_q, N_k, d, causal, mode) -> float:
    f = 4.0 * B * H * N_q * N_k * d * (0.5 if causal else 1.0)
    return f * (3.5 if mode == "fwd+bwd" else 1.0)


def _bench_one(impl_name, attn, mode, dtype, B, H, N, d, causal, timing) -> Record | None:
    shape = {"B": B, "H": H, "N_q": N, "N_k": N, "d": d, "causal": causal}
    rec = Record(SUITE, "attention", impl_name, mode, str(dtype).replace("torch.", ""), shape)
    try:
        q, k, v = _qkv(B, H, H, N, N, d, dtype, grad=(mode == "fwd+bwd"))
        if mode == "fwd":
            def fn():
                with torch.no_grad():
                    return attn(q, k, v, causal)
        else:
            do = torch.randn(B, H, N, d, device="cuda", dtype=dtype)

            def fn():
                o = attn(q, k, v, causal)
                return torch.autograd.grad(o, (q, k, v), do)
        return measure(rec, fn, flops=flops(B, H, N, N, d, causal, mode), **timing)
    except torch.cuda.OutOfMemoryError:
        rec.error = "OOM"
        return rec
    except RuntimeError as e:  # an SDPA backend that does not support this GPU/shape/dtype
        if impl_name.startswith("sdpa"):
            return None
        raise RuntimeError(f"{impl_name} {mode} {shape} {dtype}: {e}") from e
    finally:
        q = k = v = None
        torch.cuda.empty_cache()


def _speed_sweep(dtype, mode, seq_lens, head_dims, deadline, timing, impls, log):
    records = []
    for d in head_dims:
        H = WIDTH // d
        for N in seq_lens:
            B = max(1, TOKENS // N)
            for causal in (False, True):
                for name, attn in impls.items():
                    if time.monotonic() > deadline:
                        return records, True
                    r = _bench_one(name, attn, mode, dtype, B, H, N, d, causal, timing)
                    if r is not None:
                        records.append(r)
                        log(r)
    return records, False


def _memory_sweep(seq_lens, deadline, timing, log):
    """Peak memory of one fp16 forward, B = 1, H = 16, d = 64: Triton vs naive."""
    records = []
    impls = {"triton": lambda q, k, v, c: flash_attention(q, k, v, causal=c),
             "naive": lambda q, k, v, c: naive_attention(q, k, v, causal=c)}
    for N in seq_lens:
        for name, attn in impls.items():
            if time.monotonic() > deadline:
                return records, True
            r = _bench_one(name, attn, "fwd", torch.float16, 1, 16, N, 64, False, timing)
            r.op = "attention-memory"
            records.append(r)
            log(r)
    return records, False


#: The BLOCK_M x BLOCK_N sweep: one forward shape, every tile pair (chapter 2 draws it).
TILE_SWEEP_SHAPE = {"B": 4, "H": 32, "N_q": 4096, "N_k": 4096, "d": 64, "causal": False}
TILE_SWEEP_BLOCKS = [16, 32, 64, 128]


def _tile_sweep(deadline, timing, log):
    """Forward ms of fp16 attention at each BLOCK_M x BLOCK_N (autotuner bypassed)."""
    records = []
    sh = TILE_SWEEP_SHAPE
    q, k, v = _qkv(sh["B"], sh["H"], sh["H"], sh["N_q"], sh["N_k"], sh["d"], torch.float16)
    for bm in TILE_SWEEP_BLOCKS:
        for bn in TILE_SWEEP_BLOCKS:
            if time.monotonic() > deadline:
                return records, True
            warps = 8 if bm * bn >= 128 * 64 else 4
            rec = Record(SUITE, "attention", "triton", "fwd", "float16",
                         {**sh, "BLOCK_M": bm, "BLOCK_N": bn, "num_warps": warps,
                          "num_stages": 2})
            fn = lambda bm=bm, bn=bn, warps=warps: flash.forward_with_tiles(
                q, k, v, bm, bn, causal=False, num_warps=warps, num_stages=2)
            try:
                measure(rec, fn, flops=flops(sh["B"], sh["H"], sh["N_q"], sh["N_k"], sh["d"],
                                             False, "fwd"), **timing)
            except Exception as e:  # noqa: BLE001 - a tile that does not fit is a result
                rec.error = type(e).__name__
            records.append(rec)
            log(rec)
    return records, False


def _log(r: Record) -> None:
    s = r.shape
    what = (r.error if r.error else f"{r.ms:.3f} ms {r.tflops:.1f} TFLOP/s "
            f"{(r.peak_mem_bytes or 0) / 2**20:.0f} MiB")
    print(f"[flash] {r.op} {r.mode:<7} {r.dtype:<8} {r.impl:<14} B={s['B']} H={s['H']} "
          f"N={s['N_q']} d={s['d']} causal={s['causal']}"
          + (f" tiles={s['BLOCK_M']}x{s['BLOCK_N']}" if "BLOCK_M" in s else "")
          + f": {what}", flush=True)


def run(quick: bool, deadline: float) -> list[Record]:
    """Time every implementation; stop cleanly (keeping what was measured) at ``deadline``."""
    seq_lens = [1024, 4096] if quick else SEQ_LENS
    head_dims = [64] if quick else HEAD_DIMS
    mem_lens = [4096, 16384] if quick else MEM_SEQ_LENS
    timing = {"warmup": 5, "rep": 20} if quick else {"warmup": 10, "rep": 50}
    impls = _impls()
    records: list[Record] = []
    plan = [
        lambda: _speed_sweep(torch.float16, "fwd", seq_lens, head_dims, deadline, timing, impls,
                             _log),
        lambda: _speed_sweep(torch.float16, "fwd+bwd", seq_lens, head_dims, deadline, timing,
                             impls, _log),
        lambda: _memory_sweep(mem_lens, deadline, {"warmup": 1, "rep": 1}, _log),
        lambda: _tile_sweep(deadline, timing, _log),
        lambda: _speed_sweep(torch.bfloat16, "fwd", seq_lens, head_dims, deadline, timing, impls,
                             _log),
        lambda: _speed_sweep(torch.bfloat16, "fwd+bwd", seq_lens, head_dims, deadline, timing,
                             impls, _log),
    ]
    for step in plan:
        recs, stopped = step()
        records.extend(recs)
        if stopped:
            print(f"[flash] deadline reached: {len(records)} records kept", flush=True)
            break
    return records
