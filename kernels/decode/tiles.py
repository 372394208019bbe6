"""Tile tables of the split-KV decode kernels: (BLOCK_N, num_warps, num_stages) per
architecture class and padded head dim, the query-row block ``block_m`` (GQA group x
new tokens, at most ``MAX_BLOCK_M``), ``tiles``, ``block_n`` (lowered to the page size)
and ``supported``. Every entry is compiled for its target by
``kernels.decode.compile_check``.
"""

from __future__ import annotations

import torch
import triton

# the shared jit blocks of the flash kernels, and their architecture classes
from ..common import ARCHS, arch_class, block_d

__all__ = [
    "ARCHS",
    "MAX_BLOCK_M",
    "MLA_TILES",
    "block_d",
    "block_r",
    "block_m",
    "block_n",
    "max_block_m",
    "mla_supported",
    "supported",
    "tiles",
]


#: At most this many query rows (GQA group x new tokens) per program: more rows are
#: split over programs that read the same K/V tiles (L2 serves the repeats).
MAX_BLOCK_M = 64

#: (BLOCK_N, num_warps, num_stages) per architecture class and padded head dim, for
#: fp16/bf16 tiles of BLOCK_M <= 32 query rows; BLOCK_M = 64 uses 8 warps. Every entry
#: is compiled for its target by ``kernels.decode.compile_check`` (no spills).
#: Decode is bound by HBM bandwidth: the tiles aim at keeping enough K/V bytes in flight
#: per SM (BLOCK_N x BLOCK_D x 2 tensors x (num_stages - 1)), within shared memory.
_TABLE: dict[str, dict[int, tuple[int, int, int]]] = {
    "sm90": {
        16: (64, 4, 3),
        32: (64, 4, 3),
        64: (64, 4, 4),
        128: (64, 4, 3),
        256: (32, 4, 3),
    },
    "sm80": {
        16: (64, 4, 3),
        32: (64, 4, 3),
        64: (64, 4, 4),
        128: (64, 4, 3),
        256: (32, 4, 3),
    },
    "sm89": {
        16: (64, 4, 3),
        32: (64, 4, 3),
        64: (64, 4, 2),
        128: (64, 4, 2),
        256: (32, 4, 2),
    },
}
#: CUDA-core (FMA) dots: every dtype on sm_75 (Triton >= 3.2 has no tensor-core path
#: there) and float32 inputs everywhere. FMA dots hold operand rows in registers.
# (At BLOCK_D = 128, 4 warps spill on sm_75; at BLOCK_D = 256 a 64-row block needs
# more than sm_75's 64 KB of shared memory and spills: such blocks are 32 rows.)
_FMA_TABLE: dict[int, tuple[int, int, int]] = {
    16: (32, 4, 2),
    32: (32, 4, 2),
    64: (32, 4, 2),
    128: (16, 8, 2),
    256: (16, 8, 1),
}
#: Under the Triton interpreter: one small tile (the interpreter's cost is per op).
INTERPRET_TILES = (16, 4, 1)

#: MLA (one latent row a token, V its first head_dim_v columns, read once for K and
#: V): (BLOCK_N, num_warps, num_stages) per architecture class at head_dim_v <= 512,
#: with at most ``MLA_MAX_BLOCK_M`` query rows a program. The K tile is BLOCK_N x
#: (512 + 64) (two dots: the 512 columns shared with V, the 64 rope columns); the
#: fp32 accumulator BLOCK_M x 512 is what limits the rows (compiled without spills by
#: ``kernels.decode.compile_check``).
#: No sm_75 entry: its CUDA-core dots stage the 16 x 512 tiles in shared memory, and
#: every tile tried needs more than Turing's 64 KB (``mla_supported``).
MLA_TILES: dict[str, tuple[int, int, int]] = {
    "sm90": (32, 8, 2),
    "sm80": (32, 8, 2),
    "sm89": (32, 8, 2),
}
MLA_MAX_BLOCK_M = 16


def mla_supported(capability: tuple[int, int] | None) -> bool:
    """Whether an MLA tile is shipped for the GPU (all but sm_75; the interpreter)."""
    return capability is None or arch_class(capability) in MLA_TILES


def _fma(capability, dtype) -> bool:
    return arch_class(capability) == "sm75" or dtype == torch.float32


def block_r(rope_dim: int) -> int:
    """The MLA rope columns' tile: the next power of two, at least 16."""
    return max(16, triton.next_power_of_2(max(rope_dim, 1)))


def max_block_m(
    capability: tuple[int, int] | None,
    head_dim: int,
    dtype: torch.dtype = torch.float16,
    mla: bool = False,
) -> int:
    """The most query rows a program holds: ``MAX_BLOCK_M``; 16 for float32 (its
    CUDA-core dots spill with more rows); 32 for fp16/bf16 on sm_75 at BLOCK_D = 256;
    ``MLA_MAX_BLOCK_M`` for MLA (``head_dim`` is then head_dim_v).
    """
    if capability is None:
        return MAX_BLOCK_M
    if mla:
        return MLA_MAX_BLOCK_M
    if dtype == torch.float32:
        return 16
    if _fma(capability, dtype) and block_d(head_dim) >= 256:
        return 32
    return MAX_BLOCK_M


def supported(
    capability: tuple[int, int] | None, head_dim: int, dtype: torch.dtype
) -> bool:
    """Whether a compiled tile is shipped: not float32 at head dims above 128 on a GPU
    (every CUDA-core tile spills registers there on sm_80/89/90)."""
    return capability is None or dtype != torch.float32 or block_d(head_dim) <= 128


def block_m(group: int, n_q: int, most: int = MAX_BLOCK_M) -> int:
    """Query rows per program: the group's G x N_q rows padded to a power of two, at
    least 16 (the smallest tl.dot tile), at most ``most``."""
    return min(max(16, triton.next_power_of_2(group * n_q)), most)


def tiles(
    capability: tuple[int, int] | None,
    head_dim: int,
    bm: int,
    dtype: torch.dtype = torch.float16,
    mla: bool = False,
    fp8: bool = False,
    transforms: bool = False,
) -> tuple[int, int, int]:
    """(BLOCK_N, num_warps, num_stages) shipped for a GPU (``capability``; None under
    the interpreter), head dim, BLOCK_M and dtype (q's), for MLA (``head_dim`` =
    head_dim_v) and for an fp8 cache (the same tiles: its tiles are upcast to q's
    dtype after loading, so registers and shared memory hold what a 16-bit cache's
    do; half its bytes cross HBM). ``transforms`` (softcap or ALiBi: more live fp32
    score tiles) halves the key tile of 64-row blocks on tensor cores, and of every
    block on sm_89 (they spill otherwise)."""
    if capability is None:
        return INTERPRET_TILES
    if mla:
        return MLA_TILES[arch_class(capability)]
    bd = block_d(head_dim)
    if _fma(capability, dtype):
        bn, w, s = _FMA_TABLE[bd]
    else:
        bn, w, s = _TABLE[arch_class(capability)][bd]
    if bm >= 64:
        w = 8
    if transforms and not _fma(capability, dtype):
        if bm >= 64 or arch_class(capability) == "sm89":
            bn = min(bn, 32)
    return bn, w, s


def block_n(
    capability,
    head_dim: int,
    bm: int,
    dtype,
    page_size: int | None,
    mla: bool = False,
    fp8: bool = False,
    transforms: bool = False,
) -> int:
    """The key tile: the table's, lowered to the page size when pages are a smaller
    power of two (then a tile never straddles two pages and needs one block-table
    entry)."""
    bn = tiles(capability, head_dim, bm, dtype, mla, fp8, transforms)[0]
    if page_size is not None and page_size & (page_size - 1) == 0 and page_size >= 16:
        bn = min(bn, page_size)
    return bn
