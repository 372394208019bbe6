"""Compile the kernels.flex kernels ahead of time for sm_75, sm_80, sm_89 and sm_90 on a
CPU, at their shipped tiles, and check shared memory and register spills.

    python -m kernels.flex.compile_check           # every target, instantiation,
                                                   # kernel, head dim, dtype
    python -m kernels.flex.compile_check --quick   # the representative subset
                                                   # (the test's)
    python -m kernels.flex.compile_check --report  # hot-loop SASS counts, sm90
                                                   # and sm80 -> benchmarks/static/

Instantiations (each a different kernel: the mods are compile-time functions):
``causal`` (``causal_mask``), ``window`` (``sliding_window(4096)``), ``document``
(``and_masks(causal_mask, document_mask(ids))``) and ``softcap-sink``
(``causal_mask`` with ``softcap(50)`` and per-head sinks: Gemma 2 / gpt-oss) and
``user-score`` (``causal_mask`` with a user's bare score mod: the backward's five-point
difference). For each
kernel (``fwd``, ``dkdv``, ``dq``), head dims (d, d_v) in (64, 64), (128, 128) and
(192, 128) (DeepSeek MLA's prefill), dtypes fp16 (tensor cores; FMA on sm_75) and
fp32 (FMA), the shipped tile of ``kernels.flex.tiles.configs`` at a 128 x 128 block
mask, the report gives shared memory against the target's limit, registers per thread
and spill bytes (``ptxas -v``, as ``kernels.flash.compile_check``), and on
sm_90 whether the matmuls became Hopper ``wgmma``. The
argument signature is Triton's own specialisation of a representative launch:
contiguous (B, H = 16, N = 4096, d) q with H_kv = 8 (GQA), a broadcast block mask.
The sm_75 backward above d = 64 is not shipped (every tile spills with CUDA-core
dots there; ``flex_attention`` refuses it): listed as "not shipped". Exits 1 if a case
spills, exceeds shared memory or fails to compile. Runs with
TRITON_INTERPRET unset (``runtime.compile_ahead`` sets it to 0).

``--report`` writes ``benchmarks/static/flex-sm90.json`` and ``flex-sm80.json``: the
forward for a causal mask and a sliding window of 4,096 (bf16, d = 128, the shipped
tile, N = 16384 as ``kernels.machine_code.compiler.REPORT_SHAPES``), with the fields of
``kernels.flash.compile_check.machine_code_report``'s rows (so ``benchmarks.report``
renders both)
and the SASS counts per iteration of its two tensor-core loops (``sass.py``):
``hot_loop``, the full tiles' loop (no mask evaluated), and ``partial_loop``, the
partial tiles' (the mask function evaluated per score).
"""

from __future__ import annotations

import sys

from kernels import runtime

runtime.compile_ahead("kernels.flex.compile_check", __name__)

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from kernels.common import dot_precision  # noqa: E402
from kernels.flex import (  # noqa: E402
    and_masks,
    backward,
    backward_dq,
    causal_mask,
    document_mask,
    forward,
    mods,
    sliding_window,
    softcap,
    tiles,
)
from kernels.machine_code.compiler import (  # noqa: E402
    cells,
    check_args,
    compile_values,
    jit_function,
    measure,
    ptxas_usage,
    report_header,
    run_jobs,
    write_reports,
)

N, H, H_KV = 4096, 16, 8
BLOCK = 128
TARGETS = ("sm75", "sm80", "sm89", "sm90")
KERNELS = {
    "fwd": forward._flex_fwd,
    "dkdv": backward._flex_dkdv,
    "dq": backward_dq._flex_dq,
}
HEAD_DIMS = ((64, 64), (128, 128), (192, 128))
DTYPES = {"fp16": torch.float16, "fp32": torch.float32}
#: the test's subset: every instantiation and kernel once, spread over the targets
QUICK = (
    ("fwd", "causal", "sm90", (128, 128), "fp16"),
    ("fwd", "softcap-sink", "sm80", (64, 64), "fp16"),
    ("dq", "window", "sm89", (64, 64), "fp16"),
    ("dkdv", "document", "sm75", (64, 64), "fp16"),
    ("dq", "user-score", "sm90", (128, 128), "fp16"),
)


@triton.jit
def user_bias(score, b, h, q_idx, kv_idx):
    """A user's own score mod without its derivative (a T5-like bias): the backward's
    five-point difference, four more calls of the mod per score."""
    return score - 0.05 * tl.abs(q_idx - kv_idx).to(tl.float32)


def instantiation(name: str, n: int = N):
    """(mask Mod, score Mod or None, sinks?) of an instantiation at length ``n``."""
    if name == "causal":
        return causal_mask, None, False
    if name == "window":
        return sliding_window(4096), None, False
    if name == "document":
        return (
            and_masks(causal_mask, document_mask(torch.arange(n) // 1024)),
            None,
            False,
        )
    if name == "softcap-sink":
        return causal_mask, softcap(50.0), True
    if name == "user-score":
        return causal_mask, user_bias, False
    raise ValueError(
        "instantiation must be causal, window, document, softcap-sink or user-score"
    )


def _values(kernel, name, dims, dtype, config, n=N):
    mask, score, sinks = instantiation(name, n)
    mfn = mods.pack(mask, "cpu")[0]
    has_score = score is not None
    score = mods.as_mod(score, "score", "score_mod") if has_score else None
    sfn, gfn = (mods.pack(score, "cpu")[0::3]) if has_score else (mfn, None)
    d, dv = dims
    bd, bdv = tiles.block_d(d), tiles.block_d(dv)
    t = torch.empty(16, dtype=dtype)
    f32 = torch.empty(16, dtype=torch.float32)
    i32 = torch.empty(16, dtype=torch.int32)
    vals = {
        "scale": 0.125,
        "bm_sz": 0,
        "bm_sh": 0,
        "NQB": n // BLOCK,
        "NKB": n // BLOCK,
        "H": H,
        "H_KV": H_KV,
        "GROUP": H // H_KV,
        "N_Q": n,
        "N_K": n,
        "HEAD_DIM": d,
        "HEAD_DIM_V": dv,
        "MASK_FN": mfn,
        "SCORE_FN": sfn,
        "GRAD_FN": gfn if gfn is not None else sfn,
        "HAS_SCORE": has_score,
        "HAS_GRAD": gfn is not None,
        "HAS_SINKS": sinks,
        "BLOCK_D": bd,
        "BLOCK_DV": bdv,
        "UPCAST": False,
        "DOT_PRECISION": dot_precision(dtype),
        "BLOCK_M": config[0],
        "BLOCK_N": config[1],
        "SQ": BLOCK,
        "SK": BLOCK,
        "EVEN_M": True,
        "EVEN_N": True,
        "EVEN_D": d == bd and dv == bdv,
        "SHIELD": kernel.endswith("-shield"),
    }
    for p in ("Q", "K", "V", "Out", "DO", "DQ", "DKP", "DVP"):
        vals[p] = t
    for p in ("LSE2", "Delta", "SINKS", "MF", "SMF"):
        vals[p] = f32
    for p in ("V_BAD", "BAD", "MI", "SMI"):
        vals[p] = i32
    for p in ("KV_NUM", "KV_IDX", "FKV_NUM", "FKV_IDX", "Q_NUM", "Q_IDX"):
        vals[p] = i32
    vals["FQ_NUM"] = vals["FQ_IDX"] = i32
    shapes = {
        "q": (H, d),
        "k": (H_KV, d),
        "v": (H_KV, dv),
        "o": (H, dv),
        "do": (H, dv),
        "dq": (H, d),
        "dk": (H_KV, d),
        "dv": (H_KV, dv),
    }
    for pfx, (heads, width) in shapes.items():
        row = "m" if pfx in ("q", "o", "do", "dq") else "n"
        for suf, st in zip(
            ("z", "h", row, "d"), (heads * n * width, n * width, width, 1)
        ):
            vals[f"stride_{pfx}{suf}"] = st
    return vals


def compile_case(kernel, name, target, dims, dtype_name):
    """One compilation: a result dict (shared, registers, spills, ok)."""
    dtype = DTYPES[dtype_name]
    cap = tiles.ARCHS[target][0]
    d_pad = max(tiles.block_d(dims[0]), tiles.block_d(dims[1]))
    config = tiles.configs(kernel, cap, d_pad, dtype)
    res = {
        "kernel": kernel,
        "case": name,
        "target": target,
        "dims": dims,
        "dtype": dtype_name,
        "config": None,
        "limit": tiles.ARCHS[target][1],
    }
    if config is None:  # not shipped (the sm_75 backward above d = 64): refused
        return None
    config = (min(config[0], BLOCK), min(config[1], BLOCK), *config[2:])
    res["config"] = config
    return measure(
        res,
        lambda: compile_values(
            jit_function(KERNELS[kernel.removesuffix("-shield")]),
            _values(kernel, name, dims, dtype, config),
            cap,
            config[2],
            config[3],
        ),
        # the NaN/inf launches may spill (reported, not refused), as kernels.flash's
        spills_ok=kernel.endswith("-shield"),
    )


def format_row(r) -> str:
    bm, bn, w, s = r["config"]
    shared, status, wg = cells(r)
    return (
        f"{r['kernel']:<5} {r['case']:<13} {r['target']:<5} "
        f"{r['dims'][0]:>3}/{r['dims'][1]:<3} {r['dtype']:<4} "
        f"{bm}x{bn} w{w} s{s:<3} {shared:>11} {r.get('registers', '-'):>4} "
        f"{r.get('spills', '-'):>6} {wg:>5} {r['seconds']:5.1f}s {status}"
    )


HEADER = (
    f"{'kern':<5} {'case':<13} {'arch':<5} {'d/dv':<7} {'type':<4} "
    f"{'BMxBN w s':<12} {'smem KB/lim':>11} {'regs':>4} {'spills':>6} {'wgmma':>5} "
    f"{'time':>6} "
    "status"
)


ALL_KERNELS = (*KERNELS, *(f"{k}-shield" for k in KERNELS))


def plan(quick: bool, targets=None, kernels=None):
    if quick:
        return [c for c in QUICK if not targets or c[2] in targets]
    return [
        (k, name, t, dims, dt)
        for t in targets or TARGETS
        for name in ("causal", "window", "document", "softcap-sink", "user-score")
        for k in kernels or ALL_KERNELS
        for dims in HEAD_DIMS
        for dt in DTYPES
    ]


#: The report's instantiations: (row name, instantiation) at ``REPORT_SHAPES``.
REPORT_MASKS = (("causal", "causal"), ("window 4096", "window"))


def _tensor_core_loops(cubin: bytes) -> list[dict]:
    """SASS counts per iteration of each innermost loop issuing tensor-core
    instructions, in address order (the forward's full-tile loop, then its
    partial-tile loop)."""
    from kernels.machine_code import sass

    instrs, labels = sass.disassemble(cubin)
    spans = sorted(
        (a, b)
        for a, b in sass.loops(instrs, labels)
        if any(ins.base in sass.TENSOR_CORE for ins in instrs[a : b + 1])
    )
    inner = [
        (a, b)
        for a, b in spans
        if not any(a <= c and e <= b and (c, e) != (a, b) for c, e in spans)
    ]
    return [sass.count(instrs[a : b + 1]) for a, b in inner]


def machine_code_report(target: str) -> dict:
    """Hot-loop SASS counts of the flex forward on ``target`` ("sm90", "sm80") for each
    of ``REPORT_MASKS``: rows with ``compile_check.machine_code_report``'s fields plus
    ``mask`` and ``partial_loop`` (the partial tiles' loop; ``hot_loop`` is the full
    tiles')."""
    from kernels.machine_code import sass
    from kernels.machine_code.compiler import REPORT_SHAPES

    d, dtype, n = 128, REPORT_SHAPES["dtype"], REPORT_SHAPES["n_ctx"]
    cap = tiles.ARCHS[target][0]
    cfg = tiles.configs("fwd", cap, tiles.block_d(d), dtype)
    cfg = (min(cfg[0], BLOCK), min(cfg[1], BLOCK), *cfg[2:])
    rows = []
    for label, name in REPORT_MASKS:
        vals = _values("fwd", name, (d, d), dtype, cfg, n)
        c = compile_values(jit_function(KERNELS["fwd"]), vals, cap, cfg[2], cfg[3])
        regs, st, ld = ptxas_usage(c.asm["ptx"])
        rep = sass.report(c.asm["cubin"])
        found = _tensor_core_loops(c.asm["cubin"])
        if len(found) != 2:
            raise RuntimeError(
                f"expected a full-tile and a partial-tile loop, found {len(found)}"
            )
        full, part = found
        rows.append(
            {
                "kernel": "flex-fwd",
                "mask": label,
                "head_dim": d,
                "dtype": "bf16",
                "causal": True,
                "n_ctx": n,
                "block_mask": BLOCK,
                "config": dict(
                    zip(("BLOCK_M", "BLOCK_N", "num_warps", "num_stages"), cfg)
                ),
                "registers": regs,
                "spill_bytes": st + ld,
                "shared_bytes": int(c.metadata.shared),
                "launch_warps": int(c.metadata.num_warps),
                "thread_instructions_per_score": round(
                    sass.per_score(full["instructions"], *cfg[:3]), 3
                ),
                **rep,
                "hot_loop": full,
                "partial_loop": part,
            }
        )
    note = (
        "instruction counts of the compiled machine code, not time; hot_loop: "
        "the full tiles' loop, partial_loop: the partial tiles' (mask evaluated)"
    )
    return {
        **report_header(target, "kernels.flex.compile_check", note),
        "kernels": rows,
    }


def _describe(target, r) -> str:
    return (
        f"{target} {r['kernel']} {r['mask']:<12} regs {r['registers']} "
        f"spills {r['spill_bytes']} loop instr. full "
        f"{r['hot_loop']['instructions']} partial "
        f"{r['partial_loop']['instructions']}"
    )


def _not_shipped(k, name, t, dims, dt) -> str:
    return f"{k:<5} {name:<13} {t:<5} {dims[0]:>3}/{dims[1]:<3} {dt:<4} not shipped"


def main(argv=None) -> int:
    args = check_args(argv, __doc__, TARGETS, ALL_KERNELS)
    if runtime.INTERPRET:
        print("flex_check needs TRITON_INTERPRET unset", file=sys.stderr)
        return 2
    if args.report:
        return write_reports("flex", args.target, machine_code_report, _describe)
    jobs = plan(args.quick, args.target, args.kernel)
    return run_jobs(jobs, HEADER, compile_case, format_row, _not_shipped)


if __name__ == "__main__":
    sys.exit(main())
