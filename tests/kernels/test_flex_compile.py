"""kernels.machine_code.flex_check: the flex kernels compile ahead of time for
sm_75/80/89/90 at their shipped tiles without spills (no GPU needed).

Compiles, in a subprocess with TRITON_INTERPRET unset, the representative subset
``python -m kernels.machine_code.flex_check --quick``: every kernel (fwd, dkdv, dq) and
every instantiation (causal, window, document, softcap + sink) once, spread over the
four targets. The full matrix is ``python -m kernels.machine_code.flex_check``.
"""

import os
import subprocess
import sys

from tests.conftest import ROOT


def test_flex_kernels_compile_without_spills():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-m", "kernels.machine_code.flex_check", "--quick"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = proc.stdout + proc.stderr
    rows = [
        line.split()
        for line in proc.stdout.splitlines()
        if line.split() and line.split()[0] in ("fwd", "dkdv", "dq")
    ]
    assert proc.returncode == 0, out
    assert {r[0] for r in rows} == {"fwd", "dkdv", "dq"}, out
    assert {r[1] for r in rows} == {"causal", "window", "document", "softcap-sink"}, out
    assert {r[2] for r in rows} == {"sm75", "sm80", "sm89", "sm90"}, out
    assert all(r[-1] == "ok" and r[10] == "0" for r in rows), out
    assert any(r[0] == "fwd" and r[2] == "sm90" and r[11] == "yes" for r in rows), out
