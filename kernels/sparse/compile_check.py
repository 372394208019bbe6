"""Compile the kernels.sparse kernels ahead of time for sm_75, sm_80, sm_89 and sm_90
on a CPU, at their shipped tiles, and check shared memory and register spills.

    python -m kernels.sparse.compile_check           # every target, kernel,
                                                     # case, head dim, dtype, group
    python -m kernels.sparse.compile_check --quick   # the test's subset
    python -m kernels.sparse.compile_check --report  # hot-loop SASS counts
                                                     # (sm90, sm80) -> benchmarks/

Kernels ``fwd`` (``forward._sparse_fwd``) and ``bwd`` (``backward._sparse_bwd``);
cases ``blocks64`` (block_size = 64, MoBA/NSA) and ``tokens`` (block_size = 1, DSA:
Triton bakes an integer argument equal to 1 into the code, so it is its own
compilation); head dims 64, 128, 256 (d = d_v); dtypes fp16 (tensor cores; FMA on
sm_75) and fp32 (FMA); GQA groups of 16 and 64 query heads per KV head (BLOCK_M 16
and 64; CUDA-core dots hold 16 rows). The argument signature is Triton's own
specialisation of a representative launch: contiguous (B, H_q, N = 65536, d) q, one
KV head, (B, 1, N, 16) int32 indices, causal. Exits 1 if a case spills, exceeds
shared memory or fails to compile. Runs with TRITON_INTERPRET unset.

``--report`` writes ``benchmarks/static/sparse-sm90.json`` and ``sparse-sm80.json``:
the forward (bf16, d = 128, group 16, blocks of 64, the shipped tile) with its
registers, spills, shared memory and the SASS counts per iteration of its key loop
(``sass.report``'s ``hot_loop``), and the K/V bytes that loop gathers per iteration.
"""

from __future__ import annotations

import sys

from kernels import runtime

runtime.compile_ahead("kernels.sparse.compile_check", __name__)

import torch  # noqa: E402

from kernels.common import dot_precision  # noqa: E402
from kernels.machine_code.compiler import (  # noqa: E402
    cells,
    check_args,
    compile_values,
    jit_function,
    measure,
    report_header,
    run_jobs,
    write_reports,
)
from kernels.sparse import backward, forward, tiles  # noqa: E402

N, S = 65536, 16
TARGETS = ("sm75", "sm80", "sm89", "sm90")
KERNELS = {"fwd": forward._sparse_fwd, "bwd": backward._sparse_bwd}
CASES = {"blocks64": 64, "tokens": 1}
HEAD_DIMS = (64, 128, 256)
DTYPES = {"fp16": torch.float16, "fp32": torch.float32, "bf16": torch.bfloat16}
GROUPS = (16, 64)
#: the test's subset: both kernels and cases, every target once
QUICK = (
    ("fwd", "blocks64", "sm90", 128, "fp16", 16),
    ("bwd", "blocks64", "sm80", 128, "fp16", 16),
    ("fwd", "tokens", "sm89", 64, "fp16", 64),
    ("bwd", "tokens", "sm75", 64, "fp16", 16),
)


def _values(kernel, case, d, dtype, group, tile):
    bm, _, bn = tile[:3]
    prec = tile[6]
    bd = tiles.block_d(d)
    t = torch.empty(16, dtype=dtype)
    f32 = torch.empty(16, dtype=torch.float32)
    i32 = torch.empty(16, dtype=torch.int32)
    h = group
    vals = {
        "Q": t,
        "K": t,
        "V": t,
        "IDX": i32,
        "O": t,
        "LSE2": f32,
        "DO": t,
        "Delta": f32,
        "DQ": t,
        "DK": f32,
        "DV": f32,
        "sm_scale": 0.088,
        "H_KV": 2,
        "N_Q": N,
        "N_K": N,
        "GROUP": group,
        "M_BLOCKS": -(-group // bm),
        "n_keys": S * CASES[case],
        "block_size": CASES[case],
        "HEAD_DIM": d,
        "HEAD_DIM_V": d,
        "IS_CAUSAL": True,
        "CONTIG": CASES[case] % bn == 0,
        "UPCAST": tile[5],
        "DOT_PRECISION": prec,
        "BLOCK_M": bm,
        "BLOCK_N": bn,
        "BLOCK_D": bd,
        "BLOCK_DV": bd,
    }
    for pfx, heads in (("q", h), ("k", 1), ("v", 1), ("o", h), ("do", h)):
        row = "n" if pfx in ("k", "v") else "m"
        for suf, st in zip(("b", "h", row, "d"), (heads * N * d, N * d, d, 1)):
            vals[f"stride_{pfx}{suf}"] = st
    for suf, st in zip(("b", "h", "m", "s"), (N * S, N * S, S, 1)):
        vals[f"stride_i{suf}"] = st
    for suf, st in zip(("b", "h", "m"), (h * N, N, 1)):
        vals[f"stride_l{suf}"] = st
    return vals


def shipped(kernel, target, d, dtype, group):
    """The launch tile (BLOCK_M, M_BLOCKS, BLOCK_N, warps, stages, UPCAST, precision)
    ``kernels.sparse`` ships for this target, as ``tiles.Plan`` picks it."""
    cap = tiles.ARCHS[target][0]
    bm = tiles.block_m(group, cap, dtype, kernel, tiles.block_d(d))
    bn, w, s = tiles.tiles(kernel, cap, tiles.block_d(d), dtype, bm)
    prec = dot_precision(dtype)
    up = tiles.upcast_tiles(cap, dtype)
    return (bm, -(-group // bm), bn, w, s, up, prec)


def compile_case(kernel, case, target, d, dtype_name, group):
    """One compilation: a result dict (shared, registers, spills, ok); the compiled
    kernel under ``compiled``."""
    dtype = DTYPES[dtype_name]
    cap = tiles.ARCHS[target][0]
    tile = shipped(kernel, target, d, dtype, group)
    res = {
        "kernel": kernel,
        "case": case,
        "target": target,
        "head_dim": d,
        "dtype": dtype_name,
        "group": group,
        "tile": tile[:5],
        "limit": tiles.ARCHS[target][1],
    }
    return measure(
        res,
        lambda: compile_values(
            jit_function(KERNELS[kernel]),
            _values(kernel, case, d, dtype, group, tile),
            cap,
            tile[3],
            tile[4],
        ),
    )


HEADER = (
    f"{'kern':<4} {'case':<8} {'arch':<5} {'d':>3} {'type':<4} {'G':>3} "
    f"{'BMxBN w s':<12} {'smem KB/lim':>11} {'regs':>4} {'spills':>6} {'wgmma':>5} "
    f"{'time':>6} status"
)


def format_row(r) -> str:
    bm, _, bn, w, s = r["tile"]
    shared, status, wg = cells(r)
    return (
        f"{r['kernel']:<4} {r['case']:<8} {r['target']:<5} {r['head_dim']:>3} "
        f"{r['dtype']:<4} {r['group']:>3} {f'{bm}x{bn} w{w} s{s}':<12} {shared:>11} "
        f"{r.get('registers', '-'):>4} {r.get('spills', '-'):>6} {wg:>5} "
        f"{r['seconds']:5.1f}s {status}"
    )


def plan(quick: bool, targets=None, kernels=None):
    if quick:
        return [c for c in QUICK if not targets or c[2] in targets]
    return [
        (k, case, t, d, dt, g)
        for t in targets or TARGETS
        for k in kernels or KERNELS
        for case in CASES
        for d in HEAD_DIMS
        for dt in ("fp16", "fp32")
        for g in GROUPS
        # CUDA-core dots hold 16 rows: group 64 is 4 programs of group 16's tile
        if not (g == 64 and (dt == "fp32" or t == "sm75"))
        # the sm_75 backward above d = 128 is not shipped (refused by the call)
        and tiles.supported(k, tiles.ARCHS[t][0], tiles.block_d(d))
    ]


def machine_code_report(target: str) -> dict:
    """The forward's hot-loop SASS counts on ``target`` (bf16, d = 128, group 16,
    blocks of 64), with registers, spills, shared memory and the K/V bytes its loop
    gathers per iteration (counted from the tile, not measured)."""
    from kernels.machine_code import sass

    r = compile_case("fwd", "blocks64", target, 128, "bf16", 16)
    if not r["ok"]:
        raise RuntimeError(f"the report's case did not compile cleanly: {r}")
    rep = sass.report(r["compiled"].asm["cubin"])
    bm, _, bn, w, s = r["tile"]
    row = {
        "kernel": "sparse-fwd",
        "case": "blocks64",
        "head_dim": 128,
        "dtype": "bf16",
        "group": 16,
        "causal": True,
        "config": {"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": w, "num_stages": s},
        "registers": r["registers"],
        "spill_bytes": r["spills"],
        "shared_bytes": r["shared"],
        **rep,
        "kv_bytes_per_iteration": 2 * bn * 128 * 2,
    }
    note = (
        "instruction counts of the compiled machine code, not time; hot_loop: "
        "one iteration of the key loop (BLOCK_N gathered keys)"
    )
    return {
        **report_header(target, "kernels.sparse.compile_check", note),
        "kernels": [row],
    }


def _describe(target, r) -> str:
    return (
        f"{target} {r['kernel']} regs {r['registers']} spills "
        f"{r['spill_bytes']} hot loop {r['hot_loop']}"
    )


def main(argv=None) -> int:
    args = check_args(argv, __doc__, TARGETS, KERNELS)
    if runtime.INTERPRET:
        print("sparse_check needs TRITON_INTERPRET unset", file=sys.stderr)
        return 2
    if args.report:
        return write_reports("sparse", args.target, machine_code_report, _describe)
    jobs = plan(args.quick, args.target, args.kernel)
    return run_jobs(jobs, HEADER, compile_case, format_row)


if __name__ == "__main__":
    sys.exit(main())
