"""Sequence layouts for ring attention: which global positions each rank holds.

Two layouts of a sequence of N positions over P ranks (``world_size``):

``"contiguous"``
    The sequence cut into P chunks in order; rank r holds chunk r.
``"zigzag"``
    The sequence cut into 2P chunks; rank r holds chunks r and 2P-1-r, in that order
    (so rank 0 holds the first and the last chunk). Under a causal mask every rank then
    has the same work (Striped/zig-zag balancing): an early chunk, which sees few keys,
    paired with a late one, which sees many.

Split rule (uneven N)
    A sequence of N positions cut into n chunks gives chunk c the length
    ``N // n + (1 if c < N % n else 0)`` (the first ``N % n`` chunks are one longer),
    as ``torch.tensor_split`` and ``numpy.array_split`` do. Every chunk must hold at
    least one position: N >= P (contiguous) or N >= 2P (zigzag).

:func:`shard` and :func:`unshard` are exact inverses: ``unshard([shard(x, r, P, L)
for r in range(P)], L)`` returns ``x`` bit for bit.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..common import check_int

#: the sequence layouts ring attention accepts
LAYOUTS = ("contiguous", "zigzag")


def check_layout(layout) -> str:
    if not isinstance(layout, str) or layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    return layout


def check_world(rank, world_size) -> None:
    """Raise naming ``world_size`` or ``rank`` unless 0 <= rank < world_size."""
    check_int("world_size", world_size)
    check_int("rank", rank)
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in 0..{world_size - 1}, got {rank}")


def n_chunks(world_size: int, layout: str) -> int:
    """How many chunks the sequence is cut into: P (contiguous) or 2P (zigzag)."""
    return world_size * (2 if check_layout(layout) == "zigzag" else 1)


def chunk_bounds(n: int, chunks: int) -> list[tuple[int, int]]:
    """[start, end) of each of ``chunks`` chunks of a length-``n`` sequence (the split
    rule: the first ``n % chunks`` chunks are one longer)."""
    base, extra = divmod(n, chunks)
    bounds, start = [], 0
    for c in range(chunks):
        end = start + base + (1 if c < extra else 0)
        bounds.append((start, end))
        start = end
    return bounds


def check_length(n: int, world_size: int, layout: str, name: str = "x") -> None:
    need = n_chunks(world_size, layout)
    if n < need:
        raise ValueError(
            f"{name}: a sequence of {n} positions cannot be split over "
            f"world_size={world_size} ranks with layout={layout!r} "
            f"(needs at least {need}: one position per chunk)"
        )


def shard_intervals(
    n: int, rank: int, world_size: int, layout: str
) -> list[tuple[int, int]]:
    """The global [start, end) ranges rank ``rank`` of ``world_size`` holds under
    ``layout``, in local order (the torch side's twin of
    ``attention.ring.shard_intervals``)."""
    check_world(rank, world_size)
    check_length(n, world_size, layout, "n")
    bounds = chunk_bounds(n, n_chunks(world_size, layout))
    if layout == "contiguous":
        return [bounds[rank]]
    return [bounds[rank], bounds[2 * world_size - 1 - rank]]


def local_length(n: int, rank: int, world_size: int, layout: str) -> int:
    """How many positions rank ``rank`` holds."""
    return sum(e - s for s, e in shard_intervals(n, rank, world_size, layout))


def positions(n: int, rank: int, world_size: int, layout: str) -> torch.Tensor:
    """(N_local,) int64: the global position of each local row of rank ``rank``."""
    return torch.cat(
        [torch.arange(s, e) for s, e in shard_intervals(n, rank, world_size, layout)]
    )


def _check_dim(x: torch.Tensor, dim, name: str) -> int:
    check_int("dim", dim)
    if not -x.ndim <= dim < x.ndim:
        raise ValueError(
            f"dim must be in {-x.ndim}..{x.ndim - 1} for {name} of "
            f"shape {tuple(x.shape)}, got {dim}"
        )
    return dim % x.ndim


def shard(
    x: torch.Tensor,
    rank: int,
    world_size: int,
    layout: str = "contiguous",
    dim: int = 2,
) -> torch.Tensor:
    """Rank ``rank``'s shard of the full sequence ``x`` (sequence along ``dim``).

    Args:
        x: any tensor with the sequence along ``dim``; (B, H, N, d) with dim=2 is the
            book's layout.
        rank, world_size: 0 <= rank < world_size.
        layout: "contiguous" or "zigzag" (see the module docstring for the split rule).
    Returns:
        A new contiguous tensor holding the rank's positions in local order; its length
        along ``dim`` is :func:`local_length`.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    check_layout(layout)
    check_world(rank, world_size)
    dim = _check_dim(x, dim, "x")
    check_length(x.shape[dim], world_size, layout, "x")
    parts = [
        x.narrow(dim, s, e - s)
        for s, e in shard_intervals(x.shape[dim], rank, world_size, layout)
    ]
    return torch.cat(parts, dim=dim).contiguous()


def unshard(
    shards: Sequence[torch.Tensor], layout: str = "contiguous", dim: int = 2
) -> torch.Tensor:
    """Put the full sequence back from every rank's shard (``shards[r]`` from rank r).

    The inverse of :func:`shard`: the shards' lengths must be those the split rule gives
    for their total (ValueError naming ``shards`` otherwise), and they must agree in
    every other dimension, dtype and device.
    """
    check_layout(layout)
    if isinstance(shards, torch.Tensor) or not isinstance(shards, Sequence):
        raise TypeError(
            f"shards must be a list of tensors (one per rank), got "
            f"{type(shards).__name__}"
        )
    if len(shards) == 0:
        raise ValueError("shards must hold one tensor per rank, got an empty list")
    for r, t in enumerate(shards):
        if not isinstance(t, torch.Tensor):
            raise TypeError(
                f"shards[{r}] must be a torch.Tensor, got {type(t).__name__}"
            )
    first = shards[0]
    dim = _check_dim(first, dim, "shards[0]")
    for r, t in enumerate(shards):
        other = [s for i, s in enumerate(t.shape) if i != dim]
        ref = [s for i, s in enumerate(first.shape) if i != dim]
        if t.ndim != first.ndim or other != ref:
            raise ValueError(
                f"shards must agree in every dim but {dim}: shards[{r}] "
                f"has shape {tuple(t.shape)}, shards[0] "
                f"{tuple(first.shape)}"
            )
        if t.dtype != first.dtype:
            raise TypeError(
                f"shards must share a dtype: shards[{r}] is {t.dtype}, "
                f"shards[0] {first.dtype}"
            )
        if t.device != first.device:
            raise ValueError(
                f"shards must share a device: shards[{r}] is on "
                f"{t.device}, shards[0] on {first.device}"
            )
    world_size = len(shards)
    n = sum(t.shape[dim] for t in shards)
    check_length(n, world_size, layout, "shards")
    lengths = [t.shape[dim] for t in shards]
    expected = [local_length(n, r, world_size, layout) for r in range(world_size)]
    if lengths != expected:
        raise ValueError(
            f"shards: lengths {lengths} along dim {dim} are not the "
            f"{layout!r} split of {n} positions over {world_size} ranks "
            f"(expected {expected})"
        )
    pieces: dict[int, torch.Tensor] = {}
    for r, t in enumerate(shards):
        offset = 0
        for s, e in shard_intervals(n, r, world_size, layout):
            pieces[s] = t.narrow(dim, offset, e - s)
            offset += e - s
    return torch.cat([pieces[s] for s in sorted(pieces)], dim=dim)
