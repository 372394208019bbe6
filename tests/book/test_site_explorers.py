"""The static site's explorers respond in the browser, offline, with the numbers
Python computes.

Run after `make book`. Each built page is opened as a file in headless Chromium
(Playwright drives the system's Chromium; no request may leave file://), once per test
worker and width, and reset to its state on load for each test (``site_tools``). Every
control of every explorer is set to its first, last and an inside value through the
page's own DOM events (chapter 2's explorer also at 24 random settings), and the data
Vega drew (``view.data``) is compared with ``attention`` in Python. Screenshots of each
explorer before and after a change, at 1400 px and 390 px, go to
``_build/screenshots/explorers/`` for a person to look at.
"""

import functools
import random
import re

import pytest

from attention import deformable, hard, memory, plots  # noqa: F401  (registers)
from attention.explorers import (
    common,
    deformable_traffic,
    naive_traffic,
    site,
    temperature,
    tile_size,
    topk_traffic,
)
from tests.book.site_tools import HTML, SHOTS, Page

pytestmark = pytest.mark.site

CHAPTER_PAGES = sorted((HTML / "chapters").glob("*.html"))
MAX_PAGE_BYTES = 3 * 2**20
DTYPES = list(plots.DTYPE_BYTES.items())

# page, explorer kind
EXPLORERS = [
    ("intro.html", "teaser"),
    ("chapters/01_self_cross_attention.html", "naive"),
    ("chapters/02_flash_attention.html", "tile"),
    ("chapters/03_soft_hard_attention.html", "temperature"),
    ("chapters/03_soft_hard_attention.html", "topk"),
    ("chapters/04_deformable_attention.html", "deformable"),
]


def _bars(rows) -> dict:
    return {(r["group"], r["tensor"], r["kind"]): r["bytes"] for r in rows}


def _expected_bars(results: dict, bpe: int) -> dict:
    """{(group, tensor, kind): bytes} from attention Traffic results, as
    Traffic.bytes does."""
    out = {}
    for group, t in results.items():
        for tensor, (r, w) in t.per_tensor.items():
            if r:
                out[(group, tensor, "read")] = r * bpe
            if w:
                out[(group, tensor, "written")] = w * bpe
        assert sum(v for (g, _, _), v in out.items() if g == group) == t.bytes(bpe)
    return out


# ---------------------------------------------------------------------------------
# What Python says, per explorer, for the state the page reports.
# ---------------------------------------------------------------------------------


@functools.cache
def _traced(alg, n, d, br, bc):
    """The simulator's trace (the same settings recur across a test: simulated once)."""
    return memory.simulate(alg, n, d, Br=br, Bc=bc, keep_trace=True)


def check_tile(pg: Page, eid: str) -> None:
    s, cfg = pg.state(eid), tile_size
    N, d = cfg.TILE_N[s["N"]], cfg.TILE_D[s["d"]]
    br, bc = cfg.TILE_B[s["Br"]], cfg.TILE_B[s["Bc"]]
    dtype, bpe = DTYPES[s["dtype"]]
    alg = (cfg.FORWARD + cfg.BACKWARD)[s["algorithm"]]
    group = cfg.FORWARD if alg in cfg.FORWARD else cfg.BACKWARD
    res = {a: memory.closed_form(a, N, d, Br=br, Bc=bc) for a in group}
    assert _bars(pg.data(eid, "bars", "bars")) == _expected_bars(res, bpe)
    # The compulsory traffic drawn beside each bar: memory.compulsory, each tensor once.
    floor = {
        r["group"]: (r["what"], r["bytes"]) for r in pg.data(eid, "bars", "compulsory")
    }
    assert floor == {
        a: (common.COMPULSORY_LABEL, memory.compulsory(a, N, d).bytes(bpe))
        for a in group
    }
    # Fit or not, as the simulator with this SRAM says.
    M = cfg.SRAM_KIB[s["sram"]][1] * 1024 // bpe
    text = pg.readout(eid)
    for a in group:
        once = memory.compulsory(a, N, d).total
        pattern = rf"{a}: [^;]*;[^;]*; compulsory [^(]* \({once:,} elements\)"
        assert re.search(pattern, text), (a, once, text)
    assert f"M = {M:,} elements" in text
    for a in group:
        try:
            memory.closed_form(a, N, d, Br=br, Bc=bc, M=M)
            fits = True
        except ValueError:
            fits = False
        line = re.search(
            rf"{a}: [^;]*; tiles need ([\d,]+) elements of SRAM: "
            r"(fit|do NOT fit)",
            text,
        )
        assert line, (a, text)
        assert int(line.group(1).replace(",", "")) == memory.sram_need(a, N, d, br, bc)
        assert (line.group(2) == "fit") == fits
    rbr, rbc = memory.fa1_block_sizes(M, d)
    assert f"Bc = ⌈M/4d⌉ = {rbc}, Br = min(⌈M/4d⌉, d) = {rbr}" in text
    # The schedule at N = 256, up to the chosen step, from the simulator's trace.
    t = _traced(alg, cfg.TRACE_N, d, br, bc)
    tr, tc = memory.cdiv(cfg.TRACE_N, br), memory.cdiv(cfg.TRACE_N, bc)
    step = min(s["step"], t.steps - 1)
    want = {(i, j): ("pending", False) for i in range(tr) for j in range(tc)}
    for k in range(step + 1):
        ev = [e for e in t.trace if e.step == k]
        comp = [e for e in ev if e.op == "compute"]
        if not comp:
            continue
        quad = [
            e.tensor
            for e in ev
            if e.tensor in plots.QUADRATIC_TENSORS and e.op != "compute"
        ]
        block = comp[0].block
        cols = [block[1]] if len(block) > 1 else range(tc)
        for j in cols:
            want[(block[0], j)] = (quad[-1] if quad else "SRAM", k == step)
    got = {
        (r["i"], r["j"]): (r["fill"], r["current"])
        for r in pg.data(eid, "tiles", "tiles")
    }
    assert got == want
    assert f"step {step + 1} of {t.steps}" in text


def check_teaser(pg: Page, eid: str) -> None:
    s = pg.state(eid)
    N, br, bc = (
        tile_size.TILE_N[s["N"]],
        tile_size.TILE_B[s["Br"]],
        tile_size.TILE_B[s["Bc"]],
    )
    res = {
        "standard attention": memory.closed_form("standard", N, 64, Br=br, Bc=bc),
        "FlashAttention-2": memory.closed_form("flash2", N, 64, Br=br, Bc=bc),
    }
    assert _bars(pg.data(eid, "bars", "bars")) == _expected_bars(res, 2)
    # the compulsory ticks (what HBM sees when L2 holds the re-reads), as chapter 2's
    # tile-size explorer draws them, and the readout names both totals
    once = {
        "standard attention": memory.compulsory("standard", N, 64).bytes(2),
        "FlashAttention-2": memory.compulsory("flash2", N, 64).bytes(2),
    }
    floor = {
        r["group"]: (r["what"], r["bytes"]) for r in pg.data(eid, "bars", "compulsory")
    }
    assert floor == {a: (common.COMPULSORY_LABEL, b) for a, b in once.items()}
    text = pg.readout(eid)
    assert all(plots.human_bytes(b) in text for b in once.values()), text


def check_naive(pg: Page, eid: str) -> None:
    s = pg.state(eid)
    n, d = naive_traffic.NAIVE_N[s["n"]], naive_traffic.NAIVE_D[s["d"]]
    m = n if s["self"] else naive_traffic.NAIVE_M[s["m"]]
    _, bpe = DTYPES[s["dtype"]]
    t = memory.closed_form("standard", m, d, Br=64, Bc=64, N_k=n)
    want = {(k, k, kind): v for (_, k, kind), v in _expected_bars({"": t}, bpe).items()}
    assert _bars(pg.data(eid, "bars", "bars")) == want
    lines = {(r["x"], r["series"]): r["bytes"] for r in pg.data(eid, "lines", "lines")}
    for nn in naive_traffic.NAIVE_N:
        tt = memory.closed_form(
            "standard", nn if s["self"] else m, d, Br=64, Bc=64, N_k=nn
        )
        assert lines[(nn, "total")] == tt.bytes(bpe)
        for k, (r, w) in tt.per_tensor.items():
            assert lines[(nn, k)] == (r + w) * bpe
    assert pg.data(eid, "lines", "marker") == [{"x": n}]


def check_temperature(pg: Page, eid: str) -> None:
    import numpy as np

    s = pg.state(eid)
    cfg = pg.page.evaluate("eid => window.staticExplorers[eid].cfg.grid", eid)
    tau = 10.0 ** temperature.TAU_EXP[s["tau"]]
    y = hard.gumbel_softmax(np.array(cfg["scores"]), tau, noise=np.array(cfg["noise"]))
    got = np.zeros_like(y)
    for r in pg.data(eid, "map", "map"):
        got[r["query"], r["key"]] = r["y"]
    np.testing.assert_allclose(got, y, atol=1e-5)
    row = pg.data(eid, "row", "row")
    np.testing.assert_allclose([r["y"] for r in row], y[s["row"]], atol=1e-5)
    noisy = np.array(cfg["scores"]) + np.array(cfg["noise"])
    sample = int(np.argmax(noisy, -1)[s["row"]])
    assert pg.data(eid, "row", "sample") == [{"key": sample}]


def check_topk(pg: Page, eid: str) -> None:
    s = pg.state(eid)
    N, d, k = (
        topk_traffic.TOPK_N[s["N"]],
        topk_traffic.TOPK_D[s["d"]],
        topk_traffic.TOPK_K[s["k"]],
    )
    res = {
        "soft": memory.closed_form("soft", N, d),
        "hard (argmax)": memory.closed_form("hard", N, d),
        f"top-k (k = {k})": memory.closed_form("topk", N, d, k=k),
    }
    assert _bars(pg.data(eid, "bars", "bars")) == _expected_bars(res, 2)
    lines = {(r["x"], r["series"]): r["bytes"] for r in pg.data(eid, "lines", "lines")}
    for nn in topk_traffic.TOPK_N:
        assert lines[(nn, "top-k")] == memory.closed_form("topk", nn, d, k=k).bytes(2)
        assert lines[(nn, "soft")] == memory.closed_form("soft", nn, d).bytes(2)


def check_deformable(pg: Page, eid: str) -> None:
    s = pg.state(eid)
    side, d = (
        deformable_traffic.DEFORM_SIDE[s["side"]],
        deformable_traffic.DEFORM_D[s["d"]],
    )
    r, P, L = (
        deformable_traffic.DEFORM_R[s["r"]],
        deformable_traffic.DEFORM_P[s["P"]],
        deformable_traffic.DEFORM_L[s["L"]],
    )

    def kw(alg, side):
        if alg == "msda":
            return dict(n_queries=side * side, d=d, n_levels=L, n_points=P)
        return dict(
            height=side, width=side, d=d, **({"r": r} if alg.startswith("dat") else {})
        )

    res = {
        name: memory.closed_form(alg, **kw(alg, side))
        for name, alg in deformable_traffic.DEFORM_ALGS.items()
    }
    assert _bars(pg.data(eid, "bars", "bars")) == _expected_bars(res, 2)
    lines = {
        (r_["x"], r_["series"]): r_["bytes"] for r_ in pg.data(eid, "lines", "lines")
    }
    for name, alg in deformable_traffic.DEFORM_ALGS.items():
        for sd in deformable_traffic.DEFORM_SIDE:
            assert lines[(sd, name)] == memory.closed_form(alg, **kw(alg, sd)).bytes(2)


CHECKS = {
    "tile": check_tile,
    "teaser": check_teaser,
    "naive": check_naive,
    "temperature": check_temperature,
    "topk": check_topk,
    "deformable": check_deformable,
}


# ---------------------------------------------------------------------------------
# The tests.
# ---------------------------------------------------------------------------------


@pytest.mark.parametrize("page_name,kind", EXPLORERS, ids=[k for _, k in EXPLORERS])
def test_explorer_matches_python(open_page, page_name, kind):
    pg = open_page(page_name)
    eid = pg.explorer_id(kind)
    check = CHECKS[kind]
    check(pg, eid)  # the initial drawing
    times = []
    for name in pg.controls(eid):
        n = pg.n_options(eid, name)
        values = (
            [False, True, False] if n == 2 and name == "self" else [0, n - 1, n // 2]
        )
        for v in values:
            away = values[1] if v == values[0] else values[0]
            times.append(pg.timed_set(eid, name, v, away, limit_ms=100))
            check(pg, eid)
    assert max(times) < 100, f"slowest redraw {max(times):.0f} ms"
    assert not pg.errors, pg.errors
    assert not pg.outside, f"requests left the page: {pg.outside}"
    root = pg.page.locator(f"#{eid}")
    assert root.locator(".static-explorer-fallback").count() == 0
    assert root.locator(".se-error").count() == 0


# Everything a page's explorers show: each one's state and readout, the rows of every
# dataset its charts drew (Vega's own: the spec's named data, not the derived ones), and
# the theme.
_SHOWN = """() => ({
  theme: ["theme", "mode"].map(key => document.documentElement.dataset[key]),
  explorers: Object.values(window.staticExplorers).map(h => ({
    id: h.id, state: h.state(),
    readout: document.getElementById(h.id).querySelector(".se-readout").textContent,
    charts: Object.entries(h.views).map(([chart, view]) => [chart,
      Object.keys(view.getState({data: () => true, signals: () => false}).data)
        .filter(n => n !== "root" && !/^data_\\d+$|^_:|marks$|pathgroup$/.test(n))
        .sort().map(n => [n, view.data(n)])]),
  })),
})"""


def test_a_reset_page_shows_what_a_fresh_load_shows(browser, open_page):
    """The pages the site tests share (site_tools): one whose explorers and theme a
    test moved shows, once reset, exactly what the same page freshly loaded shows."""
    name = "chapters/03_soft_hard_attention.html"  # three explorers on one page
    pg = open_page(name)
    as_loaded = pg.page.evaluate(_SHOWN)
    rnd = random.Random(5)
    for eid in pg.snapshot["states"]:
        for control in pg.controls(eid):
            pg.set(eid, control, rnd.randrange(pg.n_options(eid, control)))
    pg.page.evaluate("() => { document.documentElement.dataset.theme = 'dark'; }")
    pg.page.locator("select, input").first.focus()
    moved = pg.page.evaluate(_SHOWN)
    assert moved != as_loaded
    assert pg.reset()
    fresh = Page(browser, name)
    try:
        shown = pg.page.evaluate(_SHOWN)
        assert shown == fresh.page.evaluate(_SHOWN) == as_loaded
        assert pg.page.evaluate("document.activeElement === document.body")
    finally:
        fresh.close()
    assert pg is open_page(name)  # the next test gets the same page, reset


def test_tile_explorer_random_settings(open_page):
    rnd = random.Random(11)
    pg = open_page("chapters/02_flash_attention.html")
    eid = pg.explorer_id("tile")
    for _ in range(12):
        for name in ("N", "d", "Br", "Bc", "sram", "dtype", "algorithm"):
            pg.set(eid, name, rnd.randrange(pg.n_options(eid, name)))
        pg.set(eid, "step", rnd.randrange(pg.n_options(eid, "step")))
        check_tile(pg, eid)
    assert not pg.outside and not pg.errors


def test_controls_are_labelled_and_reachable_by_tab(open_page):
    pg = open_page("chapters/02_flash_attention.html", width=390)
    eid = pg.explorer_id("tile")
    info = pg.control_boxes(eid)
    assert len(info) == 8
    for i in info:
        assert i["label"] and i["tab"] >= 0, i
        # on screen, wide enough to use
        assert 0 < i["right"] <= 390 and i["w"] >= 40, i
    # Tab walks through the controls in order.
    pg.page.locator(f"#{eid} [data-name=N]").focus()
    seen = []
    for _ in range(len(info) - 1):
        pg.page.keyboard.press("Tab")
        seen.append(pg.page.evaluate("document.activeElement.dataset.name"))
    assert seen == [i["name"] for i in info[1:]]
    # Arrow keys move a focused slider.
    before = pg.state(eid)["N"]
    pg.page.locator(f"#{eid} [data-name=N]").focus()
    pg.page.keyboard.press("ArrowRight")
    pg.page.evaluate("eid => window.staticExplorers[eid].ready", eid)
    assert pg.state(eid)["N"] == before + 1
    check_tile(pg, eid)


CHANGES = {
    "teaser": [("N", 8)],
    "naive": [("self", False), ("m", 2), ("n", 3)],
    "tile": [("Br", 0), ("Bc", 1), ("step", 40)],
    "temperature": [("tau", 10), ("row", 3)],
    "topk": [("k", 8)],
    "deformable": [("r", 1), ("P", 15)],
}


@pytest.mark.parametrize("width", [1400, 390])
@pytest.mark.parametrize("page_name,kind", EXPLORERS, ids=[k for _, k in EXPLORERS])
def test_screenshots(open_page, page_name, kind, width):
    """Screenshots of each explorer before and after a change, for a person to
    look at."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    # the whole explorer in view
    pg = open_page(page_name, width=width)
    eid = pg.explorer_id(kind)
    root = pg.page.locator(f"#{eid}")
    root.scroll_into_view_if_needed()
    before = SHOTS / f"{kind}-{width}-before.png"
    root.screenshot(path=str(before))
    for name, value in CHANGES[kind]:
        pg.set(eid, name, value)
    after = SHOTS / f"{kind}-{width}-after.png"
    root.screenshot(path=str(after))
    assert before.stat().st_size > 5_000 and after.stat().st_size > 5_000
    box = root.bounding_box()
    assert box["width"] <= width, (
        f"the explorer is wider ({box['width']}) than the page"
    )
    # every word a chart draws lies inside its drawing (a legend wider than the chart
    # is cut at the chart's edge: "compulsory (each tensor o" at 390 px, once)
    cut = root.evaluate(_CUT_TEXT)
    assert not cut, f"text cut at a chart's edge at {width} px: {cut}"
    assert not pg.outside


# The texts of an explorer's charts (Vega's SVG) that reach past their SVG's box by more
# than 3 px (a text's box is its font's em box, not its ink: a rotated axis title's
# reaches 2 px past the edge, its letters do not).
_CUT_TEXT = """(root) => [...root.querySelectorAll("svg")].flatMap((svg) => {
  const box = svg.getBoundingClientRect(), e = 3;
  return [...svg.querySelectorAll("text")]
    .filter((t) => t.textContent.trim())
    .map((t) => [t.textContent, t.getBoundingClientRect()])
    .filter(([, r]) => r.width > 0 && (r.left < box.left - e || r.right > box.right + e
      || r.top < box.top - e || r.bottom > box.bottom + e))
    .map(([text, r]) => `${text} (${Math.round(r.left - box.left)}..` +
      `${Math.round(r.right - box.left)} of ${Math.round(box.width)} px)`);
})"""


@pytest.mark.parametrize("page", CHAPTER_PAGES, ids=lambda p: p.name)
def test_chapter_page_has_no_widget_noise_and_is_small(page):
    text = page.read_text(encoding="utf-8")
    assert page.stat().st_size < MAX_PAGE_BYTES, (
        f"{page.name}: {page.stat().st_size} bytes"
    )
    assert "application/vnd.jupyter.widget-view+json" not in text
    assert "application/vnd.jupyter.widget-state+json" not in text
    assert not re.search(r"\d+%\|[█▏▎▍▌▋▊▉ ]*\| *\d+/\d+", text), (
        "a tqdm bar is on the page"
    )
    assert "static-explorer" in text, "no static explorer on the page"


def test_vega_is_vendored_not_fetched():
    bundle = HTML / "_static" / site.BUNDLE
    assert bundle.exists() and bundle.stat().st_size > 100_000
    for page in [HTML / "intro.html", *CHAPTER_PAGES]:
        text = page.read_text(encoding="utf-8")
        srcs = re.findall(r'<script[^>]+src="([^"]+)"', text)
        assert any(s.split("?")[0].endswith(site.BUNDLE) for s in srcs), page.name
        assert not [s for s in srcs if s.startswith(("http:", "https:", "//"))], (
            page.name,
            srcs,
        )
