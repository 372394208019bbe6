"""The benchmark record and its statistics, shared by the timing and results modules.

``Record`` (one timed case), ``MIN_REPS`` and ``STAT_KEYS`` (what a results file must
hold per case), ``spread`` (median, percentiles, IQR of the samples), ``RESULTS_DIR``,
``fwd_bwd_check`` (a suite's correctness row: a kernel and its gradients against fp64).
"""

from __future__ import annotations

import dataclasses
import math
import pathlib

RESULTS_DIR = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "results"


@dataclasses.dataclass
class Record:
    suite: str
    op: str  # e.g. "attention"
    impl: str  # "triton", "naive", "sdpa-flash", ...
    mode: str  # "fwd" or "fwd+bwd"
    dtype: str
    shape: dict
    ms: float | None = None  # median of the timed reps
    tflops: float | None = None
    gbps: float | None = None
    peak_mem_bytes: int | None = None
    error: str | None = None  # None, "OOM" or "unsupported" (``detail`` says why)
    stats: dict | None = None  # the timer's spread and protocol (see ``time_fn``)
    stage: str | None = None  # "goal" or "sweep" in a benchmarks/run.py file
    detail: str | None = None  # why a case failed (e.g. an SDPA backend's own words)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


#: Timed repetitions a benchmark file must have per case (``time_fn`` refuses fewer).
MIN_REPS = 20
#: Keys of ``Record.stats`` (and of ``time_fn``'s "stats"), every one always present.
STAT_KEYS = (
    "reps",
    "warmup",
    "median_ms",
    "min_ms",
    "max_ms",
    "mean_ms",
    "p20_ms",
    "p80_ms",
    "iqr_ms",
    "first_call_ms",
    "host_ms",
    "head_start_ms",
    "l2_flush",
    "cuda_graph",
    "host_sync",
    "timer",
)


def spread(samples_ms: list[float]) -> dict:
    """Median, min, max, mean, 20th/80th percentiles and IQR of ``samples_ms``."""
    if not samples_ms:
        raise ValueError("spread: no samples")
    xs = sorted(float(x) for x in samples_ms)

    def pct(p):  # linear interpolation between closest ranks (NumPy's default)
        pos = (len(xs) - 1) * p / 100
        lo, hi = math.floor(pos), math.ceil(pos)
        return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)

    return {
        "reps": len(xs),
        "median_ms": pct(50),
        "min_ms": xs[0],
        "max_ms": xs[-1],
        "mean_ms": sum(xs) / len(xs),
        "p20_ms": pct(20),
        "p80_ms": pct(80),
        "iqr_ms": pct(75) - pct(25),
    }


def clip_text(text: str, n: int = 600) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 3] + "..."


def fwd_bwd_check(name: str, o, ref, wrt) -> dict:
    """A correctness row of a suite's ``check``: the largest error of a kernel's
    output ``o`` against its fp64 reference ``ref`` (absolute) and of their
    gradients with respect to ``wrt`` for one random dO (relative to the reference
    gradient's largest entry, or 1), against the tolerance of ``o``'s dtype: bf16
    rounds the inputs and P to 8 bits (2^-8 relative) before the dots, fp32 dots
    err by a few 1e-6."""
    import torch

    do = torch.randn_like(o)
    got = torch.autograd.grad(o, wrt, do)
    want = torch.autograd.grad(ref, wrt, do.double())
    err = max(
        [(o.double() - ref).abs().max().item()]
        + [
            ((a.double() - b).abs().max() / max(1.0, b.abs().max())).item()
            for a, b in zip(got, want)
        ]
    )
    tol = 3e-2 if o.dtype == torch.bfloat16 else 1e-4
    return {"name": name, "max_err": err, "tol": tol, "ok": err < tol}
