"""Tile tables and launch heuristics of the FlashAttention kernels.

The constants every module shares (``MAX_HEAD_DIM``, ``FORWARD_PATHS``), the
shipped (BLOCK_M, BLOCK_N, num_warps, num_stages) per kernel, architecture class and
padded head dim (checked ahead of time by ``kernels.flash.compile_check``),
``arch_class``, ``block_d``, ``configs``, the autotuner's config lists, pruners and
``@triton.heuristics``, and the forward's key-length bucket ``n_bucket``.
"""

from __future__ import annotations

import torch
import triton

from .. import runtime
from ..common import ARCHS, arch_class, block_d, check_head_dim  # noqa: F401

MAX_HEAD_DIM = 256
#: flash_attention's forward paths: pointer loads (the default), TMA descriptors, TMA
#: with a warp-specialised key loop (kernels.flash.forward_tma; sm_90 only)
FORWARD_PATHS = ("pointer", "tma", "tma-ws")


# --------------------------------------------------------------------------------------
# Tile configurations. (BLOCK_M, BLOCK_N, num_warps, num_stages) per kernel,
# architecture and padded head dim; fp32 inputs (no tensor-core dot) get smaller tiles.
# --------------------------------------------------------------------------------------
INTERPRET_CONFIG = (64, 64, 4, 1)  # the one config used under the Triton interpreter

# fp16/bf16 tiles, by architecture class and BLOCK_D; autotuning picks among them. Each
# entry is checked by `python -m kernels.flash.compile_check`: it fits the
# target's shared memory and ptxas reports no register spills.
_TABLES: dict[str, dict[str, dict[int, list[tuple[int, int, int, int]]]]] = {
    "fwd": {
        "sm90": {
            16: [(128, 64, 4, 3)],
            32: [(128, 64, 4, 3)],
            64: [(128, 64, 8, 3), (64, 64, 4, 3)],
            128: [(128, 128, 8, 2), (128, 64, 8, 3)],
            256: [(128, 64, 8, 2)],
        },
        "sm80": {
            16: [(128, 64, 4, 3)],
            32: [(128, 64, 4, 3)],
            64: [(128, 64, 4, 3), (128, 128, 8, 3)],
            128: [(128, 32, 8, 3), (64, 64, 8, 2)],
            256: [(64, 32, 8, 2)],
        },
        "sm89": {
            16: [(128, 64, 4, 2)],
            32: [(128, 64, 4, 2)],
            64: [(128, 64, 8, 3), (128, 128, 8, 2)],
            128: [(64, 64, 8, 2), (64, 64, 4, 2)],
            256: [(64, 32, 8, 2)],
        },
    },
    "dkdv": {  # BLOCK_M = query rows per inner step, BLOCK_N = keys held by the program
        "sm90": {
            16: [(32, 128, 8, 2)],
            32: [(32, 128, 8, 2)],
            64: [(32, 128, 8, 2), (32, 64, 4, 2)],
            128: [(64, 64, 8, 2), (32, 128, 8, 2)],
            256: [(64, 32, 8, 2), (16, 64, 8, 2)],
        },
        "sm80": {
            16: [(32, 128, 8, 2)],
            32: [(32, 128, 8, 2)],
            64: [(32, 128, 8, 2), (32, 64, 4, 2)],
            128: [(64, 64, 8, 2), (32, 64, 8, 2)],
            256: [(64, 32, 8, 2), (32, 32, 8, 2)],
        },
        "sm89": {
            16: [(32, 128, 8, 2)],
            32: [(32, 128, 8, 2)],
            64: [(32, 128, 8, 2), (32, 64, 4, 2)],
            128: [(64, 64, 8, 2), (32, 64, 8, 2)],
            256: [(32, 32, 8, 2), (16, 64, 8, 2)],
        },
    },
    "dq": {  # BLOCK_M = query rows held by the program, BLOCK_N = keys per inner step
        "sm90": {
            16: [(128, 64, 8, 2)],
            32: [(128, 64, 8, 2)],
            64: [(128, 64, 8, 2), (128, 32, 4, 3)],
            128: [(128, 64, 8, 2), (128, 32, 8, 2)],
            256: [(128, 32, 8, 2), (64, 32, 4, 2)],
        },
        "sm80": {
            16: [(128, 64, 8, 2)],
            32: [(128, 64, 8, 2)],
            64: [(128, 64, 8, 2), (128, 32, 4, 3)],
            128: [(128, 32, 8, 2), (64, 64, 8, 2)],
            256: [(64, 32, 4, 2)],
        },
        "sm89": {
            16: [(128, 64, 8, 2)],
            32: [(128, 64, 8, 2)],
            64: [(128, 64, 8, 2), (128, 32, 4, 3)],
            128: [(128, 32, 8, 2), (64, 64, 8, 2)],
            256: [(64, 32, 4, 1)],
        },
    },
}
# (d = 256 forward on sm80/sm89 uses 8 warps: with 4, ptxas under triton 3.6 spills a
# few bytes at 255 registers; fp32 dq at d = 128 uses 32 x 16 with 8 warps: with 4 warps
# it spills on sm_90 under triton 3.6, and 16 x 16 with 4 warps spills on sm_89. The
# causal forward's masked stage keeps a key-by-key path for value rows holding NaN/inf;
# with it 128 x 64 tiles at BLOCK_D = 128 spill on sm_80/89, and 4-warp 128 x 64 or
# 3-stage 128 x 128 tiles at d = 64/128 spill on sm_89/90: those entries use the tiles
# above, each checked by `make compile-check`. The causal backward's masked stage keeps
# a path for inputs holding NaN/inf too (``finite_dot``): with it the 4-warp 64 x 64
# dQ tile at BLOCK_D = 128 spills on sm_80 (8 warps now), and so does the fp32 dK/dV
# tile 32 x 32 at d <= 64 (16 x 32 now).)
# Tiles for dot products on CUDA cores (FMA): float32 inputs everywhere (IEEE fp32
# dots) and every dtype on sm_75, where Triton >= 3.2 has no tensor-core path. FMA dots
# hold whole operand rows in registers, so the tiles are small. On sm_75 the backward
# has no config for BLOCK_D = 256: every tile of at least 16 x 16 spills there, so it
# is refused.
_FMA_TABLES: dict[str, dict[str, dict[int, list[tuple[int, int, int, int]]]]] = {
    "fp32": {
        "fwd": {
            16: [(64, 32, 8, 2)],
            32: [(64, 32, 8, 2)],
            64: [(64, 32, 8, 2)],
            128: [(32, 16, 4, 2)],
            256: [(16, 16, 4, 1)],
        },
        "dkdv": {
            16: [(16, 32, 8, 1)],
            32: [(16, 32, 8, 1)],
            64: [(16, 32, 8, 1)],
            128: [(16, 16, 4, 1)],
            256: [(16, 16, 4, 1)],
        },
        "dq": {
            16: [(32, 32, 8, 1)],
            32: [(32, 32, 8, 1)],
            64: [(32, 32, 8, 1)],
            128: [(32, 16, 8, 1)],
            256: [(16, 16, 4, 1)],
        },
    },
    "sm75": {
        "fwd": {
            16: [(64, 32, 8, 2)],
            32: [(64, 32, 8, 2)],
            64: [(64, 32, 8, 2)],
            128: [(32, 32, 8, 1)],
            256: [(16, 16, 4, 1)],
        },
        "dkdv": {
            16: [(16, 32, 8, 1)],
            32: [(16, 32, 8, 1)],
            64: [(16, 32, 8, 1)],
            128: [(16, 16, 8, 1)],
            256: [],
        },
        "dq": {
            16: [(32, 32, 8, 1)],
            32: [(32, 32, 8, 1)],
            64: [(32, 32, 8, 1)],
            128: [(16, 16, 8, 1)],
            256: [],
        },
    },
}
# The causal backward's second launch (SHIELD): it works only when an input holds
# NaN/inf, so its small tiles, one per padded head dim and dot path, are chosen to fit
# with its select-and-count path, not for speed. With CUDA-core (FMA) dots, fp32 dK/dV
# at BLOCK_D >= 128 spills even at 16 x 16 (a few hundred bytes on sm_80/90): the
# compile check reports it and accepts it for this slow path only.
_SHIELD_TABLE: dict[str, dict[int, tuple[int, int, int, int]]] = {
    "tensor-core": {
        16: (32, 32, 4, 1),
        32: (32, 32, 4, 1),
        64: (32, 32, 4, 1),
        128: (16, 32, 4, 1),
        256: (16, 16, 8, 1),
    },
    "fma": {bd: (16, 16, 8, 1) for bd in (16, 32, 64, 128, 256)},
}


def configs(
    kernel: str,
    capability: tuple[int, int],
    head_dim: int,
    dtype: torch.dtype = torch.float16,
) -> list[tuple[int, int, int, int]]:
    """Shipped (BLOCK_M, BLOCK_N, num_warps, num_stages) for ``kernel`` in fwd/dkdv/dq,
    or dkdv-shield/dq-shield (the causal backward's NaN/inf launch).

    Empty when the kernel is not supported there (the sm_75 backward at head dim > 128).
    An unknown ``kernel``, a head dim outside 1..MAX_HEAD_DIM or a ``capability`` that
    is not a (major, minor) pair is refused naming the argument.
    """
    known = sorted(_TABLES) + [f"{k}-shield" for k in ("dkdv", "dq")]
    if kernel not in known:
        raise ValueError(f"kernel must be one of {known}, got {kernel!r}")
    bd = check_head_dim(head_dim, MAX_HEAD_DIM)
    arch = arch_class(capability)
    if kernel.endswith("-shield"):
        if not configs(kernel.removesuffix("-shield"), capability, head_dim, dtype):
            return []
        path = "fma" if arch == "sm75" or dtype == torch.float32 else "tensor-core"
        return [_SHIELD_TABLE[path][bd]]
    if arch == "sm75":
        return list(_FMA_TABLES["sm75"][kernel][bd])
    if dtype == torch.float32:
        return list(_FMA_TABLES["fp32"][kernel][bd])
    return list(_TABLES[kernel][arch][bd])


def _all_configs(kernel: str) -> list[triton.Config]:
    """Every config any architecture ships (autotune prunes to the current GPU's
    list)."""
    if runtime.INTERPRET:
        bm, bn, w, s = INTERPRET_CONFIG
        return [
            triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s)
        ]
    seen = {
        c for table in _TABLES[kernel].values() for cs in table.values() for c in cs
    }
    seen |= {c for t in _FMA_TABLES.values() for cs in t[kernel].values() for c in cs}
    return [
        triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s)
        for bm, bn, w, s in sorted(seen)
    ]


def _pruner(kernel: str):
    def prune(configs_, named_args, **kwargs):
        q = named_args["Q"]
        head_dim = kwargs.get("HEAD_DIM", named_args.get("HEAD_DIM"))
        cap = torch.cuda.get_device_capability(q.device)
        allowed = set(configs(kernel, cap, head_dim, q.dtype))
        return [
            c
            for c in configs_
            if (c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages)
            in allowed
        ]

    return {"early_config_prune": prune}


_HEURISTICS = {
    "EVEN_M": lambda a: a["N_Q"] % a["BLOCK_M"] == 0,
    "EVEN_N": lambda a: a["N_K"] % a["BLOCK_N"] == 0,
    "EVEN_D": lambda a: a["HEAD_DIM"] == a["BLOCK_D"],
}


def n_bucket(n_ctx_k: int) -> int:
    """The forward's autotune key for the key length: the next power of two, from 256
    up to 65536, so a choice tuned at N = 512 is not reused at N = 65536 (nor retuned
    per N)."""
    return min(max(triton.next_power_of_2(n_ctx_k), 256), 65536)
