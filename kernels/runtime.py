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

import torch

HAS_CUDA: bool = bool(torch.cuda.is_available())

if not HAS_CUDA and "TRITON_INTERPRET" not in os.environ:
    os.environ["TRITON_INTERPRET"] = "1"

#: True when Triton kernels run under the NumPy-backed interpreter (CPU tensors).
INTERPRET: bool = os.environ.get("TRITON_INTERPRET", "0") == "1"

#: The torch device kernels expect their inputs on.
DEVICE: torch.device = torch.device("cpu" if INTERPRET or not HAS_CUDA else "cuda")


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
