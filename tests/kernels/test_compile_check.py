"""kernels.compile_check: the shipped FlashAttention configs compile for sm_75/80/89/90 and fit.

Compiles ahead of time on the CPU (no GPU needed), in a subprocess with TRITON_INTERPRET
unset, the representative subset ``python -m kernels.compile_check --quick``: every kernel
(fwd, bwd preprocess, dkdv, dq) on every target, with the configs that use the most
registers and the most shared memory (the causal, ragged path at head dims 128 and 256),
plus the sm_75 bf16 upcast and the fp32 tables (see ``compile_check.QUICK``). One target
per test, so pytest-xdist spreads them over the cores; with an empty Triton cache the four
take under two minutes on 2 cores. The full matrix (896 compilations) is
``make compile-check``, run whenever a tile table changes.

A config that exceeds its target's shared memory, spills registers or fails to compile
fails the test; on sm_90 the forward's matrix products must use Hopper's ``wgmma``.
"""

import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

TARGETS = ["sm75", "sm80", "sm89", "sm90"]


@pytest.mark.parametrize(
    "target", [pytest.param(t, marks=pytest.mark.xdist_group(f"compile-{t}")) for t in TARGETS])
def test_representative_configs_fit_and_do_not_spill(target):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-m", "kernels.compile_check", "--quick", "--target", target],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    out = proc.stdout + proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines()
            if line.split() and line.split()[0] in ("fwd", "preprocess", "dkdv", "dq")]
    assert proc.returncode == 0, out
    assert {r[0] for r in rows} == {"fwd", "preprocess", "dkdv", "dq"}, out
    assert {r[1] for r in rows} == {target}, out
    assert {int(r[2]) for r in rows} >= {128}, out
    assert "fp16" in {r[3] for r in rows}, out
    assert ("bf16" if target == "sm75" else "fp32") in {r[3] for r in rows}, out
    assert rows and all(r[-1] == "ok" for r in rows), out
    if target == "sm90":
        assert any(r[0] == "fwd" and "yes" in r for r in rows), "no wgmma on sm_90"
