"""Shared by the flash kernel tests: random inputs and fp64 reference gradients."""

import torch

from kernels import runtime
from kernels.naive import reference_attention

DEVICE = runtime.DEVICE


def qkv(B, H, H_kv, N_q, N_k, d, dtype=torch.float32, seed=0, scale=1.0, grad=False):
    g = torch.Generator().manual_seed(seed)
    ts = [
        torch.randn(shape, generator=g) * scale
        for shape in ((B, H, N_q, d), (B, H_kv, N_k, d), (B, H_kv, N_k, d))
    ]
    return [t.to(device=DEVICE, dtype=dtype).requires_grad_(grad) for t in ts]


def ref_grads(q, k, v, do, causal, scale=None):
    """fp64 outputs, lse and gradients of reference_attention."""
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    o, lse = reference_attention(q64, k64, v64, causal, scale)
    grads = torch.autograd.grad(o, (q64, k64, v64), do.double())
    return o.detach(), lse, grads


def max_err(a, b):
    return (a.double() - b.double()).abs().max().item()
