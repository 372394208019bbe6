"""kernels.flex.compile_check: the flex kernels compile ahead of time for
sm_75/80/89/90 at their shipped tiles without spills (no GPU needed).

Compiles, in a subprocess with TRITON_INTERPRET unset, the representative subset
``python -m kernels.flex.compile_check --quick``: every kernel (fwd, dkdv, dq) and
every instantiation (causal, window, document, softcap + sink, a user's bare score
mod: the backward's five-point difference) once, spread over the
four targets. The full matrix is ``python -m kernels.flex.compile_check``.
"""

import pytest

from tests.kernels.compile_tools import run_compiled, table_rows


@pytest.mark.slow
def test_flex_kernels_compile_without_spills():
    proc, out = run_compiled("-m", "kernels.flex.compile_check", "--quick")
    rows = table_rows(proc.stdout, ("fwd", "dkdv", "dq"))
    assert proc.returncode == 0, out
    assert {r[0] for r in rows} == {"fwd", "dkdv", "dq"}, out
    names = {"causal", "window", "document", "softcap-sink", "user-score"}
    assert {r[1] for r in rows} == names, out
    assert {r[2] for r in rows} == {"sm75", "sm80", "sm89", "sm90"}, out
    assert all(r[-1] == "ok" and r[10] == "0" for r in rows), out
    assert any(r[0] == "fwd" and r[2] == "sm90" and r[11] == "yes" for r in rows), out
