"""kernels.sparse.compile_check: the sparse kernels compile ahead of time for
sm_75/80/89/90 at their shipped tiles without spills (no GPU needed).

Compiles, in a subprocess with TRITON_INTERPRET unset, the representative subset
``python -m kernels.sparse.compile_check --quick``: the forward and the backward,
blocks of 64 and single tokens, groups of 16 and 64 query heads, one target each. The
full matrix is ``python -m kernels.sparse.compile_check``.
"""

from tests.kernels.compile_tools import run_compiled, table_rows


def test_sparse_kernels_compile_without_spills():
    proc, out = run_compiled("-m", "kernels.sparse.compile_check", "--quick")
    rows = table_rows(proc.stdout, ("fwd", "bwd"))
    assert proc.returncode == 0, out
    assert {r[0] for r in rows} == {"fwd", "bwd"}, out
    assert {r[1] for r in rows} == {"blocks64", "tokens"}, out
    assert {r[2] for r in rows} == {"sm75", "sm80", "sm89", "sm90"}, out
    # columns: kern case arch d type G tile w s smem regs spills wgmma time status
    assert all(r[-1] == "ok" and r[11] == "0" for r in rows), out
