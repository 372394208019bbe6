"""Timing on a CUDA GPU: the book's one timing path (chapters and every family's suite,
``kernels/<family>/timing.py``, time through here). An engine: it imports no kernel
family; the implementations to time are passed in. The recorded-results files it
writes and the chapters read are ``kernels.timing.results``; the record and its
statistics, ``kernels.timing.records``.

``time_fn`` times a call with a fixed protocol: the first call (compile, autotune) and a
peak-memory / host-sync probe apart, then at least ``MIN_REPS`` timed reps, each after
the same L2 flush and a GPU spin that lets the host queue the call first, between CUDA
events around the call only; it reports the median and the spread (min, max, p20, p80,
IQR). ``FakeTimer`` stands in for it on a CPU (``benchmarks/run.py --dry-run``).
``measure`` fills one measured row (a ``Record``). ``time_attention`` times the
attention implementations it is given over sequence lengths (for example
``kernels.flash.timing.attention_impls(sdpa_backends=True)``: each SDPA backend on its
own; a backend that refuses is recorded with its reasons);
``live_or_recorded`` is what a chapter's timing cell draws: live rows on a GPU, recorded
ones elsewhere. ``gpu_provenance`` adds the GPU's state (SM count, clocks, power limit,
MIG mode, driver) to ``runtime.describe()``; ``summarize`` names the best SDPA backend
that ran and the speed-up against naive per case (causal and not apart); both are in
``kernels.timing.results``.
``save_results`` merges a suite's rows into ``benchmarks/results/<gpu-slug>.json`` and
``validate_results`` checks such a file. ``load_results`` reads every recorded file back
for the chapters; it never invents a number: with no files it returns an empty list, and
chapters say so.

Results file schema (one per GPU)::

    {"gpu": "NVIDIA H200", "gpu_slug": "nvidia-h200", "capability": [9, 0],
     "torch": "...", "triton": "...", "cuda": "...", "date": "...",
     "protocol": {"dry_run", "phases", "budget_s", "timer", "min_reps",
                  "events": [...]},
     "suites": {"flash": {"provenance": {..., "sm_count", "driver", "clock_sm_mhz",
                                         "power_limit_w", "mig_mode", ...,
                                         "missing": {}},
                          "correctness": [...], "records": [...], "summary": [...]}}}

Each record: ``{"suite", "op", "impl", "mode", "dtype", "shape": {...}, "ms" (median),
"tflops", "gbps", "peak_mem_bytes", "error", "stats", "stage", "detail"}``; ``error`` is
null, "OOM" or "unsupported" (``detail`` says why); ``stats`` has every ``STAT_KEYS``
key; ``stage`` is "goal" or "sweep" in a ``benchmarks/run.py`` file.
"""

from __future__ import annotations

import pathlib
import time
import warnings
from collections.abc import Callable, Iterable

import torch

from .. import runtime
from .records import MIN_REPS, Record, clip_text, spread
from .results import load_results, provenance_label, suite_records

_L2_FLUSH: dict = {}
_SLEEP_CYCLES_PER_MS: list = []


def _l2_flush_buffer() -> torch.Tensor:
    """A buffer twice this GPU's L2 size (zeroing it evicts everything cached)."""
    dev = torch.cuda.current_device()
    if dev not in _L2_FLUSH:
        l2 = getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", 0) or 2**26
        _L2_FLUSH[dev] = torch.empty(2 * int(l2), dtype=torch.int8, device="cuda")
    return _L2_FLUSH[dev]


def _sleep_cycles_per_ms() -> float:
    """Clock cycles ``torch.cuda._sleep`` spins per millisecond, measured once."""
    if not _SLEEP_CYCLES_PER_MS:
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(1000)  # load the kernel before timing it
        start.record()
        torch.cuda._sleep(10**7)
        end.record()
        torch.cuda.synchronize()
        _SLEEP_CYCLES_PER_MS.append(10**7 / max(start.elapsed_time(end), 1e-3))
    return _SLEEP_CYCLES_PER_MS[0]


def _probe(fn) -> tuple[int, bool]:
    """One call of ``fn`` apart from the timed reps: the peak memory it allocates above
    what was allocated before, and whether it synchronised with the host (a ``.item()``,
    ``.cpu()``, ``.tolist()`` of a CUDA tensor: torch's sync debug mode warns)."""
    import warnings

    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    old = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode(old)
    torch.cuda.synchronize()
    synced = any("synchroniz" in str(w.message).lower() for w in caught)
    return int(torch.cuda.max_memory_allocated() - base), synced


def time_fn(
    fn: Callable[[], object],
    warmup: int = 5,
    rep: int = MIN_REPS,
    *,
    flush_l2: bool = True,
    head_start: bool = True,
    cuda_graph: bool = False,
) -> dict:
    """Time ``fn()`` on the GPU: a fixed number of reps, each between CUDA events.

    The protocol, the same for every implementation:

    1. the first call alone (compilation, autotuning), its host time kept as
       ``first_call_ms``, never mixed into the reps;
    2. one probe call for the peak memory it allocates and whether it synchronises with
       the host (``host_sync``: such an implementation's reps include a host
       round trip);
    3. ``warmup`` untimed calls, their host enqueue time (no sync) giving ``host_ms``;
    4. ``rep`` timed reps (at least ``MIN_REPS``). Before each: the same L2 flush kernel
       (zeroing a buffer twice the L2 size), then a GPU spin of about 1.5 ``host_ms``
       (``head_start_ms``) so that the host has queued all of ``fn``'s launches before
       the start event, whatever its Python overhead: the events bracket ``fn``'s
       kernels only, and a cheap-to-launch implementation gets no head start over a
       costly one. With ``cuda_graph``, ``fn`` is captured once and each rep replays the
       graph (no Python at all); a capture that fails falls back to plain calls, and
       ``cuda_graph`` says why.

    Returns ``{"ms": median, "peak_mem_bytes", "stats": {...}}`` with ``stats`` holding
    every key of ``STAT_KEYS``. Raises RuntimeError without CUDA: nothing to time.
    """
    if not runtime.HAS_CUDA or runtime.INTERPRET:
        raise RuntimeError("time_fn needs a CUDA GPU (and TRITON_INTERPRET unset)")
    if rep < MIN_REPS:
        raise ValueError(f"rep must be at least {MIN_REPS}, got {rep}")
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()  # 1. compile / autotune
    torch.cuda.synchronize()
    first_ms = (time.perf_counter() - t0) * 1e3
    peak, synced = _probe(fn)  # 2.
    host = []
    for _ in range(max(warmup, 1)):  # 3.
        t0 = time.perf_counter()
        fn()
        host.append((time.perf_counter() - t0) * 1e3)
    torch.cuda.synchronize()
    host_ms = sorted(host)[len(host) // 2]
    call, graph_state = fn, False
    if cuda_graph:
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                fn()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                fn()
            graph.replay()
            torch.cuda.synchronize()
            call, graph_state = graph.replay, True
        except Exception as e:  # noqa: BLE001 - recorded, and timed without a graph
            torch.cuda.synchronize()
            graph_state = (
                f"capture failed, timed without: {type(e).__name__}: {str(e)[:200]}"
            )
    flush = _l2_flush_buffer() if flush_l2 else None
    spin_ms = min(1.5 * host_ms + 0.05, 50.0) if head_start and call is fn else 0.0
    cycles = int(spin_ms * _sleep_cycles_per_ms()) if spin_ms else 0
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(rep)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(rep)]
    for i in range(rep):  # 4.
        if flush is not None:
            flush.zero_()
        if cycles:
            torch.cuda._sleep(cycles)
        starts[i].record()
        call()
        ends[i].record()
    torch.cuda.synchronize()
    stats = spread([s.elapsed_time(e) for s, e in zip(starts, ends)])
    stats.update(
        {
            "warmup": max(warmup, 1),
            "first_call_ms": first_ms,
            "host_ms": host_ms,
            "head_start_ms": spin_ms,
            "l2_flush": flush is not None,
            "cuda_graph": graph_state,
            "host_sync": synced,
            "timer": "cuda-events",
        }
    )
    return {"ms": stats["median_ms"], "peak_mem_bytes": peak, "stats": stats}


class FakeTimer:
    """A stand-in for ``time_fn`` on a CPU: calls ``fn`` once (so the code path really
    runs: forward, backward, the Triton interpreter) and reports made-up but well-formed
    numbers with ``stats["timer"] == "fake"``: a dry run proves the protocol and the
    schema, never a speed. ``calls`` keeps each call's return value, ``kw`` its timing
    arguments and ``log`` (shared with a dry run's event list when given) one entry per
    call, in order."""

    def __init__(self, ms: float = 2.0, log: list | None = None):
        self.ms, self.calls, self.kw = ms, [], []
        self.log = [] if log is None else log

    def __call__(self, fn, warmup: int = 5, rep: int = MIN_REPS, **kw):
        if rep < MIN_REPS:
            raise ValueError(f"rep must be at least {MIN_REPS}, got {rep}")
        t0 = time.perf_counter()
        self.calls.append(fn())
        first = (time.perf_counter() - t0) * 1e3
        self.kw.append({"warmup": warmup, "rep": rep, **kw})
        self.log.append({"event": "time", "n": len(self.calls)})
        stats = spread([self.ms * (1 + 0.01 * (i % 5)) for i in range(rep)])
        stats.update(
            {
                "warmup": warmup,
                "first_call_ms": first,
                "host_ms": None,
                "head_start_ms": None,
                "l2_flush": False,
                "cuda_graph": False,
                "host_sync": None,
                "timer": "fake",
            }
        )
        return {"ms": stats["median_ms"], "peak_mem_bytes": 123, "stats": stats}


def measure(
    record: Record,
    fn: Callable[[], object],
    flops: float | None = None,
    bytes_moved: float | None = None,
    timer: Callable[..., dict] | None = None,
    **kw,
) -> Record:
    """Time ``fn`` into ``record``; an out-of-memory error is recorded, not raised.

    ``timer(fn, **kw)`` returns ``{"ms", "peak_mem_bytes"}`` and optionally "stats":
    ``time_fn`` unless given (``FakeTimer`` runs the plumbing on a CPU).
    """
    try:
        t = (timer or time_fn)(fn, **kw)
    except torch.cuda.OutOfMemoryError:
        record.error = "OOM"
        torch.cuda.empty_cache()
        return record
    record.ms = t["ms"]
    record.peak_mem_bytes = t["peak_mem_bytes"]
    record.stats = t.get("stats")
    if flops is not None:
        record.tflops = flops / (t["ms"] * 1e-3) / 1e12
    if bytes_moved is not None:
        record.gbps = bytes_moved / (t["ms"] * 1e-3) / 1e9
    return record


# ---------------------------------------------------------------------------------
# Attention over sequence lengths, and the forward kernel over tile sizes.
# ---------------------------------------------------------------------------------


def attention_flops(
    B: int, H: int, N_q: int, N_k: int, d: int, causal: bool = False, mode: str = "fwd"
) -> float:
    """Matmul FLOPs of attention: 4 B H N_q N_k d forward (S = Q K^T and P V), halved
    when causal. Forward + backward counts 3.5x the forward (the backward does 2.5x:
    five matmuls, one of them the recomputation of S)."""
    f = 4.0 * B * H * N_q * N_k * d * (0.5 if causal else 1.0)
    return f * (3.5 if mode == "fwd+bwd" else 1.0)


def torch_dtype(dtype) -> tuple[torch.dtype, str]:
    """A dtype given as a torch.dtype or its torch name ("float16"): (dtype, name)."""
    dt = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    return dt, str(dt).removeprefix("torch.")


def random_qkv(
    B: int,
    H: int,
    N_q: int,
    d: int,
    *,
    H_kv: int | None = None,
    N_k: int | None = None,
    dtype="float16",
    device=None,
    seed: int = 0,
    grad: bool = False,
) -> list[torch.Tensor]:
    """Standard-normal q (B, H, N_q, d) and k, v (B, H_kv, N_k, d), drawn in that order
    from a generator seeded with ``seed`` on ``device`` (default ``runtime.DEVICE``)."""
    dt, _ = torch_dtype(dtype)
    device = runtime.DEVICE if device is None else device
    g = torch.Generator(device=device).manual_seed(seed)
    h_kv, n_k = H if H_kv is None else H_kv, N_q if N_k is None else N_k
    shapes = ((B, H, N_q, d), (B, h_kv, n_k, d), (B, h_kv, n_k, d))
    return [
        torch.randn(s, generator=g, device=device, dtype=dt).requires_grad_(grad)
        for s in shapes
    ]


def attention_step(attn, mode: str, q, k, v, causal: bool, do) -> Callable[[], object]:
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


def time_attention(
    lengths: Iterable[int],
    impls: dict[str, Callable] | None = None,
    *,
    d: int = 64,
    causal: bool | tuple = False,
    dtype="float16",
    modes: tuple = ("fwd",),
    batch: int | None = None,
    heads: int | None = None,
    tokens: int = 16 * 1024,
    width: int = 1024,
    suite: str = "live",
    op: str = "attention",
    device=None,
    seed: int = 0,
    timer: Callable[..., dict] | None = None,
    deadline: float | None = None,
    progress: bool = False,
    log: Callable[[Record], None] | None = None,
    stage: str | None = None,
    **timing,
) -> list[Record]:
    """Time attention at each sequence length N = N_q = N_k: one Record per case.

    Shapes: q, k, v are (B, H, N, d) in ``dtype`` with B = ``batch`` or tokens // N (at
    least 1) and H = ``heads`` or width // d, so every N does similar work per token.
    ``causal`` is a bool or a tuple of them; ``modes`` holds "fwd" (no autograd graph)
    and/or "fwd+bwd" (forward, then the gradients of a random dO). ``impls`` maps a name
    to ``fn(q, k, v, causal)`` (``kernels.flash.timing.attention_impls()``, say).

    Out of memory is recorded (error "OOM"), not raised; an SDPA implementation that
    refuses the shape or GPU is recorded with error "unsupported" and, in ``detail``,
    its error and the warnings PyTorch gave (why each backend declined); any other error
    is raised, naming the case. ``stage`` is copied into each record. ``timer`` defaults
    to ``time_fn`` (CUDA only; ``timing`` passes warmup and rep to it). Past
    ``deadline`` (``time.monotonic()``) no new case starts. ``log(record)`` is called
    after each case; ``progress`` shows a bar over the lengths.
    """
    if impls is None:
        raise TypeError(
            "impls is required: a dict name -> fn(q, k, v, causal), for example "
            "kernels.flash.timing.attention_impls()"
        )
    dt, dt_name = torch_dtype(dtype)
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
            q, k, v = random_qkv(
                B, H, N, d, dtype=dt, device=device, seed=seed, grad=grad
            )
            do = torch.randn_like(q) if grad else None  # (B, H, N, d)
        except torch.cuda.OutOfMemoryError:  # the inputs alone do not fit
            q = k = v = do = None
        cases = [
            (c, name, attn, mode)
            for c in causals
            for name, attn in impls.items()
            for mode in modes
        ]
        for c, name, attn, mode in cases:
            if deadline is not None and time.monotonic() > deadline:
                return records
            rec = Record(
                suite,
                op,
                name,
                mode,
                dt_name,
                {"B": B, "H": H, "N_q": N, "N_k": N, "d": d, "causal": c},
                stage=stage,
            )
            caught: list = []
            if q is None:
                rec.error = "OOM"
            else:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    try:
                        step = attention_step(attn, mode, q, k, v, c, do)
                        measure(
                            rec,
                            step,
                            timer=timer,
                            flops=attention_flops(B, H, N, N, d, c, mode),
                            **timing,
                        )
                    except torch.cuda.OutOfMemoryError:
                        rec.error = "OOM"
                    except RuntimeError as e:
                        if not name.startswith("sdpa"):
                            raise RuntimeError(
                                f"{name} {mode} {rec.shape} {dt_name}: {e}"
                            ) from e
                        # a backend without this GPU/shape/dtype: recorded, with
                        # its reasons
                        why = [str(w.message) for w in caught]
                        rec.error, rec.detail = (
                            "unsupported",
                            clip_text(
                                "; ".join(
                                    [f"{type(e).__name__}: {e}", *dict.fromkeys(why)]
                                )
                            ),
                        )
            if rec.error != "unsupported":  # pass on what was not a backend's refusal
                for w in caught:
                    warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
            records.append(rec)
            if log is not None:
                log(rec)
        q = k = v = do = None
        torch.cuda.empty_cache()
    return records


def live_or_recorded(
    suite: str,
    live: Callable[[], list[Record]],
    results_dir: pathlib.Path | None = None,
) -> list[tuple[str, list[dict]]]:
    """What a chapter's timing cell draws: a list of ``(label, records as dicts)``.

    On a CUDA GPU, ``live()`` measured now, labelled "measured live: <provenance>";
    elsewhere each recorded GPU's rows of ``suite``, labelled "recorded: <provenance>".
    An empty list means nothing is recorded: the chapter says so and invents nothing.
    """
    if runtime.HAS_CUDA and not runtime.INTERPRET:
        rows = [r.to_dict() if isinstance(r, Record) else r for r in live()]
        return [("measured live: " + provenance_label(runtime.describe()), rows)]
    return [
        ("recorded: " + provenance_label(prov), records)
        for prov, records in suite_records(load_results(results_dir), suite)
    ]
