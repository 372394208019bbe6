"""Host-side checks shared by every FlashAttention launch.

Argument validation (``check_inputs``: shapes, dtypes, devices, the softmax scale), the
dtype rules of the dot products (``upcast``, ``dot_precision``) and the device-side
NaN/inf flags that switch the causal launches to their pair-by-pair path.
"""

from __future__ import annotations

import torch

from ..common import FLOAT_DTYPES, check_device, check_tensor, kernel_scale
from .tiles import MAX_HEAD_DIM


def check_inputs(q, k, v, scale, name: str = "softmax_scale") -> float:
    """Check q (B, H, N_q, d), k/v (B, H_kv, N_k, d); return the softmax scale (errors
    about the scale name ``name``, the caller's argument)."""
    for arg, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(arg, t)
        if t.ndim != 4:
            raise ValueError(
                f"{arg} must be 4-D (B, H, N, d), got shape {tuple(t.shape)}"
            )
        if t.dtype not in FLOAT_DTYPES:
            raise TypeError(
                f"{arg} must be float16, bfloat16 or float32, got dtype {t.dtype}"
            )
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(
            f"q, k, v must share a dtype, got q {q.dtype}, k {k.dtype}, v {v.dtype}"
        )
    if not (q.device == k.device == v.device):
        raise ValueError(
            f"q, k, v must be on one device, got q {q.device}, "
            f"k {k.device}, v {v.device}"
        )
    check_device("q, k, v", q.device)
    B, H, N_q, d = q.shape
    if k.shape != v.shape:
        raise ValueError(
            f"k and v must have the same shape, got k {tuple(k.shape)} "
            f"and v {tuple(v.shape)}"
        )
    Bk, H_kv, N_k, dk = k.shape
    if Bk != B:
        raise ValueError(
            f"k batch {Bk} (shape {tuple(k.shape)}) does not match "
            f"q batch {B} (shape {tuple(q.shape)})"
        )
    if dk != d:
        raise ValueError(
            f"k head dim {dk} (shape {tuple(k.shape)}) does not match "
            f"q head dim {d} (shape {tuple(q.shape)})"
        )
    if not 1 <= d <= MAX_HEAD_DIM:
        raise ValueError(
            f"head dim d must be in 1..{MAX_HEAD_DIM}, got q shape {tuple(q.shape)}"
        )
    if N_q < 1 or N_k < 1:
        raise ValueError(
            f"sequence lengths must be >= 1, got q {tuple(q.shape)}, k {tuple(k.shape)}"
        )
    if B < 1 or H_kv < 1 or H % H_kv != 0:
        raise ValueError(
            f"q heads H={H} must be a positive multiple of k/v heads "
            f"H_kv={H_kv} (q {tuple(q.shape)}, k {tuple(k.shape)})"
        )
    # finite, and scale * log2(e) (folded into the kernels' exp2 scores) within fp32
    return kernel_scale(scale, d, name)


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
