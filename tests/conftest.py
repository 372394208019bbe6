"""Shared test setup: kernels run under the Triton interpreter unless a GPU is present."""

import pathlib

import kernels  # noqa: F401  (imports kernels.runtime first: sets TRITON_INTERPRET on CPU)

ROOT = pathlib.Path(__file__).resolve().parent.parent


import matplotlib  # noqa: E402

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _close_figures():
    """Each test starts with no open matplotlib figure (and leaves none behind)."""
    plt.close("all")
    yield
    plt.close("all")
