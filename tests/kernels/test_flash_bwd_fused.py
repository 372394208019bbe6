"""kernels.flash.backward_fused: the one-kernel backward (dQ by fp32 atomics) against an
independent float64 autograd reference and against kernels.flash's two-kernel backward.

Runs under the Triton interpreter on a CPU (small shapes) and on a CUDA GPU unchanged.
fp32 tolerances come from an error bound (fp32 rounding of the products and sums, and
the scores' error carried through exp), not from one machine; fp16/bf16 follow the
flash-attn rule of tests/kernels/test_flash.py (at most twice PyTorch's own error in
that dtype, plus a small atol). The last test compiles the kernel for sm_90 and sm_80
ahead of time (no GPU needed).
"""

import math

import pytest
import torch

from kernels import runtime
from kernels.flash import backward, forward, tiles
from kernels.flash import backward_fused as fused
from kernels.naive import naive_attention, reference_attention
from tests.kernels.compile_tools import run_compiled

pytestmark = pytest.mark.xdist_group("flash-bwd-fused")

DEVICE = runtime.DEVICE
U32 = 2.0**-24  # fp32 unit roundoff


def _inputs(B, H, H_kv, N_q, N_k, d, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    shapes = ((B, H, N_q, d), (B, H_kv, N_k, d), (B, H_kv, N_k, d), (B, H, N_q, d))
    return [torch.randn(s, generator=g).to(device=DEVICE, dtype=dtype) for s in shapes]


def forward_lse(q, k, v, causal, scale):
    return forward.forward_lse(q, k, v, causal, scale)  # o, lse2 (base 2)


def _ref(q, k, v, do, causal, scale, dlse=None):
    """float64 autograd through kernels.naive.reference_attention (no kernel code):
    gradients of sum(o * do) + sum(lse * dlse) over the rows that see a key."""
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    o, lse = reference_attention(q64, k64, v64, causal, scale)
    loss = (o * do.double()).sum()
    if dlse is not None:
        loss = (
            loss + torch.where(torch.isfinite(lse), lse, 0.0).mul(dlse.double()).sum()
        )
    return torch.autograd.grad(loss, (q64, k64, v64))


def _bound(q, k, v, do, causal, scale, dlse=None):
    """Elementwise error bounds (dq, dk, dv) of an fp32 backward, in float64.

    |P~ - P| <= r P with r = expm1(2 max kappa + 8u) (test_flash's score bound:
    kappa = (gamma_d + 2u) |scale| |q| |k|^T). Each gradient is a sum of products whose
    absolute values sum to M (M_dv = |P|^T |dO|, |dS| <= |P| (|dO| |V|^T + |delta|),
    M_dk = |scale| |dS|^T |Q|, M_dq = |scale| |dS| |K|); rounding them in fp32 costs at
    most gamma_n M with n the longest sum (N + d terms), P's error at most 3 r M.
    """
    group = q.shape[1] // k.shape[1]
    q, do = q.double(), do.double()
    k, v = (t.double().repeat_interleave(group, 1) for t in (k, v))
    n_q, n_k, d = q.shape[2], k.shape[2], q.shape[3]
    s = q @ k.transpose(-1, -2) * scale
    kappa = (
        (d * U32 / (1 - d * U32) + 2 * U32)
        * abs(scale)
        * (q.abs() @ k.abs().transpose(-1, -2))
    )
    vis = torch.ones(n_q, n_k, dtype=torch.bool, device=q.device)
    if causal:
        vis = vis.tril(n_k - n_q)
    s = s.masked_fill(~vis, float("-inf"))
    p = torch.softmax(s, -1).nan_to_num(0.0)  # empty rows: 0
    r = math.expm1(2 * kappa.masked_fill(~vis, 0).max().item() + 8 * U32)
    delta = (do * (p @ v)).sum(-1, keepdim=True).abs()
    if dlse is not None:
        delta = delta + dlse.double().abs()[..., None]
    ds = p * (do.abs() @ v.abs().transpose(-1, -2) + delta)
    n = max(n_q, n_k) + d + 4
    c = 2 * (n * U32 / (1 - n * U32) + 3 * r)  # twice the bound: no luck needed
    m_dv = p.transpose(-1, -2) @ do.abs()
    m_dk = abs(scale) * ds.transpose(-1, -2) @ q.abs()
    m_dq = abs(scale) * ds @ k.abs()

    def fold(t):  # sum over the q heads of a k/v head (GQA)
        return t.unflatten(1, (-1, group)).sum(2)

    return c * m_dq, c * fold(m_dk), c * fold(m_dv)


def _check_fp32(grads, refs, bounds):
    for name, g, r, b in zip(("dq", "dk", "dv"), grads, refs, bounds):
        assert torch.all(torch.isfinite(g)), name
        err = (g.double() - r).abs()
        assert torch.all(err <= b + 1e-30), (name, (err - b).max().item())


# (B, H, H_kv, N_q, N_k, d, causal)
CASES = {
    "aligned": (1, 2, 2, 128, 128, 64, False),
    "aligned-causal": (1, 2, 2, 128, 128, 32, True),
    "ragged-causal": (1, 3, 3, 97, 97, 64, True),
    "cross": (1, 2, 2, 45, 131, 32, False),
    "cross-causal-nk>nq": (1, 2, 2, 50, 150, 64, True),
    "gqa": (1, 4, 2, 70, 90, 32, True),
    "mqa": (2, 4, 1, 33, 65, 16, False),
    "d80": (1, 2, 2, 61, 61, 80, True),
    "masked-rows": (1, 2, 1, 100, 30, 32, True),  # N_q > N_k: 70 rows see no key
    "single": (1, 1, 1, 1, 1, 16, True),
    "d1": (1, 2, 2, 17, 9, 1, False),
}


@pytest.mark.parametrize("case", list(CASES))
def test_fp32_matches_fp64_and_the_two_kernel_backward(case):
    B, H, H_kv, N_q, N_k, d, causal = CASES[case]
    q, k, v, do = _inputs(B, H, H_kv, N_q, N_k, d)
    scale = 1 / math.sqrt(d)
    o, lse2 = forward_lse(q, k, v, causal, scale)
    grads = fused.backward_fused(do, q, k, v, o, lse2, causal, scale)
    for g, t in zip(grads, (q, k, v)):
        assert g.shape == t.shape and g.dtype == t.dtype
    bounds = _bound(q, k, v, do, causal, scale)
    _check_fp32(grads, _ref(q, k, v, do, causal, scale), bounds)
    # the deterministic two-kernel version: both within the bound of fp64, so within
    # twice it of each other (in practice a few fp32 ulps: only summation orders differ)
    two = backward.backward_lse(do, q, k, v, o, lse2, causal, scale)
    for name, g, t, b in zip(("dq", "dk", "dv"), grads, two, bounds):
        assert torch.all((g.double() - t.double()).abs() <= 2 * b + 1e-30), name


def test_random_shapes_and_tiles():
    # random lengths, heads, head dims and tile sizes (the tile table is bypassed:
    # BLOCK_M != BLOCK_N exercises the diagonal-block ranges), causal or not
    gen = torch.Generator().manual_seed(2024)
    tiles = [(16, 32), (32, 64), (64, 16), (128, 32), (32, 128), (16, 16)]
    for i in range(8):
        r = lambda lo, hi: int(torch.randint(lo, hi + 1, (1,), generator=gen))  # noqa
        h_kv = r(1, 2)
        B, H, N_q, N_k = r(1, 2), h_kv * r(1, 2), r(1, 90), r(1, 90)
        d = [1, 8, 16, 24, 32, 64][r(0, 5)]
        causal = bool(r(0, 1))
        tile = tiles[i % len(tiles)]
        scale = [1 / math.sqrt(d), 0.7, -0.3][i % 3]
        q, k, v, do = _inputs(B, H, h_kv, N_q, N_k, d, seed=i)
        o, lse2 = forward_lse(q, k, v, causal, scale)
        grads = fused.backward_fused(do, q, k, v, o, lse2, causal, scale, tiles=tile)
        _check_fp32(
            grads, _ref(q, k, v, do, causal, scale), _bound(q, k, v, do, causal, scale)
        )


@pytest.mark.parametrize(
    "causal,n_q,n_k", [(False, 37, 37), (True, 37, 53), (True, 60, 20)]
)
def test_lse_gradient_enters_through_delta(causal, n_q, n_k):
    q, k, v, do = _inputs(1, 2, 1, n_q, n_k, 16, seed=5)
    scale = 0.25
    o, lse2 = forward_lse(q, k, v, causal, scale)
    dlse = torch.randn(lse2.shape, generator=torch.Generator().manual_seed(1)).to(
        DEVICE
    )
    grads = fused.backward_fused(do, q, k, v, o, lse2, causal, scale, dlse=dlse)
    _check_fp32(
        grads,
        _ref(q, k, v, do, causal, scale, dlse),
        _bound(q, k, v, do, causal, scale, dlse),
    )
    # a precomputed delta (rowsum(dO * O)) gives the same answer, bit for bit
    delta = (do.float() * o.float()).sum(-1)
    again = fused.backward_fused(
        do, q, k, v, o, lse2, causal, scale, dlse=dlse, delta=flash_delta(do, o)
    )
    for a, b in zip(grads, again):
        assert torch.equal(a, b)
    again = fused.backward_fused(
        do, q, k, v, o, lse2, causal, scale, dlse=dlse, delta=delta
    )
    _check_fp32(
        again,
        _ref(q, k, v, do, causal, scale, dlse),
        _bound(q, k, v, do, causal, scale, dlse),
    )


def flash_delta(do, o):
    """kernels.flash's preprocess kernel, launched as its backward launches it."""
    B, H, N_q, d = o.shape
    delta = torch.empty((B, H, N_q), dtype=torch.float32, device=o.device)
    bm = backward.preprocess_block_m(d)
    backward._attn_bwd_preprocess[(-(-N_q // bm), B * H)](
        o,
        do,
        delta,
        *o.stride(),
        *do.stride(),
        H,
        N_q,
        d,
        BLOCK_M=bm,
        BLOCK_D=tiles.block_d(d),
        num_warps=backward.PREPROCESS_NUM_WARPS,
    )
    return delta


def test_rows_that_see_no_key_get_zero_gradient():
    q, k, v, do = _inputs(1, 2, 2, 90, 20, 32)  # causal: rows 0..69 see no key
    scale = 1 / math.sqrt(32)
    o, lse2 = forward_lse(q, k, v, True, scale)
    dq, dk, dv = fused.backward_fused(do, q, k, v, o, lse2, True, scale)
    assert torch.all(dq[:, :, :70] == 0)
    for t in (dq, dk, dv):
        assert torch.all(torch.isfinite(t))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("case", ["ragged-causal", "gqa", "d80"])
def test_half_precision_within_twice_pytorch_error(dtype, case):
    B, H, H_kv, N_q, N_k, d, causal = CASES[case]
    q, k, v, do = _inputs(B, H, H_kv, N_q, N_k, d, dtype=dtype)
    scale = 1 / math.sqrt(d)
    o, lse2 = forward_lse(q, k, v, causal, scale)
    grads = fused.backward_fused(do, q, k, v, o, lse2, causal, scale)
    refs = _ref(q, k, v, do, causal, scale)
    qs, ks, vs = (t.clone().requires_grad_() for t in (q, k, v))
    grads_pt = torch.autograd.grad(
        naive_attention(qs, ks, vs, causal, scale), (qs, ks, vs), do
    )
    atol = {torch.float16: 1e-3, torch.bfloat16: 8e-3}[dtype]
    for name, g, r, g_pt in zip(("dq", "dk", "dv"), grads, refs, grads_pt):
        assert g.dtype == dtype and torch.all(torch.isfinite(g)), name
        err = (g.double() - r).abs().max().item()
        assert err <= 2 * (g_pt.double() - r).abs().max().item() + atol, name


def test_non_contiguous_inputs():
    q, k, v, do = _inputs(1, 2, 2, 40, 40, 32)
    # the same values in (B, N, H, d) storage, seen as (B, H, N, d)
    qt, kt, vt, dot = (
        t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v, do)
    )
    assert not qt.is_contiguous()
    o, lse2 = forward_lse(q, k, v, True, 0.2)
    a = fused.backward_fused(do, q, k, v, o, lse2, True, 0.2)
    b = fused.backward_fused(dot, qt, kt, vt, o, lse2, True, 0.2)
    for x, y in zip(a, b):
        assert torch.equal(x, y)


# --------------------------------------------------------------------------------------
# NaN/inf hidden by the causal mask never reaches another row's or key's gradient
# --------------------------------------------------------------------------------------
def _poison(tensors, which, idx, value):
    out = [t.clone() for t in tensors]
    out[which][..., idx, 3] = value
    return out


@pytest.mark.parametrize("which,idx", [("do", 5), ("q", 5), ("v", 40), ("k", 40)])
def test_hidden_nan_stays_in_the_gradients_that_depend_on_it(which, idx):
    # causal N_q = N_k = 45 (ragged against the tiles): a NaN in dO or Q row 5 is seen
    # by keys 0..5 only, one in V or K row 40 by query rows 40..44 only. Which gradient
    # entries depend on the poisoned input is decided from the fp64 reference itself:
    # those that change at all (float64 bits) when the input is changed between two
    # finite values (a hidden pair adds an exact 0 to the rest). Every other
    # entry must be finite and match; every dependent one must be NaN (not dropped).
    # (The masked tiles go pair by pair here: small tiles keep the interpreter quick.)
    n, d, scale = 45, 16, 0.25
    pos = {"q": 0, "k": 1, "v": 2, "do": 3}[which]
    tile = (16, 32)
    clean = _inputs(1, 1, 1, n, n, d, seed=7)
    q, k, v, do = _poison(clean, pos, idx, float("nan"))
    o, lse2 = forward_lse(q, k, v, True, scale)
    bad = fused.nonfinite_flag(True, q, k, v, do)
    assert bad.tolist() == [1]
    grads = fused.backward_fused(do, q, k, v, o, lse2, True, scale, bad=bad, tiles=tile)
    ref_a = _ref(
        *_poison(clean, pos, idx, 0.0)[:3],
        _poison(clean, pos, idx, 0.0)[3],
        True,
        scale,
    )
    ref_b = _ref(
        *_poison(clean, pos, idx, 3.0)[:3],
        _poison(clean, pos, idx, 3.0)[3],
        True,
        scale,
    )
    bounds = _bound(*clean, True, scale)
    for name, g, ra, rb, b in zip(("dq", "dk", "dv"), grads, ref_a, ref_b, bounds):
        dep = ra != rb
        # (a NaN in V or K reaches every dK, and one in K every dV, through the last
        # rows; the earlier rows' dQ stays free of it)
        free = ~dep
        if name == "dq":
            assert free.any()
        assert torch.all(torch.isfinite(g[free])), name
        # the clean inputs' bound holds for the entries that ignore the poisoned one
        assert torch.all((g.double() - ra).abs()[free] <= 10 * b[free] + 1e-30), name
        assert torch.all(torch.isnan(g[dep])), name
    # without the flag the masked tiles use tl.dot and 0 * NaN leaks (what the flag is
    # for): e.g. a NaN dO row reaches dV of keys it cannot see
    if which == "do":
        leak = fused.backward_fused(do, q, k, v, o, lse2, True, scale, tiles=tile)
        assert torch.isnan(leak[2][..., idx + 1 :, :]).any()


def test_flag_is_zero_for_finite_or_non_causal_inputs():
    q, k, v, do = _inputs(1, 1, 1, 8, 8, 16)
    assert fused.nonfinite_flag(True, q, k, v, do).tolist() == [0]
    k[0, 0, 2, 1] = float("inf")
    assert fused.nonfinite_flag(True, q, k, v, do).tolist() == [1]
    assert fused.nonfinite_flag(False, q, k, v, do).tolist() == [0]
    assert fused.nonfinite_flag(True, q, k, v, do).dtype == torch.int32


# --------------------------------------------------------------------------------------
# Tile tables, and the ahead-of-time compile for sm_90 / sm_80
# --------------------------------------------------------------------------------------
def test_shipped_configs_are_wide_valid_tiles():
    for arch, (cap, _) in fused.ARCHS.items():
        for d in (16, 32, 64, 80, 128, 256):
            for dtype in (torch.float16, torch.bfloat16, torch.float32):
                cfgs = fused.configs(cap, d, dtype)
                # no spill-free tile (the full compile matrix): flash_attention falls
                # back to the two-kernel backward there
                if arch == "sm75" or dtype == torch.float32:
                    assert cfgs == []
                    continue
                assert cfgs, (arch, d, dtype)
                for bm, bn, w, s in cfgs:
                    for b in (bm, bn):
                        assert b >= 16 and b & (b - 1) == 0
                    assert w in (4, 8) and s in (1, 2, 3)
                    # tensor cores: dK/dV tiles of at least 64 keys
                    if dtype != torch.float32 and d <= 128:
                        assert bn >= 64, (arch, d, dtype, bm, bn)


@pytest.mark.slow
@pytest.mark.skipif(runtime.HAS_CUDA, reason="the CPU compile check; a GPU runs it")
def test_compiles_for_sm90_and_sm80_without_spills():
    # one representative case per target (the widest tiles, causal: the masked stage's
    # NaN-selection path is the register peak); the full matrix is
    # `python -m kernels.flash.compile_check_fused`
    out = ""
    for target in ("sm90", "sm80"):
        proc, run_out = run_compiled(
            "-m",
            "kernels.flash.compile_check_fused",
            "--target",
            target,
            "--head-dim",
            "128",
            "--dtype",
            "bf16",
            "--causal",
            "yes",
            "--n",
            "4000",
        )
        out += run_out
        assert proc.returncode == 0, out
        rows = [line for line in proc.stdout.splitlines() if line.startswith(target)]
        assert rows and all(line.endswith("ok") for line in rows), out
        assert all("MEMBAR.ALL.GPU" not in line for line in rows), out
        # the dQ atomics are fire-and-forget reductions (RED, REDG on sm_90), no ATOM
        assert all("red ['RED" in line and "ATOM" not in line for line in rows), out
        if target == "sm90":
            assert all("wgmma True" in line for line in rows), out
