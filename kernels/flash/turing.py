"""What a chapter's timing section says on a Turing GPU (sm_75: the T4 of Colab's free
tier), above its numbers, and what it measures there instead of a speed-up.

Triton 3.2 and later lower ``tl.dot`` to CUDA-core FMA instructions below sm_80 (an
sm_75 compile of a 64 x 64 fp16 ``tl.dot`` has no HMMA; ``kernels.machine_code`` counts
them), so on a T4 the book's kernels run without the tensor cores that PyTorch's SDPA
backends and cuBLAS do use: they lose there, and a reader should hear why before seeing
it. What still holds on a T4 is the memory: naive attention materialises the N x N
scores and probabilities, the kernel keeps O(N) extra. ``t4_report`` prints the note,
measures both peaks (``torch.cuda.max_memory_allocated``) at a few lengths, and computes
from the measured bytes the length at which naive attention no longer fits this GPU's
memory. ``timed_impls`` is what the chapters time: with each SDPA backend on its own
on sm_75 (the backends that use the T4's tensor cores, beside the kernel).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from kernels import runtime
from kernels.flash.timing import attention_impls
from kernels.timing.bench import random_qkv

#: The lengths at which the peaks are measured (B = 1, H = 8, d = 64, float16).
MEMORY_LENGTHS = (1024, 2048, 4096)

NOTE = (
    "Note: this GPU is {name}, compute capability 7.5 (sm_75, the T4 of Colab's "
    "free tier).\nTriton 3.2 and later compile tl.dot to plain FMA instructions on "
    "sm_75, not to its tensor cores,\nso the book's Triton kernels run on CUDA cores "
    "here and are slower than PyTorch's SDPA\nbackends, which do use the tensor cores "
    "(timed beside them below). For the speed story pick\nan L4 or A100 runtime. What "
    "still holds on a T4 is the memory, measured here:"
)


def is_sm75() -> bool:
    """True on a CUDA GPU of compute capability 7.5 (Turing: T4, RTX 20xx)."""
    return runtime.HAS_CUDA and not runtime.INTERPRET and runtime.capability() == (7, 5)


def timed_impls() -> dict[str, Callable]:
    """The attention implementations a chapter times: the kernel, naive and PyTorch's
    SDPA; on sm_75 each SDPA backend on its own, so the ones that use the tensor cores
    there are named beside the kernel that cannot."""
    return attention_impls(sdpa_backends=is_sm75())


def device_memory_bytes() -> int:
    """This GPU's memory as the driver reports it (a T4: 15 GiB of its 16 GB)."""
    return int(
        torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    )


def cuda_peak_bytes(fn: Callable[[], object]) -> int:
    """Peak bytes ``fn`` allocates on the GPU above what was allocated before it."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return int(torch.cuda.max_memory_allocated() - before)


def peak_memory(
    lengths=MEMORY_LENGTHS,
    *,
    batch: int = 1,
    heads: int = 8,
    d: int = 64,
    dtype: str = "float16",
    measure: Callable[[Callable[[], object]], int] | None = None,
) -> list[dict]:
    """Measured peak bytes of one forward (no autograd) of naive attention and of the
    kernel at each N: ``[{"N", "naive", "triton"}, ...]`` (inputs not counted)."""
    measure = cuda_peak_bytes if measure is None else measure
    impls = attention_impls()
    rows = []
    for n in lengths:
        q, k, v = random_qkv(batch, heads, n, d, dtype=dtype)  # (B, H, N, d)
        row = {"N": n}
        for name in ("naive", "triton"):

            def fwd(attn=impls[name], q=q, k=k, v=v):
                with torch.no_grad():
                    return attn(q, k, v, False)

            row[name] = measure(fwd)
        rows.append(row)
    return rows


def naive_limit(rows: list[dict], memory_bytes: int) -> int:
    """Computed, not measured: the N at which naive attention's peak would pass
    ``memory_bytes``, from the measured bytes per N^2 at the longest measured N (the
    N x N scores and probabilities dominate there; the kernel's peak is the rest)."""
    last = max(rows, key=lambda r: r["N"])
    per_n2 = (last["naive"] - last["triton"]) / last["N"] ** 2
    if per_n2 <= 0:
        raise ValueError("naive attention's measured peak does not grow as N^2")
    return int(math.sqrt(memory_bytes / per_n2))


def t4_report(
    lengths=MEMORY_LENGTHS,
    *,
    out: Callable[[str], object] = print,
    measure: Callable[[Callable[[], object]], int] | None = None,
) -> bool:
    """On sm_75: print the note and the memory comparison, and return True; elsewhere
    print nothing and return False. Each chapter's timing cell calls it first."""
    if not is_sm75():
        return False
    out(NOTE.format(name=runtime.gpu_name()))
    rows = peak_memory(lengths, measure=measure)
    mib = 2**20
    out(
        f"{'N':>6} {'naive peak':>12} {'kernel peak':>12}  (B = 1, H = 8, d = 64, "
        "float16, one forward, measured)"
    )
    for r in rows:
        out(
            f"{r['N']:>6} {r['naive'] / mib:>8.1f} MiB {r['triton'] / mib:>8.1f} MiB"
            f"  naive {r['naive'] / max(r['triton'], 1):.0f}x"
        )
    total = device_memory_bytes()
    out(
        f"computed from these bytes: naive attention needs more than this GPU's "
        f"{total / 2**30:.1f} GiB from N = {naive_limit(rows, total):,} on (same B, "
        "H, d); the kernel's extra memory grows as N."
    )
    return True
