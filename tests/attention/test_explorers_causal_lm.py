"""Chapter 1's SmolLM2 explorer: the twin's data are attention.pretrained's numbers,
the page script (run in Node) writes Python's readout from them, the settings are
checked, the live widget builds and responds, and the one call picks the face."""

from __future__ import annotations

import json
import shutil
import subprocess

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from attention import pretrained  # noqa: E402
from attention.explorers import causal_lm as ex  # noqa: E402
from attention.explorers import site  # noqa: E402
from tests.attention.widget_tools import controls as _controls  # noqa: E402
from tests.attention.widget_tools import output as _output  # noqa: E402
from tests.attention.widget_tools import png as _png  # noqa: E402
from tests.attention.widget_tools import walk  # noqa: E402
from tests.conftest import ROOT  # noqa: E402

pytestmark = [pytest.mark.xdist_group("smollm2"), pytest.mark.slow]
NODE = shutil.which("node")


@pytest.fixture(scope="module")
def grid():
    try:
        pretrained.load_smollm2()
    except ModuleNotFoundError as e:
        pytest.skip(f"SmolLM2 is not installed: {e}")
    return ex.causal_lm_grid()


def test_grid_holds_the_models_maps_and_scores(grid):
    model = pretrained.load_smollm2()
    assert [p["name"] for p in grid["prompts"]] == list(ex.PROMPTS)
    for p in grid["prompts"]:
        ids = ex.prompt_ids(p["name"])
        maps = model.attentions(ids)
        n = len(ids)
        assert len(p["tokens"]) == n
        rows, cols = np.tril_indices(n)
        w = np.asarray(p["w"]) / ex.SCALE  # (30, 9, n (n + 1) / 2)
        np.testing.assert_allclose(w, maps[..., rows, cols], atol=0.5 / ex.SCALE + 1e-6)
        np.testing.assert_allclose(
            p["sink"], pretrained.sink_scores(maps), atol=0.005 + 1e-6
        )
    rep = grid["prompts"][list(ex.PROMPTS).index("repeated")]
    ids = ex.prompt_ids("repeated")
    assert ids[: ex.SHORT["length"]] == ids[ex.SHORT["length"] :]
    assert "induction" in rep
    seqs, r = ex.probe()
    assert seqs.shape == (ex.PROBE["n_seq"], 2 * ex.PROBE["length"])
    np.testing.assert_allclose(
        grid["probe"]["induction"], r["induction"].mean(0), atol=0.005 + 1e-9
    )
    # the twin stays small: the page carries it inline
    assert len(ex.static_causal_lm_explorer().to_json()) < 300_000


def test_settings_are_checked():
    for kw, name in (
        ({"prompt": "poem"}, "prompt"),
        ({"layer": 0}, "layer"),
        ({"head": 10}, "head"),
        ({"score": "entropy"}, "score"),
    ):
        with pytest.raises(ValueError, match=rf"^{name} must be (one of|an int in)"):
            ex.causal_lm_explorer(**kw)


@pytest.mark.skipif(NODE is None, reason="Node.js is not installed")
def test_page_script_writes_pythons_readout(grid, tmp_path):
    cfg = json.loads(ex.static_causal_lm_explorer().to_json())
    settings = [("repeated", 19, 7, "induction"), ("posts", 1, 1, "first token"),
                ("capital", 30, 9, "previous token")]  # fmt: skip
    states = [
        {"prompt": list(ex.PROMPTS).index(p), "layer": la - 1, "head": h - 1,
         "score": list(ex.SCORES).index(s)}
        for p, la, h, s in settings
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
        "  const r = window.KINDS.causal_lm.update(cfg, s, { controls: {} });\n"
        "  return { text: r.text, cells: r.charts.map.data.cells,\n"
        "           heads: r.charts.grid.data.heads };\n"
        "})));\n"
    )  # fmt: skip
    res = subprocess.run(
        [NODE, str(script)], capture_output=True, text=True, timeout=60, check=True
    )
    _, r = ex.probe()
    for (p, la, h, s), got in zip(settings, json.loads(res.stdout)):
        assert got["text"] == "<p>" + ex.readout(p, la, h, s) + "</p>"
        toks, maps, _ = ex.prompt_maps(p)
        n = len(toks)
        assert len(got["cells"]) == n * (n + 1) // 2
        for c in got["cells"]:
            assert abs(c["w"] - maps[la - 1, h - 1, c["i"], c["j"]]) <= 0.005 + 1e-6
        assert len(got["heads"]) == 270
        want = r[ex.SCORES[s]].mean(0)
        for cell in got["heads"][:20]:
            v = want[cell["layer"] - 1, cell["head"] - 1]
            assert abs(cell["value"] - v) <= 0.005 + 1e-9


def test_live_widget_responds(grid):
    import ipywidgets

    box = ex.live_causal_lm_explorer()
    ctl = _controls(box)
    text = next(w for w in walk(box) if isinstance(w, ipywidgets.HTML))
    first = _png(_output(box))
    assert text.value == "<p>" + ex.readout("repeated", 19, 7, "induction") + "</p>"
    ctl["head"].value = 5
    assert _png(_output(box)) != first
    assert "Head 19-5" in text.value
    ctl["prompt"].value = "posts"
    assert text.value == "<p>" + ex.readout("posts", 19, 5, "induction") + "</p>"


def test_one_call_picks_the_face(grid, monkeypatch):
    monkeypatch.setattr(site, "ON_SITE", True)
    e = ex.causal_lm_explorer(layer=2, head=9)
    assert isinstance(e, site.Explorer) and e.kind == "causal_lm"
    assert 'data-kind="causal_lm"' in e._repr_html_()
    monkeypatch.setattr(site, "ON_SITE", False)
    assert not isinstance(ex.causal_lm_explorer(), site.Explorer)
