"""kernels.ring.allgather on real gloo ranks: all-gather context parallelism forward
and backward (GQA, causal zig-zag and non-causal contiguous, an uneven length) and
decoding against a KV cache sharded over the ranks (uneven slices), each against float64
attention of the whole sequence in one process. One spawn of 2 ranks runs every case
(starting processes costs seconds); every collective waits at most the group's timeout
and run_local's watchdog bounds the rest."""

from __future__ import annotations

import math

import torch

from kernels import runtime  # noqa: F401  (first: decides CUDA vs interpreter)
from kernels.ring import shard
from kernels.ring.allgather import allgather_attention, sharded_decode
from kernels.ring.launch import run_local

CASES = [(45, 4, 2, 16, True, "zigzag"), (37, 2, 2, 16, False, "contiguous")]
SLICES = [13, 20]  # the decode cache: 33 keys, rank 0 holds 13, rank 1 holds 20


def _data(n, h, h_kv, d, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, h, n, d, generator=g)
    k, v = torch.randn(2, 1, h_kv, n, d, generator=g)
    return q, k, v, torch.randn(1, h, n, d, generator=g)


def _dense(q, k, v, causal):
    """fp64 attention, GQA by repeating K/V heads: (B, H, N, d)."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        n = q.shape[2]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    return s.softmax(-1) @ v


def _decode_data(seed=7):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 2, 4, 16, generator=g)  # (B, N_q, H, d)
    k, v = torch.randn(2, 1, sum(SLICES), 2, 16, generator=g)  # (B, N, H_kv, d)
    return q, k, v


def _rank(rank, world_size):
    out = []
    for i, (n, h, h_kv, d, causal, layout) in enumerate(CASES):
        q, k, v, do = _data(n, h, h_kv, d, seed=i)
        mine = [shard(t, rank, world_size, layout).requires_grad_() for t in (q, k, v)]
        o = allgather_attention(*mine, causal=causal, layout=layout)
        (o * shard(do, rank, world_size, layout)).sum().backward()
        out.append((o, *(t.grad for t in mine)))
    q, k, v = _decode_data()
    lo = sum(SLICES[:rank])
    sl = slice(lo, lo + SLICES[rank])
    out.append(sharded_decode(q, k[:, sl], v[:, sl]))
    return out


def test_allgather_and_sharded_decode_on_two_gloo_ranks():
    ranks = run_local(_rank, 2, timeout=120)
    for i, (n, h, h_kv, d, causal, layout) in enumerate(CASES):
        q, k, v, do = _data(n, h, h_kv, d, seed=i)
        leaves = [t.double().requires_grad_() for t in (q, k, v)]
        ref = _dense(*leaves, causal)
        (ref * do.double()).sum().backward()
        want = [ref.detach(), *(t.grad for t in leaves)]
        for r, got in enumerate(ranks):
            for name, g_r, w in zip(("o", "dq", "dk", "dv"), got[i], want):
                w_r = shard(w, r, 2, layout)
                err = (g_r.double() - w_r).abs().max().item()
                # fp32 kernels: the flash kernel's own error bound at these sizes
                assert err < 1e-4, (i, r, name, err)
    q, k, v = _decode_data()
    qq = q.double().transpose(1, 2)  # (B, H, N_q, d)
    kk, vv = (t.double().transpose(1, 2) for t in (k, v))  # (B, H_kv, N, d)
    want = _dense(qq, kk, vv, causal=False).transpose(1, 2)  # every key visible
    for r, got in enumerate(ranks):
        o, lse = got[-1]
        assert o.shape == q.shape and lse.shape == (1, 4, 2)
        assert (o.double() - want).abs().max().item() < 1e-4, r


def test_one_process_is_one_kernel_call_and_bad_arguments_are_named():
    q, k, v, _ = _data(20, 2, 1, 16, seed=3)
    o = allgather_attention(q, k, v, causal=True)  # no process group: P = 1
    ref = _dense(q.double(), k.double(), v.double(), causal=True)
    assert (o.double() - ref).abs().max().item() < 1e-4
    o_d, lse = sharded_decode(q.transpose(1, 2)[:, :1], k.transpose(1, 2),
                              v.transpose(1, 2))  # fmt: skip
    assert o_d.shape == (1, 1, 2, 16) and lse.shape == (1, 2, 1)
    for bad, match in (
        (dict(k=k[:, :, :5]), "same positions"),
        (dict(layout="diagonal"), "layout"),
    ):
        args = dict(q=q, k=k, v=v, causal=False, layout="contiguous") | bad
        try:
            allgather_attention(**args)
        except (ValueError, TypeError) as err:
            assert match in str(err)
        else:
            raise AssertionError(f"{bad} was accepted")
