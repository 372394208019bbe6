"""PyTorch's own context parallelism beside ring_attention, on a local gloo group.

``torch.distributed.tensor.experimental.context_parallel`` (a prototype in torch 2.x)
shards buffers along the sequence and patches ``F.scaled_dot_product_attention`` so
that, inside the context, SDPA on the shards runs ring attention over the device mesh.
Its default layout for causal balance is the "head-tail" split (chunk r and chunk
2P-1-r of 2P equal chunks: this package's "zigzag"), used when N is a multiple of 2P.
It rotates K/V by all-gather (the default) or all-to-all
(``set_rotate_method``), not by point-to-point sends, and it dispatches to the fused
SDPA backends of CUDA (flash, memory-efficient, cuDNN); the CPU SDPA op has no
ring rule. On a CPU with gloo (torch 2.13) causal raises NotImplementedError (no
sharding strategy for ``aten._scaled_dot_product_flash_attention_for_cpu``);
non-causal runs through DTensor's generic sharding propagation over the op's
decomposition (correct, not a ring; its first call is far slower than later ones).

:func:`compare_context_parallel` runs both on a local gloo group and reports what
happened: the largest difference between the two outputs and against an fp64
reference, or the exact error torch raised.
"""

from __future__ import annotations

import torch

from .launch import run_local


def _cp_rank(
    rank: int,
    world_size: int,
    n: int,
    causal: bool,
    heads: int,
    head_dim: int,
    seed: int,
) -> dict:
    """On each rank: torch's context_parallel and ring_attention (zigzag) on the same
    shards of one random fp32 sequence; differences of this rank's rows."""
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel

    from ..naive import reference_attention
    from .api import ring_attention
    from .checks import _inputs
    from .layout import shard

    q, k, v, _ = _inputs(n, heads, heads, head_dim, seed)  # (1, H, N, d) float32
    ref, _ = reference_attention(q.double(), k.double(), v.double(), causal)
    ref = shard(ref, rank, world_size, "zigzag")  # (1, H, N_local, d) float64
    mine = ring_attention(
        *(shard(t, rank, world_size, "zigzag") for t in (q, k, v)),
        causal=causal,
        layout="zigzag",
    )
    out = dict(rank=rank, ring_vs_fp64=(mine.double() - ref).abs().max().item())
    mesh = init_device_mesh("cpu", (world_size,))
    bq, bk, bv = q.clone(), k.clone(), v.clone()  # sharded in place by the context
    try:
        with context_parallel(mesh, buffers=[bq, bk, bv], buffer_seq_dims=[2, 2, 2]):
            theirs = F.scaled_dot_product_attention(bq, bk, bv, is_causal=causal)
    except Exception as err:  # noqa: BLE001 - the measurement is the error itself
        out["error"] = f"{type(err).__name__}: {err}"
        return out
    out["torch_vs_fp64"] = (theirs.double() - ref).abs().max().item()
    out["torch_vs_ring"] = (theirs.double() - mine.double()).abs().max().item()
    return out


def compare_context_parallel(
    world_size: int = 2,
    n: int = 32,
    causal: bool = False,
    heads: int = 2,
    head_dim: int = 16,
    seed: int = 0,
    timeout: float = 60.0,
) -> dict:
    """Run torch's context_parallel and ring_attention on ``world_size`` gloo ranks.

    ``n`` must be a multiple of 2 * world_size (torch's head-tail layout, equal to
    the zigzag layout, applies only then). Returns a dict: ``ran`` (bool), ``error``
    (torch's exception as "Type: message", or None), ``torch_vs_ring``,
    ``torch_vs_fp64`` (max abs differences over all ranks' rows, None if torch
    raised), ``ring_vs_fp64``, and the setup (torch version, backend, device, shapes).
    """
    if not isinstance(n, int) or n < 2 * world_size or n % (2 * world_size):
        raise ValueError(
            f"n must be a positive multiple of 2 * world_size = "
            f"{2 * world_size}, got {n!r}"
        )
    ranks = run_local(
        _cp_rank, world_size, n, causal, heads, head_dim, seed, timeout=timeout
    )
    errors = [r["error"] for r in ranks if "error" in r]
    ran = not errors

    def worst(key):
        return max(r[key] for r in ranks) if ran else None

    return dict(
        ran=ran,
        error=errors[0] if errors else None,
        torch_vs_ring=worst("torch_vs_ring"),
        torch_vs_fp64=worst("torch_vs_fp64"),
        ring_vs_fp64=max(r["ring_vs_fp64"] for r in ranks),
        torch=torch.__version__,
        backend="gloo",
        device="cpu",
        world_size=world_size,
        shape=(1, heads, n, head_dim),
        causal=causal,
        layout="zigzag (torch: head-tail)",
    )
