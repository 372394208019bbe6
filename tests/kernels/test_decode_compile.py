"""kernels.decode.compile_check: the decode kernels' shipped tiles compile for
sm_75/80/89/90 without register spills and within shared memory.

Each test compiles, in a subprocess with TRITON_INTERPRET unset (ahead of time, no GPU),
``python -m kernels.decode.compile_check --quick --target <t>``: the heaviest case
of each kind at d = 128 (9 compilations; 7 on sm_75, where MLA is refused): the split
kernel in fp16 at query-row blocks 16 and 64 on the table's key tile (256-token pages),
bf16 at 64 on the contiguous cache, the merge kernel, a 4k window, softcap + ALiBi +
sinks, an fp8 cache (64-row blocks) and MLA at 576/512 with its merge. About 20 s per
target with an empty Triton cache (one target per test, so
pytest-xdist spreads them). ``python -m
kernels.decode.compile_check`` runs the full matrix (head dims 64/80/128/256,
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
        "-m", "kernels.decode.compile_check", "--quick", "--target", target
    )
    rows = table_rows(proc.stdout, ("split", "merge"))
    assert proc.returncode == 0, out
    mla = ["mla"] * 2 if target != "sm75" else []  # sm_75: MLA refused (64 KB smem)
    assert len(rows) == 7 + len(mla) and {r[1] for r in rows} == {target}, out
    assert {(r[2], r[4]) for r in rows if r[3] == "base"} == {
        ("128", t) for t in ("fp16", "bf16")
    }, out
    # the new paths: a window, softcap + ALiBi + sinks, fp8, MLA at 576 (and its merge)
    assert [r[3] for r in rows if r[3] != "base"] == (
        ["window", "extras", "fp8"] + mla
    ), out
    assert all(r[-1] == "ok" and r[-3] == "0" for r in rows), out  # no spill bytes
