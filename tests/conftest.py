"""Shared test setup: kernels run under the Triton interpreter unless a GPU is present."""

import pathlib

import kernels  # noqa: F401  (imports kernels.runtime first: sets TRITON_INTERPRET on CPU)

ROOT = pathlib.Path(__file__).resolve().parent.parent
