"""Argument checks shared by the NumPy side (``attention.core``, ``flash``, ``hard``,
``deformable``, ``decode``, ``ring``, ``positions``, ``memory.ring``).

One helper per kind of argument: a flag (``check_bool``), a count (``check_int``), a
real number in a range (``check_real``: bandwidths, bytes, rates), the softmax scale, an
axis, an array of reals, a boolean mask, and block indices (``as_block_indices``).
Each returns the checked value in its working form and raises ``TypeError`` (wrong
kind: a string where a bool belongs, a float where an int belongs, a non-numeric array)
or ``ValueError`` (wrong shape or range), naming the argument as the caller wrote it
(``name``) and what was expected.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

__all__ = [
    "as_block_indices",
    "as_mask",
    "as_real_array",
    "check_axis",
    "check_bool",
    "check_int",
    "check_real",
    "check_scale",
]


def check_bool(name: str, value) -> bool:
    """``value`` as a bool; TypeError for anything else (``"False"`` is not False)."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise TypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")


def check_int(name: str, value, minimum: int | None = None) -> int:
    """``value`` as a Python int (NumPy integers accepted; bools and floats refused)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(
        value, (numbers.Integral, np.integer)
    ):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def check_scale(name: str, scale, d: int) -> float:
    """The softmax scale as a float: 1/sqrt(d) when None, else a finite real number."""
    if scale is None:
        if d < 1:
            raise ValueError(
                "the head dim d must be >= 1 for the default scale "
                f"1/sqrt(d), got d={d}"
            )
        return 1.0 / math.sqrt(d)
    if isinstance(scale, (bool, np.bool_)) or not isinstance(
        scale, (numbers.Real, np.number)
    ):
        raise TypeError(
            f"{name} must be a real number or None, got {type(scale).__name__}"
        )
    scale = float(scale)
    if not math.isfinite(scale):
        raise ValueError(f"{name} must be finite, got {scale}")
    return scale


def as_real_array(name: str, x, min_ndim: int = 0) -> np.ndarray:
    """``np.asarray(x)``, refusing non-numeric, boolean and complex dtypes; integers
    become float64 (every computation here is in floating point)."""
    a = np.asarray(x)
    if a.dtype == np.bool_ or not (
        np.issubdtype(a.dtype, np.integer) or np.issubdtype(a.dtype, np.floating)
    ):
        raise TypeError(
            f"{name} must be a real (integer or floating) array, got dtype {a.dtype}"
        )
    if np.issubdtype(a.dtype, np.integer):
        a = a.astype(np.float64)
    if a.ndim < min_ndim:
        shape = " (..., N, d)" if min_ndim == 2 else ""
        raise ValueError(
            f"{name} must be at least {min_ndim}-D{shape}, got shape {a.shape}"
        )
    return a


def check_axis(name: str, axis, ndim: int) -> int:
    axis = check_int(name, axis)
    if not -ndim <= axis < ndim:
        raise ValueError(f"{name}={axis} is out of range for an array of {ndim} dims")
    return axis % ndim


def as_mask(name: str, mask, shape: tuple) -> np.ndarray:
    """A boolean mask broadcast to ``shape`` (True = may attend)."""
    m = np.asarray(mask)
    if m.dtype != np.bool_:
        raise TypeError(
            f"{name} must be a boolean array (True = may attend), got dtype {m.dtype}"
        )
    try:
        return np.broadcast_to(m, shape)
    except ValueError:
        raise ValueError(
            f"{name} of shape {m.shape} does not broadcast to the scores' "
            f"shape {tuple(shape)} (..., N_q, N_k)"
        ) from None


def check_real(
    name: str, value, minimum: float | None = None, positive: bool = False
) -> float:
    """``value`` as a finite float (ints and NumPy numbers accepted; bools, strings and
    arrays refused with TypeError; NaN, inf, values below ``minimum`` or, with
    ``positive``, values <= 0 refused with ValueError)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(
        value, (numbers.Real, np.integer, np.floating)
    ):
        raise TypeError(
            f"{name} must be a real number, got {type(value).__name__} {value!r}"
        )
    x = float(value)
    if positive and not (math.isfinite(x) and x > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    if minimum is not None and not (math.isfinite(x) and x >= minimum):
        raise ValueError(f"{name} must be a finite number >= {minimum}, got {value!r}")
    if not math.isfinite(x):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return x


def as_block_indices(name: str, idx, n_blocks: int, shape: tuple | None = None):
    """Block indices as int64 (..., S), one selection a row: integers in [-1,
    n_blocks) (-1 is padding), the non-negative ones of a row distinct (a block read
    twice is not two blocks); ``shape``: the leading axes they must have. TypeError for
    a non-integer array, ValueError naming the first bad entry otherwise."""
    a = np.asarray(idx)
    if a.dtype == np.bool_ or not np.issubdtype(a.dtype, np.integer):
        raise TypeError(f"{name} must be an integer array, got dtype {a.dtype}")
    if a.ndim < 1:
        raise ValueError(f"{name} must have a last axis of indices, got a scalar")
    if shape is not None and a.shape[:-1] != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)} + (S,), got {a.shape}")
    a = a.astype(np.int64)
    bad = (a < -1) | (a >= n_blocks)
    if bad.any():
        raise ValueError(
            f"{name} holds {int(a[bad][0])}, outside the key blocks [0, {n_blocks}) "
            "(-1 is padding)"
        )
    s = np.sort(a, axis=-1)
    dup = (s[..., 1:] == s[..., :-1]) & (s[..., 1:] >= 0)
    if dup.any():
        raise ValueError(
            f"{name} repeats block {int(s[..., 1:][dup][0])} within a row (the "
            "indices of a row must be distinct)"
        )
    return a
