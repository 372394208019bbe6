"""Deformable attention suite: MSDA and the fused DAT kernel against their
PyTorch baselines.

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

import torch

from kernels import deformable as kd
from kernels import runtime
from kernels.timing.deformable import (
    DAT_SHAPES,
    ENCODER,
    MSDA_HEADS,
    MSDA_LEVELS,
    MSDA_QUERIES,
    dat_inputs,
    msda_inputs,
    time_deformable,
)
from kernels.timing.records import Record

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
    """MSDA, then fused DAT, through ``kernels.timing.deformable.time_deformable``;
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
