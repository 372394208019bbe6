"""Chapter 7's explorer: the static grid equals mask_point and blocksparse (Python) at
every setting; its tile ranges redraw the evaluated block mask; the twin is small; the
live widget builds and responds; block_mask_explorer() picks the face by ON_SITE."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from attention import masks as M  # noqa: E402
from attention.explorers import blockmask as ex  # noqa: E402
from attention.memory import blocksparse as bs  # noqa: E402
from tests.attention.widget_tools import controls as _controls  # noqa: E402
from tests.attention.widget_tools import output as _output  # noqa: E402
from tests.attention.widget_tools import png as _png  # noqa: E402
from tests.attention.widget_tools import walk  # noqa: E402


@pytest.fixture(scope="module")
def grid():
    return ex.mask_grid()


def test_static_grid_equals_python(grid):
    for kind in ex.KINDS:
        for value in ex.VALUES[kind]:
            for B in ex.BLOCKS:
                line = grid["lines"][f"{kind},{value},{B}"]
                assert line == [
                    bs.closed_work(kind, n, ex.D, value or None, B, B).bytes(2)
                    for n in ex.LINE_N
                ]
                for N in ex.CONTEXT:
                    p = ex.mask_point(kind, N, B, value)
                    w = grid["work"][f"{kind},{value},{N},{B}"]
                    assert w == [
                        p["visited"],
                        p["full"],
                        p["partial"],
                        p["tiles"],
                        p["bytes"],
                        p["flops"],
                        p["mask_evals"],
                    ]


def _draw(flat, n_cols):
    """The page's drawing rule, in Python: each row block's ranges as tile kinds."""
    r = np.array(flat).reshape(-1, 4)
    kinds = np.zeros((len(r), n_cols), dtype=np.int8)
    for i, (jlo, flo, fhi, jhi) in enumerate(r):
        kinds[i, jlo : jhi + 1] = M.PARTIAL
        kinds[i, flo : fhi + 1] = M.FULL
    return kinds


def test_ranges_redraw_the_evaluated_block_mask(grid):
    for kind in ex.KINDS:
        for value in ex.VALUES[kind]:
            N, B = 2048, 64
            flat = grid["ranges"][f"{kind},{value},{N},{B}"]
            mask = bs.mask_for(kind, N, value or None)
            want = M.block_mask(mask, N, block_size=B).kinds
            np.testing.assert_array_equal(_draw(flat, N // B), want)


def test_presets_and_point():
    assert ex.resolve("causal", 128, 512, 256, "gpt-oss local layers (window 128)") == (
        "window",
        128,
    )
    assert ex.resolve("prefix", 128, 512, 256, None) == ("prefix", 256)
    p = ex.mask_point("window", 32768, 128, 4096)
    assert p["causal_visited"] == 256 * 257 // 2 and p["visited"] < p["causal_visited"]
    assert p["sparsity"] == pytest.approx(100 - p["visited_percent"])


def test_static_twin_is_small_and_named():
    e = ex.static_block_mask_explorer()
    assert e.kind == "blockmask" and len(e.to_json()) < 1_000_000
    assert "blockmask" in e._repr_html_()
    for kw, name in (
        (dict(N=1000), "^N"),
        (dict(window=100), "^window"),
        (dict(kind="diagonal"), "^kind"),
        (dict(preset="Llama 9"), "^preset"),
        (dict(block_size=32), "^block_size"),
    ):
        with pytest.raises(ValueError, match=name):
            ex.static_block_mask_explorer(**kw)


def test_widget_builds_and_responds():
    box = ex.live_block_mask_explorer(N=2048, block_size=128)
    out, c = _output(box), _controls(box)
    text = next(w for w in walk(box) if w.__class__.__name__ == "HTML")
    first, first_text = _png(out), text.value
    c["window"].value = 128
    assert _png(out) != first and text.value != first_text
    assert "window 128" in text.value
    c["model preset"].value = "packed documents of 2k"
    assert "document 2,048" in text.value
    c["model preset"].value = "custom"
    c["mask"].value = "causal"
    assert text.value.startswith("<p>causal")
    assert not plt.get_fignums()


def test_one_call_picks_the_face(monkeypatch):
    from attention import explorers
    from attention.explorers import site

    monkeypatch.setattr(site, "ON_SITE", True)
    assert ex.block_mask_explorer(N=1024).kind == "blockmask"
    assert explorers.block_mask_explorer(N=1024).kind == "blockmask"
    monkeypatch.setattr(site, "ON_SITE", False)
    assert ex.block_mask_explorer(N=1024).__class__.__name__ == "VBox"


_HARNESS = r"""
const fs = require("fs");
const src = fs.readFileSync(process.argv[2], "utf8")
  .replace("const KINDS = {};", "const KINDS = globalThis.__KINDS = {};");
globalThis.window = globalThis;
globalThis.document = { readyState: "loading", addEventListener() {},
                        querySelectorAll() { return []; } };
eval(src);
const cfg = JSON.parse(fs.readFileSync(0, "utf8"));
const K = globalThis.__KINDS.blockmask, specs = K.controls(cfg), controls = {};
for (const s of specs) controls[s.name] = { spec: s, input: { disabled: false } };
const state = Object.fromEntries(specs.map((s) => [s.name, s.value]));
const out = K.update(cfg, state, { controls });
console.log(JSON.stringify({ text: out.text, tiles: out.charts.tiles.data.tiles }));
"""


@pytest.mark.parametrize(
    "kw",
    [
        dict(kind="document", N=2048, block_size=64, doc_len=512),
        dict(kind="prefix", N=4096, block_size=128, prefix=256),
        dict(preset="gpt-oss local layers (window 128)", N=1024, block_size=64),
    ],
)
def test_page_script_draws_the_python_numbers(kw, tmp_path):
    """The page's script (run in node, the DOM stubbed) draws exactly the tiles of the
    evaluated block mask and prints the Python readout's numbers."""
    import json
    import pathlib
    import re
    import shutil
    import subprocess

    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    js = pathlib.Path(__file__).resolve().parents[2] / "_static" / "explorers.js"
    (tmp_path / "h.js").write_text(_HARNESS)
    cfg = ex.static_block_mask_explorer(**kw).to_json()
    run = subprocess.run(
        [node, str(tmp_path / "h.js"), str(js)],
        input=cfg,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    out = json.loads(run.stdout)
    kind, value = ex.resolve(
        kw.get("kind", "window"),
        kw.get("window", 1024),
        kw.get("doc_len", 2048),
        kw.get("prefix", 1024),
        kw.get("preset"),
    )
    N, B = kw["N"], kw["block_size"]
    want = M.block_mask(bs.mask_for(kind, N, value or None), N, block_size=B).kinds
    drawn = np.zeros_like(want)
    code = {"empty": M.EMPTY, "partial": M.PARTIAL, "full": M.FULL}
    for t in out["tiles"]:
        drawn[t["y"] : t["y2"], t["x"] : t["x2"]] = code[t["tile"]]
    np.testing.assert_array_equal(drawn, want)
    text = re.sub(r"<[^>]+>", "", out["text"]).replace("×", "x")
    py = ex.readout(ex.mask_point(kind, N, B, value), kind, value, N, B)
    assert text == py  # the same numbers, the same words
