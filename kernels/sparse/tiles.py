"""Tile tables of the sparse kernels: (BLOCK_N, num_warps, num_stages) per kernel
("fwd", "bwd"), architecture class and dot path, keyed by the padded head dim
``max(block_d(d), block_d(d_v))``; the query-row block ``block_m`` (the GQA group's
heads, padded to a power of two >= 16, at most ``MAX_BLOCK_M``). Every entry is
compiled for its target by ``kernels.sparse.compile_check`` (no spills).
"""

from __future__ import annotations

import torch
import triton

from ..common import ARCHS, arch_class, block_d

__all__ = [
    "ARCHS",
    "INTERPRET_TILES",
    "KERNELS",
    "MAX_BLOCK_M",
    "MAX_HEAD_DIM",
    "block_d",
    "block_m",
    "tiles",
]

MAX_HEAD_DIM = 256
#: At most this many query heads per program; a larger group takes several programs
#: that read the same K/V rows (from L2).
MAX_BLOCK_M = 64
KERNELS = ("fwd", "bwd")

#: tensor-core dots (fp16 / bf16 on sm_80+). A program holds one query token's group
#: (BLOCK_M rows) and gathers BLOCK_N selected keys per step: the work is a stream of
#: K/V rows, so the tables aim at keeping rows in flight, within registers.
_TC = {
    "fwd": {
        "sm90": {64: (64, 4, 3), 128: (64, 4, 3), 256: (32, 4, 2)},
        "sm80": {64: (64, 4, 3), 128: (64, 4, 3), 256: (32, 4, 2)},
        "sm89": {64: (64, 4, 3), 128: (64, 4, 2), 256: (16, 4, 2)},
    },
    "bwd": {
        "sm90": {64: (32, 4, 2), 128: (32, 4, 2), 256: (16, 4, 1)},
        "sm80": {64: (32, 4, 2), 128: (32, 4, 2), 256: (16, 4, 1)},
        "sm89": {64: (32, 4, 2), 128: (32, 4, 2), 256: (16, 4, 1)},
    },
}
#: CUDA-core dots: float32 inputs anywhere, every dtype on sm_75.
_FMA = {
    "fwd": {64: (32, 4, 2), 128: (16, 4, 2), 256: (16, 8, 1)},
    "bwd": {64: (16, 8, 1), 128: (16, 8, 1), 256: (16, 4, 1)},
}
#: per-architecture exceptions to the FMA table (ptxas spills the default there)
_FMA_ARCH = {("bwd", "sm89"): {128: (16, 4, 1), 256: (16, 8, 1)}}
#: Under the Triton interpreter: one tile (its cost is per operation, not per lane).
INTERPRET_TILES = (64, 4, 1)


def block_m(
    group: int, capability=None, dtype=torch.float16, kernel="fwd", d_pad=64
) -> int:
    """Query rows per program: the group's heads padded to a power of two, at least
    16 (the smallest tl.dot tile), at most ``MAX_BLOCK_M`` (on a GPU: 16 for
    CUDA-core dots, whose operand rows live in registers, and 32 for the backward at
    padded head dim 256, whose 64-row tiles spill on sm_90)."""
    most = MAX_BLOCK_M
    if capability is not None and (
        arch_class(capability) == "sm75" or dtype == torch.float32
    ):
        most = 16
    elif capability is not None and kernel == "bwd" and d_pad >= 256:
        most = 32
    return min(max(16, triton.next_power_of_2(group)), most)


def tiles(
    kernel: str, capability, d_pad: int, dtype: torch.dtype, bm: int = 16
) -> tuple:
    """(BLOCK_N, num_warps, num_stages) for ``kernel`` ("fwd" or "bwd") on a GPU of
    ``capability`` ((major, minor); None: the interpreter) at padded head dim
    ``d_pad``, for ``bm`` query rows (64 rows take 8 warps)."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    if capability is None:
        return INTERPRET_TILES
    key = 64 if d_pad <= 64 else d_pad
    arch = arch_class(capability)
    if arch == "sm75" or dtype == torch.float32:
        return _FMA_ARCH.get((kernel, arch), {}).get(key, _FMA[kernel][key])
    bn, w, s = _TC[kernel][arch][key]
    return bn, max(w, 8) if bm >= 64 else w, s


def upcast_tiles(capability, dtype) -> bool:
    """Whether K/V/Q tiles go through fp32: as ``common.upcast_on`` bf16 under the
    interpreter (``capability`` None) and below sm_80, and fp16 on sm_75 too (its
    CUDA-core fp16 dots spill registers in these kernels, fp32 tiles do not:
    sparse_check)."""
    from ..common import upcast_on

    if capability is None:
        return upcast_on(dtype, None)
    return upcast_on(dtype, capability) or (
        arch_class(capability) == "sm75" and dtype != torch.float32
    )


def supported(kernel: str, capability, d_pad: int) -> bool:
    """Whether a kernel is shipped: not the backward above d = 128 on sm_75 (every
    tile spills or exceeds its 64 KB of shared memory there)."""
    if capability is None or kernel == "fwd":
        return True
    return arch_class(capability) != "sm75" or d_pad <= 128


class Plan:
    """The launch parameters of one call: ``fwd`` and ``bwd`` are (BLOCK_M,
    M_BLOCKS, BLOCK_N, num_warps, num_stages, UPCAST, DOT_PRECISION)."""

    def __init__(self, q, k, v):
        from .. import runtime
        from ..common import dot_precision

        cap = None if runtime.INTERPRET else torch.cuda.get_device_capability(q.device)
        group = q.shape[1] // k.shape[1]
        d_pad = max(block_d(q.shape[3]), block_d(v.shape[3]))
        up, prec = upcast_tiles(cap, q.dtype), dot_precision(q.dtype)
        self.backward_ok = supported("bwd", cap, d_pad)
        plans = []
        for kern in KERNELS:
            bm = block_m(group, cap, q.dtype, kern, d_pad)
            bn, w, s = tiles(kern, cap, d_pad, q.dtype, bm)
            plans.append((bm, triton.cdiv(group, bm), bn, w, s, up, prec))
        self.fwd, self.bwd = plans
