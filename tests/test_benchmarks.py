"""benchmarks/run.py and kernels/bench.py: the suite protocol and the results files.

No GPU here, so nothing is timed: these tests check the plumbing that a GPU run uses
(every result written goes to a temporary folder, never to benchmarks/results/).
"""

import importlib
import json

import pytest

from benchmarks import run
from kernels import bench, runtime


@pytest.mark.parametrize("name", run.SUITES)
def test_every_suite_follows_the_protocol(name):
    mod = importlib.import_module(f"benchmarks.suite_{name}")
    assert callable(mod.check) and callable(mod.run)
    assert name in run.available_suites() and name in run.WEIGHTS


@pytest.mark.skipif(runtime.HAS_CUDA and not runtime.INTERPRET, reason="CPU-only behaviour")
def test_run_refuses_to_time_on_cpu(capsys):
    assert run.main(["--suite", "flash"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


@pytest.mark.skipif(runtime.HAS_CUDA and not runtime.INTERPRET, reason="CPU-only behaviour")
def test_time_fn_refuses_without_a_gpu():
    with pytest.raises(RuntimeError, match="CUDA"):
        bench.time_fn(lambda: None)


def test_results_round_trip_keeps_other_suites_and_provenance(tmp_path):
    prov = {"gpu": "Test GPU 1", "capability": [9, 0], "torch": "t", "triton": "tr",
            "cuda": "c", "date": "2026-01-02T03:04:05+00:00"}
    path = tmp_path / "test-gpu-1.json"
    rec = bench.Record("flash", "attention", "triton", "fwd", "float16",
                       {"B": 1, "H": 2, "N_q": 8, "N_k": 8, "d": 16, "causal": False}, ms=1.5)
    bench.save_results("flash", [rec], [{"name": "x", "max_err": 0.0, "tol": 1.0, "ok": True}],
                       path=path, provenance=prov)
    bench.save_results("hard", [], [], path=path, provenance=prov)
    data = json.loads(path.read_text())
    assert data["gpu_slug"] == "test-gpu-1" and set(data["suites"]) == {"flash", "hard"}
    (loaded,) = bench.load_results(tmp_path)
    ((p, records),) = bench.suite_records([loaded], "flash")
    assert records[0]["ms"] == 1.5 and p["gpu"] == "Test GPU 1"
    assert bench.suite_records([loaded], "hard") == []  # no records: nothing to draw
    assert "Test GPU 1" in bench.provenance_label(p) and "2026-01-02" in bench.provenance_label(p)


def test_no_results_means_an_empty_list(tmp_path):
    assert bench.load_results(tmp_path / "missing") == []


def test_slug():
    assert runtime.slug("NVIDIA H200") == "nvidia-h200"
    assert runtime.slug("Tesla T4") == "tesla-t4"
