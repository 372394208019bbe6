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
token. Timing goes through ``kernels.bench`` (``time_attention``, ``time_tiles``), the
chapters' path too; FLOPs are ``kernels.bench.attention_flops``.
"""

from __future__ import annotations

import math
import time

import torch

from kernels import bench
from kernels.bench import Record
from kernels.flash import flash_attention
from kernels.naive import naive_attention, reference_attention

SUITE = "flash"
TOKENS = 16 * 1024  # B * N per shape
WIDTH = 2048  # H * d
SEQ_LENS = [512, 1024, 2048, 4096, 8192, 16384]
MEM_SEQ_LENS = [1024, 2048, 4096, 8192, 16384, 32768, 65536]
HEAD_DIMS = [64, 128]


def _qkv(B, H, H_kv, N_q, N_k, d, dtype, grad=False, seed=0):
    return bench.random_qkv(B, H, N_q, d, H_kv=H_kv, N_k=N_k, dtype=dtype, device="cuda",
                            seed=seed, grad=grad)


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


#: The BLOCK_M x BLOCK_N sweep: one forward shape, every tile pair (chapter 2 draws it).
TILE_SWEEP_SHAPE = {"B": 4, "H": 32, "N_q": 4096, "N_k": 4096, "d": 64, "causal": False}
TILE_SWEEP_BLOCKS = [16, 32, 64, 128]


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
    impls = bench.attention_impls(sdpa_backends=True)
    common = {"suite": SUITE, "deadline": deadline, "log": _log}

    def speed(dtype, mode):
        return [r for d in head_dims for r in bench.time_attention(
            seq_lens, impls, d=d, causal=(False, True), dtype=dtype, modes=(mode,),
            tokens=TOKENS, width=WIDTH, **common, **timing)]

    def peak_memory():  # one fp16 forward, B = 1, H = 16, d = 64: Triton vs naive
        return bench.time_attention(
            mem_lens, {k: impls[k] for k in ("triton", "naive")}, d=64, batch=1, heads=16,
            op="attention-memory", **common, warmup=1, rep=1)

    def tiles():
        sh = TILE_SWEEP_SHAPE
        return bench.time_tiles(TILE_SWEEP_BLOCKS, batch=sh["B"], heads=sh["H"], N=sh["N_q"],
                                d=sh["d"], causal=sh["causal"], **common, **timing)

    plan = [lambda: speed("float16", "fwd"), lambda: speed("float16", "fwd+bwd"), peak_memory,
            tiles, lambda: speed("bfloat16", "fwd"), lambda: speed("bfloat16", "fwd+bwd")]
    records: list[Record] = []
    for step in plan:
        records.extend(step())
        if time.monotonic() > deadline:
            print(f"[flash] deadline reached: {len(records)} records kept", flush=True)
            break
    return records
