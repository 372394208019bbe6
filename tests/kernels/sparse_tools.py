"""Shared by the sparse kernel tests: random selections and an fp64 reference written
here from the definition (the keys of the chosen blocks, causal bottom-right), with
its autograd gradients."""

from __future__ import annotations

import math

import torch

from kernels import runtime

DEVICE = runtime.DEVICE


def inputs(B, H, H_kv, N_q, N_k, d, dtype=torch.float32, seed=0, d_v=None):
    g = torch.Generator().manual_seed(seed)
    shapes = ((B, H, N_q, d), (B, H_kv, N_k, d), (B, H_kv, N_k, d_v or d))
    return [torch.randn(s, generator=g).to(DEVICE, dtype) for s in shapes]


def random_indices(B, H_kv, N_q, n_blocks, S, seed=0, pad=0.3):
    """(B, H_kv, N_q, S) int32: S distinct blocks per row in random order (S <=
    n_blocks), each entry -1 with probability ``pad`` (random budgets)."""
    g = torch.Generator().manual_seed(seed)
    rows = [torch.randperm(n_blocks, generator=g)[:S] for _ in range(B * H_kv * N_q)]
    idx = torch.stack(rows).view(B, H_kv, N_q, S)
    drop = torch.rand(idx.shape, generator=g) < pad
    return torch.where(drop, -1, idx).to(DEVICE, torch.int32)


def keep_mask(idx, N_k, block_size, causal):
    """(B, H_kv, N_q, N_k) bool: key j is kept iff its block j // block_size is in
    the row's list (padding -1 matches nothing) and, causal, j <= i + N_k - N_q."""
    N_q = idx.shape[2]
    blk = torch.arange(N_k, device=idx.device) // block_size
    keep = (idx[..., :, None] == blk).any(-2)  # (B, H_kv, N_q, N_k)
    if causal:
        pos = torch.arange(N_q, device=idx.device)[:, None] + (N_k - N_q)
        keep &= torch.arange(N_k, device=idx.device)[None, :] <= pos
    return keep


def reference(q, k, v, idx, block_size, causal, scale=None):
    """(o, lse) in fp64, differentiable: softmax over the kept keys; o = 0 and lse =
    -inf for a row with none."""
    g = q.shape[1] // k.shape[1]
    keep = keep_mask(idx, k.shape[2], block_size, causal).repeat_interleave(g, 1)
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = (q @ k.transpose(-1, -2) * scale).masked_fill(~keep, float("-inf"))
    m = s.amax(-1, keepdim=True).detach()
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(s - m)
    l = e.sum(-1, keepdim=True)
    p = e / torch.where(l > 0, l, torch.ones_like(l))
    o = p @ v
    return o, (torch.log(l) + m)[..., 0]


def ref_grads(q, k, v, idx, block_size, causal, do, dlse=None, scale=None):
    """fp64 o, lse and the gradients of sum(o do) (+ sum(lse dlse) over finite
    lse)."""
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    o, lse = reference(q64, k64, v64, idx, block_size, causal, scale)
    loss = (o * do.double()).sum()
    if dlse is not None:
        loss = loss + torch.where(torch.isfinite(lse), lse * dlse.double(), 0).sum()
    grads = torch.autograd.grad(loss, (q64, k64, v64))
    return o.detach(), lse.detach(), grads


def max_err(a, b):
    return (a.double() - b.double()).abs().max().item()
