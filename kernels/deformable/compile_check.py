"""The deformable kernels (MSDA and DAT, forward and backward) compiled ahead of time
for GPU targets on a CPU, at the tiles the family ships.

    python -m kernels.deformable.compile_check   # 21 compilations, sm_75/80/90

The interpreter never runs the fp16/bf16 tensor-core paths, so this is what checks them
on a CPU-only machine: every kernel at its heaviest tensor-core shape (fp16, d = 64) on
each target, and the other paths once each (fp32 dots on sm_80, the bf16 upcast on
sm_75, MSDA in float64 and above one channel block, d = 1025). One row per compilation:
kernel, target, dtype, head dim, shared memory (bytes), spill stores/loads (``ptxas
-v``, through the engine ``kernels.machine_code.compiler``), seconds. Exits 1 when a
kernel spills or exceeds its target's shared memory (``kernels.common.ARCHS``).
"""

from __future__ import annotations

import sys
import time

from kernels import runtime

runtime.compile_ahead("kernels.deformable.compile_check", __name__)

import torch  # noqa: E402
import triton  # noqa: E402
from triton._C.libtriton import native_specialize_impl  # noqa: E402
from triton.backends.compiler import BaseBackend, GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from kernels import deformable as kd  # noqa: E402
from kernels.common import ARCHS  # noqa: E402
from kernels.deformable import backward, forward, tiles  # noqa: E402
from kernels.machine_code.compiler import jit_function, ptxas_usage  # noqa: E402

PTRS = {"Value", "Out", "Loc", "Attn", "dOut", "Q", "K", "V", "Pts", "dO", "dQ"}
F32 = {"LSE2", "Delta", "dK", "dV", "dPts", "dValue", "dLoc", "dAttn"}
ACC = {"dValue", "dLoc", "dAttn"}  # MSDA's gradient buffers: fp64 for float64 inputs


def compile_one(name, dtype, cap, head_dim):
    """Compile kernel ``name`` for sm_``cap`` (an int, 80 for sm_80) and print its row;
    True when it fits the target's shared memory and spills nothing."""
    fn = jit_function(getattr(forward if name.endswith("_fwd") else backward, name))
    if name.startswith("_msda"):
        bq, warps = kd.msda_config(
            name[6:], 1 << 20, head_dim, (cap // 10, cap % 10), dtype == torch.float32
        )
        bd = tiles._msda_block_d(head_dim, (cap // 10, cap % 10))
        consts = dict(
            N_LEVELS=4, N_POINTS=4, BLOCK_Q=bq, FP64=dtype == torch.float64, BLOCK_D=bd
        )
        if name == "_msda_bwd":
            consts["D_BLOCKS"] = -(-head_dim // bd)
    else:
        kernel = {"_dat_fwd": "fwd", "_dat_bwd_dkdv": "dkdv", "_dat_bwd_dq": "dq"}[name]
        fp32_dots = tiles.dot_fp32(dtype, (cap // 10, cap % 10))
        bm, bn, warps = kd.dat_config(
            kernel, 4096, head_dim, (cap // 10, cap % 10), fp32_dots
        )
        consts = dict(ALIGN_CORNERS=True, BLOCK_M=bm, BLOCK_N=bn, DOT_FP32=fp32_dots)
    consts.setdefault("BLOCK_D", max(16, triton.next_power_of_2(head_dim)))
    # Argument types as a contiguous launch specialises them (Triton's own rule):
    # 16-byte aligned pointers, unit inner strides baked in as 1, other ints divisible
    # by 16.
    sig, attrs = {}, {}
    for i, p in enumerate(fn.params):
        n = p.name
        if p.is_constexpr:
            sig[n] = "constexpr"
            continue
        if n in PTRS:
            val = torch.empty(16, dtype=dtype)
        elif n in ACC and dtype == torch.float64:
            val = torch.empty(16, dtype=torch.float64)
        elif n in F32:
            val = torch.empty(16, dtype=torch.float32)
        elif n in ("Shapes", "Starts"):
            val = torch.empty(16, dtype=torch.int64)
        elif n in ("qk_scale", "sm_scale"):
            val = 0.125
        elif n.startswith("stride_") and (n.endswith("d") or n == "stride_pc"):
            val = 1
        else:
            val = 4096 + 32
        ty, spec = native_specialize_impl(BaseBackend, val, False, True, True)
        sig[n] = ty
        if ty == "constexpr":
            consts[n] = spec
        elif spec == "D":
            attrs[(i,)] = [["tt.divisibility", 16]]
    t0 = time.perf_counter()
    c = triton.compile(
        ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs),
        target=GPUTarget("cuda", cap, 32),
        options={"num_warps": warps, "num_stages": tiles.NUM_STAGES},
    )
    _, st, ld = ptxas_usage(c.asm["ptx"])
    print(
        f"{name} sm{cap} {str(dtype)[6:]} d{head_dim} smem {c.metadata.shared} "
        f"spill {st}/{ld} {time.perf_counter() - t0:.1f}s",
        flush=True,
    )
    return st == ld == 0 and c.metadata.shared <= ARCHS[f"sm{cap}"][1]


NAMES = ["_msda_fwd", "_msda_bwd", "_dat_fwd", "_dat_bwd_dkdv", "_dat_bwd_dq"]
# Every kernel at its heaviest tensor-core shape (fp16, d = 64) on each target; the
# other paths once each: fp32 dots (sm_80), bf16 upcast (sm_75), MSDA in float64 and
# above one channel block (the loop over blocks, d = 1025).
JOBS = [(n, torch.float16, cap, 64) for cap in (75, 80, 90) for n in NAMES]
JOBS += [(n, torch.float32, 80, 32) for n in ("_msda_fwd", "_dat_fwd")]
JOBS += [(n, torch.bfloat16, 75, 32) for n in ("_msda_fwd", "_dat_fwd")]
JOBS += [("_msda_fwd", torch.float64, 90, 32), ("_msda_fwd", torch.float16, 90, 1025)]


def main() -> int:
    bad = sum(not compile_one(*job) for job in JOBS)
    print("compiled", len(JOBS))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
