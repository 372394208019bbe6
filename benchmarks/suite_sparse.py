"""Suite "sparse": kernels.sparse (attention over chosen key blocks) on a CUDA GPU.

The suite lives in :mod:`kernels.timing.sparse` (chapter 8 times the same goal shapes
from there): ``check`` holds ``sparse_attention`` against an fp64 reference and
``select_blocks`` against the NumPy twin on this GPU, ``goal`` times MoBA's selection
and the sparse forward at 64k tokens with 16 blocks of 64 against the dense flash
forward, and ``run`` sweeps N at that fixed budget (and DSA's 2,048 tokens).
"""

from kernels.timing.sparse import GOAL, SUITE, check, goal, run, speedups

__all__ = ["GOAL", "SUITE", "check", "goal", "run", "speedups"]
