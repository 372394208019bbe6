"""The book's figures (matplotlib) and its one palette.

Every chapter draws with these colours, so a colour means the same thing on every
page: Q, K, V, S, P, O are always the same hue, and so are the memory levels
(HBM, SRAM, DRAM). Functions take an optional ``ax`` and return it, so a chapter
can compose them.
"""

from __future__ import annotations

import matplotlib as mpl
import matplotlib.pyplot as plt
import numpy as np

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
}

#: Sequential colour map for attention weights (0 = white, 1 = dark).
ATTENTION_CMAP = "Blues"


def tensor_color(name: str) -> str:
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
    if ax is None:
        _, ax = plt.subplots()
    return ax


def attention_heatmap(
    weights: np.ndarray,
    q_labels=None,
    k_labels=None,
    ax=None,
    title: str | None = None,
    colorbar: bool = True,
    vmax: float | None = None,
):
    """Draw an (N_q, N_k) attention map: rows are queries, columns keys, darker = more weight."""
    ax = _ax(ax)
    w = np.asarray(weights)
    if w.ndim != 2:
        raise ValueError(f"weights must be 2-D (N_q, N_k), got shape {w.shape}")
    im = ax.imshow(w, cmap=ATTENTION_CMAP, vmin=0.0, vmax=vmax or max(float(w.max()), 1e-12),
                   aspect="auto", interpolation="nearest")
    if q_labels is not None:
        ax.set_yticks(range(len(q_labels)), labels=[str(t) for t in q_labels])
    if k_labels is not None:
        ax.set_xticks(range(len(k_labels)), labels=[str(t) for t in k_labels], rotation=90)
    ax.set_xlabel("key (attended to)")
    ax.set_ylabel("query (attending)")
    if title:
        ax.set_title(title)
    if colorbar:
        ax.figure.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label="weight")
    return ax


def traffic_bars(per_tensor: dict, ax=None, title: str | None = None, unit: str = "elements"):
    """Stacked bars of HBM reads and writes per tensor.

    ``per_tensor`` maps a tensor name to ``(reads, writes)``.
    """
    ax = _ax(ax)
    names = list(per_tensor)
    reads = np.array([per_tensor[n][0] for n in names], dtype=float)
    writes = np.array([per_tensor[n][1] for n in names], dtype=float)
    x = np.arange(len(names))
    colors = [tensor_color(n) for n in names]
    ax.bar(x, reads, color=colors, edgecolor="black", linewidth=0.5, label="read from HBM")
    ax.bar(x, writes, bottom=reads, color=colors, edgecolor="black", linewidth=0.5,
           hatch="///", alpha=0.6, label="written to HBM")
    ax.set_xticks(x, labels=names)
    ax.set_ylabel(f"HBM traffic ({unit})")
    if title:
        ax.set_title(title)
    ax.legend()
    return ax


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KiB'."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.3g} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n} B"  # unreachable


# ---------------------------------------------------------------------------------
# Chapter 1: masks, measured scaling, and the naive algorithm's HBM traffic.
# ---------------------------------------------------------------------------------

#: Boolean masks: a key a query may attend to, and a hidden one.
MASK_COLORS: dict[str, str] = {"keep": "#2171B5", "masked": "#EFEFEF"}

#: Bytes per element of the dtypes the widgets offer.
DTYPE_BYTES: dict[str, int] = {"float32": 4, "float16": 2, "bfloat16": 2, "float8": 1}


def mask_heatmap(mask: np.ndarray, ax=None, title: str | None = None, q_labels=None,
                 k_labels=None, diagonal: bool = False, legend: bool = False):
    """Draw a boolean (N_q, N_k) mask: dark where query i may attend to key j, light where hidden.

    ``diagonal=True`` draws the line j = i + N_k - N_q through the last key each query sees
    under the bottom-right aligned causal mask (the main diagonal when N_q == N_k).
    """
    ax = _ax(ax)
    m = np.asarray(mask)
    if m.ndim != 2 or m.dtype != bool:
        raise ValueError(f"mask must be a 2-D boolean array, got shape {m.shape} dtype {m.dtype}")
    n_q, n_k = m.shape
    cmap = mpl.colors.ListedColormap([MASK_COLORS["masked"], MASK_COLORS["keep"]])
    ax.imshow(m.astype(np.int8), cmap=cmap, vmin=0, vmax=1, interpolation="nearest",
              aspect="equal")
    ax.set_xticks(np.arange(-0.5, n_k, 1), minor=True)
    ax.set_yticks(np.arange(-0.5, n_q, 1), minor=True)
    ax.grid(which="minor", color="white", linewidth=1.0)
    ax.tick_params(which="minor", length=0)
    ax.set_xticks(range(n_k), labels=[str(t) for t in (k_labels if k_labels is not None
                                                        else range(n_k))])
    ax.set_yticks(range(n_q), labels=[str(t) for t in (q_labels if q_labels is not None
                                                       else range(n_q))])
    ax.set_xlabel("key j")
    ax.set_ylabel("query i")
    if diagonal:
        i = np.array([-0.5, n_q - 0.5])
        ax.plot(i + (n_k - n_q), i, color="black", linestyle="--", linewidth=1.0)
        ax.set_xlim(-0.5, n_k - 0.5)
        ax.set_ylim(n_q - 0.5, -0.5)
    if title:
        ax.set_title(title)
    if legend:
        handles = [mpl.patches.Patch(facecolor=MASK_COLORS["keep"], label="may attend"),
                   mpl.patches.Patch(facecolor=MASK_COLORS["masked"], edgecolor="0.7",
                                     label="masked")]
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    return ax


def power_law_fit(x, y) -> tuple[float, float]:
    """Least-squares fit of y = c * x**slope in log-log space; returns (slope, c)."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if x.shape != y.shape or x.ndim != 1 or x.size < 2:
        raise ValueError(f"x and y must be 1-D of the same length >= 2, got {x.shape}, {y.shape}")
    if (x <= 0).any() or (y <= 0).any():
        raise ValueError("a power-law fit needs positive x and y")
    slope, intercept = np.polyfit(np.log(x), np.log(y), 1)
    return float(slope), float(np.exp(intercept))


def scaling_plot(x, y, ax=None, label: str = "measured", color: str | None = None,
                 expected: float | None = None, expected_label: str | None = None,
                 xlabel: str = "n", ylabel: str = "time (s)", marker: str = "o"):
    """Log-log plot of measurements, their fitted power law, and an optional reference slope.

    The legend gives the fitted slope; ``expected`` draws a dotted line of that slope through
    the measurements' geometric mean. Returns ``(ax, slope)``.
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
        ax.loglog(xs, y0 * (xs / x0) ** expected, ":", color="0.45", linewidth=1.2, label=ref)
    ax.xaxis.set_major_locator(mpl.ticker.LogLocator(base=2))
    ax.xaxis.set_major_formatter(mpl.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(mpl.ticker.NullFormatter())
    ax.yaxis.set_minor_formatter(mpl.ticker.NullFormatter())
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.legend(loc="upper left")
    return ax, slope


# Tensors whose counts coincide share a line: the first drawn thick, the second dashed on top.
_TRAFFIC_STYLES = {"Q": ("-", 3.0), "O": ("--", 1.5), "K": ("-", 3.0), "V": ("--", 1.5),
                   "S": ("-", 3.0), "P": ("--", 1.5)}
_TRAFFIC_FORMULAS = {"Q": "m d (read)", "O": "m d (written)", "K": "⌈m/Br⌉ n d",
                     "V": "⌈m/Br⌉ n d", "S": "2 m n", "P": "2 m n"}


def naive_traffic_vs_length(ns, d: int = 64, bytes_per_elem: int = 2, m: int | None = None,
                            Br: int = 64, Bc: int = 64, ax=None, title: str | None = None):
    """HBM bytes of standard (materialising) attention against the key length n, per tensor.

    Markers are counted by ``attention.memory.simulate("standard", ...)`` tile by tile; the
    lines are its closed form (a ValueError is raised if the two ever disagree). ``m`` queries
    attend over n keys; ``m=None`` is self-attention (m = n). Log-log axes.
    """
    from attention import memory

    ax = _ax(ax)
    ns = sorted({int(n) for n in ns})
    d, Br, Bc = int(d), int(Br), int(Bc)
    sims, forms = [], []
    for n in ns:
        n_q = n if m is None else int(m)
        sims.append(memory.simulate("standard", n_q, d, Br=Br, Bc=Bc, N_k=n))
        forms.append(memory.closed_form("standard", n_q, d, Br=Br, Bc=Bc, N_k=n))
        if sims[-1].per_tensor != forms[-1].per_tensor:
            raise ValueError(f"simulation and closed form disagree at n={n}: "
                             f"{sims[-1].per_tensor} vs {forms[-1].per_tensor}")
    for t in ("Q", "O", "K", "V", "S", "P"):
        if t not in sims[-1].per_tensor:
            continue
        sim = np.array([sum(s.per_tensor.get(t, (0, 0))) for s in sims]) * bytes_per_elem
        form = np.array([sum(f.per_tensor.get(t, (0, 0))) for f in forms]) * bytes_per_elem
        style, width = _TRAFFIC_STYLES.get(t, ("-", 1.5))
        ax.loglog(ns, form, style, color=tensor_color(t), linewidth=width,
                  label=f"{t}: {_TRAFFIC_FORMULAS.get(t, '')}")
        ax.loglog(ns, sim, "o", color=tensor_color(t), markersize=3.5)
    total = np.array([s.total for s in sims]) * bytes_per_elem
    ax.loglog(ns, total, "-", color="black", linewidth=1.0, label="total")
    ax.set_xlabel("key length n" + (" (m = n)" if m is None else f" (m = {m} queries)"))
    ax.set_ylabel(f"HBM traffic (bytes at {bytes_per_elem} B/element)")
    ax.set_title(title or ("self-attention, m = n" if m is None else f"cross-attention, m = {m}")
                 + f", d = {d}, Br = {Br}")
    ax.legend(ncol=2, fontsize=8, title="lines: closed form, markers: simulated",
              title_fontsize=8, loc="upper left")
    return ax


def naive_traffic_figure(n: int = 1024, m: int | None = None, d: int = 64,
                         dtype: str = "float16", Br: int = 64, Bc: int = 64,
                         n_range: tuple[int, int] = (16, 8192)):
    """The chapter-1 traffic figure: bytes against n (left) and per tensor at (m, n) (right).

    ``m=None`` is self-attention. Both panels come from ``attention.memory.simulate``
    ("standard"); the left one also draws the closed form. Returns the figure.
    """
    from attention import memory

    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype must be one of {sorted(DTYPE_BYTES)}, got {dtype!r}")
    if n < 1 or (m is not None and m < 1) or d < 1:
        raise ValueError(f"n, m and d must be positive, got n={n}, m={m}, d={d}")
    bpe = DTYPE_BYTES[dtype]
    lo, hi = n_range
    ns = [int(x) for x in np.geomspace(lo, hi, int(round(np.log2(hi / lo))) + 1)] + [int(n)]
    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(11.5, 4.2),
                                   gridspec_kw={"width_ratios": [1.35, 1.0]})
    naive_traffic_vs_length(ns, d=d, bytes_per_elem=bpe, m=m, Br=Br, Bc=Bc, ax=ax0)
    ax0.axvline(n, color="0.5", linewidth=0.8)
    n, d, Br, Bc = int(n), int(d), int(Br), int(Bc)
    n_q = n if m is None else int(m)
    t = memory.simulate("standard", n_q, d, Br=Br, Bc=Bc, N_k=n)
    mib = bpe / 2**20
    order = [k for k in ("Q", "K", "V", "S", "P", "O") if k in t.per_tensor]
    order += [k for k in t.per_tensor if k not in order]
    per = {k: (t.per_tensor[k][0] * mib, t.per_tensor[k][1] * mib) for k in order}
    traffic_bars(per, ax=ax1, unit="MiB")
    ax1.set_ylim(0, 1.3 * max(r + w for r, w in per.values()))
    ax1.legend(loc="upper left", ncol=2)
    sp = sum(sum(t.per_tensor.get(k, (0, 0))) for k in ("S", "P")) / t.total
    ax1.set_title(f"m = {n_q}, n = {n}, d = {d}, {dtype}\n"
                  f"{human_bytes(t.bytes(bpe))} in all, {sp:.0%} of it S and P")
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------------------------
# Chapter 2: the memory hierarchy, tile schedules, HBM traffic per algorithm, roofline.
# ---------------------------------------------------------------------------------

# Backward-only tensors (light shades of their forward twins' colours).
TENSOR_COLORS.setdefault("dP", "#E08E90")  # light red: the gradient w.r.t. P
TENSOR_COLORS.setdefault("dS", "#F2B8B9")  # lighter red: the gradient w.r.t. S
TENSOR_COLORS.setdefault("D", "#A6A6A6")  # rowsum(dO * O)

#: Tensors of size N x N_k: the ones FlashAttention keeps out of HBM.
QUADRATIC_TENSORS = ("S", "P", "dP", "dS")

_GPU_MARKERS = {"A100": "o", "H100": "s", "H200": "D", "CPU": "^"}


def memory_hierarchy_plot(levels: list[dict], ax=None, title: str | None = None):
    """Bandwidth against capacity, both log scale, one marker per (device, memory level).

    Each level is a dict with ``device`` ("A100", "H100", "H200", "CPU"), ``kind``
    ("SRAM", "HBM", "DRAM": the colour), ``capacity`` (bytes), ``bandwidth`` (bytes/s),
    ``label`` and optionally ``derived=True`` (drawn hollow: computed, not a spec number)
    and ``offset`` (the label's offset in points).
    """
    ax = _ax(ax)
    for lv in levels:
        color = MEMORY_COLORS[lv["kind"]]
        hollow = lv.get("derived", False)
        ax.scatter(lv["capacity"], lv["bandwidth"], s=90,
                   marker=_GPU_MARKERS.get(lv["device"], "o"),
                   facecolors="white" if hollow else color, edgecolors=color, linewidths=2,
                   zorder=3)
        ax.annotate(lv["label"], (lv["capacity"], lv["bandwidth"]),
                    xytext=lv.get("offset", (8, -4)), textcoords="offset points", fontsize=8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("capacity (bytes)")
    ax.set_ylabel("bandwidth (bytes / s)")
    kinds = list(dict.fromkeys(lv["kind"] for lv in levels))
    devices = list(dict.fromkeys(lv["device"] for lv in levels))
    handles = [mpl.patches.Patch(color=MEMORY_COLORS[k], label=k) for k in kinds]
    handles += [mpl.lines.Line2D([], [], marker=_GPU_MARKERS.get(g, "o"), linestyle="",
                                 color="0.3", label=g) for g in devices]
    if any(lv.get("derived") for lv in levels):
        handles.append(mpl.lines.Line2D([], [], marker="o", linestyle="", markerfacecolor="white",
                                        markeredgecolor="0.3", label="derived, not a spec"))
    ax.legend(handles=handles, loc="lower left", fontsize=8)
    ax.set_title(title or "Faster means smaller")
    return ax


def _step_events(trace) -> dict:
    """step -> list of Transfers of that step (trace order)."""
    out: dict[int, list] = {}
    for t in trace:
        out.setdefault(t.step, []).append(t)
    return out


def _fmt_transfer(ts, op) -> str:
    names = []
    for t in ts:
        if t.op != op:
            continue
        sub = ",".join(str(b) for b in t.block) if t.block else ""
        names.append(f"{t.tensor}{'[' + sub + ']' if sub else ''}")
    return " ".join(dict.fromkeys(names)) or "-"


def tile_schedule_plot(trace, step: int, n_row_blocks: int, n_col_blocks: int, ax=None,
                       title: str | None = None):
    """The grid of (i, j) tiles of S, filled in up to ``step`` of a simulated schedule.

    A tile's colour says where its data went: the colour of S, P, dP or dS when that
    N x N_k tile crossed HBM at that step, SRAM amber when it lived only on chip. Tiles
    done at earlier steps are pale; the current one is outlined. The strips show which
    query block (left) and key block (top) are in SRAM now. ``trace`` comes from
    ``attention.memory.simulate(..., keep_trace=True)``.
    """
    ax = _ax(ax)
    events = _step_events(trace)
    steps = sorted(events)
    if not steps:
        raise ValueError("trace is empty: simulate with keep_trace=True")
    step = int(np.clip(step, steps[0], steps[-1]))
    tr, tc = n_row_blocks, n_col_blocks
    img = np.ones((tr, tc, 4))
    cur = None
    for s in steps:
        if s > step:
            break
        ts = events[s]
        comp = [t for t in ts if t.op == "compute"]
        if not comp:
            continue
        block = comp[0].block
        quad = [t.tensor for t in ts if t.tensor in QUADRATIC_TENSORS and t.op != "compute"]
        color = mpl.colors.to_rgba(tensor_color(quad[-1]) if quad else MEMORY_COLORS["SRAM"])
        color = color if s == step else (*color[:3], 0.35)
        rows = [block[0]] if block else range(tr)
        cols = [block[1]] if len(block) > 1 else range(tc)
        for i in rows:
            for j in cols:
                img[i, j] = color
        if s == step:
            cur = block
    ax.imshow(img, extent=(0, tc, tr, 0), interpolation="nearest", aspect="auto")
    if tr * tc <= 4096:  # grid lines only while they stay readable
        ax.set_xticks(np.arange(tc + 1), minor=True)
        ax.set_yticks(np.arange(tr + 1), minor=True)
        ax.grid(which="minor", color="0.8", linewidth=0.5)
        ax.tick_params(which="minor", length=0)
    if cur is not None:
        i0, i1 = (cur[0], cur[0] + 1) if cur else (0, tr)
        j0, j1 = (cur[1], cur[1] + 1) if len(cur) > 1 else (0, tc)
        ax.add_patch(mpl.patches.Rectangle((j0, i0), j1 - j0, i1 - i0, fill=False,
                                           edgecolor="black", linewidth=2))
        # Strips: the resident query block (left, Q's colour) and key block (top, K's).
        ax.add_patch(mpl.patches.Rectangle((-0.06 * tc, i0), 0.04 * tc, i1 - i0,
                                           color=tensor_color("Q"), clip_on=False))
        if len(cur) > 1:
            ax.add_patch(mpl.patches.Rectangle((j0, -0.06 * tr), j1 - j0, 0.04 * tr,
                                               color=tensor_color("K"), clip_on=False))
    ax.set_xlim(0, tc)
    ax.set_ylim(tr, 0)
    if tr <= 32:
        ax.set_yticks(np.arange(tr) + 0.5, labels=[str(i) for i in range(tr)])
    if tc <= 32:
        ax.set_xticks(np.arange(tc) + 0.5, labels=[str(j) for j in range(tc)])
    ts = events[step]
    ax.set_xlabel(f"key block j (T_c = {tc})\nload: {_fmt_transfer(ts, 'load')}\n"
                  f"store: {_fmt_transfer(ts, 'store')}", fontsize=8)
    ax.set_ylabel(f"query block i (T_r = {tr})")
    ax.set_title(title or f"step {step + 1} of {len(steps)}", fontsize=10, pad=16)
    return ax


def _unit(max_bytes: float) -> tuple[float, str]:
    for div, name in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if max_bytes >= div:
            return div, name
    return 1, "B"


def traffic_by_algorithm(results: dict, bytes_per_elem: int = 2, ax=None,
                         title: str | None = None):
    """Stacked bars of HBM bytes per algorithm, split by tensor: reads solid, writes hatched.

    ``results`` maps an algorithm name to its ``attention.memory.Traffic``.
    """
    ax = _ax(ax)
    names = list(results)
    tensors = list(dict.fromkeys(t for r in results.values() for t in r.per_tensor))
    div, unit = _unit(max(r.total for r in results.values()) * bytes_per_elem)
    x = np.arange(len(names))
    bottom = np.zeros(len(names))
    for t in tensors:
        for k, (hatch, alpha) in enumerate((("", 1.0), ("///", 0.6))):
            h = np.array([results[n].per_tensor.get(t, (0, 0))[k] for n in names], dtype=float)
            h = h * bytes_per_elem / div
            if not h.any():
                continue
            ax.bar(x, h, bottom=bottom, color=tensor_color(t), hatch=hatch, alpha=alpha,
                   edgecolor="black", linewidth=0.4)
            bottom += h
    for xi, tot in zip(x, bottom):
        ax.text(xi, tot, f"{tot:.3g}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(x, labels=names)
    ax.set_ylabel(f"HBM traffic ({unit})")
    ax.set_ylim(0, bottom.max() * 1.15)
    handles = [mpl.patches.Patch(color=tensor_color(t), label=t) for t in tensors]
    handles += [mpl.patches.Patch(facecolor="white", edgecolor="black", label="read"),
                mpl.patches.Patch(facecolor="white", edgecolor="black", hatch="///",
                                  label="written")]
    ax.legend(handles=handles, fontsize=7, ncol=2, loc="upper right")
    if title:
        ax.set_title(title)
    return ax


def roofline_bars(estimates: dict, ax=None, title: str | None = None, unit: str = "ms"):
    """Grouped bars of ESTIMATED times: ``estimates[gpu][algorithm] = time in unit``.

    Estimates from the roofline model, not measurements: the title says so.
    """
    ax = _ax(ax)
    gpus = list(estimates)
    algs = list(dict.fromkeys(a for g in gpus for a in estimates[g]))
    width = 0.8 / max(len(algs), 1)
    shades = np.linspace(0.35, 0.85, len(algs)) if len(algs) > 1 else [0.5]
    for k, a in enumerate(algs):
        vals = [estimates[g].get(a, np.nan) for g in gpus]
        ax.bar(np.arange(len(gpus)) + (k - (len(algs) - 1) / 2) * width, vals, width,
               color=str(shades[k]), edgecolor="black", linewidth=0.4, label=a)
    ax.set_xticks(np.arange(len(gpus)), labels=gpus)
    ax.set_ylabel(f"{unit} (ESTIMATE)")
    ax.legend(fontsize=7)
    ax.set_title(title or "roofline ESTIMATE, not a measurement", fontsize=10)
    return ax


def tile_explorer_figure(N: int = 1024, d: int = 64, sram_kib: int = 192, Br: int = 64,
                         Bc: int = 64, dtype: str = "float16", algorithm: str = "flash2",
                         step: int = 0, max_tiles: int = 16384):
    """The chapter-2 tile-size explorer: everything ``attention.memory`` says about one setting.

    Panels: HBM traffic of standard, FA1 and FA2 (or of the backward passes, if
    ``algorithm`` is one); the chosen algorithm's schedule over the tiles of S at ``step``;
    roofline time ESTIMATES for A100, H100 and H200. The SRAM holds ``sram_kib`` KiB of
    ``dtype`` elements. Tiles that do not fit draw the reason instead; more than
    ``max_tiles`` tiles are counted but not drawn. Returns the figure.
    """
    from attention import memory

    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype must be one of {sorted(DTYPE_BYTES)}, got {dtype!r}")
    bpe = DTYPE_BYTES[dtype]
    M = int(sram_kib) * 1024 // bpe
    fa1_br, fa1_bc = memory.fa1_block_sizes(M, d)
    fa1_need = memory.sram_need("flash1", N, d, fa1_br, fa1_bc)
    rule = (f"FA1 rule: Bc = ceil(M/4d) = {fa1_bc}, Br = min(ceil(M/4d), d) = {fa1_br};\n"
            f"  its flash1 tiles need {fa1_need} elements "
            f"({'fit' if fa1_need <= M else 'do NOT fit: the rule holds up to constants'})")
    backward = algorithm.endswith("_bwd") or algorithm.endswith("_split")
    group = (["standard_bwd", "flash2_bwd", "flash2_bwd_split"] if backward
             else ["standard", "flash1", "flash2"])
    t_r, t_c = memory.cdiv(N, Br), memory.cdiv(N, Bc)
    animate = t_r * t_c <= max_tiles
    try:
        chosen = memory.simulate(algorithm, N, d, Br=Br, Bc=Bc, M=M, keep_trace=animate)
        results = {a: (chosen if a == algorithm else
                       memory.simulate(a, N, d, Br=Br, Bc=Bc, M=M, keep_trace=False))
                   for a in group}
    except ValueError as err:
        fig, ax = plt.subplots(figsize=(11, 2.2))
        ax.axis("off")
        ax.text(0, 0.75, f"Invalid choice: {err}", wrap=True, fontsize=10, color="#C44E52",
                va="top")
        ax.text(0, 0.2, rule, fontsize=9, va="top", wrap=True)
        return fig
    fig = plt.figure(figsize=(12, 8.2))
    gs = fig.add_gridspec(2, 2, height_ratios=[1, 1.05], hspace=0.55, wspace=0.28)
    traffic_by_algorithm(results, bytes_per_elem=bpe, ax=fig.add_subplot(gs[0, 0]),
                         title=f"HBM traffic, N = {N}, d = {d}, Br = {Br}, Bc = {Bc}, {dtype}")
    ax = fig.add_subplot(gs[0, 1])
    if animate:
        tile_schedule_plot(chosen.trace, step, t_r, t_c, ax=ax,
                           title=f"{algorithm}: step {min(step, chosen.steps - 1) + 1} of "
                                 f"{chosen.steps}")
    else:
        ax.axis("off")
        ax.text(0, 0.5, f"{t_r} x {t_c} = {t_r * t_c} tiles: too many to draw.\n"
                        f"Shrink N or grow Br, Bc to see the schedule.", fontsize=10)
    est, lines = {}, []
    for g, spec in memory.GPUS.items():
        est[g] = {}
        for a, r in results.items():
            fl = memory.matmul_flops(a, N, d)
            est[g][a] = memory.roofline_ms(fl, r.bytes(bpe), spec) * 1e3  # microseconds
    for a, r in results.items():
        ai = memory.arithmetic_intensity(memory.matmul_flops(a, N, d), r.bytes(bpe))
        lines.append(f"{a}: {human_bytes(r.bytes(bpe))}, {ai:.0f} FLOP/byte")
    ax = fig.add_subplot(gs[1, 0])
    roofline_bars(est, ax=ax, unit="µs", title="roofline ESTIMATE of one head, "
                                              "not a measurement")
    ax2 = fig.add_subplot(gs[1, 1])
    ax2.axis("off")
    ridge = ", ".join(f"{g} {s.ridge:.0f}" for g, s in memory.GPUS.items())
    text = ("Arithmetic intensity (matmul FLOPs / HBM byte):\n  " + "\n  ".join(lines)
            + f"\nRidge (peak FLOP/s / HBM B/s): {ridge}\n\n"
            + f"SRAM: {sram_kib} KiB = M = {M} {dtype} elements;\n"
            + f"  the tiles of {algorithm} need {chosen.sram_peak}.\n" + rule
            + "\n\nEstimate = max(FLOPs / peak, bytes / HBM bandwidth), with\n"
            + "\n".join(f"  {s.name}: {s.peak_tflops:g} TFLOP/s, {s.hbm_tbps:g} TB/s"
                        for s in memory.GPUS.values()))
    ax2.text(0, 1, text, va="top", fontsize=8, family="monospace", wrap=True)
    return fig


# ---------------------------------------------------------------------------------
# Chapter 3: soft vs hard attention.
# ---------------------------------------------------------------------------------

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


def gumbel_softmax_figure(scores: np.ndarray, noise: np.ndarray, tau: float = 1.0, row: int = 0):
    """Gumbel-softmax weights y = softmax((s + g) / tau) of an (N_q, N_k) score matrix.

    Left: the map of y (white = 0, dark = 1). Right: row ``row`` of y as bars, beside the
    softmax p of the scores (the distribution the one-hot samples follow) and the
    Gumbel-max sample argmax(s + g) that y tends to as tau -> 0. Returns the figure.
    """
    s, g = np.asarray(scores, dtype=float), np.asarray(noise, dtype=float)
    z = (s + g) / tau
    y = np.exp(z - z.max(-1, keepdims=True))
    y /= y.sum(-1, keepdims=True)  # (N_q, N_k)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(11, 3.8), width_ratios=[1, 1.3])
    attention_heatmap(y, ax=ax0, vmax=1.0, title=f"Gumbel-softmax weights, τ = {tau:.3g}")
    ax0.axhline(row, color=SELECTION_COLORS["hard"], lw=1.0, ls=":")
    j = np.arange(s.shape[1])
    ax1.bar(j, y[row], color=SELECTION_COLORS["soft"], alpha=0.85, label=f"y (τ = {tau:.3g})")
    ax1.step(j, p[row], where="mid", color="black", lw=1.2, label="softmax p (τ = 1, no noise)")
    k = int(np.argmax(s[row] + g[row]))
    ax1.plot([k], [1.0], marker="v", ms=9, color=SELECTION_COLORS["hard"], ls="none",
             label="Gumbel-max sample argmax(s + g)")
    ax1.set_ylim(0, 1.08)
    ax1.set_xlabel("key")
    ax1.set_ylabel(f"weight (query {row})")
    ax1.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    return fig


def selection_traffic_figure(N: int = 4096, d: int = 64, k: int = 8, Br: int = 64,
                             Bc: int = 64, bytes_per_elem: int = 2, ns=None):
    """HBM traffic of soft, hard and top-k attention (``attention.memory``, registered by
    ``attention.hard``): total bytes against N (closed form: lines; simulated: dots), and
    the per-tensor split at N. Returns the figure."""
    from attention import hard, memory  # noqa: F401  (hard registers soft, hard, topk)

    ns = np.unique(np.geomspace(256, 65536, 9).astype(int)) if ns is None else np.asarray(ns)
    kw = {"soft": {}, "hard": {}, "topk": {"k": k}}
    label = {"soft": "soft", "hard": "hard (argmax)", "topk": f"top-k (k = {k})"}
    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(12, 4.2))
    for name, extra in kw.items():
        tot = [memory.closed_form(name, int(n), d, Br=Br, Bc=Bc, **extra).bytes(bytes_per_elem)
               for n in ns]
        ax0.plot(ns, tot, color=SELECTION_COLORS[name], lw=2, label=label[name])
        small = [n for n in ns if n <= 4096]
        sim = [memory.simulate(name, int(n), d, Br=Br, Bc=Bc, keep_trace=False,
                               **extra).bytes(bytes_per_elem) for n in small]
        ax0.plot(small, sim, "o", color=SELECTION_COLORS[name], ms=5)
    ax0.axvline(N, color="#8C8C8C", lw=0.8, ls=":")
    ax0.set_xscale("log", base=2)
    ax0.set_yscale("log")
    ax0.set_xlabel("sequence length N (N_q = N_k)")
    ax0.set_ylabel("HBM traffic (bytes)")
    ax0.set_title(f"one head, d = {d}, Br = {Br}: lines closed form, dots simulated")
    ax0.legend()
    results = {label[n]: memory.closed_form(n, N, d, Br=Br, Bc=Bc, **e) for n, e in kw.items()}
    traffic_by_algorithm(results, bytes_per_elem=bytes_per_elem, ax=ax1,
                         title=f"per tensor at N = {N} (closed form)")
    fig.tight_layout()
    return fig


def _seq_len(shape: dict):
    for key in ("N", "N_q", "seq_len", "n"):
        if key in shape:
            return shape[key]
    return None


def recorded_timing_figure(prov: dict, records: list[dict], label: str, d: int = 64,
                           causal: bool = True, dtype: str = "float16"):
    """Measured speed and peak memory against sequence length, one line per implementation.

    ``records`` are one GPU's rows of a suite (``kernels.bench.suite_records``) or live rows
    in the same schema; ``label`` is the provenance label (``provenance_label``). Timing
    panels (one per mode) use rows of op "attention" with head dim ``d``, ``causal`` and
    ``dtype``: TFLOP/s when every row has it, else milliseconds. The memory panel uses rows
    of op "attention-memory" when there are any (else the forward rows); "OOM" rows are
    marked with an x. Tile sweeps (BLOCK_M in the shape) are left out. Returns the figure,
    or None when nothing matches.
    """
    def matches(r):
        sh = r.get("shape", {})
        return (sh.get("d") == d and bool(sh.get("causal", causal)) == causal
                and r.get("dtype") == dtype and _seq_len(sh) and "BLOCK_M" not in sh)

    timing = [r for r in records if r.get("op", "attention") == "attention" and matches(r)]
    mem = [r for r in records if r.get("op") == "attention-memory" and r.get("dtype") == dtype
           and _seq_len(r.get("shape", {}))] or [r for r in timing if r.get("mode") == "fwd"]
    timed = [r for r in timing if r.get("ms") is not None]
    if not timed and not mem:
        return None
    use_tflops = bool(timed) and all(r.get("tflops") for r in timed)
    modes = [m for m in dict.fromkeys(r["mode"] for r in timed)]
    fig, axes = plt.subplots(1, len(modes) + 1, figsize=(4.4 * (len(modes) + 1), 3.9),
                             squeeze=False)
    axes = axes[0]
    for ax, mode in zip(axes, modes):
        for impl in dict.fromkeys(r["impl"] for r in timed if r["mode"] == mode):
            pts = sorted((_seq_len(r["shape"]), r["tflops"] if use_tflops else r["ms"])
                         for r in timed if r["mode"] == mode and r["impl"] == impl)
            ax.plot(*zip(*pts), "o-", color=IMPL_COLORS.get(impl, "#333333"), label=impl,
                    markersize=4)
        ax.set_xscale("log", base=2)
        if not use_tflops:
            ax.set_yscale("log")
        ax.set_xlabel("sequence length N")
        ax.set_ylabel("TFLOP/s (measured)" if use_tflops else "ms (measured, median)")
        ax.set_title(f"{mode}, d = {d}, {'causal' if causal else 'not causal'}, {dtype}",
                     fontsize=9)
        ax.legend(fontsize=7)
    ax = axes[-1]
    for impl in dict.fromkeys(r["impl"] for r in mem):
        rows = [r for r in mem if r["impl"] == impl]
        pts = sorted((_seq_len(r["shape"]), r["peak_mem_bytes"]) for r in rows
                     if r.get("peak_mem_bytes"))
        color = IMPL_COLORS.get(impl, "#333333")
        if pts:
            ax.plot(*zip(*pts), "o-", color=color, label=impl, markersize=4)
        oom = sorted(_seq_len(r["shape"]) for r in rows if r.get("error") == "OOM")
        if oom and pts:
            ax.plot(oom, [pts[-1][1]] * len(oom), "x", color=color, markersize=8,
                    label=f"{impl}: out of memory")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length N")
    ax.set_ylabel("peak memory of one forward (bytes)")
    ax.set_title("peak memory (measured)", fontsize=9)
    if ax.lines:
        ax.legend(fontsize=7)
    fig.suptitle(label, fontsize=9)
    fig.tight_layout()
    return fig


def block_sweep_figure(prov: dict, records: list[dict], label: str, simulated_bytes):
    """Measured ms over a BLOCK_M x BLOCK_N sweep beside the simulator's HBM bytes.

    ``simulated_bytes(shape, BLOCK_M, BLOCK_N)`` returns the simulator's bytes for a
    record's shape and tiles. Returns the figure, or None without sweep records.
    """
    rows = [r for r in records if r.get("ms") is not None and "BLOCK_M" in r.get("shape", {})
            and "BLOCK_N" in r.get("shape", {})]
    if not rows:
        return None
    r0 = rows[0]
    tile_keys = ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages")  # vary across the sweep

    def problem(r):
        return {k: v for k, v in r["shape"].items() if k not in tile_keys}

    rows = [r for r in rows if r["mode"] == r0["mode"] and r["dtype"] == r0["dtype"]
            and problem(r) == problem(r0)]
    bms = sorted({r["shape"]["BLOCK_M"] for r in rows})
    bns = sorted({r["shape"]["BLOCK_N"] for r in rows})
    ms = np.full((len(bms), len(bns)), np.nan)
    sim = np.full_like(ms, np.nan)
    for r in rows:
        i, j = bms.index(r["shape"]["BLOCK_M"]), bns.index(r["shape"]["BLOCK_N"])
        ms[i, j] = r["ms"]
        sim[i, j] = simulated_bytes(r["shape"], r["shape"]["BLOCK_M"], r["shape"]["BLOCK_N"])
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for ax, data, name, cmap in ((axes[0], ms, "measured ms", "Blues"),
                                 (axes[1], sim / 2**20, "simulated HBM MiB", "Oranges")):
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
    """Forward times against N from suite "hard" records (``kernels.bench`` dicts) at head dim d.

    Left: hard attention (argmax, sampled) against the naive PyTorch version and the
    flash (soft) forward on the same shape. Right: top-k attention, same comparison.
    Solid = Triton, dashed = naive PyTorch. ``title`` should carry the provenance label.
    Returns the figure.
    """
    rows = [r for r in records if r.get("shape", {}).get("d") == d and r.get("ms") is not None]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2), sharey=True)
    panels = [
        [("flash", "triton", "soft", "flash (soft) forward"),
         ("hard", "triton", "hard", "hard argmax, Triton"),
         ("hard-sample", "triton", "reinforce", "hard sampled, Triton"),
         ("hard", "naive", "hard", "hard argmax, naive")],
        [("flash", "triton", "soft", "flash (soft) forward"),
         ("topk16", "triton", "topk", "top-16, Triton"),
         ("topk64", "triton", "gumbel-st", "top-64, Triton"),
         ("topk16", "naive", "topk", "top-16, naive"),
         ("topk64", "naive", "gumbel-st", "top-64, naive")],
    ]
    for ax, lines in zip(axes, panels):
        for op, impl, color, label in lines:
            pts = sorted((r["shape"]["N"], r["ms"]) for r in rows
                         if r["op"] == op and r["impl"] == impl)
            if not pts:
                continue
            n, ms = zip(*pts)
            ax.plot(n, ms, marker="o", ms=4, color=SELECTION_COLORS[color],
                    ls="--" if impl == "naive" else "-", label=label)
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


def plot_recorded_timings(records, ax=None, *, op: str = "attention", mode: str = "fwd",
                          dtype: str = "float16", d: int | None = 64, causal: bool | None = False,
                          metric: str = "tflops", title: str | None = None):
    """Recorded GPU measurements (``kernels.bench`` records) against sequence length N.

    One line per implementation in ``IMPL_COLORS``; ``metric`` is ``"tflops"``, ``"ms"``
    or ``"peak_mem_bytes"`` (drawn in GiB). Records with an error (e.g. "OOM") are marked
    with an x at the bottom of the axis instead of a value. Log-2 x axis; log y axis
    except for TFLOP/s. Pass the provenance label (``kernels.bench.provenance_label``) in
    ``title`` so the figure says which GPU and versions measured it.
    """
    ax = _ax(ax)
    rows = [r for r in records if r.get("op") == op and r.get("mode") == mode
            and r.get("dtype") == dtype
            and (d is None or r["shape"].get("d") == d)
            and (causal is None or r["shape"].get("causal") == causal)
            and "BLOCK_M" not in r["shape"]]  # tile sweeps are drawn elsewhere
    label = {"tflops": "TFLOP/s", "ms": "time (ms)", "peak_mem_bytes": "peak memory (GiB)"}[metric]
    impls = sorted({r["impl"] for r in rows}, key=lambda n: (n != "triton", n))
    for impl in impls:
        pts = sorted((r["shape"]["N_q"], r.get(metric)) for r in rows
                     if r["impl"] == impl and r.get("error") is None and r.get(metric) is not None)
        if pts:
            x, y = zip(*pts)
            y = np.asarray(y, dtype=float) / (2**30 if metric == "peak_mem_bytes" else 1)
            ax.plot(x, y, marker="o", color=IMPL_COLORS.get(impl, "#333333"), label=impl,
                    linewidth=2.5 if impl == "triton" else 1.5)
        failed = sorted((r["shape"]["N_q"], r["error"]) for r in rows
                        if r["impl"] == impl and r.get("error"))
        if failed:
            ax.scatter([n for n, _ in failed], [0.02] * len(failed), marker="x", s=60, zorder=3,
                       color=IMPL_COLORS.get(impl, "#333333"), transform=ax.get_xaxis_transform(),
                       label=f"{impl}: {failed[0][1]}")
    ax.set_xscale("log", base=2)
    ns = sorted({r["shape"]["N_q"] for r in rows})
    if ns:
        ax.set_xticks(ns, labels=[f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)
                                  for n in ns])
        ax.minorticks_off()
    if metric != "tflops":
        ax.set_yscale("log")
    ax.set_xlabel("sequence length N")
    ax.set_ylabel(label)
    if title:
        ax.set_title(title)
    if impls:
        ax.legend(fontsize=8)
    return ax


# ---------------------------------------------------------------------------------
# Chapter 4: deformable attention (reference grids, sampled points, traffic, timings).
# ---------------------------------------------------------------------------------

# Sampled keys and values are lighter shades of K and V; sampling positions share idx's hue.
TENSOR_COLORS.setdefault("K̃", "#F3C29B")
TENSOR_COLORS.setdefault("Ṽ", "#A8D5B0")
TENSOR_COLORS.setdefault("points", TENSOR_COLORS["idx"])
IMPL_COLORS.setdefault("grid_sample+flash", "#64B5CD")
IMPL_COLORS.setdefault("grid_sample+sdpa", IMPL_COLORS["sdpa"])


def _norm_to_pixels(points, height: int, width: int) -> np.ndarray:
    """Normalised (x, y) in [-1, 1] -> pixel (column, row) with align_corners=False."""
    p = np.asarray(points, dtype=float)
    return ((p + 1.0) * np.array([width, height]) - 1.0) / 2.0


def _show_image(ax, image):
    img = np.asarray(image)
    ax.imshow(img, cmap="gray" if img.ndim == 2 else None, interpolation="nearest")
    ax.set_xticks([])
    ax.set_yticks([])


def deformable_points_plot(image, reference, points, ax=None, title: str | None = None):
    """Reference points (white dots) and arrows to the deformed points p + Δp (K's colour)
    over an image. ``reference`` and ``points`` are (N, 2) normalised (x, y) covering the
    image with ``align_corners=False``."""
    ax = _ax(ax)
    h, w = np.asarray(image).shape[:2]
    _show_image(ax, image)
    ref = _norm_to_pixels(reference, h, w)
    pts = _norm_to_pixels(points, h, w)
    ax.quiver(ref[:, 0], ref[:, 1], pts[:, 0] - ref[:, 0], pts[:, 1] - ref[:, 1],
              angles="xy", scale_units="xy", scale=1, color=TENSOR_COLORS["K"], width=0.006)
    ax.scatter(ref[:, 0], ref[:, 1], s=12, c="white", edgecolors="black", linewidths=0.5,
               zorder=3, label="reference p")
    ax.scatter(pts[:, 0], pts[:, 1], s=10, c=TENSOR_COLORS["K"], zorder=3,
               label="deformed p + Δp")
    ax.set_xlim(-0.5, w - 0.5)
    ax.set_ylim(h - 0.5, -0.5)
    ax.legend(loc="lower right", fontsize=7, frameon=True)
    if title:
        ax.set_title(title)
    return ax


def sampled_attention_plot(image, points, weights, query_xy, ax=None,
                           title: str | None = None):
    """One query's attention weights over sampled points, drawn on the image: each point's
    area and shade grow with its weight; the query is a star in Q's colour. ``points`` (N, 2)
    normalised (x, y); ``weights`` (N,); ``query_xy`` the query's pixel (column, row)."""
    ax = _ax(ax)
    h, w = np.asarray(image).shape[:2]
    _show_image(ax, image)
    pts = _norm_to_pixels(points, h, w)
    wts = np.asarray(weights, dtype=float)
    order = np.argsort(wts)
    ax.scatter(pts[order, 0], pts[order, 1], s=20 + 400 * wts[order] / max(wts.max(), 1e-12),
               c=wts[order], cmap=ATTENTION_CMAP, vmin=0, vmax=max(wts.max(), 1e-12),
               edgecolors=TENSOR_COLORS["K"], linewidths=0.8, zorder=3)
    ax.scatter([query_xy[0]], [query_xy[1]], marker="*", s=220, c=TENSOR_COLORS["Q"],
               edgecolors="white", linewidths=0.8, zorder=4)
    ax.set_xlim(-0.5, w - 0.5)
    ax.set_ylim(h - 0.5, -0.5)
    if title:
        ax.set_title(title)
    return ax


def msda_points_figure(levels, locations, weights, queries_xy, n_heads_shown: int = 2):
    """Multi-scale deformable attention: one panel per pyramid level, the sampling points of a
    few queries on it (marker per query, area = attention weight, K's colour), the queries as
    stars. ``levels``: list of 2-D arrays; ``locations`` (n_q, H, L, P, 2) in [0, 1];
    ``weights`` (n_q, H, L, P); ``queries_xy`` (n_q, 2) in [0, 1]."""
    import matplotlib.pyplot as plt

    n_l = len(levels)
    fig, axes = plt.subplots(1, n_l, figsize=(3.2 * n_l, 3.0))
    axes = np.atleast_1d(axes)
    markers = ["o", "s", "^", "D", "v", "P"]
    loc = np.asarray(locations)[:, :n_heads_shown]
    wts = np.asarray(weights)[:, :n_heads_shown]
    wmax = max(float(wts.max()), 1e-12)
    for lvl, ax in enumerate(axes):
        img = np.asarray(levels[lvl])
        h, w = img.shape[:2]
        _show_image(ax, img)
        for qi in range(loc.shape[0]):
            xy = loc[qi, :, lvl].reshape(-1, 2) * np.array([w, h]) - 0.5  # (heads*P, 2)
            ww = wts[qi, :, lvl].reshape(-1)
            ax.scatter(xy[:, 0], xy[:, 1], s=15 + 160 * ww / wmax, marker=markers[qi % 6],
                       c=TENSOR_COLORS["K"], edgecolors="black", linewidths=0.4, zorder=3,
                       alpha=0.9)
            qx, qy = np.asarray(queries_xy[qi]) * np.array([w, h]) - 0.5
            ax.scatter([qx], [qy], marker="*", s=140, c=TENSOR_COLORS["Q"],
                       edgecolors="white", linewidths=0.6, zorder=4)
        ax.set_xlim(-0.5, w - 0.5)
        ax.set_ylim(h - 0.5, -0.5)
        ax.set_title(f"level {lvl}: {h} x {w}")
    fig.tight_layout()
    return fig


_DEFORM_ALGS = {"dense": "dense-image", "DAT fused": "dat", "DAT unfused": "dat-unfused",
                "MSDA": "msda"}
_DEFORM_STYLES = {"dense": ("#C44E52", "-"), "DAT fused": ("#4C72B0", "-"),
                  "DAT unfused": ("#4C72B0", "--"), "MSDA": ("#55A868", "-")}


def _deform_kwargs(alg: str, side: int, d: int, r: int, n_points: int, n_levels: int) -> dict:
    if alg == "msda":
        return dict(n_queries=side * side, d=d, n_levels=n_levels, n_points=n_points)
    kw = dict(height=side, width=side, d=d)
    if alg.startswith("dat"):
        kw["r"] = r
    return kw


def deformable_traffic_figure(side: int = 64, d: int = 32, r: int = 4, n_points: int = 4,
                              n_levels: int = 4, bytes_per_elem: int = 2):
    """HBM traffic of one head over a side x side map (every position a query): dense
    attention, DAT fused and unfused (grid_sample writes K̃, Ṽ) and MSDA.

    Left: per-tensor bars from the simulator at the chosen size. Right: total bytes against
    the map side from the closed forms (lines), the simulator at a few sizes (dots).
    """
    import matplotlib.pyplot as plt

    from attention import deformable, memory  # noqa: F401  (deformable registers the algorithms)

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11.5, 4.0),
                                   gridspec_kw={"width_ratios": [1.1, 1]})
    results = {name: memory.simulate(alg, keep_trace=False,
                                     **_deform_kwargs(alg, side, d, r, n_points, n_levels))
               for name, alg in _DEFORM_ALGS.items()}
    traffic_by_algorithm(results, bytes_per_elem=bytes_per_elem, ax=ax1,
                         title=f"{side} x {side} map, d = {d}, r = {r}, L·P = "
                               f"{n_levels} x {n_points}")
    ax1.tick_params(axis="x", labelsize=8)
    sides = np.unique(np.geomspace(16, 512, 24).astype(int))
    for name, alg in _DEFORM_ALGS.items():
        color, ls = _DEFORM_STYLES[name]
        tot = [memory.closed_form(alg, **_deform_kwargs(alg, s, d, r, n_points, n_levels)).total
               * bytes_per_elem for s in sides]
        ax2.plot(sides, tot, color=color, linestyle=ls, label=name)
        sim_sides = [16, 32, 64]
        sims = [memory.simulate(alg, keep_trace=False,
                                **_deform_kwargs(alg, s, d, r, n_points, n_levels)).total
                * bytes_per_elem for s in sim_sides]
        ax2.scatter(sim_sides, sims, color=color, s=18, zorder=3)
    ax2.axvline(side, color="#8C8C8C", linewidth=0.8, linestyle=":")
    ax2.set_xscale("log", base=2)
    ax2.set_yscale("log")
    ax2.set_xlabel("map side (H = W); queries = H·W")
    ax2.set_ylabel("HBM bytes (one head)")
    ax2.set_title("closed form (lines), simulated (dots)")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    return fig


def deformable_timing_figure(prov_label: str, records: list[dict], dtype: str = "float16"):
    """Recorded GPU times (ms, log scale) of the deformable suite: MSDA and fused DAT against
    their PyTorch baselines, forward and forward + backward, one group of bars per shape.
    Each Triton bar is annotated with its speed-up over the naive PyTorch version."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    for ax, op in zip(axes, ("msda", "dat")):
        rows = [r for r in records if r.get("op") == op and r.get("dtype") == dtype]
        keys = list(dict.fromkeys(
            (r["shape"].get("name") or f"L_q={r['shape'].get('L_q')}", r["mode"]) for r in rows))
        impls = sorted({r["impl"] for r in rows}, key=lambda n: (n != "triton", n))
        width = 0.8 / max(len(impls), 1)
        for k, impl in enumerate(impls):
            for j, key in enumerate(keys):
                rec = [r for r in rows if r["impl"] == impl and r["mode"] == key[1]
                       and (r["shape"].get("name") or f"L_q={r['shape'].get('L_q')}") == key[0]]
                if not rec or rec[0].get("ms") is None:
                    continue
                x = j + (k - (len(impls) - 1) / 2) * width
                ax.bar(x, rec[0]["ms"], width, color=IMPL_COLORS.get(impl, "#333333"),
                       edgecolor="black", linewidth=0.4, label=impl if j == 0 else None)
                if impl == "triton":
                    base = [r for r in rows if r["impl"] == "naive" and r["mode"] == key[1]
                            and (r["shape"].get("name")
                                 or f"L_q={r['shape'].get('L_q')}") == key[0]]
                    if base and base[0].get("ms"):
                        ax.text(x, rec[0]["ms"], f"{base[0]['ms'] / rec[0]['ms']:.1f}x",
                                ha="center", va="bottom", fontsize=7)
        ax.set_xticks(range(len(keys)), labels=[f"{a}\n{b}" for a, b in keys], fontsize=8)
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
