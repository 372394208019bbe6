"""Tile tables and limits of the deformable kernels: head-dim and dtype limits,
``msda_config`` (MSDA's query rows and warps per program), ``dat_config`` (DAT's
BLOCK_M x BLOCK_N tiles), ``dot_fp32`` and the padded channel block ``_block_d``.
Each shipped config is compiled ahead of time for its target by the tests'
compile check (tests/kernels/test_deformable.py).
"""

from __future__ import annotations

import torch
import triton

from .. import runtime
from ..common import FLOAT_DTYPES, dot_precision, upcast_on

MAX_HEAD_DIM = 128


#: No software pipelining: the gathers' addresses depend on the points, and
#: multi-buffering four corner tiles per map costs more shared memory than it hides
#: (164 KB at d = 128, fp32).
NUM_STAGES = 1


_FLOAT_DTYPES = FLOAT_DTYPES


#: MSDA also takes float64 (Deformable DETR's own tests run in it): gathers and FMAs
#: only, no tensor-core dot, so the kernel simply computes in fp64 then.
_MSDA_DTYPES = _FLOAT_DTYPES + (torch.float64,)


def _block_d(head_dim: int) -> int:
    return max(16, triton.next_power_of_2(head_dim))


def _capability(device: torch.device) -> tuple[int, int] | None:
    """The GPU's compute capability, or None when the kernels run under the
    interpreter."""
    if runtime.INTERPRET or device.type != "cuda":
        return None
    return tuple(torch.cuda.get_device_capability(device))


#: MSDA walks the value head dim in blocks of at most this many channels on a GPU (any
#: D_h works); under the interpreter, where every tile op costs Python overhead, in one
#: block up to this many (the tests lower it to exercise the channel loop).
MSDA_MAX_BLOCK_D = 128


MSDA_INTERPRET_MAX_BLOCK_D = 4096


#: The MSDA kernels ``msda_config`` sizes.
MSDA_KERNELS = ("fwd", "bwd")


def msda_config(
    kernel: str,
    n_rows: int,
    head_dim: int,
    capability: tuple[int, int] | None,
    fp32: bool = False,
) -> tuple[int, int]:
    """(BLOCK_Q, num_warps) for ``"fwd"`` or ``"bwd"`` over ``n_rows = B * L_q * H``
    rows.

    Under the interpreter (``capability`` None): big tiles (fewer, vectorised programs).
    On a GPU the forward takes 32 queries per program when there are enough rows to fill
    the SMs (and D_h <= 64 in 16-bit), otherwise 16; the backward, whose four corner
    scatters hold more registers, always 16. An unknown ``kernel`` is a ValueError
    listing the names.
    """
    if kernel not in MSDA_KERNELS:
        raise ValueError(f"kernel must be one of {MSDA_KERNELS}, got {kernel!r}")
    if capability is None:
        return 64, 4
    if kernel == "fwd" and n_rows >= 32 * 1024 and head_dim <= 64 and not fp32:
        return 32, 4
    return 16, 4


def _interpret_rows(block_q: int, l_q: int, device) -> int:
    """Under the interpreter, no wider query tile than the queries need (at least
    16)."""
    if _capability(device) is None:
        return min(block_q, max(16, triton.next_power_of_2(l_q)))
    return block_q


def _msda_block_d(head_dim: int, capability: tuple[int, int] | None = None) -> int:
    """Channels per block of the MSDA kernels: the padded head dim, at most 128 on a GPU
    (the kernels loop over channel blocks for larger head dims)."""
    top = MSDA_INTERPRET_MAX_BLOCK_D if capability is None else MSDA_MAX_BLOCK_D
    return max(16, min(_block_d(head_dim), top))


def dot_fp32(dtype: torch.dtype, capability: tuple[int, int] | None) -> bool:
    """fp32 dot products: fp32 inputs (``common.dot_precision``'s IEEE dots), bf16 where
    ``common.upcast_on`` upcasts it (the interpreter, ``capability`` None, and below
    sm_80), and every dtype under the interpreter (fp16 too: its dots there take the
    sampled k and v in fp32)."""
    return (
        dot_precision(dtype) == "ieee"
        or capability is None
        or upcast_on(dtype, capability)
    )


def dat_config(
    kernel: str,
    n_s: int,
    head_dim: int,
    capability: tuple[int, int] | None,
    fp32_dots: bool = False,
    n_q: int | None = None,
) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps) for ``"fwd"``, ``"dkdv"`` or ``"dq"``.

    Under the interpreter (``capability`` None): up to 64 samples per tile, and 64
    queries, or a quarter of ``n_q`` (rounded up to a power of two) up to 1,024 where
    that is more: fewer programs run faster there (every tile op costs Python
    overhead: chapter 4's 64 x 64 map, 4,096 queries, runs forward and backward in
    about 1 s at 1,024 against 12 s at 64), and a long map still spans four query tiles
    (the tests' small maps keep 64). sm_80/sm_90: 64 x 32 with 8 warps, 32 x 16 when
    the dots run in fp32 (``fp32_dots``: twice the registers per element). sm_75:
    64 x 16, and 32 x 16 for fp32 dots or d > 64 (its 64 KB of shared memory). The dkdv
    kernel, which holds dk̃, dṽ and the corner gathers at once, drops to 16 x 16 with
    4 warps above d = 64 (d = 32 on sm_75). With ``NUM_STAGES = 1`` these fit shared
    memory and do not spill registers for d <= 128 and fp16/bf16/fp32 on sm_80 and
    sm_90, and for d <= 64 on sm_75 (``tests/kernels/test_deformable.py`` compiles a
    representative subset ahead of time).
    BLOCK_N is at least 16, the smallest tl.dot tile on a GPU.
    """
    if capability is None:
        rows = (
            64 if n_q is None else min(1024, max(64, triton.next_power_of_2(n_q) // 4))
        )
        return rows, min(64, max(16, triton.next_power_of_2(n_s))), 4
    if capability[0] >= 8:
        if kernel == "dkdv" and head_dim > 64:
            return 16, 16, 4
        return (32, 16, 8) if fp32_dots else (64, 32, 8)
    if kernel == "dkdv" and head_dim > 32:
        return 16, 16, 4
    return (32, 16, 8) if fp32_dots or head_dim > 64 else (64, 16, 8)
