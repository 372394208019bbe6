"""Chapter 1's MiniLM explorer: the twin's data are attention.pretrained's numbers, the
page script (run in Node) writes Python's readout from them, the settings are checked,
the live widget builds and responds, and the one call picks the face by ON_SITE."""

from __future__ import annotations

import json
import shutil
import subprocess

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from attention import pretrained  # noqa: E402
from attention.explorers import pretrained as ex  # noqa: E402
from attention.explorers import site  # noqa: E402
from tests.attention.widget_tools import controls as _controls  # noqa: E402
from tests.attention.widget_tools import output as _output  # noqa: E402
from tests.attention.widget_tools import png as _png  # noqa: E402
from tests.attention.widget_tools import walk  # noqa: E402
from tests.conftest import ROOT  # noqa: E402

NODE = shutil.which("node")


@pytest.fixture(scope="module")
def grid():
    return ex.pretrained_grid()


def test_grid_holds_the_models_maps_and_types(grid):
    model = pretrained.load_minilm()
    assert [s["name"] for s in grid["sentences"]] == list(ex.SENTENCES)
    for s in grid["sentences"]:
        maps = model.attentions(s["text"])
        assert s["tokens"] == model.tokens(s["text"])
        w = np.asarray(s["w"]) / ex.SCALE
        assert w.shape == maps.shape
        np.testing.assert_allclose(w, maps, atol=0.5 / ex.SCALE + 1e-7)
        st = pretrained.heads.sentence_stats(maps, s["tokens"])
        np.testing.assert_allclose(s["entropy"], st["entropy"], atol=0.005 + 1e-9)
    stats, types = ex.measured_types()
    assert grid["types"] == types.tolist()
    assert grid["n_measured"] == len(ex.SENTENCES) + len(ex.MORE_SENTENCES)
    # the twin stays small: the page carries it inline
    assert len(ex.static_pretrained_explorer().to_json()) < 400_000


def test_settings_are_checked():
    for kw, name in (
        ({"sentence": "poem"}, "sentence"),
        ({"layer": 0}, "layer"),
        ({"head": 13}, "head"),
        ({"row": 99}, "row"),
    ):
        with pytest.raises(ValueError, match=rf"^{name} must be (one of|an int in)"):
            ex.pretrained_explorer(**kw)


@pytest.mark.skipif(NODE is None, reason="Node.js is not installed")
def test_page_script_writes_pythons_readout(tmp_path):
    cfg = json.loads(ex.static_pretrained_explorer().to_json())
    settings = [("coreference", 1, 3, 9), ("agreement", 6, 12, 0), ("list", 2, 9, 4)]
    states = [
        {"sentence": list(ex.SENTENCES).index(s), "layer": la - 1, "head": h - 1,
         "row": r}
        for s, la, h, r in settings
    ]  # fmt: skip
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    (tmp_path / "states.json").write_text(json.dumps(states))
    script = tmp_path / "run.js"
    cfg_path = json.dumps(str(tmp_path / "cfg.json"))
    states_path = json.dumps(str(tmp_path / "states.json"))
    script.write_text(
        "const fs = require('fs');\n"
        "global.window = {};\n"
        "global.document = { readyState: 'complete', querySelectorAll: () => [] };\n"
        f"let src = fs.readFileSync({json.dumps(str(ROOT / '_static/explorers.js'))},"
        " 'utf8');\n"
        "src = src.replace('const KINDS = {};', 'const KINDS = window.KINDS = {};');\n"
        "eval(src);\n"
        f"const cfg = JSON.parse(fs.readFileSync({cfg_path}));\n"
        f"const states = JSON.parse(fs.readFileSync({states_path}));\n"
        "console.log(JSON.stringify(states.map((s) => {\n"
        "  const opts = { spec: { options: [] }, get: () => s.row,\n"
        "    setOptions(o) { this.spec.options = o; } };\n"
        "  const r = window.KINDS.pretrained.update(cfg, s,\n"
        "    { controls: { row: opts } });\n"
        "  return { text: r.text, cells: r.charts.map.data.cells.length,\n"
        "           heads: r.charts.heads.data.heads.length };\n"
        "})));\n"
    )  # fmt: skip
    res = subprocess.run(
        [NODE, str(script)], capture_output=True, text=True, timeout=60, check=True
    )
    model = pretrained.load_minilm()
    for (s, la, h, r), got in zip(settings, json.loads(res.stdout)):
        assert got["text"] == "<p>" + ex.readout(s, la, h, r) + "</p>"
        assert got["cells"] == len(model.tokens(ex.SENTENCES[s])) ** 2
        assert got["heads"] == 72


def test_live_widget_responds():
    import ipywidgets

    box = ex.live_pretrained_explorer()
    ctl = _controls(box)
    text = next(w for w in walk(box) if isinstance(w, ipywidgets.HTML))
    first = _png(_output(box))
    assert text.value == "<p>" + ex.readout("coreference", 1, 3, 0) + "</p>"
    ctl["head"].value = 5
    assert _png(_output(box)) != first
    assert "Head 1-5" in text.value
    ctl["sentence"].value = "list"
    n = len(pretrained.load_minilm().tokens(ex.SENTENCES["list"]))
    assert ctl["query row"].max == n - 1
    assert text.value == "<p>" + ex.readout("list", 1, 5, 0) + "</p>"


def test_one_call_picks_the_face(monkeypatch):
    monkeypatch.setattr(site, "ON_SITE", True)
    e = ex.pretrained_explorer(layer=2, head=9)
    assert isinstance(e, site.Explorer) and e.kind == "pretrained"
    assert 'data-kind="pretrained"' in e._repr_html_()
    monkeypatch.setattr(site, "ON_SITE", False)
    assert not isinstance(ex.pretrained_explorer(), site.Explorer)


def test_a_live_move_runs_no_forward_pass(monkeypatch):
    """Issue 33: the live face answers each move at once: one forward pass per
    sentence (``sentence_maps``, cached), all made as the face is built (each
    sentence's figure), none for a move."""
    ex.measured_types(), ex.pretrained_grid()  # the build-time numbers, cached
    ex.sentence_maps.cache_clear()
    calls = []
    real = pretrained.MiniLM.attentions

    def counted(self, text):
        calls.append(text)
        return real(self, text)

    monkeypatch.setattr(pretrained.MiniLM, "attentions", counted)
    box = ex.live_pretrained_explorer(sentence="list", layer=1, head=1, row=0)
    assert sorted(calls) == sorted(ex.SENTENCES.values())  # each sentence's figure
    c = _controls(box)
    for name, value in (("layer", 6), ("head", 12), ("query row", 3)):
        c[name].value = value
    c["sentence"].value = "agreement"
    assert len(calls) == len(ex.SENTENCES)


def _pixels(png: str) -> np.ndarray:
    import base64
    import io

    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(base64.b64decode(png))).convert("RGB"))


def test_picture_draws_what_a_new_figure_does(monkeypatch):
    """``PretrainedPicture`` blits a move's artists over the sentence's background:
    its pictures are, pixel for pixel, those of a new ``pretrained_figure`` given the
    same layout, across moves of every control and back; and a move draws no whole
    figure (the live face's answer is the blit)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from attention.explorers import common

    picture = ex.PretrainedPicture(["coreference"])
    draws = []
    real_draw = FigureCanvasAgg.draw

    def counted(self, *a, **k):
        draws.append(self.figure)
        return real_draw(self, *a, **k)

    monkeypatch.setattr(FigureCanvasAgg, "draw", counted)
    n_list = len(pretrained.load_minilm().tokens(ex.SENTENCES["list"]))
    moves = [("coreference", 1, 3, 0), ("coreference", 6, 12, 5),
             ("coreference", 1, 1, 13), ("list", 3, 7, n_list - 1),
             ("list", 6, 1, 0), ("coreference", 2, 4, 1)]  # fmt: skip
    for setting in moves:
        before = len(draws)
        got = _pixels(picture.png(*setting))
        kept = picture._figures[setting[0]]["fig"]
        if setting[0] == "coreference":
            assert len(draws) == before, f"{setting}: a whole figure drawn"
        monkeypatch.setattr(FigureCanvasAgg, "draw", real_draw)
        fresh = ex.pretrained_figure(*setting)
        pars = kept.subplotpars
        fresh.subplots_adjust(
            **{k: getattr(pars, k) for k in ("left", "right", "bottom", "top")},
            wspace=pars.wspace,
            hspace=pars.hspace,
        )
        want = _pixels(common.figure_png(fresh, crop="ink"))
        monkeypatch.setattr(FigureCanvasAgg, "draw", counted)
        assert got.shape == want.shape, (setting, got.shape, want.shape)
        diff = np.argwhere((got != want).any(-1))
        assert not len(diff), (setting, diff[:5])


def test_a_shorter_sentence_clamps_the_row_and_draws_once(monkeypatch):
    drawn = []
    real = ex.PretrainedPicture.png

    def counted(self, *args, **kw):
        drawn.append(kw)
        return real(self, *args, **kw)

    monkeypatch.setattr(ex.PretrainedPicture, "png", counted)
    model = pretrained.load_minilm()
    lengths = {s: len(model.tokens(t)) for s, t in ex.SENTENCES.items()}
    long, short = max(lengths, key=lengths.get), min(lengths, key=lengths.get)
    assert lengths[long] > lengths[short]
    box = ex.live_pretrained_explorer(sentence=long, row=lengths[long] - 1)
    c = _controls(box)
    drawn.clear()
    c["sentence"].value = short
    assert c["query row"].value == lengths[short] - 1
    assert drawn == [dict(sentence=short, layer=1, head=3, row=lengths[short] - 1)]
