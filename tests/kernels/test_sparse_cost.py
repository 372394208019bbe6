"""The cost claim of kernels.sparse under the Triton interpreter: at a fixed budget
(S blocks per query), doubling N about doubles the kernel's time (the work per query
is constant: S x block_size keys), well under the ~4x of dense causal attention
(kernels.flash, whose work per query grows with N).

The interpreter runs programs one after another, so its time is proportional to the
work. Timed as the process's CPU time (time.process_time, one torch thread), not wall
time: the CPU this runs on is shared, and the CPU time of a process is what its own
work costs, whoever else runs. Each figure is the least of four interleaved runs
after a warm-up. The sparse kernel visits N programs of one 64-key step each (ratio 2
plus a fixed per-launch cost); flash causal visits 36 then 136 key tiles of 64 x 64 at
N = 512 and 1024 (ratio 3.8, less its per-program cost, 8 then 16 programs).

Measured on 2 shared cores, even CPU time is noisy: over fourteen idle runs the sparse
ratio came out 1.56 ... 2.42 (3.26 once, see timing_tools) and the dense 2.84 ... 4.04,
and one loaded run (the other core
running the rest of the suite) gave a dense 2.56 against a sparse 1.65. So the bounds
are loose on each ratio (sparse 1.3 ... 2.75, dense > 2.3) and firmer on what the claim
is about, that the two stay apart: the dense ratio is at least 1.25 times the sparse
one (1.50 ... 1.87 in six idle runs with the collector off, as below; 1.55 in that
loaded run).
Larger N would bring the ratios nearer 2 and 4 at several times this test's ~10 s.
"""

from __future__ import annotations

import torch

from kernels.flash import flash_attention
from kernels.sparse import prepare
from tests.kernels.sparse_tools import inputs, random_indices
from tests.kernels.timing_tools import least_cpu_seconds


def test_doubling_n_doubles_the_sparse_time_not_the_dense():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        sparse = []
        for n in (16, 32):
            q, k, v = inputs(1, 1, 1, n, n, 16, seed=n)
            idx = random_indices(1, 1, n, n // 8, 2, seed=n, pad=0.0)
            sparse.append(prepare(q, k, v, idx, 8, causal=True))
        sparse[0]()  # warm-up
        t_sparse = least_cpu_seconds(sparse)
        dense = []
        for n in (512, 1024):
            q, k, v = inputs(1, 1, 1, n, n, 16, seed=n)
            dense.append(lambda q=q, k=k, v=v: flash_attention(q, k, v, causal=True))
        dense[0]()
        t_dense = least_cpu_seconds(dense)
    finally:
        torch.set_num_threads(threads)
    r_sparse = t_sparse[1] / t_sparse[0]
    r_dense = t_dense[1] / t_dense[0]
    # about 2 against about 4; the margins absorb a loaded machine (a dense ratio of
    # 2.46 was seen at a load of 4), and the two must stay apart
    assert 1.3 < r_sparse < 2.75, (r_sparse, r_dense, t_sparse, t_dense)
    assert r_dense > 2.3, (r_sparse, r_dense, t_sparse, t_dense)
    assert r_dense > 1.25 * r_sparse, (r_sparse, r_dense, t_sparse, t_dense)
