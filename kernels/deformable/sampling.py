"""What both deformable kernels share: constants, bilinear sampling, host checks.

The ``@triton.jit`` bilinear helpers (corner weights, the four corner rows of a
sample, their scatter in the backward), the dtype and head-dim limits, ``_block_d``,
``_capability`` and the tensor check ``_check_float``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import runtime
from ..common import FLOAT_DTYPES, LOG2E  # noqa: F401  (LOG2E: the family's exp2 factor)

MAX_HEAD_DIM = 128
#: No software pipelining: the gathers' addresses depend on the points, and
#: multi-buffering four corner tiles per map costs more shared memory than it hides
#: (164 KB at d = 128, fp32).
NUM_STAGES = 1
_FLOAT_DTYPES = FLOAT_DTYPES
#: MSDA also takes float64 (Deformable DETR's own tests run in it): gathers and FMAs
#: only, no tensor-core dot, so the kernel simply computes in fp64 then.
_MSDA_DTYPES = _FLOAT_DTYPES + (torch.float64,)


# --------------------------------------------------------------------------------------
# Bilinear sampling helpers (shared by both kernels)
# --------------------------------------------------------------------------------------


@triton.jit
def _bilinear_setup(px, py):
    """Integer top-left corner and fractional parts of pixel coordinates (px, py)."""
    x0f = tl.floor(px)
    y0f = tl.floor(py)
    lx = px - x0f  # weight of the right neighbour
    ly = py - y0f  # weight of the lower neighbour
    return x0f.to(tl.int32), y0f.to(tl.int32), lx, ly


@triton.jit
def _corner_rows(
    base, xi, yi, W, H, stride_y, stride_x, offs_d, stride_d, mask_r, mask_d
):
    """Gather one corner for a block of samples: (BLOCK, BLOCK_D) fp32, 0 outside the
    map."""
    inside = (xi >= 0) & (xi < W) & (yi >= 0) & (yi < H) & mask_r
    ptrs = (
        base
        + (yi.to(tl.int64) * stride_y + xi.to(tl.int64) * stride_x)[:, None]
        + offs_d[None, :] * stride_d
    )
    return tl.load(ptrs, mask=inside[:, None] & mask_d[None, :], other=0.0).to(
        tl.float32
    )


@triton.jit
def _corner_scatter(
    base, xi, yi, W, H, stride_y, stride_x, offs_d, mask_r, mask_d, val
):
    """atomic_add a (BLOCK, BLOCK_D) tile into one corner of a contiguous fp32 map.

    Relaxed: a sum needs no ordering against other memory, only atomicity, so no fence
    (``MEMBAR.ALL.GPU``, a round trip to L2) is issued around each add, as the default
    ``acq_rel`` would."""
    inside = (xi >= 0) & (xi < W) & (yi >= 0) & (yi < H) & mask_r
    ptrs = (
        base
        + (yi.to(tl.int64) * stride_y + xi.to(tl.int64) * stride_x)[:, None]
        + offs_d[None, :]
    )
    tl.atomic_add(ptrs, val, mask=inside[:, None] & mask_d[None, :], sem="relaxed")


def _block_d(head_dim: int) -> int:
    return max(16, triton.next_power_of_2(head_dim))


def _capability(device: torch.device) -> tuple[int, int] | None:
    """The GPU's compute capability, or None when the kernels run under the
    interpreter."""
    if runtime.INTERPRET or device.type != "cuda":
        return None
    return tuple(torch.cuda.get_device_capability(device))


def _check_float(name: str, t, ndim: int, shape_doc: str, dtypes=_FLOAT_DTYPES) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        names = ", ".join(str(x).replace("torch.", "") for x in dtypes)
        raise TypeError(f"{name} must be one of {names}, got {t.dtype}")
    if t.dim() != ndim:
        raise ValueError(f"{name} must be {shape_doc}, got shape {tuple(t.shape)}")
