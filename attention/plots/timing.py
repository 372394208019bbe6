"""Timing figures: measured scaling with its fitted power law, and the recorded (or
live) GPU timings of each suite, labelled with where they were measured."""

from __future__ import annotations

import matplotlib as mpl
import matplotlib.pyplot as plt
import numpy as np

from .style import IMPL_COLORS, POW2_LABELS, SELECTION_COLORS, _ax


def power_law_fit(x, y) -> tuple[float, float]:
    """Least-squares fit of y = c * x**slope in log-log space; returns (slope, c)."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if x.shape != y.shape or x.ndim != 1 or x.size < 2:
        raise ValueError(
            f"x and y must be 1-D of the same length >= 2, got {x.shape}, {y.shape}"
        )
    for name, a in (("x", x), ("y", y)):
        if not np.isfinite(a).all():
            raise ValueError(
                f"{name} must be finite for a power-law fit, got {a.tolist()}"
            )
    if (x <= 0).any() or (y <= 0).any():
        raise ValueError("a power-law fit needs positive x and y")
    slope, intercept = np.polyfit(np.log(x), np.log(y), 1)
    return float(slope), float(np.exp(intercept))


def scaling_plot(
    x,
    y,
    ax=None,
    label: str = "measured",
    color: str | None = None,
    expected: float | None = None,
    expected_label: str | None = None,
    xlabel: str = "n",
    ylabel: str = "time (s)",
    marker: str = "o",
):
    """Log-log plot of measurements, their fitted power law and an optional reference
    slope line.

    The legend gives the fitted slope; ``expected`` draws a dotted line of that slope
    through the measurements' geometric mean. Returns ``(ax, slope)``.
    """
    ax = _ax(ax)
    color = color or IMPL_COLORS["numpy"]
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    slope, c = power_law_fit(x, y)
    ax.loglog(x, y, marker, color=color, label=f"{label} (fitted slope {slope:.2f})")
    xs = np.geomspace(x.min(), x.max(), 50)
    ax.loglog(xs, c * xs**slope, "-", color=color, linewidth=1.2, alpha=0.8)
    if expected is not None:
        x0, y0 = np.exp(np.log(x).mean()), np.exp(np.log(y).mean())
        ref = expected_label or f"slope {expected:g}"
        ax.loglog(
            xs, y0 * (xs / x0) ** expected, ":", color="0.45", linewidth=1.2, label=ref
        )
    ax.xaxis.set_major_locator(mpl.ticker.LogLocator(base=2))
    ax.xaxis.set_major_formatter(POW2_LABELS)  # 512, 1k, 2k, 4k: read at a glance
    ax.xaxis.set_minor_formatter(mpl.ticker.NullFormatter())
    ax.yaxis.set_minor_formatter(mpl.ticker.NullFormatter())
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    # under the axes, so the legend never covers a measurement
    ax.legend(
        loc="upper center", bbox_to_anchor=(0.5, -0.16), frameon=False, fontsize=8
    )
    return ax, slope


def _seq_len(shape: dict):
    """A record's sequence length, whichever name its suite gave it."""
    for key in ("N", "N_q", "seq_len", "n"):
        if key in shape:
            return shape[key]
    return None


def _length_axis(ax, ns) -> None:
    """Log-2 x axis with a tick at each measured N (written "4k" for 4096)."""
    ax.set_xscale("log", base=2)
    ns = sorted(set(ns))
    if ns:
        ax.set_xticks(
            ns,
            labels=[
                f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n) for n in ns
            ],
        )
        ax.minorticks_off()
    ax.set_xlabel("sequence length N")


def _impl_lines(ax, rows, value, scale: float = 1.0) -> None:
    """One line per implementation (Triton first and thickest) of ``value(row)`` against
    N; rows that failed (``error``, e.g. "OOM") are an x at the bottom of the axis."""
    for impl in sorted({r["impl"] for r in rows}, key=lambda n: (n != "triton", n)):
        mine = [r for r in rows if r["impl"] == impl]
        color = IMPL_COLORS.get(impl, "#333333")
        pts = sorted(
            (_seq_len(r["shape"]), value(r) / scale)
            for r in mine
            if r.get("error") is None and value(r) is not None
        )
        if pts:
            ax.plot(
                *zip(*pts),
                "o-",
                color=color,
                label=impl,
                markersize=4,
                linewidth=2.5 if impl == "triton" else 1.5,
            )
        failed = sorted(
            (_seq_len(r["shape"]), r["error"]) for r in mine if r.get("error")
        )
        if failed:
            why = "out of memory" if failed[0][1] == "OOM" else failed[0][1]
            ax.plot(
                [n for n, _ in failed],
                [0.03] * len(failed),
                "x",
                color=color,
                markersize=8,
                transform=ax.get_xaxis_transform(),
                label=f"{impl}: {why}",
            )


def recorded_timing_figure(
    records: list[dict],
    label: str,
    *,
    d: int = 64,
    causal: bool = True,
    dtype: str = "float16",
    metric: str = "auto",
    modes=None,
    memory: bool = True,
    axes=None,
):
    """Measured speed and peak memory against sequence length N, one line per
    implementation (Triton first).

    ``records`` are ``kernels.timing.bench`` records as dicts: one GPU's rows of a suite
    (``kernels.timing.bench.suite_records``) or rows measured live
    (``kernels.timing.bench.time_attention``); ``label`` says where they were measured
    (``kernels.timing.bench.provenance_label``).

    * One timing panel per mode (``modes``; default every mode present) from rows of op
      "attention" with head dim ``d``, ``causal`` and ``dtype``; tile sweeps (BLOCK_M in
      the shape) are left out. ``metric`` is "tflops", "ms" or "auto" (TFLOP/s when
      every timed row has it, else milliseconds).
    * With ``memory``, a panel of the peak memory of one forward, from rows of op
      "attention-memory" in ``dtype`` when there are any, else from the forward rows.

    A row with an error (e.g. "OOM") is an x at the bottom of its panel. ``axes`` (one
    per panel) draws into a caller's figure, which then owns the layout and the title.
    Returns the figure, or None when no record matches.
    """
    if metric not in ("auto", "tflops", "ms"):
        raise ValueError(f"metric must be 'auto', 'tflops' or 'ms', got {metric!r}")

    def matches(r):
        sh = r.get("shape", {})
        return (
            sh.get("d") == d
            and bool(sh.get("causal", causal)) == causal
            and r.get("dtype") == dtype
            and _seq_len(sh)
            and "BLOCK_M" not in sh
        )

    timing = [
        r for r in records if r.get("op", "attention") == "attention" and matches(r)
    ]
    timed = [r for r in timing if r.get("ms") is not None]
    present = list(dict.fromkeys(r["mode"] for r in timing))
    modes = present if modes is None else [m for m in modes if m in present]
    mem = []
    if memory:
        mem = [
            r
            for r in records
            if r.get("op") == "attention-memory"
            and r.get("dtype") == dtype
            and _seq_len(r.get("shape", {}))
        ]
        mem = mem or [r for r in timing if r.get("mode") == "fwd"]
    if not modes and not mem:
        return None
    if metric == "auto":
        metric = "tflops" if timed and all(r.get("tflops") for r in timed) else "ms"
    n_panels = len(modes) + bool(mem)
    if axes is None:
        fig, axes = plt.subplots(
            1, n_panels, figsize=(4.4 * n_panels, 3.9), squeeze=False
        )
        axes = list(axes[0])
    else:
        axes = list(np.ravel(axes))
        if len(axes) != n_panels:
            raise ValueError(f"axes: {n_panels} panels to draw, {len(axes)} axes given")
        fig = None
    for ax, mode in zip(axes, modes):
        rows = [r for r in timing if r["mode"] == mode]
        _impl_lines(ax, rows, lambda r: r.get(metric))
        _length_axis(ax, [_seq_len(r["shape"]) for r in rows])
        if metric == "ms":
            ax.set_yscale("log")
        ax.set_ylabel(
            "TFLOP/s (measured)" if metric == "tflops" else "ms (measured, median)"
        )
        ax.set_title(
            f"{mode}, d = {d}, {'causal' if causal else 'not causal'}, {dtype}",
            fontsize=9,
        )
        ax.legend(fontsize=7)
    if mem:
        ax = axes[-1]
        _impl_lines(ax, mem, lambda r: r.get("peak_mem_bytes") or None, scale=2**30)
        _length_axis(ax, [_seq_len(r["shape"]) for r in mem])
        ax.set_yscale("log")
        ax.set_ylabel("peak memory of one forward (GiB)")
        ax.set_title(f"peak memory (measured), {dtype}", fontsize=9)
        if ax.lines:
            ax.legend(fontsize=7)
    if fig is None:
        return axes[0].figure
    fig.suptitle(label, fontsize=9)
    fig.tight_layout()
    return fig


def block_sweep_figure(records: list[dict], label: str, simulated_bytes):
    """Measured ms over a BLOCK_M x BLOCK_N sweep beside the simulator's HBM bytes.

    ``simulated_bytes(shape, BLOCK_M, BLOCK_N)`` returns the simulator's bytes for a
    record's shape and tiles. Returns the figure, or None without sweep records.
    """
    rows = [
        r
        for r in records
        if r.get("ms") is not None
        and "BLOCK_M" in r.get("shape", {})
        and "BLOCK_N" in r.get("shape", {})
    ]
    if not rows:
        return None
    r0 = rows[0]
    # These vary across the sweep.
    tile_keys = ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages")

    def problem(r):
        return {k: v for k, v in r["shape"].items() if k not in tile_keys}

    rows = [
        r
        for r in rows
        if r["mode"] == r0["mode"]
        and r["dtype"] == r0["dtype"]
        and problem(r) == problem(r0)
    ]
    bms = sorted({r["shape"]["BLOCK_M"] for r in rows})
    bns = sorted({r["shape"]["BLOCK_N"] for r in rows})
    ms = np.full((len(bms), len(bns)), np.nan)
    sim = np.full_like(ms, np.nan)
    for r in rows:
        i, j = bms.index(r["shape"]["BLOCK_M"]), bns.index(r["shape"]["BLOCK_N"])
        ms[i, j] = r["ms"]
        sim[i, j] = simulated_bytes(
            r["shape"], r["shape"]["BLOCK_M"], r["shape"]["BLOCK_N"]
        )
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    panels = (
        (axes[0], ms, "measured ms", "Blues"),
        (axes[1], sim / 2**20, "simulated HBM MiB", "Oranges"),
    )
    for ax, data, name, cmap in panels:
        im = ax.imshow(data, cmap=cmap, aspect="auto")
        for (i, j), val in np.ndenumerate(data):
            if np.isfinite(val):
                ax.text(j, i, f"{val:.3g}", ha="center", va="center", fontsize=8)
        ax.set_xticks(range(len(bns)), labels=bns)
        ax.set_yticks(range(len(bms)), labels=bms)
        ax.set_xlabel("BLOCK_N (= Bc)")
        ax.set_ylabel("BLOCK_M (= Br)")
        ax.set_title(name)
        fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    shape = {k: v for k, v in r0["shape"].items() if not k.startswith("BLOCK")}
    fig.suptitle(f"{r0['mode']} {r0['dtype']} {shape}\n{label}", fontsize=9)
    fig.tight_layout()
    return fig


def selection_timing_figure(records: list, d: int = 64, title: str | None = None):
    """Forward times against N from suite "hard" records (``kernels.hard.timing`` dicts)
    at head dim d.

    Left: hard attention (argmax, sampled) against the naive PyTorch version and the
    flash (soft) forward on the same shape. Right: top-k attention, same comparison.
    Solid = Triton, dashed = naive PyTorch. ``title`` should carry the provenance label.
    Returns the figure.
    """
    rows = [
        r
        for r in records
        if r.get("shape", {}).get("d") == d and r.get("ms") is not None
    ]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2), sharey=True)
    panels = [
        [
            ("flash", "triton", "soft", "flash (soft) forward"),
            ("hard", "triton", "hard", "hard argmax, Triton"),
            ("hard-sample", "triton", "reinforce", "hard sampled, Triton"),
            ("hard", "naive", "hard", "hard argmax, naive"),
        ],
        [
            ("flash", "triton", "soft", "flash (soft) forward"),
            ("topk16", "triton", "topk", "top-16, Triton"),
            ("topk64", "triton", "gumbel-st", "top-64, Triton"),
            ("topk16", "naive", "topk", "top-16, naive"),
            ("topk64", "naive", "gumbel-st", "top-64, naive"),
        ],
    ]
    for ax, lines in zip(axes, panels):
        for op, impl, color, label in lines:
            pts = sorted(
                (r["shape"]["N"], r["ms"])
                for r in rows
                if r["op"] == op and r["impl"] == impl
            )
            if not pts:
                continue
            n, ms = zip(*pts)
            ax.plot(
                n,
                ms,
                marker="o",
                ms=4,
                color=SELECTION_COLORS[color],
                ls="--" if impl == "naive" else "-",
                label=label,
            )
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length N (N_q = N_k)")
        if ax.lines:
            ax.legend(fontsize=8)
    axes[0].set_ylabel("forward time (ms, median)")
    axes[0].set_title(f"hard attention, d = {d}")
    axes[1].set_title(f"top-k attention, d = {d}")
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig


def deformable_timing_figure(
    prov_label: str, records: list[dict], dtype: str = "float16"
):
    """Recorded GPU times (ms, log scale) of the deformable suite: MSDA and fused DAT
    against their PyTorch baselines, forward and forward + backward, one group of
    bars per shape. Each Triton bar is annotated with its speed-up over the naive
    PyTorch version."""
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    for ax, op in zip(axes, ("msda", "dat")):
        rows = [r for r in records if r.get("op") == op and r.get("dtype") == dtype]
        keys = list(
            dict.fromkeys(
                (r["shape"].get("name") or f"L_q={r['shape'].get('L_q')}", r["mode"])
                for r in rows
            )
        )
        impls = sorted({r["impl"] for r in rows}, key=lambda n: (n != "triton", n))
        width = 0.8 / max(len(impls), 1)
        for k, impl in enumerate(impls):
            for j, key in enumerate(keys):
                rec = [
                    r
                    for r in rows
                    if r["impl"] == impl
                    and r["mode"] == key[1]
                    and (r["shape"].get("name") or f"L_q={r['shape'].get('L_q')}")
                    == key[0]
                ]
                if not rec or rec[0].get("ms") is None:
                    continue
                x = j + (k - (len(impls) - 1) / 2) * width
                ax.bar(
                    x,
                    rec[0]["ms"],
                    width,
                    color=IMPL_COLORS.get(impl, "#333333"),
                    edgecolor="black",
                    linewidth=0.4,
                    label=impl if j == 0 else None,
                )
                if impl == "triton":
                    base = [
                        r
                        for r in rows
                        if r["impl"] == "naive"
                        and r["mode"] == key[1]
                        and (r["shape"].get("name") or f"L_q={r['shape'].get('L_q')}")
                        == key[0]
                    ]
                    if base and base[0].get("ms"):
                        ax.text(
                            x,
                            rec[0]["ms"],
                            f"{base[0]['ms'] / rec[0]['ms']:.1f}x",
                            ha="center",
                            va="bottom",
                            fontsize=7,
                        )
        ax.set_xticks(
            range(len(keys)), labels=[f"{a}\n{b}" for a, b in keys], fontsize=8
        )
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(mpl.ticker.FormatStrFormatter("%g"))
        ax.yaxis.set_minor_locator(mpl.ticker.LogLocator(base=10, subs=(2, 5)))
        ax.yaxis.set_minor_formatter(mpl.ticker.FormatStrFormatter("%g"))
        ax.set_ylabel("time (ms, median)")
        ax.set_title(f"{'MSDA' if op == 'msda' else 'fused DAT'} · {dtype}")
        if impls:
            ax.legend(fontsize=7)
    fig.suptitle(prov_label, fontsize=9)
    fig.tight_layout()
    return fig
