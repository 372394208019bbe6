"""The book's figures (matplotlib) and its one palette, one module per kind of figure.

style      the palette (tensors, memory levels, implementations), ``use_book_style``,
           ``human_bytes`` and the small helpers every figure shares
maps       attention and mask heatmaps, Gumbel-softmax weights, deformable sampling
           points
traffic    HBM traffic per tensor and per algorithm (simulated beside closed forms)
schedule   the memory hierarchy, tile schedules, roofline ESTIMATES, the tile explorer
basics     chapter 1's soft dictionary lookup and positional encodings (sin, RoPE)
roofline   chapter 2's roofline: three GPUs' roofs, attention placed by the memory model
online     chapter 2's online softmax of one row: the max jumping, the sums rescaled
explain    chapters 3 and 4: straight-through's two passes, DAT's bias-table lookup
hopper     chapter 2's FlashAttention-3 timeline: a schedule model, drawn (a schematic)
decode     chapter 5: prefill vs decode roofline, grid fill, paging waste
timing     measured scaling with its power-law fit, recorded and live GPU timings

Every name is re-exported here, so chapters write ``plots.attention_heatmap(...)``.
"""

from .basics import positions_figure, soft_lookup_figure
from .decode import (
    decode_roofline_figure,
    grid_fill_figure,
    paging_waste_figure,
)
from .explain import rpb_lookup_figure, straight_through_figure
from .hopper import fa3_timeline, fa3_timeline_figure, tensor_core_busy
from .maps import (
    attention_heatmap,
    deformable_points_plot,
    gumbel_softmax_figure,
    mask_heatmap,
    msda_points_figure,
    sampled_attention_plot,
)
from .online import online_softmax_figure, online_softmax_trace
from .roofline import roofline_figure, roofline_points
from .schedule import (
    memory_hierarchy_plot,
    roofline_bars,
    tile_explorer_figure,
    tile_explorer_summary,
    tile_schedule_plot,
)
from .style import (
    ATTENTION_CMAP,
    DTYPE_BYTES,
    IMPL_COLORS,
    MASK_COLORS,
    MEMORY_COLORS,
    QUADRATIC_TENSORS,
    SELECTION_COLORS,
    TENSOR_COLORS,
    human_bytes,
    tensor_color,
    use_book_style,
)
from .timing import (
    block_sweep_figure,
    deformable_timing_figure,
    power_law_fit,
    recorded_timing_figure,
    scaling_plot,
    selection_timing_figure,
)
from .traffic import (
    deformable_traffic_figure,
    naive_traffic_figure,
    naive_traffic_vs_length,
    selection_traffic_figure,
    traffic_bars,
    traffic_by_algorithm,
)

__all__ = [
    "ATTENTION_CMAP",
    "DTYPE_BYTES",
    "IMPL_COLORS",
    "MASK_COLORS",
    "MEMORY_COLORS",
    "QUADRATIC_TENSORS",
    "SELECTION_COLORS",
    "TENSOR_COLORS",
    "attention_heatmap",
    "block_sweep_figure",
    "decode_roofline_figure",
    "grid_fill_figure",
    "paging_waste_figure",
    "deformable_points_plot",
    "deformable_timing_figure",
    "deformable_traffic_figure",
    "fa3_timeline",
    "fa3_timeline_figure",
    "gumbel_softmax_figure",
    "human_bytes",
    "mask_heatmap",
    "memory_hierarchy_plot",
    "msda_points_figure",
    "naive_traffic_figure",
    "naive_traffic_vs_length",
    "online_softmax_figure",
    "online_softmax_trace",
    "positions_figure",
    "power_law_fit",
    "recorded_timing_figure",
    "roofline_bars",
    "roofline_figure",
    "roofline_points",
    "rpb_lookup_figure",
    "sampled_attention_plot",
    "scaling_plot",
    "selection_timing_figure",
    "selection_traffic_figure",
    "soft_lookup_figure",
    "straight_through_figure",
    "tensor_color",
    "tensor_core_busy",
    "tile_explorer_figure",
    "tile_explorer_summary",
    "tile_schedule_plot",
    "traffic_bars",
    "traffic_by_algorithm",
    "use_book_style",
]
