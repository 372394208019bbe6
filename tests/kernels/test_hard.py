"""kernels.hard against fp64 NumPy references (attention/hard.py) and PyTorch.

Runs under the Triton interpreter on a CPU (CPU tensors) and on a GPU as is.
Integer-valued inputs make every score exact in fp32 and fp64, so argmax and top-k
indices (ties included) can be compared exactly.
"""

import numpy as np
import pytest
import torch

from attention import hard as ah
from kernels import runtime
from kernels.hard import MAX_TOPK, hard_attention, topk_attention
from kernels.naive import naive_hard_attention, naive_topk_attention
from tests.kernels.compile_tools import run_compiled

pytestmark = pytest.mark.xdist_group("hard")

DEV = runtime.DEVICE


def _ints(shape, gen, lo=-2, hi=3):
    return torch.randint(lo, hi, shape, generator=gen).float().to(DEV)


def _expand(t, H):  # (B, H_kv, N, d) -> (B, H, N, d) fp64 numpy
    return t.double().repeat_interleave(H // t.shape[1], dim=1).cpu().numpy()


def _np(t):
    return t.double().cpu().numpy()


# (B, H, H_kv, N_q, N_k, d): odd and cross lengths, GQA, d not a power of two
SHAPES = [(1, 2, 2, 37, 53, 24), (2, 4, 2, 70, 45, 16), (1, 3, 1, 1, 130, 40)]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_hard_argmax_exact(shape, causal, dtype):
    B, H, H_kv, N_q, N_k, d = shape
    gen = torch.Generator().manual_seed(1)
    q = _ints((B, H, N_q, d), gen).to(dtype)
    k = _ints((B, H_kv, N_k, d), gen).to(dtype)
    v = torch.randn((B, H_kv, N_k, d), generator=gen).to(DEV, dtype)
    o, idx = hard_attention(
        q, k, v, causal=causal, softmax_scale=0.5, return_index=True
    )
    o_ref, idx_ref = ah.hard_attention(
        _np(q),
        _expand(k, H),
        _expand(v, H),
        scale=0.5,
        causal=causal,
        return_index=True,
    )
    assert idx.dtype == torch.int64 and idx.shape == (B, H, N_q)
    np.testing.assert_array_equal(idx.cpu().numpy(), idx_ref)  # ties -> lowest index
    # o is a copy of the chosen row of v: bit-exact, in v's dtype
    np.testing.assert_array_equal(_np(o), ah.gather_rows(_expand(v, H), idx_ref))
    np.testing.assert_array_equal(_np(o), o_ref)
    if not causal:  # PyTorch agrees (torch.argmax also returns the first maximum)
        o_t, idx_t = naive_hard_attention(q.float(), k.float(), v.float(), scale=0.5)
        torch.testing.assert_close(idx.cpu(), idx_t.cpu())


def test_hard_random_fp16_matches_fp64_where_unambiguous():
    gen = torch.Generator().manual_seed(2)
    B, H, N_q, N_k, d = 2, 2, 64, 96, 64
    q = torch.randn((B, H, N_q, d), generator=gen).to(DEV, torch.float16)
    k = torch.randn((B, H, N_k, d), generator=gen).to(DEV, torch.float16)
    v = torch.randn((B, H, N_k, d), generator=gen).to(DEV, torch.float16)
    _, idx = hard_attention(q, k, v, return_index=True)
    s = ah.attention_scores(_np(q), _np(k))  # (B, H, N_q, N_k) fp64
    top2 = np.sort(s, axis=-1)[..., -2:]
    clear = (top2[..., 1] - top2[..., 0]) > 1e-2  # fp16 inputs, fp32 accumulation
    assert clear.mean() > 0.8
    np.testing.assert_array_equal(idx.cpu().numpy()[clear], ah.argmax_index(s)[clear])


def test_no_visible_key_gives_zero_and_minus_one():
    gen = torch.Generator().manual_seed(3)
    q = torch.randn((1, 2, 20, 16), generator=gen).to(DEV)
    k = torch.randn((1, 1, 6, 16), generator=gen).to(DEV)
    v = torch.randn((1, 1, 6, 16), generator=gen).to(DEV)
    o, idx = hard_attention(q, k, v, causal=True, return_index=True)
    assert (idx[:, :, :14] == -1).all() and (o[:, :, :14] == 0).all()
    assert (idx[:, :, 14:] >= 0).all()
    o, idx = hard_attention(
        q, k, v, causal=True, sample=True, seed=5, return_index=True
    )
    assert (idx[:, :, :14] == -1).all() and (o[:, :, :14] == 0).all()
    o, idx = topk_attention(q, k, v, 4, causal=True, return_index=True)
    assert not torch.isnan(o).any()
    assert (idx[:, :, :14] == -1).all() and (o[:, :, :14] == 0).all()
    # query 14 sees key 0 only: 1 kept key, 3 empty slots
    assert (idx[:, :, 14] >= 0).sum(-1).eq(1).all()


def _tv(counts, p):
    return 0.5 * np.abs(counts / counts.sum() - p).sum()


def test_sampled_frequencies_match_softmax_and_are_seeded():
    gen = torch.Generator().manual_seed(4)
    N_q, N_k, d = 2048, 12, 16
    q1 = torch.randn((1, 1, 1, d), generator=gen)
    # one query, repeated: N_q draws per call (strided)
    q = q1.expand(1, 1, N_q, d).to(DEV)
    k = torch.randn((1, 1, N_k, d), generator=gen).to(DEV)
    v = torch.randn((1, 1, N_k, d), generator=gen).to(DEV)
    p = ah.softmax(ah.attention_scores(_np(q1), _np(k))[0, 0, 0], axis=-1)  # (N_k,)
    draws = []
    for seed in (0, 1):
        o, idx = hard_attention(q, k, v, sample=True, seed=seed, return_index=True)
        draws.append(idx.flatten().cpu().numpy())
        np.testing.assert_array_equal(
            o[0, 0].cpu().numpy(), v[0, 0, idx[0, 0]].cpu().numpy()
        )
    counts = np.bincount(np.concatenate(draws), minlength=N_k)
    # E[TV] ~ sum_j sqrt(p_j (1 - p_j) / n) * 0.4 ~ 0.02 for n = 4096 and these p
    assert _tv(counts, p) < 0.04, (counts / counts.sum(), p)
    again = hard_attention(q, k, v, sample=True, seed=0, return_index=True)[1]
    np.testing.assert_array_equal(again.flatten().cpu().numpy(), draws[0])
    assert (draws[0] != draws[1]).mean() > 0.3
    torch.manual_seed(0)  # seed=None draws the seed from torch's generator
    a = hard_attention(q, k, v, sample=True, return_index=True)[1]
    torch.manual_seed(0)
    b = hard_attention(q, k, v, sample=True, return_index=True)[1]
    torch.testing.assert_close(a, b)


def test_sampling_respects_causal_mask():
    gen = torch.Generator().manual_seed(5)
    q = torch.zeros((1, 1, 64, 16)).to(DEV)  # uniform softmax over the visible keys
    k = torch.randn((1, 1, 64, 16), generator=gen).to(DEV)
    v = torch.randn((1, 1, 64, 16), generator=gen).to(DEV)
    _, idx = hard_attention(
        q, k, v, causal=True, sample=True, seed=7, return_index=True
    )
    i = torch.arange(64, device=DEV)
    assert ((idx[0, 0] >= 0) & (idx[0, 0] <= i)).all()


@pytest.mark.parametrize("causal", [False, True])
def test_hard_backward(causal):
    gen = torch.Generator().manual_seed(6)
    B, H, H_kv, N_q, N_k, d = 1, 4, 2, 33, 40, 16
    q = torch.randn((B, H, N_q, d), generator=gen).to(DEV).requires_grad_()
    k = torch.randn((B, H_kv, N_k, d), generator=gen).to(DEV).requires_grad_()
    v = torch.randn((B, H_kv, N_k, d), generator=gen).to(DEV).requires_grad_()
    do = torch.randn((B, H, N_q, d), generator=gen).to(DEV)
    o, idx = hard_attention(q, k, v, causal=causal, return_index=True)
    o.backward(do)
    # reference: o = onehot(idx) @ v_expanded, differentiated by autograd in fp64
    v64 = v.detach().double().requires_grad_()
    w = (
        torch.nn.functional.one_hot(idx.clamp(min=0), N_k).double()
        * (idx >= 0)[..., None]
    )
    (w @ v64.repeat_interleave(H // H_kv, 1)).backward(do.double())
    torch.testing.assert_close(v.grad.double(), v64.grad, rtol=1e-5, atol=1e-6)
    assert (q.grad == 0).all() and (k.grad == 0).all()


# ------------------------------------------------------------------------------- top-k


@pytest.mark.parametrize("topk", [1, 3, 16])
@pytest.mark.parametrize("causal", [False, True])
def test_topk_indices_exact_with_ties(topk, causal):
    B, H, H_kv, N_q, N_k, d = 1, 2, 1, 29, 75, 8
    gen = torch.Generator().manual_seed(7)
    q = _ints((B, H, N_q, d), gen, -1, 2)  # tiny integers: many tied scores
    k = _ints((B, H_kv, N_k, d), gen, -1, 2)
    v = torch.randn((B, H_kv, N_k, d), generator=gen).to(DEV)
    o, idx = topk_attention(
        q, k, v, topk, causal=causal, softmax_scale=1.0, return_index=True
    )
    s = ah.attention_scores(_np(q), _expand(k, H), scale=1.0, causal=causal)
    idx_ref = ah.topk_index(s, topk)  # (score desc, index asc)
    assert idx.shape == (B, H, N_q, topk)
    np.testing.assert_array_equal(np.sort(idx.cpu().numpy(), -1), np.sort(idx_ref, -1))
    o_ref = ah.topk_attention(
        _np(q), _expand(k, H), _expand(v, H), topk, scale=1.0, causal=causal
    )
    np.testing.assert_allclose(_np(o), o_ref, rtol=1e-5, atol=1e-5)


def test_topk_keeps_all_when_fewer_visible_and_matches_soft():
    gen = torch.Generator().manual_seed(8)
    q = torch.randn((1, 2, 19, 32), generator=gen).to(DEV)
    k = torch.randn((1, 2, 11, 32), generator=gen).to(DEV)
    v = torch.randn((1, 2, 11, 32), generator=gen).to(DEV)
    o, idx = topk_attention(q, k, v, 16, return_index=True)
    assert ((idx >= 0).sum(-1) == 11).all() and ((idx == -1).sum(-1) == 5).all()
    o_ref = ah.soft_attention(_np(q), _np(k), _np(v))
    np.testing.assert_allclose(_np(o), o_ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_topk_low_precision_within_pytorch_error(dtype):
    """flash-attn rule: |kernel - fp64| <= 2 |PyTorch(dtype) - fp64| + atol, on rows
    whose k-th and (k+1)-th fp64 scores are clearly apart (else the kept set is a
    coin flip)."""
    gen = torch.Generator().manual_seed(9)
    B, H, N_q, N_k, d, topk = 1, 2, 48, 90, 64, 8
    q = torch.randn((B, H, N_q, d), generator=gen).to(DEV, dtype)
    k = torch.randn((B, H, N_k, d), generator=gen).to(DEV, dtype)
    v = torch.randn((B, H, N_k, d), generator=gen).to(DEV, dtype)
    o = topk_attention(q, k, v, topk)
    s = ah.attention_scores(_np(q), _np(k))
    ss = np.sort(s, axis=-1)
    clear = (ss[..., -topk] - ss[..., -topk - 1]) > 1e-2
    assert clear.mean() > 0.6
    o_ref = ah.topk_attention(_np(q), _np(k), _np(v), topk)
    o_pt = naive_topk_attention(q, k, v, topk)  # PyTorch in the same dtype
    err = np.abs(_np(o) - o_ref)[clear].max()
    err_pt = np.abs(_np(o_pt) - o_ref)[clear].max()
    assert err <= 2 * err_pt + 1e-3, (err, err_pt)


@pytest.mark.parametrize("causal", [False, True])
def test_topk_backward(causal):
    gen = torch.Generator().manual_seed(10)
    B, H, H_kv, N_q, N_k, d, topk = 2, 2, 1, 21, 34, 16, 5
    q = torch.randn((B, H, N_q, d), generator=gen).to(DEV).requires_grad_()
    k = torch.randn((B, H_kv, N_k, d), generator=gen).to(DEV).requires_grad_()
    v = torch.randn((B, H_kv, N_k, d), generator=gen).to(DEV).requires_grad_()
    do = torch.randn((B, H, N_q, d), generator=gen).to(DEV)
    o, idx = topk_attention(q, k, v, topk, causal=causal, return_index=True)
    o.backward(do)
    # fp64 autograd reference over the same kept set: a softmax masked to the kept keys
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    s = q64 @ k64.repeat_interleave(H // H_kv, 1).transpose(-1, -2) / d**0.5
    keep = torch.zeros(s.shape, dtype=torch.bool, device=DEV)
    keep.scatter_(-1, idx.clamp(min=0), idx >= 0)
    p = torch.softmax(s.masked_fill(~keep, float("-inf")), -1).nan_to_num(0.0)
    o64 = p @ v64.repeat_interleave(H // H_kv, 1)
    o64.backward(do.double())
    torch.testing.assert_close(o.double(), o64.detach(), rtol=1e-5, atol=1e-5)
    for t, r in ((q, q64), (k, k64), (v, v64)):
        torch.testing.assert_close(t.grad.double(), r.grad, rtol=1e-4, atol=1e-4)


def test_non_contiguous_inputs():
    gen = torch.Generator().manual_seed(11)
    B, N, H, d = 1, 40, 2, 32
    # (B, H, N, d) views
    q = torch.randn((B, N, H, d), generator=gen).to(DEV).transpose(1, 2)
    k = torch.randn((B, N, H, d), generator=gen).to(DEV).transpose(1, 2)
    v = torch.randn((B, N, H, d), generator=gen).to(DEV).transpose(1, 2)
    assert not q.is_contiguous()
    o, idx = hard_attention(q, k, v, return_index=True)
    o2, idx2 = hard_attention(
        q.contiguous(), k.contiguous(), v.contiguous(), return_index=True
    )
    torch.testing.assert_close(idx, idx2)
    torch.testing.assert_close(o, o2)
    torch.testing.assert_close(
        topk_attention(q, k, v, 4),
        topk_attention(q.contiguous(), k.contiguous(), v.contiguous(), 4),
    )


def test_bad_inputs_raise():
    q = torch.randn(1, 2, 8, 16).to(DEV)
    k = torch.randn(1, 2, 8, 16).to(DEV)
    with pytest.raises(ValueError, match="4-D"):
        hard_attention(q[0], k, k)
    with pytest.raises(TypeError, match="share a dtype"):
        hard_attention(q, k.half(), k.half())
    with pytest.raises(TypeError, match="float16"):
        hard_attention(q.double(), k.double(), k.double())
    with pytest.raises(TypeError, match="torch.Tensor"):
        hard_attention(q.numpy(), k, k)
    with pytest.raises(ValueError, match="head dim"):
        hard_attention(q, k[..., :8], k[..., :8])
    with pytest.raises(ValueError, match="multiple"):
        hard_attention(torch.randn(1, 3, 8, 16).to(DEV), k, k)
    with pytest.raises(ValueError, match="same shape"):
        hard_attention(q, k, k[:, :, :4])
    with pytest.raises(ValueError, match="head dim"):
        big = torch.randn(1, 1, 4, 160).to(DEV)
        hard_attention(big, big, big)
    with pytest.raises(ValueError, match="seed"):
        hard_attention(q, k, k, sample=True, seed=-1)
    with pytest.raises(TypeError, match="causal"):
        hard_attention(q, k, k, causal="yes")
    for bad in (0, MAX_TOPK + 1):
        with pytest.raises(ValueError, match="topk"):
            topk_attention(q, k, k, bad)
    with pytest.raises(TypeError, match="topk"):
        topk_attention(q, k, k, 2.0)


@pytest.mark.parametrize("topk", [64, MAX_TOPK])
def test_topk_large_k_across_blocks(topk):
    gen = torch.Generator().manual_seed(12)
    q = _ints((1, 1, 16, 16), gen, -1, 2)
    k = _ints((1, 1, 200, 16), gen, -1, 2)  # 4 key blocks of 64, many ties
    v = torch.randn((1, 1, 200, 16), generator=gen).to(DEV)
    o, idx = topk_attention(q, k, v, topk, softmax_scale=1.0, return_index=True)
    s = ah.attention_scores(_np(q), _np(k), scale=1.0)
    np.testing.assert_array_equal(
        np.sort(idx.cpu().numpy(), -1), np.sort(ah.topk_index(s, topk), -1)
    )
    o_ref = ah.topk_attention(_np(q), _np(k), _np(v), topk, scale=1.0)
    np.testing.assert_allclose(_np(o), o_ref, rtol=1e-5, atol=1e-5)


# Compiled for real GPU targets on the CPU (the interpreter accepts code a GPU
# compiler rejects): the heaviest variants at d = 128 for sm_90 (the benchmark GPU)
# and sm_75 (T4).
_COMPILE_SCRIPT = r"""
import os, sys
os.environ["TRITON_INTERPRET"] = "0"
import torch, triton
from kernels import hard
from kernels.flash import tiles
from kernels.machine_code import compile_check

def values(cfg, topk, sample=True):
    n, d, H = 4096, 128, 16
    t = torch.empty(16, dtype=torch.float16)
    v = {"sm_scale": 0.125, "SIGN": 1, "seed": 12345, "H": H, "N_Q": n, "N_K": n,
         "GROUP": 1, "HEAD_DIM": d, "BLOCK_D": 128, "IS_CAUSAL": True,
         "SAMPLE": sample,
         "UPCAST": False, "DOT_PRECISION": "tf32", "BLOCK_M": cfg[0], "BLOCK_N": cfg[1],
         "TOPK": topk, "TOPK_PAD": triton.next_power_of_2(topk), "Q": t, "K": t, "V": t,
         "O": t, "IDX": torch.empty(16, dtype=torch.int64), "LSE": torch.empty(16)}
    for p in "qkvo":
        for suf, s in zip(("b", "h", "m" if p in "qo" else "n", "d"),
                          (H * n * d, n * d, d, 1)):
            v[f"stride_{p}{suf}"] = s
    return v

for target in ("sm90", "sm75"):
    cap, limit = tiles.ARCHS[target]
    # sampling (the heavier loop) at its tiles; argmax at the tiles only it ships
    jobs = [(hard.forward._hard_attn_fwd, "hard", c, 0, True)
            for c in hard.configs("hard", cap, 128, sample=True)]
    jobs += [(hard.forward._hard_attn_fwd, "argmax", c, 0, False)
             for c in set(hard.configs("hard", cap, 128))
             - set(hard.configs("hard", cap, 128, sample=True))]
    jobs += [(hard.forward._topk_attn_fwd, f"topk{k}", c, k, True) for k in (64, 128)
             for c in hard.configs("topk", cap, 128, topk=k)]
    b = hard.forward.NAN_INDEX_BLOCK  # the NaN rows' index pass (issue 23)
    jobs += [(hard.forward._hard_nan_index, "nan-index", (b, b, 4, 1), 0, False)]
    for kernel, name, cfg, topk, sample in jobs:
        fn, vals = compile_check._jit_function(kernel), values(cfg, topk, sample)
        c = compile_check._compile_values(fn, vals, cap, cfg[2], cfg[3])
        regs, st, ld = compile_check.ptxas_usage(c.asm["ptx"])
        ok = c.metadata.shared <= limit and st == 0 and ld == 0
        print(name, target, cfg, c.metadata.shared, limit, regs, st, ld,
              "ok" if ok else "BAD")
"""


@pytest.mark.slow
def test_shipped_configs_compile_for_gpus_without_spills():
    proc, out = run_compiled("-c", _COMPILE_SCRIPT)
    assert proc.returncode == 0, out
    rows = proc.stdout.splitlines()
    assert {r.split()[0] for r in rows} == {
        "hard",
        "argmax",
        "topk64",
        "topk128",
        "nan-index",
    }, out
    assert {r.split()[1] for r in rows} == {"sm90", "sm75"}, out
    assert all(r.endswith(" ok") for r in rows), out


# --------------------------------------------------------------------------------------
# No silent wrong answers (issue 10)
# --------------------------------------------------------------------------------------


def test_nan_score_rows_are_nan_not_empty():
    # item 1: a NaN in q row 5 gives o = NaN and idx = its first NaN key (never -1,
    # the empty row's answer, issue 23); the empty rows of a causal N_q > N_k mask give
    # o = 0 and idx = -1; a hidden NaN value row reaches nobody
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, n, 16, generator=g) for n in (10, 8, 8))
    q[0, 0, 5, 0] = float("nan")
    v[0, 0, 7] = float("nan")
    o, idx = hard_attention(q, k, v, causal=True, return_index=True)
    assert idx[0, 0, 5] == 0 and torch.isnan(o[0, 0, 5]).all()
    assert torch.all(idx[0, 0, :2] == -1) and torch.all(o[0, 0, :2] == 0)
    seen7 = (idx[0, 0] == 7) & (torch.arange(10) != 5)
    assert torch.equal(torch.isnan(o[0, 0]).any(-1), seen7 | (torch.arange(10) == 5))
    o, idx = topk_attention(q, k, v, 3, causal=True, return_index=True)
    # every score of row 5 is NaN: it keeps its first three keys
    assert sorted(idx[0, 0, 5].tolist()) == [0, 1, 2] and torch.isnan(o[0, 0, 5]).all()
    assert torch.all(o[0, 0, :2] == 0)
    o_n = naive_topk_attention(q, k, v, 3, causal=True)
    assert torch.equal(torch.isnan(o_n), torch.isnan(o))
    assert torch.all(o_n[0, 0, :2] == 0)


@pytest.mark.parametrize("sm_scale", [1e300, -3e38, float("nan")])
def test_hard_and_topk_refuse_scales_that_overflow_fp32(sm_scale):
    # item 3: scores times sm_scale * log2(e) must stay in fp32
    q, k, v = (torch.randn(1, 1, 8, 16) for _ in range(3))
    with pytest.raises(ValueError, match="softmax_scale"):
        hard_attention(q, k, v, softmax_scale=sm_scale)
    with pytest.raises(ValueError, match="softmax_scale"):
        topk_attention(q, k, v, 2, softmax_scale=sm_scale)


@pytest.mark.parametrize(
    "topk,exc",
    [
        (2.7, TypeError),
        ("3", TypeError),
        (True, TypeError),
        (0, ValueError),
        (-1, ValueError),
    ],
)
def test_topk_must_be_a_positive_int(topk, exc):
    q, k, v = (torch.randn(1, 1, 8, 16) for _ in range(3))
    with pytest.raises(exc, match="topk"):
        topk_attention(q, k, v, topk)
    with pytest.raises(TypeError, match="causal"):
        hard_attention(q, k, v, causal="False")


@pytest.mark.parametrize("sm_scale", [-0.5, 1e30, -1e30])
def test_argmax_and_topk_rank_raw_scores_for_any_scale(sm_scale):
    # the kernels rank q k^T (argmax) or -q k^T (a negative scale: argmin) without
    # multiplying by the scale, so a scale that would overflow the scaled scores to inf
    # cannot create ties
    gen = torch.Generator().manual_seed(11)
    q = torch.randn((1, 2, 70, 16), generator=gen).to(DEV)
    k = torch.randn((1, 2, 90, 16), generator=gen).to(DEV)
    v = torch.randn((1, 2, 90, 16), generator=gen).to(DEV)
    s = q.double() @ k.double().transpose(-1, -2)  # (1, 2, 70, 90)
    want = (s if sm_scale > 0 else -s).argmax(-1)
    _, idx = hard_attention(q, k, v, softmax_scale=sm_scale, return_index=True)
    assert torch.equal(idx.cpu(), want.cpu())
    if abs(sm_scale) < 1:
        o, idx_k = topk_attention(q, k, v, 4, softmax_scale=sm_scale, return_index=True)
        top = (s * sm_scale).topk(4, -1).indices
        assert torch.equal(idx_k.sort(-1).values.cpu(), top.sort(-1).values.cpu())
        p = torch.softmax((s * sm_scale).gather(-1, top), -1)  # (1, 2, 70, 4)
        o_ref = (
            p.unsqueeze(-1)
            * v.double()[:, :, None]
            .expand(-1, -1, 70, -1, -1)
            .gather(3, top[..., None].expand(-1, -1, -1, -1, 16))
        ).sum(-2)
        assert (o.double() - o_ref).abs().max().item() < 1e-5
