"""One settings check per explorer, on both faces (issue 33): every setting outside its
declaration (``attention.explorers.settings``) is a ValueError naming it, on the live
and on the static face, before anything is drawn; a setting inside is drawn as given
(the live control holds exactly that value, nothing clamped; the static twin starts on
that grid point)."""

from __future__ import annotations

import re

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from attention import core  # noqa: E402
from attention import deformable as dfm  # noqa: E402
from attention.explorers import (  # noqa: E402
    blockmask,
    common,
    decode,
    deformable_traffic,
    estimators,
    landing,
    maps,
    naive_traffic,
    online_softmax,
    pretrained,
    ring,
    roofline,
    sampling,
    settings,
    sparse,
    temperature,
    tile_size,
    topk_traffic,
)
from tests.attention.widget_tools import controls, walk  # noqa: E402


def _tasks():
    rng = np.random.default_rng(0)
    w = core.softmax(rng.normal(size=(3, 2, 4, 5)) * 2)
    q, k = [[f"q{i}" for i in range(4)]] * 3, [[f"t{i}" for i in range(5)]] * 3
    return {"toy": maps.map_task(w, q, k, [["a"] * 4] * 3)}


def _pictures():
    rng = np.random.default_rng(0)
    x, img = rng.normal(size=(1, 16, 16, 4)), rng.uniform(size=(16, 16, 3))
    params = dfm.init_dat_params(4, 1, kernel_size=5, rng=rng)
    params["offset"] = dfm.init_offset_params(4, 5, rng, scale=2.0)
    return (img, x, {"a": params}, 2, 1, 4, 0.5)


# name: (module, call, inputs, declaration, settings inside (not the defaults),
#        where the static twin's init holds each of them: {setting: (init key, grid)})
CASES = {
    "naive": (
        naive_traffic,
        "naive_traffic_explorer",
        (),
        naive_traffic.SETTINGS,
        dict(n=2048, m=256, d=32, dtype="bfloat16"),
        {"n": ("n", naive_traffic.NAIVE_N), "d": ("d", naive_traffic.NAIVE_D)},
    ),
    "tile": (
        tile_size,
        "tile_size_explorer",
        (),
        tile_size.SETTINGS,
        dict(N=512, d=32, sram_kib=100, Br=32, Bc=128, algorithm="flash1"),
        {"N": ("N", tile_size.TILE_N), "Bc": ("Bc", tile_size.TILE_B)},
    ),
    "temperature": (
        temperature,
        "temperature_explorer",
        (),
        temperature.settings(8),
        dict(tau=10**-0.5, row=7),
        {"row": ("row", range(8))},
    ),
    "topk": (
        topk_traffic,
        "topk_traffic_explorer",
        (),
        topk_traffic.SETTINGS,
        dict(N=1024, d=32, k=64),
        {"k": ("k", topk_traffic.TOPK_K), "N": ("N", topk_traffic.TOPK_N)},
    ),
    "deformable": (
        deformable_traffic,
        "deformable_traffic_explorer",
        (),
        deformable_traffic.SETTINGS,
        dict(side=32, d=64, r=7, n_points=16, n_levels=1),
        {"r": ("r", deformable_traffic.DEFORM_R)},
    ),
    "maps": (
        maps,
        "attention_map_explorer",
        (_tasks(),),
        maps.map_settings(_tasks(), None),
        dict(example=2, head=1, row=3),
        {"row": ("row", range(4)), "head": ("head", range(2))},
    ),
    "masks": (
        maps,
        "mask_explorer",
        (),
        maps.MASK_SETTINGS,
        dict(n_q=8, n_k=1, kind="padding", length=2),
        {"n_q": ("n_q", maps.MASK_SIZES)},
    ),
    "online": (
        online_softmax,
        "online_softmax_explorer",
        (),
        online_softmax.settings(5),
        dict(block=5, step=4),
        {"step": ("step", range(5))},
    ),
    "roofline": (
        roofline,
        "roofline_explorer",
        (),
        roofline.SETTINGS,
        dict(gpu="A100", N=65536, d=64, dtype="float32", algorithm="standard_bwd"),
        {"N": ("N", roofline.ROOF_N)},
    ),
    "estimators": (
        estimators,
        "estimator_explorer",
        (),
        estimators.settings(4),
        dict(method="REINFORCE", tau=5.0, n_samples=64, component=3),
        {"component": ("j", range(4))},
    ),
    "sampling": (
        sampling,
        "sampling_points_explorer",
        _pictures(),
        sampling.settings(["a"], 2),
        dict(query=63, scale=2.0, label="a", head=1),
        {"query": ("query", range(64)), "head": ("head", range(2))},
    ),
    "decode": (
        decode,
        "decode_explorer",
        (),
        decode.SETTINGS,
        dict(B=64, N=131072, H_q=64, H_kv=64, n_splits=32, gpu="T4"),
        {"N": ("N", decode.CONTEXT)},
    ),
    "ring": (
        ring,
        "context_parallel_explorer",
        (),
        ring.SETTINGS,
        dict(N=1048576, P=32, heads=0, causal=False, layout="contiguous"),
        {"P": ("P", ring.RING_P)},
    ),
    "sparse": (
        sparse,
        "sparse_explorer",
        (),
        sparse.settings(2048),
        dict(method="oracle", N=2048, block_size=128, topk=32, query=255),
        {"N": ("N", sparse.CONTEXT), "query": ("query", sparse.query_rows(2048))},
    ),
    "blockmask": (
        blockmask,
        "block_mask_explorer",
        (),
        blockmask.SETTINGS,
        dict(
            kind="document",
            N=2048,
            block_size=64,
            window=512,
            doc_len=4096,
            prefix=256,
            preset="prefix LM (prefix 1,024)",
        ),
        {"N": ("N", blockmask.CONTEXT), "block_size": ("B", blockmask.BLOCKS)},
    ),
    "pretrained": (
        pretrained,
        "pretrained_explorer",
        (),
        pretrained.settings("list"),
        dict(sentence="list", layer=6, head=12, row=5),
        {"row": ("row", range(99)), "layer": ("layer", range(1, 7))},
    ),
}


def _outside(rule) -> list:
    """Values just outside a declaration: past each end, off the step, wrong type."""
    if isinstance(rule, settings.Choice):
        numeric = [o for o in rule.options if isinstance(o, (int, float))]
        out = (
            ["nope", True] if not all(isinstance(o, bool) for o in rule.options) else []
        )
        if numeric and not all(isinstance(o, bool) for o in rule.options):
            out += [max(numeric) + 1, min(numeric) - 1]
        if all(isinstance(o, bool) for o in rule.options):
            out += [1, "yes"]
        return out
    step = rule.step or 1
    if rule.log:
        return [10.0 ** (rule.hi + step), 10.0 ** (rule.lo - step), -1.0, "1"]
    out = [rule.hi + step, rule.lo - step, "1", True, float("nan")]
    if step > 1:
        out.append(rule.lo + step / 2)
    return out


def _faces(module, call):
    return {
        "live": getattr(module, f"live_{call}"),
        "static": getattr(module, f"static_{call}"),
    }


@pytest.fixture(autouse=True)
def _no_png(monkeypatch):
    """The live faces draw their real figures; only the PNG encoding is skipped."""
    import matplotlib.pyplot as plt

    def quick(fig, **_):
        plt.close(fig)
        return ""

    monkeypatch.setattr(common, "figure_png", quick)
    tile_size.tile_png.cache_clear()
    common.cached_png.cache_clear()
    yield
    tile_size.tile_png.cache_clear()
    common.cached_png.cache_clear()


@pytest.mark.parametrize("case", list(CASES))
def test_every_setting_outside_is_refused_by_name_on_both_faces(case):
    module, call, inputs, rules, inside, _ = CASES[case]
    faces = _faces(module, call)
    for name, rule in rules.items():
        for bad in _outside(rule):
            for face, f in faces.items():
                with pytest.raises(ValueError, match=rf"^{re.escape(name)} must be"):
                    f(*inputs, **{**inside, name: bad})
                    pytest.fail(f"{face} {call}({name}={bad!r}) drew")


def test_the_message_names_the_value_and_what_is_allowed():
    with pytest.raises(ValueError) as err:
        settings.check(tile_size.SETTINGS, Br=20)
    assert str(err.value) == "Br must be an int in [16, 512] in steps of 16, got 20"
    with pytest.raises(ValueError, match=r"layout must be one of \['contiguous', "):
        ring.live_context_parallel_explorer(layout="striped")
    with pytest.raises(
        ValueError, match=r"tau must be a number in \[10\^-2, 10\^1.5\]"
    ):
        temperature.static_temperature_explorer(tau=0.7)


@pytest.mark.parametrize("case", list(CASES))
def test_settings_inside_are_shown_as_given_on_both_faces(case):
    module, call, inputs, rules, inside, init_of = CASES[case]
    settings.check(rules, **inside)
    faces = _faces(module, call)
    # Live: each control holds exactly the value asked for (ipywidgets would clamp).
    box = faces["live"](*inputs, **inside)
    held = {}
    for w in walk(box):
        if not hasattr(w, "value"):
            continue
        held.setdefault(getattr(w, "description", ""), []).append(w.value)
    values = [v for vs in held.values() for v in vs]
    for name, value in inside.items():
        if name in ("m",):  # a slider shared with the self-attention tick box
            continue
        assert any(v == value for v in values), (call, name, value, held)
    # Static: the twin starts on the grid point of each value.
    e = faces["static"](*inputs, **inside)
    init = e.config["init"]
    for name, (key, grid) in init_of.items():
        assert list(grid)[init[key]] == inside[name], (call, name)


def test_the_landing_page_shares_the_tile_explorers_declaration():
    for f in (landing.live_teaser, landing.static_teaser):
        with pytest.raises(ValueError, match="^d must be one of"):
            f(d=48)
        with pytest.raises(ValueError, match="^dtype must be one of"):
            f(dtype="int8")


def test_a_setting_shown_once_redraws_from_the_cache(monkeypatch):
    """The tile explorer's figure (its one simulation, of the drawn schedule) is
    computed once per setting: moving a slider back does not redraw."""
    calls = []
    real = tile_size.tile_figure

    def counted(*a):
        calls.append(a)
        return real(*a)

    monkeypatch.setattr(tile_size, "tile_figure", counted)
    box = tile_size.live_tile_size_explorer(N=4096, Br=64, Bc=64)
    bc = controls(box)["Bc"]
    bc.value = 128
    bc.value = 64
    bc.value = 128
    assert len(calls) == 2


def test_controls_the_figure_does_not_read_redraw_from_the_cache(monkeypatch):
    """The ring explorer's figure depends on N, P, layout and causal only: moving the
    GPU or the link updates the readout without drawing the figure again."""
    calls = []
    real = ring.work_figure

    def counted(**kw):
        calls.append(kw)
        return real(**kw)

    monkeypatch.setattr(ring, "work_figure", counted)
    box = ring.live_context_parallel_explorer(N=16384, P=2)
    ctl = controls(box)
    ctl["GPU"].value = "A100"
    ctl["link"].value = "PCIe 5 x16"
    assert len(calls) == 1


@pytest.mark.parametrize("case", list(CASES))
def test_each_live_control_is_built_from_its_declaration(case):
    # One declaration per control (issue 44): its label names the live widget.
    module, call, inputs, rules, inside, _ = CASES[case]
    assert all(rule.label for rule in rules.values()), rules
    shown = controls(_faces(module, call)["live"](*inputs, **inside))
    for name, rule in rules.items():
        assert rule.label in shown, (call, name, rule.label, list(shown))


def test_control_builds_the_widget_its_declaration_names():
    import ipywidgets as w

    log = settings.Range(-2, 1.5, 0.05, False, True, "τ", readout_format=".3g")
    kinds = [
        (settings.Range(16, 512, 16, label="Br"), 64, w.IntSlider),
        (settings.Range(0.0, 1.0, 0.25, integer=False, label="x"), 0.5, w.FloatSlider),
        (log, 1.0, w.FloatLogSlider),
        (settings.Choice([32, 64], label="d"), 64, w.Dropdown),
        (settings.Choice([1, 2], label="P", widget="slider"), 2, w.SelectionSlider),
        (
            settings.Choice([False, True], label="causal", widget="checkbox"),
            True,
            w.Checkbox,
        ),
    ]
    for rule, value, kind in kinds:
        c = settings.control(rule, value)
        assert type(c) is kind and c.value == value and c.description == rule.label
    assert settings.control(log, 1.0).readout_format == ".3g"
    ints = settings.control(settings.Range(0, 8, label="n"), 3)
    assert (ints.min, ints.max, ints.step) == (0, 8, 1)
    named = settings.Choice([256, 1024], label="N", names=["256", "1,024"])
    assert settings.control(named, 1024).label == "1,024"
    assert settings.control(named, 1024, names=["a", "b"]).label == "b"
    both = settings.controls(
        {"d": settings.Choice([32, 64], label="d"), "n": settings.Range(0, 8)},
        {"n": 2, "d": 32},
        continuous_update=False,
    )
    assert list(both) == ["n", "d"] and not both["n"].continuous_update
    with pytest.raises(ValueError, match="widget must be one of"):
        settings.Choice([1], widget="radio")
