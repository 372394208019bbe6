"""The cost claim of kernels.sparse, counted under the Triton interpreter: at a fixed
budget (S blocks per query), doubling N doubles the kernel's work at most (the work
per query is bounded: S x block_size keys, one step of the key loop here), while
dense causal attention (kernels.flash, whose work per query grows with N) about
quadruples it.

The work is counted, not timed (tests/kernels/interpreter_work.py counts the ``tl.dot``
calls the interpreter executes). The sparse forward runs two dots
(QK^T and PV) per step of its key loop that holds a visible key and none for a step
without one; flash's causal forward two per 64 x 64 tile it visits (36 of them at
N = 512, 136 at N = 1024). The interpreter runs programs one after another, so its
time follows these counts; an earlier version of this test timed the calls in CPU
seconds, and on 2 shared cores the ratios drifted far enough (a sparse ratio of 2.49
against a dense 2.91, once) to fail a run. The counts are exact.
"""

from __future__ import annotations

from functools import partial

from kernels.flash import flash_attention
from kernels.sparse import prepare
from tests.kernels.interpreter_work import count_dots
from tests.kernels.sparse_tools import inputs, keep_mask, random_indices

BLOCK, S = 8, 2  # S x BLOCK = 16 keys a query: one step of the sparse key loop


def test_doubling_n_doubles_the_sparse_work_at_most_not_the_dense():
    sparse = {}
    for n in (16, 32, 64):
        q, k, v = inputs(1, 1, 1, n, n, 16, seed=n)
        idx = random_indices(1, 1, n, n // BLOCK, S, seed=n, pad=0.0)
        run = prepare(q, k, v, idx, BLOCK, causal=True)
        rows_with_a_key = int(keep_mask(idx, n, BLOCK, True).any(-1).sum())
        sparse[n] = count_dots(run)
        # one step per query that sees a key (its chosen blocks may all lie ahead of
        # it, causal: then no step at all), two dots a step
        assert sparse[n] == 2 * rows_with_a_key, (n, sparse[n], rows_with_a_key)
        assert sparse[n] <= 2 * n
    dense = {}
    for n, tiles in ((512, 36), (1024, 136)):
        q, k, v = inputs(1, 1, 1, n, n, 16, seed=n)
        dense[n] = count_dots(partial(flash_attention, q, k, v, causal=True))
        assert dense[n] == 2 * tiles, (n, dense[n])
    assert sparse[32] / sparse[16] <= 2 and sparse[64] / sparse[32] <= 2, sparse
    assert dense[1024] / dense[512] > 3.7, dense
