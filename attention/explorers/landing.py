"""The landing page's explorer: standard attention against FlashAttention-2 (forward),
HBM bytes per tensor as N and the tiles change, each bar with its compulsory traffic
as a tick. On the site a twin over chapter 2's grids; in Jupyter, chapter 2's tile-size
explorer at the teaser's start (same settings declaration, ``tile_size.SETTINGS``).
"""

from __future__ import annotations

from . import site
from .common import bars_floor_spec, dtypes
from .settings import check
from .site import Explorer
from .tile_size import (
    SETTINGS,
    TILE_B,
    TILE_N,
    compulsory_grid,
    live_tile_size_explorer,
    tensor_names_of,
    tile_grid,
)


def static_teaser(d: int = 64, dtype: str = "float16") -> Explorer:
    """The landing page's explorer: standard attention against FlashAttention-2
    (forward), HBM bytes per tensor as N and the tiles change (from
    ``memory.closed_form``), each bar with its compulsory traffic as a tick
    (``memory.compulsory``: what HBM sees when L2 holds the re-reads), as chapter 2's
    tile-size explorer, its live twin, draws them."""
    check(SETTINGS, d=d, dtype=dtype)
    algorithms = ["standard", "flash2"]
    grid = tile_grid(ds=[d], algorithms=algorithms)
    bpe = dict(dtypes())[dtype]
    tensors = tensor_names_of(grid, algorithms)
    config = {
        "grid": grid,
        "bpe": bpe,
        "dtype": dtype,
        "compulsory": compulsory_grid(ds=[d], algorithms=algorithms),
        "init": {
            "N": TILE_N.index(4096),
            "Br": TILE_B.index(64),
            "Bc": TILE_B.index(64),
        },
        "specs": {"bars": bars_floor_spec(tensors, height=220)},
    }
    return Explorer(
        "teaser",
        config,
        "Standard attention against FlashAttention-2",
        "explorers.teaser()",
    )


def live_teaser(d: int = 64, dtype: str = "float16"):
    """The landing page's explorer in Jupyter: the tile-size explorer at N = 4096,
    Br = Bc = 64 (the static teaser's start), where standard attention and
    FlashAttention-2 stand side by side with FlashAttention-1. Returns the box."""
    check(SETTINGS, d=d, dtype=dtype)
    return live_tile_size_explorer(N=4096, d=d, Br=64, Bc=64, dtype=dtype)


def teaser(d: int = 64, dtype: str = "float16"):
    """The landing page: standard attention against FlashAttention-2, HBM bytes per
    tensor as N and the tiles change (in Jupyter: the tile-size explorer there)."""
    face = static_teaser if site.ON_SITE else live_teaser
    return face(d=d, dtype=dtype)


__all__ = ["teaser"]
