"""attention.deformable (NumPy) against PyTorch (grid_sample, conv2d, autograd) and
finite differences; DAT's position bias against explicit loops; the traffic simulators
against their closed forms."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from attention import deformable as dfm
from attention import memory
from attention.core import scaled_dot_product_attention

pytestmark = pytest.mark.xdist_group("deformable")


def _grid_sample(feat, points, align_corners):
    """Reference: torch grid_sample on a channels-last map. feat (B,H,W,C), points
    (B,N,2)."""
    f = torch.as_tensor(feat).permute(0, 3, 1, 2)  # (B, C, H, W)
    g = torch.as_tensor(points)[:, None]  # (B, 1, N, 2)
    out = F.grid_sample(
        f, g, mode="bilinear", padding_mode="zeros", align_corners=align_corners
    )
    return out[:, :, 0].permute(0, 2, 1)  # (B, N, C)


@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("shape", [(2, 5, 7, 3), (1, 1, 4, 2), (1, 6, 1, 1)])
def test_bilinear_sample_matches_grid_sample(align_corners, shape):
    rng = np.random.default_rng(0)
    feat = rng.normal(size=shape)
    # points inside, on the border and well outside the map (zero padding)
    points = rng.uniform(-1.6, 1.6, size=(shape[0], 40, 2))
    points[:, 0] = [-1.0, -1.0]
    points[:, 1] = [1.0, 1.0]
    points[:, 2] = [5.0, -7.0]
    ours = dfm.bilinear_sample(feat, points, align_corners)
    ref = _grid_sample(feat, points, align_corners).numpy()
    assert ours.shape == (shape[0], 40, shape[3])
    np.testing.assert_allclose(ours, ref, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(ours[:, 2], 0.0)


@pytest.mark.parametrize("align_corners", [False, True])
def test_bilinear_backward_matches_autograd(align_corners):
    rng = np.random.default_rng(1)
    feat = rng.normal(size=(2, 6, 5, 3))
    points = rng.uniform(-1.3, 1.3, size=(2, 30, 2))
    g_out = rng.normal(size=(2, 30, 3))
    gf, gp = dfm.bilinear_sample_backward(feat, points, g_out, align_corners)
    ft = torch.tensor(feat, requires_grad=True)
    pt = torch.tensor(points, requires_grad=True)
    (_grid_sample(ft, pt, align_corners) * torch.tensor(g_out)).sum().backward()
    np.testing.assert_allclose(gf, ft.grad.numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(gp, pt.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_bilinear_point_gradient_finite_differences():
    rng = np.random.default_rng(2)
    feat = rng.normal(size=(1, 5, 6, 4))
    points = rng.uniform(-0.9, 0.9, size=(1, 8, 2))
    g_out = rng.normal(size=(1, 8, 4))
    _, gp = dfm.bilinear_sample_backward(feat, points, g_out, align_corners=False)
    eps = 1e-6
    fd = np.zeros_like(points)
    for n in range(points.shape[1]):
        for a in range(2):
            hi, lo = points.copy(), points.copy()
            hi[0, n, a] += eps
            lo[0, n, a] -= eps
            f_hi = (dfm.bilinear_sample(feat, hi) * g_out).sum()
            f_lo = (dfm.bilinear_sample(feat, lo) * g_out).sum()
            fd[0, n, a] = (f_hi - f_lo) / (2 * eps)
    np.testing.assert_allclose(gp, fd, rtol=1e-6, atol=1e-8)


def test_coordinates_round_trip_and_reference_grid():
    pts = np.array([[-1.0, -1.0], [1.0, 1.0], [0.0, 0.0]])
    np.testing.assert_allclose(
        dfm.to_pixels(pts, 4, 8, True), [[0, 0], [7, 3], [3.5, 1.5]]
    )
    np.testing.assert_allclose(
        dfm.to_pixels(pts, 4, 8, False), [[-0.5, -0.5], [7.5, 3.5], [3.5, 1.5]]
    )
    for ac in (False, True):
        back = dfm.to_normalized(dfm.to_pixels(pts, 4, 8, ac), 4, 8, ac)
        np.testing.assert_allclose(back, pts)
    ref = dfm.reference_grid(2, 3)
    assert ref.shape == (6, 2)
    # cell centres of a 2x3 grid on an 8x12 map (r = 4) are pixel (4j + 1.5, 4i + 1.5)
    px = dfm.to_pixels(ref, 8, 12, align_corners=False)
    np.testing.assert_allclose(px[:3, 0], [1.5, 5.5, 9.5])
    np.testing.assert_allclose(px[::3, 1], [1.5, 5.5])


def test_offset_network_matches_torch():
    rng = np.random.default_rng(3)
    c, k, r = 4, 5, 4
    params = dfm.init_offset_params(c, k, rng)
    params["b_dw"] = rng.normal(size=c)
    q = rng.normal(size=(2, c, 16, 12))
    ours = dfm.offset_network(q, params, stride=r, offset_range=0.3)
    hid = F.conv2d(
        torch.tensor(q),
        torch.tensor(params["w_dw"])[:, None],
        torch.tensor(params["b_dw"]),
        stride=r,
        padding=k // 2,
        groups=c,
    )
    raw = F.conv2d(F.gelu(hid), torch.tensor(params["w_pw"])[:, :, None, None])
    ref = (torch.tanh(raw) * 0.3).permute(0, 2, 3, 1).numpy()  # (B, H_r, W_r, 2)
    assert ours.shape == (2, 4, 3, 2)
    np.testing.assert_allclose(ours, ref, rtol=1e-10, atol=1e-12)
    assert np.abs(ours).max() <= 0.3


def test_dat_attention_one_group_equals_project_then_sample():
    """Sampling and projecting commute (both linear), so with G = 1 DAT equals the
    kernel's form: sample the projected K and V maps."""
    rng = np.random.default_rng(4)
    b, h, w, c, n_h, r = 1, 8, 12, 8, 2, 4
    x = rng.normal(size=(b, h, w, c))
    p = dfm.init_dat_params(c, 1, 3, rng)
    res = dfm.dat_attention(
        x, p, n_heads=n_h, n_groups=1, stride=r, offset_range=0.4, return_all=True
    )
    assert res["out"].shape == (b, h, w, c)
    assert res["points"].shape == (b, 1, (h // r) * (w // r), 2)
    q = (x @ p["w_q"]).reshape(b, h * w, n_h, c // n_h)
    q = q.transpose(0, 2, 1, 3)  # (B, H, N, d)
    kmap = (x @ p["w_k"]).reshape(b, h, w, n_h, c // n_h).transpose(0, 3, 1, 2, 4)
    vmap = (x @ p["w_v"]).reshape(b, h, w, n_h, c // n_h).transpose(0, 3, 1, 2, 4)
    o = dfm.deformable_attention(q, kmap, vmap, res["points"], align_corners=False)
    np.testing.assert_allclose(o, res["o"], rtol=1e-10, atol=1e-12)


def test_dat_attention_groups_and_bad_shapes():
    rng = np.random.default_rng(5)
    x = rng.normal(size=(2, 8, 8, 8))
    p = dfm.init_dat_params(8, 2, 3, rng)
    res = dfm.dat_attention(
        x, p, n_heads=4, n_groups=2, stride=2, offset_range=0.2, return_all=True
    )
    assert res["points"].shape == (2, 2, 16, 2)
    assert res["weights"].shape == (2, 4, 64, 16)
    np.testing.assert_allclose(res["weights"].sum(-1), 1.0)
    with pytest.raises(ValueError, match="n_heads"):
        dfm.dat_attention(x, p, n_heads=3, n_groups=2, stride=2, offset_range=0.2)


def test_deformable_attention_matches_torch():
    rng = np.random.default_rng(6)
    b, n_h, g, n_q, n_s, d, hf, wf = 2, 4, 2, 9, 7, 8, 5, 6
    q = rng.normal(size=(b, n_h, n_q, d))
    km = rng.normal(size=(b, n_h, hf, wf, d))
    vm = rng.normal(size=(b, n_h, hf, wf, d))
    pts = rng.uniform(-1.2, 1.2, size=(b, g, n_s, 2))
    ours = dfm.deformable_attention(q, km, vm, pts, align_corners=True)
    pts_h = np.repeat(pts, n_h // g, axis=1).reshape(b * n_h, n_s, 2)
    k = _grid_sample(km.reshape(b * n_h, hf, wf, d), pts_h, True)
    v = _grid_sample(vm.reshape(b * n_h, hf, wf, d), pts_h, True)
    k, v = k.reshape(b, n_h, n_s, d), v.reshape(b, n_h, n_s, d)
    ref = torch.softmax(torch.tensor(q) @ k.transpose(-1, -2) / np.sqrt(d), -1) @ v
    np.testing.assert_allclose(ours, ref.numpy(), rtol=1e-10, atol=1e-12)


def _msda_pytorch(value, shapes, loc, w):
    """Deformable DETR's ms_deform_attn_core_pytorch."""
    b, _, n_h, d = value.shape
    _, l_q, _, n_l, n_p, _ = loc.shape
    splits = value.split([int(h * w_) for h, w_ in shapes], dim=1)
    grids = 2 * loc - 1
    outs = []
    for lvl, (h, w_) in enumerate(shapes):
        v = splits[lvl].flatten(2).transpose(1, 2).reshape(b * n_h, d, int(h), int(w_))
        g = grids[:, :, :, lvl].transpose(1, 2).flatten(0, 1)  # (B*H, L_q, P, 2)
        outs.append(
            F.grid_sample(
                v, g, mode="bilinear", padding_mode="zeros", align_corners=False
            )
        )
    ww = w.transpose(1, 2).reshape(b * n_h, 1, l_q, n_l * n_p)
    out = (torch.stack(outs, dim=-2).flatten(-2) * ww).sum(-1).view(b, n_h * d, l_q)
    return out.transpose(1, 2)


def test_ms_deform_attn_matches_deformable_detr_reference():
    rng = np.random.default_rng(7)
    shapes = np.array([[6, 8], [3, 4], [2, 2], [1, 1]])
    s = int((shapes[:, 0] * shapes[:, 1]).sum())
    b, n_h, d, l_q, n_p = 2, 3, 4, 5, 3
    value = rng.normal(size=(b, s, n_h, d))
    loc = rng.uniform(-0.2, 1.2, size=(b, l_q, n_h, 4, n_p, 2))
    w = rng.uniform(size=(b, l_q, n_h, 4, n_p))
    ours = dfm.ms_deform_attn(value, shapes, dfm.level_start_index(shapes), loc, w)
    ref = _msda_pytorch(torch.tensor(value), shapes, torch.tensor(loc), torch.tensor(w))
    assert ours.shape == (b, l_q, n_h * d)
    np.testing.assert_allclose(ours, ref.numpy(), rtol=1e-10, atol=1e-12)


def test_msda_layer_weights_and_locations():
    rng = np.random.default_rng(8)
    shapes = np.array([[8, 8], [4, 4]])
    c, n_h, n_p = 8, 2, 4
    p = dfm.init_msda_params(c, n_h, 2, n_p, rng)
    x = rng.normal(size=(1, 80, c))
    query = rng.normal(size=(1, 5, c))
    ref = rng.uniform(0.2, 0.8, size=(1, 5, 2))
    res = dfm.msda_layer(query, ref, x, shapes, p, n_h, n_p, return_all=True)
    assert res["out"].shape == (1, 5, c)
    assert res["locations"].shape == (1, 5, n_h, 2, n_p, 2)
    np.testing.assert_allclose(res["weights"].sum(axis=(-1, -2)), 1.0)
    # initial offsets: point p of head 0 (direction +x) sits p+1 pixels right of the
    # reference
    dx_pix = (res["locations"][0, :, 0, 0, :, 0] - ref[0, :, None, 0]) * 8
    np.testing.assert_allclose(
        dx_pix, np.arange(1, n_p + 1)[None].repeat(5, 0), atol=0.2
    )


@pytest.mark.parametrize(
    "name,kw",
    [
        ("dense-image", dict(height=10, width=13, d=16, Br=32, Bc=16)),
        ("dat", dict(height=10, width=13, d=16, r=3, Br=32, Bc=16)),
        ("dat-unfused", dict(height=10, width=13, d=16, r=3, Br=32, Bc=16)),
        ("msda", dict(n_queries=77, d=16, n_levels=3, n_points=2, Bq=32)),
    ],
)
def test_traffic_simulation_matches_closed_form(name, kw):
    sim = memory.simulate(name, **kw)
    closed = memory.closed_form(name, **kw)
    assert sim.per_tensor == closed.per_tensor
    assert sim.total == closed.total > 0


def test_traffic_fused_dat_never_writes_sampled_keys():
    kw = dict(height=32, width=32, d=32, r=4)
    fused, unfused = memory.simulate("dat", **kw), memory.simulate("dat-unfused", **kw)
    assert "K̃" not in fused.per_tensor and fused.writes == 32 * 32 * 32
    assert unfused.per_tensor["K̃"][1] == 64 * 32
    # both read the same queries and write the same outputs
    assert fused.per_tensor["Q"] == unfused.per_tensor["Q"]


def test_attention_cost():
    c = dfm.attention_cost(64, 64, 256, r=8, n_levels=4, n_points=4)
    assert c["dense"]["keys"] == 4096 and c["dat"]["keys"] == 64
    assert c["msda"]["keys"] == 16


def test_scaled_attention_reference_consistency():
    # deformable_attention on points exactly on pixel centres is plain attention
    rng = np.random.default_rng(9)
    hf, wf, d = 3, 4, 5
    km = rng.normal(size=(1, 1, hf, wf, d))
    vm = rng.normal(size=(1, 1, hf, wf, d))
    q = rng.normal(size=(1, 1, 6, d))
    pix = np.stack(np.meshgrid(np.arange(wf), np.arange(hf)), -1)
    pix = pix.reshape(-1, 2)  # (x, y)
    pts = dfm.to_normalized(pix, hf, wf, align_corners=True)[None, None]
    o = dfm.deformable_attention(q, km, vm, pts, align_corners=True)
    ref = scaled_dot_product_attention(
        q, km.reshape(1, 1, hf * wf, d), vm.reshape(1, 1, hf * wf, d)
    )
    np.testing.assert_allclose(o, ref, rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------- no silent wrong answers


def test_nan_point_gives_nan_sample_not_index_error():
    # item 11: a NaN sampling point used to crash the sampler with IndexError
    feat = np.random.default_rng(0).normal(size=(1, 4, 5, 3))
    pts = np.array([[[np.nan, 0.0], [0.1, 0.2], [0.3, np.inf]]])
    out = dfm.bilinear_sample(feat, pts)
    assert np.isnan(out[0, [0, 2]]).all() and np.isfinite(out[0, 1]).all()
    g_feat, g_pts = dfm.bilinear_sample_backward(feat, pts, np.ones((1, 3, 3)))
    assert np.isnan(g_pts[0, 0]).all() and np.isfinite(g_pts[0, 1]).all()


def test_ms_deform_attn_checks_levels_like_the_kernel():
    # item 5: level tensors that do not describe value are refused, not read wrongly
    v = np.ones((1, 6, 1, 2))
    loc, w = np.full((1, 1, 1, 1, 1, 2), 0.5), np.ones((1, 1, 1, 1, 1))
    with pytest.raises(ValueError, match="spatial_shapes"):
        dfm.ms_deform_attn(v, [[2, 2]], [0], loc, w)  # 4 positions, S = 6
    with pytest.raises(ValueError, match="level_start"):
        dfm.ms_deform_attn(v, [[2, 3]], [1], loc, w)
    with pytest.raises(TypeError, match="spatial_shapes"):
        dfm.ms_deform_attn(v, [[2.0, 3.0]], [0], loc, w)
    with pytest.raises(ValueError, match="attention_weights"):
        dfm.ms_deform_attn(v, [[2, 3]], [0], loc, w[..., :0])
    with pytest.raises(TypeError, match="align_corners"):
        dfm.bilinear_sample(
            np.ones((1, 2, 2, 1)), np.zeros((1, 1, 2)), align_corners="False"
        )


# --------------------------------------------------------------------------------------
# DAT's deformable relative position bias and the offset network's LayerNorm
# --------------------------------------------------------------------------------------


def _loop_bias(table, points, height, width, align_corners):
    """Independent float64 reference of DAT's bias, one (head, query, sample) at a time:
    the sample's pixel position, the displacement from the query pixel, and a bilinear
    read of the table at (W - 1 + dx, H - 1 + dy) with zero padding."""
    b, g, n_s, _ = points.shape
    n_h = table.shape[0]
    out = np.zeros((b, n_h, height * width, n_s))
    for bi in range(b):
        for hd in range(n_h):
            grp = hd // (n_h // g)
            for qi in range(height * width):
                i, j = divmod(qi, width)
                for n in range(n_s):
                    x, y = points[bi, grp, n]
                    if align_corners:
                        px, py = (x + 1) / 2 * (width - 1), (y + 1) / 2 * (height - 1)
                    else:
                        px, py = ((x + 1) * width - 1) / 2, ((y + 1) * height - 1) / 2
                    tx, ty = (j - px) + width - 1, (i - py) + height - 1
                    x0, y0 = int(np.floor(tx)), int(np.floor(ty))
                    acc = 0.0
                    for yy, wy in ((y0, 1 - (ty - y0)), (y0 + 1, ty - y0)):
                        for xx, wx in ((x0, 1 - (tx - x0)), (x0 + 1, tx - x0)):
                            if 0 <= yy < 2 * height - 1 and 0 <= xx < 2 * width - 1:
                                acc += wy * wx * table[hd, yy, xx]
                    out[bi, hd, qi, n] = acc
    return out


def _loop_attention(q, k, v, bias):
    """o = softmax(q k^T / sqrt(d) + bias) v, row by row with an explicit max-shifted
    softmax. q (B, H, N_q, d), k and v (B, H, N_s, d), bias (B, H, N_q, N_s)."""
    b, n_h, n_q, d = q.shape
    o = np.zeros_like(q)
    p = np.zeros(bias.shape)
    for bi in range(b):
        for hd in range(n_h):
            for i in range(n_q):
                s = [
                    float(q[bi, hd, i] @ k[bi, hd, n]) / np.sqrt(d) + bias[bi, hd, i, n]
                    for n in range(k.shape[2])
                ]
                e = np.exp(np.array(s) - max(s))
                p[bi, hd, i] = e / e.sum()
                o[bi, hd, i] = p[bi, hd, i] @ v[bi, hd]
    return o, p


@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize(
    "seed,b,h,w,c,n_h,g,r",
    [(10, 1, 6, 5, 4, 2, 1, 2), (11, 2, 4, 7, 8, 4, 2, 3), (12, 1, 5, 5, 6, 3, 3, 2)],
)
def test_dat_position_bias_matches_explicit_loops(
    align_corners, seed, b, h, w, c, n_h, g, r
):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(b, h, w, c))
    p = dfm.init_dat_params(c, g, 3, rng)
    table = rng.normal(0.0, 1.0, (n_h, 2 * h - 1, 2 * w - 1))
    kw = dict(
        n_heads=n_h,
        n_groups=g,
        stride=r,
        offset_range=0.6,
        align_corners=align_corners,
        return_all=True,
    )
    plain = dfm.dat_attention(x, p, **kw)
    res = dfm.dat_attention(x, p, rpb_table=table, **kw)
    assert plain["bias"] is None
    np.testing.assert_array_equal(res["points"], plain["points"])  # bias moves no point
    bias = _loop_bias(table, plain["points"], h, w, align_corners)
    np.testing.assert_allclose(res["bias"], bias, rtol=1e-12, atol=1e-12)
    split = lambda t: t.reshape(b, -1, n_h, c // n_h).transpose(0, 2, 1, 3)  # noqa: E731
    o, weights = _loop_attention(
        split(plain["q"]), split(plain["k"]), split(plain["v"]), bias
    )
    out = o.transpose(0, 2, 1, 3).reshape(b, h * w, c) @ p["w_o"]
    np.testing.assert_allclose(res["weights"], weights, rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(
        res["out"], out.reshape(b, h, w, c), rtol=1e-10, atol=1e-12
    )
    assert not np.allclose(res["out"], plain["out"])  # a random table changes it


def test_dat_position_bias_of_a_zero_table_changes_nothing():
    rng = np.random.default_rng(13)
    x = rng.normal(size=(2, 8, 8, 8))
    p = dfm.init_dat_params(8, 2, 3, rng)
    kw = dict(n_heads=4, n_groups=2, stride=2, offset_range=0.3)
    zero = np.zeros((4, 15, 15))
    np.testing.assert_array_equal(
        dfm.dat_attention(x, p, **kw), dfm.dat_attention(x, p, rpb_table=zero, **kw)
    )


@pytest.mark.parametrize("align_corners", [False, True])
def test_position_bias_at_grid_points_is_the_table_entry(align_corners):
    """A sample an integer number of pixels (dx, dy) from a query reads exactly entry
    [H - 1 + dy, W - 1 + dx]; halfway between two entries it reads their mean."""
    rng = np.random.default_rng(14)
    h, w, n_h = 4, 8, 2  # powers of two: pixel <-> normalised is exact, both ways
    table = rng.normal(size=(n_h, 2 * h - 1, 2 * w - 1))
    pix = np.array([[0.0, 0.0], [7.0, 3.0], [2.0, 1.0], [5.0, 2.0]])  # (column, row)
    points = dfm.to_normalized(pix, h, w, align_corners)[None, None]  # (1, 1, 4, 2)
    np.testing.assert_array_equal(dfm.to_pixels(points, h, w, align_corners)[0, 0], pix)
    bias = dfm.relative_position_bias(table, points, h, w, align_corners)
    assert bias.shape == (1, n_h, h * w, 4)
    for qi in range(h * w):
        i, j = divmod(qi, w)
        for n, (pc, pr) in enumerate(pix.astype(int)):
            dy, dx = i - pr, j - pc
            np.testing.assert_array_equal(
                bias[0, :, qi, n], table[:, h - 1 + dy, w - 1 + dx]
            )
    # the lookup itself: integer pixels read entries, half pixels average two
    tab = table.transpose(1, 2, 0)[None]  # (1, 2H-1, 2W-1, n_h)
    at = np.array([[[3.0, 2.0], [0.0, 6.0], [3.5, 2.0], [14.0, 6.0], [15.0, 2.0]]])
    got = dfm.bilinear_sample_pixels(tab, at)[0]
    np.testing.assert_array_equal(got[0], table[:, 2, 3])
    np.testing.assert_array_equal(got[1], table[:, 6, 0])
    np.testing.assert_allclose(
        got[2], (table[:, 2, 3] + table[:, 2, 4]) / 2, rtol=1e-15
    )
    np.testing.assert_array_equal(got[3], table[:, 6, 14])  # the last column
    np.testing.assert_array_equal(got[4], 0.0)  # beyond the table: zero padding


def test_position_bias_is_dat_official_grid_sample_with_align_corners_true():
    """DAT's code: q_grid = 2 (j, i) / (W - 1, H - 1) - 1, displacement (q - p) / 2,
    grid_sample(table, displacement, bilinear, zeros, align_corners=True)."""
    rng = np.random.default_rng(15)
    b, g, n_h, h, w, n_s = 2, 2, 4, 5, 6, 7
    table = rng.normal(size=(n_h, 2 * h - 1, 2 * w - 1))
    points = rng.uniform(-1.2, 1.2, size=(b, g, n_s, 2))  # some outside the map
    ours = dfm.relative_position_bias(table, points, h, w, align_corners=True)
    rows, cols = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    q_grid = np.stack([2 * cols / (w - 1) - 1, 2 * rows / (h - 1) - 1], -1)
    q_grid = q_grid.reshape(-1, 2)  # (HW, 2) as (x, y)
    disp = (q_grid[None, None, :, None] - points[:, :, None]) * 0.5  # (B,G,HW,N_s,2)
    tab = torch.tensor(table).reshape(1, g, n_h // g, 2 * h - 1, 2 * w - 1)
    tab = tab.expand(b, -1, -1, -1, -1).reshape(b * g, n_h // g, 2 * h - 1, 2 * w - 1)
    ref = F.grid_sample(
        tab,
        torch.tensor(disp).reshape(b * g, h * w, n_s, 2),
        mode="bilinear",
        padding_mode="zeros",
        align_corners=True,
    )
    ref = ref.reshape(b, n_h, h * w, n_s).numpy()  # (B*G, h_g, HW, N_s) -> by head
    np.testing.assert_allclose(ours, ref, rtol=1e-12, atol=1e-12)


def test_position_bias_checks_shapes():
    rng = np.random.default_rng(16)
    x = rng.normal(size=(1, 4, 4, 4))
    p = dfm.init_dat_params(4, 1, 3, rng)
    kw = dict(n_heads=2, n_groups=1, stride=2, offset_range=0.3)
    with pytest.raises(ValueError, match="rpb_table"):
        dfm.dat_attention(x, p, rpb_table=np.zeros((2, 8, 7)), **kw)
    with pytest.raises(ValueError, match="rpb_table"):
        dfm.dat_attention(x, p, rpb_table=np.zeros((3, 7, 7)), **kw)
    with pytest.raises(ValueError, match="points"):
        dfm.relative_position_bias(np.zeros((3, 7, 7)), np.zeros((1, 2, 4, 2)), 4, 4)
    table = dfm.init_rpb_table(2, 4, 4, rng)
    assert table.shape == (2, 7, 7) and np.abs(table).max() < 0.1  # DAT's std 0.01


def test_offset_network_layer_norm_matches_torch():
    rng = np.random.default_rng(17)
    c, k, r = 6, 3, 2
    params = dfm.init_offset_params(c, k, rng, layer_norm=True)
    assert np.array_equal(
        params["ln_w"], np.ones(c)
    ) and "ln_w" not in dfm.init_offset_params(c, k, rng)
    params.update(
        b_dw=rng.normal(size=c), ln_w=rng.normal(size=c), ln_b=rng.normal(size=c)
    )
    q = rng.normal(size=(2, c, 8, 6))
    ours = dfm.offset_network(q, params, stride=r, offset_range=0.5)
    hid = F.conv2d(
        torch.tensor(q),
        torch.tensor(params["w_dw"])[:, None],
        torch.tensor(params["b_dw"]),
        stride=r,
        padding=k // 2,
        groups=c,
    )
    hid = F.layer_norm(
        hid.permute(0, 2, 3, 1),
        (c,),
        torch.tensor(params["ln_w"]),
        torch.tensor(params["ln_b"]),
        eps=1e-5,
    ).permute(0, 3, 1, 2)
    raw = F.conv2d(F.gelu(hid), torch.tensor(params["w_pw"])[:, :, None, None])
    ref = (torch.tanh(raw) * 0.5).permute(0, 2, 3, 1).numpy()
    np.testing.assert_allclose(ours, ref, rtol=1e-10, atol=1e-12)
    x = rng.normal(size=(1, 8, 8, c))
    p = dfm.init_dat_params(c, 1, 3, rng, layer_norm=True)
    assert dfm.dat_attention(x, p, 2, 1, 2, 0.3).shape == x.shape


def test_package_reexports_and_module_sizes():
    """attention.deformable is a package of modules of at most ~600 lines; every public
    name is importable from the package and the traffic algorithms are registered."""
    import pathlib

    for name in dfm.__all__:
        assert hasattr(dfm, name), name
    for path in pathlib.Path(dfm.__file__).parent.glob("*.py"):
        assert len(path.read_text().splitlines()) <= 600, path.name
    for name in ("dense-image", "dat", "dat-unfused", "msda"):
        memory.closed_form(
            name,
            **(
                {"n_queries": 64, "d": 8}
                if name == "msda"
                else {"height": 8, "width": 8, "d": 8}
            ),
        )
