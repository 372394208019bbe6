"""Deformable attention in NumPy: reference grids, the offset network, bilinear sampling
and its gradient, DAT's attention over sampled keys and values (with its deformable
relative position bias), and multi-scale deformable attention (MSDA, Deformable DETR).

Modules: ``sampling`` (coordinates, bilinear sampling and its gradient), ``dat`` (the
offset network, the position bias, DAT and the fused kernel's twin), ``msda``
(Deformable DETR's op and layer) and ``traffic`` (cost, and the memory-traffic
algorithms it registers with ``attention.memory`` on import). Every public name is
re-exported here: ``from attention import deformable; deformable.bilinear_sample``.

Conventions (the same as ``torch.nn.functional.grid_sample`` and the kernels):

* A feature map is channels-last, ``(B, H_f, W_f, C)``; a point is ``(x, y)`` with x
  along the width and y along the height, normalised to [-1, 1].
* ``align_corners=True``: -1 and +1 are the *centres* of the corner pixels,
  ``px = (x + 1) / 2 * (W_f - 1)``. ``align_corners=False``: -1 and +1 are the outer
  *edges* of the corner pixels, ``px = ((x + 1) * W_f - 1) / 2``.
* Zero padding: a bilinear corner outside the map contributes 0, so a point far outside
  samples 0 and has zero gradient.
* A NaN (or infinite) coordinate has no place on the map: its sample is NaN, as in the
  kernels, never an index error or a silent 0.

DAT (Xia et al. 2022) here follows the paper's six steps. Two parts of DAT are options,
off by default so that the chapter's walk-through stays six steps: the deformable
relative position bias (``dat_attention(..., rpb_table=...)``, a (2H-1) x (2W-1) table
per head read bilinearly at each query-to-sample displacement and added to the logits
before the softmax) and the LayerNorm inside the offset network
(``init_offset_params(..., layer_norm=True)``). The bias measures displacements in
pixels of the same ``align_corners`` convention that samples the keys; the book uses
``align_corners=False`` and DAT's code ``align_corners=True``, where the lookup is
exactly DAT's ``grid_sample`` of the table (see ``relative_position_bias``).

``deformable_attention`` is the NumPy twin of
``kernels.deformable.deformable_attention`` (project first, then sample; no attention
bias): with one offset group it is exactly DAT without its position bias.
``ms_deform_attn`` is the twin of ``kernels.deformable.ms_deform_attn`` (Deformable
DETR's op, ``align_corners=False``).
"""

from .dat import (
    LAYER_NORM_EPS,
    channel_layer_norm,
    dat_attention,
    deformable_attention,
    depthwise_conv2d,
    gelu,
    init_dat_params,
    init_offset_params,
    init_rpb_table,
    offset_network,
    relative_position_bias,
)
from .msda import (
    init_msda_params,
    level_start_index,
    ms_deform_attn,
    msda_layer,
    msda_sampling,
)
from .sampling import (
    CORNERS,
    bilinear_corners,
    bilinear_sample,
    bilinear_sample_backward,
    bilinear_sample_pixels,
    pixel_scale,
    reference_grid,
    to_normalized,
    to_pixels,
)
from .traffic import attention_cost  # importing traffic registers the algorithms

__all__ = [
    "CORNERS",
    "LAYER_NORM_EPS",
    "attention_cost",
    "bilinear_corners",
    "bilinear_sample",
    "bilinear_sample_backward",
    "bilinear_sample_pixels",
    "channel_layer_norm",
    "dat_attention",
    "deformable_attention",
    "depthwise_conv2d",
    "gelu",
    "init_dat_params",
    "init_msda_params",
    "init_offset_params",
    "init_rpb_table",
    "level_start_index",
    "ms_deform_attn",
    "msda_layer",
    "msda_sampling",
    "offset_network",
    "pixel_scale",
    "reference_grid",
    "relative_position_bias",
    "to_normalized",
    "to_pixels",
]
