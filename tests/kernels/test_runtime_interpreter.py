"""kernels.runtime's change to Triton 3.7's interpreter: a ``@triton.jit`` helper called
inside a running kernel does not patch ``triton.language`` again when the launch has
patched it already; a helper whose module sees another language module still patches;
launches restore ``tl`` as before."""

import importlib
import inspect
import sys

import pytest
import torch
import triton
import triton.language as tl
from triton.errors import TritonError

from kernels import runtime

pytestmark = pytest.mark.skipif(not runtime.INTERPRET, reason="interpreter only")

interpreter = pytest.importorskip("triton.runtime.interpreter")
SPARED = getattr(interpreter._patch_lang, "_spared", False)


@triton.jit
def _relu(x):
    return tl.maximum(x, 0.0)


@triton.jit
def _steps_kernel(x_ptr, out_ptr, STEPS: tl.constexpr, N: tl.constexpr):
    offs = tl.arange(0, N)
    x = tl.load(x_ptr + offs)
    for _ in tl.static_range(STEPS):
        x = _relu(x - 1.0)
    tl.store(out_ptr + offs, x)


def _run(steps: int, x: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    _steps_kernel[(1,)](x, out, STEPS=steps, N=x.numel())
    return out


def _count_getmembers(monkeypatch) -> list:
    calls = []
    real = inspect.getmembers

    def counted(obj, *args, **kwargs):
        calls.append(obj)
        return real(obj, *args, **kwargs)

    monkeypatch.setattr(interpreter.inspect, "getmembers", counted)
    return calls


@pytest.mark.skipif(
    tuple(int(p) for p in triton.__version__.split(".")[:2]) < (3, 7),
    reason="applied to Triton 3.7's interpreter only",
)
def test_applied_under_triton_37():
    assert SPARED


@pytest.mark.skipif(not SPARED, reason="not applied to this Triton")
def test_a_helper_called_in_a_loop_patches_once_per_launch(monkeypatch):
    x = torch.linspace(-4, 12, 16)
    calls = _count_getmembers(monkeypatch)
    once = _run(1, x)
    per_launch = len(calls)
    calls.clear()
    eight = _run(8, x)
    assert per_launch > 0 and len(calls) == per_launch  # not 8 more patches
    torch.testing.assert_close(once, torch.clamp(x - 1, min=0), rtol=0, atol=0)
    ref = x.clone()
    for _ in range(8):
        ref = torch.clamp(ref - 1, min=0)
    torch.testing.assert_close(eight, ref, rtol=0, atol=0)


@pytest.mark.skipif(not SPARED, reason="not applied to this Triton")
def test_a_helper_that_sees_another_language_module_still_patches(
    tmp_path, monkeypatch
):
    """A helper whose module imports ``triton.language.core`` (which the kernel's
    module does not name) gets the patch it needs, and computes under it."""
    (tmp_path / "core_helper.py").write_text(
        "import triton\n"
        "from triton.language import core\n\n\n"
        "@triton.jit\n"
        "def twice_max(x):\n"
        "    return core.maximum(x, 0.0) * 2.0\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    src = tmp_path / "core_kernel.py"
    src.write_text(
        "import triton\n"
        "import triton.language as tl\n"
        "from core_helper import twice_max\n\n\n"
        "@triton.jit\n"
        "def kernel(x_ptr, out_ptr, N: tl.constexpr):\n"
        "    offs = tl.arange(0, N)\n"
        "    tl.store(out_ptr + offs, twice_max(tl.load(x_ptr + offs)))\n"
    )
    mod = importlib.import_module("core_kernel")
    try:
        x = torch.linspace(-3, 3, 8)
        out = torch.empty_like(x)
        calls = _count_getmembers(monkeypatch)
        mod.kernel[(1,)](x, out, N=8)
        assert tl.core in calls  # the helper's own patch ran
        torch.testing.assert_close(out, 2 * torch.clamp(x, min=0), rtol=0, atol=0)
    finally:
        for name in ("core_kernel", "core_helper"):
            sys.modules.pop(name, None)


def test_launches_restore_the_language_as_before():
    before = {name: getattr(tl.tensor, name) for name in ("__add__", "__mul__", "T")}
    before_max = tl.maximum
    _run(3, torch.arange(8.0))
    with pytest.raises(TritonError, match="power of 2"):  # a failing launch restores
        _steps_kernel[(1,)](torch.arange(8.0), torch.empty(4), STEPS=1, N=6)
    assert tl.maximum is before_max
    assert {n: getattr(tl.tensor, n) for n in before} == before
