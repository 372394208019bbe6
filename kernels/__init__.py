"""GPU side of the book: Triton kernels, naive PyTorch baselines, and timing.

Importing this package first imports :mod:`kernels.runtime`, which sets
``TRITON_INTERPRET=1`` when no CUDA GPU is present, *before* any ``@triton.jit``
decorator runs (the decorator reads the variable when the kernel is defined).
"""

from . import runtime  # noqa: F401  (must come first: decides CUDA vs interpreter)
