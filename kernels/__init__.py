"""GPU side of the book: Triton kernels, naive PyTorch baselines, timing, machine code.

What lives where:

* ``runtime`` (CUDA or the Triton interpreter), ``naive`` (the PyTorch baselines that
  materialise S and P, and the shared argument checks);
* one package or module per kernel family: ``flash`` (FlashAttention-2: public face in
  its ``__init__``; tile tables, shared ``@triton.jit`` blocks, forward, TMA forward,
  backward and fused backward below it), ``hard`` (argmax, sampled and top-k
  attention), ``deformable`` (MSDA and DAT);
* tools above them: ``timing`` (the one timing path, results files, GPU provenance,
  report tables) and ``machine_code`` (ahead-of-time compiles and SASS counts, no GPU).

Importing this package first imports :mod:`kernels.runtime`, which sets
``TRITON_INTERPRET=1`` when no CUDA GPU is present, *before* any ``@triton.jit``
decorator runs (the decorator reads the variable when the kernel is defined).
"""

from . import runtime  # noqa: F401  (must come first: decides CUDA vs interpreter)
