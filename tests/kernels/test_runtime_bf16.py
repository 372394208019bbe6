"""kernels.runtime's rounding of the interpreter's casts to bfloat16 (issue 50, item
12): a GPU converts fp32 to bf16 to the nearest (ties to even: ``cvt.rn.bf16.f32``);
Triton 3.4-3.7's interpreter truncated (every bf16 output biased toward zero by up to
an ulp), ignored ``fp_downcast_rounding="rtne"`` and read fp64 or integers as raw bits.
Every cast below must agree with torch's own ``.to(torch.bfloat16)`` bit for bit (NaN:
any NaN), and a bf16 kernel's output with torch's rounding of the exact result."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from kernels import runtime
from kernels.decode import attention_with_kvcache
from kernels.flash import flash_attention
from kernels.flex import flex_attention

pytestmark = pytest.mark.skipif(not runtime.INTERPRET, reason="interpreter only")


@triton.jit
def _to_bf16(x_ptr, out_ptr, N: tl.constexpr, RTNE: tl.constexpr):
    offs = tl.arange(0, N)
    x = tl.load(x_ptr + offs)
    if RTNE:
        y = x.to(tl.bfloat16, fp_downcast_rounding="rtne")
    else:
        y = x.to(tl.bfloat16)
    tl.store(out_ptr + offs, y)


@triton.jit
def _to_fp16(x_ptr, out_ptr, N: tl.constexpr):
    offs = tl.arange(0, N)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs).to(tl.float16))


def _hard_fp32(n: int = 8192) -> torch.Tensor:
    """fp32 values where rounding decides: exact ties (low 16 bits 0x8000 above an even
    and an odd bf16), one ulp either side of a tie, random bits over the whole range
    (subnormals included), the largest finite values (they round to inf), +-0, +-inf,
    NaNs (quiet and signalling)."""
    g = torch.Generator().manual_seed(12)
    hi = torch.randint(0, 1 << 16, (n // 8,), generator=g, dtype=torch.int64) << 16
    parts = [
        hi | 0x8000,
        hi | 0x7FFF,
        hi | 0x8001,
        torch.randint(0, 1 << 32, (n // 2,), generator=g, dtype=torch.int64),
        torch.randint(0, 1 << 23, (n // 16,), generator=g, dtype=torch.int64),  # sub
        torch.tensor([0, 1 << 31, 0x7F7FFFFF, 0xFF7FFFFF, 0x7F7F8000, 0x7F7F7FFF]),
        torch.tensor([0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001, 0xFFFFFFFF]),
        torch.tensor([0x00008000, 0x00018000, 0x0000FFFF, 0x807F8000]),
    ]
    bits = torch.cat(parts)
    bits = torch.where(bits >= 1 << 31, bits - (1 << 32), bits).to(torch.int32)
    bits = torch.nn.functional.pad(bits, (0, n - bits.numel()))  # a power of two
    return bits.view(torch.float32)


def _same_bf16(got: torch.Tensor, want: torch.Tensor) -> None:
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan)
    g16, w16 = got[~nan].view(torch.int16), want[~nan].view(torch.int16)
    wrong = (g16 != w16).sum().item()
    assert wrong == 0, f"{wrong} of {g16.numel()} differ from torch's rounding"


@pytest.mark.parametrize("rtne", [False, True], ids=["default", "rtne"])
def test_fp32_to_bf16_rounds_to_nearest_even_as_torch_does(rtne):
    x = _hard_fp32()
    out = torch.empty(x.shape, dtype=torch.bfloat16)
    _to_bf16[(1,)](x, out, N=x.numel(), RTNE=rtne)
    _same_bf16(out, x.to(torch.bfloat16))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.int32])
def test_other_casts_to_bf16_round_once_as_torch_does(dtype):
    g = torch.Generator().manual_seed(13)
    if dtype == torch.int32:
        x = torch.randint(-(2**30), 2**30, (4096,), generator=g, dtype=torch.int32)
    else:
        mag = torch.exp(torch.randn(4096, generator=g, dtype=torch.float64) * 8)
        x = (mag * torch.randn(4096, generator=g, dtype=torch.float64)).to(dtype)
        x[:4] = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0])
    out = torch.empty(x.shape, dtype=torch.bfloat16)
    _to_bf16[(1,)](x, out, N=x.numel(), RTNE=False)
    _same_bf16(out, x.to(torch.bfloat16))


@pytest.mark.filterwarnings("ignore:overflow encountered in cast")  # 7e4 -> inf
def test_fp32_to_fp16_rounds_to_nearest_even_as_torch_does():
    x = torch.cat([_hard_fp32(), torch.randn(4096) * 1e-6, torch.randn(4096) * 7e4])
    x = torch.nn.functional.pad(x, (0, (1 << 15) - x.numel()))
    out = torch.empty(x.shape, dtype=torch.float16)
    _to_fp16[(1,)](x, out, N=x.numel())
    want = x.to(torch.float16)
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(out), nan)
    assert torch.equal(out[~nan].view(torch.int16), want[~nan].view(torch.int16))


def _values(n_k: int, seed: int) -> torch.Tensor:
    """(1, 2, n_k, 16) bf16 values in +-[0.5, 2): the mean of n_k = 4 of them is
    exact in fp32, so a kernel's bf16 output is that mean rounded once."""
    g = torch.Generator().manual_seed(seed)
    mag = 0.5 + 1.5 * torch.rand(1, 2, n_k, 16, generator=g)
    sign = torch.where(torch.rand(1, 2, n_k, 16, generator=g) < 0.5, -1.0, 1.0)
    return (mag * sign).to(torch.bfloat16)


@pytest.mark.parametrize("kernel", ["flash", "flex", "decode"])
def test_a_bf16_kernel_output_is_the_exact_result_rounded_to_nearest(kernel):
    # q = 0: every score 0, every weight exactly 1 / 4, the output the values' mean
    v = _values(4, seed=14)  # (B, H, N_k, d)
    k = _values(4, seed=15)
    q = torch.zeros(1, 2, 8, 16, dtype=torch.bfloat16)
    want = v.float().mean(2, keepdim=True).expand(1, 2, 8, 16).to(torch.bfloat16)
    if kernel == "flash":
        got = flash_attention(q, k, v)
    elif kernel == "flex":
        got = flex_attention(q, k, v)
    else:  # decode layout (B, N, H, d); 8 new tokens, none causal-hidden from all 4
        lens = torch.tensor([4], dtype=torch.int32)
        got = attention_with_kvcache(
            q[:, :, :1].transpose(1, 2),
            k.transpose(1, 2).contiguous(),
            v.transpose(1, 2).contiguous(),
            lens,
            causal=False,
            num_splits=1,
        ).transpose(1, 2)
        want = want[:, :, :1]
    assert got.dtype == torch.bfloat16
    _same_bf16(got.contiguous(), want.contiguous())
