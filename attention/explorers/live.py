"""The live explorers: ipywidgets built on ``attention.plots`` and ``attention.memory``,
redrawn by Python in Jupyter and Colab (``explorers.X()`` gives these off the site).
"""

from __future__ import annotations

from .data import BACKWARD, FORWARD, temperature_inputs
from .site import check_option

# ---------------------------------------------------------------------------------
# Shared helper: show a matplotlib figure in an Output widget.
# ---------------------------------------------------------------------------------


def _within(name: str, value, lo, hi) -> None:
    """A slider's starting value must lie on its range (ipywidgets would clamp it
    quietly): ValueError naming the argument and the range."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not lo <= value <= hi
    ):
        raise ValueError(f"{name} must be a number in [{lo}, {hi}], got {value!r}")


def _show_figure(out, fig) -> None:
    """Replace ``out``'s content with ``fig`` as a PNG, then close the figure.

    Setting ``out.outputs`` directly works the same inside and outside a running kernel
    (so tests can check a redraw), and swaps the image in one step (no flicker).
    """
    import base64
    import io

    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    png = base64.b64encode(buf.getvalue()).decode("ascii")
    out.outputs = (
        {
            "output_type": "display_data",
            "metadata": {},
            "data": {"image/png": png, "text/plain": "<Figure>"},
        },
    )


# ---------------------------------------------------------------------------------
# Chapter 1: HBM traffic of standard (materialising) attention.
# ---------------------------------------------------------------------------------


def naive_traffic_explorer(
    n: int = 1024, m: int | None = None, d: int = 64, dtype: str = "float16"
):
    """Sliders for n (keys), m (queries; tick "self" for m = n), d and dtype.

    Each change redraws ``attention.plots.naive_traffic_figure``: bytes against n per
    tensor (simulated and closed form) and the per-tensor bars at the chosen (m, n).
    Returns the box.
    """
    import ipywidgets as widgets

    from attention import plots

    _within("n", n, 64, 8192)
    if m is not None:
        _within("m", m, 16, 8192)
    check_option("d", d, [16, 32, 64, 128, 256])
    check_option("dtype", dtype, list(plots.DTYPE_BYTES))
    style = {"description_width": "initial"}
    n_slider = widgets.IntSlider(
        value=n,
        min=64,
        max=8192,
        step=64,
        description="keys n",
        continuous_update=False,
        style=style,
    )
    m_slider = widgets.IntSlider(
        value=m or n,
        min=16,
        max=8192,
        step=16,
        description="queries m",
        continuous_update=False,
        style=style,
        disabled=m is None,
    )
    self_box = widgets.Checkbox(
        value=m is None, description="self-attention (m = n)", indent=False
    )
    d_menu = widgets.Dropdown(
        options=[16, 32, 64, 128, 256], value=d, description="head dim d", style=style
    )
    dtype_menu = widgets.Dropdown(
        options=list(plots.DTYPE_BYTES), value=dtype, description="dtype", style=style
    )
    out = widgets.Output()

    def redraw(change=None):
        m_slider.disabled = self_box.value
        fig = plots.naive_traffic_figure(
            n=n_slider.value,
            m=None if self_box.value else m_slider.value,
            d=d_menu.value,
            dtype=dtype_menu.value,
        )
        _show_figure(out, fig)

    for w in (n_slider, m_slider, self_box, d_menu, dtype_menu):
        w.observe(redraw, names="value")
    redraw()
    controls = widgets.VBox(
        [
            widgets.HBox([n_slider, m_slider, self_box]),
            widgets.HBox([d_menu, dtype_menu]),
        ]
    )
    return widgets.VBox([controls, out])


# ---------------------------------------------------------------------------------
# Chapter 2: the tile-size explorer (HBM traffic, SRAM schedule, roofline estimates).
# ---------------------------------------------------------------------------------


#: A setting whose simulation (of the chosen algorithm, the one whose schedule is
#: drawn) would record more events than this is drawn from the closed forms alone
#: (same counts, no schedule): a slider redraw stays well under a second.
SIMULATE_EVENTS = 1_500_000
#: The tile explorer's schedule panel draws at most this many tiles of S (as the
#: figure's ``max_tiles``); beyond it the step slider is switched off.
MAX_TILES = 16384


def tile_schedule_state(N: int, d: int, M: int, Br: int, Bc: int, algorithm: str):
    """What the tile explorer's step slider can show: ``(steps, None)`` with the number
    of steps of ``algorithm``'s schedule, or ``(0, reason)`` when there is no schedule
    to step through (the tiles do not fit in ``M`` elements of SRAM, or too many tiles
    to draw). From ``memory.closed_form``: nothing is simulated."""
    from attention import memory

    try:
        form = memory.closed_form(algorithm, N, d, Br=Br, Bc=Bc, M=M)
    except ValueError as err:  # the tiles do not fit in M
        return 0, f"step: off, the tiles do not fit in SRAM. {err}"
    tiles = memory.cdiv(N, Br) * memory.cdiv(N, Bc)
    if tiles > MAX_TILES:
        return 0, (
            f"step: off, {tiles:,} tiles of S are too many to draw (at most "
            f"{MAX_TILES:,}); shrink N or grow Br, Bc"
        )
    return form.steps, None


def _closed_form_tile_figure(N, d, sram_kib, Br, Bc, dtype, algorithm, events):
    """The tile explorer's figure for settings too big to simulate: HBM traffic
    and roofline ESTIMATES from ``memory.closed_form`` (the same counts
    ``simulate`` would give)."""
    import matplotlib.pyplot as plt

    from attention import memory, plots

    bpe = plots.DTYPE_BYTES[dtype]
    M = int(sram_kib) * 1024 // bpe
    group = BACKWARD if algorithm in BACKWARD else FORWARD
    results = {a: memory.closed_form(a, N, d, Br=Br, Bc=Bc, M=M) for a in group}
    floor = {a: memory.compulsory(a, N, d) for a in group}
    fig, (ax0, ax1, ax2) = plt.subplots(
        1, 3, figsize=(14, 4.4), gridspec_kw={"width_ratios": [1.1, 1.1, 0.7]}
    )
    plots.traffic_by_algorithm(
        results,
        bytes_per_elem=bpe,
        ax=ax0,
        floor=floor,
        title=f"HBM traffic, N = {N}, d = {d}, Br = {Br}, "
        f"Bc = {Bc}, {dtype} (closed form)",
    )

    def estimate(counts):
        return {
            g: {
                a: memory.roofline_ms(memory.matmul_flops(a, N, d), r.bytes(bpe), spec)
                * 1e3
                for a, r in counts.items()
            }
            for g, spec in memory.GPUS.items()
        }

    plots.roofline_bars(
        estimate(results),
        ax=ax1,
        unit="µs",
        floor=estimate(floor),
        title="roofline ESTIMATE of one head, not a measurement",
    )
    ax2.axis("off")
    text = (
        f"Counted by memory.closed_form:\nsimulating these {events:,} events\n"
        f"in Python would take too long\n(no schedule drawn).\n\nThe numbers are "
        f"printed\nunder the figure."
    )
    ax2.text(0, 1, text, va="top", fontsize=8)
    fig.tight_layout()
    return fig


def tile_size_explorer(
    N: int = 1024,
    d: int = 64,
    sram_kib: int = 192,
    Br: int = 64,
    Bc: int = 64,
    dtype: str = "float16",
    algorithm: str = "flash2",
):
    """Sliders for N, d, SRAM size, Br, Bc, dtype, algorithm and the schedule's step.

    Each change redraws ``attention.plots.tile_explorer_figure``: HBM reads and writes
    per algorithm and tensor (simulated, no L2, beside the compulsory traffic), the
    tiles in SRAM at the chosen step, and roofline ESTIMATES for A100, H100 and H200
    from both counts; ``plots.tile_explorer_summary`` prints the numbers under the
    figure. Tiles larger than the SRAM draw the reason instead, and switch the step
    slider off (the label beside it says why), as do more tiles than can be drawn.
    Settings too big to simulate quickly (``SIMULATE_EVENTS``) are drawn from the closed
    forms, so no slider position can stall the kernel. "Use the FA1 rule" sets Br and Bc
    from the SRAM size. Returns the widget box.
    """
    import html

    import ipywidgets as widgets

    from attention import memory, plots

    _within("N", N, 64, 16384)
    check_option("d", d, [32, 64, 128, 256])
    _within("sram_kib", sram_kib, 16, 256)
    _within("Br", Br, 16, 512)
    _within("Bc", Bc, 16, 512)
    check_option("dtype", dtype, list(plots.DTYPE_BYTES))
    check_option("algorithm", algorithm, FORWARD + BACKWARD)
    style = {"description_width": "initial"}
    opts = dict(continuous_update=False, style=style)
    n_s = widgets.IntSlider(
        value=N, min=64, max=16384, step=64, description="N", **opts
    )
    d_m = widgets.Dropdown(
        options=[32, 64, 128, 256], value=d, description="head dim d", style=style
    )
    m_s = widgets.IntSlider(
        value=sram_kib, min=16, max=256, step=8, description="SRAM (KiB)", **opts
    )
    br_s = widgets.IntSlider(
        value=Br, min=16, max=512, step=16, description="Br", **opts
    )
    bc_s = widgets.IntSlider(
        value=Bc, min=16, max=512, step=16, description="Bc", **opts
    )
    dt_m = widgets.Dropdown(
        options=list(plots.DTYPE_BYTES), value=dtype, description="dtype", style=style
    )
    alg_m = widgets.Dropdown(
        options=FORWARD + BACKWARD,
        value=algorithm,
        description="algorithm",
        style=style,
    )
    step_s = widgets.IntSlider(value=0, min=0, max=0, description="step", **opts)
    step_note = widgets.HTML(value="")
    rule_b = widgets.Button(description="Use the FA1 rule for Br, Bc")
    out = widgets.Output()
    summary = widgets.HTML(value="")  # the numbers, printed under the figure
    busy = {"on": False}

    def sram_elements() -> int:
        return m_s.value * 1024 // plots.DTYPE_BYTES[dt_m.value]

    def update_step() -> None:
        steps, why = tile_schedule_state(
            n_s.value, d_m.value, sram_elements(), br_s.value, bc_s.value, alg_m.value
        )
        step_s.max = max(steps - 1, 0)
        step_s.disabled = why is not None
        if why is not None:
            step_s.value = 0
        step_note.value = "" if why is None else f"<i>{why}</i>"

    def figure():
        kw = dict(
            N=n_s.value,
            d=d_m.value,
            sram_kib=m_s.value,
            Br=br_s.value,
            Bc=bc_s.value,
            dtype=dt_m.value,
            algorithm=alg_m.value,
        )
        # The figure simulates the chosen algorithm only (the rest: closed forms).
        try:
            events = memory.closed_form(
                alg_m.value,
                n_s.value,
                d_m.value,
                Br=br_s.value,
                Bc=bc_s.value,
                M=sram_elements(),
            ).events
        except ValueError:
            # The tiles do not fit: the figure says why, simulating nothing.
            events = 0
        if events > SIMULATE_EVENTS:
            return _closed_form_tile_figure(events=events, **kw)
        return plots.tile_explorer_figure(
            step=step_s.value, max_tiles=MAX_TILES, text_panel=False, **kw
        )

    def numbers() -> str:
        try:
            text = plots.tile_explorer_summary(
                N=n_s.value,
                d=d_m.value,
                sram_kib=m_s.value,
                Br=br_s.value,
                Bc=bc_s.value,
                dtype=dt_m.value,
                algorithm=alg_m.value,
            )
        except ValueError:  # the tiles do not fit: the figure gives the reason
            return ""
        style = "font-size: 12px; line-height: 1.3"
        return f"<pre style='{style}'>{html.escape(text)}</pre>"

    def redraw(change=None):
        if busy["on"]:
            return
        busy["on"] = True
        try:
            if change is None or change["owner"] is not step_s:
                update_step()
                summary.value = numbers()
            _show_figure(out, figure())
        finally:
            busy["on"] = False

    def use_rule(_button):
        br, bc = memory.fa1_block_sizes(sram_elements(), d_m.value)
        busy["on"] = True  # one redraw for both sliders
        br_s.value = min(max(br, br_s.min), br_s.max)
        bc_s.value = min(max(bc, bc_s.min), bc_s.max)
        busy["on"] = False
        redraw()

    for w in (n_s, d_m, m_s, br_s, bc_s, dt_m, alg_m, step_s):
        w.observe(redraw, names="value")
    rule_b.on_click(use_rule)
    redraw()
    controls = widgets.VBox(
        [
            widgets.HBox([n_s, d_m, m_s, dt_m]),
            widgets.HBox([br_s, bc_s, rule_b]),
            widgets.HBox([alg_m, step_s, step_note]),
        ]
    )
    return widgets.VBox([controls, out, summary])


def teaser(d: int = 64, dtype: str = "float16"):
    """The landing page's explorer in Jupyter: the tile-size explorer at N = 4096,
    Br = Bc = 64 (the static teaser's start), where standard attention and
    FlashAttention-2 stand side by side with FlashAttention-1. Returns the box."""
    return tile_size_explorer(N=4096, d=d, Br=64, Bc=64, dtype=dtype)


# ---------------------------------------------------------------------------------
# Chapter 3: soft vs hard attention (temperature, and the traffic of top-k).
# ---------------------------------------------------------------------------------


def temperature_explorer(
    scores=None, noise=None, tau: float = 1.0, row: int = 0, seed: int = 0
):
    """A log slider for the Gumbel-softmax temperature tau (and one for the query row).

    Each change redraws ``attention.plots.gumbel_softmax_figure`` with the SAME scores
    and Gumbel noise, so only tau moves the weights: uniform for large tau, one-hot (the
    Gumbel-max sample) as tau -> 0. Default scores: a random (8, 12) matrix. Returns
    the box.
    """
    import ipywidgets as widgets

    from attention import plots

    s, g = temperature_inputs(scores, noise, seed)
    _within("tau", tau, 10**-2, 10**1.5)
    if isinstance(row, bool) or not isinstance(row, int) or not 0 <= row < s.shape[0]:
        raise ValueError(f"row must be an int in 0..{s.shape[0] - 1}, got {row!r}")
    style = {"description_width": "initial"}
    tau_s = widgets.FloatLogSlider(
        value=tau,
        base=10,
        min=-2,
        max=1.5,
        step=0.05,
        description="temperature τ",
        continuous_update=False,
        style=style,
        readout_format=".3g",
    )
    row_s = widgets.IntSlider(
        value=row,
        min=0,
        max=s.shape[0] - 1,
        description="query row",
        continuous_update=False,
        style=style,
    )
    out = widgets.Output()

    def redraw(change=None):
        _show_figure(
            out, plots.gumbel_softmax_figure(s, g, tau=tau_s.value, row=row_s.value)
        )

    for w in (tau_s, row_s):
        w.observe(redraw, names="value")
    redraw()
    return widgets.VBox([widgets.HBox([tau_s, row_s]), out])


def topk_traffic_explorer(N: int = 4096, d: int = 64, k: int = 8):
    """Sliders for k (rows of V read per query), N and d; each change redraws
    ``attention.plots.selection_traffic_figure`` (soft, hard and top-k HBM traffic).
    Returns the box."""
    import ipywidgets as widgets

    from attention import plots

    _within("k", k, 1, 256)
    _within("N", N, 256, 65536)
    check_option("d", d, [32, 64, 128])
    style = {"description_width": "initial"}
    k_s = widgets.IntSlider(
        value=k,
        min=1,
        max=256,
        description="top-k k",
        continuous_update=False,
        style=style,
    )
    n_s = widgets.IntSlider(
        value=N,
        min=256,
        max=65536,
        step=256,
        description="length N",
        continuous_update=False,
        style=style,
    )
    d_m = widgets.Dropdown(
        options=[32, 64, 128], value=d, description="head dim d", style=style
    )
    out = widgets.Output()

    def redraw(change=None):
        _show_figure(
            out, plots.selection_traffic_figure(N=n_s.value, d=d_m.value, k=k_s.value)
        )

    for w in (k_s, n_s, d_m):
        w.observe(redraw, names="value")
    redraw()
    return widgets.VBox([widgets.HBox([k_s, n_s, d_m]), out])


# ---------------------------------------------------------------------------------
# Chapter 4: deformable attention's memory traffic against r and the number of points.
# ---------------------------------------------------------------------------------


def deformable_traffic_explorer(
    side: int = 64, d: int = 32, r: int = 4, n_points: int = 4, n_levels: int = 4
):
    """Sliders for DAT's downsampling factor r, MSDA's points per level P and levels L,
    the map side and d; each change redraws
    ``attention.plots.deformable_traffic_figure``. Returns the box."""
    import ipywidgets as widgets

    from attention import plots

    _within("r", r, 1, 16)
    _within("n_points", n_points, 1, 16)
    _within("n_levels", n_levels, 1, 4)
    _within("side", side, 16, 128)
    check_option("d", d, [16, 32, 64, 128])
    style = {"description_width": "initial"}
    r_s = widgets.IntSlider(
        value=r,
        min=1,
        max=16,
        description="DAT factor r",
        continuous_update=False,
        style=style,
    )
    p_s = widgets.IntSlider(
        value=n_points,
        min=1,
        max=16,
        description="MSDA points P",
        continuous_update=False,
        style=style,
    )
    l_s = widgets.IntSlider(
        value=n_levels,
        min=1,
        max=4,
        description="MSDA levels L",
        continuous_update=False,
        style=style,
    )
    side_s = widgets.IntSlider(
        value=side,
        min=16,
        max=128,
        step=16,
        description="map side",
        continuous_update=False,
        style=style,
    )
    d_m = widgets.Dropdown(
        options=[16, 32, 64, 128], value=d, description="head dim d", style=style
    )
    out = widgets.Output()

    def redraw(change=None):
        _show_figure(
            out,
            plots.deformable_traffic_figure(
                side=side_s.value,
                d=d_m.value,
                r=r_s.value,
                n_points=p_s.value,
                n_levels=l_s.value,
            ),
        )

    for w in (r_s, p_s, l_s, side_s, d_m):
        w.observe(redraw, names="value")
    redraw()
    return widgets.VBox(
        [widgets.HBox([r_s, p_s, l_s]), widgets.HBox([side_s, d_m]), out]
    )
