"""The kernels' shared internal layer: constants, the dtype table, the device facts
(architectures and their shared memory, the padded head dim), argument checks and the
softmax-scale rule.

Every kernel family (``flash``, ``hard``, ``deformable``, ``decode``, ``ring`` and the
ones after them) takes these from here instead of from a sibling's private names, so
one rule has one definition. The names below are the layer's whole surface
(``__all__``); anything a family lends another family is a public name of the lending
package instead (for example ``kernels.flash.forward_lse``).

Conventions
    * Scores are kept in base 2 inside the kernels: ``exp(x) = exp2(x * LOG2E)`` and
      ``log(x) = log2(x) * LN2``; the scale is multiplied by ``LOG2E`` on the host.
      ``@triton.jit`` code reads the same two numbers as ``LOG2E_JIT`` and ``LN2_JIT``
      (``tl.constexpr``: a kernel may read a global only when it is one).
    * The softmax scale defaults to ``1 / sqrt(d)`` (``check_scale``); a kernel takes
      it as a float32 argument (``kernel_scale``). Inside the package the scale is
      called ``scale``; public calls keep the name users know from their anchor
      (``softmax_scale`` in flash-attn-style calls, ``scale`` in PyTorch-style ones)
      and pass it here with that name, so an error names what the caller wrote.
"""

from __future__ import annotations

import math
import numbers
import warnings

import torch

from . import runtime

try:
    import triton.language as tl
except ImportError:  # pragma: no cover - no triton (not Linux): host names still import
    tl = None

__all__ = [
    "ARCHS",
    "arch_class",
    "block_d",
    "check_head_dim",
    "FLOAT_DTYPES",
    "DTYPE_NAMES",
    "FP32_MAX",
    "FP32_TINY",
    "LN2",
    "LN2_JIT",
    "LOG2E",
    "LOG2E_JIT",
    "check_alike",
    "check_bool",
    "check_float_tensor",
    "check_device",
    "check_int",
    "check_qkv",
    "check_scale",
    "check_size",
    "check_tensor",
    "dot_precision",
    "kernel_scale",
    "renamed_scale",
    "upcast",
    "upcast_on",
]

LOG2E = 1.4426950408889634  # log2(e): exp(x) = exp2(x * LOG2E)
LN2 = 0.6931471805599453  # ln(2): log(x) = log2(x) * LN2
# the same two for @triton.jit code, which reads a global only as a tl.constexpr
LOG2E_JIT = tl.constexpr(LOG2E) if tl is not None else LOG2E
LN2_JIT = tl.constexpr(LN2) if tl is not None else LN2
FP32_MAX = 3.4028234663852886e38
FP32_TINY = 2.0**-126  # the smallest normal float32

# The dtypes every attention kernel takes, and their short names (reports, suites).
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
DTYPE_NAMES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


# --- Device facts: the architectures, their shared memory, the padded head dim. ---
#: The GPU architectures every family's tile tables are written for (and the
#: ahead-of-time compile checks target), with their shared memory per block (bytes, the
#: opt-in maximum from the CUDA programming guide's compute-capability table).
ARCHS: dict[str, tuple[tuple[int, int], int]] = {
    "sm75": ((7, 5), 64 * 1024),
    "sm80": ((8, 0), 163 * 1024),
    "sm89": ((8, 9), 99 * 1024),
    "sm90": ((9, 0), 227 * 1024),
}


def arch_class(capability: tuple[int, int]) -> str:
    """Which config table a GPU uses: (7, 5) -> 'sm75', (8, 6)/(8, 9) -> 'sm89', ...

    ``capability`` is a (major, minor) pair of ints, as
    ``torch.cuda.get_device_capability`` returns (not a string like "sm90").
    """
    if (
        not isinstance(capability, (tuple, list))
        or len(capability) != 2
        or not all(
            isinstance(c, int) and not isinstance(c, bool) and c >= 0
            for c in capability
        )
    ):
        raise TypeError(
            "capability must be a (major, minor) pair of ints such as "
            f"(9, 0), got {type(capability).__name__} {capability!r}"
        )
    major, minor = capability
    if major < 8:
        return "sm75"
    if major == 8:
        return "sm80" if minor == 0 else "sm89"
    if major == 12:  # consumer Blackwell: ~99 KB shared memory, like sm_89
        return "sm89"
    return "sm90"


def block_d(head_dim: int) -> int:
    """Padded head dim: the next power of two, at least 16 (the smallest tl.dot tile).
    ``head_dim`` is an int >= 1."""
    if isinstance(head_dim, bool) or not isinstance(head_dim, int):
        raise TypeError(
            f"head_dim must be an int, got {type(head_dim).__name__} {head_dim!r}"
        )
    if head_dim < 1:
        raise ValueError(f"head_dim must be >= 1, got {head_dim}")
    return max(16, 1 << (head_dim - 1).bit_length())  # triton.next_power_of_2


def check_head_dim(head_dim, limit: int) -> int:
    """``head_dim`` as an int in 1..limit (the tile tables' range), else TypeError or
    ValueError naming it."""
    bd = block_d(head_dim)  # type and >= 1
    if head_dim > limit:
        raise ValueError(
            f"head_dim must be in 1..{limit} (the largest head dim the "
            f"tile tables cover), got {head_dim}"
        )
    return bd


def check_bool(name: str, value) -> bool:
    """A flag: exactly ``True`` or ``False`` (TypeError naming ``name`` otherwise; an
    int 0/1 or a tensor is not a flag)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")
    return value


def check_int(name: str, value, minimum: int | None = None) -> int:
    """An int (bools and floats refused, TypeError), at least ``minimum`` when given
    (ValueError); both errors name ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def check_size(name: str, value) -> int:
    """A size: a non-negative int (TypeError for bools and floats)."""
    return check_int(name, value, 0)


def check_device(name: str, device) -> torch.device:
    """Where a kernel can run: a CUDA device for the compiled kernels; under the
    Triton interpreter a CPU or CUDA one (a meta tensor has no data to read).
    ValueError naming ``name`` (the tensors as the caller wrote them) otherwise."""

    device = torch.device(device)
    if runtime.INTERPRET:
        if device.type not in ("cpu", "cuda"):
            raise ValueError(
                f"{name} must be on a CPU or CUDA device for the Triton interpreter, "
                f"got {device} (a {device.type} tensor holds no data to compute on)"
            )
    elif device.type != "cuda":
        raise ValueError(
            f"{name} must be CUDA tensors for the compiled kernels, got {device} "
            f"(set TRITON_INTERPRET=1 before importing kernels to run on the CPU)"
        )
    return device


def check_tensor(name: str, value) -> torch.Tensor:
    """A torch.Tensor (TypeError naming ``name`` otherwise)."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    return value


def _dtype_names(dtypes) -> str:
    """'float16, bfloat16 or float32'."""
    names = [str(d).removeprefix("torch.") for d in dtypes]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def check_float_tensor(
    name: str, t, ndim: int = 4, shape: str = "(B, H, N, d)", dtypes=None
) -> torch.Tensor:
    """``t`` a torch.Tensor (TypeError) of ``ndim`` dims laid out as ``shape``
    (ValueError), floating point and one of ``dtypes`` when given (TypeError); each
    error names ``name``, the caller's argument."""
    check_tensor(name, t)
    if t.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D {shape}, got shape {tuple(t.shape)}")
    if dtypes is not None and t.dtype not in dtypes:
        raise TypeError(f"{name} must be {_dtype_names(dtypes)}, got dtype {t.dtype}")
    if not t.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {t.dtype}")
    return t


def check_alike(what: str, **tensors) -> None:
    """The tensors (keyword = the caller's name) share a ``"dtype"`` (TypeError) or a
    ``"device"`` (ValueError); the error names each tensor with its own."""
    if what not in ("dtype", "device"):
        raise ValueError(f"what must be 'dtype' or 'device', got {what!r}")
    values = {name: getattr(t, what) for name, t in tensors.items()}
    if len(set(values.values())) > 1:
        names = ", ".join(values)
        got = ", ".join(f"{name} {value}" for name, value in values.items())
        if what == "dtype":
            raise TypeError(f"{names} must share a dtype, got {got}")
        raise ValueError(f"{names} must be on one device, got {got}")


def check_qkv(
    q,
    k,
    v,
    same_dtype: bool = True,
    *,
    dtypes=None,
    same_head_dim_v: bool = True,
    max_head_dim: int | None = None,
) -> None:
    """q (B, H, N_q, d), k (B, H_kv, N_k, d) and v (B, H_kv, N_k, d_v): 4-D
    floating-point tensors on one device, batch and head dim of k matching q, H a
    multiple of H_kv (GQA). TypeError/ValueError naming the tensor and its values
    otherwise. The options, for what each caller takes:

    * ``same_dtype``: one dtype for the three (False: the fp64 reference takes mixed
      inputs); ``dtypes``: the dtypes accepted (None: any floating point);
    * ``same_head_dim_v``: v of k's shape (False: d_v may differ from d); ``v`` None:
      q and k only (a block selection scores without values);
    * ``max_head_dim``: a kernel launch: head dims in 1..max_head_dim, every size
      >= 1, CUDA tensors unless the Triton interpreter runs.
    """
    tensors = {"q": q, "k": k} if v is None else {"q": q, "k": k, "v": v}
    for name, t in tensors.items():
        check_float_tensor(name, t, 4, "(B, H, N, d)", dtypes)
    if same_dtype:
        check_alike("dtype", **tensors)
    check_alike("device", **tensors)
    names = ", ".join(tensors)
    if max_head_dim is not None:  # a kernel launch: where it can run
        check_device(names, q.device)
    (B, H, N_q, d), (Bk, H_kv, N_k, dk) = q.shape, k.shape
    for what, a, b in (("batch", Bk, B), ("head dim", dk, d)):
        if a != b:
            raise ValueError(
                f"k {what} {a} (shape {tuple(k.shape)}) does not match q {what} {b} "
                f"(shape {tuple(q.shape)})"
            )
    if H_kv == 0 or H % H_kv != 0:
        raise ValueError(
            f"q heads H={H} must be a multiple of k/v heads H_kv={H_kv} "
            f"(q {tuple(q.shape)}, k {tuple(k.shape)})"
        )
    if v is not None and same_head_dim_v and k.shape != v.shape:
        raise ValueError(
            f"k and v must have the same shape, got k {tuple(k.shape)} "
            f"and v {tuple(v.shape)}"
        )
    if v is not None and tuple(v.shape[:3]) != tuple(k.shape[:3]):
        raise ValueError(
            f"v must be (B, H_kv, N_k, d_v) with k's (B, H_kv, N_k) = "
            f"{tuple(k.shape[:3])}, got v {tuple(v.shape)}"
        )
    if max_head_dim is not None:
        for name, t in tensors.items():
            if not 1 <= t.shape[-1] <= max_head_dim:
                raise ValueError(
                    f"{name}'s head dim must be in 1..{max_head_dim}, got "
                    f"{t.shape[-1]} ({name} {tuple(t.shape)})"
                )
        if min(B, H, N_q, H_kv, N_k) < 1:
            raise ValueError(
                f"batch, heads and lengths must be >= 1, got q {tuple(q.shape)}, "
                f"k {tuple(k.shape)}"
            )


def renamed_scale(scale, old, name: str, old_name: str = "sm_scale"):
    """The scale a public call got: ``scale`` under its current name ``name``, or
    ``old`` under the old keyword ``old_name``, still accepted with a
    DeprecationWarning so existing code runs. Both given: TypeError."""
    if old is None:
        return scale
    if scale is not None:
        raise TypeError(f"pass {name} only ({old_name} is its old name), not both")
    warnings.warn(
        f"{old_name}= is deprecated, pass {name}= instead",
        DeprecationWarning,
        stacklevel=3,
    )
    return old


def check_scale(scale, d: int, name: str = "scale") -> float:
    """The softmax scale: ``1/sqrt(d)`` when None; refused, naming ``name``, when it is
    not a finite real number (TypeError/ValueError) or when ``scale * log2(e)``, the
    factor the kernels fold into their exp2 scores, overflows float32."""
    if scale is None:
        return 1.0 / math.sqrt(d)
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(
            f"{name} must be a real number or None, got {type(scale).__name__}"
        )
    value = float(scale)
    if not math.isfinite(value) or abs(value) * LOG2E > FP32_MAX:
        raise ValueError(
            f"{name} must be finite with |{name} * log2(e)| within "
            f"float32 (|{name}| <= {FP32_MAX / LOG2E:.3g}), got {scale}"
        )
    return value


def kernel_scale(scale, d: int, name: str = "scale") -> float:
    """``check_scale`` for a Triton kernel, whose scale is a float32 argument: a nonzero
    |scale| below the smallest normal float32 (which Triton cannot pass as fp32) is
    flushed to 0. That changes no fp32 result: exp2(s * scale * log2 e) rounds to 1 for
    every finite fp32 score s either way."""
    value = check_scale(scale, d, name)
    return 0.0 if abs(value) < FP32_TINY else value


def upcast(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether bf16 tiles go through fp32: under the Triton interpreter (its bf16
    ``tl.dot`` is wrong) and on GPUs without bf16 tensor cores (below sm_80)."""

    if dtype != torch.bfloat16:
        return False
    return upcast_on(
        dtype, None if runtime.INTERPRET else torch.cuda.get_device_capability(device)
    )


def upcast_on(dtype: torch.dtype, capability: tuple[int, int] | None) -> bool:
    """``upcast`` for a GPU of compute ``capability``, or the interpreter when it is
    None: what tile tables and ahead-of-time compiles ask without a device."""
    return dtype == torch.bfloat16 and (
        capability is None or tuple(capability) < (8, 0)
    )


def dot_precision(dtype: torch.dtype) -> str:
    """``tl.dot``'s input precision: IEEE fp32 for float32 inputs (no TF32, PyTorch's
    default); fp16/bf16 dots ignore it."""
    return "ieee" if dtype == torch.float32 else "tf32"
