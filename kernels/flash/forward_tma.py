"""FlashAttention-2 forward with TMA descriptors (sm_90), warp-specialised or not.

Spec sheet
----------
Algorithm
    The forward of :mod:`kernels.flash` (``_attn_fwd``), line for line, with one change:
    the q, k, v tiles are read and the o tile is written through host-side tensor
    descriptors (``triton.tools.tensor_descriptor.TensorDescriptor``), which Triton
    lowers to Hopper's Tensor Memory Accelerator (``cp.async.bulk.tensor``, SASS
    ``UTMALDG``/``UTMASTG``) on sm_90. One 4-D descriptor per tensor, over its own
    (B, H, N, d) shape and strides, block (1, 1, rows, BLOCK_D): a tile that runs past
    N or d reads zeros and a store past them is clipped by the hardware, exactly the
    zeros the pointer path's masked loads produce, so the numbers are the same: the
    online softmax, the scale folded into one FFMA per score on unmasked blocks (rowmin
    for a negative scale), the bottom-right causal mask, GQA, ragged lengths, empty
    causal rows (o = 0, lse = -inf), NaN rows staying NaN, and the device-side
    ``V_BAD`` flag that makes the causal masked tiles sum key by key (``_select_dot``,
    through plain pointers) so a NaN/inf in a value row hidden from a query never
    reaches it.
    ``warp_specialize=True`` marks the unmasked key loop ``tl.range(...,
    warp_specialize=True)``: Triton splits the program into a producer warp group that
    issues the TMA loads and consumer warp groups that run the dots and the softmax.
    The masked stage (diagonal and ragged blocks) is not specialised.
Paths
    ``FORWARD_PATHS``: ``"pointer"`` (kernels.flash, the default), ``"tma"`` and
    ``"tma-ws"`` (this module). A path becomes the default only after a GPU run has
    checked it: ``benchmarks/run.py`` checks every path against an fp64 reference on
    the GPU and records which passed (``forward_paths`` in the flash suite's results).
Shapes, dtypes, head dims, causal
    As :func:`kernels.flash.flash_attention`'s forward: q (B, H, N_q, d), k/v (B, H_kv,
    N_k, d), fp16/bf16/fp32, d in 1..256 (padded to a power of two), any N_q, N_k.
    Returns ``(o, lse2)``: o in q's dtype, lse2 the base-2 log-sum-exp (float32,
    (B, H, N_q)), the contract of ``kernels.flash.forward_lse``. Forward only: no
    autograd.
Devices
    sm_90 (H100/H200) and newer: TMA descriptors need Hopper. Under the Triton
    interpreter (CPU) the descriptors are emulated, so the path is tested there.
Known limits
    TMA needs each tensor's last dim contiguous (stride 1), every other stride and the
    base address 16-byte aligned: for a contiguous tensor, d * itemsize a multiple of 16
    (d a multiple of 8 in fp16/bf16, of 4 in fp32). A tensor that does not qualify is
    refused with a ValueError naming it (``tma_problem`` says why without raising); the
    caller falls back to the pointer path (kernels.flash), which takes any strides.
    Warp specialisation on Hopper is new in Triton; whether it helps is measured, not
    assumed.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from .. import runtime
from ..common import LOG2E_JIT, check_bool, dot_precision, renamed_scale, upcast
from .blocks import finish_rows, key_range, softmax_pv_step
from .checks import _v_bad, check_inputs
from .tiles import (
    _HEURISTICS,
    FORWARD_PATHS,
    INTERPRET_CONFIG,
    arch_class,
    block_d,
    configs,
    n_bucket,
)

#: The path flash_attention uses unless told otherwise; a GPU run's correctness check
#: (benchmarks/run.py, ``forward_paths`` in the results file) is the evidence to change
#: it.
DEFAULT_FORWARD_PATH = "pointer"
#: TMA alignment: base address and every stride but the last, in bytes.
TMA_ALIGN = 16


def tma_problem(t: torch.Tensor, name: str) -> str | None:
    """Why ``t`` cannot be read through a TMA descriptor (None when it can)."""
    item = t.element_size()
    if t.data_ptr() % TMA_ALIGN:
        return (
            f"{name} starts at an address that is not {TMA_ALIGN}-byte aligned "
            f"(data_ptr % {TMA_ALIGN} = {t.data_ptr() % TMA_ALIGN})"
        )
    if t.shape[-1] > 1 and t.stride(-1) != 1:
        return (
            f"{name}'s last dim is not contiguous (strides {tuple(t.stride())}, "
            f"shape {tuple(t.shape)})"
        )
    for i in range(t.ndim - 1):
        s = t.stride(i)
        if t.shape[i] > 1 and (s <= 0 or (s * item) % TMA_ALIGN):
            return (
                f"{name}.stride({i}) = {s} elements = {s * item} bytes is not a "
                f"positive multiple of {TMA_ALIGN} bytes (shape {tuple(t.shape)}, "
                f"strides {tuple(t.stride())}, {t.dtype}): contiguous tensors need "
                f"d * itemsize to be a multiple of {TMA_ALIGN}"
            )
    return None


def _descriptor(t: torch.Tensor, bd: int) -> TensorDescriptor:
    """A 4-D descriptor over ``t`` (B, H, N, d); its block shape is set per config by
    ``_set_block_shapes``. Strides of size-1 dims (never stepped over) are replaced by
    aligned ones so the descriptor is valid whatever torch reports for them."""
    align = TMA_ALIGN // t.element_size()
    shape, strides = list(t.shape), list(t.stride())
    strides[-1] = 1
    for i in range(t.ndim - 2, -1, -1):
        if shape[i] == 1:
            inner = strides[i + 1] * shape[i + 1]
            strides[i] = -(-inner // align) * align
    return TensorDescriptor(t, shape, strides, [1, 1, 16, bd])


def _set_block_shapes(nargs) -> None:
    """Config pre-hook: the descriptors' blocks follow the config's tiles."""
    bm, bn, bd = nargs["BLOCK_M"], nargs["BLOCK_N"], nargs["BLOCK_D"]
    nargs["desc_q"].block_shape = [1, 1, bm, bd]
    nargs["desc_o"].block_shape = [1, 1, bm, bd]
    nargs["desc_k"].block_shape = [1, 1, bn, bd]
    nargs["desc_v"].block_shape = [1, 1, bn, bd]


#: sm_90 fp16/bf16 tiles (BLOCK_M, BLOCK_N, num_warps, num_stages) by BLOCK_D, each
#: checked by ``python -m kernels.flash.compile_check --target sm90 --kernel
#: fwd-tma --kernel fwd-tma-ws`` (fits shared memory, no spills). Non-causal:
#: kernels.flash's sm_90 forward tiles. Causal: the masked stage with its key-by-key
#: path for a V holding NaN/inf costs registers, and with descriptor loads the pointer
#: forward's 128 x 128 (d = 128) and 128 x 64 (d = 256) tiles spill, so these replace
#: them.
_CAUSAL_TILES: dict[int, list[tuple[int, int, int, int]]] = {
    16: [(128, 64, 4, 3)],
    32: [(128, 64, 4, 3)],
    64: [(128, 64, 8, 3), (64, 64, 4, 3)],
    128: [(128, 64, 8, 2), (128, 64, 8, 3)],
    256: [(64, 64, 8, 2)],
}
#: Non-causal tiles of the warp-specialised loop. Triton 3.7's Hopper warp
#: specialisation acts only on 4-warp programs (it adds a producer warp group: 12 warps
#: in all; with 8 warps it leaves the loop as it is) and, with host-side descriptors,
#: only at BLOCK_M = 64 (at 128 it splits the query rows between two consumer groups
#: and fails: "descriptor block and tensor must have the same number of elements").
#: It does not act on the causal kernel (two key loops; the causal tma-ws path runs
#: ``_CAUSAL_TILES`` unspecialised) and fails on a ragged N_k, where the loop is not
#: marked (the WS_LOOP heuristic).
_WS_TILES: dict[int, list[tuple[int, int, int, int]]] = {
    16: [(64, 128, 4, 3), (64, 64, 4, 3)],
    32: [(64, 128, 4, 3), (64, 64, 4, 3)],
    64: [(64, 128, 4, 2), (64, 64, 4, 3)],
    128: [(64, 64, 4, 2), (64, 128, 4, 2)],
    256: [(64, 64, 4, 2)],
}


def tma_configs(
    capability: tuple[int, int],
    head_dim: int,
    dtype: torch.dtype = torch.float16,
    warp_specialize: bool = False,
    causal: bool = False,
) -> list[tuple[int, int, int, int]]:
    """Shipped (BLOCK_M, BLOCK_N, num_warps, num_stages) of the TMA forward. Empty,
    so refused, below sm_90, on GPUs with less shared memory (sm_120) and for
    float32: with CUDA-core dots every fp32 tile spills once its tiles arrive by TMA
    (the pointer path serves fp32)."""
    if capability < (9, 0) or arch_class(capability) != "sm90":
        return []
    if dtype == torch.float32:
        return []
    bd = block_d(head_dim)
    if causal:
        return list(_CAUSAL_TILES[bd])
    if warp_specialize:
        return list(_WS_TILES[bd])
    return configs("fwd", capability, head_dim, dtype)


def _tma_configs(warp_specialize: tuple[bool, ...]) -> list[triton.Config]:
    """Every tile any head dim ships, once per warp-specialisation choice (the pruner
    keeps this GPU's)."""
    if runtime.INTERPRET:
        tiles = {False: [INTERPRET_CONFIG], True: [INTERPRET_CONFIG]}
        warp_specialize = warp_specialize[:1]
    else:
        tiles = {
            ws: sorted(
                {
                    c
                    for d in _WS_TILES
                    for causal in (False, True)
                    for c in tma_configs((9, 0), d, torch.float16, ws, causal)
                }
            )
            for ws in (False, True)
        }
    return [
        triton.Config(
            {"BLOCK_M": bm, "BLOCK_N": bn, "WARP_SPECIALIZE": ws},
            num_warps=w,
            num_stages=s,
            pre_hook=_set_block_shapes,
        )
        for ws in warp_specialize
        for bm, bn, w, s in tiles[ws]
    ]


def _prune(configs_, named_args, **kwargs):
    q = named_args["desc_q"].base
    head_dim = kwargs.get("HEAD_DIM", named_args.get("HEAD_DIM"))
    causal = kwargs.get("IS_CAUSAL", named_args.get("IS_CAUSAL"))
    cap = torch.cuda.get_device_capability(q.device)
    return [
        c
        for c in configs_
        if (c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages)
        in tma_configs(
            cap, head_dim, q.dtype, c.kwargs["WARP_SPECIALIZE"], bool(causal)
        )
    ]


# --------------------------------------------------------------------------------------
# The kernel: kernels.flash._attn_fwd with descriptor loads and stores
# --------------------------------------------------------------------------------------
@triton.jit
def _tma_fwd_inner(
    acc,
    l_i,
    m_i,
    q,
    desc_k,
    desc_v,
    off_z,
    off_hkv,
    v_base,
    stride_vn,
    stride_vd,
    offs_m,
    offs_n0,
    offs_d,
    lo,
    hi,
    qk_scale,
    N_K,
    HEAD_DIM,
    causal_offset,
    v_bad,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    MASKED: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    UPCAST: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    NEG_SCALE: tl.constexpr,
    WARP_SPECIALIZE: tl.constexpr,
):
    """``kernels.flash._attn_fwd_inner`` with k/v tiles read by TMA: rows past N_K
    and columns past HEAD_DIM arrive as zeros, as the pointer path's masked loads give
    them. WARP_SPECIALIZE: producer/consumer warp groups for this loop."""
    for start_n in tl.range(lo, hi, BLOCK_N, warp_specialize=WARP_SPECIALIZE):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        offs_n = start_n + offs_n0
        # -- k, v tiles: HBM -> SRAM by TMA --
        k = desc_k.load([off_z, off_hkv, start_n, 0]).reshape(BLOCK_N, BLOCK_D)
        v = desc_v.load([off_z, off_hkv, start_n, 0]).reshape(BLOCK_N, BLOCK_D)
        if UPCAST:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
        acc, l_i, m_i = softmax_pv_step(
            acc,
            l_i,
            m_i,
            qk,
            v,
            v_base,
            stride_vn,
            stride_vd,
            start_n,
            offs_n,
            offs_m,
            offs_d,
            qk_scale,
            N_K,
            HEAD_DIM,
            causal_offset,
            v_bad,
            BLOCK_N,
            MASKED,
            IS_CAUSAL,
            DOT_PRECISION,
            NEG_SCALE,
        )
    return acc, l_i, m_i


@triton.jit
def _attn_fwd_tma(
    desc_q,
    desc_k,
    desc_v,
    desc_o,
    V,
    LSE2,
    V_BAD,
    sm_scale,
    stride_vz,
    stride_vh,
    stride_vn,
    stride_vd,
    H,
    GROUP,
    N_Q,
    N_K,
    HEAD_DIM,
    N_BUCKET,
    IS_CAUSAL: tl.constexpr,
    BLOCK_D: tl.constexpr,
    UPCAST: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    WARP_SPECIALIZE: tl.constexpr,
    EVEN_M: tl.constexpr,
    EVEN_N: tl.constexpr,
    EVEN_D: tl.constexpr,
    NEG_SCALE: tl.constexpr,
    WS_LOOP: tl.constexpr,
):
    # N_BUCKET (n_bucket(N_K)) is only the autotuner's key; NEG_SCALE: sm_scale < 0;
    # V and its strides serve only the key-by-key path of a V holding NaN/inf;
    # WARP_SPECIALIZE (the config's) asks for the warp-specialised loop, WS_LOOP (a
    # heuristic) says whether this launch gets it
    start_m = tl.program_id(0)
    off_hz = tl.program_id(1)
    off_z = off_hz // H
    off_h = off_hz % H
    off_hkv = off_h // GROUP
    v_base = V + off_z.to(tl.int64) * stride_vz + off_hkv.to(tl.int64) * stride_vh

    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    qk_scale = sm_scale * LOG2E_JIT

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    q = desc_q.load([off_z, off_h, start_m * BLOCK_M, 0]).reshape(BLOCK_M, BLOCK_D)
    if UPCAST:
        q = q.to(tl.float32)

    causal_offset = N_K - N_Q
    hi, full_end = key_range(start_m, N_Q, N_K, IS_CAUSAL, BLOCK_M, BLOCK_N)
    offs_n0 = tl.arange(0, BLOCK_N)
    v_bad = tl.load(V_BAD)
    # stage 1: blocks every row sees in full, no masks (warp-specialised if asked)
    acc, l_i, m_i = _tma_fwd_inner(
        acc,
        l_i,
        m_i,
        q,
        desc_k,
        desc_v,
        off_z,
        off_hkv,
        v_base,
        stride_vn,
        stride_vd,
        offs_m,
        offs_n0,
        offs_d,
        0,
        full_end,
        qk_scale,
        N_K,
        HEAD_DIM,
        causal_offset,
        v_bad,
        BLOCK_N,
        BLOCK_D,
        False,
        IS_CAUSAL,
        UPCAST,
        DOT_PRECISION,
        NEG_SCALE,
        WS_LOOP,
    )
    # stage 2: the diagonal (causal) and the ragged last key block, masked
    if IS_CAUSAL or not EVEN_N:
        acc, l_i, m_i = _tma_fwd_inner(
            acc,
            l_i,
            m_i,
            q,
            desc_k,
            desc_v,
            off_z,
            off_hkv,
            v_base,
            stride_vn,
            stride_vd,
            offs_m,
            offs_n0,
            offs_d,
            full_end,
            hi,
            qk_scale,
            N_K,
            HEAD_DIM,
            causal_offset,
            v_bad,
            BLOCK_N,
            BLOCK_D,
            True,
            IS_CAUSAL,
            UPCAST,
            DOT_PRECISION,
            NEG_SCALE,
            False,
        )

    acc, lse2 = finish_rows(acc, l_i, m_i)
    lse_ptrs = LSE2 + off_hz.to(tl.int64) * N_Q + offs_m
    if EVEN_M:
        tl.store(lse_ptrs, lse2)
    else:
        tl.store(lse_ptrs, lse2, mask=offs_m < N_Q)
    # rows past N_Q and columns past HEAD_DIM are clipped by the TMA store
    desc_o.store(
        [off_z, off_h, start_m * BLOCK_M, 0],
        acc.to(desc_o.dtype).reshape(1, 1, BLOCK_M, BLOCK_D),
    )


_KEY = ["HEAD_DIM", "IS_CAUSAL", "N_BUCKET"]
_HEUR = {
    **_HEURISTICS,
    "NEG_SCALE": lambda a: a["sm_scale"] < 0,
    # the one key loop of an aligned non-causal launch: where Triton 3.7
    # specialises (the causal kernel has two loops, a ragged N_k makes it fail)
    "WS_LOOP": lambda a: (
        a["WARP_SPECIALIZE"] and not a["IS_CAUSAL"] and a["N_K"] % a["BLOCK_N"] == 0
    ),
}


def _autotuned(warp_specialize: tuple[bool, ...]):
    return triton.autotune(
        configs=_tma_configs(warp_specialize),
        key=_KEY,
        prune_configs_by={"early_config_prune": _prune},
    )(triton.heuristics(_HEUR)(_attn_fwd_tma))


#: warp_specialize -> the autotuned kernel: False and True pin it; "auto" lets the
#: autotuner choose among both (every tile with and without).
_KERNELS = {
    False: _autotuned((False,)),
    True: _autotuned((True,)),
    "auto": _autotuned((False, True)),
}


def forward_tma(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    softmax_scale: float | None = None,
    warp_specialize: bool | str = False,
    *,
    sm_scale: float | None = None,
):
    """The FlashAttention forward with TMA descriptor loads and stores.

    Args:
        q: (B, H, N_q, d); k, v: (B, H_kv, N_k, d); fp16, bf16 or fp32, one device.
            Each must be TMA-readable: last dim contiguous, other strides and the
            address 16-byte aligned (else ValueError naming it: use the pointer path).
        causal: bottom-right aligned mask, as kernels.flash.
        softmax_scale: softmax scale, default 1 / sqrt(d) (``flash_attention``'s name;
            the old keyword ``sm_scale=`` still works, with a DeprecationWarning).
        warp_specialize: False, True (the unmasked key loop warp-specialised) or
            "auto" (the autotuner tries both).

    Returns:
        (o, lse2): o (B, H, N_q, d) in q's dtype, lse2 (B, H, N_q) float32 base-2
        log-sum-exp (-inf for a row that sees no key), as ``kernels.flash.forward_lse``.
    """
    softmax_scale = renamed_scale(softmax_scale, sm_scale, "softmax_scale")
    scale = check_inputs(q, k, v, softmax_scale, "softmax_scale")
    check_bool("causal", causal)
    return tma_lse(q, k, v, bool(causal), scale, warp_specialize)


def tma_lse(q, k, v, causal: bool, scale: float, warp_specialize: bool | str = False):
    """``forward_tma`` on inputs and a scale already checked (``flash_attention`` checks
    them once): the TMA-specific checks, then the launch."""
    if not isinstance(warp_specialize, (bool, str)) or warp_specialize not in _KERNELS:
        raise ValueError(
            f"warp_specialize must be False, True or 'auto', got {warp_specialize!r}"
        )
    if not runtime.INTERPRET:
        cap = torch.cuda.get_device_capability(q.device)
        if not tma_configs(cap, q.shape[-1], q.dtype, bool(warp_specialize), causal):
            raise ValueError(
                f"the TMA forward has no tiles for q {q.dtype} "
                f"{tuple(q.shape)} on sm_{cap[0]}{cap[1]} (it needs "
                f"sm_90-class TMA and shared memory, and fp16/bf16): "
                f"use the pointer path"
            )
    for name, t in (("q", q), ("k", k), ("v", v)):
        if (why := tma_problem(t, name)) is not None:
            raise ValueError(
                f"{why}; the TMA forward cannot read it (use the pointer "
                f"path, kernels.flash, or a contiguous copy)"
            )
    B, H, N_q, d = q.shape
    H_kv, N_k = k.shape[1], k.shape[2]
    bd = block_d(d)
    o = torch.empty((B, H, N_q, d), dtype=q.dtype, device=q.device)
    lse2 = torch.empty((B, H, N_q), dtype=torch.float32, device=q.device)
    grid = lambda META: (triton.cdiv(N_q, META["BLOCK_M"]), B * H)
    _KERNELS[warp_specialize][grid](
        _descriptor(q, bd),
        _descriptor(k, bd),
        _descriptor(v, bd),
        _descriptor(o, bd),
        v,
        lse2,
        _v_bad(v, causal),
        scale,
        *v.stride(),
        H,
        H // H_kv,
        N_q,
        N_k,
        d,
        n_bucket(N_k),
        IS_CAUSAL=bool(causal),
        BLOCK_D=bd,
        UPCAST=upcast(q.dtype, q.device),
        DOT_PRECISION=dot_precision(q.dtype),
    )
    return o, lse2


def forward(
    q,
    k,
    v,
    causal: bool = False,
    softmax_scale: float | None = None,
    path: str = DEFAULT_FORWARD_PATH,
    *,
    sm_scale: float | None = None,
):
    """``(o, lse2)`` by the named forward path (one of ``FORWARD_PATHS``); the scale is
    ``softmax_scale`` as in ``flash_attention`` (``sm_scale=`` deprecated)."""
    if path not in FORWARD_PATHS:
        raise ValueError(f"path must be one of {FORWARD_PATHS}, got {path!r}")
    softmax_scale = renamed_scale(softmax_scale, sm_scale, "softmax_scale")
    scale = check_inputs(q, k, v, softmax_scale, "softmax_scale")
    check_bool("causal", causal)
    if path == "pointer":
        from .forward import forward_lse

        return forward_lse(q, k, v, bool(causal), scale)
    return tma_lse(q, k, v, bool(causal), scale, warp_specialize=path == "tma-ws")
