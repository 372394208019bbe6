"""Chapter 5's explorer: the static grid equals decode_point (Python) at the smallest,
largest and middle settings; the twin is small; the live widget builds and responds;
decode_explorer() picks the face by ON_SITE."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from attention import memory  # noqa: E402
from attention.explorers import decode as ex  # noqa: E402
from tests.attention.widget_tools import controls as _controls  # noqa: E402
from tests.attention.widget_tools import output as _output  # noqa: E402
from tests.attention.widget_tools import png as _png  # noqa: E402


@pytest.fixture(scope="module")
def grid():
    return ex.decode_grid()


def _settings():
    """Smallest, largest and middle index of every control (H_kv <= H_q kept)."""
    lists = dict(
        B=ex.BATCH,
        N=ex.CONTEXT,
        d=ex.HEAD_DIM,
        dtype=[n for n, _ in ex.DTYPES],
        n_splits=ex.SPLITS,
        page_size=ex.PAGES,
        gpu=ex.GPUS,
    )
    for pick in (0, -1, "mid"):
        kw = {k: v[len(v) // 2] if pick == "mid" else v[pick] for k, v in lists.items()}
        for hq, hkv in ((ex.HEADS_Q[0], 1), (ex.HEADS_Q[-1], ex.HEADS_KV[-1]), (32, 8)):
            yield {**kw, "H_q": hq, "H_kv": hkv}


def test_static_grid_equals_python(grid):
    kern = "split-KV, paged (the kernel)"
    for kw in _settings():
        p = ex.decode_point(**kw)
        iB, iN = ex.BATCH.index(kw["B"]), ex.CONTEXT.index(kw["N"])
        ic = grid["combos"].index((kw["H_q"], kw["H_kv"]))
        i_d = ex.HEAD_DIM.index(kw["d"])
        ib = grid["bpe"].index(dict(ex.DTYPES)[kw["dtype"]])
        iS, ip = ex.SPLITS.index(kw["n_splits"]), ex.PAGES.index(kw["page_size"])
        ig = ex.GPUS.index(kw["gpu"])
        assert grid["bytes"][kern][iB][iN][ic][i_d][ib][iS][ip] == p["step_bytes"][kern]
        for line in ex.LINES:
            if line != kern:
                assert grid["bytes"][line][iB][iN][ic][i_d][ib] == p["step_bytes"][line]
        assert grid["cache"][iB][iN][ic][i_d][ib] == p["cache_bytes"]
        assert grid["token"][ic][i_d][ib] == p["kv_bytes_per_token"]
        assert grid["pps"][iB][ic][iS][ig] == pytest.approx(
            p["programs_per_sm"], abs=1e-4
        )
        assert grid["pps_fa2"][iB][ic][ig] == pytest.approx(
            p["fa2_programs_per_sm"], abs=1e-4
        )
        w = grid["waste"][iB][iN][ip]
        assert w == pytest.approx(
            [p["waste_percent"]["contiguous"], p["waste_percent"]["paged"]], abs=0.005
        )
        # the page's one conversion reproduces Python's estimate
        us = grid["bytes"][kern][iB][iN][ic][i_d][ib][iS][ip] / grid["bw"][ig] * 1e6
        assert us == pytest.approx(p["step_us_estimate"][kern], rel=1e-12)


def test_point_matches_the_closed_forms():
    p = ex.decode_point(
        B=1,
        N=32768,
        H_q=32,
        H_kv=8,
        d=128,
        dtype="float16",
        n_splits=8,
        page_size=16,
        gpu="H100",
    )
    t = memory.closed_form(
        "decode_paged", 1, 8, 32768, 128, group=4, page_size=16, n_splits=8
    )
    assert p["step_bytes"]["split-KV, paged (the kernel)"] == memory.decode_bytes(t, 2)
    assert p["kv_bytes_per_token"] == 2 * 8 * 128 * 2
    assert p["programs_per_sm"] == 1 * 8 * 8 / 132


def test_static_twin_is_small_and_named():
    e = ex.static_decode_explorer()
    assert e.kind == "decode" and len(e.to_json()) < 1_000_000
    assert "decode" in e._repr_html_()
    with pytest.raises(ValueError, match="^n_splits"):
        ex.static_decode_explorer(n_splits=3)
    with pytest.raises(ValueError, match="^H_q must be a multiple"):
        ex.static_decode_explorer(H_q=32, H_kv=64)


def test_widget_builds_and_responds():
    box = ex.live_decode_explorer(B=1, N=1024)
    out, c = _output(box), _controls(box)
    text = next(w for w in _walk(box) if w.__class__.__name__ == "HTML")
    first, first_text = _png(out), text.value
    c["splits"].value = 32
    assert _png(out) != first and text.value != first_text
    assert "32 splits" in text.value
    c["GPU"].value = "T4"
    assert "T4" in text.value
    c["KV heads H_kv"].value = 64  # does not divide H_q = 32: says so, no crash
    assert "divide" in text.value
    assert not plt.get_fignums()


def test_sliders_pass_their_values_to_the_figure(monkeypatch):
    calls = []

    def fake(**kw):
        calls.append(kw)
        return plt.figure(figsize=(1, 1))

    monkeypatch.setattr(ex, "decode_explorer_figure", fake)
    box = ex.live_decode_explorer()
    c = _controls(box)
    for desc, key, value in (
        ("batch B", "B", 64),
        ("context N", "N", 131072),
        ("head dim d", "d", 64),
        ("page size", "page_size", 128),
        ("dtype", "dtype", "float8"),
    ):
        c[desc].value = value
        assert calls[-1][key] == value


def test_one_call_picks_the_face(monkeypatch):
    from attention import explorers
    from attention.explorers import site

    monkeypatch.setattr(site, "ON_SITE", True)
    assert ex.decode_explorer(B=1).kind == "decode"
    assert explorers.decode_explorer(B=1).kind == "decode"
    monkeypatch.setattr(site, "ON_SITE", False)
    assert ex.decode_explorer(B=1).__class__.__name__ == "VBox"


def _walk(box):
    from tests.attention.widget_tools import walk

    return walk(box)
