"""The kernels' public edges (issues 27 and 33): old argument names still run with a
DeprecationWarning, and bad arguments are refused naming them as the caller wrote them.

Small shapes under the Triton interpreter on a CPU; unchanged on a CUDA GPU.
"""

import warnings

import pytest
import torch

from kernels import deformable, naive, runtime
from kernels.decode import choose_splits
from kernels.flash import attention_probs, flash_attention, forward_with_tiles
from kernels.hard import hard_attention, topk_attention
from kernels.ring import ring_attention

DEV = runtime.DEVICE


def _qkv(n_q=8, n_k=8, d=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, 2, n, d, generator=g).to(DEV) for n in (n_q, n_k, n_k)]


# --------------------------------------------------------------------------------------
# The softmax scale: softmax_scale (flash-attn-style calls), scale (PyTorch-style ones)
# --------------------------------------------------------------------------------------
def _dat(fn, q, k, v, **kw):
    """A deformable call on maps cut from k, v: (1, 2, 8, d) -> (1, 2, 2, 4, d)."""
    pts = torch.linspace(-0.9, 0.9, 6).reshape(1, 1, 3, 2).to(q.device)
    return fn(q, k.reshape(1, 2, 2, 4, -1), v.reshape(1, 2, 2, 4, -1), pts, **kw)


FLASH_STYLE = {
    "flash_attention": lambda q, k, v, **kw: flash_attention(q, k, v, **kw),
    "hard_attention": lambda q, k, v, **kw: hard_attention(q, k, v, **kw),
    "topk_attention": lambda q, k, v, **kw: topk_attention(q, k, v, 2, **kw),
    "ring_attention": lambda q, k, v, **kw: ring_attention(q, k, v, **kw),
    "forward_with_tiles": lambda q, k, v, **kw: forward_with_tiles(
        q, k, v, 16, 16, **kw
    ),
    "deformable_attention": lambda q, k, v, **kw: _dat(
        deformable.deformable_attention, q, k, v, **kw
    ),
}
TORCH_STYLE = {
    "naive_attention": lambda q, k, v, **kw: naive.naive_attention(q, k, v, **kw),
    "reference_attention": lambda q, k, v, **kw: naive.reference_attention(
        q, k, v, **kw
    )[0],
    "naive_hard_attention": lambda q, k, v, **kw: naive.naive_hard_attention(
        q, k, v, **kw
    )[0],
    "naive_topk_attention": lambda q, k, v, **kw: naive.naive_topk_attention(
        q, k, v, 2, **kw
    ),
    "deformable_attention_reference": lambda q, k, v, **kw: _dat(
        deformable.deformable_attention_reference, q, k, v, **kw
    ),
}


@pytest.mark.parametrize(
    "call, new",
    [(c, "softmax_scale") for c in FLASH_STYLE] + [(c, "scale") for c in TORCH_STYLE],
)
def test_the_old_sm_scale_keyword_runs_with_a_deprecation_warning(call, new):
    fn = {**FLASH_STYLE, **TORCH_STYLE}[call]
    q, k, v = _qkv()
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)  # the new name: no warning
        want = fn(q, k, v, **{new: 0.3})
    with pytest.warns(DeprecationWarning, match=f"sm_scale= is deprecated.*{new}="):
        got = fn(q, k, v, sm_scale=0.3)
    assert torch.equal(got, want)  # the same call, the same bits
    with pytest.raises(TypeError, match=f"pass {new} only"):
        fn(q, k, v, sm_scale=0.3, **{new: 0.3})


def test_attention_probs_takes_softmax_scale_and_the_old_name():
    q, k, v = _qkv()
    _, lse = flash_attention(q, k, v, softmax_scale=0.3, return_lse=True)
    p = attention_probs(q, k, lse, softmax_scale=0.3)
    with pytest.warns(DeprecationWarning, match="softmax_scale="):
        assert torch.equal(attention_probs(q, k, lse, sm_scale=0.3), p)
    assert torch.allclose(p.sum(-1), torch.ones(()), atol=1e-5)


@pytest.mark.parametrize(
    "call",
    [
        "flash_attention",
        "hard_attention",
        "topk_attention",
        "ring_attention",
        "deformable_attention",
    ],
)
def test_a_bad_scale_is_named_softmax_scale(call):
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="softmax_scale must be finite"):
        FLASH_STYLE[call](q, k, v, softmax_scale=float("nan"))
    with pytest.raises(TypeError, match="softmax_scale must be a real number"):
        FLASH_STYLE[call](q, k, v, softmax_scale="0.5")


def test_a_bad_scale_under_the_old_name_is_named_as_written():
    q, k, v = _qkv()
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="^sm_scale"):
        FLASH_STYLE["deformable_attention"](q, k, v, sm_scale=float("nan"))


def test_naive_baselines_name_their_scale_scale():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="^scale must be finite"):
        naive.naive_attention(q, k, v, scale=float("inf"))


# --------------------------------------------------------------------------------------
# attention_probs refuses an lse that cannot be the problem's (issue 33)
# --------------------------------------------------------------------------------------
def test_attention_probs_refuses_an_integer_lse():
    q, k, _ = _qkv()
    with pytest.raises(TypeError, match="lse must be a floating-point tensor"):
        attention_probs(q, k, torch.zeros(1, 2, 8, dtype=torch.int64, device=DEV))


def test_attention_probs_refuses_minus_inf_rows_that_see_keys():
    q, k, v = _qkv(n_q=12, n_k=8)
    _, lse = flash_attention(q, k, v, causal=True, return_lse=True)
    assert torch.isneginf(lse[..., :4]).all()  # N_q - N_k = 4 empty causal rows
    p = attention_probs(q, k, lse, causal=True)  # its own problem: accepted
    assert torch.equal(p[..., :4, :], torch.zeros_like(p[..., :4, :]))
    with pytest.raises(ValueError, match=r"lse is -inf at rows that see keys"):
        attention_probs(q, k, lse, causal=False)  # every row sees all 8 keys
    bad = lse.clone()
    bad[..., 6] = float("-inf")  # row 6 sees keys 0..2 under the causal mask
    with pytest.raises(ValueError, match="causal=True"):
        attention_probs(q, k, bad, causal=True)


@pytest.mark.parametrize("made, read", [(True, False), (False, True)])
def test_attention_probs_refuses_an_lse_of_the_other_mask(made, read):
    # N_q = N_k: no row is empty, so only the row sums tell the masks apart
    q, k, v = _qkv(n_q=16, n_k=16, seed=3)
    _, lse = flash_attention(q, k, v, causal=made, return_lse=True)
    p = attention_probs(q, k, lse, causal=made)  # its own mask: rows sum to 1
    assert torch.allclose(p.sum(-1), torch.ones(()), atol=1e-5)
    with pytest.raises(ValueError, match="lse does not normalise query row"):
        attention_probs(q, k, lse, causal=read)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_attention_probs_accepts_its_own_lse_at_large_logits(dtype):
    # the bound scales with |q| |k|: large logits in half precision stay accepted
    q, k, v = (t.to(dtype) for t in _qkv(n_q=16, n_k=40, d=64, seed=4))
    q = q * 6
    for causal in (False, True):
        _, lse = flash_attention(q, k, v, causal=causal, return_lse=True)
        p = attention_probs(q, k, lse, causal=causal, rows=[0, 7, 15])
        assert p.shape == (1, 2, 3, 40)


def test_attention_probs_keeps_a_minus_inf_lse_when_scores_are_infinite():
    q, k, v = _qkv()
    _, lse = flash_attention(q, k, v, return_lse=True)
    q = q.clone()
    q[0, 0, 3] = float("-inf")  # non-finite input: no claim about its lse is made
    lse[0, 0, 3] = float("-inf")
    p = attention_probs(q, k, lse)
    assert p.shape == (1, 2, 8, 8)
    assert torch.allclose(p[0, 1].sum(-1), torch.ones(()), atol=1e-5)


# --------------------------------------------------------------------------------------
# choose_splits and msda_config refuse bad arguments by name (issue 33)
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "args, exc, match",
    [
        ((4, 1000, 0), ValueError, "sms must be >= 1"),
        ((4, 1000, -2), ValueError, "sms must be >= 1"),
        ((2.5, 1000, 4), TypeError, "programs must be an int"),
        ((4, 1000.0, 4), TypeError, "max_seqlen must be an int"),
        ((4, -1, 4), ValueError, "max_seqlen must be >= 0"),
        ((-1, 1000, 4), ValueError, "programs must be >= 0"),
        ((4, 1000, True), TypeError, "sms must be an int"),
    ],
)
def test_choose_splits_refuses_bad_sizes_by_name(args, exc, match):
    with pytest.raises(exc, match=match):
        choose_splits(*args)


def test_choose_splits_returns_an_int_split_count():
    s = choose_splits(2, 100_000, 132)
    assert type(s) is int and s > 1
    assert choose_splits(0, 1000, 4) == 1  # nothing to split: one split


def test_msda_config_refuses_an_unknown_kernel_listing_the_names():
    with pytest.raises(ValueError, match=r"kernel must be one of \('fwd', 'bwd'\)"):
        deformable.msda_config("forward", 1024, 32, (9, 0))
    assert deformable.msda_config("bwd", 1024, 32, (9, 0)) == (16, 4)


def test_ring_attention_names_a_group_that_is_not_a_process_group():
    q, k, v = _qkv()
    with pytest.raises(TypeError, match="group must be a torch.distributed"):
        ring_attention(q, k, v, group="world")


def test_the_flash_paths_name_their_scale_softmax_scale_as_flash_attention_does():
    """kernels.flash.forward_tma's entry points take ``softmax_scale``, as the public
    ``flash_attention`` does: a bad one is named so (checked before any GPU work, so on
    a CPU too); the old ``sm_scale=`` still runs, with a DeprecationWarning."""
    from kernels.flash import forward_tma as tma

    q, k, v = _qkv()
    for call in (
        lambda: tma.forward_tma(q, k, v, softmax_scale=float("nan")),
        lambda: tma.forward(q, k, v, softmax_scale=float("nan"), path="pointer"),
    ):
        with pytest.raises(ValueError, match="^softmax_scale must be finite"):
            call()
    with pytest.warns(DeprecationWarning, match="sm_scale"):
        old = tma.forward(q, k, v, sm_scale=0.5, path="pointer")
    new = tma.forward(q, k, v, softmax_scale=0.5, path="pointer")
    assert torch.equal(old[0], new[0]) and torch.equal(old[1], new[1])
