"""benchmarks/run.py and kernels/bench.py: the suite protocol and the results files.

No GPU here, so nothing is timed: these tests check the plumbing that a GPU run uses
(every result written goes to a temporary folder, never to benchmarks/results/).
"""

import importlib
import json

import pytest
import torch

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


# ---------------------------------------------------------------------------------
# kernels.bench's timing loops, run on the CPU with a fake timer: the timer calls the
# function once (so forward and backward really run) and reports a fixed time.
# ---------------------------------------------------------------------------------


class FakeTimer:
    def __init__(self, ms: float = 2.0):
        self.ms, self.calls, self.kw = ms, [], []

    def __call__(self, fn, **kw):
        self.calls.append(fn())
        self.kw.append(kw)
        return {"ms": self.ms, "peak_mem_bytes": 123}


def test_time_attention_times_every_case_on_cpu():
    timer = FakeTimer()
    impls = bench.attention_impls()
    assert set(impls) == {"triton", "naive", "sdpa"}
    recs = bench.time_attention([16, 32], impls, d=16, causal=(False, True), dtype="float32",
                                modes=("fwd", "fwd+bwd"), tokens=32, width=32, device="cpu",
                                timer=timer, warmup=1, rep=2)
    assert len(recs) == 2 * 2 * 3 * 2 == len(timer.calls)  # N x causal x impl x mode
    assert timer.kw[0] == {"warmup": 1, "rep": 2}
    r = recs[0]
    assert (r.suite, r.op, r.impl, r.mode, r.dtype) == ("live", "attention", "triton", "fwd",
                                                         "float32")
    assert r.shape == {"B": 2, "H": 2, "N_q": 16, "N_k": 16, "d": 16, "causal": False}
    assert r.ms == 2.0 and r.peak_mem_bytes == 123 and r.error is None
    assert r.tflops == pytest.approx(bench.attention_flops(2, 2, 16, 16, 16) / 2e-3 / 1e12)
    bwd = [rec for rec in recs if rec.mode == "fwd+bwd" and rec.shape["causal"]]
    assert bwd[0].shape["N_q"] == 16  # causal halves the FLOPs; the backward adds 2.5x
    assert bwd[0].tflops == pytest.approx(3.5 * 0.5 * r.tflops)
    # "fwd" returns the output, "fwd+bwd" the gradients of q, k and v; all implementations agree.
    outs = {(rec.impl, rec.mode, rec.shape["N_q"], rec.shape["causal"]): out
            for rec, out in zip(recs, timer.calls)}
    for (_impl, mode, n, causal), out in outs.items():
        ref = outs[("naive", mode, n, causal)]
        if mode == "fwd":
            assert out.shape == (32 // n, 2, n, 16)
            torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
        else:
            assert len(out) == 3
            for g, g_ref in zip(out, ref):
                torch.testing.assert_close(g, g_ref, atol=1e-4, rtol=1e-4)


def test_time_attention_records_oom_skips_refusing_sdpa_and_names_other_errors():
    def oom(q, k, v, causal):
        raise torch.cuda.OutOfMemoryError("out of memory")

    def refuses(q, k, v, causal):
        raise RuntimeError("No available kernel")

    impls = {"big": oom, "sdpa-flash": refuses}
    recs = bench.time_attention([8], impls, d=8, dtype="float32", device="cpu",
                                timer=FakeTimer())
    assert [(r.impl, r.error) for r in recs] == [("big", "OOM")]
    with pytest.raises(RuntimeError, match="broken fwd"):
        bench.time_attention([8], {"broken": refuses}, d=8, dtype="float32", device="cpu",
                             timer=FakeTimer())


def test_time_attention_stops_at_the_deadline_and_logs():
    seen = []
    impls = {"naive": bench.attention_impls()["naive"]}
    assert bench.time_attention([8], impls, d=8, dtype="float32", device="cpu",
                                timer=FakeTimer(), deadline=0.0) == []
    recs = bench.time_attention([8, 16], impls, d=8, dtype="float32", device="cpu",
                                timer=FakeTimer(), log=seen.append, batch=3, heads=1,
                                op="attention-memory", suite="flash")
    assert seen == recs and [r.shape["B"] for r in recs] == [3, 3]
    assert {(r.op, r.suite) for r in recs} == {("attention-memory", "flash")}


def test_time_tiles_runs_each_tile_pair_under_the_interpreter():
    recs = bench.time_tiles([16, 32], batch=1, heads=1, N=32, d=16, dtype="float32",
                            device=runtime.DEVICE, timer=FakeTimer())
    assert [(r.shape["BLOCK_M"], r.shape["BLOCK_N"]) for r in recs] == [
        (16, 16), (16, 32), (32, 16), (32, 32)]
    assert all(r.error is None and r.ms == 2.0 for r in recs)
    assert recs[0].shape["num_warps"] == 4 and recs[0].shape["num_stages"] == 2


def test_time_fn_is_the_default_timer_and_refuses_on_cpu():
    if runtime.HAS_CUDA and not runtime.INTERPRET:
        pytest.skip("CPU-only behaviour")
    with pytest.raises(RuntimeError, match="CUDA"):
        bench.time_attention([8], {"naive": bench.attention_impls()["naive"]}, d=8,
                             dtype="float32", device="cpu")


def test_live_or_recorded(tmp_path, monkeypatch):
    prov = {"gpu": "Test GPU", "capability": [9, 0], "torch": "t", "triton": "tr", "cuda": "c",
            "date": "2026-01-02"}
    rec = bench.Record("flash", "attention", "triton", "fwd", "float16",
                       {"B": 1, "H": 2, "N_q": 8, "N_k": 8, "d": 16, "causal": False}, ms=1.5)
    monkeypatch.setattr(runtime, "HAS_CUDA", False)
    assert bench.live_or_recorded("flash", lambda: 1 / 0, tmp_path) == []  # nothing recorded
    bench.save_results("flash", [rec], [], path=tmp_path / "test-gpu.json", provenance=prov)
    ((label, rows),) = bench.live_or_recorded("flash", lambda: 1 / 0, tmp_path)
    assert label.startswith("recorded: Test GPU") and rows[0]["ms"] == 1.5
    monkeypatch.setattr(runtime, "HAS_CUDA", True)
    monkeypatch.setattr(runtime, "INTERPRET", False)
    monkeypatch.setattr(runtime, "describe", lambda: prov)
    ((label, rows),) = bench.live_or_recorded("flash", lambda: [rec], tmp_path)
    assert label.startswith("measured live: Test GPU") and rows == [rec.to_dict()]


def test_live_records_draw_with_the_book_plotter():
    import matplotlib.pyplot as plt

    from attention import plots

    impls = {k: v for k, v in bench.attention_impls().items() if k != "triton"}
    recs = bench.time_attention([16, 32], impls, d=16, dtype="float32", device="cpu",
                                modes=("fwd", "fwd+bwd"), timer=FakeTimer())
    fig = plots.recorded_timing_figure([r.to_dict() for r in recs], "live", d=16,
                                       causal=False, dtype="float32")
    assert len(fig.axes) == 3 and fig.axes[0].get_ylabel().startswith("TFLOP/s")
    assert [len(line.get_xdata()) for line in fig.axes[0].lines] == [2, 2]
    plt.close(fig)
