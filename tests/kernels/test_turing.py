"""kernels.flash.turing: on sm_75 (faked here: no GPU) a chapter's timing cell prints
why the kernels lose on a T4, the measured peak memory of naive attention against the
kernel's, and the computed length at which naive attention stops fitting; elsewhere it
prints nothing. The memory measurement is faked too (it needs CUDA); the kernels it
measures really run, under the interpreter, at tiny lengths."""

import json
import math

import pytest

import kernels.flash  # noqa: F401  (its tile tables are made before anything is faked)
from kernels import runtime
from kernels.flash import timing as flash_timing
from kernels.flash import turing
from tests.conftest import ROOT

GIB = 2**30
REAL = {k: getattr(runtime, k) for k in ("HAS_CUDA", "INTERPRET", "capability")}


@pytest.fixture
def t4(monkeypatch):
    monkeypatch.setattr(runtime, "HAS_CUDA", True)
    monkeypatch.setattr(runtime, "INTERPRET", False)
    monkeypatch.setattr(runtime, "capability", lambda: (7, 5))
    monkeypatch.setattr(runtime, "gpu_name", lambda: "Tesla T4")
    monkeypatch.setattr(turing, "device_memory_bytes", lambda: 15 * GIB)


def fake_peaks(lengths, bh=8):
    """A stand-in for cuda_peak_bytes: runs fn, answers naive's N^2 scores and
    probabilities (fp16, fp32 softmax) or the kernel's O(N), in the order measured."""
    answers = iter(
        [
            v
            for n in lengths
            for v in ((2 + 4) * bh * n * n + 3 * bh * n * 128, bh * n * 132)
        ]
    )
    calls = []

    def measure(fn):
        # the kernels run here as on any CPU: under the interpreter, no CUDA
        faked = {k: getattr(runtime, k) for k in REAL}
        try:
            for k, v in REAL.items():
                setattr(runtime, k, v)
            calls.append(fn() is not None)
        finally:
            for k, v in faked.items():
                setattr(runtime, k, v)
        return next(answers)

    return measure, calls


def test_t4_report_on_sm75(t4):
    lengths = (32, 64)
    measure, calls = fake_peaks(lengths)
    lines = []
    assert turing.t4_report(lengths, out=lines.append, measure=measure)
    text = "\n".join(lines)
    assert calls == [True] * 4  # naive and the kernel, at each length, really ran
    assert lines[0].startswith("Note: this GPU is Tesla T4, compute capability 7.5")
    for phrase in (
        "Triton 3.2 and later compile tl.dot to plain FMA",
        "sm_75",
        "SDPA",
        "tensor cores",
        "L4 or A100",
        "memory",
    ):
        assert phrase in text, phrase
    table = [ln for ln in lines if ln.lstrip().startswith(("32 ", "64 "))]
    assert len(table) == 2 and "MiB" in table[0]
    per_n2 = ((6 * 8 * 64 * 64 + 3 * 8 * 64 * 128) - 8 * 64 * 132) / 64**2
    n_limit = int(math.sqrt(15 * GIB / per_n2))
    assert "computed from these bytes" in text and f"N = {n_limit:,}" in text
    assert "15.0 GiB" in text


def test_nothing_printed_elsewhere(monkeypatch):
    lines = []
    assert not turing.t4_report(out=lines.append)  # this machine: no GPU
    assert lines == []
    monkeypatch.setattr(runtime, "HAS_CUDA", True)
    monkeypatch.setattr(runtime, "INTERPRET", False)
    monkeypatch.setattr(runtime, "capability", lambda: (8, 9))  # an L4
    assert not turing.t4_report(out=lines.append) and lines == []
    assert not any(k.startswith("sdpa-") for k in turing.timed_impls())


def test_sdpa_backends_timed_beside_on_sm75(t4):
    names = set(turing.timed_impls())
    assert {"triton", "naive"} <= names
    assert {n for n in names if n.startswith("sdpa-")} == {
        n for n in flash_timing.SDPA_BACKENDS if n in names
    } and len(names) >= 4


def test_naive_limit_is_computed_from_the_bytes():
    rows = [
        {"N": 1024, "naive": 10 * 1024**2 + 5000, "triton": 5000},
        {"N": 2048, "naive": 10 * 2048**2 + 9000, "triton": 9000},
    ]
    assert turing.naive_limit(rows, 10 * 4096**2) == 4096
    with pytest.raises(ValueError, match="N\\^2"):
        turing.naive_limit([{"N": 8, "naive": 1, "triton": 1}], 100)


def test_every_chapter_timing_section_reports_on_t4():
    """A chapter's first cell that times live (``bench.live_or_recorded``) calls
    ``turing.t4_report()`` first, so its numbers never arrive unexplained on a T4."""
    for path in sorted((ROOT / "chapters").glob("*.ipynb")):
        timing = [
            src
            for cell in json.loads(path.read_text())["cells"]
            if cell["cell_type"] == "code"
            and "bench.live_or_recorded(" in (src := "".join(cell["source"]))
        ]
        if timing:
            first = timing[0]
            assert "turing.t4_report()" in first, path.name
            assert first.index("turing.t4_report()") < first.index("live_or_recorded")
