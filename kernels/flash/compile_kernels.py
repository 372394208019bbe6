"""One FlashAttention kernel compiled ahead of time for one GPU target, on a CPU: the
kernel table (``KERNELS``: name -> the @triton.jit function in ``KERNEL_FNS``), the
argument values of a representative launch (``launch_values``), ``compile_kernel``
(through the engine's ``kernels.machine_code.compiler.compile_values``) and
``compile_one`` (shared memory, registers and spills of one config, a ``Result``).
:mod:`kernels.flash.compile_check` runs the matrix of shipped configs through it, and
:mod:`kernels.flash.compile_check_fused` the fused backward. Import it with
``TRITON_INTERPRET=0`` (``runtime.compile_ahead`` does this for the checks): under the
interpreter the kernels are not compilable objects.
"""

from __future__ import annotations

import dataclasses
import time

import torch

from kernels.common import ARCHS, FLOAT_DTYPES, block_d, dot_precision, upcast_on
from kernels.flash import backward, backward_fused, forward, forward_tma, tiles
from kernels.machine_code.compiler import (
    DTYPE_NAMES,
    compile_values,
    error_text,
    jit_function,
    ptxas_usage,
)

#: fwd-tma / fwd-tma-ws: kernels.flash.forward_tma's forward (TMA descriptors; the
#: second with its key loop warp-specialised), shipped for sm_90 only.
#: dkdv-shield / dq-shield: the causal backward's second launch (SHIELD=True), which
#: recomputes the gradients only when an input holds NaN/inf. bwd-fused:
#: kernels.flash.backward_fused (flash_attention(..., deterministic=False)).
KERNELS = (
    "fwd",
    "preprocess",
    "dkdv",
    "dq",
    "dkdv-shield",
    "dq-shield",
    "bwd-fused",
    "fwd-tma",
    "fwd-tma-ws",
)
TMA_KERNELS = ("fwd-tma", "fwd-tma-ws")
#: the @triton.jit function (under its autotuner) each kernel name compiles
KERNEL_FNS = {
    "fwd": forward._attn_fwd,
    "preprocess": backward._attn_bwd_preprocess,
    "dkdv": backward._attn_bwd_dkdv,
    "dq": backward._attn_bwd_dq,
    "dkdv-shield": backward._attn_bwd_dkdv,
    "dq-shield": backward._attn_bwd_dq,
    "bwd-fused": backward_fused._attn_bwd_fused,
    "fwd-tma": forward_tma._attn_fwd_tma,
    "fwd-tma-ws": forward_tma._attn_fwd_tma,
}
HEAD_DIMS = (64, 80, 128, 256)  # 80: the padded, masked head-dim path (BLOCK_D = 128)
DTYPES = FLOAT_DTYPES  # fp16, bf16, fp32


@dataclasses.dataclass
class Result:
    kernel: str
    target: str
    head_dim: int
    dtype: str
    causal: bool
    config: tuple[int, int, int, int]  # (BLOCK_M, BLOCK_N, num_warps, num_stages)
    n_ctx: int = 4096
    shared: int | None = None
    shared_limit: int = 0
    registers: int | None = None
    spill_stores: int | None = None
    spill_loads: int | None = None
    wgmma: bool | None = None
    seconds: float = 0.0
    error: str | None = None

    @property
    def ok(self) -> bool:
        # the shield launches (NaN/inf inputs only) may spill: reported, not refused
        return (
            self.error is None
            and self.shared is not None
            and self.shared <= self.shared_limit
            and (
                self.kernel.endswith("-shield")
                or not (self.spill_stores or self.spill_loads)
            )
        )


def launch_values(
    kernel: str,
    dtype,
    head_dim: int,
    n_ctx: int,
    causal: bool,
    config: tuple[int, int, int, int],
) -> dict:
    """Argument values of a representative launch, keyed by parameter name."""
    H = 16  # heads; the batch size only enters through stride_qz
    bd = block_d(head_dim)
    # only its dtype and (16-byte aligned) address matter
    t = torch.empty(16, dtype=dtype)
    lse = torch.empty(16, dtype=torch.float32)
    # contiguous (B, H, N, d)
    strides = (H * n_ctx * head_dim, n_ctx * head_dim, head_dim, 1)
    bm, bn = config[0], config[1]
    values = {
        "sm_scale": 0.125,
        "H": H,
        "H_KV": H,
        "GROUP": 1,
        "N_Q": n_ctx,
        "N_K": n_ctx,
        "HEAD_DIM": head_dim,
        "IS_CAUSAL": causal,
        "BLOCK_D": bd,
        "UPCAST": False,
        "DOT_PRECISION": dot_precision(dtype),
        "BLOCK_M": bm,
        "BLOCK_N": bn,
        "EVEN_M": n_ctx % bm == 0,
        "EVEN_N": n_ctx % bn == 0,
        "EVEN_D": head_dim == bd,
        "N_BUCKET": tiles.n_bucket(n_ctx),
        "NEG_SCALE": False,
        "SHIELD": kernel.endswith("-shield"),
    }
    for name in ("Q", "K", "V", "Out", "O", "DO", "DQ", "DK", "DV"):
        values[name] = t
    values["LSE2"] = values["Delta"] = lse
    values["V_BAD"] = values["BAD"] = torch.zeros(1, dtype=torch.int32)
    for prefix in ("q", "k", "v", "o", "do", "dq", "dk"):
        row = "m" if prefix in ("q", "o", "do", "dq") else "n"
        for suffix, s in zip(("z", "h", row, "d"), strides):
            values[f"stride_{prefix}{suffix}"] = s
    if kernel in TMA_KERNELS:  # host-side descriptors: dtype and block shape matter
        from triton.tools.tensor_descriptor import TensorDescriptor

        for name, rows in (
            ("desc_q", bm),
            ("desc_o", bm),
            ("desc_k", bn),
            ("desc_v", bn),
        ):
            values[name] = TensorDescriptor(
                t, [1, H, n_ctx, head_dim], list(strides), [1, 1, rows, bd]
            )
        values["WARP_SPECIALIZE"] = ws = kernel == "fwd-tma-ws"
        values["WS_LOOP"] = ws and not causal and n_ctx % bn == 0
    return values


def compile_kernel(
    kernel: str,
    target: str,
    head_dim: int,
    dtype,
    causal: bool,
    config: tuple[int, int, int, int],
    n_ctx: int,
):
    """``triton.compile`` of one kernel/config for one target, as a launch would
    specialise."""
    cap = ARCHS[target][0]
    fn = jit_function(KERNEL_FNS[kernel])
    values = launch_values(kernel, dtype, head_dim, n_ctx, causal, config)
    values["UPCAST"] = upcast_on(dtype, cap)
    if kernel == "bwd-fused":
        values["DQ"] = torch.empty(16, dtype=torch.float32)  # the fp32 dQ accumulator
    return compile_values(fn, values, cap, config[2], config[3])


def compile_one(
    kernel: str,
    target: str,
    head_dim: int,
    dtype,
    causal: bool,
    config: tuple[int, int, int, int],
    n_ctx: int = 4096,
) -> Result:
    """Compile one kernel/config for one target; measure shared memory, registers,
    spills."""
    limit = ARCHS[target][1]
    res = Result(
        kernel,
        target,
        head_dim,
        DTYPE_NAMES[dtype],
        causal,
        config,
        n_ctx,
        shared_limit=limit,
    )
    t0 = time.perf_counter()
    try:
        compiled = compile_kernel(
            kernel, target, head_dim, dtype, causal, config, n_ctx
        )
        ptx = compiled.asm["ptx"]
        res.shared = int(compiled.metadata.shared)
        res.registers, res.spill_stores, res.spill_loads = ptxas_usage(ptx)
        res.wgmma = (
            "wgmma" in ptx if target == "sm90" and kernel != "preprocess" else None
        )
    except Exception as e:  # noqa: BLE001 - any compile failure is a reported result
        res.error = error_text(e)
    res.seconds = time.perf_counter() - t0
    return res
