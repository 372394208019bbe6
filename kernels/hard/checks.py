"""Argument checks of hard and top-k attention: flash_attention's checks
(:func:`kernels.flash.check_inputs`) on q, k, v and the softmax scale, this family's
head-dim limit, N_k = 0 allowed (every row empty), and the causal flag.
"""

from __future__ import annotations

import torch

from ..common import check_bool
from ..flash import check_inputs as flash_check_inputs
from .tiles import MAX_HEAD_DIM


def check_inputs(q, k, v, causal, scale, name: str = "softmax_scale") -> float:
    """The checks of ``flash_attention`` (kernels/flash/checks.py), plus this module's
    head-dim limit. N_k = 0 is allowed (every row is empty): the other checks run on
    a one-key stand-in."""
    if (
        isinstance(k, torch.Tensor)
        and isinstance(v, torch.Tensor)
        and k.ndim == 4
        and k.shape == v.shape
        and k.shape[2] == 0
    ):
        k, v = (t.new_zeros(t.shape[:2] + (1,) + t.shape[3:]) for t in (k, v))
    scale = flash_check_inputs(q, k, v, scale, name)
    if q.shape[-1] > MAX_HEAD_DIM:
        raise ValueError(
            f"head dim d must be in 1..{MAX_HEAD_DIM}, got q shape {tuple(q.shape)}"
        )
    check_bool("causal", causal)
    return scale
