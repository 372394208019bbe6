"""Host-side checks shared by every FlashAttention launch.

Argument validation (``check_inputs``: shapes, dtypes, devices, the softmax scale) and
the device-side NaN/inf flags that switch the causal launches to their pair-by-pair
path. The dtype rules of the dot products are the house's, ``kernels.common.upcast``
and ``dot_precision``.
"""

from __future__ import annotations

import torch

from ..common import FLOAT_DTYPES, check_qkv, kernel_scale
from .tiles import MAX_HEAD_DIM


def check_inputs(q, k, v, scale, name: str = "softmax_scale") -> float:
    """Check q (B, H, N_q, d), k/v (B, H_kv, N_k, d) (``kernels.common.check_qkv``:
    float16/bfloat16/float32, one dtype and device, d in 1..MAX_HEAD_DIM); return the
    softmax scale (errors about the scale name ``name``, the caller's argument)."""
    check_qkv(q, k, v, dtypes=FLOAT_DTYPES, max_head_dim=MAX_HEAD_DIM)
    # finite, and scale * log2(e) (folded into the kernels' exp2 scores) within fp32
    return kernel_scale(scale, q.shape[-1], name)


def _nonfinite_flag(causal, *tensors, nan_only=()) -> torch.Tensor:
    """(1,) int32 on the tensors' device: 1 if one of ``tensors`` holds a NaN or inf,
    or one of ``nan_only`` a NaN (read by causal launches only, which then sum the
    masked tiles pair by pair; computed on the device, no host sync).

    One float32 sum per tensor instead of an elementwise test: a NaN or inf makes the
    sum non-finite. A sum of finite values that overflows fp32 also sets the flag: the
    kernels then take the slow, equally exact path.
    """
    device = tensors[0].device
    if not causal:
        return torch.zeros(1, dtype=torch.int32, device=device)
    total = sum(t.sum(dtype=torch.float32) for t in tensors)
    bad = ~torch.isfinite(total)
    for t in nan_only:  # lse: -inf marks an empty row, only NaN matters
        bad = bad | torch.isnan(t.sum(dtype=torch.float32))
    return bad.to(torch.int32).reshape(1)


def _grad_flag(causal, q, k, v, do, lse2, dlse=None) -> torch.Tensor:
    """The backward's flag: a NaN/inf in q, k, v, dO or dlse, or a NaN in lse (its -inf
    marks an empty row)."""
    return _nonfinite_flag(
        causal, q, k, v, do, *(() if dlse is None else (dlse,)), nan_only=(lse2,)
    )


def _v_bad(v: torch.Tensor, causal) -> torch.Tensor:
    """The forward's flag: a NaN/inf in v (a hidden k row is masked by selection)."""
    return _nonfinite_flag(causal, v)
