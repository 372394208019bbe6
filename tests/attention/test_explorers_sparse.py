"""Chapter 8's explorer: its selections are attention.sparse's (the decode-time choice
equals the causal prefill's row for MoBA and NSA), the mass kept is
sparse_mass.mass_kept, the costs are attention.memory.sparse's closed forms; both faces
refuse every setting outside the declaration by name; the live widget responds and
redraws a setting it showed from the cache; the page's script (node) draws the Python
numbers; sparse_explorer() picks the face by ON_SITE."""

from __future__ import annotations

import re

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from attention import sparse, sparse_mass  # noqa: E402
from attention.explorers import settings  # noqa: E402
from attention.explorers import sparse as ex  # noqa: E402
from attention.memory import sparse as ms  # noqa: E402
from tests.attention.widget_tools import controls as _controls  # noqa: E402
from tests.attention.widget_tools import output as _output  # noqa: E402
from tests.attention.widget_tools import png as _png  # noqa: E402
from tests.attention.widget_tools import walk  # noqa: E402


@pytest.fixture(scope="module")
def grid():
    return ex.sparse_grid()


def test_decode_time_choice_is_the_causal_prefills_row():
    """MoBA and NSA choose for query i at decode (keys 0..i) what they choose for row
    i of a causal prefill over all N keys."""
    N, B = 512, 32
    q, k = ex.synthetic_qk(N)
    Q, K = q[None, None], k[None, None]
    full = {
        "moba": sparse.select_blocks(Q, K, B, ex.TOPK_MAX, True),
        "nsa": sparse.nsa_select(Q, K, B, ex.TOPK_MAX, True),
    }
    for m, idx in full.items():
        for i in ex.query_rows(N):
            assert ex.row_point(m, N, B, i)["order"] == idx[0, 0, i].tolist(), (m, i)


def test_mass_kept_is_sparse_mass(grid):
    N, B, i = 1024, 64, 639
    q, k = ex.synthetic_qk(N)
    s = k[: i + 1] @ q[i] / np.sqrt(ex.D)
    p = np.exp(s - s.max())
    p = (p / p.sum())[None, None, None]
    for m in ex.METHODS:
        r = ex.row_point(m, N, B, i)
        assert grid["rows"][f"{m},{N},{B},{i}"] == r["order"] + r["kept"]
        order = np.array(r["order"])[None, None, None]
        for a, t in enumerate(ex.TOPKS):
            want = 100 * sparse_mass.mass_kept(p, order[..., :t], B)[0, 0, 0]
            assert r["kept"][a] == pytest.approx(want, abs=0.05)
    assert grid["rows"][f"oracle,{N},{B},{i}"][: ex.TOPK_MAX] == (
        sparse_mass.oracle_blocks(p, B, ex.TOPK_MAX, True)[0, 0, 0].tolist()
    )
    assert sum(grid["mass"][f"{N},{B},{i}"]) == pytest.approx(1000, abs=10)
    # the oracle keeps the most at every budget
    for m in ex.METHODS:
        kept = np.array(ex.row_point(m, N, B, i)["kept"])
        assert (kept <= np.array(ex.row_point("oracle", N, B, i)["kept"])).all()


def test_costs_are_the_closed_forms(grid):
    for N, B, t in ((256, 16, 1), (4096, 128, 32), (2048, 64, 4)):
        row = grid["cost"][f"{N},{B}"][ex.TOPKS.index(t)]
        c = dict(zip(ex.COST_FIELDS, row))
        assert c["flops"] == ms.selected_work(N, N, B, t, ex.D).flops
        assert c["dense_flops"] == ms.dense_causal_flops(N, ex.D)
        assert c["gate_flops"] == ms.gate_cost(N, N, B, t, ex.D)["flops"]
    # a fixed budget: the attention's FLOPs grow linearly in N, dense's quadratically
    f = [grid["cost"][f"{N},64"][5][0] for N in (2048, 4096)]  # 8 blocks
    d = [grid["cost"][f"{N},64"][5][4] for N in (2048, 4096)]
    assert f[1] / f[0] < 2.25 and d[1] / d[0] > 3.9


def test_the_map_has_local_and_global_structure():
    t = np.array(ex.map_thumbnail(1024)) / 1000
    assert np.allclose(t.sum(axis=1), 1, atol=0.05)
    assert np.triu(t, 1).sum() == 0  # causal
    diag = np.mean([t[a, a] for a in range(8, ex.THUMB)])
    far = np.mean([t[a, 1 : a - 2].sum() for a in range(8, ex.THUMB)])
    assert diag > 0.1 and far > 0.2  # a local band, and mass far back


def test_static_twin_is_small_and_named():
    e = ex.static_sparse_explorer()
    assert e.kind == "sparse" and len(e.to_json()) < 1_000_000
    assert "sparse" in e._repr_html_()
    assert e.config["init"]["query"] == ex.N_QUERIES - 1  # the last row


def _outside(rule):
    if isinstance(rule, settings.Choice):
        nums = [o for o in rule.options if isinstance(o, int)]
        return ["nope", True] + ([max(nums) + 1, min(nums) - 1] if nums else [])
    raise AssertionError(rule)


INSIDE = dict(method="quest", N=2048, block_size=32, topk=6, query=1279)


@pytest.mark.parametrize("face", ["live", "static"])
def test_every_setting_outside_is_refused_by_name(face, monkeypatch):
    monkeypatch.setattr(ex.SparsePicture, "png", lambda self, **kw: "")
    f = getattr(ex, f"{face}_sparse_explorer")
    for name, rule in ex.settings(INSIDE["N"]).items():
        for bad in _outside(rule):
            with pytest.raises(ValueError, match=rf"^{name} must be"):
                f(**{**INSIDE, name: bad})
    with pytest.raises(ValueError, match=r"^query must be one of \[63, 127, "):
        f(N=512, query=500)
    with pytest.raises(ValueError, match=r"^topk must be one of \[1, 2, 3, 4, 6, "):
        f(topk=5)


def test_settings_inside_are_shown_as_given(monkeypatch):
    monkeypatch.setattr(ex.SparsePicture, "png", lambda self, **kw: "")
    box = ex.live_sparse_explorer(**INSIDE)
    values = [w.value for w in walk(box) if hasattr(w, "value")]
    for name, value in INSIDE.items():
        assert value in values, name
    init = ex.static_sparse_explorer(**INSIDE).config["init"]
    assert ex.METHODS[init["method"]] == "quest" and init["topk"] == 4
    assert ex.query_rows(2048)[init["query"]] == 1279


def test_widget_responds_and_redraws_from_the_cache(monkeypatch):
    import time

    calls, times = [], {}
    real = ex.SparsePicture.png

    def counted(self, **kw):
        calls.append(kw)
        return real(self, **kw)

    monkeypatch.setattr(ex.SparsePicture, "png", counted)
    box = ex.live_sparse_explorer(N=1024, block_size=64, topk=4)
    out, c = _output(box), _controls(box)
    text = next(w for w in walk(box) if w.__class__.__name__ == "HTML")
    first, first_text = _png(out), text.value

    def move(name, value):
        t0 = time.perf_counter()
        c[name].value = value
        times[f"{name} -> {value}"] = time.perf_counter() - t0

    move("budget (blocks)", 8)
    assert _png(out) != first and "budget 8" in text.value and text.value != first_text
    move("selection", "nsa")
    assert text.value.startswith("<p>NSA")
    move("query row", 511)
    move("sequence length N", 4096)  # the query keeps its eighth of the sequence
    assert c["query row"].value == 2047 and "query 2,047" in text.value
    assert len(calls) == 5  # one redraw per move, none for the query's new options
    move("sequence length N", 1024)
    move("selection", "moba")
    move("budget (blocks)", 4)
    move("query row", 1023)
    assert _png(out) == first and len(calls) == 7  # 1024/511/nsa and the last cached
    assert not plt.get_fignums()
    print({k: f"{v * 1e3:.0f} ms" for k, v in times.items()})


def test_blitted_picture_is_the_full_drawing():
    """``SparsePicture.png`` draws the axes once per N and blits the moving artists
    over them: each picture, pixel for pixel, is what drawing the whole figure at that
    setting gives, across moves of every control, a new N and back."""
    import base64
    import io

    from PIL import Image

    picture = ex.SparsePicture()
    keys = ("method", "N", "block_size", "topk", "query")
    cases = [
        ("moba", 1024, 64, 4, 1023),
        ("nsa", 1024, 64, 8, 511),
        ("quest", 4096, 128, 2, 2047),
        ("moba", 1024, 32, 1, 127),
    ]
    for values in cases:
        s = dict(zip(keys, values))
        png = picture.png(**s)
        got = np.asarray(Image.open(io.BytesIO(base64.b64decode(png))).convert("RGB"))
        picture.fig.canvas.draw()  # the whole figure, as the blit left its artists
        want = np.asarray(picture.fig.canvas.buffer_rgba())[..., :3]
        assert got.shape == want.shape, s
        diff = np.argwhere((got != want).any(-1))
        assert not len(diff), (s, diff[:5])


def test_one_call_picks_the_face(monkeypatch):
    from attention import explorers
    from attention.explorers import site

    monkeypatch.setattr(site, "ON_SITE", True)
    assert ex.sparse_explorer(N=512).kind == "sparse"
    assert explorers.sparse_explorer(method="nsa").kind == "sparse"
    monkeypatch.setattr(site, "ON_SITE", False)
    monkeypatch.setattr(ex.SparsePicture, "png", lambda self, **kw: "")
    assert ex.sparse_explorer(N=512).__class__.__name__ == "VBox"


_HARNESS = r"""
const fs = require("fs");
const src = fs.readFileSync(process.argv[2], "utf8")
  .replace("const KINDS = {};", "const KINDS = globalThis.__KINDS = {};");
globalThis.window = globalThis;
globalThis.document = { readyState: "loading", addEventListener() {},
                        querySelectorAll() { return []; } };
eval(src);
const cfg = JSON.parse(fs.readFileSync(0, "utf8"));
const K = globalThis.__KINDS.sparse, specs = K.controls(cfg), controls = {};
for (const s of specs) {
  controls[s.name] = { spec: s, input: { disabled: false }, get: () => s.value,
                       setOptions(o) { s.options = o; } };
}
const state = Object.fromEntries(specs.map((s) => [s.name, s.value]));
const out = K.update(cfg, state, { controls });
console.log(JSON.stringify({ text: out.text, chosen: out.charts.map.data.chosen,
                             blocks: out.charts.row.data.blocks }));
"""


@pytest.mark.parametrize(
    "kw",
    [
        dict(method="nsa", N=512, block_size=16, topk=6, query=319),
        dict(method="quest", N=4096, block_size=128, topk=32, query=511),
        dict(method="oracle", N=1024, block_size=64, topk=1),
    ],
)
def test_page_script_draws_the_python_numbers(kw, tmp_path):
    """The page's script (run in node, the DOM stubbed) draws the chosen blocks of
    ``row_point`` and prints the Python readout."""
    import json
    import pathlib
    import shutil
    import subprocess

    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    js = pathlib.Path(__file__).resolve().parents[2] / "_static" / "explorers.js"
    (tmp_path / "h.js").write_text(_HARNESS)
    run = subprocess.run(
        [node, str(tmp_path / "h.js"), str(js)],
        input=ex.static_sparse_explorer(**kw).to_json(),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    out = json.loads(run.stdout)
    m, N, B, t = kw["method"], kw["N"], kw["block_size"], kw["topk"]
    i = kw.get("query", N - 1)
    want = [b for b in ex.row_point(m, N, B, i)["order"][:t] if b >= 0]
    assert [c["x"] // B for c in out["chosen"]] == want
    assert [b["chosen"] == "chosen" for b in out["blocks"]] == [
        b in want for b in range(i // B + 1)
    ]
    text = re.sub(r"<[^>]+>", "", out["text"]).replace("×", "x")
    assert text == ex.readout(m, N, B, t, i)
