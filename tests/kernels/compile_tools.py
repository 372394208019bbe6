"""Shared by the tests that compile kernels for GPU targets on this CPU: Python run in
a subprocess from the repository root with the interpreter off, and the rows of a
machine-code check's table."""

import os
import subprocess
import sys

from tests.conftest import ROOT


def run_compiled(*args: str, timeout: int = 600, interpret: str | None = None):
    """``python *args`` with TRITON_INTERPRET removed from the environment (set to
    ``interpret`` when given): (the completed process, its stdout and stderr)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if interpret is not None:
        env["TRITON_INTERPRET"] = interpret
    proc = subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return proc, proc.stdout + proc.stderr


def table_rows(stdout: str, kernels) -> list[list[str]]:
    """The lines of a check's table whose first column is one of ``kernels``, split
    into columns."""
    return [
        line.split()
        for line in stdout.splitlines()
        if line.split() and line.split()[0] in kernels
    ]
