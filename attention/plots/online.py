"""Chapter 2's online softmax drawn for one row: the running max jumping, the running
sum and the accumulator rescaled at each jump, the running output settling on o."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from ..checks import as_real_array
from .style import TENSOR_COLORS


def online_softmax_trace(x, v) -> dict:
    """The one-pass recurrence of one row, key by key, as arrays over the steps j:
    ``m`` (running max), ``alpha`` (e^(m_{j-1} - m_j), the rescale at step j; 1 where
    the max did not move), ``l_before`` (l_{j-1} e^0, before rescaling), ``l`` (l_j),
    ``acc_before``, ``acc`` (N, d_v) and ``out`` = acc_j / l_j.

    x: (N,) scores of one row (finite), v: (N, d_v) values.
    """
    x, v = as_real_array("x", x, 1), as_real_array("v", v, 2)
    if x.ndim != 1 or not np.isfinite(x).all():
        raise ValueError(
            f"x must be one row of finite scores (N,), got shape {x.shape}"
        )
    if v.shape[0] != x.shape[0]:
        raise ValueError(f"v must have N = {x.shape[0]} rows, got shape {v.shape}")
    n = len(x)
    m = np.maximum.accumulate(x)  # (N,)
    m_prev = np.concatenate([[m[0]], m[:-1]])
    alpha = np.exp(m_prev - m)  # 1 at step 0 (nothing to rescale)
    l_ = np.empty(n)
    l_before = np.empty(n)
    acc = np.empty_like(v, dtype=float)  # (N, d_v)
    acc_before = np.empty_like(acc)
    l_run, acc_run = 0.0, np.zeros(v.shape[1])
    for j in range(n):
        l_before[j], acc_before[j] = l_run, acc_run
        p = np.exp(x[j] - m[j])
        l_run = l_run * alpha[j] + p
        acc_run = acc_run * alpha[j] + p * v[j]
        l_[j], acc[j] = l_run, acc_run
    return dict(
        m=m,
        alpha=alpha,
        l_before=l_before,
        l=l_,
        acc_before=acc_before,
        acc=acc,
        out=acc / l_[:, None],
    )


def online_softmax_figure(x, v, coord: int = 0, axes=None):
    """Three panels over the keys j of one row: the scores and the running max (red
    circles: a jump); the running sum l and the accumulator's ``coord``-th entry, each
    step drawn as a rescale (a drop, red triangle, where the max jumped) then an add;
    the running output acc/l beside the final o (dashed), equal at the last key."""
    tr = online_softmax_trace(x, v)
    x = np.asarray(x, dtype=float)
    j = np.arange(len(x))
    jumps = np.flatnonzero(tr["alpha"] < 1)
    if axes is None:
        _, axes = plt.subplots(3, 1, figsize=(6.4, 7.2), sharex=True)
    ax0, ax1, ax2 = axes
    ax0.vlines(j, 0, x, color=TENSOR_COLORS["S"], lw=2, alpha=0.6)
    ax0.plot(j, x, "o", color=TENSOR_COLORS["S"], ms=4, label="score $x_j$")
    ax0.step(
        j,
        tr["m"],
        where="post",
        color=TENSOR_COLORS["m"],
        lw=2,
        label="running max $m_j$",
    )
    ax0.plot(
        jumps,
        tr["m"][jumps],
        "o",
        color="#C00000",
        ms=7,
        mfc="none",
        mew=2,
        label="the max jumps",
    )
    ax0.axhline(0, color="0.7", lw=0.8)
    ax0.set_ylabel("score")
    ax0.legend(fontsize=8, loc="lower right", ncol=3, bbox_to_anchor=(1, 1.0))
    acc = tr["acc"][:, coord]
    for y, yb, name, color in (
        (tr["l"], tr["l_before"], r"$\ell_j$", "l"),
        (acc, tr["acc_before"][:, coord], f"acc$_j$[{coord}]", "O"),
    ):
        # the path j-1 -> (rescaled, at j - 1/2) -> j: a drop where the max jumped
        mid = yb * tr["alpha"]
        px = np.ravel(np.column_stack([j - 0.5, j]))[1:]
        py = np.ravel(np.column_stack([mid, y]))[1:]
        ax1.plot(px, py, "-", color=TENSOR_COLORS[color], lw=1.5)
        ax1.plot(j, y, "o", color=TENSOR_COLORS[color], ms=4, label=name)
        k = jumps[jumps > 0]
        ax1.plot(k - 0.5, mid[k], "v", color="#C00000", ms=6)
    ax1.axhline(0, color="0.7", lw=0.8)
    ax1.set_ylabel("running value")
    ax1.plot([], [], "v", color="#C00000", label=r"rescaled by $e^{m_{j-1} - m_j}$")
    ax1.legend(fontsize=8, loc="lower right", ncol=3)
    out = tr["out"][:, coord]
    ax2.plot(
        j,
        out,
        "o-",
        color=TENSOR_COLORS["O"],
        ms=4,
        label=f"acc$_j$ / $\\ell_j$, entry {coord}",
    )
    ax2.axhline(out[-1], color=TENSOR_COLORS["O"], ls="--", lw=1, label="final $o$")
    ax2.set(xlabel="key j", ylabel="running output")
    ax2.legend(fontsize=8, loc="best")
    return axes
