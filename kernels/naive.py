"""Naive attention in PyTorch: the baseline the chapters time against,
and an fp64 reference.

``naive_attention`` does what the textbook formula says and nothing cleverer: it
materialises the scores ``S = q k^T * scale`` and the probabilities ``P = softmax(S)``
as full ``(B, H, N_q, N_k)`` tensors in HBM, then computes ``P v``. That is exactly the
memory traffic FlashAttention avoids, so it is the honest baseline (it is what a model
gets without a fused kernel). It is differentiable by autograd, which stores ``P`` for
the backward pass: O(N_q * N_k) memory per head.

Conventions shared with :mod:`kernels.flash`:

* layout ``(B, H, N, d)``; ``k`` and ``v`` may have fewer
  heads ``H_kv`` with ``H`` a multiple of ``H_kv`` (GQA/MQA):
  each k/v head serves ``H // H_kv`` consecutive q heads;
* ``causal=True`` aligns the mask bottom-right: query ``i`` sees key ``j`` iff
  ``j <= i + N_k - N_q`` (the FlashAttention-2 convention; the usual lower triangle when
  ``N_q == N_k``);
* a query row that sees no key gets probability 0 everywhere and output 0, never NaN;
  a NaN in a row's inputs gives NaN in that row (``reference_attention``, the top-k
  baseline: output and lse), and a value row that a query cannot see never reaches it;
* ``scale`` (PyTorch's name) defaults to ``1 / sqrt(d)``; the old keyword ``sm_scale=``
  still works, with a DeprecationWarning.

``naive_hard_attention`` and ``naive_topk_attention`` are chapter 3's baselines for
``kernels.hard``: the same materialised ``S`` (``naive_scores``), then argmax or top-k
and a gather of the selected rows of ``v``.

``reference_attention`` computes the same thing in float64 and also returns the natural
log-sum-exp of each row (``-inf`` for a row with no visible key); tests and the
benchmark suite's correctness checks compare kernels against it.
"""

from __future__ import annotations

import torch

from .common import (
    check_bool,
    check_int,
    check_qkv,
    check_scale,
    check_size,
    renamed_scale,
)


def causal_mask(n_q: int, n_k: int, device=None) -> torch.Tensor:
    """Boolean ``(n_q, n_k)`` mask, True where query i may see
    key j (bottom-right aligned). n_q, n_k >= 0."""
    n_q, n_k = check_size("n_q", n_q), check_size("n_k", n_k)
    i = torch.arange(n_q, device=device)[:, None]
    j = torch.arange(n_k, device=device)[None, :]
    return j <= i + (n_k - n_q)


def masked_matmul(
    p: torch.Tensor, v: torch.Tensor, keep: torch.Tensor | None
) -> torch.Tensor:
    """sum_j p_ij v_j over the kept j only: a hidden value row (NaN, inf) never reaches
    a query that cannot see it (``p @ v`` would multiply it by 0: 0 * NaN = NaN)."""
    if keep is None or bool(torch.isfinite(v).all()):
        return torch.matmul(p, v)
    terms = torch.where(keep.unsqueeze(-1), p.unsqueeze(-1) * v.unsqueeze(-3), 0.0)
    return terms.sum(-2)  # (..., N_q, d)


def repeat_kv(x: torch.Tensor, group: int) -> torch.Tensor:
    """(B, H_kv, N, d) -> (B, H_kv * group, N, d):
    each k/v head serves ``group`` q heads (an int >= 1)."""
    if not isinstance(x, torch.Tensor) or x.ndim != 4:
        raise TypeError(
            f"x must be a 4-D (B, H_kv, N, d) torch.Tensor, got "
            f"{type(x).__name__} {tuple(getattr(x, 'shape', ()))}"
        )
    if check_size("group", group) < 1:
        raise ValueError(f"group must be >= 1 (q heads per k/v head), got {group}")
    return x if group == 1 else x.repeat_interleave(group, dim=1)  # (B, H, N, d)


def naive_scores(
    q: torch.Tensor,
    k: torch.Tensor,
    causal: bool = False,
    scale: float | None = None,
    *,
    sm_scale: float | None = None,
) -> torch.Tensor:
    """S = q k^T * scale, materialised: (B, H, N_q, N_k), causally hidden entries
    -inf."""
    check_qkv(q, k, k)
    scale = check_scale(renamed_scale(scale, sm_scale, "scale"), q.shape[-1])
    check_bool("causal", causal)
    k = repeat_kv(k, q.shape[1] // k.shape[1])  # (B, H, N_k, d)
    s = torch.matmul(q, k.transpose(-2, -1)) * scale  # (B, H, N_q, N_k): in HBM
    if causal:
        s = s.masked_fill(
            ~causal_mask(q.shape[2], k.shape[2], device=q.device), float("-inf")
        )
    return s


def naive_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    scale: float | None = None,
    *,
    sm_scale: float | None = None,
) -> torch.Tensor:
    """softmax(q k^T * scale) v with S and P materialised: q (B, H, N_q, d), k/v (B,
    H_kv, N_k, d).

    Returns o: (B, H, N_q, d) in q's dtype. Computed in the inputs' dtype (as a model
    would run it), so its error against :func:`reference_attention` is PyTorch's own
    error in that dtype.
    """
    check_qkv(q, k, v)
    v = repeat_kv(v, q.shape[1] // k.shape[1])  # (B, H, N_k, d)
    scale = renamed_scale(scale, sm_scale, "scale")
    s = naive_scores(q, k, causal, scale)  # (B, H, N_q, N_k): in HBM
    p = torch.softmax(s, dim=-1)  # (B, H, N_q, N_k): in HBM, kept for the backward
    if causal:  # a row with no visible key: 0, not NaN
        p = p.masked_fill(
            ~causal_mask(q.shape[2], k.shape[2], device=q.device).any(
                dim=-1, keepdim=True
            ),
            0.0,
        )
    return torch.matmul(p, v)  # (B, H, N_q, d)


def reference_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    scale: float | None = None,
    *,
    sm_scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """fp64 attention and its natural log-sum-exp:
    returns (o (B, H, N_q, d), lse (B, H, N_q)).

    Differentiable (in float64) so tests can take reference gradients with autograd.
    A row with no visible key has o = 0 and lse = -inf. Mixed input dtypes are fine
    (everything becomes float64).
    """
    check_qkv(q, k, v, same_dtype=False)
    group = q.shape[1] // k.shape[1]
    scale = check_scale(renamed_scale(scale, sm_scale, "scale"), q.shape[-1])
    q, k, v = q.double(), repeat_kv(k.double(), group), repeat_kv(v.double(), group)
    s = torch.matmul(q, k.transpose(-2, -1)) * scale  # (B, H, N_q, N_k)
    keep = None
    if check_bool("causal", causal):
        keep = causal_mask(q.shape[2], k.shape[2], device=q.device)
        s = s.masked_fill(~keep, float("-inf"))
    # (B, H, N_q); -inf where every key is masked, NaN rows NaN
    lse = torch.logsumexp(s, dim=-1)
    # no visible key: P = 0 (a NaN row stays NaN)
    empty = torch.isneginf(lse)[..., None]
    p = torch.where(empty, 0.0, torch.exp(s - torch.where(empty, 0.0, lse[..., None])))
    return masked_matmul(p, v, keep), lse  # (B, H, N_q, d), (B, H, N_q)


def _rows(v: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """v (B, H, N_k, d), idx (B, H, N_q, T) -> the selected rows (B, H, N_q, T, d)."""
    B, H, N_q, T = idx.shape
    # (B, H, N_q*T, d)
    flat = idx.reshape(B, H, N_q * T, 1).expand(-1, -1, -1, v.shape[-1])
    return torch.gather(v, 2, flat).view(B, H, N_q, T, v.shape[-1])  # (B, H, N_q, T, d)


def naive_hard_attention(q, k, v, causal=False, scale=None, *, sm_scale=None):
    """S = q k^T (materialised), idx = argmax S, o = v[idx].  Returns (o, idx).

    A timing baseline for ``kernels.hard.hard_attention``: a row with no visible key
    gets torch.argmax's answer for an all -inf row (index 0), where the kernel returns
    -1 and o = 0.
    """
    check_qkv(q, k, v)
    scale = renamed_scale(scale, sm_scale, "scale")
    s = naive_scores(q, k, causal, scale)  # (B, H, N_q, N_k)
    idx = s.argmax(-1)  # (B, H, N_q)
    v = repeat_kv(v, q.shape[1] // k.shape[1])  # (B, H, N_k, d)
    return _rows(v, idx.unsqueeze(-1))[:, :, :, 0], idx


def naive_topk_attention(q, k, v, topk, causal=False, scale=None, *, sm_scale=None):
    """S = q k^T (materialised), the topk scores per row, their softmax,
    the kept rows of V.

    The baseline for ``kernels.hard.topk_attention``. Slots whose score is -inf (fewer
    than ``topk`` visible keys) weigh 0 and are not read; a row with no visible key
    gives 0, a row with a NaN score gives NaN.
    """
    check_qkv(q, k, v)
    check_int("topk", topk, 1)
    scale = renamed_scale(scale, sm_scale, "scale")
    s = naive_scores(q, k, causal, scale)  # (B, H, N_q, N_k)
    vals, idx = s.topk(min(topk, s.shape[-1]), dim=-1)  # (B, H, N_q, T)
    kept = vals > float("-inf")  # (B, H, N_q, T)
    m = vals.float().amax(-1, keepdim=True)
    m = torch.where(torch.isneginf(m), 0.0, m)
    e = torch.where(kept, torch.exp(vals.float() - m), 0.0)
    l = e.sum(-1, keepdim=True)
    p = torch.where(l == 0, 0.0, e / torch.where(l == 0, 1.0, l))  # NaN rows stay NaN
    nan_row = torch.isnan(s).any(-1, keepdim=True)
    p = torch.where(nan_row, float("nan"), p).to(v.dtype)
    v_sel = _rows(repeat_kv(v, q.shape[1] // k.shape[1]), idx)  # (B, H, N_q, T, d)
    v_sel = torch.where(kept.unsqueeze(-1), v_sel, 0.0)  # an unkept slot is never read
    return torch.einsum("bhqt,bhqtd->bhqd", p, v_sel)
