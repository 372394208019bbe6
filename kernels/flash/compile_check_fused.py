"""Compile the fused backward (:mod:`kernels.flash.backward_fused`) ahead of time.

    python -m kernels.flash.compile_check_fused
        # sm_90 and sm_80, every shipped config, d 64/128, fp16/bf16/fp32, causal or not
    python -m kernels.flash.compile_check_fused --target sm90 --head-dim 128 \
        --dtype bf16

No GPU needed. Uses :mod:`kernels.flash.compile_kernels` (the launch specialisation),
the engine's ``ptxas -v`` reading and :mod:`kernels.machine_code.sass` (``nvdisasm``).
Per case it prints shared memory against the target's limit, registers, spill bytes,
whether sm_90 lowers the matmuls to ``wgmma`` (and the wgmma N sizes in the PTX), and
what the dQ atomics became in SASS: the ``RED``/``ATOM`` opcodes, how many sit in loops,
and whether any ``MEMBAR`` does (relaxed atomics need none). Each case compiles at N =
4096 (aligned: no masks) unless ``--n`` says otherwise. Exits 1 if a case spills,
exceeds shared memory or fails.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time

from kernels import runtime

runtime.compile_ahead("kernels.flash.compile_check_fused", __name__)

import torch  # noqa: E402

from kernels.flash import backward_fused as fused  # noqa: E402
from kernels.flash import compile_kernels as cc  # noqa: E402
from kernels.machine_code import sass  # noqa: E402
from kernels.machine_code.compiler import ptxas_usage  # noqa: E402

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def compile_fused(
    target: str, head_dim: int, dtype, causal: bool, config, n_ctx: int = 4096
):
    """``triton.compile`` of ``_attn_bwd_fused`` for ``target`` as a launch on
    contiguous (B, 16, n_ctx, head_dim) tensors would specialise it (compile_check's
    "bwd-fused" kernel)."""
    return cc.compile_kernel(
        "bwd-fused", target, head_dim, dtype, causal, config, n_ctx
    )


def atomics_report(cubin: bytes) -> dict:
    """The dQ atomics in SASS: opcodes, how many inside loops, fences anywhere."""
    instrs, labels = sass.disassemble(cubin)
    loop_idx = set()
    for a, b in sass.loops(instrs, labels):
        loop_idx.update(range(a, b + 1))
    atom = [
        (i, ins)
        for i, ins in enumerate(instrs)
        if ins.base in ("RED", "ATOM", "ATOMG", "REDG")
    ]
    membar = [ins.opcode for ins in instrs if ins.base == "MEMBAR"]
    hot = sass.report(cubin)
    return {
        "atomic_opcodes": sorted({ins.opcode for _, ins in atom}),
        "atomics": len(atom),
        "atomics_in_loops": sum(1 for i, _ in atom if i in loop_idx),
        "membar": sorted(set(membar)),
        "membar_gpu_in_hot_loop": hot["membar_gpu_in_loop"],
        "hot_loop": hot["hot_loop"],
    }


def check(target, head_dim, dtype_name, causal, config, n_ctx=4096) -> dict:
    dtype = DTYPES[dtype_name]
    row = {
        "target": target,
        "head_dim": head_dim,
        "dtype": dtype_name,
        "causal": causal,
        "config": list(config),
        "n_ctx": n_ctx,
        "shared_limit": fused.ARCHS[target][1],
    }
    t0 = time.perf_counter()
    try:
        c = compile_fused(target, head_dim, dtype, causal, config, n_ctx)
        ptx = c.asm["ptx"]
        row["shared"] = int(c.metadata.shared)
        row["registers"], row["spill_stores"], row["spill_loads"] = ptxas_usage(ptx)
        row["wgmma"] = "wgmma" in ptx if target == "sm90" else None
        row["wgmma_n"] = sorted(
            {
                int(n)
                for n in re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n(\d+)k", ptx)
            }
        )
        row["ptx_red"] = sorted(set(re.findall(r"\b(red\.[\w.]+|atom\.[\w.]+)", ptx)))
        row.update(atomics_report(c.asm["cubin"]))
    except Exception as e:  # noqa: BLE001 - a failed compile is a reported result
        row["error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0]}"
    row["seconds"] = round(time.perf_counter() - t0, 1)
    row["ok"] = (
        "error" not in row
        and row["shared"] <= row["shared_limit"]
        and not row["spill_stores"]
        and not row["spill_loads"]
    )
    return row


def format_row(r: dict) -> str:
    cfg = "x".join(map(str, r["config"][:2])) + f" w{r['config'][2]} s{r['config'][3]}"
    if "error" in r:
        return (
            f"{r['target']} d={r['head_dim']} {r['dtype']} "
            f"{'causal' if r['causal'] else 'full'} {cfg}: {r['error']}"
        )
    hl = r["hot_loop"] or {}
    return (
        f"{r['target']:<5} {r['head_dim']:>4} {r['dtype']:<4} "
        f"{'causal' if r['causal'] else 'full':<6} {r['n_ctx']:>5} {cfg:<15} "
        f"smem {r['shared'] / 1024:6.1f}/{r['shared_limit'] // 1024} "
        f"regs {r['registers']:>3} spill {r['spill_stores']}/{r['spill_loads']} "
        f"wgmma {r['wgmma']} n{r['wgmma_n']} "
        f"red {r['atomic_opcodes']} x{r['atomics']} "
        f"(loops {r['atomics_in_loops']}) membar {r['membar']} "
        f"hot-loop instr {hl.get('instructions')} mma {hl.get('tensor_core')} "
        f"{r['seconds']}s {'ok' if r['ok'] else 'FAIL'}"
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", action="append", choices=list(fused.ARCHS))
    ap.add_argument("--head-dim", type=int, action="append")
    ap.add_argument("--dtype", action="append", choices=list(DTYPES))
    ap.add_argument("--causal", choices=["yes", "no"], action="append")
    ap.add_argument("--n", type=int, action="append")
    ap.add_argument("--config", help="BMxBNxWxS instead of the shipped configs")
    ap.add_argument("--json", help="write the rows to this file")
    args = ap.parse_args(argv)
    if runtime.INTERPRET:
        print("needs TRITON_INTERPRET unset", file=sys.stderr)
        return 2
    rows = []
    for t in args.target or ["sm90", "sm80"]:
        for d in args.head_dim or [64, 128]:
            for dn in args.dtype or ["fp16", "bf16", "fp32"]:
                for c in args.causal or ["no", "yes"]:
                    cfgs = (
                        [tuple(int(x) for x in args.config.split("x"))]
                        if args.config
                        else fused.configs(fused.ARCHS[t][0], d, DTYPES[dn])
                    )
                    for cfg in cfgs:
                        for n in args.n or [4096]:
                            r = check(t, d, dn, c == "yes", cfg, n)
                            rows.append(r)
                            print(format_row(r), flush=True)
    bad = [r for r in rows if not r["ok"]]
    print(f"# {len(rows) - len(bad)}/{len(rows)} ok")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
