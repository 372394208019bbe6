"""The FlashAttention kernel inside a real model: all-MiniLM-L6-v2's six layers with
``kernels.flash.flash_attention`` in place of the NumPy attention give the sentence
embedding of the NumPy forward, with an error against a float64 forward at most twice
the float32 NumPy forward's own (the flash-attn rule the kernel's tests use)."""

from __future__ import annotations

import numpy as np
import torch

import kernels  # noqa: F401  (first: CUDA or the Triton interpreter)
from attention import pretrained
from kernels import runtime
from kernels.flash import flash_attention


def flash_attend(q, k, v):
    t = [
        torch.from_numpy(np.ascontiguousarray(x)).to(runtime.DEVICE) for x in (q, k, v)
    ]
    return flash_attention(*t).cpu().numpy(), None


def test_minilm_with_the_kernel_embeds_as_numpy():
    model = pretrained.load_minilm()
    text = "Attention, please."  # short: the interpreter runs one program per tile
    got = model.embed([text], attend=flash_attend)
    want32 = model.embed([text])
    want64 = model.astype(np.float64).embed([text])
    assert got.dtype == np.float32 and got.shape == (1, 384)
    err, ref_err = np.abs(got - want64).max(), np.abs(want32 - want64).max()
    assert err <= 2 * ref_err + 1e-7, (err, ref_err)
    h, p = model.forward(text, attend=flash_attend)
    assert p is None and h.shape == (len(model.tokens(text)), 384)
