"""Argument checks of ``flex_attention``: each refusal is a TypeError/ValueError naming
the argument as the caller wrote it."""

from __future__ import annotations

from ..common import (
    FLOAT_DTYPES,
    check_bool,
    check_device,
    check_tensor,
    kernel_scale,
)
from .block_mask import BlockMask
from .mods import Mod, as_mod
from .tiles import MAX_HEAD_DIM


def validate(q, k, v, score_mod, block_mask, scale, enable_gqa, return_lse, sinks):
    """Check every argument; return (scale, score Mod or None, sinks float32 or
    None)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, t)
        if t.ndim != 4:
            raise ValueError(
                f"{name} must be 4-D (B, H, N, d), got shape {tuple(t.shape)}"
            )
        if t.dtype not in FLOAT_DTYPES:
            raise TypeError(
                f"{name} must be float16, bfloat16 or float32, got dtype {t.dtype}"
            )
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(
            f"q, k, v must share a dtype, got q {q.dtype}, k {k.dtype}, v {v.dtype}"
        )
    if not (q.device == k.device == v.device):
        raise ValueError(
            f"q, k, v must be on one device, got q {q.device}, k {k.device}, "
            f"v {v.device}"
        )
    check_device("q, k, v", q.device)
    B, H, N_q, d = q.shape
    Bk, H_kv, N_k, dk = k.shape
    if tuple(v.shape[:3]) != (Bk, H_kv, N_k):
        raise ValueError(
            f"v must be (B, H_kv, N_k, d_v) with k's (B, H_kv, N_k) = "
            f"{(Bk, H_kv, N_k)}, got v {tuple(v.shape)}"
        )
    if Bk != B:
        raise ValueError(f"k batch {Bk} does not match q batch {B}")
    if dk != d:
        raise ValueError(f"k head dim {dk} does not match q head dim {d}")
    dv = v.shape[-1]
    for name, n in (("q", d), ("v", dv)):
        if not 1 <= n <= MAX_HEAD_DIM:
            raise ValueError(f"{name}'s head dim must be in 1..{MAX_HEAD_DIM}, got {n}")
    if min(B, H, N_q, H_kv, N_k) < 1:
        raise ValueError(
            f"batch, heads and lengths must be >= 1, got q {tuple(q.shape)}, "
            f"k {tuple(k.shape)}"
        )
    check_bool("enable_gqa", enable_gqa)
    check_bool("return_lse", return_lse)
    if H != H_kv:
        if not enable_gqa:
            raise ValueError(
                f"q has {H} heads and k/v {H_kv}: pass enable_gqa=True for "
                f"grouped-query attention"
            )
        if H % H_kv:
            raise ValueError(f"q heads {H} must be a multiple of k/v heads {H_kv}")
    if block_mask is not None:
        if not isinstance(block_mask, BlockMask):
            raise TypeError(
                f"block_mask must be a kernels.flex BlockMask (create_block_mask) or "
                f"None, got {type(block_mask).__name__}"
            )
        if block_mask.seq_lengths != (N_q, N_k):
            raise ValueError(
                f"block_mask was made for (Q_LEN, KV_LEN) = {block_mask.seq_lengths}, "
                f"but q has N_q={N_q} and k N_k={N_k}"
            )
        Bm, Hm = block_mask.state.shape[:2]
        if Bm not in (1, B) or Hm not in (1, H):
            raise ValueError(
                f"block_mask was made for B={Bm}, H={Hm}; q has B={B}, H={H} "
                f"(a block mask's B and H must be 1 (None) or match)"
            )
        if block_mask.state.device != q.device:
            raise ValueError(
                f"block_mask is on {block_mask.state.device}, q on {q.device}"
            )
    mod = as_mod(score_mod, "score", "score_mod")
    if isinstance(mod, Mod):
        for leaf in mod.leaves():
            if leaf.heads is not None and leaf.heads != H:
                raise ValueError(
                    f"score_mod {leaf} carries {leaf.heads} heads, q has {H}"
                )
    if sinks is not None:
        check_tensor("sinks", sinks)
        if tuple(sinks.shape) != (H,):
            raise ValueError(f"sinks must be (H_q,) = ({H},), got {tuple(sinks.shape)}")
        if not sinks.dtype.is_floating_point:
            raise TypeError(f"sinks must be floating point, got dtype {sinks.dtype}")
        if sinks.device != q.device:
            raise ValueError(f"sinks is on {sinks.device}, q on {q.device}")
    return kernel_scale(scale, d, "scale"), mod
