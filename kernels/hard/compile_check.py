"""The hard (argmax, sampled) and top-k kernels compiled ahead of time on a CPU.

    python -m kernels.hard.compile_check                # sm_90 and sm_75 (T4)
    python -m kernels.hard.compile_check --target sm80

``main`` compiles the shipped tiles at d = 128 (the heaviest variants: sampling,
argmax-only tiles, top-k 64 and 128, and the NaN rows' index pass) and checks shared
memory against the target's limit and that ptxas spills nothing. The interpreter
accepts code a GPU compiler rejects, so this is the family's check that its kernels are
GPU code. ``machine_code_report`` gives the hot-loop SASS counts of the forward at
every config the family ships for the target, beside the flash forward's.

``python -m kernels.flash.compile_check --report`` writes them into
``benchmarks/static/static-<target>.json`` with the FlashAttention rows (chapter 3 reads
them there); ``machine_code_report(target, fwd_per_score)`` is that section.
Import it with ``TRITON_INTERPRET=0`` (the compile checks set it): under the
interpreter the kernels are not compilable objects.
"""

from __future__ import annotations

import sys

from kernels import runtime

runtime.compile_ahead("kernels.hard.compile_check", __name__)

import torch  # noqa: E402
import triton  # noqa: E402

from kernels.common import ARCHS, block_d  # noqa: E402
from kernels.hard import forward  # noqa: E402
from kernels.hard.tiles import configs  # noqa: E402
from kernels.machine_code import sass  # noqa: E402
from kernels.machine_code.compiler import (  # noqa: E402
    REPORT_SHAPES,
    compile_values,
    jit_function,
    ptxas_usage,
)

#: kernels/hard.py in the report: argmax, Gumbel-max sampling and top-k (k = 16), bf16,
#: d = 128, non-causal, N = 16384, every config the kernel ships for the target (the
#: autotuner picks among them at run time).
HARD_REPORT = (
    ("hard-argmax", "hard", False),
    ("hard-sample", "hard", True),
    ("topk16", "topk", False),
)


def machine_code_report(target: str, fwd_per_score: float | None) -> list[dict]:
    """Hot-loop counts of kernels/hard.py; ``vs_flash_fwd``: instructions per score per
    thread (``sass.per_score``) over the flash forward's (same target, d = 128, its
    first shipped config, non-causal)."""
    cap = ARCHS[target][0]
    n, d, H = REPORT_SHAPES["n_ctx"], 128, 16
    rows = []
    cases = [
        (name, kind, sample, cfg)
        for name, kind, sample in HARD_REPORT
        for cfg in configs(kind, cap, d, REPORT_SHAPES["dtype"], 16, sample)
    ]
    for name, kind, sample, cfg in cases:
        vals = launch_values(
            cfg, 16, sample, False, REPORT_SHAPES["dtype"], n=n, d=d, heads=H
        )
        fn = jit_function(
            forward._hard_attn_fwd if kind == "hard" else forward._topk_attn_fwd
        )
        c = compile_values(fn, vals, cap, cfg[2], cfg[3])
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


def launch_values(
    cfg,
    topk: int,
    sample: bool,
    causal: bool,
    dtype,
    n: int = 4096,
    d: int = 128,
    heads: int = 16,
) -> dict:
    """Argument values of a representative launch of the hard/top-k forward, keyed by
    parameter name: contiguous (B, heads, n, d) tensors of ``dtype``, tile ``cfg``."""
    t = torch.empty(16, dtype=dtype)
    vals = {
        "sm_scale": 0.125,
        "SIGN": 1,
        "seed": 12345,
        "H": heads,
        "N_Q": n,
        "N_K": n,
        "GROUP": 1,
        "HEAD_DIM": d,
        "BLOCK_D": block_d(d),
        "IS_CAUSAL": causal,
        "SAMPLE": sample,
        "UPCAST": False,
        "DOT_PRECISION": "tf32",
        "BLOCK_M": cfg[0],
        "BLOCK_N": cfg[1],
        "TOPK": topk,
        "TOPK_PAD": triton.next_power_of_2(topk),
        "Q": t,
        "K": t,
        "V": t,
        "O": t,
        "IDX": torch.empty(16, dtype=torch.int64),
        "LSE": torch.empty(16),
    }
    for pfx in "qkvo":
        strides = (heads * n * d, n * d, d, 1)
        for suf, st in zip(("b", "h", "m" if pfx in "qo" else "n", "d"), strides):
            vals[f"stride_{pfx}{suf}"] = st
    return vals


def plan(targets=("sm90", "sm75")) -> list[tuple]:
    """The compile matrix at d = 128 (fp16): sampling (the heavier loop) at its tiles,
    argmax at the tiles only it ships, top-k 64 and 128, and the NaN rows' index pass,
    for each target: (kernel function, name, target, config, topk, sample)."""
    jobs = []
    for target in targets:
        cap = ARCHS[target][0]
        hard, topk = forward._hard_attn_fwd, forward._topk_attn_fwd
        sampling = configs("hard", cap, 128, sample=True)
        jobs += [(hard, "hard", target, c, 0, True) for c in sampling]
        argmax_only = set(configs("hard", cap, 128)) - set(sampling)
        jobs += [(hard, "argmax", target, c, 0, False) for c in sorted(argmax_only)]
        jobs += [
            (topk, f"topk{k}", target, c, k, True)
            for k in (64, 128)
            for c in configs("topk", cap, 128, topk=k)
        ]
        b = forward.NAN_INDEX_BLOCK  # the NaN rows' index pass (issue 23)
        jobs.append(
            (forward._hard_nan_index, "nan-index", target, (b, b, 4, 1), 0, False)
        )
    return jobs


def main(argv=None) -> int:
    """Compile ``plan()`` (``--target`` narrows it) at fp16, causal, N = 4096 and print
    one row per case: name, target, config, shared bytes, the target's limit,
    registers, spill stores and loads, ok or BAD. Exits 1 on any BAD row."""
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", action="append", choices=list(ARCHS))
    args = ap.parse_args(argv)
    bad = 0
    for kernel, name, target, cfg, topk, sample in plan(
        args.target or ("sm90", "sm75")
    ):
        cap, limit = ARCHS[target]
        vals = launch_values(cfg, topk, sample, True, torch.float16)
        c = compile_values(jit_function(kernel), vals, cap, cfg[2], cfg[3])
        regs, st, ld = ptxas_usage(c.asm["ptx"])
        ok = c.metadata.shared <= limit and st == 0 and ld == 0
        bad += not ok
        print(
            name,
            target,
            cfg,
            c.metadata.shared,
            limit,
            regs,
            st,
            ld,
            "ok" if ok else "BAD",
            flush=True,
        )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
