"""The book's explorers: one call per explorer, live in Jupyter and Colab, static on
the built site.

site     ``ON_SITE`` (true while the site is built), ``tqdm`` (silent there), the
         ``Explorer`` page object and the Sphinx hook that vendors Vega into the build
live     the ipywidgets explorers, redrawn by Python (``attention.plots``, ``memory``)
static   their static twins: data computed when the chapter executes, drawn in the
         browser by ``_static/explorers.js``
data     the grids behind the twins (``memory.closed_form``, ``simulate``, ...)
specs    the twins' Vega-Lite specs
decode   chapter 5's explorer (decoding with a KV cache), its data, twin and widget in
         one module
ring     chapter 6's explorer (context parallelism across GPUs), the same way
blockmask  chapter 7's explorer (masks, block masks and the work they save), the same
         way
maps     chapter 1's pictures: the trained attention maps, the masks
pretrained  chapter 1's real model: MiniLM's heads on the chapter's sentences
softmax  chapter 2's: the online softmax block by block, the roofline
estimators  chapter 3's: REINFORCE, with a baseline, Gumbel-softmax straight-through
sampling chapter 4's: DAT's and MSDA's sampling points on the photograph

A chapter calls ``explorers.tile_size_explorer(...)``; the switch between the two
media lives here (``site.ON_SITE``, read at each call), not in the chapter. Each call
takes the same arguments in both; on the site they must be points of the twin's grid
(``data.TILE_N``, ``data.SRAM_KIB``, ...).
"""

from __future__ import annotations

from . import live, site, static
from .blockmask import block_mask_explorer
from .decode import decode_explorer
from .estimators import estimator_explorer
from .maps import attention_map_explorer, map_task, mask_explorer
from .pretrained import pretrained_explorer
from .ring import context_parallel_explorer
from .sampling import sampling_points_explorer
from .site import ON_SITE, tqdm
from .softmax import online_softmax_explorer, roofline_explorer

__all__ = [
    "ON_SITE",
    "attention_map_explorer",
    "block_mask_explorer",
    "context_parallel_explorer",
    "decode_explorer",
    "deformable_traffic_explorer",
    "estimator_explorer",
    "map_task",
    "mask_explorer",
    "naive_traffic_explorer",
    "online_softmax_explorer",
    "pretrained_explorer",
    "roofline_explorer",
    "sampling_points_explorer",
    "teaser",
    "temperature_explorer",
    "tile_size_explorer",
    "topk_traffic_explorer",
    "tqdm",
]


def _medium():
    """``static`` while the site is built, ``live`` otherwise."""
    return static if site.ON_SITE else live


def naive_traffic_explorer(
    n: int = 1024, m: int | None = None, d: int = 64, dtype: str = "float16"
):
    """Chapter 1: bytes of standard attention against the key length n per tensor,
    and the per-tensor split at (m, n); ``m=None`` is self-attention (m = n)."""
    return _medium().naive_traffic_explorer(n=n, m=m, d=d, dtype=dtype)


def tile_size_explorer(
    N: int = 1024,
    d: int = 64,
    sram_kib: int = 192,
    Br: int = 64,
    Bc: int = 64,
    dtype: str = "float16",
    algorithm: str = "flash2",
):
    """Chapter 2: HBM traffic of the forward (or backward) algorithms beside their
    compulsory traffic, the SRAM need against ``sram_kib`` KiB, FA1's rule and the
    schedule over the tiles of S, step by step."""
    return _medium().tile_size_explorer(
        N=N, d=d, sram_kib=sram_kib, Br=Br, Bc=Bc, dtype=dtype, algorithm=algorithm
    )


def teaser(d: int = 64, dtype: str = "float16"):
    """The landing page: standard attention against FlashAttention-2, HBM bytes per
    tensor as N and the tiles change (in Jupyter: the tile-size explorer there)."""
    return _medium().teaser(d=d, dtype=dtype)


def temperature_explorer(
    scores=None, noise=None, tau: float = 1.0, row: int = 0, seed: int = 0
):
    """Chapter 3: y = softmax((s + g) / tau) over a temperature slider, with the SAME
    scores and Gumbel noise at every tau (random (8, 12) ones from ``seed`` where
    None), and one query row beside softmax(s)."""
    return _medium().temperature_explorer(
        scores=scores, noise=noise, tau=tau, row=row, seed=seed
    )


def topk_traffic_explorer(N: int = 4096, d: int = 64, k: int = 8):
    """Chapter 3: HBM traffic of soft, hard and top-k attention against N, and per
    tensor at N."""
    return _medium().topk_traffic_explorer(N=N, d=d, k=k)


def deformable_traffic_explorer(
    side: int = 64, d: int = 32, r: int = 4, n_points: int = 4, n_levels: int = 4
):
    """Chapter 4: per-tensor traffic of dense, DAT (factor ``r``) and MSDA
    (``n_points`` per level, ``n_levels`` levels) on a ``side`` x ``side`` map, and the
    totals against the map side."""
    return _medium().deformable_traffic_explorer(
        side=side, d=d, r=r, n_points=n_points, n_levels=n_levels
    )
