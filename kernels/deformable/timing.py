"""The deformable family's timing: suite "deformable" of ``make bench`` (``check``,
``run``) and ``time_deformable`` (``time_msda`` then ``time_dat``), which chapter 4's
timing cell and the suite both measure through.

* op "msda": ``kernels.deformable.ms_deform_attn`` (impl "triton") against Deformable
  DETR's ``ms_deform_attn_core_pytorch`` (impl "naive": one grid_sample per level, then
  a weighted sum), at Deformable DETR's shapes by default: d_model 256, 8 heads
  (D_h = 32), 4 levels of a ~800 x 1200 image at strides 8..64, 4 points, batch 2;
  with the decoder's 300 object queries and at encoder scale (``ENCODER``: every pixel
  of every level a query, L_q = S, the shape that dominates Deformable DETR's cost).
  Shape ``{"B", "L_q", "H", "D_h", "levels", "S", "P"}``, plus ``"name": "encoder"``
  at encoder scale.
* op "dat": the fused ``deformable_attention`` (impl "triton") against
  "grid_sample+flash" (grid_sample of the K and V maps, then ``kernels.flash``),
  "grid_sample+sdpa" and "naive" (grid_sample, then S and P materialised), at the
  shapes of ``DAT_SHAPES``.
  Shape ``{"name", "B", "H", "G", "N_q", "H_f", "W_f", "N_s", "d", "r"}``.

Each in mode "fwd" (no autograd graph) and "fwd+bwd" (forward, then backward of ones).
``msda_inputs`` and ``dat_inputs`` also feed the suite's correctness checks.

The suite: MSDA and the fused DAT kernel against their PyTorch baselines.

``check()`` holds ``kernels.deformable.ms_deform_attn`` and ``deformable_attention``
(forward and every gradient; fp32 and fp16; points partly outside the maps, ragged
sizes) to fp64 references built on ``grid_sample`` on this GPU, with the flash-attn
rule: error at most twice PyTorch's own error in the same dtype plus a small atol.

``run(quick, deadline)`` records, in order of importance (a deadline cuts the rest):

1. MSDA at Deformable DETR's shapes: d_model 256, 8 heads (D_h = 32), 4 levels of a
   ~800 x 1200 image at strides 8..64 (19,947 values), 4 points, batch 2, with 300
   queries (the decoder's object queries) and at encoder scale, every one of the
   19,947 pixels a query (``ENCODER``: the shape that dominates Deformable DETR's
   cost, since its encoder runs MSDA over the whole pyramid in each of its layers);
   forward and forward + backward; fp32 and fp16. ``triton`` (kernels.deformable)
   against ``naive`` (Deformable DETR's ``ms_deform_attn_core_pytorch``: one
   grid_sample per level, then a weighted sum).
2. Fused DAT attention at two DAT shapes (an ImageNet stage at 28 x 28 and a detection
   stage at 50 x 84, d = 32, r = 4): ``triton`` against ``grid_sample+flash``
   (grid_sample of the K and V maps, then kernels.flash), ``grid_sample+sdpa`` and
   ``naive`` (grid_sample, then S and P materialised).

Run it with ``python benchmarks/run.py --suite deformable`` on a CUDA machine. It is
sized to fit in about 1.5 minutes on an H200, compilation included (a budget, not yet
measured: no GPU run of this suite is recorded in this repository); ``run`` stops at its
deadline. The timing is ``kernels.timing.bench.time_deformable``, the path chapter 4's
timing cell takes too.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

import torch
import torch.nn.functional as F

from kernels import deformable as kd
from kernels import runtime
from kernels.timing.bench import measure, torch_dtype
from kernels.timing.records import Record

# Deformable DETR: levels at strides 8, 16, 32, 64 of an ~800 x 1200 image.
MSDA_LEVELS = [[100, 150], [50, 75], [25, 38], [13, 19]]
MSDA_HEADS, MSDA_HEAD_DIM, MSDA_POINTS, MSDA_BATCH = 8, 32, 4, 2
#: L_q meaning "every pixel of every level is a query" (Deformable DETR's encoder).
ENCODER = "encoder"
MSDA_QUERIES = [300, ENCODER]

# (name, B, H, G, map H_f, map W_f, d, r): every map position is a query;
# N_s = (H_f/r)(W_f/r)
DAT_SHAPES = [
    ("imagenet-28x28", 32, 6, 3, 28, 28, 32, 4),
    ("detection-50x84", 2, 12, 6, 50, 84, 32, 4),
]


def msda_inputs(
    b, l_q, levels, dtype, seed=0, grad=False, lo=-0.1, hi=1.1, heads=MSDA_HEADS
):
    """value (b, S, H, D_h), sampling locations (b, L_q, H, L, P, 2) in [lo, hi) and
    weights (b, L_q, H, L, P) summing to 1 over L x P, in ``dtype`` (H = ``heads``);
    the levels' shapes and start offsets (int64)."""
    g = torch.Generator(device=runtime.DEVICE).manual_seed(seed)
    shapes = torch.tensor(levels, dtype=torch.int64, device=runtime.DEVICE)
    areas = shapes[:, 0] * shapes[:, 1]
    starts = torch.cat([areas.new_zeros(1), areas.cumsum(0)[:-1]])
    s, n_l = int(areas.sum()), len(levels)
    value = torch.randn(b, s, heads, MSDA_HEAD_DIM, generator=g, device=runtime.DEVICE)
    loc = lo + (hi - lo) * torch.rand(
        b, l_q, heads, n_l, MSDA_POINTS, 2, generator=g, device=runtime.DEVICE
    )
    w = torch.rand(b, l_q, heads, n_l, MSDA_POINTS, generator=g, device=runtime.DEVICE)
    w = w / w.sum((-1, -2), keepdim=True)
    tensors = [t.to(dtype).requires_grad_(grad) for t in (value, loc, w)]
    return tensors, shapes, starts


def dat_inputs(b, n_h, g_, h_f, w_f, d, r, dtype, seed=0, grad=False, spread=1.1):
    """q (b, H, H_f W_f, d), key and value maps (b, H, H_f, W_f, d) and points
    (b, G, N_s, 2) in [-spread, spread), in ``dtype``."""
    g = torch.Generator(device=runtime.DEVICE).manual_seed(seed)
    n_s = (h_f // r) * (w_f // r)
    q = torch.randn(b, n_h, h_f * w_f, d, generator=g, device=runtime.DEVICE)
    km = torch.randn(b, n_h, h_f, w_f, d, generator=g, device=runtime.DEVICE)
    vm = torch.randn(b, n_h, h_f, w_f, d, generator=g, device=runtime.DEVICE)
    u = torch.rand(b, g_, n_s, 2, generator=g, device=runtime.DEVICE)
    pts = (2 * u - 1) * spread
    return [t.to(dtype).requires_grad_(grad) for t in (q, km, vm, pts)]


def _step(fn, tensors, mode: str) -> Callable[[], None]:
    """One forward without an autograd graph, or one forward and its backward."""
    if mode == "fwd":

        def step():
            with torch.no_grad():
                fn(*tensors)

        return step
    do = torch.ones_like(fn(*tensors))

    def fwd_bwd():
        for t in tensors:
            t.grad = None
        fn(*tensors).backward(do)

    return fwd_bwd


def _grid_sample_then(attn):
    def fn(q, km, vm, pts):
        k, v = kd.sample_maps(km, vm, pts, align_corners=True)  # (B, H, N_s, d)
        return attn(q, k, v)

    return fn


def dat_impls() -> dict[str, Callable]:
    """The fused DAT kernel and its baselines, each ``fn(q, k_map, v_map, points)``."""
    impls = {
        "triton": lambda q, km, vm, p: kd.deformable_attention(q, km, vm, p),
        "grid_sample+sdpa": _grid_sample_then(F.scaled_dot_product_attention),
        "naive": kd.deformable_attention_reference,
    }
    try:
        from kernels.flash import flash_attention
    except ImportError:  # the flash chapter's kernel is not in this checkout
        return impls
    impls["grid_sample+flash"] = _grid_sample_then(flash_attention)
    return impls


def msda_query_count(queries, levels) -> int:
    """L_q of a ``queries`` entry: a count, or ``ENCODER`` = S, the pixels of
    ``levels``."""
    if queries == ENCODER:
        return int(sum(h * w for h, w in levels))
    if isinstance(queries, bool) or not isinstance(queries, int) or queries < 1:
        raise ValueError(
            f"queries must be a positive count or {ENCODER!r}, got {queries!r}"
        )
    return queries


def _past(deadline: float | None) -> bool:
    return deadline is not None and time.monotonic() > deadline


def time_msda(
    queries: Iterable[int] = MSDA_QUERIES,
    *,
    levels=MSDA_LEVELS,
    dtypes: Iterable = ("float16",),
    modes: Iterable[str] = ("fwd", "fwd+bwd"),
    suite: str = "live",
    stage: str | None = None,
    timer: Callable[..., dict] | None = None,
    deadline: float | None = None,
    log: Callable[[Record], None] | None = None,
    batch: int = MSDA_BATCH,
    heads: int = MSDA_HEADS,
    **timing,
) -> list[Record]:
    """MSDA, triton against naive, at each (dtype, L_q in ``queries``, mode), ``batch``
    images of ``heads`` heads; an entry ``ENCODER`` makes every pixel of ``levels`` a
    query. The naive
    version gets ``spatial_shapes`` on the host, so it never synchronises with the GPU
    per call (it reads them with ``.tolist()``); the Triton wrapper validates them on
    the host each call, and the record's ``stats["host_sync"]`` says so."""
    records: list[Record] = []
    for dtype in dtypes:
        dt, dt_name = torch_dtype(dtype)
        for q_entry in queries:
            l_q = msda_query_count(q_entry, levels)
            for mode in modes:
                for impl, fn in (
                    ("triton", kd.ms_deform_attn),
                    ("naive", kd.ms_deform_attn_reference),
                ):
                    if _past(deadline):
                        return records
                    tensors, shapes, starts = msda_inputs(
                        batch, l_q, levels, dt, grad=mode != "fwd", heads=heads
                    )
                    if impl == "naive":  # shapes on the host: no copy per call
                        shapes, starts = shapes.cpu(), starts.cpu()
                    call = lambda v, lc, w, f=fn, sh=shapes, st=starts: f(  # noqa: E731
                        v, sh, st, lc, w
                    )
                    shape = {
                        "B": batch,
                        "L_q": l_q,
                        "H": heads,
                        "D_h": MSDA_HEAD_DIM,
                        "levels": levels,
                        "S": int(sum(h * w for h, w in levels)),
                        "P": MSDA_POINTS,
                    }
                    if q_entry == ENCODER:
                        shape["name"] = ENCODER
                    rec = Record(suite, "msda", impl, mode, dt_name, shape, stage=stage)
                    records.append(
                        measure(rec, _step(call, tensors, mode), timer=timer, **timing)
                    )
                    if log is not None:
                        log(rec)
    return records


def time_dat(
    shapes: Iterable = DAT_SHAPES,
    *,
    dtypes: Iterable = ("float16",),
    modes: Iterable[str] = ("fwd", "fwd+bwd"),
    impls: dict | None = None,
    suite: str = "live",
    stage: str | None = None,
    timer: Callable[..., dict] | None = None,
    deadline: float | None = None,
    log: Callable[[Record], None] | None = None,
    **timing,
) -> list[Record]:
    """Fused DAT against its baselines (``dat_impls()`` unless ``impls``) at each
    (dtype, shape, mode). A shape is a ``DAT_SHAPES`` tuple or the name of one."""
    named = {s[0]: s for s in DAT_SHAPES}
    impls = dat_impls() if impls is None else impls
    records: list[Record] = []
    for dtype in dtypes:
        dt, dt_name = torch_dtype(dtype)
        for s in shapes:
            name, b, n_h, g_, h_f, w_f, d, r = named[s] if isinstance(s, str) else s
            n_s = (h_f // r) * (w_f // r)
            shape = {
                "name": name,
                "B": b,
                "H": n_h,
                "G": g_,
                "N_q": h_f * w_f,
                "H_f": h_f,
                "W_f": w_f,
                "N_s": n_s,
                "d": d,
                "r": r,
            }
            flops = 4 * b * n_h * h_f * w_f * n_s * d  # QK^T and PV
            for mode in modes:
                for impl, fn in impls.items():
                    if _past(deadline):
                        return records
                    tensors = dat_inputs(
                        b, n_h, g_, h_f, w_f, d, r, dt, grad=mode != "fwd"
                    )
                    rec = Record(
                        suite, "dat", impl, mode, dt_name, dict(shape), stage=stage
                    )
                    records.append(
                        measure(
                            rec,
                            _step(fn, tensors, mode),
                            timer=timer,
                            flops=flops * (1 if mode == "fwd" else 3.5),
                            **timing,
                        )
                    )
                    if log is not None:
                        log(rec)
    return records


def time_deformable(
    queries: Iterable[int] = MSDA_QUERIES,
    dat_shapes: Iterable = DAT_SHAPES,
    *,
    levels=MSDA_LEVELS,
    dtypes: Iterable = ("float16",),
    suite: str = "live",
    deadline: float | None = None,
    msda_shape: dict | None = None,
    **kw,
) -> list[Record]:
    """``time_msda(queries)``, then ``time_dat(dat_shapes)``, one list of Records;
    both stop at ``deadline``. ``kw`` (modes, stage, timer, log, warmup, rep) goes to
    both, ``msda_shape`` (``batch``, ``heads``) to ``time_msda`` alone."""
    dtypes = list(dtypes)
    msda = time_msda(
        queries,
        levels=levels,
        dtypes=dtypes,
        suite=suite,
        deadline=deadline,
        **(msda_shape or {}),
        **kw,
    )
    return msda + time_dat(
        dat_shapes, dtypes=dtypes, suite=suite, deadline=deadline, **kw
    )


SUITE = "deformable"


def _errors(fn, ref_fn, tensors, grad_seed=1):
    """Max abs error of fn (in the inputs' dtype) and of ref_fn in the same dtype, both
    against ref_fn in fp64, over the output and every input gradient."""

    def run(f, dtype):
        xs = [t.detach().to(dtype).requires_grad_() for t in tensors]
        out = f(*xs)
        g = torch.Generator(device=runtime.DEVICE).manual_seed(grad_seed)
        do = torch.randn(out.shape, generator=g, device=runtime.DEVICE).to(dtype)
        grads = torch.autograd.grad(out, xs, do)
        return [out.double(), *(x.double() for x in grads)]

    dtype = tensors[0].dtype
    ours, ref, pt = run(fn, dtype), run(ref_fn, torch.float64), run(ref_fn, dtype)
    return [
        (
            (o - r).abs().max().item(),
            (p - r).abs().max().item(),
            max(r.abs().max().item(), 1.0),
        )
        for o, r, p in zip(ours, ref, pt)
    ]


def _tolerance(err_pt: float, scale: float, atol: float, cap: float) -> float:
    """2x PyTorch's error in the same dtype plus atol, relative to the largest reference
    value; never looser than ``cap`` of it (PyTorch's half-precision grid gradients can
    be far off, or inf), so a tolerance is never vacuous."""
    if not err_pt == err_pt or err_pt == float("inf"):  # NaN or inf
        err_pt = cap * scale
    return min(2 * err_pt, cap * scale) + atol * scale


def check(dry: bool = False) -> list[dict]:
    """MSDA and fused DAT vs fp64 on this GPU; ``dry``: small maps (the interpreter)."""
    out = []
    levels = [[7, 9], [4, 5]] if dry else [[31, 45], [16, 23], [8, 12], [4, 6]]
    l_q, dat = (20, (1, 2, 2, 9, 11, 16, 3)) if dry else (333, (2, 4, 2, 23, 37, 32, 3))
    for dtype, atol, cap in ((torch.float32, 1e-5, 1e-3), (torch.float16, 2e-3, 2e-2)):
        tag = str(dtype).replace("torch.", "")
        tensors, shapes, starts = msda_inputs(
            1, l_q, levels, dtype, heads=DRY_MSDA_HEADS if dry else MSDA_HEADS
        )
        errs = _errors(
            lambda v, lc, w, sh=shapes, st=starts: kd.ms_deform_attn(v, sh, st, lc, w),
            lambda v, lc, w, sh=shapes, st=starts: kd.ms_deform_attn_reference(
                v, sh, st, lc, w
            ),
            tensors,
        )
        for part, (err, err_pt, scale) in zip(
            ["out", "dvalue", "dloc", "dweights"], errs
        ):
            tol = _tolerance(err_pt, scale, atol, cap)
            out.append(
                {
                    "name": f"msda-{part}-{tag}",
                    "max_err": err,
                    "tol": tol,
                    "ok": err <= tol,
                }
            )
        for align in (True, False):
            tensors = dat_inputs(*dat, dtype)
            errs = _errors(
                lambda *a, ac=align: kd.deformable_attention(*a, align_corners=ac),
                lambda *a, ac=align: kd.deformable_attention_reference(
                    *a, align_corners=ac
                ),
                tensors,
            )
            for part, (err, err_pt, scale) in zip(
                ["out", "dq", "dk", "dv", "dpoints"], errs
            ):
                tol = _tolerance(err_pt, scale, atol, cap)
                out.append(
                    {
                        "name": f"dat-{part}-{tag}-ac{int(align)}",
                        "max_err": err,
                        "tol": tol,
                        "ok": err <= tol,
                    }
                )
    return out


#: The dry run's shapes (``benchmarks/run.py --dry-run``: the interpreter on a CPU):
#: one image of two heads (the interpreter runs a program per query block and head).
DRY_MSDA_LEVELS, DRY_MSDA_QUERIES = [[6, 8], [3, 4]], [12, ENCODER]
DRY_MSDA_HEADS = 2
DRY_DAT_SHAPES = [("dry-4x8", 1, 2, 1, 4, 8, 16, 2)]
TIMING = {"warmup": 5, "rep": 20}


def run(quick: bool, deadline: float, timer=None, dry: bool = False) -> list[Record]:
    """MSDA, then fused DAT, through ``kernels.deformable.timing.time_deformable``;
    stops cleanly at ``deadline``. ``timer``: ``kernels.timing.bench.time_fn`` unless
    given;
    ``dry``: tiny shapes (the interpreter)."""
    dtypes = [torch.float16] if quick or dry else [torch.float32, torch.float16]
    queries = DRY_MSDA_QUERIES if dry else MSDA_QUERIES[:1] if quick else MSDA_QUERIES
    dat_shapes = DRY_DAT_SHAPES if dry else DAT_SHAPES[:1] if quick else DAT_SHAPES
    return time_deformable(
        queries,
        dat_shapes,
        levels=DRY_MSDA_LEVELS if dry else MSDA_LEVELS,
        dtypes=dtypes,
        suite=SUITE,
        stage="sweep",
        timer=timer,
        deadline=deadline,
        msda_shape=dict(batch=1, heads=DRY_MSDA_HEADS) if dry else None,
        **TIMING,
    )
