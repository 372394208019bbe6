"""benchmarks/run.py and kernels/timing/: the suite protocol and the results files.

No GPU here, so nothing is timed: these tests check the plumbing that a GPU run uses
(every result written goes to a temporary folder, never to benchmarks/results/).
"""

import importlib
import json

import pytest
import torch

from benchmarks import run
from kernels import runtime
from kernels.flash import timing as flash_timing
from kernels.timing import bench, results
from kernels.timing.records import MIN_REPS, RESULTS_DIR, STAT_KEYS, Record, spread


@pytest.mark.parametrize("name", run.SUITES)
def test_every_suite_follows_the_protocol(name):
    mod = importlib.import_module(f"kernels.{name}.timing")
    assert callable(mod.check) and callable(mod.run)
    assert name in run.available_suites() and name in run.WEIGHTS


@pytest.mark.skipif(
    runtime.HAS_CUDA and not runtime.INTERPRET, reason="CPU-only behaviour"
)
def test_run_refuses_to_time_on_cpu(capsys):
    assert run.main(["--suite", "flash"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


@pytest.mark.skipif(
    runtime.HAS_CUDA and not runtime.INTERPRET, reason="CPU-only behaviour"
)
def test_time_fn_refuses_without_a_gpu():
    with pytest.raises(RuntimeError, match="CUDA"):
        bench.time_fn(lambda: None)


def test_results_round_trip_keeps_other_suites_and_provenance(tmp_path):
    prov = {
        "gpu": "Test GPU 1",
        "capability": [9, 0],
        "torch": "t",
        "triton": "tr",
        "cuda": "c",
        "date": "2026-01-02T03:04:05+00:00",
    }
    path = tmp_path / "test-gpu-1.json"
    rec = Record(
        "flash",
        "attention",
        "triton",
        "fwd",
        "float16",
        {"B": 1, "H": 2, "N_q": 8, "N_k": 8, "d": 16, "causal": False},
        ms=1.5,
    )
    results.save_results(
        "flash",
        [rec],
        [{"name": "x", "max_err": 0.0, "tol": 1.0, "ok": True}],
        path=path,
        provenance=prov,
    )
    results.save_results("hard", [], [], path=path, provenance=prov)
    data = json.loads(path.read_text())
    assert data["gpu_slug"] == "test-gpu-1" and set(data["suites"]) == {"flash", "hard"}
    (loaded,) = results.load_results(tmp_path)
    ((p, records),) = results.suite_records([loaded], "flash")
    assert records[0]["ms"] == 1.5 and p["gpu"] == "Test GPU 1"
    assert results.suite_records([loaded], "hard") == []  # no records: nothing to draw
    assert "Test GPU 1" in results.provenance_label(p)
    assert "2026-01-02" in results.provenance_label(p)


def test_no_results_means_an_empty_list(tmp_path):
    assert results.load_results(tmp_path / "missing") == []


def test_slug():
    assert runtime.slug("NVIDIA H200") == "nvidia-h200"
    assert runtime.slug("Tesla T4") == "tesla-t4"


# ---------------------------------------------------------------------------------
# kernels.timing.bench's timing loops, run on the CPU with a fake timer: the timer calls
# the function once (so forward and backward really run) and reports a fixed time.
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
    impls = flash_timing.attention_impls()
    assert set(impls) == {"triton", "naive", "sdpa"}
    recs = bench.time_attention(
        [16, 32],
        impls,
        d=16,
        causal=(False, True),
        dtype="float32",
        modes=("fwd", "fwd+bwd"),
        tokens=32,
        width=32,
        device="cpu",
        timer=timer,
        warmup=1,
        rep=2,
    )
    assert len(recs) == 2 * 2 * 3 * 2 == len(timer.calls)  # N x causal x impl x mode
    assert timer.kw[0] == {"warmup": 1, "rep": 2}
    r = recs[0]
    assert (r.suite, r.op, r.impl, r.mode, r.dtype) == (
        "live",
        "attention",
        "triton",
        "fwd",
        "float32",
    )
    assert r.shape == {"B": 2, "H": 2, "N_q": 16, "N_k": 16, "d": 16, "causal": False}
    assert r.ms == 2.0 and r.peak_mem_bytes == 123 and r.error is None
    assert r.tflops == pytest.approx(
        bench.attention_flops(2, 2, 16, 16, 16) / 2e-3 / 1e12
    )
    bwd = [rec for rec in recs if rec.mode == "fwd+bwd" and rec.shape["causal"]]
    assert bwd[0].shape["N_q"] == 16  # causal halves the FLOPs; the backward adds 2.5x
    assert bwd[0].tflops == pytest.approx(3.5 * 0.5 * r.tflops)
    # "fwd" returns the output, "fwd+bwd" the gradients of q, k and v; all
    # implementations agree.
    outs = {
        (rec.impl, rec.mode, rec.shape["N_q"], rec.shape["causal"]): out
        for rec, out in zip(recs, timer.calls)
    }
    for (_impl, mode, n, causal), out in outs.items():
        ref = outs[("naive", mode, n, causal)]
        if mode == "fwd":
            assert out.shape == (32 // n, 2, n, 16)
            torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
        else:
            assert len(out) == 3
            for g, g_ref in zip(out, ref):
                torch.testing.assert_close(g, g_ref, atol=1e-4, rtol=1e-4)


def test_time_attention_records_oom_and_refusing_sdpa_and_names_other_errors():
    def oom(q, k, v, causal):
        raise torch.cuda.OutOfMemoryError("out of memory")

    def refuses(q, k, v, causal):
        import warnings

        warnings.warn("Flash attention requires head dim <= 256", stacklevel=2)
        raise RuntimeError("No available kernel")

    impls = {"big": oom, "sdpa-flash": refuses}
    recs = bench.time_attention(
        [8], impls, d=8, dtype="float32", device="cpu", timer=FakeTimer()
    )
    assert [(r.impl, r.error) for r in recs] == [
        ("big", "OOM"),
        ("sdpa-flash", "unsupported"),
    ]
    assert "No available kernel" in recs[1].detail
    assert "head dim <= 256" in recs[1].detail
    with pytest.raises(RuntimeError, match="broken fwd"):
        bench.time_attention(
            [8],
            {"broken": refuses},
            d=8,
            dtype="float32",
            device="cpu",
            timer=FakeTimer(),
        )


def test_time_attention_stops_at_the_deadline_and_logs():
    seen = []
    impls = {"naive": flash_timing.attention_impls()["naive"]}
    assert (
        bench.time_attention(
            [8],
            impls,
            d=8,
            dtype="float32",
            device="cpu",
            timer=FakeTimer(),
            deadline=0.0,
        )
        == []
    )
    recs = bench.time_attention(
        [8, 16],
        impls,
        d=8,
        dtype="float32",
        device="cpu",
        timer=FakeTimer(),
        log=seen.append,
        batch=3,
        heads=1,
        op="attention-memory",
        suite="flash",
    )
    assert seen == recs and [r.shape["B"] for r in recs] == [3, 3]
    assert {(r.op, r.suite) for r in recs} == {("attention-memory", "flash")}


def test_time_tiles_runs_each_tile_pair_under_the_interpreter():
    recs = flash_timing.time_tiles(
        [16, 32],
        batch=1,
        heads=1,
        N=32,
        d=16,
        dtype="float32",
        device=runtime.DEVICE,
        timer=FakeTimer(),
    )
    assert [(r.shape["BLOCK_M"], r.shape["BLOCK_N"]) for r in recs] == [
        (16, 16),
        (16, 32),
        (32, 16),
        (32, 32),
    ]
    assert all(r.error is None and r.ms == 2.0 for r in recs)
    assert recs[0].shape["num_warps"] == 4 and recs[0].shape["num_stages"] == 2


def test_time_fn_is_the_default_timer_and_refuses_on_cpu():
    if runtime.HAS_CUDA and not runtime.INTERPRET:
        pytest.skip("CPU-only behaviour")
    with pytest.raises(RuntimeError, match="CUDA"):
        bench.time_attention(
            [8],
            {"naive": flash_timing.attention_impls()["naive"]},
            d=8,
            dtype="float32",
            device="cpu",
        )


def test_live_or_recorded(tmp_path, monkeypatch):
    prov = {
        "gpu": "Test GPU",
        "capability": [9, 0],
        "torch": "t",
        "triton": "tr",
        "cuda": "c",
        "date": "2026-01-02",
    }
    rec = Record(
        "flash",
        "attention",
        "triton",
        "fwd",
        "float16",
        {"B": 1, "H": 2, "N_q": 8, "N_k": 8, "d": 16, "causal": False},
        ms=1.5,
    )
    monkeypatch.setattr(runtime, "HAS_CUDA", False)
    # nothing recorded
    assert bench.live_or_recorded("flash", lambda: 1 / 0, tmp_path) == []
    results.save_results(
        "flash", [rec], [], path=tmp_path / "test-gpu.json", provenance=prov
    )
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

    impls = {k: v for k, v in flash_timing.attention_impls().items() if k != "triton"}
    recs = bench.time_attention(
        [16, 32],
        impls,
        d=16,
        batch=2,  # not tokens // N = 1,024 sequences: the figure is under test here
        heads=2,
        dtype="float32",
        device="cpu",
        modes=("fwd", "fwd+bwd"),
        timer=FakeTimer(),
    )
    fig = plots.recorded_timing_figure(
        [r.to_dict() for r in recs], "live", d=16, causal=False, dtype="float32"
    )
    assert len(fig.axes) == 3 and fig.axes[0].get_ylabel().startswith("TFLOP/s")
    assert [len(line.get_xdata()) for line in fig.axes[0].lines] == [2, 2]
    plt.close(fig)


# ---------------------------------------------------------------------------------
# The protocol of a GPU run (issue 14), proven on the CPU: benchmarks/run.py --dry-run.
# ---------------------------------------------------------------------------------


def test_goal_shapes_are_the_issues():
    from kernels.flash import timing as suite_flash

    assert suite_flash.GOAL == {
        "dtype": "bfloat16",
        "d": 128,
        "N": 16384,
        "B": 1,
        "H": 16,
    }
    assert suite_flash.GOAL_CASES == [
        ("fwd", False),
        ("fwd", True),
        ("fwd+bwd", False),
        ("fwd+bwd", True),
    ]
    assert suite_flash.TIMING["rep"] >= MIN_REPS
    assert set(flash_timing.SDPA_BACKENDS) == {
        "sdpa-cudnn",
        "sdpa-flash",
        "sdpa-efficient",
        "sdpa-math",
    }


@pytest.mark.slow
@pytest.mark.skipif(runtime.HAS_CUDA and not runtime.INTERPRET, reason="CPU dry run")
def test_dry_run_proves_the_order_and_the_schema(tmp_path, capsys):
    from kernels.flash import forward_tma
    from kernels.flash import timing as suite_flash

    before = sorted(RESULTS_DIR.glob("*")) if RESULTS_DIR.exists() else []
    assert run.main(["--dry-run", "--results-dir", str(tmp_path)]) == 0
    after = sorted(RESULTS_DIR.glob("*")) if RESULTS_DIR.exists() else []
    assert before == after  # nothing written into benchmarks/results/
    (path,) = tmp_path.glob("*.json")
    data = json.loads(path.read_text())
    assert results.validate_results(data) == []
    proto = data["protocol"]
    assert proto["dry_run"] and proto["timer"] == "fake" and proto["min_reps"] >= 20
    events = proto["events"]
    assert [e["seq"] for e in events] == list(range(len(events)))
    kinds = [(e["phase"], e["event"]) for e in events]
    checks = [i for i, k in enumerate(kinds) if k == ("check", "check")]
    goal = [i for i, k in enumerate(kinds) if k == ("goal", "time")]
    sweep = [i for i, k in enumerate(kinds) if k == ("sweep", "time")]
    # correctness of every suite before any timing; the goal shapes before any sweep
    assert [events[i]["suite"] for i in checks] == run.SUITES
    assert all(events[i]["failed"] == 0 for i in checks)
    assert goal and sweep and max(checks) < min(goal) and max(goal) < min(sweep)
    assert {events[i]["suite"] for i in sweep} == set(run.SUITES)
    flash = data["suites"]["flash"]
    stages = [r["stage"] for r in flash["records"]]
    n_goal = stages.count("goal")
    assert stages == ["goal"] * n_goal + ["sweep"] * (len(stages) - n_goal)
    impls = ["triton", "naive", *flash_timing.SDPA_BACKENDS]
    goal_recs = flash["records"][:n_goal]
    n_std = len(suite_flash.GOAL_CASES) * len(impls)
    assert [
        (r["mode"], r["shape"]["causal"], r["impl"]) for r in goal_recs[:n_std]
    ] == [(m, c, i) for m, c in suite_flash.GOAL_CASES for i in impls]
    # every forward path checked (all pass under the interpreter); the non-default ones
    # timed after the goal cases, forward only
    fp = flash["forward_paths"]
    assert fp["default"] == "pointer"
    assert list(fp["paths"]) == list(forward_tma.FORWARD_PATHS)
    for p, r in fp["paths"].items():
        assert r["ok"] and r["error"] is None, (p, r)
        assert r["checks"] and all(
            c["ok"] and c["name"].startswith(p) for c in r["checks"]
        )
        assert r["max_err"] == max(c["max_err"] for c in r["checks"])
    # then the fused backward (its checks passed in the same run), then the TMA paths
    assert [
        (r["mode"], r["shape"]["causal"], r["impl"]) for r in goal_recs[n_std:]
    ] == [("fwd+bwd", c, "triton-fused-bwd") for c in (False, True)] + [
        (m, c, f"triton-{p}")
        for m, c in suite_flash.PATH_GOAL_CASES
        for p in ("tma", "tma-ws")
    ]
    assert any(
        c["name"].startswith("fused-bwd-") and c["ok"]
        for c in data["suites"]["flash"]["correctness"]
    )
    assert all(r["ms"] is not None for r in goal_recs[n_std:])
    path_events = [e for e in events if e["event"] == "check-paths"]
    assert [e["suite"] for e in path_events] == ["flash"]
    assert path_events[0]["phase"] == "check" and all(path_events[0]["paths"].values())
    assert {r["dtype"] for r in goal_recs} == {suite_flash.DRY_GOAL["dtype"]}
    for r in (
        data["suites"]["hard"]["records"] + data["suites"]["deformable"]["records"]
    ):
        assert r["stage"] == "sweep" and r["stats"]["reps"] >= MIN_REPS
    # every SDPA backend is a record: timed, or failed with its reason
    for r in goal_recs:
        assert (r["ms"] is not None) != (
            r["error"] == "unsupported" and bool(r["detail"])
        )
    # the summary: causal and non-causal apart, the best SDPA that ran named
    rows = [s for s in flash["summary"] if s["stage"] == "goal"]
    assert [(s["mode"], s["causal"]) for s in rows] == suite_flash.GOAL_CASES
    for s in rows:
        assert s["speedup_vs_naive"] is not None and s["best_sdpa"] in s["sdpa_ms"]
        assert s["sdpa_ms"][s["best_sdpa"]] is not None
        assert set(s["sdpa_failed"]) == {
            n for n, t in s["sdpa_ms"].items() if t is None
        }
    # provenance: every GPU field present, null only with its reason
    prov = flash["provenance"]
    assert all(k in prov for k in results.GPU_FIELDS)
    assert prov["sm_count"] is None and "no CUDA" in prov["missing"]["sm_count"]
    out = capsys.readouterr().out
    assert out.index("check") < out.index("goal fwd non-causal")


@pytest.mark.skipif(runtime.HAS_CUDA and not runtime.INTERPRET, reason="CPU dry run")
def test_a_failing_forward_path_is_recorded_and_not_timed(monkeypatch):
    from kernels.flash import forward_tma
    from kernels.flash import timing as suite_flash

    real = forward_tma.tma_lse  # what forward_tma.forward launches through

    def broken_ws(q, k, v, causal, scale, warp_specialize=False):
        if warp_specialize:
            raise RuntimeError("PassManager::run failed\nmore detail")
        o, lse2 = real(q, k, v, causal, scale)
        return o, lse2 + 1.0 if causal else lse2  # wrong lse: the check must see it

    monkeypatch.setattr(forward_tma, "tma_lse", broken_ws)
    res = suite_flash.check_paths(dry=True)["paths"]
    assert res["pointer"]["ok"] and res["pointer"]["error"] is None
    assert not res["tma"]["ok"] and res["tma"]["error"] is None
    assert any(not c["ok"] and c["name"].endswith("-lse") for c in res["tma"]["checks"])
    assert not res["tma-ws"]["ok"] and res["tma-ws"]["checks"] == []
    assert res["tma-ws"]["error"] == "RuntimeError: PassManager::run failed"
    assert suite_flash.passed_paths({"default": "pointer", "paths": res}) == []
    ok = {p: {**r, "ok": True} for p, r in res.items()}
    assert suite_flash.passed_paths({"default": "pointer", "paths": ok}) == [
        "tma",
        "tma-ws",
    ]


def _row(impl, ms, causal=False, mode="fwd", error=None):
    return Record(
        "flash",
        "attention",
        impl,
        mode,
        "bfloat16",
        {"B": 1, "H": 16, "N_q": 64, "N_k": 64, "d": 128, "causal": causal},
        ms=ms,
        error=error,
        stage="goal",
    ).to_dict()


def test_summary_names_the_best_sdpa_and_keeps_causal_apart():
    rows = results.summarize(
        [
            _row("triton", 2.0),
            _row("naive", 3.0),
            _row("sdpa-flash", 1.8),
            _row("sdpa-cudnn", 1.5),
            _row("sdpa-efficient", None, error="unsupported"),
            _row("triton", 1.0, True),
            _row("naive", 4.0, True),
            _row("sdpa-math", 9.0, True),
            _row("triton", 9.0, mode="fwd+bwd"),
        ]
    )
    nc, c, bwd = rows
    assert (nc["best_sdpa"], nc["best_sdpa_ms"], nc["speedup_vs_naive"]) == (
        "sdpa-cudnn",
        1.5,
        1.5,
    )
    assert nc["best_sdpa_vs_triton"] == pytest.approx(0.75)
    assert set(nc["sdpa_failed"]) == {"sdpa-efficient"}
    assert (c["causal"], c["best_sdpa"], c["speedup_vs_naive"]) == (
        True,
        "sdpa-math",
        4.0,
    )
    assert bwd["best_sdpa"] is None and bwd["naive_ms"] is None
    assert bwd["speedup_vs_naive"] is None


def test_spread_and_fake_timer():
    s = spread([5.0, 1.0, 2.0, 3.0, 4.0])
    assert (s["reps"], s["median_ms"], s["min_ms"], s["max_ms"]) == (5, 3.0, 1.0, 5.0)
    assert s["p20_ms"] == pytest.approx(1.8) and s["p80_ms"] == pytest.approx(4.2)
    assert s["iqr_ms"] == pytest.approx(2.0)
    timer = bench.FakeTimer()
    t = timer(lambda: 7)
    assert timer.calls == [7] and set(STAT_KEYS) <= set(t["stats"])
    assert t["stats"]["reps"] == MIN_REPS and t["ms"] == t["stats"]["median_ms"]
    with pytest.raises(ValueError, match="at least"):
        timer(lambda: 7, rep=MIN_REPS - 1)


def test_gpu_provenance_reads_nvidia_smi_and_says_why_a_field_is_missing():
    def smi(fields):
        values = {
            "driver_version": "570.86",
            "clocks.sm": "1980",
            "mig.mode.current": "Disabled",
            "power.limit": "700.00",
            "clocks.max.mem": "[N/A]",
        }
        return ", ".join(values.get(f, "1") for f in fields) + "\n"

    prov = results.gpu_provenance(smi)
    assert prov["driver"] == "570.86" and prov["clock_sm_mhz"] == 1980.0
    assert prov["mig_mode"] == "Disabled" and prov["power_limit_w"] == 700.0
    assert prov["clock_mem_max_mhz"] is None
    assert "[N/A]" in prov["missing"]["clock_mem_max_mhz"]

    def broken(fields):
        raise FileNotFoundError("nvidia-smi not found on PATH")

    prov = results.gpu_provenance(broken)
    assert prov["driver"] is None and "not found" in prov["missing"]["driver"]


def test_validate_results_finds_problems():
    bad = {
        "suites": {
            "flash": {
                "provenance": {},
                "correctness": [{"name": "x"}],
                "summary": [],
                "records": [_row("triton", 1.0), _row("naive", None)],
            }
        }
    }
    problems = results.validate_results(bad)
    assert any("top level: no 'gpu'" in p for p in problems)
    assert any("stats lacks" in p for p in problems)
    assert any("neither ms nor error" in p for p in problems)
    assert any("'driver'" in p for p in problems)
    assert any("correctness[0]" in p for p in problems)
