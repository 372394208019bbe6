"""Compile every shipped FlashAttention config for sm_75, sm_80, sm_89 and sm_90
on a CPU.

    python -m kernels.machine_code.compile_check          # every kernel, config,
                                                          # head dim, dtype, causal flag
    python -m kernels.machine_code.compile_check --quick  # the recorded peaks
                                                          # (make test)

`make compile-check` runs the full matrix (about 1,400 compilations, 30-45 minutes on
one core with an empty Triton cache) and records in
``kernels/machine_code/compile_peaks.json`` the cases with the most registers and the
most shared memory per kernel, target and dot path; run it whenever a tile table in
``kernels/flash/tiles.py`` changes. ``make test`` runs ``--quick``: exactly those
recorded cases (about 40 compilations, a minute cold on 2 cores).

On sm_90 the matrix also compiles kernels.flash.forward_tma's forward: ``fwd-tma`` (TMA
descriptor loads and stores) and ``fwd-tma-ws`` (the same with its key loop
warp-specialised), every tile ``forward_tma.tma_configs`` ships (``--kernel fwd-tma
--kernel fwd-tma-ws --target sm90``: 112 compilations, about 4 minutes).

Triton compiles ahead of time for a GPU it does not have:
``triton.compile(ASTSource(fn, signature, constexprs, attrs),
target=GPUTarget("cuda", cap, 32))``
lowers a kernel to PTX and, with the bundled ``ptxas``, to a cubin. For each kernel
(``_attn_fwd``, ``_attn_bwd_preprocess``, ``_attn_bwd_dkdv``, ``_attn_bwd_dq``), target,
head dim (64, 80 = the padded and masked path, 128, 256; d = 16 and 32 ship the same
tiles as d = 64 on a narrower BLOCK_D), dtype (fp16, bf16, fp32), causal flag and
shipped tile config this reports

* shared memory per block (``compiled.metadata.shared``) against the target's limit
  (``kernels.flash.tiles.ARCHS``: 64 KB on sm_75, 163 KB on sm_80, 99 KB on sm_86/89,
  227 KB on sm_90: the opt-in maximum per block of the CUDA programming guide);
* registers per thread and spill stores/loads, from ``ptxas -v`` on the kernel's PTX
  with the flags Triton itself uses;
* on sm_90, whether the matmuls were lowered to Hopper ``wgmma`` instructions.

The argument signature (pointer dtypes, which integers are divisible by 16, which
equal 1) is derived with Triton's own specialisation rule from a representative launch
on contiguous (B, H=16, N, d) tensors. The full run compiles each config twice:
N = 4096 (the aligned fast path, EVEN_M and EVEN_N: no masks) and N = 4000 (the ragged
variant, whose masks cost registers); ``--quick`` compiles the recorded peaks.

Exits 1 if any config exceeds its target's shared memory, spills, or fails to compile
(the causal backward's shield launches, which run only when an input holds NaN/inf,
may spill: their spills are reported, not refused).
Runs with ``TRITON_INTERPRET`` unset: ``runtime.compile_ahead`` sets the variable to 0
and starts the check again when :mod:`kernels` was imported under the interpreter
(under the interpreter the kernels are not compilable objects).
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

from kernels import runtime

runtime.compile_ahead("kernels.machine_code.compile_check", __name__)

import torch  # noqa: E402
import triton  # noqa: E402

from kernels.flash import backward, backward_fused, forward_tma, tiles  # noqa: E402
from kernels.machine_code.compiler import (  # noqa: E402, F401  (re-exported)
    DTYPE_NAMES,
    DTYPES,
    HEAD_DIMS,
    KERNEL_FNS,
    KERNELS,
    PTXAS,
    STATIC_DIR,
    TMA_KERNELS,
    Result,
    _compile,
    _compile_values,
    _jit_function,
    _launch_values,
    compile_one,
    ptxas_usage,
    report_header,
)


def shipped(
    kernel: str, target: str, head_dim: int, dtype, causal: bool = False
) -> list[tuple[int, int, int, int]]:
    """The configs kernels.flash (its forward_tma) launches for this kernel/target/
    head dim/dtype (and causal flag: the TMA forward's tiles depend on it)."""
    if kernel == "preprocess":
        return [
            (
                backward.preprocess_block_m(head_dim),
                tiles.block_d(head_dim),
                backward.PREPROCESS_NUM_WARPS,
                1,
            )
        ]
    if kernel == "bwd-fused":
        return backward_fused.configs(tiles.ARCHS[target][0], head_dim, dtype)
    if kernel in TMA_KERNELS:  # TMA needs Hopper: sm_90 only
        return (
            forward_tma.tma_configs(
                tiles.ARCHS[target][0], head_dim, dtype, kernel == "fwd-tma-ws", causal
            )
            if target == "sm90"
            else []
        )
    return tiles.configs(kernel, tiles.ARCHS[target][0], head_dim, dtype)


#: The configs with the most registers and the most shared memory, per kernel, target
#: and dot path (tensor cores, or CUDA-core FMA for fp32 and sm_75), as measured by the
#: last full run (``make compile-check`` rewrites it). ``--quick`` compiles exactly
#: these.
PEAKS_FILE = pathlib.Path(__file__).with_name("compile_peaks.json")
_NAME_DTYPES = {v: k for k, v in DTYPE_NAMES.items()}


def _dot_path(target: str, dtype: str) -> str:
    return "fma" if target == "sm75" or dtype == "fp32" else "tensor-core"


def peaks(results: list[Result]) -> list[dict]:
    """The heaviest compiled case per (kernel, target, dot path): the one with the most
    registers (ties: more shared memory) and the one with the most shared memory (ties:
    more registers)."""
    groups: dict[tuple, list[Result]] = {}
    for r in results:
        if r.ok:
            key = (r.kernel, r.target, _dot_path(r.target, r.dtype))
            groups.setdefault(key, []).append(r)
    out = []
    for (kernel, target, path), rs in sorted(groups.items()):
        by_regs = max(rs, key=lambda r: (r.registers, r.shared))
        by_smem = max(rs, key=lambda r: (r.shared, r.registers))
        for why, r in (("registers", by_regs), ("shared", by_smem)):
            case = {
                "kernel": kernel,
                "target": target,
                "dot": path,
                "head_dim": r.head_dim,
                "dtype": r.dtype,
                "causal": r.causal,
                "config": list(r.config),
                "n_ctx": r.n_ctx,
                "registers": r.registers,
                "shared": r.shared,
                "peak": why,
            }
            if by_regs is by_smem and why == "shared":
                out[-1]["peak"] = "registers+shared"
                continue
            out.append(case)
    return out


def _recorded_peaks(targets, kernels) -> list[tuple] | None:
    """``--quick``'s jobs from PEAKS_FILE (None when there is none). A recorded config
    that is no longer shipped is replaced by every config shipped for that case."""
    if not PEAKS_FILE.exists():
        return None
    import json

    jobs = []
    for c in json.loads(PEAKS_FILE.read_text())["peaks"]:
        if c["target"] not in targets or c["kernel"] not in kernels:
            continue
        dt = _NAME_DTYPES[c["dtype"]]
        now = shipped(c["kernel"], c["target"], c["head_dim"], dt, c["causal"])
        cfgs = [tuple(c["config"])] if tuple(c["config"]) in now else now
        if tuple(c["config"]) not in now:
            print(
                f"# {PEAKS_FILE.name} is stale for {c['kernel']} {c['target']} "
                f"d={c['head_dim']}: run make compile-check",
                flush=True,
            )
        for cfg in cfgs:
            job = (
                c["kernel"],
                c["target"],
                c["head_dim"],
                dt,
                c["causal"],
                cfg,
                c["n_ctx"],
            )
            if job not in jobs:
                jobs.append(job)
    return jobs


def plan(quick: bool, targets=None, kernels=None) -> list[tuple]:
    """Every (kernel, target, head_dim, dtype, causal, config, n_ctx) to compile."""
    targets = targets or list(tiles.ARCHS)
    kernels = kernels or list(KERNELS)
    if quick:  # the recorded peaks, nothing else
        jobs = _recorded_peaks(targets, kernels)
        if jobs is None:
            raise SystemExit(f"no {PEAKS_FILE.name}: run `make compile-check` first")
        return jobs
    cases = [
        (t, d, dt, c)
        for t in targets
        for d in HEAD_DIMS
        for dt in DTYPES
        for c in (False, True)
    ]
    jobs = []
    for t, d, dt, c in cases:
        for k in kernels:
            if k.endswith("-shield") and not c:  # launched for causal only
                continue
            # no causal flag: compile once per (t, d, dtype)
            if k == "preprocess" and c:
                if any(j[:4] == (k, t, d, dt) for j in jobs):
                    continue
            for cfg in shipped(k, t, d, dt, c):
                for n_ctx in (4096, 4000):
                    jobs.append((k, t, d, dt, c, cfg, n_ctx))
    return jobs


def format_row(r: Result) -> str:
    cfg = "x".join(str(x) for x in r.config[:2]) + f" w{r.config[2]} s{r.config[3]}"
    shared = (
        "-" if r.shared is None else f"{r.shared / 1024:.1f}/{r.shared_limit // 1024}"
    )
    spills = "-" if r.spill_stores is None else f"{r.spill_stores}/{r.spill_loads}"
    wg = {True: "yes", False: "no", None: ""}[r.wgmma]
    status = "ok" if r.ok else (r.error or "FAIL")
    return (
        f"{r.kernel:<10} {r.target:<5} {r.head_dim:>4} {r.dtype:<4} "
        f"{'causal' if r.causal else 'full':<6} {r.n_ctx:>5} {cfg:<16} "
        f"{shared:>11} "
        f"{r.registers if r.registers is not None else '-':>4} {spills:>7} {wg:>5} "
        f"{r.seconds:5.1f}s {status}"
    )


HEADER = (
    f"{'kernel':<10} {'arch':<5} {'d':>4} {'type':<4} {'mask':<6} {'N':>5} "
    f"{'BMxBN warps st':<16} "
    f"{'smem KB/lim':>11} {'regs':>4} {'spill':>7} {'wgmma':>5} {'time':>6} "
    f"status"
)


#: The hot loop to beat, as recorded (not recompiled here: the tutorial is not shipped
#: with the triton wheel): the Triton fused-attention tutorial's forward
#: (python/tutorials/06-fused-attention.py), compiled the same way for sm_90 with
#: triton 3.7.1 at fp16, d = 128, 128 x 128 tiles, 8 warps, 3 stages, non-causal.
TUTORIAL_FWD_SM90 = {
    "what": "Triton fused-attention tutorial forward, fp16, d=128, 128x128, 8 warps, "
    "3 stages, non-causal, sm_90, triton 3.7.1 (recorded, not recompiled)",
    "hot_loop": {
        "instructions": 492,
        "tensor_core": 16,
        "FMUL": 66,
        "FFMA": 66,
        "MUFU.EX2": 66,
        "integer": 13,
    },
    "tma": True,
}
#: The report's shapes: bf16 at the head dims models use, long aligned sequences.
REPORT_SHAPES = {"head_dims": (64, 128), "dtype": torch.bfloat16, "n_ctx": 16384}


def machine_code_report(target: str) -> dict:
    """Hot-loop instruction counts of every shipped fwd/dkdv/dq config on ``target``,
    and on sm_90 of the TMA forward (fwd-tma) and its warp-specialised variant
    (fwd-tma-ws; ``warp_specialized`` and ``launch_warps`` say whether Triton split it
    into producer and consumer warp groups)."""
    from kernels.machine_code import sass

    rows = []
    for kernel in ("fwd", "dkdv", "dq", *TMA_KERNELS):
        for d in REPORT_SHAPES["head_dims"]:
            for causal in (False, True):
                for cfg in shipped(kernel, target, d, REPORT_SHAPES["dtype"], causal):
                    c = _compile(
                        kernel,
                        target,
                        d,
                        REPORT_SHAPES["dtype"],
                        causal,
                        cfg,
                        REPORT_SHAPES["n_ctx"],
                    )
                    regs, st, ld = ptxas_usage(c.asm["ptx"])
                    rep = sass.report(c.asm["cubin"])
                    loop = rep["hot_loop"] or {}
                    # instructions per score, per thread (sass.per_score)
                    per_score = sass.per_score(loop.get("instructions", 0), *cfg[:3])
                    rows.append(
                        {
                            "kernel": kernel,
                            "head_dim": d,
                            "dtype": "bf16",
                            "causal": causal,
                            "n_ctx": REPORT_SHAPES["n_ctx"],
                            "config": dict(
                                zip(
                                    ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages"),
                                    cfg,
                                )
                            ),
                            "registers": regs,
                            "spill_bytes": st + ld,
                            "shared_bytes": int(c.metadata.shared),
                            "launch_warps": int(c.metadata.num_warps),
                            "thread_instructions_per_score": round(per_score, 3),
                            **rep,
                        }
                    )
    fwd = [
        r
        for r in rows
        if r["kernel"] == "fwd" and r["head_dim"] == 128 and not r["causal"]
    ]
    rows += hard_machine_code_report(
        target, fwd[0]["thread_instructions_per_score"] if fwd else None
    )
    note = "instruction counts of the compiled machine code, not time"
    return {
        **report_header(target, "compile_check", note),
        "reference": TUTORIAL_FWD_SM90 if target == "sm90" else None,
        "kernels": rows,
    }


#: kernels/hard.py in the report: argmax, Gumbel-max sampling and top-k (k = 16), bf16,
#: d = 128, non-causal, N = 16384, every config the kernel ships for the target (the
#: autotuner picks among them at run time).
HARD_REPORT = (
    ("hard-argmax", "hard", False),
    ("hard-sample", "hard", True),
    ("topk16", "topk", False),
)


def hard_machine_code_report(target: str, fwd_per_score: float | None) -> list[dict]:
    """Hot-loop counts of kernels/hard.py; ``vs_flash_fwd``: instructions per score per
    thread (``sass.per_score``) over the flash forward's (same target, d = 128, its
    first shipped config, non-causal)."""
    from kernels import hard
    from kernels.machine_code import sass

    cap = tiles.ARCHS[target][0]
    n, d, H = REPORT_SHAPES["n_ctx"], 128, 16
    rows = []
    cases = [
        (name, kind, sample, cfg)
        for name, kind, sample in HARD_REPORT
        for cfg in hard.configs(kind, cap, d, REPORT_SHAPES["dtype"], 16, sample)
    ]
    for name, kind, sample, cfg in cases:
        topk = 16
        t = torch.empty(16, dtype=REPORT_SHAPES["dtype"])
        vals = {
            "sm_scale": 0.125,
            "SIGN": 1,
            "seed": 12345,
            "H": H,
            "N_Q": n,
            "N_K": n,
            "GROUP": 1,
            "HEAD_DIM": d,
            "BLOCK_D": 128,
            "IS_CAUSAL": False,
            "SAMPLE": sample,
            "UPCAST": False,
            "DOT_PRECISION": "tf32",
            "BLOCK_M": cfg[0],
            "BLOCK_N": cfg[1],
            "TOPK": topk,
            "TOPK_PAD": topk,
            "Q": t,
            "K": t,
            "V": t,
            "O": t,
            "IDX": torch.empty(16, dtype=torch.int64),
            "LSE": torch.empty(16),
        }
        for pfx in "qkvo":
            for suf, st in zip(
                ("b", "h", "m" if pfx in "qo" else "n", "d"), (H * n * d, n * d, d, 1)
            ):
                vals[f"stride_{pfx}{suf}"] = st
        fn = _jit_function(
            hard.forward._hard_attn_fwd
            if kind == "hard"
            else hard.forward._topk_attn_fwd
        )
        c = _compile_values(fn, vals, cap, cfg[2], cfg[3])
        regs, st, ld = ptxas_usage(c.asm["ptx"])
        rep = sass.report(c.asm["cubin"])
        per_score = sass.per_score(
            (rep["hot_loop"] or {}).get("instructions", 0), *cfg[:3]
        )
        rows.append(
            {
                "kernel": name,
                "head_dim": d,
                "dtype": "bf16",
                "causal": False,
                "n_ctx": n,
                "config": dict(
                    zip(("BLOCK_M", "BLOCK_N", "num_warps", "num_stages"), cfg)
                ),
                "registers": regs,
                "spill_bytes": st + ld,
                "shared_bytes": int(c.metadata.shared),
                "thread_instructions_per_score": round(per_score, 3),
                "vs_flash_fwd": (
                    round(per_score / fwd_per_score, 3) if fwd_per_score else None
                ),
                **rep,
            }
        )
    return rows


def format_report(rep: dict) -> str:
    lines = [
        f"# {rep['target']}: hot loop per iteration (triton {rep['triton']}); "
        "instruction counts, not time;\n# thr/score: instructions "
        "one thread issues per score (loop instr. x 32 x warps / (BM x BN))",
        f"{'kernel':<10} {'d':>4} {'mask':<6} {'BMxBN w s':<14} {'instr':>6} "
        f"{'thr/score':>9} "
        f"{'mma':>4} {'FMUL':>5} {'FFMA':>5} {'EX2':>4} {'int':>4} {'cp.as':>5} "
        f"{'TMA':>4} {'WS':>3} {'regs':>4}",
    ]
    for r in rep["kernels"]:
        c, hl = r["config"], r["hot_loop"] or {}
        cfg = f"{c['BLOCK_M']}x{c['BLOCK_N']} w{c['num_warps']} s{c['num_stages']}"
        lines.append(
            f"{r['kernel']:<10} {r['head_dim']:>4} "
            f"{'causal' if r['causal'] else 'full':<6} "
            f"{cfg:<14} {hl.get('instructions', '-'):>6} "
            f"{r['thread_instructions_per_score']:>9.3f} "
            f"{hl.get('tensor_core', '-'):>4} {hl.get('FMUL', '-'):>5} "
            f"{hl.get('FFMA', '-'):>5} "
            f"{hl.get('MUFU.EX2', '-'):>4} {hl.get('integer', '-'):>4} "
            f"{hl.get('LDGSTS', '-'):>5} {'yes' if r['tma'] else 'no':>4} "
            f"{'yes' if r.get('warp_specialized') else 'no':>3} {r['registers']:>4}"
        )
    if rep["reference"]:
        ref = rep["reference"]
        lines.append(f"# to beat: {ref['what']}: {ref['hot_loop']}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument(
        "--quick",
        action="store_true",
        help="the recorded peaks (kernels/machine_code/compile_peaks.json)",
    )
    ap.add_argument("--target", action="append", choices=list(tiles.ARCHS))
    ap.add_argument(
        "--kernel",
        action="append",
        choices=list(KERNELS),
        help="fwd-tma, fwd-tma-ws: kernels.flash.forward_tma's forward (sm90 only)",
    )
    ap.add_argument(
        "--report",
        action="store_true",
        help="hot-loop SASS instruction counts (sm90/sm80) -> benchmarks/static/",
    )
    args = ap.parse_args(argv)
    if runtime.INTERPRET:
        print(
            "compile_check needs TRITON_INTERPRET unset (kernels were imported under "
            "the interpreter)",
            file=sys.stderr,
        )
        return 2
    if args.report:
        import json

        STATIC_DIR.mkdir(parents=True, exist_ok=True)
        for target in args.target or ["sm90", "sm80"]:
            rep = machine_code_report(target)
            path = STATIC_DIR / f"static-{target}.json"
            path.write_text(json.dumps(rep, indent=1) + "\n")
            print(format_report(rep), f"\n# written to {path}", flush=True)
        return 0
    jobs = plan(args.quick, args.target, args.kernel)
    print(f"# triton {triton.__version__}, {len(jobs)} compilations", flush=True)
    print(HEADER, flush=True)
    results = []
    for k, t, d, dt, c, cfg, n_ctx in jobs:
        r = compile_one(k, t, d, dt, c, cfg, n_ctx=n_ctx)
        results.append(r)
        print(format_row(r), flush=True)
    bad = [r for r in results if not r.ok]
    print(
        f"# {len(results) - len(bad)}/{len(results)} ok"
        + (f"; {len(bad)} over shared memory, spilling or failing" if bad else "")
    )
    if not (args.quick or args.target or args.kernel or bad):
        write_peaks(results)
        print(f"# peaks per kernel and target written to {PEAKS_FILE}")
    return 1 if bad else 0


def write_peaks(results: list[Result]) -> None:
    import json

    PEAKS_FILE.write_text(
        json.dumps(
            {
                "triton": triton.__version__,
                "date": time.strftime("%Y-%m-%d"),
                "command": "python -m kernels.machine_code.compile_check",
                "compilations": len(results),
                "peaks": peaks(results),
            },
            indent=1,
        )
        + "\n"
    )


if __name__ == "__main__":
    sys.exit(main())
