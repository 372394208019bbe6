"""Softcap keeps its relative accuracy at every cap (issue 50, item 4): the tanh of
kernels.flex's ``softcap`` mod (forward and its derivative in the backward) and of
kernels.decode's ``softcap`` keyword, against float64.

tanh computed as 1 - 2 / (e^(2x) + 1) cancels for small x = score / cap: at a cap of
1,000 a score of 1 kept 4 of its bits (flex output off by 6.5e-5), at 10^6 none (off by
0.04). Caps far above the scores are a no-op in exact arithmetic, so the kernel must
agree with the fp64 reference as closely with them as without a cap: a few 1e-7 here
(fp32 inputs, <= 64 keys of O(1) terms), bounded by 1e-5.
"""

from __future__ import annotations

import math

import pytest
import torch
import triton
import triton.language as tl

from kernels import runtime
from kernels.decode import attention_with_kvcache, blocks
from kernels.flex import (
    create_block_mask,
    flex_attention,
    mods,
    sliding_window,
    softcap,
)

CAPS = [1.0, 30.0, 50.0, 1e3, 1e6]
FLEX_TANH, DECODE_TANH = mods.tanh, blocks.tanh  # one helper: decode imports flex's
TOL = 1e-5
U32 = 2.0**-24


@triton.jit
def _tanh_kernel(x_ptr, flex_ptr, decode_ptr, N: tl.constexpr):
    offs = tl.arange(0, N)
    x = tl.load(x_ptr + offs)
    tl.store(flex_ptr + offs, FLEX_TANH(x))
    tl.store(decode_ptr + offs, DECODE_TANH(x))


def _points() -> torch.Tensor:
    """fp32 x across every scale, both signs, subnormals, 0, +-inf and NaN."""
    mag = torch.logspace(-44, 1.6, 2000, dtype=torch.float64).float()
    mag = torch.cat([mag, torch.tensor([0.2999, 0.3, 0.3001, 20.0, 50.0, 1e30])])
    x = torch.cat([mag, -mag, torch.tensor([0.0, math.inf, -math.inf, math.nan])])
    return torch.nn.functional.pad(x, (0, 4096 - x.numel()))


def test_the_kernels_tanh_is_accurate_relative_to_x_at_every_scale():
    x = _points().to(runtime.DEVICE)
    got_flex, got_decode = torch.empty_like(x), torch.empty_like(x)
    _tanh_kernel[(1,)](x, got_flex, got_decode, N=x.numel())
    want = torch.tanh(x.double())
    for name, got in (("flex", got_flex), ("decode", got_decode)):
        got = got.double()
        same_nan = torch.isnan(got) == torch.isnan(want)
        assert bool(same_nan.all()), name
        fin = ~torch.isnan(want)
        rel = ((got - want)[fin].abs() / want[fin].abs().clamp_min(1e-300)).max()
        assert rel < 8 * U32, (name, rel.item())  # measured 3.3 u32
        assert torch.equal(
            torch.signbit(got[fin & (x != 0)]), torch.signbit(x[fin & (x != 0)])
        )


def _flex_inputs(q_scale: float):
    g = torch.Generator().manual_seed(50)
    q = torch.randn(1, 2, 64, 16, generator=g) * q_scale
    k = torch.randn(1, 2, 64, 16, generator=g)
    v = torch.randn(1, 2, 64, 16, generator=g)
    return [t.requires_grad_(True) for t in (q, k, v)]


def _flex_reference(q, k, v, cap, vis):
    q, k, v = q.double(), k.double(), v.double()
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    s = cap * torch.tanh(s / cap)
    s = s.masked_fill(~vis, -math.inf)
    lse = torch.logsumexp(s, -1)
    return torch.softmax(s, -1) @ v, lse


@pytest.mark.parametrize("q_scale", [3.0, 1e-3], ids=["scores", "small-scores"])
@pytest.mark.parametrize("cap", CAPS)
def test_flex_softcap_forward_and_backward_at_every_cap(cap, q_scale):
    q, k, v = _flex_inputs(q_scale)
    bm = create_block_mask(sliding_window(40), None, None, 64, 64, BLOCK_SIZE=16)
    qi, ki = torch.arange(64)[:, None], torch.arange(64)[None, :]
    vis = (qi >= ki) & (qi - ki < 40)
    o, lse = flex_attention(
        q, k, v, score_mod=softcap(cap), block_mask=bm, return_lse=True
    )
    ro, rl = _flex_reference(q, k, v, cap, vis)
    assert (o.double() - ro).abs().max() < TOL
    assert (lse.double() - rl).abs().max() < TOL
    do = torch.randn(o.shape, generator=torch.Generator().manual_seed(7))
    got = torch.autograd.grad((o * do).sum() + lse.sum(), (q, k, v))
    want = torch.autograd.grad((ro * do).sum() + rl.sum(), (q, k, v))
    for name, a, b in zip("qkv", got, want):
        err = (a.double() - b).abs().max().item()
        assert err < TOL * max(1.0, b.abs().max().item()), (name, err)


@pytest.mark.parametrize("q_scale", [3.0, 1e-3], ids=["scores", "small-scores"])
@pytest.mark.parametrize("cap", CAPS)
def test_decode_softcap_at_every_cap(cap, q_scale):
    g = torch.Generator().manual_seed(51)
    B, n_q, h, d, n = 2, 2, 2, 16, 48
    q = torch.randn(B, n_q, h, d, generator=g) * q_scale
    k = torch.randn(B, n, h, d, generator=g)
    v = torch.randn(B, n, h, d, generator=g)
    lens = torch.tensor([48, 29], dtype=torch.int32)
    dev = runtime.DEVICE
    o, lse = attention_with_kvcache(
        q.to(dev), k.to(dev), v.to(dev), lens.to(dev), softcap=cap, return_lse=True
    )
    for b, L in enumerate(lens.tolist()):
        s = torch.einsum("thd,jhd->htj", q[b].double(), k[b, :L].double())
        s = cap * torch.tanh(s / math.sqrt(d) / cap)
        i = torch.arange(L - n_q, L)[:, None]
        s = s.masked_fill(torch.arange(L)[None, :] > i, -math.inf)  # causal
        ro = torch.einsum("htj,jhd->thd", torch.softmax(s, -1), v[b, :L].double())
        assert (o[b].cpu().double() - ro).abs().max() < TOL, b
        assert (lse[b].cpu().double() - torch.logsumexp(s, -1)).abs().max() < TOL, b
