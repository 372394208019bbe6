"""The public face of the FlashAttention kernels: validation, autograd, calls.

``flash_attention`` (validate, then the autograd Function ``_FlashAttention``, which
runs a forward path of :mod:`.forward` or :mod:`.forward_tma` and a backward of
:mod:`.backward` or :mod:`.backward_fused`) and ``attention_probs``.
"""

from __future__ import annotations

import torch

from .. import runtime
from ..common import LN2, check_bool, renamed_scale
from . import backward_fused as fused
from .backward import backward_lse
from .checks import _grad_flag, check_inputs
from .forward import forward_lse
from .forward_tma import tma_lse
from .tiles import FORWARD_PATHS


class _FlashAttention(torch.autograd.Function):
    """Autograd glue: saves q, k, v, o, lse (B, H, N_q) -- never the N_q x N_k matrix P.

    The saved lse is in base 2 (the kernels' units, so the backward's recomputed scores
    and lse sit on the same fp32 grid); the lse handed to the caller is converted to
    natural log. That lse is differentiable: its gradient enters the FA2 backward as
    delta <- delta - dlse.
    """

    @staticmethod
    def forward(ctx, q, k, v, causal, scale, return_lse, forward_path, deterministic):
        if forward_path == "pointer":
            o, lse2 = forward_lse(q, k, v, causal, scale)
        else:  # TMA descriptors (sm_90), kernels.flash.forward_tma
            o, lse2 = tma_lse(
                q, k, v, causal, scale, warp_specialize=forward_path == "tma-ws"
            )
        ctx.save_for_backward(q, k, v, o, lse2)
        ctx.causal, ctx.scale, ctx.deterministic = causal, scale, deterministic
        if not return_lse:
            return o
        lse = lse2 * LN2  # (B, H, N_q) natural log; -inf stays -inf
        return o, lse

    @staticmethod
    def backward(ctx, do, dlse=None):
        q, k, v, o, lse2 = ctx.saved_tensors
        if ctx.deterministic or not (
            runtime.INTERPRET
            or fused.configs(
                torch.cuda.get_device_capability(q.device), q.shape[-1], q.dtype
            )
        ):
            # (the fused kernel has no tile for this GPU and head dim: the two-kernel
            # backward, deterministic as well)
            dq, dk, dv = backward_lse(do, q, k, v, o, lse2, ctx.causal, ctx.scale, dlse)
        else:  # one fused kernel, dQ by fp32 atomics: kernels.flash.backward_fused
            bad = _grad_flag(ctx.causal, q, k, v, do, lse2, dlse)
            dq, dk, dv = fused.backward_fused(
                do, q, k, v, o, lse2, ctx.causal, ctx.scale, dlse=dlse, bad=bad
            )
        return dq, dk, dv, None, None, None, None, None


def flash_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    softmax_scale: float | None = None,
    return_lse: bool = False,
    forward_path: str = "pointer",
    deterministic: bool = True,
    *,
    sm_scale: float | None = None,
):
    """softmax(q k^T * softmax_scale) v without ever storing the N_q x N_k scores.

    Args:
        q: (B, H, N_q, d) float16, bfloat16 or float32.
        k, v: (B, H_kv, N_k, d), same dtype and device; H must be a multiple of H_kv.
        causal: mask aligned bottom-right: query i sees key j iff j <= i + N_k - N_q.
        softmax_scale: softmax scale, default 1 / sqrt(d) (flash-attn's name; the old
            keyword ``sm_scale=`` still works, with a DeprecationWarning).
        return_lse: also return the natural log-sum-exp of each row.
        forward_path: "pointer" (the default), or "tma" / "tma-ws" (sm_90 only: the
            forward of :mod:`kernels.flash.forward_tma`, K/V tiles by TMA descriptors,
            the second with a warp-specialised key loop). Not the default until a GPU
            run has checked them (``make bench`` records which paths passed).
        deterministic: True (the default): the two-kernel FlashAttention-2 backward,
            the same bits on every run. False: one fused kernel
            (:mod:`kernels.flash.backward_fused`, five matmuls per tile) that
            accumulates dQ with fp32 atomics, so dQ's rounding varies from run to run.
            Where it has no tile (sm_75; see ``kernels.flash.backward_fused.configs``)
            the two-kernel backward runs instead.

    Returns:
        o: (B, H, N_q, d) in q's dtype (0 for a row with no visible key), and with
        ``return_lse`` also lse: (B, H, N_q) float32 (-inf for such a row).
        Differentiable with respect to q, k and v, through o and through lse (so partial
        attentions can be merged by their lse, as in split-K or ring attention).
    """
    softmax_scale = renamed_scale(softmax_scale, sm_scale, "softmax_scale")
    scale = check_inputs(q, k, v, softmax_scale, "softmax_scale")
    check_bool("causal", causal)
    check_bool("return_lse", return_lse)
    check_bool("deterministic", deterministic)
    if forward_path not in FORWARD_PATHS:
        raise ValueError(
            f"forward_path must be one of {FORWARD_PATHS}, got {forward_path!r}"
        )
    return _FlashAttention.apply(
        q, k, v, causal, scale, return_lse, forward_path, deterministic
    )


def attention_probs(
    q: torch.Tensor,
    k: torch.Tensor,
    lse: torch.Tensor,
    causal: bool = False,
    softmax_scale: float | None = None,
    rows=None,
    *,
    sm_scale: float | None = None,
) -> torch.Tensor:
    """Recompute softmax probabilities P = exp(S * scale - lse) for chosen query rows.

    The kernel never stores P; this rebuilds it exactly from q, k and the lse the
    forward pass saved (what the backward kernels do tile by tile), so a reader can
    draw the map. Plain PyTorch in float32.

    Args:
        q: (B, H, N_q, d); k: (B, H_kv, N_k, d); lse: (B, H, N_q) from
            ``flash_attention(..., return_lse=True)``.
        rows: None for every query row, or a sequence / 1-D tensor of row indices.

    Returns:
        (B, H, len(rows), N_k) float32; masked entries and rows with lse = -inf are 0.
        An lse that is not floating point is a TypeError; an lse of -inf at a row that
        sees keys (impossible for finite q and k), or one whose rows do not sum to 1
        within the fp32 error bound of the recomputation, a ValueError.
    """
    softmax_scale = renamed_scale(softmax_scale, sm_scale, "softmax_scale")
    scale = check_inputs(q, k, k, softmax_scale, "softmax_scale")
    check_bool("causal", causal)
    B, H, N_q, d = q.shape
    H_kv, N_k = k.shape[1], k.shape[2]
    if not isinstance(lse, torch.Tensor) or tuple(lse.shape) != (B, H, N_q):
        shape = (
            tuple(lse.shape) if isinstance(lse, torch.Tensor) else type(lse).__name__
        )
        raise ValueError(f"lse must be (B, H, N_q) = {(B, H, N_q)}, got {shape}")
    if not lse.is_floating_point():
        raise TypeError(
            f"lse must be a floating-point tensor (flash_attention's float32 lse), "
            f"got dtype {lse.dtype}"
        )
    # A row that sees at least one key has a finite lse when q and k are finite (only
    # an empty causal row has -inf): a -inf there means the lse of another problem.
    sees = torch.ones(N_q, dtype=torch.bool, device=q.device)
    if causal:
        sees = torch.arange(N_q, device=q.device) + (N_k - N_q) >= 0
    if bool((torch.isneginf(lse) & sees).any()) and bool(
        torch.isfinite(q).all() and torch.isfinite(k).all()
    ):
        raise ValueError(
            f"lse is -inf at rows that see keys (causal={causal}): with finite q and k "
            f"only a row with no visible key (causal, N_q > N_k) has lse -inf; was lse "
            f"computed with another causal flag or other inputs?"
        )
    if rows is None:
        idx = torch.arange(N_q, device=q.device)
    else:
        idx = torch.as_tensor(rows, device=q.device).reshape(-1)
        if idx.dtype.is_floating_point or idx.dtype == torch.bool:
            raise TypeError(f"rows must hold integer indices, got dtype {idx.dtype}")
        if idx.numel() and (int(idx.min()) < -N_q or int(idx.max()) >= N_q):
            raise ValueError(f"rows must index 0..{N_q - 1}, got {rows!r}")
        idx = idx.long() % N_q
    kk = k.float().repeat_interleave(H // H_kv, dim=1)  # (B, H, N_k, d)
    # (B, H, R, N_k)
    s = torch.matmul(q.float()[:, :, idx], kk.transpose(-2, -1)) * scale
    row_lse = lse.float()[:, :, idx]  # (B, H, R)
    visible = torch.isfinite(row_lse)[..., None].expand_as(s)  # (B, H, R, N_k)
    if causal:
        visible = visible & (
            torch.arange(N_k, device=q.device)[None, :] <= idx[:, None] + (N_k - N_q)
        )
    p = torch.exp(s - torch.where(torch.isfinite(row_lse), row_lse, 0.0)[..., None])
    p = torch.where(visible, p, 0.0)
    _check_rows_sum_to_one(p, s, q[:, :, idx], kk, row_lse, scale, causal, idx)
    return p


def _check_rows_sum_to_one(p, s, q_rows, kk, row_lse, scale, causal, idx) -> None:
    """Each rebuilt row with a finite lse sums to 1 up to the fp32 error of the two
    computations of its scores and lse (ValueError otherwise: an lse of another
    problem, e.g. a causal one read with causal=False).

    Bound (unit roundoff u = 2^-24): a score q.k * scale summed in another order
    differs by at most 2 d u |scale| (|q| . |k|) between the kernel and here; the
    subtraction, the scale and the natural-log conversion add 3 u (|s| + |lse|); the
    kernel's exp2 (ex2.approx on a GPU) is within 2^-21 relative; the row sum adds
    N_k u. The row sum then lies within expm1(max_j delta_j) + N_k u of 1, doubled
    for margin. Rows with a NaN, or whose inputs are not finite, are not judged.
    """
    u = 2.0**-24
    n_k, d = kk.shape[-2], kk.shape[-1]
    mag = torch.matmul(q_rows.float().abs(), kk.abs().transpose(-2, -1))
    delta = 2 * d * u * abs(scale) * mag + 3 * u * (s.abs() + row_lse.abs()[..., None])
    delta = torch.where(p > 0, delta, 0.0).amax(-1) + 2.0**-21  # (B, H, R)
    tol = 2 * (torch.expm1(delta) + n_k * u)
    err = (p.sum(-1) - 1).abs()
    judged = torch.isfinite(row_lse) & torch.isfinite(err) & torch.isfinite(tol)
    bad = judged & (err > tol)
    if bool(bad.any()):
        b, h, r = bad.nonzero()[0].tolist()
        total, bound = 1 + float(err[b, h, r]), float(tol[b, h, r])
        raise ValueError(
            f"lse does not normalise query row {int(idx[r])} (batch {b}, head {h}): "
            f"its probabilities sum to {total:.6g}, beyond the fp32 bound "
            f"{bound:.2g} (causal={causal}): was lse computed with another causal "
            f"flag or other inputs?"
        )
