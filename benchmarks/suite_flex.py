"""Suite "flex": kernels.flex (FlexAttention in Triton) on a CUDA GPU.

The suite lives in :mod:`kernels.timing.flex` (chapter 7 times the same goal shapes
from there): ``check`` holds ``flex_attention`` against an fp64 reference on this GPU,
``goal`` times causal through flex against ``kernels.flash``, ``torch.compile
(flex_attention)`` and SDPA, and a 4,096-key window at 32k against dense causal, and
``run`` sweeps N.
"""

from kernels.timing.flex import GOAL, SUITE, check, goal, run

__all__ = ["GOAL", "SUITE", "check", "goal", "run"]
