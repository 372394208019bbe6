"""kernels.deformable (Triton; the interpreter on CPU) against fp64 references built
on grid_sample, against PyTorch in the same dtype, and against the NumPy twins."""

import numpy as np
import pytest
import torch

from attention import deformable as npd
from kernels import deformable as kd
from kernels import runtime
from tests.kernels.compile_tools import run_compiled

pytestmark = pytest.mark.xdist_group("deformable")

DEV = runtime.DEVICE


def _levels(shapes):
    shapes = torch.tensor(shapes, dtype=torch.int64, device=DEV)
    areas = shapes[:, 0] * shapes[:, 1]
    starts = torch.cat([areas.new_zeros(1), areas.cumsum(0)[:-1]])
    return shapes, starts, int(areas.sum())


def _msda_inputs(b, l_q, n_h, d, shapes, n_p, seed=0, lo=-0.15, hi=1.15):
    g = torch.Generator().manual_seed(seed)
    shapes, starts, s = _levels(shapes)
    n_l = shapes.shape[0]
    value = torch.randn(b, s, n_h, d, generator=g)
    # locations partly outside [0, 1]: zero padding and zero gradients there
    loc = lo + (hi - lo) * torch.rand(b, l_q, n_h, n_l, n_p, 2, generator=g)
    w = torch.rand(b, l_q, n_h, n_l, n_p, generator=g)
    return value.to(DEV), shapes, starts, loc.to(DEV), w.to(DEV)


def _run(fn, tensors, grad_out, dtype):
    xs = [t.detach().to(dtype).requires_grad_() for t in tensors]
    out = fn(*xs)
    out.backward(grad_out.to(dtype))
    return [out.detach().double()] + [x.grad.double() for x in xs]


def _max_err(a, b):
    return max((x - y).abs().max().item() for x, y in zip(a, b))


def _assert_close(ours, ref, torch_same_dtype, names, atol):
    """The flash-attn rule: our error against fp64 is at most 2x PyTorch's + atol."""
    for name, o, r, t in zip(names, ours, ref, torch_same_dtype):
        err, err_pt = (o - r).abs().max().item(), (t - r).abs().max().item()
        scale = max(r.abs().max().item(), 1.0)
        assert err <= 2 * err_pt + atol * scale, (
            f"{name}: max error {err:.3g} vs PyTorch's {err_pt:.3g} (|ref| {scale:.3g})"
        )


# --------------------------------------------------------------------------------------
# Multi-scale deformable attention
# --------------------------------------------------------------------------------------

MSDA_CASES = [
    # (B, L_q, H, D_h, levels, P)
    # ragged sizes, odd L_q, D_h not 2^k
    (2, 37, 3, 20, [[7, 9], [4, 5], [2, 3], [1, 1]], 3),
    (1, 70, 2, 32, [[12, 10], [6, 5]], 4),  # L_q > BLOCK_Q
    (1, 5, 1, 8, [[1, 13]], 1),  # one row, one point
]


@pytest.mark.parametrize(
    "case", MSDA_CASES, ids=lambda c: f"B{c[0]}Lq{c[1]}H{c[2]}D{c[3]}"
)
def test_msda_forward_backward_fp32(case):
    b, l_q, n_h, d, shapes, n_p = case
    value, sh, st, loc, w = _msda_inputs(b, l_q, n_h, d, shapes, n_p)
    grad = torch.randn(b, l_q, n_h * d, device=DEV)
    fn = lambda v, lc, ww: kd.ms_deform_attn(v, sh, st, lc, ww)  # noqa: E731
    ref_fn = lambda v, lc, ww: kd.ms_deform_attn_reference(  # noqa: E731
        v, sh, st, lc, ww
    )
    ours = _run(fn, (value, loc, w), grad, torch.float32)
    ref = _run(ref_fn, (value, loc, w), grad, torch.float64)
    pt = _run(ref_fn, (value, loc, w), grad, torch.float32)
    assert ours[0].shape == (b, l_q, n_h * d)
    _assert_close(
        ours, ref, pt, ["out", "d value", "d locations", "d weights"], atol=1e-5
    )


def test_msda_points_outside_have_zero_output_and_gradient():
    value, sh, st, loc, w = _msda_inputs(1, 8, 2, 16, [[5, 6], [3, 3]], 2)
    loc = torch.full_like(loc, 3.0)  # far outside every level
    loc[0, :4] = -2.5
    locr = loc.clone().requires_grad_()
    vr = value.clone().requires_grad_()
    out = kd.ms_deform_attn(vr, sh, st, locr, w)
    out.sum().backward()
    assert torch.count_nonzero(out) == 0
    assert torch.count_nonzero(locr.grad) == 0 and torch.count_nonzero(vr.grad) == 0


def test_msda_matches_numpy_twin_and_accepts_non_contiguous():
    b, l_q, n_h, d, shapes, n_p = 1, 19, 2, 12, [[6, 4], [3, 2]], 2
    value, sh, st, loc, w = _msda_inputs(b, l_q, n_h, d, shapes, n_p, seed=3)
    # value as a non-contiguous view: (B, S, H, D) from a (B, H, S, D) buffer
    value_nc = value.transpose(1, 2).contiguous().transpose(1, 2)
    assert not value_nc.is_contiguous()
    ours = kd.ms_deform_attn(value_nc, sh, st, loc, w)
    twin = npd.ms_deform_attn(
        value.double().cpu().numpy(),
        sh.cpu().numpy(),
        st.cpu().numpy(),
        loc.double().cpu().numpy(),
        w.double().cpu().numpy(),
    )
    np.testing.assert_allclose(ours.cpu().numpy(), twin, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_msda_low_precision_within_pytorch_error(dtype):
    b, l_q, n_h, d, shapes, n_p = 1, 24, 2, 16, [[6, 7], [3, 4]], 2
    # locations inside [0, 1]: PyTorch's CPU half-precision grid_sample (the reference
    # in the same dtype) can crash on points far outside the map; fp32 tests cover those
    value, sh, st, loc, w = _msda_inputs(
        b, l_q, n_h, d, shapes, n_p, seed=5, lo=0.0, hi=1.0
    )
    grad = torch.randn(b, l_q, n_h * d, device=DEV)
    fn = lambda v, lc, ww: kd.ms_deform_attn(v, sh, st, lc, ww)  # noqa: E731
    ref_fn = lambda v, lc, ww: kd.ms_deform_attn_reference(  # noqa: E731
        v, sh, st, lc, ww
    )
    ours = _run(fn, (value, loc, w), grad, dtype)
    ref = _run(ref_fn, (value, loc, w), grad, torch.float64)
    pt = _run(ref_fn, (value, loc, w), grad, dtype)
    _assert_close(
        ours, ref, pt, ["out", "d value", "d locations", "d weights"], atol=1e-3
    )


def test_msda_bad_inputs():
    value, sh, st, loc, w = _msda_inputs(1, 4, 2, 8, [[4, 4], [2, 2]], 2)
    with pytest.raises(ValueError, match="spatial_shapes"):
        kd.ms_deform_attn(value, torch.tensor([[4, 4], [2, 3]], device=DEV), st, loc, w)
    with pytest.raises(ValueError, match="level_start_index"):
        kd.ms_deform_attn(value, sh, torch.tensor([0, 15], device=DEV), loc, w)
    with pytest.raises(TypeError, match="value"):
        kd.ms_deform_attn(value.int(), sh, st, loc, w)
    with pytest.raises(TypeError, match="spatial_shapes"):
        kd.ms_deform_attn(value, sh.float(), st, loc, w)
    with pytest.raises(ValueError, match="attention_weights"):
        kd.ms_deform_attn(value, sh, st, loc, w[..., :1])
    with pytest.raises(ValueError, match="sampling_locations"):
        kd.ms_deform_attn(value, sh, st, loc[:, :, :1], w)
    with pytest.raises(ValueError, match="value"):
        kd.ms_deform_attn(value[0], sh, st, loc, w)


# --------------------------------------------------------------------------------------
# Fused DAT attention
# --------------------------------------------------------------------------------------

DAT_CASES = [
    # (B, H, G, N_q, N_s, d, H_f, W_f)
    (2, 4, 2, 37, 21, 24, 9, 11),  # groups, odd lengths, d not 2^k
    (1, 2, 1, 70, 80, 16, 7, 5),  # N_q and N_s above one block
    (1, 1, 1, 3, 1, 32, 1, 6),  # one sample, a one-row map
]


def _dat_inputs(case, seed=0, spread=1.3):
    b, n_h, g, n_q, n_s, d, h_f, w_f = case
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, n_h, n_q, d, generator=gen)
    km = torch.randn(b, n_h, h_f, w_f, d, generator=gen)
    vm = torch.randn(b, n_h, h_f, w_f, d, generator=gen)
    # some points outside the map
    pts = (2 * torch.rand(b, g, n_s, 2, generator=gen) - 1) * spread
    return [t.to(DEV) for t in (q, km, vm, pts)]


@pytest.mark.parametrize("align_corners", [True, False])
@pytest.mark.parametrize("case", DAT_CASES, ids=lambda c: "x".join(map(str, c)))
def test_dat_forward_backward_fp32(case, align_corners):
    ins = _dat_inputs(case)
    grad = torch.randn(case[0], case[1], case[3], case[5], device=DEV)
    fn = lambda *a: kd.deformable_attention(  # noqa: E731
        *a, align_corners=align_corners
    )
    ref_fn = lambda *a: kd.deformable_attention_reference(  # noqa: E731
        *a, align_corners=align_corners
    )
    ours = _run(fn, ins, grad, torch.float32)
    ref = _run(ref_fn, ins, grad, torch.float64)
    pt = _run(ref_fn, ins, grad, torch.float32)
    _assert_close(
        ours, ref, pt, ["out", "dq", "dk_map", "dv_map", "dpoints"], atol=1e-5
    )


def test_dat_matches_numpy_twin_non_contiguous_and_scale():
    case = (1, 2, 2, 13, 9, 8, 5, 6)
    q, km, vm, pts = _dat_inputs(case, seed=2)
    # (B, H, N, d) view of (B, N, H, d)
    q_nc = q.transpose(1, 2).contiguous().transpose(1, 2)
    km_nc = km.permute(0, 1, 3, 2, 4).contiguous().permute(0, 1, 3, 2, 4)
    assert not q_nc.is_contiguous() and not km_nc.is_contiguous()
    out = kd.deformable_attention(
        q_nc, km_nc, vm, pts, softmax_scale=0.5, align_corners=False
    )
    twin = npd.deformable_attention(
        *(t.double().cpu().numpy() for t in (q, km, vm, pts)),
        scale=0.5,
        align_corners=False,
    )
    np.testing.assert_allclose(out.cpu().numpy(), twin, rtol=1e-5, atol=1e-5)


def test_dat_points_outside_sample_zeros():
    q, km, vm, pts = _dat_inputs((1, 2, 1, 6, 4, 16, 4, 4))
    pts = torch.full_like(pts, 4.0).requires_grad_()
    out = kd.deformable_attention(q, km, vm, pts)
    out.sum().backward()
    # every sampled key and value is 0: uniform weights over zero values
    assert torch.count_nonzero(out) == 0 and torch.count_nonzero(pts.grad) == 0


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_dat_low_precision_within_pytorch_error(dtype):
    case = (1, 2, 1, 40, 24, 32, 6, 7)
    ins = _dat_inputs(case, seed=4, spread=1.0)
    grad = torch.randn(1, 2, 40, 32, device=DEV)
    fn = lambda *a: kd.deformable_attention(*a)  # noqa: E731
    ours = _run(fn, ins, grad, dtype)
    ref = _run(kd.deformable_attention_reference, ins, grad, torch.float64)
    pt = _run(kd.deformable_attention_reference, ins, grad, dtype)
    _assert_close(
        ours, ref, pt, ["out", "dq", "dk_map", "dv_map", "dpoints"], atol=2e-3
    )


def test_dat_bad_inputs():
    q, km, vm, pts = _dat_inputs((1, 4, 2, 6, 5, 8, 4, 4))
    with pytest.raises(ValueError, match="k_map"):
        kd.deformable_attention(q, km[:, :2], vm, pts)
    with pytest.raises(ValueError, match="v_map"):
        kd.deformable_attention(q, km, vm[..., :4], pts)
    with pytest.raises(ValueError, match="points"):
        kd.deformable_attention(q, km, vm, pts[:, :, :, :1])
    with pytest.raises(ValueError, match="points"):
        kd.deformable_attention(
            q, km, vm, torch.zeros(1, 3, 5, 2, device=DEV)
        )  # 3 !| 4
    with pytest.raises(TypeError, match="q"):
        kd.deformable_attention(q.long(), km, vm, pts)
    with pytest.raises(TypeError, match="share a dtype"):
        kd.deformable_attention(q.half(), km, vm, pts)
    with pytest.raises(ValueError, match="q"):
        kd.deformable_attention(q[0], km, vm, pts)


# --------------------------------------------------------------------------------------
# The GPU code paths compile (ahead of time, on the CPU) with the shipped tile configs:
# kernels.deformable.compile_check
# --------------------------------------------------------------------------------------


@pytest.mark.slow
def test_kernels_compile_for_sm75_sm80_sm90_without_spills():
    """Triton compiles for a GPU it does not have; the interpreter never runs the
    fp16/bf16 tensor-core paths, so this is what checks them on a CPU-only machine."""
    proc, out = run_compiled("-m", "kernels.deformable.compile_check")
    assert proc.returncode == 0, out
    assert "compiled 21" in out, out
    rows = [line for line in proc.stdout.splitlines() if " spill " in line]
    assert len(rows) == 21, out
    spilling = [r for r in rows if " spill -" not in r and " spill 0/0 " not in r]
    assert not spilling, "\n".join(spilling)
    # shared memory per block within each target's opt-in maximum (CUDA
    # programming guide)
    limit = {"sm75": 64 * 1024, "sm80": 163 * 1024, "sm90": 227 * 1024}
    too_big = [r for r in rows if int(r.split()[5]) > limit[r.split()[1]]]
    assert not too_big, "\n".join(too_big)


def test_msda_level_check_sees_in_place_edits():
    # item 4: no cache may skip the bounds check; an edit through .numpy() bypasses
    # torch's version counter, so the check runs on every call
    value, sh, st, loc, w = _msda_inputs(1, 4, 2, 8, [[4, 4], [2, 2]], 2)
    kd.ms_deform_attn(value, sh, st, loc, w)
    kd.ms_deform_attn(value, sh, st, loc, w)
    sh[1, 1] = 3  # in place: now 16 + 6 != S = 20
    with pytest.raises(ValueError, match="spatial_shapes"):
        kd.ms_deform_attn(value, sh, st, loc, w)
    sh[1, 1] = 2
    kd.ms_deform_attn(value, sh, st, loc, w)
    if sh.device.type == "cpu":
        sh.numpy()[0, 0] = 9  # 36 + 4 != 20: reading past the end of value if unchecked
        with pytest.raises(ValueError, match="spatial_shapes"):
            kd.ms_deform_attn(value, sh, st, loc, w)


# --------------------------------------------------------------------------------------
# Drop-in for Deformable DETR's MSDeformAttnFunction: its own test suite
# (models/ops/test.py), float64 forward equality and gradcheck at its head dims.
# gradcheck uses fast_mode (one random direction per input) so D_h = 3096 stays
# seconds under the interpreter.
# --------------------------------------------------------------------------------------


def _detr_inputs(channels, seed):
    g = torch.Generator().manual_seed(seed)
    n, m, lq, n_l, n_p = 1, 2, 2, 2, 2
    shapes = torch.as_tensor([(6, 4), (3, 2)], dtype=torch.long, device=DEV)
    starts = torch.cat((shapes.new_zeros((1,)), shapes.prod(1).cumsum(0)[:-1]))
    s = int(shapes.prod(1).sum())
    value = torch.rand(n, s, m, channels, generator=g) * 0.01
    loc = torch.rand(n, lq, m, n_l, n_p, 2, generator=g)
    w = torch.rand(n, lq, m, n_l, n_p, generator=g) + 1e-5
    w /= w.sum(-1, keepdim=True).sum(-2, keepdim=True)
    return value.to(DEV), shapes, starts, loc.to(DEV), w.to(DEV)


def test_detr_forward_equal_with_pytorch_double_and_float():
    value, shapes, starts, loc, w = _detr_inputs(2, 0)
    ref = kd.ms_deform_attn_reference(
        value.double(), shapes, starts, loc.double(), w.double()
    )
    out = kd.MSDeformAttnFunction.apply(
        value.double(), shapes, starts, loc.double(), w.double(), 2
    )
    assert out.dtype == torch.float64
    assert torch.allclose(out, ref)  # DETR's check: default rtol 1e-5, atol 1e-8
    out32 = kd.MSDeformAttnFunction.apply(value, shapes, starts, loc, w, 2)
    assert torch.allclose(out32.double(), ref, rtol=1e-2, atol=1e-3)


@pytest.mark.parametrize("channels", [30, 32, 64, 71, 1025, 2048, 3096])
def test_detr_gradient_numerical(channels):
    value, shapes, starts, loc, w = _detr_inputs(channels, channels)
    ins = (
        value.double().requires_grad_(),
        shapes,
        starts,
        loc.double().requires_grad_(),
        w.double().requires_grad_(),
        2,
    )
    assert torch.autograd.gradcheck(kd.MSDeformAttnFunction.apply, ins, fast_mode=True)
    ref = kd.ms_deform_attn_reference(*ins[:5])
    assert torch.allclose(kd.MSDeformAttnFunction.apply(*ins), ref)


def test_msda_loops_over_channel_blocks(monkeypatch):
    # item 14: head dims above one block (128 on a GPU) loop over channel blocks;
    # forcing 16-channel blocks under the interpreter exercises that loop, ragged last
    # block included
    monkeypatch.setattr(kd.tiles, "MSDA_INTERPRET_MAX_BLOCK_D", 16)
    monkeypatch.setattr(kd.tiles, "MSDA_MAX_BLOCK_D", 16)
    value, shapes, starts, loc, w = _detr_inputs(71, 1)
    ins = [value.double(), loc.double(), w.double()]
    grad = torch.randn(1, 2, 2 * 71, dtype=torch.float64)
    ours = _run(
        lambda v, lc, ww: kd.ms_deform_attn(v, shapes, starts, lc, ww),
        ins,
        grad,
        torch.float64,
    )
    ref = _run(
        lambda v, lc, ww: kd.ms_deform_attn_reference(v, shapes, starts, lc, ww),
        ins,
        grad,
        torch.float64,
    )
    for a, b in zip(ours, ref):
        # float64, sums of at most L*P*4 = 16 terms per output: a few ulp of
        # the magnitudes
        assert torch.allclose(a, b, rtol=1e-12, atol=1e-14)


def test_msda_nan_location_gives_nan_only_there():
    value, shapes, starts, loc, w = _detr_inputs(8, 2)
    loc[0, 1, 0, 0, 0, 0] = float("nan")  # query 1, head 0
    out = kd.ms_deform_attn(value, shapes, starts, loc, w).view(1, 2, 2, 8)
    assert torch.isnan(out[0, 1, 0]).all()
    assert torch.isfinite(out[0, 0]).all() and torch.isfinite(out[0, 1, 1]).all()


def test_dat_refuses_bad_scale_and_flags():
    q = torch.randn(1, 2, 5, 8, device=DEV)
    km = torch.randn(1, 2, 4, 4, 8, device=DEV)
    pts = torch.rand(1, 1, 3, 2, device=DEV) * 2 - 1
    for scale in (1e300, float("nan"), 3e38):
        with pytest.raises(ValueError, match="^softmax_scale"):
            kd.deformable_attention(q, km, km, pts, softmax_scale=scale)
    with pytest.raises(TypeError, match="align_corners"):
        kd.deformable_attention(q, km, km, pts, align_corners="False")
