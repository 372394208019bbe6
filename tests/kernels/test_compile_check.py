"""kernels.compile_check: every shipped FlashAttention config compiles for sm_75/80/89/90 and fits.

Compiles ahead of time on the CPU (no GPU needed), in a subprocess with TRITON_INTERPRET
unset, the full matrix of ``python -m kernels.compile_check``: every kernel (fwd, bwd
preprocess, dkdv, dq) and every config it ships, at head dims 64/80/128/256, in fp16, bf16
and fp32, causal and not, aligned (N = 4096) and ragged (N = 4000, masks on, the most
registers): 896 compilations, one target per test so that pytest-xdist spreads them over
the cores. A config that exceeds its target's shared memory, spills registers or fails to
compile fails the test; on sm_90 the matrix products must use Hopper's ``wgmma``.
"""

import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

TARGETS = ["sm75", "sm80", "sm89", "sm90"]


@pytest.mark.parametrize(
    "target", [pytest.param(t, marks=pytest.mark.xdist_group(f"compile-{t}")) for t in TARGETS])
def test_every_shipped_config_fits_and_does_not_spill(target):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-m", "kernels.compile_check", "--target", target],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    out = proc.stdout + proc.stderr
    rows = [line for line in proc.stdout.splitlines()
            if line.split() and line.split()[0] in ("fwd", "preprocess", "dkdv", "dq")]
    assert proc.returncode == 0, out
    assert {r.split()[0] for r in rows} == {"fwd", "preprocess", "dkdv", "dq"}, out
    assert {r.split()[1] for r in rows} == {target}, out
    assert {r.split()[3] for r in rows} == {"fp16", "bf16", "fp32"}, out
    assert {int(r.split()[2]) for r in rows} == {64, 80, 128, 256}, out
    assert rows and all(r.rstrip().endswith("ok") for r in rows), out
    if target == "sm90":
        assert any(" yes " in r for r in rows), "no wgmma on sm_90"
