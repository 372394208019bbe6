"""The book's one palette and its shared helpers.

Every chapter draws with these colours, so a colour means the same thing on every
page: Q, K, V, S, P, O are always the same hue, and so are the memory levels
(HBM, SRAM, DRAM). Plot functions take an optional ``ax`` and return it, so a chapter
can compose them.
"""

from __future__ import annotations

import matplotlib as mpl
import matplotlib.pyplot as plt

#: A base-2 axis's ticks as lengths a reader takes in at once (16, 256, 1k, 64k).
POW2_LABELS = mpl.ticker.FuncFormatter(
    lambda v, _: f"{round(v) // 1024}k" if v >= 1024 else f"{v:g}"
)

#: Tensors keep their colours in every chapter.
TENSOR_COLORS: dict[str, str] = {
    "Q": "#4C72B0",  # blue
    "K": "#DD8452",  # orange
    "V": "#55A868",  # green
    "S": "#C44E52",  # red: the N x N scores
    "P": "#8172B3",  # purple: the N x N probabilities
    "O": "#937860",  # brown: the output
    "dO": "#B07AA1",
    "dQ": "#7DA3D9",
    "dK": "#F0B27A",
    "dV": "#8FCB9B",
    "l": "#8C8C8C",  # row sums
    "m": "#595959",  # row maxima
    "L": "#3F3F3F",  # log-sum-exp
    "idx": "#CCB974",
    # Backward-only tensors (light shades of their forward twins' colours).
    "dP": "#E08E90",  # light red: the gradient w.r.t. P
    "dS": "#F2B8B9",  # lighter red: the gradient w.r.t. S
    "D": "#A6A6A6",  # rowsum(dO * O)
    # Sampled keys and values are lighter shades of K and V; sampling positions share
    # idx's.
    "K̃": "#F3C29B",
    "Ṽ": "#A8D5B0",
    "points": "#CCB974",  # = idx
}

#: Memory levels keep theirs.
MEMORY_COLORS: dict[str, str] = {
    "HBM": "#2F4B7C",  # dark blue: big and slow
    "SRAM": "#FFA600",  # amber: small and fast
    "DRAM": "#7A7A7A",  # grey: CPU memory
    "read": "#2F4B7C",
    "write": "#D45087",
}

#: Implementations in timing plots.
IMPL_COLORS: dict[str, str] = {
    "naive": "#C44E52",
    "triton": "#4C72B0",
    "numpy": "#937860",
    "sdpa": "#55A868",
    "sdpa-flash": "#55A868",
    "sdpa-efficient": "#8FCB9B",
    "sdpa-cudnn": "#2E7D32",
    "sdpa-math": "#A5A5A5",
    "grid_sample+flash": "#64B5CD",
    "grid_sample+sdpa": "#55A868",
}

#: Sequential colour map for attention weights (0 = white, 1 = dark).
ATTENTION_CMAP = "Blues"

#: Boolean masks: a key a query may attend to, and a hidden one.
MASK_COLORS: dict[str, str] = {"keep": "#2171B5", "masked": "#EFEFEF"}

#: Bytes per element of the dtypes the widgets offer.
DTYPE_BYTES: dict[str, int] = {"float32": 4, "float16": 2, "bfloat16": 2, "float8": 1}

#: Tensors of size N x N_k: the ones FlashAttention keeps out of HBM.
QUADRATIC_TENSORS = ("S", "P", "dP", "dS")

#: Chapter 3's attention kinds and gradient estimators (soft attention weights are P).
SELECTION_COLORS: dict[str, str] = {
    "soft": TENSOR_COLORS["P"],
    "hard": TENSOR_COLORS["idx"],
    "argmax": TENSOR_COLORS["idx"],
    "topk": "#64B5CD",
    "reinforce": "#D95F02",
    "reinforce+baseline": "#E7298A",
    "gumbel-st": "#1B9E77",
}


def tensor_color(name: str) -> str:
    """The palette colour of a tensor (dark grey for a name outside it)."""
    return TENSOR_COLORS.get(name, "#333333")


def use_book_style() -> None:
    """Matplotlib defaults shared by every chapter."""
    mpl.rcParams.update(
        {
            "figure.dpi": 100,
            "savefig.dpi": 150,
            "figure.figsize": (6.4, 4.0),
            "axes.spines.top": False,
            "axes.spines.right": False,
            "axes.grid": False,
            "axes.titlesize": 11,
            "axes.labelsize": 10,
            "legend.frameon": False,
            "font.size": 10,
        }
    )


def _ax(ax):
    """``ax``, or the axes of a new figure when it is None."""
    if ax is None:
        _, ax = plt.subplots()
    return ax


def _sig3(x: float) -> str:
    """``x`` to three significant digits, a tie rounded half up on its exact binary
    value, trailing zeros dropped, never an exponent: the rule of JavaScript's
    ``String(Number(x.toPrecision(3)))``, which the site's explorers print with
    (12.25 -> '12.3', 1.5 -> '1.5', 1023.5 -> '1020')."""
    import decimal

    if x == 0:
        return "0"
    d = decimal.Decimal(x)  # exact
    q = d.quantize(
        decimal.Decimal(1).scaleb(d.adjusted() - 2), rounding=decimal.ROUND_HALF_UP
    )
    return format(q.normalize(), "f")


def _nonempty(name: str, x) -> None:
    """A figure needs something to draw: ValueError naming the empty argument."""
    if x is None or len(x) == 0:
        raise ValueError(f"{name} must not be empty (nothing to draw), got {x!r}")


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KiB' (n >= 0, a byte count; binary units, three significant
    digits: ``_sig3``, the same rule as ``human`` in _static/explorers.js)."""
    if not 0 <= n < float("inf"):
        raise ValueError(f"n must be a finite byte count >= 0, got {n!r}")
    units = (2**60, "EiB"), (2**50, "PiB"), (2**40, "TiB"), (2**30, "GiB")
    for div, unit in (*units, (2**20, "MiB"), (2**10, "KiB")):
        if abs(n) >= div:
            return f"{_sig3(n / div)} {unit}"
    return f"{int(n)} B"


def _unit(max_bytes: float) -> tuple[float, str]:
    """The divisor and name of the largest binary unit not above ``max_bytes``."""
    for div, name in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if max_bytes >= div:
            return div, name
    return 1, "B"
