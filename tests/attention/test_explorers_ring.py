"""Chapter 6's explorer: the static grid is the closed forms' numbers, the page's
script only looks them up (checked in Node when it is installed), the live version
redraws, and the one public call picks the right twin."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import itertools  # noqa: E402
import json  # noqa: E402
import pathlib  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from attention import ring  # noqa: E402
from attention.explorers import ring as er  # noqa: E402
from attention.memory import ring as mring  # noqa: E402
from attention.plots import human_bytes  # noqa: E402
from tests.attention.widget_tools import controls as _controls  # noqa: E402
from tests.attention.widget_tools import output as _output  # noqa: E402
from tests.attention.widget_tools import png as _png  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
COMBOS = list(
    itertools.product(
        range(len(er.RING_N)),
        range(len(er.RING_P)),
        range(len(er.RING_HEADS)),
        range(len(er.RING_D)),
        range(len(er.RING_DTYPES)),
        (False, True),
        range(len(er.RING_LAYOUTS)),
        range(len(er.RING_GPUS)),
        range(len(er.RING_LINKS)),
    )
)


@pytest.fixture(scope="module")
def grid():
    return er.ring_grid()


def _row_args(c):
    iN, iP, iH, id_, idt, causal, iL, iG, iK = c
    _, H, H_kv = er.RING_HEADS[iH]
    return (
        er.RING_N[iN],
        er.RING_P[iP],
        H,
        H_kv,
        er.RING_D[id_],
        er.RING_DTYPES[idt],
        causal,
        er.RING_LAYOUTS[iL],
        er.RING_GPUS[iG],
        er.RING_LINKS[iK],
    )


def test_rows_are_the_closed_forms(grid):
    assert len(grid["rows"]) == len(COMBOS)
    rng = np.random.default_rng(0)
    for i in rng.choice(len(COMBOS), 40, replace=False):
        want = er.ring_row(*_row_args(COMBOS[i]))
        got = dict(zip(grid["fields"], grid["rows"][i]))
        for f in er.ROW_FIELDS:
            if want[f] is None:
                assert got[f] is None
            else:
                assert got[f] == pytest.approx(want[f], rel=1e-3), (COMBOS[i], f)


def test_ulysses_only_where_p_divides_the_heads(grid):
    for c, row in zip(COMBOS, grid["rows"]):
        _, P, H, H_kv, *_ = _row_args(c)
        assert (row[5] is None) == bool(H % P or H_kv % P)


@pytest.mark.parametrize(
    "N,P,heads,causal,layout",
    [
        (16384, 4, 2, True, "zigzag"),
        (16384, 8, 3, True, "contiguous"),
        (65536, 2, 0, False, "zigzag"),
    ],
)
def test_allgather_row_from_positions(N, P, heads, causal, layout):
    """All-gather's gather: every device receives the K/V of the N - n_r tokens it does
    not hold, in the dtype, at the link's per-direction peak (the ring's volume, at
    once), exposed; its attention: 4 H d FLOPs per visible pair of its own queries
    against all N keys, counted here from the positions its shard holds."""
    _, H, H_kv = er.RING_HEADS[heads]
    d, dtype, gpu, link = 128, "bfloat16", "H100", "InfiniBand NDR"
    row = er.ring_row(N, P, H, H_kv, d, dtype, causal, layout, gpu, link)
    bw, b = mring.LINKS[link].gbps * 1e9, mring.DTYPE_BYTES[dtype]
    held, pairs = [], []
    for r in range(P):
        runs = ring.shard_intervals(N, r, P, layout)
        held.append(sum(e - a for a, e in runs))
        # causal: query at position i sees i + 1 keys; otherwise all N
        pairs.append(
            sum((a + 1 + e) * (e - a) // 2 if causal else N * (e - a) for a, e in runs)
        )
    gather = (N - min(held)) * 2 * H_kv * d * b / bw
    attend = 4 * H * d * max(pairs) / mring.peak_flops(gpu, dtype)
    assert row["allgather_ms"] == pytest.approx(gather * 1e3, rel=1e-12)
    assert row["allgather_total_ms"] == pytest.approx((gather + attend) * 1e3)
    assert row["allgather_pct"] == pytest.approx(100 * gather / attend)
    counts = mring.ring_closed_form(N, P, H, d, H_kv, 1, causal, layout)
    ring_volume = counts.received.sum(axis=0).max() * b / bw  # the same bytes
    assert row["allgather_ms"] == pytest.approx(ring_volume * 1e3, rel=1e-12)
    kv = er.memory_row(N, P, H, H_kv, d, dtype)[er.MEMORY_FIELDS.index("allgather_kv")]
    assert kv == N * 2 * H_kv * d * b  # all of K and V, resident


def test_hypothetical_pairs_are_labelled(grid):
    """An NVLink generation the GPU does not have is labelled, as chapter 6 does: an
    A100 with NVLink 4; PCIe and InfiniBand pair with any GPU."""
    for g, gpu in enumerate(er.RING_GPUS):
        for k, link in enumerate(er.RING_LINKS):
            want = gpu == "A100" and link == "NVLink 4"
            assert grid["hypothetical"][g][k] is want
            assert er.link_label(link, gpu).endswith(" (hypothetical)") is want
    text = er.readout(16384, 4, 0, 64, "bfloat16", True, "zigzag", "NVLink 4", "A100")
    assert "(hypothetical)" in text and "all-gather context parallelism" in text
    text = er.readout(16384, 4, 0, 64, "bfloat16", True, "zigzag", "NVLink 4", "H100")
    assert "hypothetical" not in text


def test_idle_and_work_tables(grid):
    keys = list(itertools.product(er.RING_N, er.RING_P, (False, True), er.RING_LAYOUTS))
    for (N, P, causal, layout), idle, wi in zip(keys, grid["idle"], grid["work_index"]):
        if P > 8 and N > 65536:
            continue  # the positions walk is slow there; the closed forms are tested
        work = ring.work_matrix(N, P, layout, causal)
        assert idle == pytest.approx(ring.idle_fraction(work), abs=1e-3)
        full = mring.shard_lengths(N, P, layout).max() ** 2
        np.testing.assert_allclose(grid["work"][wi], work / full, atol=6e-3)


def test_json_is_small_and_parseable():
    e = er.static_context_parallel_explorer()
    text = e.to_json()
    assert len(text) < 1_000_000
    data = json.loads(text)
    assert data["kind"] == "ring" and set(data["specs"]) == {"work", "times"}
    html = e._repr_html_()
    assert 'data-kind="ring"' in html and "context_parallel_explorer()" in html


def test_one_call_picks_the_twin(monkeypatch):
    from attention import explorers
    from attention.explorers import site

    monkeypatch.setattr(site, "ON_SITE", True)
    assert er.context_parallel_explorer(P=4).kind == "ring"
    assert explorers.context_parallel_explorer(P=4).kind == "ring"
    monkeypatch.setattr(site, "ON_SITE", False)
    import ipywidgets

    assert isinstance(er.context_parallel_explorer(P=4), ipywidgets.VBox)


def test_live_explorer_redraws():
    box = er.live_context_parallel_explorer(P=4, causal=True, layout="contiguous")
    out = _output(box)
    first, c = _png(out), _controls(box)
    text = next(w for w in _walk(box) if type(w).__name__ == "HTML")
    assert "idle 43%" in text.value  # (P-1)/(2P-1) at P = 4, to the percent
    c["layout"].value = "zigzag"
    assert _png(out) != first and "idle 0%" in text.value
    c["link"].value = "PCIe 5 x16"
    assert "PCIe" in text.value and "all-gather context parallelism" in text.value
    c["link"].value, c["GPU"].value = "NVLink 4", "A100"
    assert "(hypothetical)" in text.value


def _walk(box):
    from tests.attention.widget_tools import walk

    return walk(box)


NODE = shutil.which("node")


@pytest.mark.skipif(NODE is None, reason="Node.js is not installed")
def test_page_script_looks_rows_up(tmp_path, grid):
    """Run explorers.js's 'ring' kind in Node on a few states; its bars carry exactly
    the grid's numbers for that state, found by the same index the Python grid uses."""
    cfg = json.loads(er.static_context_parallel_explorer().to_json())
    rng = np.random.default_rng(1)
    picks = [int(i) for i in rng.choice(len(COMBOS), 12, replace=False)]
    a100_nvlink4 = (0, 1, 2, 1, 0, True, 1, 0, 0)  # a hypothetical pair
    assert er.RING_GPUS[a100_nvlink4[7]] == "A100"
    assert er.RING_LINKS[a100_nvlink4[8]] == "NVLink 4"
    picks.append(COMBOS.index(a100_nvlink4))
    states = []
    for i in picks:
        iN, iP, iH, id_, idt, causal, iL, iG, iK = COMBOS[i]
        states.append(
            {
                "N": iN,
                "P": iP,
                "heads": iH,
                "d": id_,
                "dtype": idt,
                "causal": causal,
                "layout": iL,
                "gpu": iG,
                "link": iK,
            }
        )
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    (tmp_path / "states.json").write_text(json.dumps(states))
    script = tmp_path / "run.js"
    script.write_text(
        "const fs = require('fs');\n"
        "global.window = {};\n"
        "global.document = { readyState: 'complete', querySelectorAll: () => [] };\n"
        f"let src = fs.readFileSync({json.dumps(str(ROOT / '_static/explorers.js'))},"
        " 'utf8');\n"
        "src = src.replace('const KINDS = {};', 'const KINDS = window.KINDS = {};');\n"
        "eval(src);\n"
        "const cfg = JSON.parse(fs.readFileSync("
        f"{json.dumps(str(tmp_path / 'cfg.json'))}));\n"
        f"const states = JSON.parse(fs.readFileSync("
        f"{json.dumps(str(tmp_path / 'states.json'))}));\n"
        "console.log(JSON.stringify(states.map((s) => {\n"
        "  const r = window.KINDS.ring.update(cfg, s);\n"
        "  return { times: r.charts.times.data.times, work: r.charts.work.data.work,\n"
        "           text: r.text };\n"
        "})));\n"
    )
    res = subprocess.run(
        [NODE, str(script)], capture_output=True, text=True, timeout=60, check=True
    )
    for i, got in zip(picks, json.loads(res.stdout)):
        row = dict(zip(grid["fields"], grid["rows"][i]))
        ms = {t["what"]: t["ms"] for t in got["times"]}
        assert ms["compute, busiest step"] == row["compute_ms"]
        assert ms["K/V transfer, one step"] == row["transfer_ms"]
        assert ms["ring, overlapped"] == row["total_ms"]
        assert ms.get("Ulysses (all-to-all + compute)") == row["ulysses_ms"]
        assert ms["all-gather of K/V (exposed)"] == row["allgather_ms"]
        assert ms["all-gather CP (gather + compute)"] == row["allgather_total_ms"]
        P = er.RING_P[COMBOS[i][1]]
        assert len(got["work"]) == P * P
        assert "ESTIMATES" in got["text"]
        assert f"{row['allgather_ms']} ms of all-gather" in got["text"]
        iG, iK = COMBOS[i][7], COMBOS[i][8]
        assert ("(hypothetical)" in got["text"]) is grid["hypothetical"][iG][iK]
        iN, iP, iH, id_, idt = COMBOS[i][:5]
        _, H, H_kv = er.RING_HEADS[iH]
        kv = er.memory_row(
            er.RING_N[iN], er.RING_P[iP], H, H_kv, er.RING_D[id_], er.RING_DTYPES[idt]
        )[2]
        assert f"all of K/V {human_bytes(kv)} per device" in got["text"]
