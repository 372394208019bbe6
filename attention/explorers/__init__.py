"""The book's explorers: one call per explorer, live in Jupyter and Colab, static on
the built site.

Every explorer is one module holding its data (the grids its static twin sends to the
page), its Vega-Lite specs, its static twin ``static_<call>``, its ipywidgets face
``live_<call>`` and its one public call ``<call>``, which gives the twin while the site
is built (``site.ON_SITE``, read at each call) and the widgets elsewhere; both faces
first check the call's arguments against the module's settings declaration
(``settings.check``: a ValueError naming a setting outside its choices or range).

naive_traffic       chapter 1: HBM bytes of standard attention against n, m, d, dtype
maps                chapter 1: the trained attention maps, and the masks
tile_size           chapter 2: the tile-size explorer (traffic, SRAM, the schedule)
landing             the landing page: standard attention against FlashAttention-2
online_softmax      chapter 2: the online softmax block by block
roofline            chapter 2: the roofline of one attention head
temperature         chapter 3: the Gumbel-softmax temperature
topk_traffic        chapter 3: soft, hard and top-k traffic
estimators          chapter 3: REINFORCE, with a baseline, Gumbel-softmax ST
deformable_traffic  chapter 4: dense, DAT and MSDA traffic
sampling            chapter 4: DAT's and MSDA's sampling points on the photograph
decode              chapter 5: decoding with a KV cache
ring                chapter 6: context parallelism across GPUs
blockmask           chapter 7: masks, block masks and the work they save
pretrained          chapter 1: a real model's heads (MiniLM) on the chapter's sentences
causal_lm           chapter 1: a causal language model's heads (SmolLM2): maps,
                    induction, previous-token and first-token scores
sparse              chapter 8: the blocks a sparse attention picks, the mass they keep

settings  the one settings check both faces call (``Choice``, ``Range``, ``check``)
common    what the explorers share: the Vega-Lite frame, the traffic bars and lines,
          the live faces' figure swap
site      ``ON_SITE``, ``tqdm`` (silent there), the ``Explorer`` page object and the
          Sphinx hook that vendors Vega into the build
"""

from __future__ import annotations

from . import site
from .blockmask import block_mask_explorer
from .causal_lm import causal_lm_explorer
from .decode import decode_explorer
from .deformable_traffic import deformable_traffic_explorer
from .estimators import estimator_explorer
from .landing import teaser
from .maps import attention_map_explorer, map_task, mask_explorer
from .naive_traffic import naive_traffic_explorer
from .online_softmax import online_softmax_explorer
from .pretrained import pretrained_explorer
from .ring import context_parallel_explorer
from .roofline import roofline_explorer
from .sampling import sampling_points_explorer
from .site import ON_SITE, tqdm
from .sparse import sparse_explorer
from .temperature import temperature_explorer
from .tile_size import tile_size_explorer
from .topk_traffic import topk_traffic_explorer

__all__ = [
    "ON_SITE",
    "attention_map_explorer",
    "block_mask_explorer",
    "causal_lm_explorer",
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
    "site",
    "sparse_explorer",
    "teaser",
    "temperature_explorer",
    "tile_size_explorer",
    "topk_traffic_explorer",
    "tqdm",
]
