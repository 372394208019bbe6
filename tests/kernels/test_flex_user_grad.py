"""A user's own score mod in kernels.flex's backward: with its derivative carried
(``score_mod_with_grad``) and bare (a five-point difference inside the kernel).

The yardstick is PyTorch's own fp32 error: the same attention written in PyTorch ops
and differentiated by autograd in float32, against the same in float64. The kernel's
fp32 dq, dk, dv are held to a multiple of that error, per mod: 2.5x with the derivative
carried (what the ready-made mods get), 5x for mods affine in the score (a bias, even
``score + 1000``, where the step follows what the mod adds; a step that followed the
score alone left dq off by hundreds of times PyTorch's error), 25x for a bare curved
mod (a softcap written by hand, cap 2: measured about 13x, the fp32 rounding of the
mod's value over the step; the spec sheet states it). The bounds are ratios of two
measured errors on the same inputs, so they hold on any CPU's BLAS.
"""

from __future__ import annotations

import math

import pytest
import torch
import triton
import triton.language as tl

from kernels.flex import (
    causal_mask,
    create_block_mask,
    flex_attention,
    score_mod_with_grad,
    softcap,
)

CAP = 2.0


@triton.jit
def hand_softcap(score, b, h, q_idx, kv_idx):  # cap 2, tanh written by hand
    t = tl.exp(-tl.abs(score))  # exp(-2|x| / cap)
    th = (1.0 - t) / (1.0 + t)
    return 2.0 * tl.where(score < 0, -th, th)


@triton.jit
def hand_softcap_grad(score, b, h, q_idx, kv_idx):
    t = tl.exp(-tl.abs(score))
    th = (1.0 - t) / (1.0 + t)
    return 1.0 - th * th


@triton.jit
def plus_1000(score, b, h, q_idx, kv_idx):
    return score + 1000.0


@triton.jit
def hand_alibi(score, b, h, q_idx, kv_idx):
    return score - 0.25 * (h + 1).to(tl.float32) * (q_idx - kv_idx).to(tl.float32)


@triton.jit
def masks_far_keys(score, b, h, q_idx, kv_idx):  # a score mod that masks with -inf
    return tl.where(q_idx - kv_idx > 20, float("-inf"), score * 0.5)


def torch_mod(name, s, h, qi, ki):
    if name == "softcap":
        return CAP * torch.tanh(s / CAP)
    if name == "plus_1000":
        return s + 1000.0
    if name == "alibi":
        return s - 0.25 * (h + 1) * (qi - ki)
    if name == "masks_far_keys":
        return torch.where(qi - ki > 20, -math.inf, s * 0.5)
    raise ValueError(name)


def attention(q, k, v, name):
    """Causal attention with the mod, in PyTorch ops (float32 or float64)."""
    n = q.shape[2]
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    h = torch.arange(q.shape[1], dtype=s.dtype)[None, :, None, None]
    qi = torch.arange(n, dtype=s.dtype)[:, None]
    ki = torch.arange(n, dtype=s.dtype)[None, :]
    s = torch_mod(name, s, h, qi, ki).masked_fill(qi < ki, -math.inf)
    return torch.softmax(s, -1) @ v


N, D = 50, 16  # ragged: 50 is no multiple of a tile


def _inputs():
    g = torch.Generator().manual_seed(0)
    base = [torch.randn(1, 2, N, D, generator=g) * 2 for _ in range(3)]
    return base, torch.randn(1, 2, N, D, generator=g)


def _grads(fn, base, do, dtype):
    t = [x.to(dtype).requires_grad_() for x in base]
    o = fn(*t)
    return o, torch.autograd.grad((o * do.to(dtype)).sum(), t)


CASES = [
    # (name, the mod given to the kernel, the torch twin's name, bound in x PyTorch)
    ("ready-made softcap", lambda: softcap(CAP), "softcap", 2.5),
    (
        "hand softcap with its grad",
        lambda: score_mod_with_grad(hand_softcap, hand_softcap_grad),
        "softcap",
        2.5,
    ),
    ("hand softcap, bare", lambda: hand_softcap, "softcap", 25.0),
    ("score + 1000, bare", lambda: plus_1000, "plus_1000", 5.0),
    ("hand ALiBi, bare", lambda: hand_alibi, "alibi", 5.0),
    ("a mod that masks with -inf, bare", lambda: masks_far_keys, "masks_far_keys", 5.0),
]


@pytest.mark.parametrize("label, mod, twin, bound", CASES, ids=[c[0] for c in CASES])
def test_user_score_mod_gradients_against_pytorch_own_error(label, mod, twin, bound):
    base, do = _inputs()
    bm = create_block_mask(causal_mask, None, None, N, N)
    _, want = _grads(lambda q, k, v: attention(q, k, v, twin), base, do, torch.float64)
    _, torch32 = _grads(
        lambda q, k, v: attention(q, k, v, twin), base, do, torch.float32
    )
    o, got = _grads(
        lambda q, k, v: flex_attention(q, k, v, score_mod=mod(), block_mask=bm),
        base,
        do,
        torch.float32,
    )
    assert torch.isfinite(o).all()
    for name, a, t, w in zip(("dq", "dk", "dv"), got, torch32, want):
        assert torch.isfinite(a).all(), (label, name)
        scale = w.abs().max().item()
        err = (a.double() - w).abs().max().item() / scale
        torch_err = (t.double() - w).abs().max().item() / scale
        assert err <= bound * torch_err, (label, name, err, torch_err)


def test_carrying_the_grad_is_what_removes_the_difference_error():
    # the same hand-written softcap: bare, then with its derivative; the carried one is
    # the more accurate by a wide margin in dq (the difference's rounding is gone)
    base, do = _inputs()
    bm = create_block_mask(causal_mask, None, None, N, N)
    _, want = _grads(
        lambda q, k, v: attention(q, k, v, "softcap"), base, do, torch.float64
    )
    errs = []
    for mod in (hand_softcap, score_mod_with_grad(hand_softcap, hand_softcap_grad)):
        _, got = _grads(
            lambda q, k, v, mod=mod: flex_attention(
                q, k, v, score_mod=mod, block_mask=bm
            ),
            base,
            do,
            torch.float32,
        )
        errs.append((got[0].double() - want[0]).abs().max().item())
    assert errs[1] * 3 < errs[0], errs


def test_score_mod_with_grad_refuses_what_is_not_a_jit_mod():
    with pytest.raises(TypeError, match="score_mod"):
        score_mod_with_grad(lambda s, b, h, q, k: s, hand_softcap_grad)
    with pytest.raises(TypeError, match="grad"):
        score_mod_with_grad(hand_softcap, None)

    @triton.jit
    def three_args(score, b, h):
        return score

    with pytest.raises(
        TypeError, match=r"grad must take \(score, b, h, q_idx, kv_idx\)"
    ):
        score_mod_with_grad(hand_softcap, three_args)
