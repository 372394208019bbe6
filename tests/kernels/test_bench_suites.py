"""kernels.hard.timing and kernels.deformable.timing: the timing that chapters 3 and 4
and their benchmark suites share, run on the CPU (Triton interpreter) with a fake timer
that calls each function once and reports a fixed time."""

import pytest
import torch

from kernels import runtime
from kernels.deformable import timing as deformable_timing
from kernels.hard import timing as hard_timing
from kernels.timing import bench
from kernels.timing.records import MIN_REPS, Record


def test_time_hard_times_every_case_in_the_suite_schema():
    timer, seen = bench.FakeTimer(), []
    recs = hard_timing.time_hard(
        [16, 32],
        (16,),
        batch=1,
        heads=2,
        topks=(2, 4),
        suite="hard",
        stage="sweep",
        timer=timer,
        log=seen.append,
    )
    per_n = [
        ("flash", "triton"),
        ("hard", "triton"),
        ("hard-sample", "triton"),
        ("topk2", "triton"),
        ("topk4", "triton"),
        ("hard", "naive"),
        ("topk2", "naive"),
        ("topk4", "naive"),
    ]
    assert [(r.op, r.impl) for r in recs] == per_n * 2 and seen == recs
    assert len(timer.calls) == len(recs)
    r = recs[3]
    assert (r.suite, r.mode, r.dtype, r.stage, r.error) == (
        "hard",
        "fwd",
        "float16",
        "sweep",
        None,
    )
    assert r.shape == {"B": 1, "H": 2, "N": 16, "d": 16, "causal": False, "topk": 2}
    assert r.stats["reps"] >= MIN_REPS
    qk = 2.0 * 1 * 2 * 16 * 16 * 16
    assert recs[0].tflops == pytest.approx(2 * qk / (r.ms * 1e-3) / 1e12)
    assert recs[1].tflops == pytest.approx(qk / (r.ms * 1e-3) / 1e12)
    # the Triton kernels and the naive versions agree on what they computed
    out = {(r.op, r.impl, r.shape["N"]): o for r, o in zip(recs, timer.calls)}
    for n in (16, 32):
        torch.testing.assert_close(
            out[("topk4", "triton", n)].float(),
            out[("topk4", "naive", n)].float(),
            atol=2e-3,
            rtol=2e-3,
        )


def test_time_hard_skips_naive_past_the_memory_cap_and_stops_at_the_deadline():
    recs = hard_timing.time_hard(
        [16],
        (16,),
        batch=1,
        heads=1,
        topks=(2,),
        naive_max_bytes=0,
        timer=bench.FakeTimer(),
    )
    assert {r.impl for r in recs} == {"triton"}
    assert (
        hard_timing.time_hard([16], (16,), timer=bench.FakeTimer(), deadline=0.0) == []
    )


TINY_LEVELS = [[6, 8], [3, 4]]
TINY_DAT = ("tiny-4x8", 1, 2, 1, 4, 8, 16, 2)


def test_time_deformable_times_msda_then_dat_in_the_suite_schema():
    timer = bench.FakeTimer()
    impls = {
        k: v
        for k, v in deformable_timing.dat_impls().items()
        if k in ("triton", "naive")
    }
    recs = deformable_timing.time_deformable(
        [12],
        [TINY_DAT],
        levels=TINY_LEVELS,
        dtypes=(torch.float32,),
        suite="deformable",
        stage="sweep",
        timer=timer,
    )[:4]
    assert [(r.op, r.impl, r.mode) for r in recs] == [
        ("msda", "triton", "fwd"),
        ("msda", "naive", "fwd"),
        ("msda", "triton", "fwd+bwd"),
        ("msda", "naive", "fwd+bwd"),
    ]
    assert recs[0].shape == {
        "B": 2,
        "L_q": 12,
        "H": 8,
        "D_h": 32,
        "levels": TINY_LEVELS,
        "S": 60,
        "P": 4,
    }
    assert {r.dtype for r in recs} == {"float32"}
    dat = deformable_timing.time_dat(
        [TINY_DAT], impls=impls, timer=timer, dtypes=("float32",)
    )
    assert [(r.impl, r.mode) for r in dat] == [
        ("triton", "fwd"),
        ("naive", "fwd"),
        ("triton", "fwd+bwd"),
        ("naive", "fwd+bwd"),
    ]
    assert dat[0].shape == {
        "name": "tiny-4x8",
        "B": 1,
        "H": 2,
        "G": 1,
        "N_q": 32,
        "H_f": 4,
        "W_f": 8,
        "N_s": 8,
        "d": 16,
        "r": 2,
    }
    flops = 4 * 1 * 2 * 32 * 8 * 16
    assert dat[2].tflops == pytest.approx(3.5 * flops / (dat[2].ms * 1e-3) / 1e12)


def test_time_dat_takes_a_shape_by_name_and_stops_at_the_deadline():
    named = deformable_timing.time_dat(["detection-50x84"], deadline=0.0)
    assert named == []  # nothing started; a name resolves before any timing
    with pytest.raises(KeyError):
        deformable_timing.time_dat(["no-such-shape"], timer=bench.FakeTimer())
    assert (
        deformable_timing.time_deformable(
            [12], [TINY_DAT], levels=TINY_LEVELS, deadline=0.0
        )
        == []
    )


@pytest.mark.skipif(
    runtime.HAS_CUDA and not runtime.INTERPRET, reason="CPU-only behaviour"
)
def test_the_chapter_cells_draw_recorded_rows_or_nothing(tmp_path):
    # On a CPU, live_or_recorded never calls the live timing: no files, nothing drawn.
    assert bench.live_or_recorded("hard", lambda: 1 / 0, tmp_path) == []
    assert bench.live_or_recorded("deformable", lambda: 1 / 0, tmp_path) == []


def test_speedups_come_from_measured_records_only():
    def rec(op, impl, n, ms):
        return Record(
            "hard",
            op,
            impl,
            "fwd",
            "float16",
            {"B": 2, "H": 16, "N": n, "d": 64, "causal": False},
            ms=ms,
        ).to_dict()

    rows = [
        rec("flash", "triton", 4096, 3.0),
        rec("hard", "triton", 4096, 1.5),
        rec("hard", "naive", 4096, 45.0),
        rec("topk16", "triton", 4096, 4.5),
        rec("topk16", "naive", 4096, None),
        rec("flash", "triton", 8192, None),
    ]
    n, found = hard_timing.speedups(rows)
    assert n == 4096 and found == {
        "hard: flash time / hard time": 2.0,
        "hard: naive time / Triton time": 30.0,
        "top-16: its time / flash time": 1.5,
    }
    assert hard_timing.speedups(rows, lengths=(8192,)) == (None, {})
    assert hard_timing.speedups([]) == (None, {})


def test_msda_is_timed_at_encoder_scale_with_every_pixel_a_query():
    timer = bench.FakeTimer()
    assert deformable_timing.ENCODER in deformable_timing.MSDA_QUERIES
    recs = deformable_timing.time_msda(
        [deformable_timing.ENCODER],
        levels=TINY_LEVELS,
        dtypes=(torch.float32,),
        modes=("fwd",),
        suite="deformable",
        timer=timer,
    )
    assert [(r.op, r.impl) for r in recs] == [("msda", "triton"), ("msda", "naive")]
    s = sum(h * w for h, w in TINY_LEVELS)
    assert recs[0].shape == {
        "B": 2,
        "L_q": s,
        "H": 8,
        "D_h": 32,
        "levels": TINY_LEVELS,
        "S": s,
        "P": 4,
        "name": "encoder",
    }
    assert len(timer.calls) == 2  # each implementation really ran, once
    # the inputs it timed: one query per pixel of the pyramid
    (value, loc, w), _, _ = deformable_timing.msda_inputs(
        2, recs[0].shape["L_q"], TINY_LEVELS, torch.float32
    )
    assert value.shape[1] == loc.shape[1] == w.shape[1] == s
    assert deformable_timing.msda_query_count(300, TINY_LEVELS) == 300
    for bad in (0, -3, 2.5, True, "decoder"):
        with pytest.raises(ValueError, match="queries"):
            deformable_timing.msda_query_count(bad, TINY_LEVELS)


def test_the_deformable_suite_times_encoder_scale_in_every_run(monkeypatch):
    from kernels.deformable import timing as suite_deformable

    seen = []
    monkeypatch.setattr(
        suite_deformable,
        "time_deformable",
        lambda queries, *a, **kw: seen.append(list(queries)) or [],
    )
    for quick, dry in ((False, True), (False, False), (True, False)):
        suite_deformable.run(quick=quick, deadline=float("inf"), dry=dry)
    dry_q, full_q, quick_q = seen
    assert deformable_timing.ENCODER in dry_q  # benchmarks/run.py --dry-run runs it
    assert full_q == [300, deformable_timing.ENCODER] and quick_q == [300]


def test_the_sparse_suite_dry(tmp_path):
    """kernels.sparse.timing on the CPU through benchmarks/run.py --dry-run: its
    checks pass, the goal and the sweep time every case once with the fake timer,
    and speedups reads the goal records."""
    import json

    from benchmarks import run
    from kernels.sparse import timing as sbench
    from kernels.timing import results

    assert "sparse" in run.SUITES and "sparse" in run.WEIGHTS
    args = ["--dry-run", "--suite", "sparse", "--results-dir", str(tmp_path)]
    assert run.main(args) == 0
    (path,) = tmp_path.glob("*.json")
    data = json.loads(path.read_text())
    assert results.validate_results(data) == []
    suite = data["suites"]["sparse"]
    assert len(suite["correctness"]) == 3
    assert all(c["ok"] for c in suite["correctness"]), suite["correctness"]
    recs = suite["records"]
    assert all(r["error"] is None for r in recs)
    goal = [(r["impl"], r["mode"]) for r in recs if r["stage"] == "goal"]
    assert goal == [
        ("select", "fwd"),
        ("sparse", "fwd"),
        ("select+sparse", "fwd"),
        ("flash-causal", "fwd"),
        ("sparse", "fwd+bwd"),
        ("flash-causal", "fwd+bwd"),
    ]
    assert sbench.speedups(recs) == {"vs_dense_flash": 1.0, "selection_share": 1.0}
    ops = {(r["op"], r["impl"]) for r in recs}
    assert ("sparse-tokens", "sparse") in ops and ("sparse-blocks", "select") in ops
    # the FLOPs count the keys the indices make visible (4 blocks of 16 at N = 32:
    # every earlier key, causal)
    q, k, _ = bench.random_qkv(1, 2, 32, 16, H_kv=1, dtype="bfloat16", seed=0)
    idx = sbench.select_blocks(q, k, 16, 4)
    assert sbench.visible_keys(idx, 32, 16) == sum(range(1, 33))
    assert recs[1]["shape"]["visible_pairs"] == 2 * sum(range(1, 33))
    assert sbench.visible_keys(idx[..., :1], 32, 16) == sum(range(1, 17)) * 2
