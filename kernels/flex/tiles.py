"""Tile tables of the flex kernels.

One (BLOCK_M, BLOCK_N, num_warps, num_stages) per kernel ("fwd", "dkdv", "dq"),
architecture class (``kernels.common.arch_class``) and dot path (tensor cores;
CUDA-core FMA for float32 inputs and sm_75), keyed by the padded head dim
``max(block_d(d), block_d(d_v))``. The kernel tile never exceeds the block mask's
tile: the launch takes ``min(table, BLOCK_SIZE)`` per side (both powers of two, so a
kernel tile divides a mask tile). Checked ahead of time by
``python -m kernels.flex.compile_check`` (shared memory, no spills).
"""

from __future__ import annotations

import torch
import triton

from ..common import ARCHS, arch_class

__all__ = ["ARCHS", "INTERPRET_CONFIG", "MAX_HEAD_DIM", "block_d", "configs", "tiles"]

MAX_HEAD_DIM = 256
INTERPRET_CONFIG = (64, 64, 4, 1)

_TC = {  # tensor-core dots (fp16 / bf16 on sm_80+)
    "fwd": {
        "sm90": {64: (128, 64, 8, 3), 128: (128, 64, 8, 3), 256: (64, 64, 8, 2)},
        "sm80": {64: (128, 64, 8, 3), 128: (128, 64, 8, 2), 256: (64, 64, 8, 2)},
        "sm89": {64: (128, 64, 8, 2), 128: (64, 64, 4, 2), 256: (64, 32, 4, 2)},
    },
    "dkdv": {
        "sm90": {64: (32, 128, 8, 2), 128: (64, 64, 8, 2), 256: (32, 32, 8, 2)},
        "sm80": {64: (32, 128, 8, 2), 128: (64, 64, 8, 2), 256: (32, 32, 8, 2)},
        "sm89": {64: (32, 128, 8, 2), 128: (64, 64, 8, 2), 256: (32, 32, 8, 2)},
    },
    "dq": {
        "sm90": {64: (128, 64, 8, 2), 128: (64, 64, 8, 2), 256: (64, 32, 4, 2)},
        "sm80": {64: (128, 64, 8, 2), 128: (64, 64, 8, 2), 256: (64, 32, 4, 2)},
        "sm89": {64: (128, 64, 8, 2), 128: (64, 64, 8, 2), 256: (64, 32, 8, 1)},
    },
}
_FMA = {  # CUDA-core dots: float32 inputs anywhere, every dtype on sm_75
    "fwd": {64: (64, 32, 8, 2), 128: (32, 16, 4, 2), 256: (16, 16, 4, 1)},
    "dkdv": {64: (16, 32, 4, 1), 128: (16, 16, 8, 1), 256: (16, 16, 8, 1)},
    "dq": {64: (32, 32, 8, 1), 128: (32, 16, 8, 1), 256: (16, 16, 4, 1)},
}
#: per-architecture exceptions to the FMA table (ptxas spills the default there)
_FMA_ARCH = {("dkdv", "sm80"): {128: (16, 16, 2, 1), 256: (16, 16, 2, 1)}}
KERNELS = ("fwd", "dkdv", "dq")
#: the NaN/inf launches (SHIELD: they work only when an input holds NaN/inf, summing
#: the partial tiles pair by pair): small tiles, chosen to fit, not for speed
SHIELD_CONFIGS = {"tensor-core": (32, 32, 4, 1), "fma": (16, 16, 4, 1)}


def block_d(head_dim: int) -> int:
    """Padded head dim: the next power of two, at least 16."""
    return max(16, triton.next_power_of_2(int(head_dim)))


def configs(kernel: str, capability, d_pad: int, dtype: torch.dtype) -> tuple:
    """The shipped (BLOCK_M, BLOCK_N, num_warps, num_stages) for ``kernel`` (fwd, dkdv,
    dq, or their ``-shield`` NaN/inf launches) on a GPU of ``capability`` at padded
    head dim ``d_pad`` (16 ... 256). None where the kernel is not shipped: the sm_75
    backward above d_pad = 64 (with CUDA-core dots every backward tile spills there)."""
    known = KERNELS + tuple(f"{k}-shield" for k in KERNELS)
    if kernel not in known:
        raise ValueError(f"kernel must be one of {known}, got {kernel!r}")
    key = 64 if d_pad <= 64 else d_pad
    arch = arch_class(capability)
    if arch == "sm75" and key > 64 and not kernel.startswith("fwd"):
        return None  # every backward tile spills there (flex_check): refused
    if kernel.endswith("-shield"):
        fma = arch == "sm75" or dtype == torch.float32
        return SHIELD_CONFIGS["fma" if fma else "tensor-core"]
    if arch == "sm75" or dtype == torch.float32:
        return _FMA_ARCH.get((kernel, arch), {}).get(key, _FMA[kernel][key])
    return _TC[kernel][arch][key]


def tiles(kernel, capability, d_pad, dtype, block_size, interpret: bool) -> tuple:
    """The launch tile: the table's (or the interpreter's) capped by the block mask's
    (Q, KV) tile."""
    cfg = INTERPRET_CONFIG if interpret else configs(kernel, capability, d_pad, dtype)
    if cfg is None:
        raise ValueError(
            f"the flex backward does not support head dims above 64 (padded "
            f"{d_pad}) on sm_{capability[0]}{capability[1]}: without tensor cores "
            f"its tiles spill registers; use d, d_v <= 64 or an sm_80+ GPU"
        )
    bm, bn, w, s = cfg
    return min(bm, block_size[0]), min(bn, block_size[1]), w, s
