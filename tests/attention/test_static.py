"""attention.explorers: the data behind the static twins equals what attention
computes, and each explorer is one call (the twin on the site, ipywidgets otherwise)."""

import inspect
import json
import random

import numpy as np
import pytest

from attention import explorers, hard, memory
from attention.core import softmax
from attention.explorers import (
    common,
    deformable_traffic,
    landing,
    naive_traffic,
    site,
    temperature,
    tile_size,
    topk_traffic,
)
from tests.attention.widget_tools import walk

rnd = random.Random(0)


def _flat(t, names):
    return [x for n in names for x in t.per_tensor.get(n, (0, 0))]


@pytest.fixture(scope="module")
def tile_grid():
    return tile_size.tile_grid()


def test_tile_grid_is_closed_form(tile_grid):
    g = tile_grid
    assert g["N"] == [256 * 2**k for k in range(9)] and g["d"] == [32, 64, 128, 256]
    assert g["B"] == [16, 32, 64, 128, 256]
    assert set(g["counts"]) == set(tile_size.FORWARD + tile_size.BACKWARD)
    for _ in range(60):
        alg = rnd.choice(tile_size.FORWARD + tile_size.BACKWARD)
        iN, id_, ibr, ibc = (rnd.randrange(len(g[k])) for k in ("N", "d", "B", "B"))
        k = ((iN * len(g["d"]) + id_) * len(g["B"]) + ibr) * len(g["B"]) + ibc
        t = memory.closed_form(
            alg, g["N"][iN], g["d"][id_], Br=g["B"][ibr], Bc=g["B"][ibc]
        )
        row = g["counts"][alg][k]
        assert row[:-1] == _flat(t, g["tensors"][alg])
        assert sum(row[:-1]) == t.total and row[-1] == t.sram_peak
        # The tiles fit in M exactly when the closed form with M accepts them.
        for M in (row[-1] - 1, row[-1]):
            fits = True
            try:
                memory.closed_form(
                    alg, g["N"][iN], g["d"][id_], Br=g["B"][ibr], Bc=g["B"][ibc], M=M
                )
            except ValueError:
                fits = False
            assert fits == (row[-1] <= M)


def test_compulsory_grid_is_memory_compulsory():
    g = tile_size.compulsory_grid()
    assert g["N"] == tile_size.TILE_N and g["d"] == tile_size.TILE_D
    assert set(g["counts"]) == set(tile_size.FORWARD + tile_size.BACKWARD)
    for alg in tile_size.FORWARD + tile_size.BACKWARD:
        for iN, N in enumerate(g["N"]):
            for id_, d in enumerate(g["d"]):
                t = memory.compulsory(alg, N, d)
                row = g["counts"][alg][iN * len(g["d"]) + id_]
                assert row == [t.total] + _flat(t, g["tensors"][alg])
    # The explorer carries it, and draws it with the bars of both groups.
    e = tile_size.static_tile_size_explorer()
    assert e.config["compulsory"] == g
    for key in ("bars_fwd", "bars_bwd"):
        layers = e.config["specs"][key]["layer"]
        assert [lyr["data"]["name"] for lyr in layers] == ["bars", "compulsory"]
        color = layers[1]["encoding"]["color"]
        assert color["scale"]["domain"] == [common.COMPULSORY_LABEL]


def test_sram_table():
    tab = tile_size.sram_table()
    for si, (_, kib) in enumerate(tile_size.SRAM_KIB):
        for ti, (_, bpe) in enumerate(common.dtypes()):
            M = tab["M"][si][ti]
            assert M == kib * 1024 // bpe
            for di, d in enumerate(tile_size.TILE_D):
                br, bc, need = tab["rule"][f"{si},{ti},{di},0"]
                assert (br, bc) == memory.fa1_block_sizes(M, d)
                assert need == memory.sram_need(
                    "flash1", tile_size.TILE_N[0], d, br, bc
                )


@pytest.mark.parametrize("alg", tile_size.FORWARD + tile_size.BACKWARD)
def test_schedule_steps_follow_the_simulator(alg):
    br, bc = rnd.choice(tile_size.TILE_B), rnd.choice(tile_size.TILE_B)
    t = memory.simulate(alg, 256, 64, Br=br, Bc=bc, keep_trace=True)
    steps = tile_size.schedule_steps(alg, 256, 64, br, bc)
    assert len(steps) == t.steps
    for s, (i, j, _what, loads, stores) in enumerate(steps):
        ev = [e for e in t.trace if e.step == s]
        comp = [e for e in ev if e.op == "compute"]
        if comp:
            assert (i, j) == (comp[0].block + (-1, -1))[:2]
        for op, text in (("load", loads), ("store", stores)):
            names = {e.tensor for e in ev if e.op == op}
            assert {w.split("[")[0] for w in text.split()} == (names or {"-"})
    # The schedule's shape does not depend on d (the step view is drawn at one d).
    assert tile_size.schedule_steps(alg, 256, 32, br, bc) == steps


def test_naive_grid_is_closed_form():
    g = naive_traffic.naive_grid()
    for _ in range(40):
        mi = rnd.randrange(-1, len(g["m"]))
        di, ni = rnd.randrange(len(g["d"])), rnd.randrange(len(g["n"]))
        n = g["n"][ni]
        m = n if mi < 0 else g["m"][mi]
        t = memory.closed_form("standard", m, g["d"][di], Br=64, Bc=64, N_k=n)
        assert g["counts"][mi + 1][di][ni] == _flat(t, g["tensors"])
        assert sum(g["counts"][mi + 1][di][ni]) == t.total


def test_topk_grid_is_closed_form():
    g = topk_traffic.topk_grid()
    for _ in range(30):
        name = rnd.choice(["soft", "hard"] + [f"topk:{k}" for k in g["k"]])
        di, ni = rnd.randrange(len(g["d"])), rnd.randrange(len(g["N"]))
        kw = {"k": int(name.split(":")[1])} if ":" in name else {}
        t = memory.closed_form(name.split(":")[0], g["N"][ni], g["d"][di], **kw)
        assert g["counts"][name][di][ni] == _flat(t, g["tensors"])


def test_deformable_grid_is_closed_form():
    g = deformable_traffic.deformable_grid()
    for _ in range(30):
        di, si = rnd.randrange(len(g["d"])), rnd.randrange(len(g["side"]))
        ri, pi, li = (rnd.randrange(len(g[k])) for k in ("r", "P", "L"))
        side, d = g["side"][si], g["d"][di]
        c = g["counts"]
        cases = [
            (
                c["dense-image"][di][si],
                "dense-image",
                dict(height=side, width=side, d=d),
            ),
            (
                c["dat"][di][si][ri],
                "dat",
                dict(height=side, width=side, d=d, r=g["r"][ri]),
            ),
            (
                c["dat-unfused"][di][si][ri],
                "dat-unfused",
                dict(height=side, width=side, d=d, r=g["r"][ri]),
            ),
            (
                c["msda"][di][si][li][pi],
                "msda",
                dict(
                    n_queries=side * side, d=d, n_levels=g["L"][li], n_points=g["P"][pi]
                ),
            ),
        ]
        for row, alg, kw in cases:
            assert row == _flat(memory.closed_form(alg, **kw), g["tensors"]), (alg, kw)


def test_temperature_grid_is_gumbel_softmax():
    rng = np.random.default_rng(1)
    s = rng.standard_normal((8, 12))
    g = hard.gumbel(s.shape, rng)
    grid = temperature.temperature_grid(s, g)
    for i in (0, 17, 40, 70):
        want = hard.gumbel_softmax(s, 10.0 ** grid["tau_exp"][i], noise=g)
        np.testing.assert_allclose(grid["y"][i], want, atol=1e-5)
    np.testing.assert_allclose(grid["p"], softmax(s, axis=-1), atol=1e-5)
    assert grid["sample"] == np.argmax(s + g, -1).tolist()


def test_explorer_html_embeds_parseable_json():
    e = landing.static_teaser()
    html = e._repr_html_()
    assert 'class="static-explorer"' in html and "static-explorer-fallback" in html
    marker = 'class="static-explorer-data">'
    start = html.index(marker) + len(marker)
    payload = json.loads(html[start : html.index("</script>", start)])
    assert payload["kind"] == "teaser"
    assert set(payload["grid"]["counts"]) == {"standard", "flash2"}
    assert "</script" not in html[start : html.index("</script>", start)]


EXPLORERS = [
    "naive_traffic_explorer",
    "tile_size_explorer",
    "teaser",
    "temperature_explorer",
    "topk_traffic_explorer",
    "deformable_traffic_explorer",
    "mask_explorer",
    "online_softmax_explorer",
    "roofline_explorer",
    "estimator_explorer",
    "decode_explorer",
    "context_parallel_explorer",
    "sparse_explorer",
]
#: Explorers whose call needs the chapter's inputs (no call without arguments).
WITH_INPUTS = ["attention_map_explorer", "sampling_points_explorer"]


@pytest.mark.parametrize("name", EXPLORERS + WITH_INPUTS)
def test_each_explorer_is_one_module_one_call_one_signature(name):
    """Each public call lives in its explorer's module beside ``static_<call>`` and
    ``live_<call>``, all three with the same explicit signature (no **settings)."""
    import sys

    def params(f):
        return [
            (p.name, p.kind, p.default)
            for p in inspect.signature(f).parameters.values()
        ]

    one = getattr(explorers, name)
    module = sys.modules[one.__module__]
    static, live = getattr(module, f"static_{name}"), getattr(module, f"live_{name}")
    assert params(one) == params(static) == params(live)
    assert all(k is not inspect.Parameter.VAR_KEYWORD for _, k, _ in params(one))
    assert name in explorers.__all__
    if name in WITH_INPUTS:
        return
    # The twin's fallback text names the one call, which exists.
    e = static()
    assert e.live.startswith(f"explorers.{name}(")


def test_one_call_gives_the_twin_on_the_site_and_widgets_elsewhere(monkeypatch):
    import ipywidgets

    monkeypatch.setattr(site, "ON_SITE", True)
    e = explorers.topk_traffic_explorer(N=1024, d=32, k=4)
    assert isinstance(e, site.Explorer)
    assert (
        e.to_json()
        == topk_traffic.static_topk_traffic_explorer(N=1024, d=32, k=4).to_json()
    )
    assert json.loads(e.to_json())["init"] == {
        "N": topk_traffic.TOPK_N.index(1024),
        "d": topk_traffic.TOPK_D.index(32),
        "k": topk_traffic.TOPK_K.index(4),
    }
    monkeypatch.setattr(site, "ON_SITE", False)
    box = explorers.topk_traffic_explorer(N=1024, d=32, k=4)
    assert isinstance(box, ipywidgets.VBox)
    values = {
        w.description: w.value
        for w in walk(box)
        if hasattr(w, "value") and getattr(w, "description", "")
    }
    assert values == {"top-k k": 4, "length N": 1024, "head dim d": 32}


def test_temperature_defaults_are_the_same_in_both_media():
    s, g = temperature.temperature_inputs(seed=3)
    assert s.shape == (8, 12) and g.shape == (8, 12)
    grid = json.loads(temperature.static_temperature_explorer(seed=3).to_json())["grid"]
    np.testing.assert_array_equal(grid["scores"], s)
    np.testing.assert_array_equal(grid["noise"], g)
    # Given inputs are used as they are.
    s2, g2 = temperature.temperature_inputs(scores=s[:2], noise=g[:2])
    assert s2.shape == (2, 12) and (s2 == s[:2]).all() and (g2 == g[:2]).all()


def test_tqdm_is_silent_on_the_site(monkeypatch):
    import importlib

    monkeypatch.setenv(site.SITE_ENV, "1")
    mod = importlib.reload(site)
    try:
        assert mod.ON_SITE and mod.tqdm(range(3)).disable
    finally:
        monkeypatch.delenv(site.SITE_ENV)
        importlib.reload(site)
    assert not site.ON_SITE
