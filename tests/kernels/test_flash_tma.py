"""kernels.flash.forward_tma: the TMA-descriptor forward (and its warp-specialised
variant) against the fp64 reference and against the pointer forward of kernels.flash.

Runs under the Triton interpreter on a CPU (descriptors emulated, small shapes) and on
an sm_90 GPU unchanged. fp32 uses the forward error bound of test_flash; fp16/bf16 the
flash-attn rule (at most twice PyTorch's own error in the dtype, plus a small atol).
The GPU's own check of every path is benchmarks/run.py's correctness step.
"""

import pytest
import torch

from kernels import runtime
from kernels.common import LN2
from kernels.flash import forward_tma as flash_tma
from kernels.flash.checks import check_inputs
from kernels.flash.forward import forward_lse
from kernels.flash.forward_tma import forward_tma
from kernels.naive import naive_attention, reference_attention

pytestmark = pytest.mark.xdist_group("flash-tma")

DEVICE = runtime.DEVICE
# fp32 is not shipped on the GPU (refused there); under the interpreter it runs
FP32 = runtime.INTERPRET


def _qkv(B, H, H_kv, N_q, N_k, d, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randn(s, generator=g).to(device=DEVICE, dtype=dtype)
        for s in ((B, H, N_q, d), (B, H_kv, N_k, d), (B, H_kv, N_k, d))
    ]


def _max_err(a, b):
    return (a.double() - b.double()).abs().max().item()


# (B, H, H_kv, N_q, N_k, d, causal)
CASES = {
    "aligned": (1, 2, 2, 128, 128, 64, False),
    "ragged-causal": (1, 2, 2, 97, 97, 32, True),
    "cross": (1, 2, 2, 45, 131, 32, False),
    "cross-causal-nk>nq": (1, 1, 1, 50, 150, 64, True),
    "gqa-causal": (1, 4, 2, 70, 90, 16, True),
    "mqa": (2, 4, 1, 33, 65, 16, False),
    "d80-causal": (1, 1, 1, 61, 61, 80, True),  # BLOCK_D = 128, columns past 80 zero
    "masked-rows": (1, 2, 1, 100, 30, 32, True),  # 70 rows see no key
    "single": (1, 1, 1, 1, 1, 16, True),
}


def _random_case(seed):
    g = torch.Generator().manual_seed(seed)
    r = lambda lo, hi: int(torch.randint(lo, hi + 1, (1,), generator=g))  # noqa: E731
    h_kv = r(1, 2)
    return (
        r(1, 2),
        h_kv * r(1, 2),
        h_kv,
        r(1, 90),
        r(1, 90),
        8 * r(1, 8),
        bool(r(0, 1)),
    )


def _ref(q, k, v, causal, sm_scale=None):
    o, lse = reference_attention(q.double(), k.double(), v.double(), causal, sm_scale)
    return o, lse / LN2  # base 2, as the kernels keep it


def _check(q, k, v, causal, o, lse2):
    B, H, N_q, d = q.shape
    assert o.shape == (B, H, N_q, d) and o.dtype == q.dtype
    assert lse2.shape == (B, H, N_q) and lse2.dtype == torch.float32
    o_ref, lse_ref = _ref(q, k, v, causal)
    visible = torch.isfinite(lse_ref)
    assert torch.equal(torch.isneginf(lse2), ~visible)  # -inf exactly on empty rows
    assert torch.all(o[~visible[..., None].expand_as(o)] == 0)
    if q.dtype == torch.float32:
        assert _max_err(o, o_ref) < 2e-5
        assert _max_err(lse2[visible], lse_ref[visible]) < 3e-5
    else:
        o_pt = naive_attention(q, k, v, causal)
        atol = {torch.float16: 1e-3, torch.bfloat16: 8e-3}[q.dtype]
        assert _max_err(o, o_ref) <= 2 * _max_err(o_pt, o_ref) + atol
        assert _max_err(lse2[visible], lse_ref[visible]) < 1e-3


def _same_as_pointer(q, k, v, causal, o, lse2, sm_scale=None):
    """The pointer forward's output, within fp32 rounding (bitwise under the
    interpreter, where both run the same arithmetic on the same zero padding)."""
    scale = check_inputs(q, k, v, sm_scale)
    o_p, lse_p = forward_lse(q, k, v, causal, scale)
    eps = torch.finfo(q.dtype).eps
    torch.testing.assert_close(o, o_p, rtol=eps, atol=eps, equal_nan=True)
    torch.testing.assert_close(lse2, lse_p, rtol=2**-20, atol=2**-20, equal_nan=True)


DTYPES = [torch.float16, torch.bfloat16] + ([torch.float32] if FP32 else [])


@pytest.mark.parametrize("case", list(CASES))
def test_matches_fp64_and_the_pointer_path(case):
    B, H, H_kv, N_q, N_k, d, causal = CASES[case]
    # every case once per dtype would triple the time: rotate the dtype per case
    dtype = DTYPES[list(CASES).index(case) % len(DTYPES)]
    q, k, v = _qkv(B, H, H_kv, N_q, N_k, d, dtype)
    o, lse2 = forward_tma(q, k, v, causal=causal)
    _check(q, k, v, causal, o, lse2)
    _same_as_pointer(q, k, v, causal, o, lse2)


@pytest.mark.parametrize("seed", range(4))
def test_random_shapes(seed):
    B, H, H_kv, N_q, N_k, d, causal = _random_case(seed)
    dtype = DTYPES[seed % len(DTYPES)]
    q, k, v = _qkv(B, H, H_kv, N_q, N_k, d, dtype, seed=seed)
    o, lse2 = forward_tma(q, k, v, causal=causal, warp_specialize=bool(seed % 2))
    _check(q, k, v, causal, o, lse2)
    _same_as_pointer(q, k, v, causal, o, lse2)


@pytest.mark.parametrize("path", flash_tma.FORWARD_PATHS)
def test_every_path_by_name(path):
    q, k, v = _qkv(1, 2, 1, 40, 70, 32, torch.float16, seed=5)
    o, lse2 = flash_tma.forward(q, k, v, causal=True, softmax_scale=-0.3, path=path)
    o_ref, lse_ref = _ref(q, k, v, True, -0.3)  # negative scale: NEG_SCALE path
    assert _max_err(o, o_ref) < 2e-3
    _same_as_pointer(q, k, v, True, o, lse2, sm_scale=-0.3)


def test_nan_query_row_stays_nan_and_empty_rows_are_zero():
    q, k, v = _qkv(1, 1, 1, 6, 4, 16, torch.float16)
    q[0, 0, 4, 0] = float("nan")
    o, lse2 = forward_tma(q, k, v, causal=True)
    assert torch.isnan(o[0, 0, 4]).all() and torch.isnan(lse2[0, 0, 4])
    assert torch.all(o[0, 0, :2] == 0) and torch.isneginf(lse2[0, 0, :2]).all()
    assert torch.isfinite(o[0, 0, [2, 3, 5]]).all()


@pytest.mark.parametrize("n", [8, 77])
def test_hidden_nan_in_v_does_not_leak_with_causal(n):
    q, k, v = _qkv(1, 2, 2, n, n, 16, torch.float16, seed=3)
    v[..., n - 1, 3] = float("nan")
    v[..., n - 2, 5] = float("inf")
    o, lse2 = forward_tma(q, k, v, causal=True, warp_specialize=n > 8)
    o_ref, _ = _ref(q, k, v, True)
    assert torch.equal(torch.isnan(o), torch.isnan(o_ref))
    assert torch.isnan(o[..., n - 1, 3]).all()
    assert not torch.isnan(o[..., : n - 1, :]).any()
    finite = torch.isfinite(o_ref)
    assert torch.equal(torch.isfinite(o), finite)
    assert _max_err(o[finite], o_ref[finite]) < 2e-3
    assert torch.all(torch.isfinite(lse2))


def test_strided_inputs_that_tma_can_read():
    # a (B, N, H, d) buffer seen as (B, H, N, d): strides permuted, all 16-byte aligned
    g = torch.Generator().manual_seed(1)
    q = torch.randn(1, 37, 2, 32, generator=g).to(DEVICE, torch.float16).transpose(1, 2)
    k = torch.randn(1, 50, 2, 32, generator=g).to(DEVICE, torch.float16).transpose(1, 2)
    v = torch.randn(1, 50, 2, 32, generator=g).to(DEVICE, torch.float16).transpose(1, 2)
    o, lse2 = forward_tma(q, k, v)
    _check(q, k, v, False, o, lse2)
    _same_as_pointer(q, k, v, False, o, lse2)


def _unreadable(which):
    """q, k, v with ``which`` unreadable by TMA (and the others readable)."""
    q, k, v = _qkv(1, 2, 2, 8, 8, 16, torch.float16)
    if which == "k":  # d = 7 contiguous: rows of 14 bytes (q's 7 of 8 are readable)
        return q[..., :7], k[..., :7].contiguous(), v[..., :7]
    if which == "v":  # last dim strided
        return q, k, v.transpose(2, 3).contiguous().transpose(2, 3)
    # q 2 bytes past an aligned address
    return torch.cat([q.flatten(), q.flatten()[:1]])[1:].view(q.shape), k, v


@pytest.mark.parametrize(
    "which,match",
    [
        ("k", r"k\.stride\(2\) = 7 elements = 14 bytes"),
        ("v", r"v's last dim is not contiguous"),
        ("q", r"q starts at an address that is not 16-byte aligned"),
    ],
)
def test_refuses_what_tma_cannot_read(which, match):
    q, k, v = _unreadable(which)
    with pytest.raises(ValueError, match=match):
        forward_tma(q, k, v)
    t = {"q": q, "k": k, "v": v}
    assert all(
        (flash_tma.tma_problem(x, n) is None) == (n != which) for n, x in t.items()
    )


def test_bad_arguments():
    q, k, v = _qkv(1, 1, 1, 8, 8, 16, torch.float16)
    with pytest.raises(ValueError, match="warp_specialize"):
        forward_tma(q, k, v, warp_specialize=1)
    with pytest.raises(ValueError, match="path"):
        flash_tma.forward(q, k, v, path="tensor-memory")
    with pytest.raises(ValueError, match="q must be 4-D"):
        forward_tma(q[0], k, v)


def test_shipped_tiles():
    for d in (16, 64, 80, 128, 256):
        for causal in (False, True):
            assert flash_tma.tma_configs((9, 0), d, torch.bfloat16, False, causal)
            ws = flash_tma.tma_configs((9, 0), d, torch.bfloat16, True, causal)
            # Triton 3.7 specialises only 4-warp, 64-row programs (non-causal)
            assert causal or all(c[0] == 64 and c[2] == 4 for c in ws)
    assert flash_tma.tma_configs((8, 0), 128, torch.bfloat16) == []
    assert flash_tma.tma_configs((9, 0), 128, torch.float32) == []
    assert flash_tma.FORWARD_PATHS[0] == flash_tma.DEFAULT_FORWARD_PATH == "pointer"
