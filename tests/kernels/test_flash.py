"""kernels.flash: forward, backward and attention_probs against fp64 references
and PyTorch.

Runs under the Triton interpreter on a CPU (small shapes), and on a CUDA GPU unchanged.
fp16/bf16 tolerances follow the flash-attn rule: the kernel's error against the fp64
reference may be at most twice PyTorch's own error in the same dtype, plus a small atol.
"""

import math

import pytest
import torch
import torch.nn.functional as F

from kernels import flash, runtime
from kernels.flash import attention_probs, flash_attention, tiles
from kernels.naive import naive_attention, reference_attention
from tests.kernels.flash_tools import max_err, qkv, ref_grads

pytestmark = pytest.mark.xdist_group("flash")

DEVICE = runtime.DEVICE


# (B, H, H_kv, N_q, N_k, d, causal): every case class once, small enough for the
# Triton interpreter
CASES = {
    # EVEN_M, EVEN_N, EVEN_D: no masks at all
    "aligned": (1, 2, 2, 128, 128, 64, False),
    "aligned-causal": (1, 2, 2, 128, 128, 32, True),
    "ragged": (2, 2, 2, 77, 77, 16, False),
    "ragged-causal": (1, 3, 3, 97, 97, 64, True),
    "cross": (1, 2, 2, 45, 131, 32, False),
    "cross-causal-nk>nq": (1, 2, 2, 50, 150, 64, True),
    "gqa": (1, 4, 2, 70, 90, 32, True),
    "mqa": (2, 4, 1, 33, 65, 16, False),
    "d80": (1, 2, 2, 61, 61, 80, True),  # head dim not a power of two: padded to 128
    "d96": (1, 1, 1, 40, 70, 96, False),
    "d128": (1, 2, 1, 65, 64, 128, True),
    "d256": (1, 1, 1, 33, 47, 256, True),
    "masked-rows": (1, 2, 1, 100, 30, 32, True),  # causal N_q > N_k: 70 rows see no key
    "single": (1, 1, 1, 1, 1, 16, True),
    "d1": (1, 2, 2, 17, 9, 1, False),
}


@pytest.mark.parametrize("case", list(CASES))
def test_fp32_forward_and_backward_match_fp64(case):
    B, H, H_kv, N_q, N_k, d, causal = CASES[case]
    q, k, v = qkv(B, H, H_kv, N_q, N_k, d, grad=True)
    o, lse = flash_attention(q, k, v, causal=causal, return_lse=True)
    assert o.shape == (B, H, N_q, d) and o.dtype == torch.float32
    assert lse.shape == (B, H, N_q) and lse.dtype == torch.float32
    do = torch.randn_like(o)
    o.backward(do)
    o_ref, lse_ref, (dq_ref, dk_ref, dv_ref) = ref_grads(q, k, v, do, causal)

    assert max_err(o, o_ref) < 2e-5
    visible = torch.isfinite(lse_ref)
    # -inf exactly where no key is visible
    assert torch.equal(torch.isfinite(lse), visible)
    assert torch.all(torch.isneginf(lse[~visible]))
    assert max_err(lse[visible], lse_ref[visible]) < 2e-5
    for name, t, ref in (("dq", q, dq_ref), ("dk", k, dk_ref), ("dv", v, dv_ref)):
        assert t.grad.shape == t.shape and t.grad.dtype == t.dtype
        assert torch.all(torch.isfinite(t.grad)), name
        assert max_err(t.grad, ref) < 1e-4 * max(1.0, ref.abs().max().item()), name


def test_fully_masked_rows_give_zero_output_and_zero_grad():
    q, k, v = qkv(1, 2, 2, 90, 20, 32, grad=True)  # causal: rows 0..69 see no key
    o, lse = flash_attention(q, k, v, causal=True, return_lse=True)
    o.sum().backward()
    assert torch.all(o[:, :, :70] == 0) and torch.all(torch.isneginf(lse[:, :, :70]))
    assert torch.all(torch.isfinite(o)) and torch.all(torch.isfinite(lse[:, :, 70:]))
    assert torch.all(q.grad[:, :, :70] == 0)
    for t in (q, k, v):
        assert torch.all(torch.isfinite(t.grad))


def test_agrees_with_torch_sdpa():
    q, k, v = qkv(2, 4, 2, 64, 64, 32)
    for causal in (False, True):
        expected = F.scaled_dot_product_attention(
            q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), is_causal=causal
        )
        assert max_err(flash_attention(q, k, v, causal=causal), expected) < 2e-5
        assert max_err(naive_attention(q, k, v, causal=causal), expected) < 2e-5


U32 = 2.0**-24  # fp32 unit roundoff


def _softmax_error_bound(q, k, causal, sm_scale):
    """Forward error bound of P = softmax(q k^T * scale) computed in fp32, from
    fp64 inputs.

    Each score is a length-d fp32 dot product, then scaled: |s~ - s| <= kappa_ij with
    kappa_ij = (gamma_d + 2u) * scale * sum_c |q_ic| |k_jc| (gamma_d = d u / (1 - d u)).
    lse moves by at most max_j kappa_ij, so |ln P~_ij - ln P_ij| <= r_ij = kappa_ij +
    max_j kappa_ij + 8u (exp2/log2 and the rescalings) and |P~ - P| <= P * expm1(r).
    Returns (P (fp64), |P~ - P| bound, max_j kappa_ij + 8u per row: the lse bound).
    """
    d = q.shape[-1]
    scale = sm_scale or 1 / math.sqrt(d)
    gamma = d * U32 / (1 - d * U32)
    s_abs = (q.abs().double() @ k.abs().double().transpose(-1, -2)) * abs(scale)
    kappa = (gamma + 2 * U32) * s_abs
    s = (q.double() @ k.double().transpose(-1, -2)) * scale
    if causal:
        hidden = ~torch.ones(s.shape[-2:], dtype=torch.bool).tril(
            s.shape[-1] - s.shape[-2]
        )
        s = s.masked_fill(hidden, float("-inf"))
        kappa = kappa.masked_fill(hidden, 0.0)
    p = torch.softmax(s, dim=-1)
    row = kappa.amax(-1, keepdim=True) + 8 * U32
    return p, p * torch.expm1(kappa + row), row[..., 0]


def test_custom_scale_and_large_logits_do_not_overflow():
    # Inputs of size ~1e2: scores ~1e4 * sqrt(d); exp would overflow without the running
    # max. Tolerances come from a forward error bound, not from one machine: fp32
    # rounding of scores of ~1e4 moves them by ~1e-3 absolute, hence P by ~1e-3 relative
    # (_softmax_error_bound). o = P V / l, lse and dv = P^T dO inherit that bound plus
    # their own fp32 summation error (N u relative). dq and dk are not well conditioned:
    # softmax is nearly one-hot, dS = P * (dP - delta) cancels almost exactly, and the
    # FlashAttention-2 identity delta = rowsum(dO * O) rounds differently from dP, so
    # their error is bounded by fp32 rounding of dP (eps * |dO| |V|) amplified by
    # scale * |K|.
    q, k, v = qkv(1, 2, 2, 64, 80, 32, scale=100.0, grad=True)
    n_q, n_k = q.shape[2], k.shape[2]
    for sm_scale in (None, 0.05):
        o, lse = flash_attention(
            q, k, v, causal=True, softmax_scale=sm_scale, return_lse=True
        )
        do = torch.randn_like(o)
        dq, dk, dv = torch.autograd.grad(o, (q, k, v), do)
        o_ref, lse_ref, (dq_r, dk_r, dv_r) = ref_grads(q, k, v, do, True, sm_scale)
        for t in (o, lse, dq, dk, dv):
            assert torch.all(torch.isfinite(t))
        p, dp_bound, lse_bound = _softmax_error_bound(
            q.detach(), k.detach(), True, sm_scale
        )
        va, doa = v.detach().abs().double(), do.abs().double()
        o_tol = dp_bound @ va + (n_k + 4) * U32 * (p @ va)  # (B, H, N_q, d)
        assert torch.all((o.double() - o_ref).abs() <= 2 * o_tol + 1e-30)
        lse_tol = lse_bound + 4 * U32 * lse_ref.abs()
        assert torch.all((lse.double() - lse_ref).abs() <= 2 * lse_tol)
        dv_tol = dp_bound.transpose(-1, -2) @ doa + (n_q + 4) * U32 * (
            p.transpose(-1, -2) @ doa
        )
        assert torch.all((dv.double() - dv_r).abs() <= 2 * dv_tol + 1e-30)
        scale = sm_scale or 1 / math.sqrt(q.shape[-1])
        dp_bound = (do.abs().double() @ v.abs().double().transpose(-1, -2)).max().item()
        for g, r, x in ((dq, dq_r, k), (dk, dk_r, q)):
            # 4x slack: measured 0.4-0.6
            cond = 6e-8 * dp_bound * scale * x.abs().max().item() * 4
            assert max_err(g, r) < cond


def test_non_contiguous_inputs_and_grad():
    B, N, H, d = 2, 37, 3, 32
    # (B, N, H, d) storage viewed as (B, H, N, d), as a model's projection produces
    q, k, v = (t.transpose(1, 2) for t in qkv(B, N, N, H, H, d))
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    assert not q.is_contiguous()
    o = flash_attention(q, k, v, causal=True)
    do = torch.randn(B, H, N, 1, device=DEVICE).expand(B, H, N, d)  # stride-0 gradient
    o.backward(do)
    o_ref, _, grads = ref_grads(q, k, v, do, True)
    assert max_err(o, o_ref) < 2e-5
    for t, ref in zip((q, k, v), grads):
        assert max_err(t.grad, ref) < 1e-4


def _torch_error(q, k, v, causal, do, sm_scale=None):
    """PyTorch in q's dtype (naive attention and its autograd grads), to measure
    its error."""
    qs, ks, vs = (t.detach().clone().requires_grad_() for t in (q, k, v))
    o = naive_attention(qs, ks, vs, causal, sm_scale)
    grads = torch.autograd.grad(o, (qs, ks, vs), do)
    return o, grads


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("case", ["ragged-causal", "gqa", "d80", "masked-rows"])
def test_half_precision_within_twice_pytorch_error(dtype, case):
    B, H, H_kv, N_q, N_k, d, causal = CASES[case]
    q, k, v = qkv(B, H, H_kv, N_q, N_k, d, dtype=dtype, grad=True)
    o = flash_attention(q, k, v, causal=causal)
    assert o.dtype == dtype
    do = torch.randn_like(o)
    grads = torch.autograd.grad(o, (q, k, v), do)
    o_ref, _, grads_ref = ref_grads(q, k, v, do, causal)
    o_pt, grads_pt = _torch_error(q, k, v, causal, do)
    atol = {torch.float16: 1e-3, torch.bfloat16: 8e-3}[dtype]
    assert max_err(o, o_ref) <= 2 * max_err(o_pt, o_ref) + atol
    for name, g, g_ref, g_pt in zip(("dq", "dk", "dv"), grads, grads_ref, grads_pt):
        assert g.dtype == dtype and torch.all(torch.isfinite(g)), name
        assert max_err(g, g_ref) <= 2 * max_err(g_pt, g_ref) + atol, name


def test_lse_is_natural_log_sum_exp():
    q, k, v = qkv(1, 2, 2, 20, 30, 16)
    _, lse = flash_attention(q, k, v, softmax_scale=0.7, return_lse=True)
    s = (q.double() @ k.double().transpose(-1, -2)) * 0.7  # (B, H, N_q, N_k)
    assert max_err(lse, torch.logsumexp(s, -1)) < 1e-5


@pytest.mark.parametrize("causal", [False, True])
def test_attention_probs_match_fp64_softmax(causal):
    B, H, H_kv, N_q, N_k, d = 1, 4, 2, 40, 25, 16  # GQA; causal N_q > N_k masks 15 rows
    q, k, v = qkv(B, H, H_kv, N_q, N_k, d)
    _, lse = flash_attention(q, k, v, causal=causal, return_lse=True)
    kk = k.double().repeat_interleave(H // H_kv, 1)  # (B, H, N_k, d)
    s = q.double() @ kk.transpose(-1, -2) / math.sqrt(d)  # (B, H, N_q, N_k)
    if causal:
        s = s.masked_fill(
            torch.arange(N_k)[None, :] > torch.arange(N_q)[:, None] + N_k - N_q,
            float("-inf"),
        )
    p_ref = torch.nan_to_num(torch.softmax(s, -1), nan=0.0)  # fully masked rows -> 0
    p = attention_probs(q, k, lse, causal=causal)
    assert p.shape == (B, H, N_q, N_k) and p.dtype == torch.float32
    assert max_err(p, p_ref) < 1e-5
    rows = [0, 17, 39, -1]
    p_rows = attention_probs(q, k, lse, causal=causal, rows=rows)
    assert p_rows.shape == (B, H, 4, N_k)
    assert max_err(p_rows, p_ref[:, :, rows]) < 1e-5
    if causal:
        assert torch.all(p[:, :, :15] == 0)


def test_attention_probs_bad_inputs():
    q, k, v = qkv(1, 2, 2, 8, 8, 16)
    _, lse = flash_attention(q, k, v, return_lse=True)
    with pytest.raises(ValueError, match="lse"):
        attention_probs(q, k, lse[:, :, :4])
    with pytest.raises(ValueError, match="rows"):
        attention_probs(q, k, lse, rows=[8])
    with pytest.raises(TypeError, match="rows"):
        attention_probs(q, k, lse, rows=[0.5])


def _t(*shape, dtype=torch.float32):
    return torch.zeros(shape, dtype=dtype, device=DEVICE)


@pytest.mark.parametrize(
    "q,k,v,exc,match",
    [
        (
            _t(2, 8, 16),
            _t(1, 2, 8, 16),
            _t(1, 2, 8, 16),
            ValueError,
            r"q must be 4-D.*\(2, 8, 16\)",
        ),
        (_t(1, 2, 8, 16), _t(2, 8, 16), _t(1, 2, 8, 16), ValueError, r"k must be 4-D"),
        (
            [[1.0]],
            _t(1, 2, 8, 16),
            _t(1, 2, 8, 16),
            TypeError,
            "q must be a torch.Tensor",
        ),
        (_t(2, 2, 8, 16), _t(1, 2, 8, 16), _t(1, 2, 8, 16), ValueError, "batch"),
        (_t(1, 3, 8, 16), _t(1, 2, 8, 16), _t(1, 2, 8, 16), ValueError, r"H=3.*H_kv=2"),
        (_t(1, 2, 8, 16), _t(1, 2, 8, 32), _t(1, 2, 8, 32), ValueError, "head dim 32"),
        (
            _t(1, 2, 8, 16),
            _t(1, 2, 8, 16),
            _t(1, 2, 9, 16),
            ValueError,
            r"k and v.*\(1, 2, 9, 16\)",
        ),
        (
            _t(1, 2, 8, 16),
            _t(1, 2, 8, 16, dtype=torch.float16),
            _t(1, 2, 8, 16),
            TypeError,
            "share a dtype",
        ),
        (_t(1, 2, 8, 16, dtype=torch.int32),) * 3 + (TypeError, "torch.int32"),
        (_t(1, 2, 8, 16, dtype=torch.float64),) * 3 + (TypeError, "torch.float64"),
        (
            _t(1, 2, 8, 512),
            _t(1, 2, 8, 512),
            _t(1, 2, 8, 512),
            ValueError,
            r"1\.\.256.*512",
        ),
        (_t(1, 2, 8, 0), _t(1, 2, 8, 0), _t(1, 2, 8, 0), ValueError, "head dim"),
        (_t(1, 2, 0, 16), _t(1, 2, 8, 16), _t(1, 2, 8, 16), ValueError, "lengths"),
    ],
)
def test_bad_inputs_raise_clear_errors(q, k, v, exc, match):
    with pytest.raises(exc, match=match):
        flash_attention(q, k, v)


def test_cpu_tensors_rejected_when_compiled(monkeypatch):
    monkeypatch.setattr(runtime, "INTERPRET", False)
    x = torch.zeros(1, 1, 4, 16)
    with pytest.raises(ValueError, match="CUDA"):
        flash_attention(x, x, x)


def test_shipped_configs_are_valid_tiles():
    # every config: power-of-two tiles >= 16 (tl.dot on a real GPU), sane warps/stages
    for kernel in ("fwd", "dkdv", "dq"):
        for target, (cap, _) in tiles.ARCHS.items():
            for d in (16, 32, 64, 80, 128, 256):
                for dtype in (torch.float16, torch.bfloat16, torch.float32):
                    cfgs = tiles.configs(kernel, cap, d, dtype)
                    # the one documented gap: no sm_75 backward above head dim 128
                    unsupported = target == "sm75" and kernel != "fwd" and d > 128
                    assert (len(cfgs) == 0) if unsupported else (1 <= len(cfgs) <= 2), (
                        kernel,
                        target,
                        d,
                        dtype,
                    )
                    for bm, bn, warps, stages in cfgs:
                        for b in (bm, bn):
                            assert b >= 16 and b & (b - 1) == 0, (
                                kernel,
                                target,
                                d,
                                bm,
                                bn,
                            )
                        assert warps in (2, 4, 8) and 1 <= stages <= 4
    assert tiles.arch_class((7, 5)) == "sm75" and tiles.arch_class((8, 6)) == "sm89"
    assert tiles.arch_class((9, 0)) == "sm90" and tiles.block_d(80) == 128


def test_gpu_results_figures_draw_from_a_results_file(tmp_path):
    """figures/src/gpu_results.py on a synthetic results file written to a temp
    dir only."""
    import importlib.util

    from kernels.timing import results
    from kernels.timing.records import RESULTS_DIR, Record

    spec = importlib.util.spec_from_file_location(
        "gpu_results", RESULTS_DIR.parent.parent / "figures" / "src" / "gpu_results.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    prov = {
        "gpu": "Test GPU",
        "capability": [9, 0],
        "torch": "t",
        "triton": "x",
        "cuda": "c",
        "date": "2026-01-01",
    }
    records = []
    for impl in ("triton", "naive"):
        for n in (512, 1024):
            for mode in ("fwd", "fwd+bwd"):
                for d in (64, 128):
                    for causal in (False, True):
                        records.append(
                            Record(
                                "flash",
                                "attention",
                                impl,
                                mode,
                                "float16",
                                {
                                    "B": 1,
                                    "H": 1,
                                    "N_q": n,
                                    "N_k": n,
                                    "d": d,
                                    "causal": causal,
                                },
                                ms=1.0,
                                tflops=float(n),
                            ).to_dict()
                        )
        records.append(
            Record(
                "flash",
                "attention-memory",
                impl,
                "fwd",
                "float16",
                {"B": 1, "H": 16, "N_q": 1024, "N_k": 1024, "d": 64, "causal": False},
                peak_mem_bytes=2**20,
                error="OOM" if impl == "naive" else None,
            ).to_dict()
        )
    results.save_results(
        "flash", records, [], path=tmp_path / "test-gpu.json", provenance=prov
    )
    (found,) = results.suite_records(results.load_results(tmp_path), "flash")
    paths = mod.draw(*found, out_dir=tmp_path)
    assert [p.name for p in paths] == [
        "gpu_flash_test-gpu_fwd_float16.png",
        "gpu_flash_test-gpu_fwd_bwd_float16.png",
        "gpu_flash_test-gpu_memory.png",
    ]
    assert all(p.stat().st_size > 10_000 for p in paths)


@pytest.mark.parametrize("block_m,block_n", [(16, 32), (128, 16)])
def test_forward_with_tiles_matches_reference(block_m, block_n):
    q, k, v = qkv(1, 2, 1, 45, 70, 32)
    o = flash.forward_with_tiles(q, k, v, block_m, block_n, causal=True)
    o_ref, _ = reference_attention(q, k, v, causal=True)
    assert max_err(o, o_ref) < 2e-5
    with pytest.raises(ValueError, match="block_n"):
        flash.forward_with_tiles(q, k, v, 64, 24)
