"""The data behind the static site's explorers (``explorers.static`` draws them): the
grids the page's script looks rows up in, computed by the same ``attention`` functions
the live explorers (``explorers.live``) call (``memory.closed_form`` and
``memory.compulsory`` grids, ``memory.simulate`` traces, ``hard.gumbel_softmax``).
Lists and dicts of numbers only, ready for JSON; each explorer's slider values are the
grid constants here.
"""

from __future__ import annotations

import itertools

import numpy as np

# Grids. Chapter 2 (and the landing page's teaser) cover these exactly.
TILE_N = [2**k for k in range(8, 17)]  # 256 .. 65536
TILE_D = [32, 64, 128, 256]
TILE_B = [16, 32, 64, 128, 256]
FORWARD = ["standard", "flash1", "flash2"]
BACKWARD = ["standard_bwd", "flash2_bwd", "flash2_bwd_split"]
#: On-chip memory per SM a kernel can use (KiB, as NVIDIA's "KB"), and the paper's.
SRAM_KIB = [
    ("T4 (64 KB shared)", 64),
    ("L4 (100 KB shared)", 100),
    ("A100 (164 KB shared)", 164),
    ("A100 L1+shared, the paper's (192 KB)", 192),
    ("H100 (228 KB shared)", 228),
]
#: The step view walks the schedule at this (small) N.
TRACE_N = 256
TRACE_D = 64


def _dtypes():
    from attention import plots

    return list(plots.DTYPE_BYTES.items())


def _flat(per_tensor: dict, names: list[str]) -> list[int]:
    """[reads, writes] of each tensor in ``names`` (0, 0 where absent), flattened."""
    out = []
    for n in names:
        r, w = per_tensor.get(n, (0, 0))
        out += [int(r), int(w)]
    return out


def _tensor_names(results) -> list[str]:
    return list(dict.fromkeys(t for r in results for t in r.per_tensor))


# ---------------------------------------------------------------------------------
# Chapter 2: the tile-size explorer.
# ---------------------------------------------------------------------------------


def tile_grid(Ns=TILE_N, ds=TILE_D, Bs=TILE_B, algorithms=FORWARD + BACKWARD) -> dict:
    """``memory.closed_form`` of each algorithm at every (N, d, Br, Bc) of the grid.

    ``counts[alg][k]`` is [r_0, w_0, r_1, w_1, ..., sram_peak] over ``tensors[alg]``,
    with k = ((iN * len(ds) + id) * len(Bs) + iBr) * len(Bs) + iBc. Counts are elements;
    they do not depend on the SRAM size or the dtype (which only decide whether the
    tiles fit: ``sram_peak <= M``, the test ``closed_form(..., M=M)`` makes).
    """
    from attention import memory

    tensors, counts = {}, {}
    for alg in algorithms:
        res = [
            memory.closed_form(alg, N, d, Br=br, Bc=bc)
            for N, d, br, bc in itertools.product(Ns, ds, Bs, Bs)
        ]
        tensors[alg] = _tensor_names(res)
        counts[alg] = [
            _flat(r.per_tensor, tensors[alg]) + [int(r.sram_peak)] for r in res
        ]
    return {
        "N": list(Ns),
        "d": list(ds),
        "B": list(Bs),
        "tensors": tensors,
        "counts": counts,
    }


#: How the explorer names the compulsory count beside the simulated one.
COMPULSORY_LABEL = "compulsory (each tensor once)"  # short: fits a 390 px legend row


def compulsory_grid(Ns=TILE_N, ds=TILE_D, algorithms=FORWARD + BACKWARD) -> dict:
    """``memory.compulsory`` of each algorithm at every (N, d): ``counts[alg][k]`` is
    [total elements, *per-tensor reads and writes over ``tensors[alg]``], with
    k = iN * len(ds) + id. Each tensor crosses HBM once: the lower bound an L2 that
    holds the re-reads gets near (the tiles do not change it)."""
    from attention import memory

    tensors, counts = {}, {}
    for alg in algorithms:
        res = [memory.compulsory(alg, N, d) for N, d in itertools.product(Ns, ds)]
        tensors[alg] = _tensor_names(res)
        counts[alg] = [[int(r.total)] + _flat(r.per_tensor, tensors[alg]) for r in res]
    return {
        "N": list(Ns),
        "d": list(ds),
        "tensors": tensors,
        "counts": counts,
        "label": COMPULSORY_LABEL,
    }


def sram_table(Ns=TILE_N, ds=TILE_D, srams=SRAM_KIB) -> dict:
    """M (elements) for each SRAM size and dtype (``M[si][ti]``), and FA1's rule there:
    ``rule["si,ti,di,Ni"]`` = [Br, Bc] of ``memory.fa1_block_sizes(M, d)`` and the SRAM
    its flash1 tiles need at N (``memory.sram_need``)."""
    from attention import memory

    M, rule = [], {}
    for si, (_, kib) in enumerate(srams):
        row = []
        for ti, (_, bpe) in enumerate(_dtypes()):
            m = kib * 1024 // bpe
            row.append(m)
            for di, d in enumerate(ds):
                br, bc = memory.fa1_block_sizes(m, d)
                for ni, N in enumerate(Ns):
                    need = memory.sram_need("flash1", N, d, br, bc)
                    rule[f"{si},{ti},{di},{ni}"] = [br, bc, need]
        M.append(row)
    return {"M": M, "rule": rule}


def _fmt(events, op) -> str:
    names = [
        f"{t.tensor}[{','.join(map(str, t.block))}]" if t.block else t.tensor
        for t in events
        if t.op == op
    ]
    return " ".join(dict.fromkeys(names)) or "-"


def schedule_steps(algorithm: str, N: int, d: int, Br: int, Bc: int) -> list[list]:
    """The steps of ``memory.simulate(algorithm, ..., keep_trace=True)``, one row each:
    [i, j, tensor, loads, stores]. (i, j) is the tile of S computed on chip (j = -1: the
    whole query block i, a row pass); ``tensor`` is the N x N_k tensor (S, P, dP or dS)
    whose tile crossed HBM at that step, or "SRAM" if it lived only on chip."""
    from attention import memory, plots

    t = memory.simulate(algorithm, N, d, Br=Br, Bc=Bc, keep_trace=True)
    steps: dict[int, list] = {}
    for ev in t.trace:
        steps.setdefault(ev.step, []).append(ev)
    rows = []
    for s in sorted(steps):
        ev = steps[s]
        comp = [e for e in ev if e.op == "compute"]
        block = comp[0].block if comp else ()
        quad = [
            e.tensor
            for e in ev
            if e.tensor in plots.QUADRATIC_TENSORS and e.op != "compute"
        ]
        rows.append(
            [
                block[0] if block else -1,
                block[1] if len(block) > 1 else -1,
                quad[-1] if quad else "SRAM",
                _fmt(ev, "load"),
                _fmt(ev, "store"),
            ]
        )
    return rows


def schedule_table(
    N=TRACE_N, d=TRACE_D, Bs=TILE_B, algorithms=FORWARD + BACKWARD
) -> dict:
    """``schedule_steps`` of each algorithm at every (Br, Bc), keyed "alg,Br,Bc", with
    the grid's T_r = ceil(N/Br) and T_c = ceil(N/Bc)."""
    from attention import memory

    return {
        "N": N,
        "d": d,
        "runs": {
            f"{a},{br},{bc}": {
                "tr": memory.cdiv(N, br),
                "tc": memory.cdiv(N, bc),
                "steps": schedule_steps(a, N, d, br, bc),
            }
            for a in algorithms
            for br in Bs
            for bc in Bs
        },
    }


# ---------------------------------------------------------------------------------
# Chapter 1: the traffic of standard attention against n, m, d and the dtype.
# ---------------------------------------------------------------------------------

# 64 .. 8192
NAIVE_N = sorted({2**k for k in range(6, 14)} | {3 * 2**k for k in range(5, 12)})
NAIVE_M = [2**k for k in range(4, 14)]  # 16 .. 8192 queries
NAIVE_D = [16, 32, 64, 128, 256]
NAIVE_TENSORS = ["Q", "K", "V", "S", "P", "O"]


def naive_grid(ns=NAIVE_N, ms=NAIVE_M, ds=NAIVE_D, Br: int = 64, Bc: int = 64) -> dict:
    """``memory.closed_form("standard", m, d, Br, Bc, N_k=n)`` for m = n (self) and
    every m of the grid: ``counts[mi + 1][di][ni]`` = [r_Q, w_Q, ..., r_O, w_O] over
    ``NAIVE_TENSORS`` (mi = -1 is self-attention)."""
    from attention import memory

    counts = []
    for m in [None, *ms]:
        counts.append(
            [
                [
                    _flat(
                        memory.closed_form(
                            "standard", n if m is None else m, d, Br=Br, Bc=Bc, N_k=n
                        ).per_tensor,
                        NAIVE_TENSORS,
                    )
                    for n in ns
                ]
                for d in ds
            ]
        )
    return {
        "n": list(ns),
        "m": list(ms),
        "d": list(ds),
        "tensors": NAIVE_TENSORS,
        "counts": counts,
        "Br": Br,
        "Bc": Bc,
    }


# ---------------------------------------------------------------------------------
# Chapter 3: the Gumbel-softmax temperature, and the traffic of top-k.
# ---------------------------------------------------------------------------------

#: The temperature slider of ``live.temperature_explorer``: 10^-2 .. 10^1.5 in
#: steps of 0.05.
TAU_EXP = [round(-2 + 0.05 * i, 2) for i in range(71)]


def temperature_grid(scores, noise, exps=TAU_EXP) -> dict:
    """``hard.gumbel_softmax(scores, tau, noise=noise)`` at each tau = 10^e (rounded to
    5 decimals), ``core.softmax(scores)`` and, per row, the Gumbel-max sample
    argmax(s + g)."""
    from attention import hard
    from attention.core import softmax

    s, g = np.asarray(scores, float), np.asarray(noise, float)
    ys = [np.round(hard.gumbel_softmax(s, 10.0**e, noise=g), 5).tolist() for e in exps]
    return {
        "tau_exp": list(exps),
        "y": ys,
        "p": np.round(softmax(s, axis=-1), 5).tolist(),
        "sample": np.argmax(s + g, axis=-1).tolist(),
        "shape": list(s.shape),
        # The inputs, so a test can recompute.
        "scores": s.tolist(),
        "noise": g.tolist(),
    }


def temperature_inputs(scores=None, noise=None, seed: int = 0):
    """The temperature explorer's (scores, noise) as float arrays: the given ones, or
    a random (8, 12) score matrix (1.5 x standard normal) and its Gumbel noise, both
    drawn from ``seed`` (scores first)."""
    rng = np.random.default_rng(seed)
    s = (
        1.5 * rng.standard_normal((8, 12))
        if scores is None
        else np.asarray(scores, float)
    )
    g = (
        -np.log(-np.log(rng.random(s.shape)))
        if noise is None
        else np.asarray(noise, float)
    )
    return s, g


TOPK_N = [2**k for k in range(8, 17)]
TOPK_D = [32, 64, 128]
TOPK_K = [2**k for k in range(0, 9)]  # 1 .. 256


def topk_grid(ns=TOPK_N, ds=TOPK_D, ks=TOPK_K, Br: int = 64, Bc: int = 64) -> dict:
    """``memory.closed_form`` of soft, hard and top-k (each k) attention, at every
    (N, d): ``counts[name][di][ni]`` (name "soft", "hard" or "topk:k") over the
    names in ``tensors``."""
    # hard registers soft, hard, topk.
    from attention import hard, memory  # noqa: F401

    runs = {"soft": {}, "hard": {}, **{f"topk:{k}": {"k": k} for k in ks}}
    res = {
        name: [
            [
                memory.closed_form(name.split(":")[0], n, d, Br=Br, Bc=Bc, **kw)
                for n in ns
            ]
            for d in ds
        ]
        for name, kw in runs.items()
    }
    tensors = _tensor_names(r for rows in res.values() for row in rows for r in row)
    counts = {
        name: [[_flat(r.per_tensor, tensors) for r in row] for row in rows]
        for name, rows in res.items()
    }
    return {
        "N": list(ns),
        "d": list(ds),
        "k": list(ks),
        "tensors": tensors,
        "counts": counts,
    }


# ---------------------------------------------------------------------------------
# Chapter 4: deformable attention's traffic.
# ---------------------------------------------------------------------------------

DEFORM_SIDE = list(range(16, 129, 16))
DEFORM_D = [16, 32, 64, 128]
DEFORM_R = list(range(1, 17))
DEFORM_P = list(range(1, 17))
DEFORM_L = [1, 2, 3, 4]
DEFORM_ALGS = {
    "dense": "dense-image",
    "DAT fused": "dat",
    "DAT unfused": "dat-unfused",
    "MSDA": "msda",
}


def deformable_grid(
    sides=DEFORM_SIDE, ds=DEFORM_D, rs=DEFORM_R, ps=DEFORM_P, ls=DEFORM_L
) -> dict:
    """``memory.closed_form`` of dense, DAT (fused, unfused) and MSDA over a side x
    side map: dense[di][si], dat[di][si][ri], dat-unfused[di][si][ri],
    msda[di][si][li][pi]."""
    # Importing deformable registers the algorithms.
    from attention import deformable, memory  # noqa: F401

    def cf(alg, **kw):
        return memory.closed_form(alg, **kw)

    res = {
        "dense-image": [
            [cf("dense-image", height=s, width=s, d=d) for s in sides] for d in ds
        ],
        "dat": [
            [[cf("dat", height=s, width=s, d=d, r=r) for r in rs] for s in sides]
            for d in ds
        ],
        "dat-unfused": [
            [
                [cf("dat-unfused", height=s, width=s, d=d, r=r) for r in rs]
                for s in sides
            ]
            for d in ds
        ],
        "msda": [
            [
                [
                    [
                        cf("msda", n_queries=s * s, d=d, n_levels=L, n_points=P)
                        for P in ps
                    ]
                    for L in ls
                ]
                for s in sides
            ]
            for d in ds
        ],
    }

    def leaves(x):
        return [x] if hasattr(x, "per_tensor") else [r for y in x for r in leaves(y)]

    tensors = _tensor_names(r for v in res.values() for r in leaves(v))

    def enc(x):
        if hasattr(x, "per_tensor"):
            return _flat(x.per_tensor, tensors)
        return [enc(y) for y in x]

    return {
        "side": list(sides),
        "d": list(ds),
        "r": list(rs),
        "P": list(ps),
        "L": list(ls),
        "tensors": tensors,
        "counts": {a: enc(v) for a, v in res.items()},
        "names": DEFORM_ALGS,
    }
