"""benchmarks.report: the Benchmarks page's tables come from recorded files only."""

import subprocess
import sys

from benchmarks import report


def test_results_and_report_import_on_their_own():
    # kernels.timing.bench re-exports kernels.timing.results: importing results first
    # must not be a circular import (the benchmarks page imports benchmarks.report
    # first)
    for mod in ("kernels.timing.results", "benchmarks.report"):
        subprocess.run([sys.executable, "-c", f"import {mod}"], check=True)


def test_static_table_has_a_row_per_compiled_kernel():
    rep = report.load_static("sm90")
    assert rep is not None and rep["note"].startswith("instruction counts")
    table = report.static_table(rep).splitlines()
    assert len(table) == 2 + len(rep["kernels"])
    assert table[0].startswith("| kernel | d | mask | tile | regs | spill B")
    only_fwd = report.static_table(rep, ("fwd",)).splitlines()[2:]
    assert only_fwd and all(r.startswith("| fwd |") for r in only_fwd)
    first = rep["kernels"][0]
    assert f"| {first['hot_loop']['instructions']} |" in table[2]
    assert "492" in report.reference_line(rep)  # the recorded tutorial figure


def test_no_file_means_no_table(tmp_path):
    assert report.load_static("sm90", tmp_path) is None
    assert report.gpu_table([]) is None


def test_gpu_table_names_the_best_sdpa_and_keeps_causal_apart():
    shape = {"B": 4, "H": 16, "N_q": 16384, "N_k": 16384, "d": 128}
    recs = []
    for causal, tri in ((False, 2.0), (True, 1.2)):
        sh = {**shape, "causal": causal}
        for impl, ms, err in (
            ("triton", tri, None),
            ("naive", 9.0, None),
            ("sdpa-cudnn", 1.5, None),
            ("sdpa-flash", 1.8, None),
            ("sdpa-math", None, "OutOfMemoryError"),
        ):
            recs.append(
                {
                    "op": "attention",
                    "mode": "fwd",
                    "dtype": "bf16",
                    "shape": sh,
                    "impl": impl,
                    "ms": ms,
                    "error": err,
                }
            )
    data = {
        "suites": {"flash": {"provenance": {"gpu": "NVIDIA H200"}, "records": recs}}
    }
    rows = report.gpu_table([data]).splitlines()[2:]
    assert len(rows) == 2 and all(r.count("|") == 10 for r in rows)
    full, causal = rows
    assert "| full |" in full and "| 2.000 | sdpa-cudnn 1.500 | 9.000 |" in full
    assert "| causal |" in causal and "| 1.200 |" in causal
    assert "4x16x16384x128" in full and full.startswith("| NVIDIA H200 | flash |")


def test_per_score_column_is_per_thread_and_recomputed_from_the_fields():
    """The "thread instr. / score" column is the hot-loop count (per warp) x 32 x warps
    over the tile's BLOCK_M x BLOCK_N scores, recomputed from each recorded row's own
    fields; the recorded field agrees with it. A tile of 8 warps and one of 4 doing the
    same work per thread read alike: every flash forward issues one MUFU.EX2 per score
    plus the row rescale's (at most half as many again on the smallest tiles), whatever
    its tile and warps."""
    col = report.STATIC_COLUMNS.index("thread instr. / score")
    for target in ("sm90", "sm80"):
        rep = report.load_static(target)
        rows = report.static_rows(rep)
        assert len(rows) == len(rep["kernels"])
        for r, row in zip(rep["kernels"], rows):
            c, hl = r["config"], r["hot_loop"]
            want = (
                hl["instructions"] * 32 * c["num_warps"] / (c["BLOCK_M"] * c["BLOCK_N"])
            )
            assert row[col] == f"{want:.2f}", (target, r["kernel"], c)
            assert r["thread_instructions_per_score"] == round(want, 3)
            if r["kernel"].startswith("fwd"):
                ex2 = (
                    hl["MUFU.EX2"] * 32 * c["num_warps"] / (c["BLOCK_M"] * c["BLOCK_N"])
                )
                assert 1 <= ex2 <= 1.5, (target, r["kernel"], c, ex2)
    # the example: 128x64 w8 and 64x64 w4 at d = 64 both issue 34 EX2 per thread
    # per iteration; per score per thread they are within 5 % of each other
    fwd64 = {
        (k["config"]["BLOCK_M"], k["config"]["num_warps"]): k[
            "thread_instructions_per_score"
        ]
        for k in report.load_static("sm90")["kernels"]
        if k["kernel"] == "fwd" and k["head_dim"] == 64 and not k["causal"]
    }
    assert abs(fwd64[(128, 8)] / fwd64[(64, 4)] - 1) < 0.05


def test_per_score_rejects_an_empty_tile():
    import pytest

    from kernels.machine_code import sass

    assert sass.per_score(34, 128, 64, 8) == 34 * 256 / 8192
    with pytest.raises(ValueError, match="tile and warps"):
        sass.per_score(34, 0, 64, 8)


def test_decode_rows_read_the_recorded_decode_report():
    for target in ("sm90", "sm80"):
        rep = report.load_decode_static(target)
        assert rep is not None, target
        rows = report.decode_rows(rep)
        assert len(rows) == len(rep["kernels"]) > 0
        for row, k in zip(rows, rep["kernels"]):
            assert len(row) == len(report.DECODE_COLUMNS)
            case = k["case"]
            assert row[:5] == (
                case["kernel"],
                case["head_dim"],
                case["dtype"],
                case["block_m"],
                case["layout"],
            )
            assert row[6:8] == (case["registers"], case["spills"])
            assert row[9] == k["hot_loop"]["instructions"]


def test_no_decode_file_means_no_decode_report(tmp_path):
    assert report.load_decode_static("sm90", static_dir=tmp_path) is None


def test_flex_rows_read_the_recorded_flex_report():
    cols = report.STATIC_COLUMNS
    for target in ("sm90", "sm80"):
        rep = report.load_flex_static(target)
        assert rep is not None and rep["target"] == target
        rows = report.flex_rows(rep)
        assert len(rows) == 2 * len(rep["kernels"])
        assert {r["mask"] for r in rep["kernels"]} == {"causal", "window 4096"}
        for r, (full, part) in zip(rep["kernels"], zip(rows[::2], rows[1::2])):
            assert full[cols.index("mask")] == part[cols.index("mask")] == r["mask"]
            assert full[cols.index("loop instr.")] == r["hot_loop"]["instructions"]
            assert part[cols.index("loop instr.")] == r["partial_loop"]["instructions"]
            assert full[cols.index("int")] == r["hot_loop"]["integer"]
            assert part[cols.index("int")] == r["partial_loop"]["integer"]
            assert full[cols.index("spill B")] == r["spill_bytes"] == 0
        line = report.flex_vs_flash(rep, report.load_static(target))
        causal = next(r for r in rep["kernels"] if r["mask"] == "causal")
        assert f"full tiles {causal['hot_loop']['instructions']} " in line
        assert f"partial tiles {causal['partial_loop']['instructions']} " in line


def test_no_flex_file_means_no_flex_report(tmp_path):
    assert report.load_flex_static("sm90", static_dir=tmp_path) is None
