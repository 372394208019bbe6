"""Tile tables of the hard and top-k kernels: shipped configs per GPU and head dim.

``configs`` (what a launch may use), the autotuner's config lists and pruners, and the
limits ``MAX_HEAD_DIM`` and ``MAX_TOPK``. Each config was compiled ahead of time for its
target (``kernels.flash.compile_check``): shared memory within the limit, no
register spills.
"""

from __future__ import annotations

import torch
import triton

from .. import common, runtime
from ..common import arch_class, block_d, check_head_dim

MAX_HEAD_DIM = 128
MAX_TOPK = 128


# (BLOCK_M, BLOCK_N, num_warps, num_stages) per architecture class
# (kernels.common.arch_class) and padded head dim. Each was compiled ahead of time
# for its target (triton.compile with GPUTarget, as kernels.flash.compile_check
# does): shared memory within the limit and no register spills. Top-k uses the first
# entry for float32 tiles.
_HARD_TABLE: dict[str, dict[int, list[tuple[int, int, int, int]]]] = {
    "sm90": {
        64: [(64, 64, 4, 2), (128, 64, 8, 2), (128, 32, 4, 3)],
        128: [(64, 64, 4, 2), (128, 64, 8, 2), (128, 32, 4, 3)],
    },
    "sm80": {
        64: [(64, 64, 4, 2), (128, 64, 8, 2), (128, 32, 4, 3)],
        128: [(64, 64, 4, 2), (128, 64, 8, 2)],
    },
    "sm89": {
        64: [(64, 64, 4, 2), (128, 64, 8, 2), (128, 32, 4, 3)],
        128: [(64, 64, 4, 2)],
    },
    "sm75": {64: [(64, 64, 4, 2), (128, 64, 8, 2)], 128: [(32, 32, 4, 2)]},
}
# Argmax only (SAMPLE=False): no Philox draws or logs in the loop, so its registers
# leave room for 128 x 128 tiles, which issue about a fifth fewer instructions per
# score than 128 x 64 on sm_90 (4.78 vs 5.84 per thread, machine_code.sass.per_score,
# d = 128, bf16). Sampling at 128 x 128 spills (about 1 KB per thread), so those tiles
# are argmax's alone; on sm_80 at d = 128 the causal argmax spills too.
_ARGMAX_EXTRA: dict[str, dict[int, list[tuple[int, int, int, int]]]] = {
    "sm90": {64: [(128, 128, 8, 2)], 128: [(128, 128, 8, 2)]},
    "sm80": {64: [(128, 128, 8, 2)], 128: []},
}
# float32 inputs (IEEE FMA dot products need the most registers), every architecture
_HARD_FP32: dict[int, tuple[int, int, int, int]] = {
    64: (64, 64, 4, 2),
    128: (32, 32, 4, 2),
}
# top-k, by TOPK_PAD (<= 64 or 128): the (BLOCK_M, TOPK_PAD) buffer lives in registers
_TOPK_TABLE: dict[str, dict[int, list[tuple[int, int, int, int]]]] = {
    "sm90": {
        64: [(32, 64, 4, 2), (64, 64, 4, 2), (64, 32, 4, 2)],
        128: [(32, 64, 4, 2)],
    },
    "sm80": {
        64: [(32, 64, 4, 2), (64, 64, 4, 2), (64, 32, 4, 2)],
        128: [(32, 64, 4, 2)],
    },
    "sm89": {
        64: [(32, 64, 4, 2), (64, 64, 4, 2), (64, 32, 4, 2)],
        128: [(32, 64, 4, 2)],
    },
    "sm75": {64: [(32, 64, 4, 2), (64, 32, 4, 2)], 128: [(32, 64, 4, 2)]},
}
INTERPRET_CONFIG = (64, 64, 4, 1)  # the one config used under the Triton interpreter


def configs(
    kind: str,
    capability: tuple[int, int],
    head_dim: int,
    dtype=torch.float16,
    topk: int = 16,
    sample: bool = False,
) -> list[tuple[int, int, int, int]]:
    """Shipped (BLOCK_M, BLOCK_N, num_warps, num_stages) for kind "hard" (argmax, or
    Gumbel sampling with ``sample``) or "topk" (``topk`` in 1..MAX_TOPK). Bad arguments
    (an unknown kind, a head dim outside 1..MAX_HEAD_DIM) are refused naming them."""
    if kind not in ("hard", "topk"):
        raise ValueError(f"kind must be 'hard' or 'topk', got {kind!r}")
    check_head_dim(head_dim, MAX_HEAD_DIM)
    common.check_int("topk", topk)
    if not 1 <= topk <= MAX_TOPK:
        raise ValueError(f"topk must be in 1..{MAX_TOPK}, got {topk}")
    arch = arch_class(capability)
    # float32 tiles: float32 inputs, and bf16 on sm_75 (upcast: no bf16 tensor cores)
    fp32_tiles = dtype == torch.float32 or common.upcast_on(dtype, capability)
    if kind == "hard":
        d_class = 64 if block_d(head_dim) <= 64 else 128
        if fp32_tiles:
            return [_HARD_FP32[d_class]]
        extra = [] if sample else _ARGMAX_EXTRA.get(arch, {}).get(d_class, [])
        return list(_HARD_TABLE[arch][d_class]) + extra
    table = _TOPK_TABLE[arch][64 if triton.next_power_of_2(topk) <= 64 else 128]
    return list(table[:1] if fp32_tiles else table)


def _all_configs(kind: str) -> list[triton.Config]:
    """Every config any architecture ships (the pruner keeps the current GPU's list)."""
    if runtime.INTERPRET:
        tables = [[INTERPRET_CONFIG]]
    else:
        tables = (_HARD_TABLE if kind == "hard" else _TOPK_TABLE).values()
        tables = [cs for t in tables for cs in t.values()]
        if kind == "hard":
            tables.append(list(_HARD_FP32.values()))
            tables += [cs for t in _ARGMAX_EXTRA.values() for cs in t.values()]
    seen = sorted({c for cs in tables for c in cs})
    return [
        triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=st)
        for bm, bn, w, st in seen
    ]


def _pruner(kind: str):
    def prune(configs_, named_args, **kwargs):
        if runtime.INTERPRET:
            return configs_
        q = named_args["Q"]
        args = {**named_args, **kwargs}
        allowed = set(
            configs(
                kind,
                torch.cuda.get_device_capability(q.device),
                args["HEAD_DIM"],
                q.dtype,
                args.get("TOPK_PAD", 16),
                bool(args.get("SAMPLE", False)),
            )
        )
        return [
            c
            for c in configs_
            if (c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages)
            in allowed
        ]

    return {"early_config_prune": prune}
