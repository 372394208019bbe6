"""kernels.flash.compile_check: the shipped FlashAttention configs compile for
sm_75/80/89/90 and fit.

Compiles ahead of time on the CPU (no GPU needed), in a subprocess with TRITON_INTERPRET
unset, the representative subset ``python -m kernels.flash.compile_check
--quick``: every kernel (fwd, bwd preprocess, dkdv, dq) on every target, with the cases
that use the most registers and the most shared memory per dot path (tensor cores;
CUDA-core FMA for fp32 and sm_75), as the last full run recorded them in
``kernels/flash/compile_peaks.json``. One target per test, so pytest-xdist
spreads them over the cores; with an empty Triton cache the four take about a minute on
2 cores. The full matrix (896 compilations, about 20 minutes) is ``make compile-check``,
which rewrites the peaks file; run it whenever a tile table changes.

A config that exceeds its target's shared memory, spills registers or fails to compile
fails the test; on sm_90 the forward's matrix products must use Hopper's ``wgmma``.
"""

import pytest

from tests.kernels.compile_tools import run_compiled, table_rows

TARGETS = ["sm75", "sm80", "sm89", "sm90"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "target",
    [pytest.param(t, marks=pytest.mark.xdist_group(f"compile-{t}")) for t in TARGETS],
)
def test_representative_configs_fit_and_do_not_spill(target):
    proc, out = run_compiled(
        "-m",
        "kernels.flash.compile_check",
        "--quick",
        "--target",
        target,
        timeout=900,
    )
    rows = table_rows(proc.stdout, ("fwd", "preprocess", "dkdv", "dq"))
    assert proc.returncode == 0, out
    assert {r[0] for r in rows} == {"fwd", "preprocess", "dkdv", "dq"}, out
    assert {r[1] for r in rows} == {target}, out
    # the recorded peaks: fp16 (tensor cores, or the sm_75 FMA path) and fp32 (FMA dots)
    assert {"fp16", "fp32"} <= {r[3] for r in rows}, out
    assert rows and all(r[-1] == "ok" for r in rows), out
    if target == "sm90":
        assert any(r[0] == "fwd" and "yes" in r for r in rows), "no wgmma on sm_90"


def test_sass_parser_finds_the_innermost_tensor_core_loop():
    from kernels.machine_code import sass

    text = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_0:
        /*0010*/                   IMAD R2, R3, R4, R5 ;
.L_x_1:
        /*0020*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], R24 ;
        /*0030*/                   FFMA R6, R7, R8, R9 ;
        /*0040*/                   MUFU.EX2 R10, R11 ;
        /*0050*/                   UIADD3 UR5, UR5, 0x1, URZ ;
        /*0060*/              @!P0 BRA `(.L_x_1) ;
        /*0070*/              @P1 BRA `(.L_x_0) ;
        /*0080*/                   EXIT ;
"""
    instrs, labels = sass.parse(text)
    assert len(instrs) == 9 and labels == {".L_x_0": 1, ".L_x_1": 2}
    assert sass.loops(instrs, labels) == [(2, 6), (1, 7)]
    a, b = sass.hot_loop(instrs, labels)
    counts = sass.count(instrs[a : b + 1])
    assert (a, b) == (2, 6)
    assert counts["instructions"] == 5 and counts["tensor_core"] == 1
    assert counts["FFMA"] == 1 and counts["MUFU.EX2"] == 1
    assert counts["integer"] == 0 and counts["uniform"] == 1


def test_machine_code_report_of_the_forward_on_sm90():
    """One forward config compiled for sm_90: its hot loop issues the wgmma count the
    tile implies and one exp2 per score element per thread."""
    script = (
        "import os, tempfile\n"
        "os.environ['TRITON_CACHE_DIR'] = tempfile.mkdtemp()  # Triton compiles anew\n"
        "import hashlib, json, re, torch\n"
        "from kernels.flash import compile_kernels as cc\n"
        "from kernels.machine_code import compiler, sass\n"
        "c = cc.compile_kernel('fwd', 'sm90', 128, torch.bfloat16, False, "
        "(128, 128, 8, 2), 16384)\n"
        "ptx = c.asm['ptx']\n"
        "kept = hashlib.sha256(ptx.encode()).hexdigest() in compiler._PTXAS_REPORTS\n"
        "log = compiler.run_ptxas(ptx)\n"
        "again = [int(re.search(p, log).group(1)) for p in (r'Used (\\d+) registers', "
        "r'(\\d+) bytes spill stores', r'(\\d+) bytes spill loads')]\n"
        "print(json.dumps([kept, compiler.ptxas_usage(ptx), again]))\n"
        "print(json.dumps(sass.report(c.asm['cubin'])))\n"
    )
    proc, out = run_compiled("-c", script, interpret="0")
    assert proc.returncode == 0, out
    import json

    # The registers and spills read from the report of the ptxas run Triton made
    # compiling (compiler._keep_ptxas_reports: ptxas is not run twice) are those of a
    # run of our own.
    kept, usage, again = json.loads(proc.stdout.strip().splitlines()[-2])
    assert kept and usage == again and usage[0] > 0, out
    rep = json.loads(proc.stdout.strip().splitlines()[-1])
    loop = rep["hot_loop"]
    # two warpgroups of 64 rows; S = Q K^T: d / 16 = 8 wgmma, O += P V: BLOCK_N / 16 = 8
    assert loop["tensor_core"] == 16
    # 128 x 128 scores over 256 threads: 64 exponentials per thread (+ the rescale's)
    assert 64 <= loop["MUFU.EX2"] <= 64 + 4
    assert loop["LDGSTS"] > 0 and not rep["tma"]
