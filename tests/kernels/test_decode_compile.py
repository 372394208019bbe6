"""kernels.machine_code.decode_check: the decode kernels' shipped tiles compile for
sm_75/80/89/90 without register spills and within shared memory.

Each test compiles, in a subprocess with TRITON_INTERPRET unset (ahead of time, no GPU),
``python -m kernels.machine_code.decode_check --quick --target <t>``: the split kernel
at d = 64 and 128, fp16 and bf16, query-row blocks of 16 and 64, the table's key tile
(256-token pages) and the contiguous cache (the heaviest layouts of the full matrix),
causal, and the merge kernel (20 compilations), then issue 29's paths at d = 128: a 4k
window (BLOCK_M 16 and 64), softcap + ALiBi + sinks under it, an fp8 cache (fp16 and
bf16 q), MLA at 576/512 (paged and contiguous) and its merge (10 more; 7 on sm_75, where
MLA is refused): 1-4 minutes per target with an empty Triton cache on a busy 2-core
machine (slow: one target per test, so pytest-xdist spreads them). ``python -m
kernels.machine_code.decode_check`` runs the full matrix (head dims 64/80/128/256,
fp16/bf16/fp32, four cache layouts, the new paths at d = 128 and 256).
"""

import pytest

from tests.kernels.compile_tools import run_compiled, table_rows

TARGETS = ["sm75", "sm80", "sm89", "sm90"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "target",
    [pytest.param(t, marks=pytest.mark.xdist_group(f"compile-{t}")) for t in TARGETS],
)
def test_decode_tiles_compile_without_spills(target):
    proc, out = run_compiled(
        "-m", "kernels.machine_code.decode_check", "--quick", "--target", target
    )
    rows = table_rows(proc.stdout, ("split", "merge"))
    assert proc.returncode == 0, out
    mla = ["mla"] * 3 if target != "sm75" else []  # sm_75: MLA refused (64 KB smem)
    assert len(rows) == 27 + len(mla) and {r[1] for r in rows} == {target}, out
    assert {(r[2], r[4]) for r in rows if r[3] == "base"} == {
        (d, t) for d in ("64", "128") for t in ("fp16", "bf16")
    }, out
    # the new paths: a window, softcap + ALiBi + sinks, fp8, MLA at 576 (and its merge)
    assert [r[3] for r in rows if r[3] != "base"] == (
        ["window"] * 2 + ["extras"] * 2 + ["fp8"] * 3 + mla
    ), out
    assert all(r[-1] == "ok" and r[-3] == "0" for r in rows), out  # no spill bytes
