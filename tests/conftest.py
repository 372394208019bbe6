"""Shared test setup: kernels run under the Triton interpreter unless a GPU is present;
every test starts from fixed random seeds and no open figure."""

import pathlib

import matplotlib

# kernels.runtime sets TRITON_INTERPRET on CPU before any kernel
import kernels  # noqa: F401

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _fresh_state():
    """No open matplotlib figure before or after a test, and the global generators
    seeded, so a test that draws from them is reproducible whatever ran before it (xdist
    distributes tests differently on every run)."""
    plt.close("all")
    torch.manual_seed(0)
    np.random.seed(0)
    yield
    plt.close("all")


def pytest_collection_modifyitems(config, items):
    """The long tests (marked ``slow``: the Colab-path runs, the compile checks, the
    gloo groups, the benchmark dry run) first, the rest in collection order after them:
    pytest-xdist hands out work in this order, so the two workers no longer end on a
    long test one of them started last while the other waits."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
