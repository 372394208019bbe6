"""GPU side of the book: Triton kernels, naive PyTorch baselines, timing, machine code.

What lives where:

* ``runtime`` (CUDA or the Triton interpreter), ``common`` (the internal layer every
  family shares: ``LOG2E``/``LN2``, the dtype table, the argument checks, the softmax
  scale rule), ``naive`` (the PyTorch baselines that materialise S and P, and the fp64
  reference ``reference_attention``);
* one package per kernel family, each laid out as ``flash``: ``tiles`` (tile tables
  and configs), ``checks`` (argument validation), ``forward`` / ``backward`` (the
  ``@triton.jit`` kernels; ``blocks`` for the jit pieces they share), ``api`` (public
  calls and autograd), and ``__init__`` (the spec sheet and the public names):
  ``flash`` (FlashAttention-2, with the TMA forward and the fused backward beside
  the defaults), ``hard`` (argmax, sampled and top-k attention), ``deformable`` (MSDA
  and DAT), ``decode`` (split-KV decoding over a paged KV cache) and ``ring`` (ring
  attention over torch.distributed: the ring loop around the flash kernel, the shard
  layouts, a local process-group launcher and PyTorch's own context parallelism
  beside it). What one family lends another is a public name of the lender (for
  example ``kernels.flash.forward_lse``), never an underscore name;
* tools above them: ``timing`` (the one timing path, results files, GPU provenance,
  report tables) and ``machine_code`` (ahead-of-time compiles and SASS counts, no GPU).

Importing this package first imports :mod:`kernels.runtime`, which sets
``TRITON_INTERPRET=1`` when no CUDA GPU is present, *before* any ``@triton.jit``
decorator runs (the decorator reads the variable when the kernel is defined).
"""

from . import runtime  # noqa: F401  (must come first: decides CUDA vs interpreter)
