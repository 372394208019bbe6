"""One kernel of the FlashAttention family compiled for one GPU target, on a CPU.

The kernel table (``KERNELS``, ``KERNEL_FNS``), the argument values of a representative
launch, ``compile_one`` (``triton.compile`` of an ``ASTSource`` with a ``GPUTarget``,
then ``ptxas`` on the PTX) and ``ptxas_usage`` (registers and spills from ptxas's
report). :mod:`kernels.machine_code.compile_check` runs the matrix of shipped configs
through it. Sets ``TRITON_INTERPRET=0`` before importing :mod:`kernels`.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import re
import subprocess
import tempfile
import time

# before kernels is imported: compile, do not interpret
os.environ["TRITON_INTERPRET"] = "0"

import torch  # noqa: E402
import triton  # noqa: E402
from triton._C.libtriton import native_specialize_impl  # noqa: E402
from triton.backends.compiler import BaseBackend, GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from kernels import common  # noqa: E402
from kernels.flash import backward, backward_fused, forward, forward_tma, tiles  # noqa: E402

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
KERNEL_FNS = {
    "fwd": "_attn_fwd",
    "preprocess": "_attn_bwd_preprocess",
    "dkdv": "_attn_bwd_dkdv",
    "dq": "_attn_bwd_dq",
    "dkdv-shield": "_attn_bwd_dkdv",
    "dq-shield": "_attn_bwd_dq",
    "bwd-fused": "_attn_bwd_fused",
    "fwd-tma": "_attn_fwd_tma",
    "fwd-tma-ws": "_attn_fwd_tma",
}
HEAD_DIMS = (64, 80, 128, 256)  # 80: the padded, masked head-dim path (BLOCK_D = 128)
DTYPES = common.FLOAT_DTYPES  # fp16, bf16, fp32
DTYPE_NAMES = {dt: name for name, dt in common.DTYPE_NAMES.items()}  # dtype -> "fp16"
PTXAS = pathlib.Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"


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


def _jit_function(kernel) -> triton.runtime.JITFunction:
    """Unwrap @autotune / @heuristics down to the @jit function."""
    while not isinstance(kernel, triton.runtime.JITFunction):
        kernel = kernel.fn
    return kernel


def _launch_values(
    kernel: str,
    dtype,
    head_dim: int,
    n_ctx: int,
    causal: bool,
    config: tuple[int, int, int, int],
) -> dict:
    """Argument values of a representative launch, keyed by parameter name."""
    H = 16  # heads; the batch size only enters through stride_qz
    bd = tiles.block_d(head_dim)
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
        "N_CTX_Q": n_ctx,
        "N_CTX_K": n_ctx,
        "HEAD_DIM": head_dim,
        "IS_CAUSAL": causal,
        "BLOCK_D": bd,
        "UPCAST": False,
        "DOT_PRECISION": "ieee" if dtype == torch.float32 else "tf32",
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


def _compile_values(
    fn, values: dict, cap: tuple[int, int], num_warps: int, num_stages: int
):
    """``triton.compile`` of jit function ``fn`` with argument ``values`` keyed by
    name."""
    signature, constexprs, attrs = {}, {}, {}
    for i, p in enumerate(fn.params):  # specialised as a launch does
        val = values[p.name]
        if p.is_constexpr:
            signature[p.name], constexprs[p.name] = "constexpr", val
            continue
        ty, spec = native_specialize_impl(BaseBackend, val, False, True, True)
        signature[p.name] = ty
        if ty == "constexpr":  # integers equal to 1 are baked in
            constexprs[p.name] = spec
        elif spec == "D":
            attrs[(i,)] = [["tt.divisibility", 16]]
    return triton.compile(
        ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs),
        target=GPUTarget("cuda", cap[0] * 10 + cap[1], 32),
        options={"num_warps": num_warps, "num_stages": num_stages},
    )


def _compile(
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
    cap = tiles.ARCHS[target][0]
    module = {"fwd": forward, "bwd-fused": backward_fused}.get(kernel) or (
        forward_tma if kernel in TMA_KERNELS else backward
    )
    fn = _jit_function(getattr(module, KERNEL_FNS[kernel]))
    values = _launch_values(kernel, dtype, head_dim, n_ctx, causal, config)
    values["UPCAST"] = dtype == torch.bfloat16 and cap < (8, 0)
    if kernel == "bwd-fused":
        values["DQ"] = torch.empty(16, dtype=torch.float32)  # the fp32 dQ accumulator
    return _compile_values(fn, values, cap, config[2], config[3])


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
    limit = tiles.ARCHS[target][1]
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
        compiled = _compile(kernel, target, head_dim, dtype, causal, config, n_ctx)
        ptx = compiled.asm["ptx"]
        res.shared = int(compiled.metadata.shared)
        res.registers, res.spill_stores, res.spill_loads = ptxas_usage(ptx)
        res.wgmma = (
            "wgmma" in ptx if target == "sm90" and kernel != "preprocess" else None
        )
    except Exception as e:  # noqa: BLE001 - any compile failure is a reported result
        first = str(e).strip().splitlines()[0] if str(e) else ""
        res.error = f"{type(e).__name__}: {first}"
    res.seconds = time.perf_counter() - t0
    return res


def ptxas_usage(ptx: str) -> tuple[int, int, int]:
    """(registers, spill store bytes, spill load bytes) from ``ptxas -v`` on ``ptx``."""
    arch = re.search(r"^\.target\s+(\w+)", ptx, re.M).group(1)
    with tempfile.TemporaryDirectory() as d:
        src = pathlib.Path(d) / "k.ptx"
        src.write_text(ptx)
        # the flags Triton's own ptxas call uses
        # (backends/nvidia/compiler.py: make_cubin)
        out = subprocess.run(
            [
                str(PTXAS),
                "-lineinfo",
                "-v",
                "--regAllocOptLevel=2",
                f"--gpu-name={arch}",
                str(src),
                "-o",
                str(src) + ".o",
            ],
            capture_output=True,
            text=True,
            check=True,
        )
    log = out.stdout + out.stderr
    regs = int(re.search(r"Used (\d+) registers", log).group(1))
    spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    return regs, int(spill.group(1)), int(spill.group(2))
