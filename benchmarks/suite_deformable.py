"""Deformable attention suite: MSDA and the fused DAT kernel against their
PyTorch baselines.

``check()`` holds ``kernels.deformable.ms_deform_attn`` and ``deformable_attention``
(forward and every gradient; fp32 and fp16; points partly outside the maps, ragged
sizes) to fp64 references built on ``grid_sample`` on this GPU, with the flash-attn
rule: error at most twice PyTorch's own error in the same dtype plus a small atol.

``run(quick, deadline)`` records, in order of importance (a deadline cuts the rest):

1. MSDA at Deformable DETR's shapes: d_model 256, 8 heads (D_h = 32), 4 levels of a
   ~800 x 1200 image at strides 8..64 (19,947 values), 4 points, batch 2, with 300
   (decoder) and 10,000 (encoder-sized) queries; forward and forward + backward; fp32
   and fp16. ``triton`` (kernels.deformable) against ``naive`` (Deformable DETR's
   ``ms_deform_attn_core_pytorch``: one grid_sample per level, then a weighted sum).
2. Fused DAT attention at two DAT shapes (an ImageNet stage at 28 x 28 and a detection
   stage at 50 x 84, d = 32, r = 4): ``triton`` against ``grid_sample+flash``
   (grid_sample of the K and V maps, then kernels.flash), ``grid_sample+sdpa`` and
   ``naive`` (grid_sample, then S and P materialised).

Run it with ``python benchmarks/run.py --suite deformable`` on a CUDA machine. It is
sized to fit in about 1.5 minutes on an H200, compilation included (a budget, not yet
measured: no GPU run of this suite is recorded in this repository); ``run`` stops at
its deadline.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from kernels import deformable as kd
from kernels import runtime
from kernels.bench import Record, measure

SUITE = "deformable"

# Deformable DETR: levels at strides 8, 16, 32, 64 of an ~800 x 1200 image.
MSDA_LEVELS = [[100, 150], [50, 75], [25, 38], [13, 19]]
MSDA_HEADS, MSDA_HEAD_DIM, MSDA_POINTS, MSDA_BATCH = 8, 32, 4, 2
MSDA_QUERIES = [300, 10_000]

# (name, B, H, G, map H_f, map W_f, d, r): every map position is a query;
# N_s = (H_f/r)(W_f/r)
DAT_SHAPES = [
    ("imagenet-28x28", 32, 6, 3, 28, 28, 32, 4),
    ("detection-50x84", 2, 12, 6, 50, 84, 32, 4),
]


def _msda_inputs(b, l_q, levels, dtype, seed=0, grad=False, lo=-0.1, hi=1.1):
    g = torch.Generator(device=runtime.DEVICE).manual_seed(seed)
    shapes = torch.tensor(levels, dtype=torch.int64, device=runtime.DEVICE)
    areas = shapes[:, 0] * shapes[:, 1]
    starts = torch.cat([areas.new_zeros(1), areas.cumsum(0)[:-1]])
    s, n_l = int(areas.sum()), len(levels)
    value = torch.randn(b, s, MSDA_HEADS, MSDA_HEAD_DIM, generator=g,
                        device=runtime.DEVICE)
    loc = lo + (hi - lo) * torch.rand(b, l_q, MSDA_HEADS, n_l, MSDA_POINTS, 2,
                                      generator=g, device=runtime.DEVICE)
    w = torch.rand(b, l_q, MSDA_HEADS, n_l, MSDA_POINTS, generator=g,
                   device=runtime.DEVICE)
    w = w / w.sum((-1, -2), keepdim=True)
    tensors = [t.to(dtype).requires_grad_(grad) for t in (value, loc, w)]
    return tensors, shapes, starts


def _dat_inputs(b, n_h, g_, h_f, w_f, d, r, dtype, seed=0, grad=False, spread=1.1):
    g = torch.Generator(device=runtime.DEVICE).manual_seed(seed)
    n_s = (h_f // r) * (w_f // r)
    q = torch.randn(b, n_h, h_f * w_f, d, generator=g, device=runtime.DEVICE)
    km = torch.randn(b, n_h, h_f, w_f, d, generator=g, device=runtime.DEVICE)
    vm = torch.randn(b, n_h, h_f, w_f, d, generator=g, device=runtime.DEVICE)
    u = torch.rand(b, g_, n_s, 2, generator=g, device=runtime.DEVICE)
    pts = (2 * u - 1) * spread
    return [t.to(dtype).requires_grad_(grad) for t in (q, km, vm, pts)]


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
    return [((o - r).abs().max().item(), (p - r).abs().max().item(),
             max(r.abs().max().item(), 1.0)) for o, r, p in zip(ours, ref, pt)]


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
        tensors, shapes, starts = _msda_inputs(1, l_q, levels, dtype)
        errs = _errors(lambda v, lc, w, sh=shapes, st=starts: kd.ms_deform_attn(
                           v, sh, st, lc, w),
                       lambda v, lc, w, sh=shapes, st=starts:
                           kd.ms_deform_attn_reference(v, sh, st, lc, w), tensors)
        for part, (err, err_pt, scale) in zip(["out", "dvalue", "dloc", "dweights"],
                                              errs):
            tol = _tolerance(err_pt, scale, atol, cap)
            out.append({"name": f"msda-{part}-{tag}", "max_err": err, "tol": tol,
                        "ok": err <= tol})
        for align in (True, False):
            tensors = _dat_inputs(*dat, dtype)
            errs = _errors(lambda *a, ac=align: kd.deformable_attention(
                               *a, align_corners=ac),
                           lambda *a, ac=align: kd.deformable_attention_reference(
                               *a, align_corners=ac), tensors)
            for part, (err, err_pt, scale) in zip(["out", "dq", "dk", "dv", "dpoints"],
                                                  errs):
                tol = _tolerance(err_pt, scale, atol, cap)
                out.append({"name": f"dat-{part}-{tag}-ac{int(align)}", "max_err": err,
                            "tol": tol, "ok": err <= tol})
    return out


def _fwd_bwd(fn, tensors):
    out = fn(*tensors)
    do = torch.ones_like(out)

    def step():
        for t in tensors:
            t.grad = None
        fn(*tensors).backward(do)
    return step


def _grid_sample_then(attn):
    def fn(q, km, vm, pts):
        k, v = kd.sample_maps(km, vm, pts, align_corners=True)  # (B, H, N_s, d)
        return attn(q, k, v)
    return fn


def _dat_impls() -> dict:
    impls = {"triton": lambda q, km, vm, p: kd.deformable_attention(q, km, vm, p),
             "grid_sample+sdpa": _grid_sample_then(F.scaled_dot_product_attention),
             "naive": kd.deformable_attention_reference}
    try:
        from kernels.flash import flash_attention
    except ImportError:  # the flash chapter's kernel is not in this checkout
        return impls
    impls["grid_sample+flash"] = _grid_sample_then(flash_attention)
    return impls


#: The dry run's shapes (``benchmarks/run.py --dry-run``: the interpreter on a CPU).
DRY_MSDA_LEVELS, DRY_MSDA_QUERIES = [[6, 8], [3, 4]], [12]
DRY_DAT_SHAPES = [("dry-4x8", 1, 2, 1, 4, 8, 16, 2)]
TIMING = {"warmup": 5, "rep": 20}


def run(quick: bool, deadline: float, timer=None, dry: bool = False) -> list[Record]:
    """MSDA, then fused DAT; stops cleanly at ``deadline``. ``timer``:
    ``kernels.bench.time_fn`` unless given. The MSDA reference gets ``spatial_shapes``
    on the host, so it never synchronises with the GPU per call (it reads them with
    ``.tolist()``); the Triton wrapper validates them on the host each call, and the
    record's ``stats["host_sync"]`` says so."""
    records: list[Record] = []
    dtypes = [torch.float16] if quick or dry else [torch.float32, torch.float16]
    levels = DRY_MSDA_LEVELS if dry else MSDA_LEVELS
    queries = DRY_MSDA_QUERIES if dry else MSDA_QUERIES[:1] if quick else MSDA_QUERIES
    timing = {**TIMING, "timer": timer}
    # 1. MSDA
    for dtype in dtypes:
        for l_q in queries:
            for mode in ("fwd", "fwd+bwd"):
                for impl, fn in (("triton", kd.ms_deform_attn),
                                 ("naive", kd.ms_deform_attn_reference)):
                    if time.monotonic() > deadline:
                        return records
                    tensors, shapes, starts = _msda_inputs(MSDA_BATCH, l_q, levels,
                                                           dtype, grad=mode != "fwd")
                    # host-side shapes: no device-to-host copy per call
                    if impl == "naive":
                        shapes, starts = shapes.cpu(), starts.cpu()
                    call = lambda v, lc, w, f=fn, sh=shapes, st=starts: f(  # noqa: E731
                        v, sh, st, lc, w)
                    if mode == "fwd":
                        def step(call=call, tensors=tensors):
                            with torch.no_grad():
                                call(*tensors)
                    else:
                        step = _fwd_bwd(call, tensors)
                    shape = {"B": MSDA_BATCH, "L_q": l_q, "H": MSDA_HEADS,
                             "D_h": MSDA_HEAD_DIM, "levels": levels,
                             "S": int(sum(h * w for h, w in levels)), "P": MSDA_POINTS}
                    rec = Record(SUITE, "msda", impl, mode,
                                 str(dtype).replace("torch.", ""), shape, stage="sweep")
                    records.append(measure(rec, step, **timing))
    # 2. fused DAT attention
    impls = _dat_impls()
    dat_shapes = DRY_DAT_SHAPES if dry else DAT_SHAPES[:1] if quick else DAT_SHAPES
    for dtype in dtypes:
        for name, b, n_h, g_, h_f, w_f, d, r in dat_shapes:
            for mode in ("fwd", "fwd+bwd"):
                for impl, fn in impls.items():
                    if time.monotonic() > deadline:
                        return records
                    tensors = _dat_inputs(b, n_h, g_, h_f, w_f, d, r, dtype,
                                          grad=mode != "fwd")
                    if mode == "fwd":
                        def step(fn=fn, tensors=tensors):
                            with torch.no_grad():
                                fn(*tensors)
                    else:
                        step = _fwd_bwd(fn, tensors)
                    n_s = (h_f // r) * (w_f // r)
                    shape = {"name": name, "B": b, "H": n_h, "G": g_, "N_q": h_f * w_f,
                             "H_f": h_f, "W_f": w_f, "N_s": n_s, "d": d, "r": r}
                    flops = 4 * b * n_h * h_f * w_f * n_s * d  # QK^T and PV
                    rec = Record(SUITE, "dat", impl, mode,
                                 str(dtype).replace("torch.", ""), shape, stage="sweep")
                    records.append(measure(rec, step,
                                           flops=flops * (1 if mode == "fwd" else 3.5),
                                           **timing))
    return records
