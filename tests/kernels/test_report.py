"""kernels.timing.report: the Benchmarks page's tables come from recorded files only."""

import subprocess
import sys

from kernels.timing import report


def test_results_and_report_import_on_their_own():
    # kernels.timing.bench re-exports kernels.timing.results: importing results first
    # must not be a circular import (the benchmarks page imports kernels.timing.report
    # first)
    for mod in ("kernels.timing.results", "kernels.timing.report"):
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
        for impl, ms, err in (("triton", tri, None), ("naive", 9.0, None),
                              ("sdpa-cudnn", 1.5, None), ("sdpa-flash", 1.8, None),
                              ("sdpa-math", None, "OutOfMemoryError")):
            recs.append({"op": "attention", "mode": "fwd", "dtype": "bf16",
                         "shape": sh, "impl": impl, "ms": ms, "error": err})
    data = {"suites": {"flash": {"provenance": {"gpu": "NVIDIA H200"},
                                 "records": recs}}}
    rows = report.gpu_table([data]).splitlines()[2:]
    assert len(rows) == 2 and all(r.count("|") == 10 for r in rows)
    full, causal = rows
    assert "| full |" in full and "| 2.000 | sdpa-cudnn 1.500 | 9.000 |" in full
    assert "| causal |" in causal and "| 1.200 |" in causal
    assert "4x16x16384x128" in full and full.startswith("| NVIDIA H200 | flash |")
