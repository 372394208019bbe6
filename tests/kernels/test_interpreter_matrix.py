"""The interpreter path across the versions a reader may have: Triton 3.4 and 3.7 with
NumPy 2.0 and 2.4 (the extreme pairs), each in a fresh virtual environment with the
pinned CPU torch, running ``interpreter_smoke.py`` (every kernel family, forward and
backward, against float64 references).

Not part of ``make test`` (each environment installs torch and triton: about a minute
or two apiece); ``make interpreter-matrix`` runs it. The pinned pair (Triton 3.7.1,
NumPy 2.4.6) is the one every other test runs under.
"""

import json
import os
import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT

SMOKE = ROOT / "tests" / "kernels" / "interpreter_smoke.py"
PAIRS = [("3.4.0", "2.0.2"), ("3.4.0", "2.4.6"), ("3.7.1", "2.0.2")]


def _torch_pin() -> str:
    m = re.search(r"^(torch==[^\s;]+)", (ROOT / "requirements.txt").read_text(), re.M)
    assert m, "requirements.txt pins no torch"
    return m.group(1)  # pinned: an unpinned torch could pull a multi-GB CUDA build


@pytest.mark.interpreter_matrix
@pytest.mark.parametrize(("triton", "numpy"), PAIRS)
def test_kernels_under_interpreter(tmp_path, triton, numpy):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = str(venv / "bin" / "python")
    subprocess.run(
        [
            py,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            _torch_pin(),
            f"triton=={triton}",
            f"numpy=={numpy}",
        ],
        check=True,
        timeout=1200,
    )
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("TRITON_INTERPRET", "VIRTUAL_ENV")
    }
    env["PYTHONPATH"] = str(ROOT)
    run = subprocess.run(
        [py, str(SMOKE)], env=env, capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stdout + run.stderr[-4000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["triton"] == triton and got["numpy"] == numpy, got
    assert all(e < 1e-4 for e in got["errors"].values()), got


def test_triton_imported_first_says_what_to_do(tmp_path):
    """Importing triton before kernels on a CPU: a clear ImportError, not Triton's
    "Cannot call @triton.jit'd outside of the scope of a kernel" at the first call."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)
    env["CUDA_VISIBLE_DEVICES"] = ""  # no GPU, even where there is one
    run = subprocess.run(
        [sys.executable, "-c", "import triton\nimport kernels"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode != 0
    assert "ImportError: triton was imported before kernels" in run.stderr
    assert "TRITON_INTERPRET=1" in run.stderr and "restart" in run.stderr
    # ... and with the variable set first, the same order works
    env["TRITON_INTERPRET"] = "1"
    ok = subprocess.run(
        [sys.executable, "-c", "import triton\nimport kernels"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ok.returncode == 0, ok.stderr
