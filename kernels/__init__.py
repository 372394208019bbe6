"""GPU side of the book: Triton kernels, naive PyTorch baselines, timing, machine code.

What lives where:

* ``runtime`` (CUDA or the Triton interpreter), ``common`` (device facts and the rules
  every family shares: architectures, head-dim padding, capability, the upcast/fp32
  rule, ``LOG2E``/``LN2`` as jit constants), ``naive`` (the PyTorch baselines that
  materialise S and P, and the fp64 reference ``reference_attention``);
* one package per kernel family, each a whole vertical with the same file names:
  ``__init__`` (the spec sheet and the public names), ``tiles`` (tile tables and
  configs), ``checks`` (argument validation), ``blocks`` (the ``@triton.jit`` pieces
  its kernels share), ``forward*`` / ``backward*`` (the kernels), ``api`` (public
  calls and autograd), ``timing`` (its benchmark suite, which ``benchmarks/run.py``
  iterates) and ``compile_check`` (its ahead-of-time matrix). The families:
  ``flash`` (FlashAttention-2, with the TMA forward and the fused backward beside
  the defaults), ``hard`` (argmax, sampled and top-k attention), ``deformable`` (MSDA
  and DAT), ``decode`` (split-KV decoding over a paged KV cache, MLA), ``ring`` (ring
  attention over torch.distributed: the ring loop around the flash kernel, the shard
  layouts, a local process-group launcher and PyTorch's own context parallelism
  beside it), ``flex`` (FlexAttention: score and mask mods, block masks) and
  ``sparse`` (attention over chosen blocks or tokens, block selection, the lightning
  indexer); ``linear`` (chunked linear attention, Gated DeltaNet) is to come. What one
  family lends another is a public name of the lender (for example
  ``kernels.flash.forward_lse``), never an underscore name;
* two engines under them, which import no family: ``timing`` (measuring, records,
  results files, provenance) and ``machine_code`` (compiling one kernel ahead of
  time, ptxas and SASS, no GPU).

Importing this package first imports :mod:`kernels.runtime`, which sets
``TRITON_INTERPRET=1`` when no CUDA GPU is present, *before* any ``@triton.jit``
decorator runs (the decorator reads the variable when the kernel is defined).
"""

from . import runtime  # noqa: F401  (must come first: decides CUDA vs interpreter)
