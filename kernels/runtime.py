"""Where Triton kernels run: CUDA when a GPU is present, else the Triton interpreter.

This is the one place that decides. ``TRITON_INTERPRET`` must be set before
``triton.jit`` decorates a kernel, so this module is imported by ``kernels/__init__``
before any kernel module. A reader can force the interpreter on a GPU machine by
setting ``TRITON_INTERPRET=1`` before importing ``kernels``.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import re
import sys

import torch

HAS_CUDA: bool = bool(torch.cuda.is_available())

if not HAS_CUDA and "TRITON_INTERPRET" not in os.environ:
    os.environ["TRITON_INTERPRET"] = "1"

#: True when Triton kernels run under the NumPy-backed interpreter (CPU tensors).
INTERPRET: bool = os.environ.get("TRITON_INTERPRET", "0") == "1"

#: The torch device kernels expect their inputs on.
DEVICE: torch.device = torch.device("cpu" if INTERPRET or not HAS_CUDA else "cuda")


def _triton_imported_compiled() -> bool:
    """True when ``triton`` was imported before this module with the interpreter off.

    ``triton.jit`` decides when a function is *defined* whether it is interpreted, and
    Triton's own library (``tl.max``, ``tl.sum``, ... in ``triton.language.standard``)
    is defined when ``triton`` is first imported. Imported first on a machine without a
    CUDA GPU, those helpers stay GPU functions, and every kernel that calls one fails
    under the interpreter with "Cannot call @triton.jit'd outside of the scope of a
    kernel".
    """
    standard = sys.modules.get("triton.language.standard")
    if standard is None:
        return False
    from triton.runtime.jit import JITFunction

    return any(type(f) is JITFunction for f in vars(standard).values())


if INTERPRET and _triton_imported_compiled():
    raise ImportError(
        "triton was imported before kernels on a machine without a CUDA GPU, so "
        "Triton's own functions were set up for a GPU and its interpreter cannot run "
        "them. Restart the Python process (in Jupyter or Colab: restart the kernel or "
        "session), then import kernels before triton (in a chapter: run its first "
        "cell first), or set the environment variable TRITON_INTERPRET=1 before "
        "anything imports triton."
    )


def _mend_interpreter_index() -> None:
    """Let Triton 3.4-3.6's interpreter take a computed loop bound under NumPy >= 2.4.

    The interpreter holds a scalar as a one-element 1-d array, and those versions turn
    it into a Python int with ``int(array)`` when it is a ``range`` bound (``range(lo,
    hi, BLOCK_N)`` with ``lo`` or ``hi`` computed by ``tl`` ops). NumPy deprecated that
    conversion in 1.25 and refuses it from 2.4 on ("only 0-dimensional arrays can be
    converted to Python scalars"). Triton 3.7 squeezes the array first; here the older
    interpreters get the same ``__index__`` each time they patch ``tl.tensor`` for a
    kernel call. Compiled kernels are not touched.
    """
    try:
        import triton
        from triton.runtime import interpreter
    except ImportError:  # pragma: no cover - triton is pinned on Linux
        return
    if tuple(int(p) for p in re.findall(r"\d+", triton.__version__)[:2]) >= (3, 7):
        return  # squeezes by itself
    patch = getattr(interpreter, "_patch_lang_tensor", None)
    if patch is None or getattr(patch, "_mended", False):
        return

    def index(self) -> int:
        return (
            int(self.handle.data.reshape(-1)[0])
            if self.handle.data.size == 1
            else int(self.handle.data)
        )  # a block: let NumPy say why it cannot

    def mended(tensor, *args, **kwargs):
        patch(tensor, *args, **kwargs)
        scope = args[0] if args else kwargs.get("scope")
        if scope is not None and hasattr(scope, "set_attr"):  # 3.7 restores after
            scope.set_attr(tensor, "__index__", index)
        else:
            tensor.__index__ = index

    mended._mended = True
    interpreter._patch_lang_tensor = mended


def _skip_nested_repatch() -> None:
    """Spare Triton 3.7's interpreter re-patching ``triton.language`` at every call of a
    ``@triton.jit`` helper inside a kernel it is already running.

    The interpreter swaps ``tl``'s builtins for NumPy-backed ones when a kernel is
    launched and swaps them back when it returns. It also patches again at each call
    of a helper (a ``mask_mod``, an inner-loop step), once per program and loop
    iteration: ``inspect.getmembers`` over ``tl``, ``tl.tensor`` and ``tl.math``, about
    0.6 ms a call, finding nothing left to swap. (Measured: 21,700 such calls in one
    ``benchmarks/run.py --dry-run``.) Here a helper's call patches only when its module
    sees a language module (``tl`` or ``tl.core``) the running launch did not patch;
    otherwise the patch would change nothing, and the call goes straight on. Launches
    patch and restore exactly as before. Older interpreters, whose patches have no
    scope to restore, are left as they are; compiled kernels are not touched.
    """
    try:
        import triton
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:  # pragma: no cover - triton is pinned on Linux
        return
    if tuple(int(p) for p in re.findall(r"\d+", triton.__version__)[:2]) < (3, 7):
        return  # the structure read here is 3.7's
    patch = getattr(interpreter, "_patch_lang", None)
    scope_type = getattr(interpreter, "_LangPatchScope", None)
    if patch is None or scope_type is None or getattr(patch, "_spared", False):
        return
    running: list[set] = []  # per launch in progress: the language modules it patched

    def langs(fn) -> set:
        return {id(v) for v in fn.__globals__.values() if v is tl or v is tl.core}

    def spared(fn):
        need = langs(fn)
        if running:  # a helper's call inside a kernel
            if need <= running[-1]:
                return scope_type()  # nothing to patch; the launch restores
            running[-1] |= need
            return patch(fn)
        scope = patch(fn)  # a launch: patched now, restored when it returns
        running.append(need)
        restore = scope.restore

        def restore_and_pop():
            running.pop()
            restore()

        scope.restore = restore_and_pop
        return scope

    spared._spared = True
    interpreter._patch_lang = spared


if INTERPRET:
    _mend_interpreter_index()
    _skip_nested_repatch()


def compile_ahead(module: str, name: str) -> None:
    """For the machine-code checks, ``python -m kernels.machine_code.<check>``: compile,
    do not interpret. Sets ``TRITON_INTERPRET=0`` and, when this process chose the
    interpreter (``python -m`` imported ``kernels`` before the check's first line) and
    ``name`` is ``"__main__"``, starts ``python -m module`` again with the same
    arguments, which inherits the setting."""
    os.environ["TRITON_INTERPRET"] = "0"
    if INTERPRET and name == "__main__":
        os.execv(sys.executable, [sys.executable, "-m", module, *sys.argv[1:]])


def device() -> torch.device:
    """The device to allocate kernel inputs on (``cuda`` or, under the interpreter,
    ``cpu``)."""
    return DEVICE


def capability() -> tuple[int, int] | None:
    """CUDA compute capability of the current GPU, or None without one."""
    if not HAS_CUDA:
        return None
    return tuple(torch.cuda.get_device_capability())  # type: ignore[return-value]


def gpu_name() -> str | None:
    return torch.cuda.get_device_name() if HAS_CUDA else None


def slug(name: str) -> str:
    """'NVIDIA H200' -> 'nvidia-h200' (used for benchmarks/results/<slug>.json)."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def describe() -> dict:
    """Provenance for recorded results: GPU, versions, date."""
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:  # pragma: no cover - triton is pinned on Linux
        triton_version = None
    cap = capability()
    return {
        "gpu": gpu_name(),
        "capability": list(cap) if cap else None,
        "torch": torch.__version__,
        "triton": triton_version,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "interpreter": INTERPRET,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
