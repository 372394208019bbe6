"""Timing on a CUDA GPU and the recorded-results files the book plots.

``time_fn`` is the median of ``triton.testing.do_bench`` after a warm-up, plus the
peak memory the call allocated. ``Record`` is one measured row; ``save_results``
merges a suite's rows into ``benchmarks/results/<gpu-slug>.json`` together with the
provenance (GPU name, capability, torch, triton and CUDA versions, date).
``load_results`` reads every recorded file back for the chapters; it never invents
a number: with no files it returns an empty list, and chapters say so.

Results file schema (one per GPU)::

    {"gpu": "NVIDIA H200", "gpu_slug": "nvidia-h200", "capability": [9, 0],
     "torch": "...", "triton": "...", "cuda": "...", "date": "...",
     "suites": {"flash": {"provenance": {...}, "correctness": [...], "records": [...]}}}

Each record: ``{"suite", "op", "impl", "mode", "dtype", "shape": {...}, "ms",
"tflops", "gbps", "peak_mem_bytes", "error"}``; ``error`` is null or e.g. "OOM".
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
from collections.abc import Callable

import torch

from . import runtime

RESULTS_DIR = pathlib.Path(__file__).resolve().parent.parent / "benchmarks" / "results"


@dataclasses.dataclass
class Record:
    suite: str
    op: str  # e.g. "attention"
    impl: str  # "triton", "naive", "sdpa-flash", ...
    mode: str  # "fwd" or "fwd+bwd"
    dtype: str
    shape: dict
    ms: float | None = None
    tflops: float | None = None
    gbps: float | None = None
    peak_mem_bytes: int | None = None
    error: str | None = None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def time_fn(fn: Callable[[], object], warmup: int = 25, rep: int = 100) -> dict:
    """Median milliseconds of ``fn()`` on the GPU and the peak memory one call allocates.

    Uses ``triton.testing.do_bench`` (which flushes L2 between runs) with
    ``return_mode="median"``. Raises RuntimeError without CUDA: there is nothing to time.
    """
    if not runtime.HAS_CUDA or runtime.INTERPRET:
        raise RuntimeError("time_fn needs a CUDA GPU (and TRITON_INTERPRET unset)")
    from triton.testing import do_bench

    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()  # warm-up call (compiles / autotunes) and peak-memory probe
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    ms = do_bench(fn, warmup=warmup, rep=rep, return_mode="median")
    return {"ms": float(ms), "peak_mem_bytes": int(peak)}


def measure(record: Record, fn: Callable[[], object], flops: float | None = None,
            bytes_moved: float | None = None, **kw) -> Record:
    """Time ``fn`` into ``record``; an out-of-memory error is recorded, not raised."""
    try:
        t = time_fn(fn, **kw)
    except torch.cuda.OutOfMemoryError:
        record.error = "OOM"
        torch.cuda.empty_cache()
        return record
    record.ms = t["ms"]
    record.peak_mem_bytes = t["peak_mem_bytes"]
    if flops is not None:
        record.tflops = flops / (t["ms"] * 1e-3) / 1e12
    if bytes_moved is not None:
        record.gbps = bytes_moved / (t["ms"] * 1e-3) / 1e9
    return record


def results_path(gpu: str | None = None) -> pathlib.Path:
    gpu = gpu or runtime.gpu_name()
    if gpu is None:
        raise RuntimeError("no GPU: nothing to name a results file after")
    return RESULTS_DIR / f"{runtime.slug(gpu)}.json"


def save_results(suite: str, records: list[Record], correctness: list[dict],
                 path: pathlib.Path | None = None, provenance: dict | None = None) -> pathlib.Path:
    """Merge one suite's measurements into the GPU's results file (other suites are kept)."""
    prov = provenance or runtime.describe()
    path = path or results_path(prov.get("gpu"))
    path.parent.mkdir(parents=True, exist_ok=True)
    data = json.loads(path.read_text()) if path.exists() else {}
    data.update({k: prov[k] for k in ("gpu", "capability", "torch", "triton", "cuda", "date")})
    data["gpu_slug"] = runtime.slug(prov["gpu"] or "unknown")
    data.setdefault("suites", {})[suite] = {
        "provenance": prov,
        "correctness": correctness,
        "records": [r.to_dict() if isinstance(r, Record) else r for r in records],
    }
    # strict JSON: json.dumps writes a float NaN/inf as a bare NaN/Infinity (never passing it
    # to ``default``), which is not JSON; they are written as null
    path.write_text(json.dumps(_finite(data), indent=1, sort_keys=True, default=_json_default,
                               allow_nan=False) + "\n")
    return path


def _finite(x):
    """``x`` with every non-finite float (NaN, +-inf) replaced by None, recursively."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


def _json_default(x):
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if hasattr(x, "item") and getattr(x, "ndim", None) == 0:  # NumPy / torch scalars
        return _finite(x.item())
    return str(x)


def load_results(results_dir: pathlib.Path | None = None) -> list[dict]:
    """Every recorded results file, newest first (an empty list when none are recorded)."""
    d = results_dir or RESULTS_DIR
    files = sorted(d.glob("*.json")) if d.exists() else []
    out = [json.loads(f.read_text()) for f in files]
    return sorted(out, key=lambda r: r.get("date") or "", reverse=True)


def suite_records(results: list[dict], suite: str) -> list[tuple[dict, list[dict]]]:
    """(provenance, records) for each GPU that recorded ``suite``."""
    out = []
    for r in results:
        s = r.get("suites", {}).get(suite)
        if s and s.get("records"):
            out.append((s.get("provenance", r), s["records"]))
    return out


def provenance_label(prov: dict) -> str:
    """'NVIDIA H200 · torch 2.11 · triton 3.6 · CUDA 12.8 · 2026-11-29' for figure captions."""
    date = (prov.get("date") or "")[:10]
    return (f"{prov.get('gpu')} · torch {prov.get('torch')} · triton {prov.get('triton')}"
            f" · CUDA {prov.get('cuda')} · {date}")
