"""Chapter 2's tile-size explorer: builds, redraws on every control, shows
invalid choices."""

import matplotlib
import pytest

matplotlib.use("Agg")

from attention import plots  # noqa: E402
from attention.explorers import tile_size  # noqa: E402

pytestmark = pytest.mark.xdist_group("memory_flash")


def _find(box, description):
    stack = [box]
    while stack:
        w = stack.pop()
        if getattr(w, "description", None) == description:
            return w
        stack.extend(getattr(w, "children", ()))
    raise LookupError(description)


def _png(box):
    out = box.children[1]  # controls, the figure, the numbers printed under it
    assert len(out.outputs) == 1
    return out.outputs[0]["data"]["image/png"]


def _summary(box):
    return box.children[2].value


def test_explorer_redraws_on_each_control(monkeypatch):
    calls = []
    real = plots.tile_explorer_figure

    def spy(**kw):
        calls.append(kw)
        return real(**kw)

    monkeypatch.setattr(plots, "tile_explorer_figure", spy)
    box = tile_size.live_tile_size_explorer(N=256, d=64, Br=64, Bc=64)
    first = _png(box)
    assert calls[-1]["N"] == 256 and calls[-1]["algorithm"] == "flash2"
    # No text panel inside the figure: the numbers are printed under it.
    assert calls[-1]["text_panel"] is False
    want = plots.tile_explorer_summary(N=256, d=64, Br=64, Bc=64)
    assert want.splitlines()[2].split()[0] == "standard"
    assert all(line in _summary(box) for line in want.splitlines()[:5])
    step = _find(box, "step")
    assert step.max == 16 - 1  # (256/64)^2 tiles, one step each
    step.value = 7
    assert calls[-1]["step"] == 7 and _png(box) != first
    _find(box, "algorithm").value = "flash1"
    assert calls[-1]["algorithm"] == "flash1"
    _find(box, "N").value = 512
    assert calls[-1]["N"] == 512 and step.max == 64 - 1
    assert "compulsory" in _summary(box)
    want = plots.tile_explorer_summary(N=512, d=64, algorithm="flash1")
    assert want.splitlines()[3] in _summary(box)
    _find(box, "Bc").value = 128
    assert calls[-1]["Bc"] == 128


def test_fa1_rule_button_sets_tiles():
    box = tile_size.live_tile_size_explorer(N=256, d=64, sram_kib=64, dtype="float16")
    _find(box, "Use the FA1 rule for Br, Bc").click()
    # M = 64 KiB / 2 B = 32768 elements: Bc = ceil(M / 4d) = 128, Br = min(128, d) = 64.
    assert (_find(box, "Br").value, _find(box, "Bc").value) == (64, 128)


def test_invalid_tiles_show_the_reason(monkeypatch):
    texts = []
    real = plots.tile_explorer_figure

    def spy(**kw):
        fig = real(**kw)
        texts.append(" ".join(t.get_text() for ax in fig.axes for t in ax.texts))
        return fig

    monkeypatch.setattr(plots, "tile_explorer_figure", spy)
    box = tile_size.live_tile_size_explorer(N=1024, d=128, sram_kib=16, Br=256, Bc=256)
    assert "Invalid choice" in texts[-1] and "M holds 8192" in texts[-1]
    assert _png(box) and _summary(box) == ""  # the figure gives the reason


def test_chapter2_figures_draw():
    from attention import memory

    trace = memory.simulate("standard", 200, 16, Br=64, Bc=64).trace
    ax = plots.tile_schedule_plot(trace, 5, 4, 4)
    # Step 5 is tile (1, 1) of S = Q K^T: Q_1 is already in SRAM since step 4.
    assert "load: K[1]\nstore: S[1,1]" in ax.get_xlabel()
    ax = plots.memory_hierarchy_plot(
        [
            dict(
                device="A100", kind="HBM", capacity=40e9, bandwidth=1.5e12, label="HBM"
            ),
            dict(
                device="H100",
                kind="SRAM",
                capacity=3e7,
                bandwidth=3e13,
                label="SRAM",
                derived=True,
            ),
        ]
    )
    assert len(ax.collections) == 2


def test_recorded_result_figures_use_only_given_records():
    # A synthetic fixture for the drawing code only; the site draws real recorded files.
    def rec(impl, mode, n, d=64, causal=True, dtype="float16", op="attention", **kw):
        row = dict(
            suite="flash",
            op=op,
            impl=impl,
            mode=mode,
            dtype=dtype,
            shape={"B": 1, "H": 2, "N_q": n, "N_k": n, "d": d, "causal": causal},
            ms=0.01 * n,
            tflops=n / 100,
            peak_mem_bytes=n * 64,
            error=None,
        )
        row.update(kw)
        return row

    recs = [
        rec(impl, mode, n)
        for impl in ("triton", "naive")
        for mode in ("fwd", "fwd+bwd")
        for n in (512, 1024)
    ]
    others = [
        rec("triton", "fwd", 512, d=128),
        rec("triton", "fwd", 512, causal=False),
        rec("triton", "fwd", 512, dtype="bfloat16"),
    ]
    mem = [
        rec("naive", "fwd", 4096, op="attention-memory"),
        rec(
            "naive",
            "fwd",
            65536,
            op="attention-memory",
            ms=None,
            peak_mem_bytes=None,
            error="OOM",
        ),
    ]
    # As the suite records it: the warp count changes with the tile, the problem
    # does not.
    sweep = [
        dict(
            rec("triton", "fwd", 1024),
            shape={
                "B": 1,
                "H": 2,
                "N": 1024,
                "d": 64,
                "BLOCK_M": bm,
                "BLOCK_N": bn,
                "num_warps": 8 if bm * bn >= 8192 else 4,
                "num_stages": 2,
            },
        )
        for bm in (64, 128)
        for bn in (32, 64)
    ]
    fig = plots.recorded_timing_figure(recs + others + mem + sweep, "label")
    assert len(fig.axes) == 3  # fwd, fwd+bwd, peak memory
    # Only d = 64, causal, fp16 rows: two points per implementation and mode.
    assert [len(line.get_xdata()) for ax in fig.axes[:2] for line in ax.lines] == [
        2
    ] * 4
    assert fig.axes[0].get_ylabel().startswith("TFLOP/s")
    assert any("out of memory" in line.get_label() for line in fig.axes[2].lines)
    assert plots.recorded_timing_figure(sweep, "label", d=32) is None
    seen = []
    fig = plots.block_sweep_figure(
        sweep, "label", lambda shape, bm, bn: seen.append((bm, bn)) or bm * bn
    )
    assert sorted(seen) == [(64, 32), (64, 64), (128, 32), (128, 64)]
    assert plots.block_sweep_figure(recs, "label", lambda *a: 0) is None


def _note(box):
    step = _find(box, "step")
    stack = [box]
    while stack:  # the HTML label beside the step slider
        w = stack.pop()
        kids = list(getattr(w, "children", ()))
        if step in kids:
            return kids[kids.index(step) + 1].value
        stack.extend(kids)
    raise LookupError("step note")


def test_step_slider_is_off_when_the_tiles_do_not_fit():
    from attention import memory

    box = tile_size.live_tile_size_explorer(N=1024, d=128, sram_kib=16, Br=256, Bc=256)
    step = _find(box, "step")
    assert step.disabled and step.max == 0 and step.value == 0
    assert "do not fit in SRAM" in _note(box) and "M holds 8192" in _note(box)
    # A larger SRAM and smaller tiles: they fit, the slider comes back with
    # the schedule.
    _find(box, "Br").value = 128
    _find(box, "Bc").value = 128
    assert step.disabled
    _find(box, "SRAM (KiB)").value = 256
    assert memory.sram_need("flash2", 1024, 128, 128, 128) <= 256 * 1024 // 2
    assert not step.disabled and _note(box) == ""
    steps = memory.closed_form("flash2", 1024, 128, Br=128, Bc=128).steps
    assert step.max == steps - 1 == 63
    # The standard forward needs a whole row of S: with a small SRAM and a long N it
    # does not fit while flash2 does; switching the algorithm switches the slider off.
    _find(box, "SRAM (KiB)").value = 16
    _find(box, "Br").value = 16
    _find(box, "Bc").value = 16
    _find(box, "N").value = 16384
    _find(box, "algorithm").value = "standard"
    assert step.disabled and "one row of S" in _note(box)


def test_no_slider_position_runs_a_huge_simulation(monkeypatch):
    import time

    from attention import memory

    real = memory.simulate
    events = []

    def spy(alg, *a, **kw):
        t = real(alg, *a, **kw)
        events.append(t.events)
        return t

    monkeypatch.setattr(memory, "simulate", spy)
    t0 = time.perf_counter()
    # The sliders' extreme corner (longest N, smallest tiles), forward and backward.
    for alg in ("flash2", "flash2_bwd"):
        box = tile_size.live_tile_size_explorer(
            N=16384, d=32, sram_kib=256, Br=16, Bc=16, algorithm=alg
        )
        assert _find(box, "step").disabled and "too many to draw" in _note(box)
        assert _png(box)
    assert time.perf_counter() - t0 < 10  # ~1 s each on one core
    assert sum(events) <= tile_size.SIMULATE_EVENTS
    # The closed-form figure carries the counts.
    fig = tile_size._closed_form_tile_figure(
        16384, 32, 256, 16, 16, "float16", "flash2", events=10**7
    )
    text = " ".join(t.get_text() for ax in fig.axes for t in ax.texts)
    assert "memory.closed_form" in text and "10,000,000 events" in text


def test_a_sibling_whose_tiles_do_not_fit_is_left_out_not_raised():
    """Past the simulator's budget the figure compares the chosen algorithm with its
    siblings; those whose tiles do not fit M (flash1 and flash2 beside standard here:
    2 Br d of Q_i, O_i alone) are left out and named, instead of the move raising."""
    import matplotlib.pyplot as plt

    fig = tile_size.tile_figure(65536, 256, 256, 512, 16, "float8", "standard", 0)
    labels = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    assert labels == ["standard"]
    text = " ".join(t.get_text() for t in fig.axes[1].texts)  # where a schedule is
    assert "flash1, flash2 do not fit" in text
    plt.close(fig)
