"""Ring attention on torch.distributed: the sequence split over ranks, K/V on a ring.

(Spec sheet written in full below once the public face is complete.)
"""

from .layout import LAYOUTS, local_length, positions, segments, shard, unshard
from .ring import block_plan, merge, ring_attention

__all__ = ["LAYOUTS", "block_plan", "local_length", "merge", "positions",
           "ring_attention", "segments", "shard", "unshard"]
