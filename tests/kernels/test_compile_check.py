"""kernels.compile_check: shipped FlashAttention configs compile for sm_75/80/89/90 and fit.

Compiles ahead of time on the CPU (no GPU needed) in a subprocess with TRITON_INTERPRET
unset. Covered (``compile_check.QUICK``, 55 compilations): every kernel (fwd, bwd
preprocess, dkdv, dq) on every target, every shipped tile config of the causal (heaviest)
variant in fp16 at head dims 128 and 256 (the largest tiles), plus bf16 on sm_75 (the
upcast path) and fp32 at d = 128 on sm_80 and sm_90, each in its ragged variant (N = 4000,
masks on, the most registers). The full matrix (d = 64/80/128/256, fp16/bf16/fp32, causal and
not, aligned and ragged: 896 compilations) is ``python -m kernels.compile_check``.
"""

import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.xdist_group("flash-compile")


def test_every_shipped_config_fits_and_does_not_spill():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-m", "kernels.compile_check", "--quick"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=900)
    out = proc.stdout + proc.stderr
    rows = [line for line in proc.stdout.splitlines()
            if line.split() and line.split()[0] in ("fwd", "preprocess", "dkdv", "dq")]
    assert proc.returncode == 0, out
    kernels_seen = {r.split()[0] for r in rows}
    targets_seen = {r.split()[1] for r in rows}
    assert kernels_seen == {"fwd", "preprocess", "dkdv", "dq"}, out
    assert targets_seen == {"sm75", "sm80", "sm89", "sm90"}, out
    assert rows and all(r.rstrip().endswith("ok") for r in rows), out
    assert any(r.split()[1] == "sm90" and " yes " in r for r in rows), "no wgmma on sm_90"
