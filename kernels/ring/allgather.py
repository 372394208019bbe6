"""All-gather context parallelism and decoding against a sharded KV cache, on
torch.distributed: the two variants chapter 6 runs beside the ring.

Spec sheet
----------
Algorithm
    ``allgather_attention`` (Llama 3's context parallelism; the default rotation of
    PyTorch's ``context_parallel``): one all-gather gives every rank the K/V shards of
    all ranks, put back in global order; each contiguous run [s, e) of this rank's
    queries (one run for ``contiguous``, two for ``zigzag``) is one causal
    ``kernels.flash.flash_attention`` call against keys [0, e) (the kernel's
    bottom-right causal alignment is then the global mask), or one non-causal call
    against all keys. The backward is autograd's: the flash backward per run, then
    the gathered K/V's gradient summed over the ranks and each rank's own rows kept
    (a reduce-scatter; done as an fp32 all_reduce and a slice, which gloo supports).
    ``sharded_decode``: every rank holds a slice of one KV cache and the same new
    queries; each runs chapter 5's ``kernels.decode.attention_with_kvcache`` on its
    slice (returning (o, lse)), one all-gather collects the P partials and
    ``merge_partials`` merges them: one log-sum-exp reduction.
Shapes and dtypes
    ``allgather_attention``: q (B, H, N_local, d), k, v (B, H_kv, N_local, d), as
    ``ring_attention``; o (B, H, N_local, d) in q's dtype. ``sharded_decode``: q
    (B, N_q, H, d) (the same on every rank), k_cache, v_cache (B, n_r, H_kv, d), this
    rank's slice (n_r may differ between ranks, 0 included); returns o (B, N_q, H, d)
    in q's dtype and lse (B, H, N_q) float32, identical on every rank. Head dims and
    dtypes as ``kernels.flash`` and ``kernels.decode``.
Process groups
    Any group (default: the world); one rank or no process group is one kernel call.
    One small all_gather agrees on the shard lengths (zigzag requires the split rule's
    lengths). Every collective is posted asynchronously and waited with the group's
    timeout on the CPU (gloo's bare wait is not bounded by it); NCCL's watchdog bounds
    it on CUDA.
Known limits
    The gathered K/V (2 N H_kv d elements) are resident during attention; the gather is
    not overlapped with compute. No sliding window or document masks beyond causal.
    ``sharded_decode`` is forward only (inference).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..common import check_bool
from ..decode import attention_with_kvcache
from ..flash import flash_attention
from .blocks import _wait_timeout, group_size, merge_partials
from .layout import check_layout, shard_intervals

__all__ = ["allgather_attention", "check_allgather", "sharded_decode"]


def _wait(work, group, device):
    timeout = _wait_timeout(group, device)
    work.wait(timeout) if timeout is not None else work.wait()


def _all_gather(x: torch.Tensor, group) -> list[torch.Tensor]:
    """All-gather of equal-shape tensors, waited with the group's timeout."""
    bufs = [torch.empty_like(x) for _ in range(group_size(group)[0])]
    _wait(dist.all_gather(bufs, x.contiguous(), group=group, async_op=True), group,
          x.device)  # fmt: skip
    return bufs


class _GatherSequence(torch.autograd.Function):
    """Forward: every rank's (..., n_r, d) concatenated in rank order along axis -2
    (padded to the longest shard for the collective). Backward: the sum over ranks of
    the gradient, this rank's rows kept."""

    @staticmethod
    def forward(ctx, x, group, lengths, rank):
        longest = max(lengths)
        pad = x.new_zeros(x.shape[:-2] + (longest, x.shape[-1]))
        pad[..., : x.shape[-2], :] = x
        bufs = _all_gather(pad, group)
        ctx.group, ctx.lengths, ctx.rank, ctx.dtype = group, lengths, rank, x.dtype
        return torch.cat([b[..., :n, :] for b, n in zip(bufs, lengths)], dim=-2)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.float().contiguous()  # partial sums of every rank, in fp32
        _wait(dist.all_reduce(grad, group=ctx.group, async_op=True), ctx.group,
              grad.device)  # fmt: skip
        start = sum(ctx.lengths[: ctx.rank])
        mine = grad[..., start : start + ctx.lengths[ctx.rank], :]
        return mine.to(ctx.dtype), None, None, None


def allgather_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    group=None,
    layout: str = "contiguous",
    softmax_scale: float | None = None,
) -> torch.Tensor:
    """Attention of this rank's query shard over the whole sequence, K/V all-gathered.

    Arguments as ``kernels.ring.ring_attention`` (q (B, H, N_local, d); k, v (B, H_kv,
    N_local, d); ``layout`` "contiguous" or "zigzag"). Returns o (B, H, N_local, d),
    differentiable in q, k, v.
    """
    causal = check_bool("causal", causal)
    layout = check_layout(layout)
    if k.shape[2] != q.shape[2] or v.shape[2] != q.shape[2]:
        raise ValueError(
            f"k and v must hold the same positions as q: q {tuple(q.shape)}, "
            f"k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    P, rank = group_size(group)
    if P == 1:
        return flash_attention(q, k, v, causal, softmax_scale)
    mine = torch.tensor([q.shape[2]], dtype=torch.int64, device=q.device)
    lengths = [int(t.item()) for t in _all_gather(mine, group)]
    n = sum(lengths)
    if layout == "contiguous":
        starts = [sum(lengths[:r]) for r in range(P)]
        segs = [[(s, s + m)] for s, m in zip(starts, lengths)]
    else:
        segs = [shard_intervals(n, r, P, layout) for r in range(P)]
        expected = [sum(e - s for s, e in sg) for sg in segs]
        if lengths != expected:
            raise ValueError(
                f"q: shard lengths {lengths} over the ranks are not the zigzag split "
                f"of {n} positions (expected {expected}; use kernels.ring.shard)"
            )
    kv = _GatherSequence.apply(torch.stack((k, v)), group, lengths, rank)
    order = torch.cat([torch.arange(s, e) for sg in segs for s, e in sg])
    kv = kv[..., torch.argsort(order).to(q.device), :]  # (2, B, H_kv, N, d), global
    outs, row = [], 0
    for s, e in segs[rank]:
        q_run = q[:, :, row : row + e - s]  # this run's queries, positions [s, e)
        row += e - s
        keys = slice(0, e) if causal else slice(0, n)
        outs.append(
            flash_attention(q_run, kv[0, :, :, keys], kv[1, :, :, keys], causal,
                            softmax_scale)
        )  # fmt: skip
    return torch.cat(outs, dim=2)


def sharded_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    group=None,
    softmax_scale: float | None = None,
):
    """Decode against a KV cache sharded over the ranks by sequence.

    q (B, N_q, H, d), the same new queries on every rank; k_cache, v_cache (B, n_r,
    H_kv, d): this rank's slice of the cache (every cached key visible to every new
    query). Returns (o (B, N_q, H, d), lse (B, H, N_q) float32), the same on every rank.
    """
    B, n_r = k_cache.shape[0], k_cache.shape[1]
    seqlens = torch.full((B,), n_r, dtype=torch.int32, device=q.device)
    o, lse = attention_with_kvcache(
        q, k_cache, v_cache, seqlens, causal=False, softmax_scale=softmax_scale,
        return_lse=True,
    )  # fmt: skip
    P, _ = group_size(group)
    o = o.transpose(1, 2).float()  # (B, H, N_q, d)
    if P == 1:
        return o.transpose(1, 2).to(q.dtype), lse
    parts_o = torch.stack(_all_gather(o, group))  # (P, B, H, N_q, d)
    parts_lse = torch.stack(_all_gather(lse.float(), group))  # (P, B, H, N_q)
    o, lse = merge_partials(parts_o, parts_lse)  # one log-sum-exp reduction
    return o.transpose(1, 2).to(q.dtype), lse


# --------------------------------------------------------------------------------------
# The chapter's check: both variants on a local process group against float64
# --------------------------------------------------------------------------------------
def _dense64(q, k, v, causal):
    """float64 attention of a whole sequence, GQA by repeated K/V heads."""
    rep = q.shape[1] // k.shape[1]
    q, k, v = q.double(), k.double().repeat_interleave(rep, 1), v.double()
    v = v.repeat_interleave(rep, 1)
    s = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    if causal:
        hidden = torch.ones(s.shape[-2:], dtype=torch.bool).triu(1)
        s = s.masked_fill(hidden, float("-inf"))
    return s.softmax(-1) @ v


def _check_rank(rank, world_size, n, heads, kv_heads, head_dim, n_cache, seed):
    from .layout import shard

    g = torch.Generator().manual_seed(seed)
    q, k, v, do = (
        torch.randn(1, h, n, head_dim, generator=g)
        for h in (heads, kv_heads, kv_heads, heads)
    )
    leaves = [t.double().requires_grad_() for t in (q, k, v)]
    ref = _dense64(*leaves, causal=True)
    (ref * do.double()).sum().backward()
    mine = [shard(t, rank, world_size, "zigzag").requires_grad_() for t in (q, k, v)]
    o = allgather_attention(*mine, causal=True, layout="zigzag")
    (o * shard(do, rank, world_size, "zigzag")).sum().backward()
    errs = {}
    for name, got, want in zip(
        ("o", "dq", "dk", "dv"),
        (o, *(t.grad for t in mine)),
        (ref.detach(), *(t.grad for t in leaves)),
    ):
        want = shard(want, rank, world_size, "zigzag")
        errs[f"all-gather {name}"] = (got.double() - want).abs().max().item()
    q1 = torch.randn(1, 1, heads, head_dim, generator=g)  # (B, N_q, H, d)
    kc, vc = torch.randn(2, 1, n_cache, kv_heads, head_dim, generator=g)
    bounds = torch.linspace(0, n_cache, world_size + 1).long().tolist()
    lo, hi = bounds[rank], bounds[rank + 1]
    o1, _ = sharded_decode(q1, kc[:, lo:hi], vc[:, lo:hi])
    want1 = _dense64(q1.transpose(1, 2), kc.transpose(1, 2), vc.transpose(1, 2), False)
    errs["sharded decode o"] = (o1.double() - want1.transpose(1, 2)).abs().max().item()
    return errs


def check_allgather(
    world_size: int = 2,
    n: int = 45,
    heads: int = 4,
    kv_heads: int = 2,
    head_dim: int = 16,
    n_cache: int = 1000,
    seed: int = 0,
    timeout: float = 120.0,
) -> dict:
    """Run ``allgather_attention`` (causal zigzag, forward and backward) and
    ``sharded_decode`` (a cache of ``n_cache`` keys in ``world_size`` slices) on a
    local gloo group (``kernels.ring.launch.run_local``); returns the largest error of
    each output against float64 attention of the whole sequence, over all ranks."""
    from .launch import run_local

    ranks = run_local(
        _check_rank, world_size, n, heads, kv_heads, head_dim, n_cache, seed,
        timeout=timeout,
    )  # fmt: skip
    return {key: max(r[key] for r in ranks) for key in ranks[0]}
