"""A small run of every kernel family under the Triton interpreter, for the
version matrix (``tests/kernels/test_interpreter_matrix.py``): FlashAttention forward
and backward (causal, ragged lengths), hard and top-k attention, MSDA and DAT forward
and backward, each against PyTorch references in float64 at tiny shapes.

Run as a script in an environment that has torch, triton and numpy, with this
repository on ``PYTHONPATH``; it prints one JSON line with the versions and the errors,
and exits non-zero on the first failure.
"""

import json
import os
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import kernels  # noqa: E402, F401  (first: the interpreter)
from kernels import deformable as kd  # noqa: E402
from kernels.flash import flash_attention  # noqa: E402
from kernels.hard import hard_attention, topk_attention  # noqa: E402


def _max_err(a, b) -> float:
    return float((a.detach().double() - b.detach().double()).abs().max())


def main() -> dict:
    g = torch.Generator().manual_seed(0)
    errs = {}
    # FlashAttention, causal, N_q != N_k and neither a multiple of a tile: (B, H, N, d)
    q = torch.randn(1, 2, 37, 16, generator=g, dtype=torch.float64)
    k, v = (torch.randn(1, 2, 45, 16, generator=g, dtype=torch.float64) for _ in "kv")
    do = torch.randn_like(q)
    xs = [t.float().requires_grad_() for t in (q, k, v)]
    o = flash_attention(*xs, causal=True)
    o.backward(do.float())
    keep = torch.ones(37, 45, dtype=torch.bool).tril(45 - 37)  # bottom-right causal
    refs = [t.clone().requires_grad_() for t in (q, k, v)]
    ref = F.scaled_dot_product_attention(*refs, attn_mask=keep)
    ref.backward(do)
    errs["flash"] = max(
        _max_err(o, ref), *(_max_err(x.grad, r.grad) for x, r in zip(xs, refs))
    )
    # hard (argmax) and top-k against their definitions
    scores = (q @ k.mT) / 4  # (B, H, N_q, N_k), 1/sqrt(16)
    o_h = hard_attention(*(t.float() for t in (q, k, v)))
    idx = scores.argmax(-1)
    errs["hard"] = _max_err(
        o_h, torch.gather(v, 2, idx[..., None].expand(-1, -1, -1, 16))
    )
    o_t = topk_attention(*(t.float() for t in (q, k, v)), topk=4)
    top = scores.topk(4, -1)
    p = torch.softmax(top.values, -1)  # (B, H, N_q, 4)
    rows = torch.gather(
        v[:, :, None].expand(-1, -1, 37, -1, -1),
        3,
        top.indices[..., None].expand(-1, -1, -1, -1, 16),
    )
    errs["topk"] = _max_err(o_t, (p[..., None] * rows).sum(-2))
    # MSDA: two levels, forward and backward against grid_sample
    shapes = torch.tensor([[4, 5], [2, 3]])
    starts = torch.tensor([0, 20])
    value = torch.randn(1, 26, 2, 8, generator=g, dtype=torch.float64)
    loc = torch.rand(1, 6, 2, 2, 3, 2, generator=g, dtype=torch.float64)
    w = torch.rand(1, 6, 2, 2, 3, generator=g, dtype=torch.float64)
    go = torch.randn(1, 6, 16, generator=g, dtype=torch.float64)
    got = [t.float().requires_grad_() for t in (value, loc, w)]
    out = kd.ms_deform_attn(got[0], shapes, starts, got[1], got[2])
    out.backward(go.float())
    want = [t.clone().requires_grad_() for t in (value, loc, w)]
    ref = kd.ms_deform_attn_reference(want[0], shapes, starts, want[1], want[2])
    ref.backward(go)
    errs["msda"] = max(
        _max_err(out, ref), *(_max_err(a.grad, b.grad) for a, b in zip(got, want))
    )
    # DAT: queries over keys and values sampled from a 6 x 7 map (one group), forward
    qd = torch.randn(1, 2, 5, 16, generator=g, dtype=torch.float64)
    k_map, v_map = (
        torch.randn(1, 2, 6, 7, 16, generator=g, dtype=torch.float64) for _ in "kv"
    )
    pts = torch.rand(1, 1, 9, 2, generator=g, dtype=torch.float64) * 2 - 1
    out = kd.deformable_attention(*(t.float() for t in (qd, k_map, v_map, pts)))
    ref = kd.deformable_attention_reference(qd, k_map, v_map, pts)
    errs["dat"] = _max_err(out, ref)
    import triton  # after kernels: see kernels.runtime

    return {
        "torch": torch.__version__,
        "triton": triton.__version__,
        "numpy": numpy.__version__,
        "errors": errs,
    }


if __name__ == "__main__":
    result = main()
    print(json.dumps(result))
    bad = {k: e for k, e in result["errors"].items() if not e < 1e-4}
    sys.exit(f"too large: {bad}" if bad else 0)
