"""The chapters' picture explorers on the built site (issue 22): offline in headless
Chromium, every control moves the drawing, the data Vega drew equal Python's at each
control's first, last and middle option and at random settings, Tab reaches every
control at 390 px, and screenshots at 1400 and 390 px, light and dark, go to
``_build/screenshots/explorers/`` for a person to look at.

Run after `make book`; same browser and shared pages as ``test_site_explorers``
(``site_tools``).
"""

from __future__ import annotations

import functools
import random
import re

import numpy as np
import pytest

from attention import core, deformable, pretrained
from attention.explorers import estimators, maps, online_softmax, roofline, sampling
from attention.explorers import pretrained as minilm_ex
from attention.explorers import sparse as sparse_ex
from tests.book.site_tools import HTML, SHOTS

pytestmark = pytest.mark.site

CH = "chapters/{}.html"
EXPLORERS = [
    (CH.format("01_self_cross_attention"), "maps"),
    (CH.format("01_self_cross_attention"), "masks"),
    (CH.format("01_self_cross_attention"), "pretrained"),
    (CH.format("02_flash_attention"), "online"),
    (CH.format("02_flash_attention"), "roofline"),
    (CH.format("03_soft_hard_attention"), "estimators"),
    (CH.format("04_deformable_attention"), "sampling"),
    (CH.format("08_sparse_attention"), "sparse"),
]


def _grid(pg, eid):
    """The explorer's grid (its static data: read once per page, it does not change)."""
    cache = pg.__dict__.setdefault("_grids", {})
    if eid not in cache:
        cache[eid] = pg.page.evaluate(
            "eid => window.staticExplorers[eid].cfg.grid", eid
        )
    return cache[eid]


@functools.cache
def _minilm_maps(text: str) -> np.ndarray:
    return pretrained.load_minilm().attentions(text)


def _by(rows, *keys):
    return {tuple(r[k] for k in keys): r for r in rows}


# ---------------------------------------------------------------------------------
# What Python says, per explorer, for the state the page reports.
# ---------------------------------------------------------------------------------


def check_maps(pg, eid):
    """The page's maps are the chapter's (trained there, tested in
    tests/attention): drawn cells, row and outline are the grid's at the state, each
    row a distribution, and the readout names the row's largest weight."""
    s, g = pg.state(eid), _grid(pg, eid)
    t = g["tasks"][s["task"]]
    w = np.array(t["w"][s["example"]][s["head"]])  # (m, n)
    cells = _by(pg.data(eid, "map", "cells"), "i", "j")
    assert len(cells) == w.size
    for (i, j), r in cells.items():
        assert r["w"] == w[i, j]
        assert r["key"] == f"{j}: {t['keys'][s['example']][j]}"
    row = [
        r["w"]
        for r in sorted(pg.data(eid, "map", "cells"), key=lambda r: r["j"])
        if r["i"] == s["row"]
    ]
    assert [r["w"] for r in pg.data(eid, "row", "row")] == row
    assert {r["i"] for r in pg.data(eid, "map", "outline")} == {s["row"]}
    np.testing.assert_allclose(w.sum(-1), 1, atol=5e-3)
    j = int(np.argmax(w[s["row"]]))
    assert f"on key {j} (" in pg.readout(eid)
    assert f"model outputs {t['outputs'][s['example']][s['row']]}" in pg.readout(eid)


def check_masks(pg, eid):
    s = pg.state(eid)
    kind, n_q, n_k = (
        maps.MASK_KINDS[s["kind"]],
        maps.MASK_SIZES[s["n_q"]],
        maps.MASK_SIZES[s["n_k"]],
    )
    pt = maps.mask_point(kind, n_q, n_k, maps.MASK_SIZES[s["length"]])
    cells = _by(pg.data(eid, "mask", "cells"), "i", "j")
    assert set(cells) == {(i, j) for i in range(n_q) for j in range(n_k)}
    for (i, j), r in cells.items():
        assert r["cell"] == ("may attend" if pt["keep"][i, j] else "masked")
        assert abs(r["p"] - pt["p"][i, j]) <= 5e-4 + 1e-12
    assert f"{int(pt['keep'].sum())} of {n_q * n_k} cells" in pg.readout(eid)


def check_pretrained(pg, eid):
    """MiniLM's maps on the page are attention.pretrained's (to the thousandths the
    page carries), the row and head outlined are the state's, and the readout is
    Python's sentence for that state."""
    s, g = pg.state(eid), _grid(pg, eid)
    sent = g["sentences"][s["sentence"]]
    n = len(sent["tokens"])
    assert pg.n_options(eid, "row") == n and 0 <= s["row"] < n
    w = _minilm_maps(sent["text"])[s["layer"], s["head"]]
    cells = _by(pg.data(eid, "map", "cells"), "i", "j")
    assert len(cells) == n * n
    for (i, j), r in cells.items():
        assert abs(r["w"] - w[i, j]) <= 5e-4 + 1e-7
    assert {r["i"] for r in pg.data(eid, "map", "outline")} == {s["row"]}
    assert len(pg.data(eid, "heads", "heads")) == 72
    (chosen,) = pg.data(eid, "heads", "chosen")
    assert (chosen["layer"], chosen["head"]) == (s["layer"] + 1, s["head"] + 1)
    text = minilm_ex.readout(
        list(minilm_ex.SENTENCES)[s["sentence"]],
        s["layer"] + 1,
        s["head"] + 1,
        s["row"],
    )
    assert pg.readout(eid) == re.sub(r"<[^>]+>", "", text)


def check_online(pg, eid):
    s = pg.state(eid)
    block = online_softmax.BLOCKS[s["block"]]
    x, v = online_softmax.default_row()
    steps = online_softmax.online_steps(x, v, block)
    assert pg.n_options(eid, "step") == len(steps)
    st = steps[s["step"]]
    keys = sorted(pg.data(eid, "scores", "keys"), key=lambda r: r["j"])
    np.testing.assert_allclose([r["s"] for r in keys], x, rtol=1e-5)
    np.testing.assert_allclose([r["w"] for r in keys], st["w"], rtol=1e-5, atol=1e-9)
    np.testing.assert_allclose([r["p"] for r in keys], core.softmax(x), rtol=1e-5)
    assert [r["status"] for r in keys] == [
        "seen" if j < st["a"] else "this block" if j < st["b"] else "not yet"
        for j in range(len(x))
    ]
    mx = {r["what"]: r["y"] for r in pg.data(eid, "scores", "max")}
    np.testing.assert_allclose(
        [mx["running max m"], mx["final max"]], [st["m"], x.max()], rtol=1e-5
    )
    state = _by(pg.data(eid, "state", "state"), "step", "what")
    for k, sk in enumerate(steps, 1):
        np.testing.assert_allclose(
            [
                state[(k, "m")]["value"],
                state[(k, "ℓ")]["value"],
                state[(k, "α")]["value"],
            ],
            [sk["m"], sk["l"], sk["alpha"]],
            rtol=1e-5,
        )
    assert pg.data(eid, "state", "now") == [{"step": s["step"] + 1}]
    assert f"ℓ = {st['l']:.3f}" in pg.readout(eid)


def check_roofline(pg, eid):
    s = pg.state(eid)
    args = (
        roofline.ROOF_GPUS[s["gpu"]],
        roofline.ROOF_N[s["N"]],
        roofline.ROOF_D[s["d"]],
        roofline.ROOF_DTYPES[s["dtype"]],
        roofline.ROOF_ALGS[s["alg"]],
    )
    p = roofline.roofline_point(*args)
    pts = _by(pg.data(eid, "roof", "points"), "traffic")
    for name, key in (("simulated (no L2)", "sim"), ("compulsory", "comp")):
        np.testing.assert_allclose(
            [pts[(name,)]["ai"], pts[(name,)]["tflops"]],
            [p[key]["ai"], p[key]["flops_s"] / 1e12],
            rtol=1e-4,
        )
    roof = [[r["ai"], r["tflops"]] for r in pg.data(eid, "roof", "roof")]
    np.testing.assert_allclose(roof, roofline.roof_line(args[0], args[3]), rtol=1e-4)


def check_estimators(pg, eid):
    s = pg.state(eid)
    m, tau = estimators.METHODS[s["method"]], estimators.TAUS[s["tau"]]
    n, j = estimators.SAMPLES[s["samples"]], s["j"]
    lo, f = np.array(estimators.LOGITS), np.array(estimators.LOSSES)
    gumbel = "Gumbel" in m
    d = estimators.estimates(lo, f, m, tau if gumbel else estimators.TAUS[0], n)
    counts, edges = np.histogram(d[:, j], bins=estimators.BINS)
    hist = sorted(pg.data(eid, "hist", "hist"), key=lambda r: r["x0"])
    assert [r["count"] for r in hist] == counts.tolist()
    np.testing.assert_allclose(
        [r["x0"] for r in hist], edges[:-1], rtol=1e-4, atol=1e-6
    )
    lines = {r["what"]: r["x"] for r in pg.data(eid, "hist", "lines")}
    true = core.softmax(lo) * (f - core.softmax(lo) @ f)  # d E_p[f] / d logits
    np.testing.assert_allclose(lines["true gradient"], true[j], rtol=1e-5)
    np.testing.assert_allclose(
        lines["mean of the estimates"], d[:, j].mean(), rtol=1e-5, atol=1e-9
    )
    bars = _by(pg.data(eid, "bars", "bars"), "method", "stat")
    for mm in estimators.METHODS:
        dd = estimators.estimates(
            lo, f, mm, tau if "Gumbel" in mm else estimators.TAUS[0], n
        )
        np.testing.assert_allclose(
            bars[(mm, "std")]["value"], dd[:, j].std(), rtol=1e-5
        )
        np.testing.assert_allclose(
            bars[(mm, "|bias|")]["value"],
            abs(dd[:, j].mean() - true[j]),
            rtol=1e-4,
            atol=1e-6,
        )


def check_sampling(pg, eid):
    """The chapter's layers are tested in tests/attention; here: the drawn points are
    the grid's at the state, the reference grid is DAT's, offsets x 0 put every
    deformed point on its reference point and every MSDA point on the query, and each
    query's weights are a distribution."""
    s, g = pg.state(eid), _grid(pg, eid)
    side = sampling.QUERY_GRID
    q = s["qrow"] * side + s["qcol"]
    r, c = g["queries"][q]
    assert pg.data(eid, "dat", "query") == [{"x": c + 0.5, "y": r + 0.5}]
    h_r = round(len(g["reference"]) ** 0.5)
    ref = sampling.to_image_units(deformable.reference_grid(h_r, h_r), g["H"], g["W"])
    np.testing.assert_allclose(g["reference"], ref, atol=5e-3)
    run = g["dat"][g["labels"][s["label"]]][s["scale"]]
    grp = s["head"] * g["n_groups"] // g["n_heads"]
    pts = [p for p in pg.data(eid, "dat", "points") if p["kind"].startswith("deformed")]
    np.testing.assert_allclose([[p["x"], p["y"]] for p in pts], run["points"][grp])
    w = np.array([p["w"] for p in pts])
    np.testing.assert_allclose(w, np.array(run["weights"][s["head"]][q]) * 1e-4)
    assert abs(w.sum() - 1) < 5e-3
    if g["scales"][s["scale"]] == 0:
        np.testing.assert_allclose(run["points"][grp], ref, atol=5e-3)
    if "msda" in g:
        mp = pg.data(eid, "msda", "points")
        n_l = len(g["level_shapes"])
        per = g["msda_heads"] * len(g["msda"][0]["locations"][q][0][0])
        assert len(mp) == per * (n_l if s["level"] == 0 else 1)
        if g["scales"][s["scale"]] == 0:  # no offset: every point on the query
            np.testing.assert_allclose(
                [[p["x"], p["y"]] for p in mp],
                [[c + 0.5, r + 0.5]] * len(mp),
                atol=5e-3,
            )
        ws = np.array(g["msda"][s["scale"]]["weights"][q]) * 1e-4  # (heads, L, P)
        np.testing.assert_allclose(ws.sum((1, 2)), 1, atol=5e-3)


def check_sparse(pg, eid):
    """The blocks drawn as chosen are attention.sparse's choice for the state (each
    rule's top k at decode time), each block's mass is Python's, the query row offered
    are query_rows(N), and the readout is Python's sentence for that state."""
    s, g = pg.state(eid), _grid(pg, eid)
    method = sparse_ex.METHODS[s["method"]]
    N, B = sparse_ex.CONTEXT[s["N"]], sparse_ex.BLOCKS[s["B"]]
    k = sparse_ex.TOPKS[s["topk"]]
    rows = sparse_ex.query_rows(N)
    assert g["queries"][str(N)] == rows and pg.n_options(eid, "query") == len(rows)
    query = rows[s["query"]]
    point = sparse_ex.row_point(method, N, B, query)
    blocks = sorted(pg.data(eid, "row", "blocks"), key=lambda r: r["x"])
    assert [round(r["mass"] * 1000) for r in blocks] == point["mass"]
    chosen = {b for b in point["order"][:k] if b >= 0}
    assert {r["x"] // B for r in blocks if r["chosen"] == "chosen"} == chosen
    assert len(pg.data(eid, "map", "chosen")) == len(chosen)
    assert pg.data(eid, "map", "query") == [{"y": query}]
    text = sparse_ex.readout(method, N, B, k, query)
    assert pg.readout(eid) == re.sub(r"<[^>]+>", "", text).replace("x the", "× the")


CHECKS = {
    "maps": check_maps,
    "masks": check_masks,
    "pretrained": check_pretrained,
    "online": check_online,
    "roofline": check_roofline,
    "estimators": check_estimators,
    "sampling": check_sampling,
    "sparse": check_sparse,
}


# ---------------------------------------------------------------------------------
# The tests.
# ---------------------------------------------------------------------------------


#: The datasets each explorer draws, (chart, data source).
DATASETS = {
    "maps": [("map", "cells"), ("map", "outline"), ("row", "row")],
    "masks": [("mask", "cells")],
    "pretrained": [
        ("map", "cells"),
        ("map", "outline"),
        ("heads", "heads"),
        ("heads", "chosen"),
    ],
    "online": [("scores", "keys"), ("scores", "max"), ("state", "now")],
    "roofline": [("roof", "roof"), ("roof", "points")],
    "estimators": [("hist", "hist"), ("hist", "lines"), ("bars", "bars")],
    "sampling": [
        ("dat", "points"),
        ("dat", "query"),
        ("msda", "points"),
        ("msda", "image"),
    ],
    "sparse": [("map", "chosen"), ("map", "query"), ("row", "blocks")],
}


def _drawn(pg, eid, kind):
    """Every dataset the explorer drew, to see that a control moved the drawing."""
    return [pg.data(eid, chart, name) for chart, name in DATASETS[kind]]


@pytest.mark.parametrize("page_name,kind", EXPLORERS, ids=[k for _, k in EXPLORERS])
def test_picture_explorer_matches_python(open_page, page_name, kind):
    pg = open_page(page_name)
    rnd = random.Random(22)
    eid = pg.explorer_id(kind)
    check = CHECKS[kind]
    check(pg, eid)
    times, moved = [], {}
    for name in pg.controls(eid):
        n = pg.n_options(eid, name)
        for v in (0, n - 1, n // 2):
            before = _drawn(pg, eid, kind)
            away = n - 1 if v == 0 else 0
            times.append(pg.timed_set(eid, name, v, away, limit_ms=150))
            check(pg, eid)
            moved[name] = moved.get(name, False) or _drawn(pg, eid, kind) != before
    for _ in range(8):  # random settings, every control at once
        for name in pg.controls(eid):
            pg.set(eid, name, rnd.randrange(pg.n_options(eid, name)))
        check(pg, eid)
    # every control moves the drawing (the head of a one-head model has nothing
    # to move to; a slider with one option neither)
    still = [k for k, v in moved.items() if not v and pg.n_options(eid, k) > 1]
    assert not still, f"controls that change nothing drawn: {still}"
    assert max(times) < 150, f"slowest redraw {max(times):.0f} ms"
    assert not pg.errors, pg.errors
    assert not pg.outside, f"requests left the page: {pg.outside}"
    root = pg.page.locator(f"#{eid}")
    assert root.locator(".se-error").count() == 0


@pytest.mark.parametrize("page_name,kind", EXPLORERS, ids=[k for _, k in EXPLORERS])
def test_tab_reaches_every_control_at_390px(open_page, page_name, kind):
    pg = open_page(page_name, width=390)
    eid = pg.explorer_id(kind)
    info = pg.control_boxes(eid)
    assert [i["name"] for i in info] == pg.controls(eid)
    for i in info:
        assert i["label"] and 0 < i["right"] <= 390 and i["w"] >= 40, i
    enabled = [i["name"] for i in info if not i["disabled"]]
    pg.page.locator(f"#{eid} [data-name={enabled[0]}]").focus()
    seen = []
    for _ in range(len(enabled) - 1):
        pg.page.keyboard.press("Tab")
        seen.append(pg.page.evaluate("document.activeElement.dataset.name"))
    assert seen == enabled[1:]
    box = pg.page.locator(f"#{eid}").bounding_box()
    assert box["width"] <= 390


CHANGES = {
    "maps": [("task", 1), ("row", 3)],
    "masks": [("n_q", 7), ("n_k", 3)],
    "pretrained": [("sentence", 2), ("head", 8)],
    "online": [("step", 3)],
    "roofline": [("alg", 0), ("N", 8)],
    "estimators": [("method", 0), ("samples", 2)],
    "sampling": [("scale", 3), ("level", 2)],
    "sparse": [("method", 1), ("topk", 5), ("query", 3)],
}


@pytest.mark.parametrize("width", [1400, 390])
@pytest.mark.parametrize("page_name,kind", EXPLORERS, ids=[k for _, k in EXPLORERS])
def test_picture_screenshots(open_page, page_name, kind, width):
    """Each explorer after a few changes, in the light and the dark theme (one page
    load: the theme switch changes the page in place, as a reader's click does)."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    pg = open_page(page_name, width=width)
    eid = pg.explorer_id(kind)
    root = pg.page.locator(f"#{eid}")
    for name, value in CHANGES[kind]:
        pg.set(eid, name, value)
    for theme in ("light", "dark"):
        # what the page's theme switch does: data-theme on <html>
        pg.page.evaluate(
            "t => { document.documentElement.dataset.theme = t; "
            "document.documentElement.dataset.mode = t; }",
            theme,
        )
        root.scroll_into_view_if_needed()
        shot = SHOTS / f"{kind}-{width}-{theme}.png"
        root.screenshot(path=str(shot))
        assert shot.stat().st_size > 5_000
        assert root.bounding_box()["width"] <= width
    assert not pg.outside and not pg.errors


def test_picture_explorer_data_is_small():
    """The data each page carries for these explorers (the page limit, 3 MB with
    everything else, is test_site_explorers' test)."""
    limits = {
        "maps": 60_000,
        "masks": 150_000,
        "pretrained": 250_000,
        "online": 40_000,
        "roofline": 120_000,
        "estimators": 60_000,
        "sampling": 700_000,
        "sparse": 200_000,
    }
    for page_name, kind in EXPLORERS:
        text = (HTML / page_name).read_text(encoding="utf-8")
        blobs = re.findall(
            rf'data-kind="{kind}".*?<script type="application/json" '
            r'class="static-explorer-data">(.*?)</script>',
            text,
            re.S,
        )
        assert len(blobs) == 1, (page_name, kind)
        assert len(blobs[0].encode()) < limits[kind], (kind, len(blobs[0]))
