"""Timing on a CUDA GPU and the recorded-results files the book plots: the book's one
timing path (chapters and ``benchmarks/`` both time through here).

``time_fn`` is the median of ``triton.testing.do_bench`` after a warm-up, plus the
peak memory the call allocated. ``Record`` is one measured row and ``measure`` fills
one. ``time_attention`` times attention implementations over sequence lengths and
``time_tiles`` the forward kernel over BLOCK_M x BLOCK_N; ``live_or_recorded`` is what
a chapter's timing cell draws: live rows on a GPU, recorded ones elsewhere.
``save_results`` merges a suite's rows into ``benchmarks/results/<gpu-slug>.json`` together with the
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
import time
from collections.abc import Callable, Iterable

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
            bytes_moved: float | None = None, timer: Callable[..., dict] | None = None,
            **kw) -> Record:
    """Time ``fn`` into ``record``; an out-of-memory error is recorded, not raised.

    ``timer(fn, **kw)`` returns ``{"ms", "peak_mem_bytes"}``: ``time_fn`` unless given
    (tests pass a fake one to run the plumbing on a CPU).
    """
    try:
        t = (timer or time_fn)(fn, **kw)
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


# ---------------------------------------------------------------------------------
# Attention over sequence lengths, and the forward kernel over tile sizes.
# ---------------------------------------------------------------------------------


def attention_flops(B: int, H: int, N_q: int, N_k: int, d: int, causal: bool = False,
                    mode: str = "fwd") -> float:
    """Matmul FLOPs of attention: 4 B H N_q N_k d forward (S = Q K^T and P V), halved when
    causal. Forward + backward counts 3.5x the forward (the backward does 2.5x: five
    matmuls, one of them the recomputation of S)."""
    f = 4.0 * B * H * N_q * N_k * d * (0.5 if causal else 1.0)
    return f * (3.5 if mode == "fwd+bwd" else 1.0)


def attention_impls(sdpa_backends: bool = False) -> dict[str, Callable]:
    """The implementations chapters and suites time, each ``fn(q, k, v, causal)``.

    "triton" (``kernels.flash``), "naive" (``kernels.naive``: S and P in HBM) and PyTorch's
    scaled_dot_product_attention: one "sdpa" (PyTorch picks the backend) or, with
    ``sdpa_backends``, "sdpa-flash", "sdpa-efficient" and "sdpa-cudnn", each pinned to
    one backend (those this torch has).
    """
    import torch.nn.functional as F

    from .flash import flash_attention
    from .naive import naive_attention

    impls = {"triton": lambda q, k, v, causal: flash_attention(q, k, v, causal=causal),
             "naive": lambda q, k, v, causal: naive_attention(q, k, v, causal=causal)}
    if not sdpa_backends:
        impls["sdpa"] = lambda q, k, v, causal: F.scaled_dot_product_attention(
            q, k, v, is_causal=causal)
        return impls
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def pinned(backend):
        def attn(q, k, v, causal):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return attn

    for name, attr in (("sdpa-flash", "FLASH_ATTENTION"),
                       ("sdpa-efficient", "EFFICIENT_ATTENTION"),
                       ("sdpa-cudnn", "CUDNN_ATTENTION")):
        if hasattr(SDPBackend, attr):
            impls[name] = pinned(getattr(SDPBackend, attr))
    return impls


def _torch_dtype(dtype) -> tuple[torch.dtype, str]:
    dt = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    return dt, str(dt).removeprefix("torch.")


def random_qkv(B: int, H: int, N_q: int, d: int, *, H_kv: int | None = None,
               N_k: int | None = None, dtype="float16", device=None, seed: int = 0,
               grad: bool = False) -> list[torch.Tensor]:
    """Standard-normal q (B, H, N_q, d) and k, v (B, H_kv, N_k, d), drawn in that order from
    a generator seeded with ``seed`` on ``device`` (default ``runtime.DEVICE``)."""
    dt, _ = _torch_dtype(dtype)
    device = runtime.DEVICE if device is None else device
    g = torch.Generator(device=device).manual_seed(seed)
    h_kv, n_k = H if H_kv is None else H_kv, N_q if N_k is None else N_k
    return [torch.randn(shape, generator=g, device=device, dtype=dt).requires_grad_(grad)
            for shape in ((B, H, N_q, d), (B, h_kv, n_k, d), (B, h_kv, n_k, d))]


def _step(attn, mode: str, q, k, v, causal: bool, do) -> Callable[[], object]:
    """One forward (no autograd graph), or one forward and its backward of ``do``."""
    if mode == "fwd":
        def fn():
            with torch.no_grad():
                return attn(q, k, v, causal)
    elif mode == "fwd+bwd":
        def fn():
            return torch.autograd.grad(attn(q, k, v, causal), (q, k, v), do)
    else:
        raise ValueError(f"mode must be 'fwd' or 'fwd+bwd', got {mode!r}")
    return fn


def time_attention(lengths: Iterable[int], impls: dict[str, Callable] | None = None, *,
                   d: int = 64, causal: bool | tuple = False, dtype="float16",
                   modes: tuple = ("fwd",), batch: int | None = None,
                   heads: int | None = None, tokens: int = 16 * 1024, width: int = 1024,
                   suite: str = "live", op: str = "attention", device=None, seed: int = 0,
                   timer: Callable[..., dict] | None = None, deadline: float | None = None,
                   progress: bool = False, log: Callable[[Record], None] | None = None,
                   **timing) -> list[Record]:
    """Time attention at each sequence length N = N_q = N_k: one Record per case.

    Shapes: q, k, v are (B, H, N, d) in ``dtype`` with B = ``batch`` or tokens // N (at
    least 1) and H = ``heads`` or width // d, so every N does similar work per token.
    ``causal`` is a bool or a tuple of them; ``modes`` holds "fwd" (no autograd graph)
    and/or "fwd+bwd" (forward, then the gradients of a random dO). ``impls`` maps a name
    to ``fn(q, k, v, causal)`` (default ``attention_impls()``).

    Out of memory is recorded (error "OOM"), not raised; an SDPA implementation that
    refuses the shape or GPU is left out; any other error is raised, naming the case.
    ``timer`` defaults to ``time_fn`` (CUDA only; ``timing`` passes warmup and rep to it).
    Past ``deadline`` (``time.monotonic()``) no new case starts. ``log(record)`` is called
    after each case; ``progress`` shows a bar over the lengths.
    """
    impls = attention_impls() if impls is None else impls
    dt, dt_name = _torch_dtype(dtype)
    device = runtime.DEVICE if device is None else device
    causals = (causal,) if isinstance(causal, bool) else tuple(causal)
    grad = "fwd+bwd" in modes
    lengths = list(lengths)
    if progress:
        from tqdm.auto import tqdm

        lengths = tqdm(lengths, desc="timing")
    records: list[Record] = []
    for N in lengths:
        B = batch or max(1, tokens // N)
        H = heads or max(1, width // d)
        try:
            q, k, v = random_qkv(B, H, N, d, dtype=dt, device=device, seed=seed, grad=grad)
            do = torch.randn_like(q) if grad else None  # (B, H, N, d)
        except torch.cuda.OutOfMemoryError:  # the inputs alone do not fit
            q = k = v = do = None
        cases = [(c, name, attn, mode) for c in causals for name, attn in impls.items()
                 for mode in modes]
        for c, name, attn, mode in cases:
            if deadline is not None and time.monotonic() > deadline:
                return records
            rec = Record(suite, op, name, mode, dt_name,
                         {"B": B, "H": H, "N_q": N, "N_k": N, "d": d, "causal": c})
            if q is None:
                rec.error = "OOM"
            else:
                try:
                    measure(rec, _step(attn, mode, q, k, v, c, do), timer=timer,
                            flops=attention_flops(B, H, N, N, d, c, mode), **timing)
                except torch.cuda.OutOfMemoryError:
                    rec.error = "OOM"
                except RuntimeError as e:
                    if name.startswith("sdpa"):  # a backend without this GPU/shape/dtype
                        continue
                    raise RuntimeError(f"{name} {mode} {rec.shape} {dt_name}: {e}") from e
            records.append(rec)
            if log is not None:
                log(rec)
        q = k = v = do = None
        torch.cuda.empty_cache()
    return records


def time_tiles(blocks: Iterable[int] = (16, 32, 64, 128), *, batch: int = 4, heads: int = 32,
               N: int = 4096, d: int = 64, causal: bool = False, dtype="float16",
               num_stages: int = 2, suite: str = "live", device=None, seed: int = 0,
               timer: Callable[..., dict] | None = None, deadline: float | None = None,
               log: Callable[[Record], None] | None = None, **timing) -> list[Record]:
    """Forward time of ``kernels.flash`` at each BLOCK_M x BLOCK_N, autotuner bypassed.

    One Record per tile pair, the tiles and warps in its shape (8 warps from 128 x 64 up,
    else 4). A tile that does not fit this GPU is a result: its error names why.
    """
    from .flash import forward_with_tiles

    _, dt_name = _torch_dtype(dtype)
    q, k, v = random_qkv(batch, heads, N, d, dtype=dtype, device=device, seed=seed)
    shape = {"B": batch, "H": heads, "N_q": N, "N_k": N, "d": d, "causal": causal}
    records: list[Record] = []
    blocks = list(blocks)
    for bm in blocks:
        for bn in blocks:
            if deadline is not None and time.monotonic() > deadline:
                return records
            warps = 8 if bm * bn >= 128 * 64 else 4
            rec = Record(suite, "attention", "triton", "fwd", dt_name,
                         {**shape, "BLOCK_M": bm, "BLOCK_N": bn, "num_warps": warps,
                          "num_stages": num_stages})
            fn = lambda bm=bm, bn=bn, w=warps: forward_with_tiles(  # noqa: E731
                q, k, v, bm, bn, causal=causal, num_warps=w, num_stages=num_stages)
            try:
                measure(rec, fn, timer=timer,
                        flops=attention_flops(batch, heads, N, N, d, causal), **timing)
            except Exception as e:  # noqa: BLE001 - a tile that does not fit is a result
                rec.error = type(e).__name__
            records.append(rec)
            if log is not None:
                log(rec)
    return records


def live_or_recorded(suite: str, live: Callable[[], list[Record]],
                     results_dir: pathlib.Path | None = None) -> list[tuple[str, list[dict]]]:
    """What a chapter's timing cell draws: a list of ``(label, records as dicts)``.

    On a CUDA GPU, ``live()`` measured now, labelled "measured live: <provenance>";
    elsewhere each recorded GPU's rows of ``suite``, labelled "recorded: <provenance>".
    An empty list means nothing is recorded: the chapter says so and invents nothing.
    """
    if runtime.HAS_CUDA and not runtime.INTERPRET:
        rows = [r.to_dict() if isinstance(r, Record) else r for r in live()]
        return [("measured live: " + provenance_label(runtime.describe()), rows)]
    return [("recorded: " + provenance_label(prov), records)
            for prov, records in suite_records(load_results(results_dir), suite)]


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
