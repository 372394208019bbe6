"""The chapters' picture explorers (attention.explorers: maps, softmax, estimators,
sampling): their data equal independent recomputations with attention's functions,
their pages stay small, bad arguments are refused, and the live (ipywidgets) versions
redraw when a control moves."""

from __future__ import annotations

import json

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from attention import core, flash, hard, memory  # noqa: E402
from attention import deformable as dfm  # noqa: E402
from attention.explorers import estimators, maps, online_softmax, roofline, sampling  # noqa: E402
from tests.attention.widget_tools import controls as _controls  # noqa: E402
from tests.attention.widget_tools import output as _output  # noqa: E402
from tests.attention.widget_tools import png as _png  # noqa: E402


def _size(explorer) -> int:
    return len(explorer.to_json().encode())


def _tasks(seed=0, e=3, h=2, m=4, n=5):
    rng = np.random.default_rng(seed)
    w = core.softmax(rng.normal(size=(e, h, m, n)) * 2)
    labels = [[f"t{i}" for i in range(n)]] * e
    return {
        "toy": maps.map_task(
            w,
            [[f"q{i}" for i in range(m)]] * e,
            labels,
            [["a"] * m] * e,
            [["b"] * m] * e,
        ),
        "one head": maps.map_task(
            w[:, 0], [[f"q{i}" for i in range(m)]] * e, labels, [["c"] * m] * e
        ),
    }


# ---------------------------------------------------------------------------------
# Chapter 1
# ---------------------------------------------------------------------------------


def test_map_task_checks_and_grid_equals_the_maps():
    tasks = _tasks()
    g = maps.maps_grid(tasks)
    assert [t["name"] for t in g["tasks"]] == ["toy", "one head"]
    np.testing.assert_allclose(g["tasks"][0]["w"], tasks["toy"]["maps"], atol=5e-4)
    assert g["tasks"][1]["H"] == 1 and "targets" not in g["tasks"][1]
    with pytest.raises(ValueError, match="maps"):
        maps.map_task(np.ones((2, 3, 3)), None, None, [["a"] * 3] * 2)  # rows sum 3
    with pytest.raises(ValueError, match="outputs"):
        maps.map_task(np.full((2, 3, 3), 1 / 3), None, None, [["a"] * 2] * 2)
    with pytest.raises(TypeError, match="tasks"):
        maps.maps_grid({})


def test_mask_grid_equals_core_masks_and_softmax():
    g = maps.mask_grid()
    s = maps.mask_scores()
    rng = np.random.default_rng(1)
    for _ in range(40):
        kind = maps.MASK_KINDS[rng.integers(4)]
        n_q, n_k, length = (int(v) for v in rng.integers(1, 9, 3))
        keep = np.ones((n_q, n_k), bool)
        if "causal" in kind:  # bottom right: j <= i + n_k - n_q
            keep &= np.arange(n_k)[None] <= np.arange(n_q)[:, None] + n_k - n_q
        if "padding" in kind:
            keep &= np.arange(n_k)[None] < min(length, n_k)
        key = maps._mask_key(kind, n_q, n_k, length)
        bits, p = g["masks"][key]
        assert bits == ["".join("1" if b else "0" for b in r) for r in keep]
        e = np.where(keep, np.exp(s[:n_q, :n_k] - s[:n_q, :n_k].max()), 0.0)
        tot = e.sum(-1, keepdims=True)
        want = np.where(tot > 0, e / np.where(tot > 0, tot, 1), 0.0)
        np.testing.assert_allclose(np.array(p) / 1000, want, atol=5e-4 + 1e-12)
    # every setting the controls reach is there, and nothing else
    reach = {
        maps._mask_key(k, a, b, c)
        for k in maps.MASK_KINDS
        for a in range(1, 9)
        for b in range(1, 9)
        for c in range(1, 9)
    }
    assert set(g["masks"]) == reach


def test_map_explorers_are_small_and_refuse_bad_arguments():
    assert _size(maps.static_attention_map_explorer(_tasks())) < 20_000
    assert _size(maps.static_mask_explorer()) < 150_000
    with pytest.raises(ValueError, match="n_q"):
        maps.static_mask_explorer(n_q=9)
    with pytest.raises(ValueError, match="kind"):
        maps.mask_of("diagonal", 2, 2, 1)


def test_live_map_explorers_redraw():
    box = maps.live_attention_map_explorer(_tasks(), row=0)
    out, first = _output(box), _png(_output(box))
    ctl = _controls(box)
    ctl["query row"].value = 3
    assert _png(out) != first
    ctl["task"].value = "one head"
    assert ctl["head"].max == 0 and ctl["query row"].value == 3
    box = maps.live_mask_explorer()
    out, first = _output(box), _png(_output(box))
    _controls(box)["keys N_k"].value = 2
    assert _png(out) != first


# ---------------------------------------------------------------------------------
# Chapter 2
# ---------------------------------------------------------------------------------


@pytest.mark.parametrize("block", online_softmax.BLOCKS + [7])
def test_online_steps_match_a_direct_fp64_computation_and_flash(block):
    s, v = online_softmax.default_row()
    steps = online_softmax.online_steps(s, v, block)
    assert len(steps) == -(-len(s) // block)
    for st in steps:  # the state after keys [0, b) is that of the prefix, computed anew
        b = st["b"]
        m = s[:b].max()
        e = np.exp(s[:b] - m)
        assert st["m"] == m
        np.testing.assert_allclose(st["l"], e.sum(), rtol=1e-13)
        np.testing.assert_allclose(st["acc"], e @ v[:b], rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(st["w"][:b], e / e.sum(), rtol=1e-12)
        assert not st["w"][b:].any()
        prev = s[: st["a"]].max() if st["a"] else -np.inf
        np.testing.assert_allclose(st["alpha"], np.exp(prev - m), rtol=1e-14)
    last = steps[-1]
    o = flash.softmax_1pass_attention(s[None], v, block)[0]
    np.testing.assert_allclose(last["acc"] / last["l"], o, rtol=1e-12)
    np.testing.assert_allclose(last["w"], flash.softmax_2pass(s, block), rtol=1e-12)


def test_online_grid_and_roofline_points():
    g = online_softmax.online_grid()
    assert g["blocks"] == online_softmax.BLOCKS and len(g["runs"]) == len(
        online_softmax.BLOCKS
    )
    s, v = online_softmax.default_row()
    np.testing.assert_allclose(g["p"], core.softmax(s), rtol=1e-5)
    np.testing.assert_allclose(g["o"], core.softmax(s) @ v, rtol=1e-5, atol=1e-6)
    p = roofline.roofline_point("A100", 1024, 64, "float16", "standard")
    flops = 4 * 1024 * 1024 * 64
    by = memory.simulate("standard", 1024, 64, keep_trace=False).bytes(2)
    assert p["flops"] == flops and p["sim"]["bytes"] == by
    assert p["sim"]["ai"] == flops / by
    spec = memory.GPUS["A100"]
    assert p["sim"]["flops_s"] == min(
        spec.peak_tflops * 1e12, flops / by * spec.hbm_tbps * 1e12
    )
    comp = memory.compulsory("flash2", 4096, 128).bytes(4)
    q = roofline.roofline_point("H100", 4096, 128, "float32", "flash2")
    assert q["comp"]["bytes"] == comp
    assert q["comp"]["flops_s"] <= 494.7e12  # H100 TF32 dense peak
    grid = roofline.roofline_grid()
    i = [
        roofline.ROOF_GPUS.index("H100"),
        roofline.ROOF_N.index(4096),
        roofline.ROOF_D.index(128),
        roofline.ROOF_DTYPES.index("float32"),
        roofline.ROOF_ALGS.index("flash2"),
    ]
    row = grid["rows"][i[0]][i[1]][i[2]][i[3]][i[4]]
    np.testing.assert_allclose(
        row[3:5], [q["comp"]["ai"], q["comp"]["flops_s"] / 1e12], rtol=1e-4
    )


def test_chapter2_explorers_are_small_and_refuse_bad_arguments():
    assert _size(online_softmax.static_online_softmax_explorer()) < 40_000
    assert _size(roofline.static_roofline_explorer()) < 120_000
    with pytest.raises(ValueError, match="block"):
        online_softmax.static_online_softmax_explorer(block=7)
    with pytest.raises(ValueError, match="gpu"):
        roofline.static_roofline_explorer(gpu="T4")
    with pytest.raises(ValueError, match="block"):
        online_softmax.online_steps([1.0, 2.0], [[1.0], [2.0]], 0)


def test_live_chapter2_explorers_redraw():
    box = online_softmax.live_online_softmax_explorer(block=4)
    out, first = _output(box), _png(_output(box))
    ctl = _controls(box)
    ctl["block step"].value = 3
    assert _png(out) != first
    ctl["block size"].value = 12
    assert ctl["block step"].max == 1
    box = roofline.live_roofline_explorer()
    out, first = _output(box), _png(_output(box))
    _controls(box)["algorithm"].value = "standard"
    assert _png(out) != first


# ---------------------------------------------------------------------------------
# Chapter 3
# ---------------------------------------------------------------------------------


def test_estimates_are_seeded_and_reinforce_is_unbiased():
    s, f = np.array(estimators.LOGITS), np.array(estimators.LOSSES)
    true = hard.expected_loss_grad(s, f)
    a = estimators.estimates(s, f, "REINFORCE", 1.0, 4)
    np.testing.assert_array_equal(a, estimators.estimates(s, f, "REINFORCE", 1.0, 4))
    for method in ("REINFORCE", "REINFORCE + baseline"):
        st = estimators.summary(estimators.estimates(s, f, method, 1.0, 4), true)
        assert (np.abs(st["bias"]) < 5 * st["se"]).all(), (method, st)
    # the baseline cuts the spread; Gumbel-ST at small tau is biased, its spread shrinks
    # with tau
    sd = {
        m: estimators.summary(estimators.estimates(s, f, m, 1.0, 1), true)["std"]
        for m in estimators.METHODS
    }
    assert (sd["REINFORCE + baseline"] < sd["REINFORCE"]).all()
    lo = estimators.summary(
        estimators.estimates(s, f, "Gumbel-softmax ST", 0.1, 64), true
    )
    hi = estimators.summary(
        estimators.estimates(s, f, "Gumbel-softmax ST", 5.0, 64), true
    )
    assert (hi["std"] < lo["std"]).all()
    assert np.abs(hi["bias"]).max() > 10 * hi["se"].max()


def test_reinforce_mean_is_the_mean_of_reinforce_grad_on_the_same_draws():
    """The explorer's REINFORCE estimates come from how often each position was drawn;
    on draws made by ``hard.reinforce_grad`` itself (its samples returned), the counts
    give the mean of its estimates, with and without a baseline, to round-off."""
    s, f = np.array(estimators.LOGITS), np.array(estimators.LOSSES)
    p = core.softmax(s)
    rows = np.broadcast_to(s, (300, len(s)))  # 300 estimates
    for b in (None, float(p @ f)):
        g, z = hard.reinforce_grad(
            rows, f, np.random.default_rng(3), n_samples=16, baseline=b,
            return_samples=True,
        )  # fmt: skip
        counts = np.stack([(z == j).sum(0) for j in range(len(s))], -1)  # (300, N)
        got = estimators.reinforce_mean(counts, p, f, 0.0 if b is None else b)
        np.testing.assert_allclose(got, g.mean(0), rtol=1e-12, atol=1e-12)


def test_estimator_grid_equals_the_draws():
    g = estimators.estimator_grid()
    assert len(g["runs"]) == (2 + len(estimators.TAUS)) * len(estimators.SAMPLES)
    s, f = np.array(estimators.LOGITS), np.array(estimators.LOSSES)
    true = hard.expected_loss_grad(s, f)
    np.testing.assert_allclose(g["true"], true, rtol=1e-5)
    for key, method, tau, n in (
        ("2,3,1", "Gumbel-softmax ST", 1.0, 4),
        ("1,0,3", "REINFORCE + baseline", 0.1, 64),
    ):
        d = estimators.estimates(s, f, method, tau, n)
        for j, row in enumerate(g["runs"][key]):
            counts, edges = np.histogram(d[:, j], bins=estimators.BINS)
            assert row["hist"]["counts"] == counts.tolist()
            np.testing.assert_allclose(
                [row["hist"]["lo"], row["hist"]["hi"]], edges[[0, -1]], rtol=1e-5
            )
            np.testing.assert_allclose(
                row["mean"], d[:, j].mean(), rtol=1e-5, atol=1e-9
            )
            np.testing.assert_allclose(row["std"], d[:, j].std(), rtol=1e-5)
    assert _size(estimators.static_estimator_explorer()) < 60_000
    with pytest.raises(ValueError, match="tau"):
        estimators.static_estimator_explorer(tau=3.0)
    with pytest.raises(ValueError, match="component"):
        estimators.static_estimator_explorer(component=4)


def test_live_estimator_explorer_redraws():
    box = estimators.live_estimator_explorer()
    out, first = _output(box), _png(_output(box))
    ctl = _controls(box)
    ctl["temperature τ"].value = 0.1
    assert _png(out) != first
    ctl["estimator"].value = "REINFORCE"
    assert ctl["temperature τ"].disabled


# ---------------------------------------------------------------------------------
# Chapter 4
# ---------------------------------------------------------------------------------


def _dat_setup(side=16, c=4, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(1, side, side, c))
    img = rng.uniform(size=(side, side, 3))
    params = dfm.init_dat_params(c, 1, kernel_size=5, rng=rng)
    params["offset"] = dfm.init_offset_params(c, 5, rng, scale=2.0)
    shapes = np.array([(side, side), (side // 2, side // 2)])
    msda = dict(
        params=dfm.init_msda_params(c, 2, 2, 3, rng),
        spatial_shapes=shapes,
        n_heads=2,
        n_points=3,
    )
    return img, x, {"a": params}, msda


def test_sampling_grid_equals_dat_and_msda():
    img, x, dat, msda = _dat_setup()
    g = sampling.sampling_grid(img, x, dat, 2, 1, 4, 0.5, msda)
    pos = sampling.query_positions(16, 16)
    assert len(pos) == sampling.QUERY_GRID**2
    assert [tuple(q) for q in g["queries"]] == pos
    for si, sc in enumerate(sampling.SCALES):
        res = dfm.dat_attention(x, dat["a"], 2, 1, 4, 0.5 * sc, return_all=True)
        px = (res["points"][0] + 1) * 16 / 2  # (G, N_s, 2): align_corners=False
        np.testing.assert_allclose(g["dat"]["a"][si]["points"], px, atol=5e-3)
        idx = [r * 16 + c for r, c in pos]
        np.testing.assert_allclose(
            np.array(g["dat"]["a"][si]["weights"]) * 1e-4,
            res["weights"][0][:, idx],
            atol=5e-5,
        )
        if sc == 0:  # no offset: the reference grid
            np.testing.assert_allclose(px[0], g["reference"], atol=5e-3)
        z = np.stack([x[0, r, c] for r, c in pos])[None]
        ref = np.array([[(c + 0.5) / 16, (r + 0.5) / 16] for r, c in pos])[None]
        p = dict(
            msda["params"],
            w_off=msda["params"]["w_off"] * sc,
            b_off=msda["params"]["b_off"] * sc,
        )
        loc, w = dfm.msda_sampling(z, ref, p, msda["spatial_shapes"], 2, 3)
        np.testing.assert_allclose(g["msda"][si]["locations"], loc[0] * 16, atol=5e-3)
        np.testing.assert_allclose(
            np.array(g["msda"][si]["weights"]) * 1e-4, w[0], atol=5e-5
        )
    assert g["photo"].startswith("data:image/png;base64,")
    assert len(g["levels"]) == 2
    with pytest.raises(ValueError, match="image"):
        sampling.sampling_grid(img[:8], x, dat, 2, 1, 4, 0.5)
    with pytest.raises(TypeError, match="dat_params"):
        sampling.sampling_grid(img, x, {"a": {}}, 2, 1, 4, 0.5)


def test_live_sampling_explorer_redraws():
    img, x, dat, msda = _dat_setup()
    box = sampling.live_sampling_points_explorer(img, x, dat, 2, 1, 4, 0.5, msda)
    out, first = _output(box), _png(_output(box))
    ctl = _controls(box)
    ctl["query"].value = 5
    second = _png(out)
    assert second != first
    ctl["MSDA level"].value = 1
    assert _png(out) != second


def test_explorer_json_is_valid():
    e = online_softmax.static_online_softmax_explorer()
    assert json.loads(e.to_json())["kind"] == "online"


def test_online_block_change_that_clamps_the_step_redraws_once(monkeypatch):
    """Moving to a larger block shortens the step slider; the clamped step is drawn
    once, at the new block (the slider's own change does not draw a second picture)."""
    from tests.attention.widget_tools import controls, output, png

    drawn = []
    real = online_softmax.live_png

    def counted(make, *args):
        drawn.append(args)
        return real(make, *args)

    monkeypatch.setattr(online_softmax, "live_png", counted)
    box = online_softmax.live_online_softmax_explorer(block=1, step=20)
    c = controls(box)
    drawn.clear()
    c["block size"].value = 24
    assert drawn == [(24, 0)] and c["block step"].value == 0
    assert png(output(box))


def test_a_task_change_that_clamps_the_sliders_redraws_once(monkeypatch):
    """Chapter 1's map explorer: a task whose maps are smaller clamps the example,
    head and row sliders; the move draws one picture, at the clamped settings."""
    from tests.attention.widget_tools import controls

    drawn = []
    real = maps.live_png

    def counted(make, *args):
        drawn.append(args[1:])
        return real(make, *args)

    monkeypatch.setattr(maps, "live_png", counted)
    rng = np.random.default_rng(0)
    tasks = {}
    for name, (e, h, m) in (("big", (8, 4, 12)), ("small", (3, 2, 5))):
        w = rng.random((e, h, m, m))
        w /= w.sum(-1, keepdims=True)
        tokens = rng.integers(0, 10, (e, m)).tolist()
        tasks[name] = maps.map_task(w, tokens, tokens, tokens, tokens)
    box = maps.live_attention_map_explorer(tasks)
    c = controls(box)
    sliders = [c[k] for k in ("example", "head", "query row")]
    for w in sliders:
        w.value = w.max
    drawn.clear()
    c["task"].value = "small"
    assert [w.value for w in sliders] == [2, 1, 4]  # clamped to the new maps
    assert drawn == [("small", 2, 1, 4)]


def test_fixed_panels_hold_every_block_size_of_the_online_softmax():
    """``ONLINE_PANELS`` replaces a ``tight_layout`` per move: at every block size, at
    its first and last step, nothing drawn leaves the canvas or runs into the next
    panel."""

    from attention.plots import live
    from tests.attention.widget_tools import assert_fixed_panels_hold

    with live.reusing({}):
        for block in online_softmax.BLOCKS:
            for step in {0, -(-online_softmax.N_ROW // block) - 1}:
                fig = online_softmax.online_figure(block, step)
                assert_fixed_panels_hold(fig, (block, step))


def test_fixed_panels_hold_the_corners_of_the_estimator_settings():
    """``ESTIMATOR_PANELS``: every method at the temperature and sample-count ends, for
    the first and last component, on the canvas and apart."""

    from tests.attention.widget_tools import assert_fixed_panels_hold

    s, f = estimators.LOGITS, estimators.LOSSES
    from attention.plots import live

    with live.reusing({}):
        for method in estimators.METHODS:
            for tau in (estimators.TAUS[0], estimators.TAUS[-1]):
                for n in (estimators.SAMPLES[0], estimators.SAMPLES[-1]):
                    for j in (0, len(s) - 1):
                        fig = estimators.estimator_figure(s, f, method, tau, n, j)
                        assert_fixed_panels_hold(fig, (method, tau, n, j))
