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


def _bf16_bits(data):
    """The bfloat16 bit patterns (uint16) of ``data`` rounded to the nearest, ties to
    even, as a GPU's ``cvt.rn.bf16.f32`` rounds. fp32 by its bits: add 0x7FFF plus the
    kept part's lowest bit, drop the low 16 (a carry runs into the exponent: the
    largest values round to inf; subnormals round like any other value); a NaN stays
    NaN (its top bits, quiet bit set). Anything else (fp64, integers) through fp64 and
    torch's own cast."""
    import numpy as np

    data = np.asarray(data)
    if data.dtype != np.float32:
        wide = torch.from_numpy(np.ascontiguousarray(data, dtype=np.float64))
        return wide.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    bits = np.ascontiguousarray(data).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    rounded = np.where(np.isnan(data), (bits >> 16) | 0x40, rounded)
    return rounded.astype(np.uint16).reshape(data.shape)


def _round_bf16_casts() -> None:
    """Make the interpreter's casts to bfloat16 round to the nearest, ties to even, as
    a GPU's do.

    Triton 3.4-3.7's interpreter casts fp32 to bf16 by dropping the low 16 bits
    (``_convert_float`` with no rounding mode), so every bf16 output on a CPU sat up to
    an ulp nearer zero than the GPU's; ``fp_downcast_rounding="rtne"`` takes the same
    path (nearest-even is the default, the plain cast); and fp64 or integers cast to
    bf16 came out as raw integer bits. Here ``InterpreterBuilder.cast_impl`` (which the
    interpreter's fp-truncating and int-to-float casts call) rounds every cast to bf16
    from fp32, fp64 or an integer with ``_bf16_bits``; other casts (fp16 from fp32 is
    NumPy's, already to nearest; fp8; explicit ``rtz``, which truncates as a GPU does)
    are untouched. Applied only where the interpreter has that method and a probe
    finds it truncating, so a Triton that rounds is left alone. Compiled kernels are
    not touched.
    """
    try:
        import numpy as np
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:  # pragma: no cover - triton is pinned on Linux
        return
    builder = getattr(interpreter, "InterpreterBuilder", None)
    handle = getattr(interpreter, "TensorHandle", None)
    cast = getattr(builder, "cast_impl", None)
    if cast is None or handle is None or getattr(cast, "_rounded", False):
        return
    try:  # 1 + 2^-8 + 2^-9 is above the tie: nearest is 1 + 2^-7, truncation 1
        probe = handle(np.array([1.0 + 2**-8 + 2**-9], dtype=np.float32), tl.float32)
        got = np.asarray(cast(None, probe, tl.bfloat16).data).view(np.uint16)
        if int(got.reshape(-1)[0]) == 0x3F81:
            return  # rounds already
    except Exception:  # an interpreter laid out otherwise: round all the same
        pass

    def rounded(self, src, dst_type):
        dst, s = dst_type.scalar, src.dtype.scalar
        if dst == tl.bfloat16 and (s.is_fp32() or s.is_fp64() or s.is_int()):
            return handle(_bf16_bits(src.data), dst)
        return cast(self, src, dst_type)

    rounded._rounded = True
    builder.cast_impl = rounded


if INTERPRET:
    _mend_interpreter_index()
    _skip_nested_repatch()
    _round_bf16_casts()


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
