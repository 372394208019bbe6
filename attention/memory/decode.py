"""Decoding's traffic (chapter 5): one step of N_q new query rows per sequence against a
cache of N keys (the context), tile by tile and in closed form, for the whole batch.

Registered algorithms (each counts every (batch, head) program of one attention layer):

``decode_naive``  materialising: per query head, S = q K^T goes to HBM, P = softmax(S)
                  goes to HBM, then O = P V (what eager PyTorch does).
``decode_fa2``    FlashAttention-2's grid: one program per (sequence, query head); each
                  streams its KV head's K and V (so a KV head shared by ``group`` query
                  heads is read ``group`` times) and writes O and the log-sum-exp L.
``decode_split``  FlashDecoding, GQA-packed: one program per (sequence, KV head, split)
                  holds the ``group * N_q`` query rows that share the KV head, streams
                  its chunk of K and V once and writes a partial (O_part, lse_part);
                  a second kernel, one program per (sequence, KV head), merges the
                  ``n_splits`` partials. With n_splits = 1 there is no merge: O and L
                  are written directly.
``decode_paged``  ``decode_split`` over a paged cache: a tile is one page, and a program
                  reads the page's block-table entry before it loads it.

The model is ``attention.memory``'s (see its docstring): counts are elements; a tile
that a loop loads is resident while the loop runs; nothing is cached in L2; a split
covers ceil(ceil(N / Bc) / n_splits) whole tiles, so trailing splits may be empty:
their programs load nothing and store a partial of o = 0, lse = -inf, which the merge
reads like any other. Every sequence holds N keys (the closed forms need one length;
``attention.decode`` handles ragged batches). Not counted: the per-sequence length
(one int a program), causal tile skipping among the N_q new rows.

``decode_bytes`` turns counts into bytes with each tensor's own size: K, V, Q, O in the
cache's dtype, the partials and L in fp32, the block table in int32.
"""

from __future__ import annotations

import dataclasses

from .sim import (
    HBMSim,
    Traffic,
    blocks,
    cdiv,
    check_count,
    fit_tiles,
    register,
    traffic,
)

#: Bytes per element of the tensors whose size is not the cache dtype's.
FIXED_BYTES = {"O_part": 4, "lse_part": 4, "L": 4, "block_table": 4}


def decode_bytes(t: Traffic, bytes_per_elem: int = 2) -> int:
    """HBM bytes of a decode count: K, V, Q, O, S, P at ``bytes_per_elem``; O_part,
    lse_part, L (fp32) and block_table (int32) at 4."""
    bpe = check_count("bytes_per_elem", bytes_per_elem)
    return sum(
        (r + w) * FIXED_BYTES.get(name, bpe) for name, (r, w) in t.per_tensor.items()
    )


def decode_flops(
    B: int, H_kv: int, N: int, d: int, group: int = 1, N_q: int = 1
) -> int:
    """Matmul FLOPs of one decode step, q K^T and P V: 4 B H_q N_q N d (H_q = H_kv
    group; no causal saving among the N_q new rows)."""
    return (
        4
        * check_count("B", B)
        * check_count("H_kv", H_kv)
        * check_count("group", group)
        * check_count("N_q", N_q)
        * check_count("N", N)
        * check_count("d", d)
    )


# ---------------------------------------------------------------------------------
# Naive decode: S and P through HBM, per query head
# ---------------------------------------------------------------------------------


def _phases_naive(N, d, N_q, Bc):
    bc = min(Bc, N)
    return {
        "S = q K^T": {"q": N_q * d, "K_j": bc * d, "S_j": N_q * bc},
        "P = softmax(S)": {"one row of S": N},
        "O = P V": {"O": N_q * d, "P_j": N_q * bc, "V_j": bc * d},
    }


def _simulate_naive(
    B: int,
    H_kv: int,
    N: int,
    d: int,
    group: int = 1,
    N_q: int = 1,
    Bc: int = 64,
    M: int | None = None,
    keep_trace: bool = True,
) -> Traffic:
    """Per (sequence, query head): S to HBM, softmax through HBM, then P V."""
    fit_tiles("decode_naive", _phases_naive(N, d, N_q, Bc), M)
    sim = HBMSim(M, keep_trace)
    cols = blocks(N, Bc)
    first = True
    for p in range(B * H_kv * group):
        sim.hold(N_q * d, "q")
        for j, bc in enumerate(cols):
            if not first:
                sim.next_step()
            first = False
            if j == 0:
                sim.load("Q", N_q * d, (p,))
            sim.hold(bc * d + N_q * bc, "q, K_j and S_j")
            sim.load("K", bc * d, (p, j))
            sim.compute("S", (p, j))
            sim.store("S", N_q * bc, (p, j))
            sim.release(bc * d + N_q * bc)
        sim.release(N_q * d)
        sim.next_step()
        sim.hold(N, "one row of S")
        sim.load("S", N_q * N, (p,))
        sim.compute("P", (p,))
        sim.store("P", N_q * N, (p,))
        sim.release(N)
        sim.hold(N_q * d, "O")
        for j, bc in enumerate(cols):
            sim.next_step()
            sim.hold(N_q * bc + bc * d, "O, P_j and V_j")
            sim.load("P", N_q * bc, (p, j))
            sim.load("V", bc * d, (p, j))
            sim.compute("O", (p, j))
            sim.release(N_q * bc + bc * d)
        sim.store("O", N_q * d, (p,))
        sim.release(N_q * d)
    return sim.result()


def _closed_naive(
    B: int,
    H_kv: int,
    N: int,
    d: int,
    group: int = 1,
    N_q: int = 1,
    Bc: int = 64,
    M: int | None = None,
    keep_trace: bool = True,
) -> Traffic:
    peak = fit_tiles("decode_naive", _phases_naive(N, d, N_q, Bc), M)
    P, T = B * H_kv * group, cdiv(N, Bc)
    return traffic(
        {
            "Q": (P * N_q * d, 0),
            "K": (P * N * d, 0),
            "S": (P * N_q * N, P * N_q * N),
            "P": (P * N_q * N, P * N_q * N),
            "V": (P * N * d, 0),
            "O": (0, P * N_q * d),
        },
        peak,
        steps=P * (2 * T + 1),
        events=P * (6 * T + 5),
    )


register("decode_naive", _simulate_naive, _closed_naive)


# ---------------------------------------------------------------------------------
# FlashAttention-2's grid: one program per (sequence, query head)
# ---------------------------------------------------------------------------------


def _phases_stream(rows, N, d, bc):
    bc = min(bc, N)
    return {
        "the key loop": {
            "q": rows * d,
            "acc": rows * d,
            "m, l": 2 * rows,
            "K_j, V_j": 2 * bc * d,
            "S_j": rows * bc,
        }
    }


def _simulate_fa2(
    B: int,
    H_kv: int,
    N: int,
    d: int,
    group: int = 1,
    N_q: int = 1,
    Bc: int = 64,
    M: int | None = None,
    keep_trace: bool = True,
) -> Traffic:
    """One program per (sequence, query head): q, acc, m, l stay on chip while K and V
    stream past; O and L written once."""
    fit_tiles("decode_fa2", _phases_stream(N_q, N, d, Bc), M)
    sim = HBMSim(M, keep_trace)
    cols = blocks(N, Bc)
    for p in range(B * H_kv * group):
        sim.hold(2 * N_q * d + 2 * N_q, "q, acc, m and l")
        for j, bc in enumerate(cols):
            if p or j:
                sim.next_step()
            if j == 0:
                sim.load("Q", N_q * d, (p,))
            sim.hold(2 * bc * d + N_q * bc, "q, acc, m, l, K_j, V_j and S_j")
            sim.load("K", bc * d, (p, j))
            sim.load("V", bc * d, (p, j))
            sim.compute("S", (p, j))
            sim.release(2 * bc * d + N_q * bc)
        sim.store("O", N_q * d, (p,))
        sim.store("L", N_q, (p,))
        sim.release(2 * N_q * d + 2 * N_q)
    return sim.result()


def _closed_fa2(
    B: int,
    H_kv: int,
    N: int,
    d: int,
    group: int = 1,
    N_q: int = 1,
    Bc: int = 64,
    M: int | None = None,
    keep_trace: bool = True,
) -> Traffic:
    peak = fit_tiles("decode_fa2", _phases_stream(N_q, N, d, Bc), M)
    P, T = B * H_kv * group, cdiv(N, Bc)
    return traffic(
        {
            "Q": (P * N_q * d, 0),
            "K": (P * N * d, 0),
            "V": (P * N * d, 0),
            "O": (0, P * N_q * d),
            "L": (0, P * N_q),
        },
        peak,
        steps=P * T,
        events=P * (3 * T + 3),
    )


register("decode_fa2", _simulate_fa2, _closed_fa2)


# ---------------------------------------------------------------------------------
# Split-KV (FlashDecoding), GQA-packed; and the same over a paged cache
# ---------------------------------------------------------------------------------


def split_tiles(n_tiles: int, n_splits: int) -> list[int]:
    """Tiles of each of ``n_splits`` splits of ``n_tiles`` tiles: ceil(n_tiles /
    n_splits) each, the last non-empty one ragged, the rest 0."""
    n_tiles, n_splits = (
        check_count("n_tiles", n_tiles),
        check_count("n_splits", n_splits),
    )
    per = cdiv(n_tiles, n_splits)
    return [max(0, min(per, n_tiles - s * per)) for s in range(n_splits)]


def _phases_split(rows, N, d, bc, n_splits):
    phases = _phases_stream(rows, N, d, bc)
    if n_splits > 1:
        phases["the merge"] = {
            "acc": rows * d,
            "m, l": 2 * rows,
            "O_part, lse_part": rows * d + rows,
        }
    return phases


def _simulate_split_kv(
    name, B, H_kv, N, d, group, N_q, bc, n_splits, M, keep_trace, paged
):
    R = group * N_q  # the query rows that share one KV head, packed in one program
    fit_tiles(name, _phases_split(R, N, d, bc, n_splits), M)
    sim = HBMSim(M, keep_trace)
    cols = blocks(N, bc)
    counts = split_tiles(len(cols), n_splits)
    first = True
    for p in range(B * H_kv):
        start = 0
        for s, n_t in enumerate(counts):
            if n_t:
                sim.hold(2 * R * d + 2 * R, "q, acc, m and l")
            for j in range(start, start + n_t):
                if not first:
                    sim.next_step()
                first = False
                if j == start:
                    sim.load("Q", R * d, (p, s))
                sim.hold(
                    2 * cols[j] * d + R * cols[j], "q, acc, m, l, K_j, V_j and S_j"
                )
                if paged:
                    sim.load("block_table", 1, (p, j))
                sim.load("K", cols[j] * d, (p, j))
                sim.load("V", cols[j] * d, (p, j))
                sim.compute("S", (p, j))
                sim.release(2 * cols[j] * d + R * cols[j])
            if n_splits == 1:
                sim.store("O", R * d, (p,))
                sim.store("L", R, (p,))
            else:  # an empty split stores o = 0, lse = -inf without loading anything
                sim.store("O_part", R * d, (p, s))
                sim.store("lse_part", R, (p, s))
            if n_t:
                sim.release(2 * R * d + 2 * R)
            start += n_t
    if n_splits == 1:
        return sim.result()
    for p in range(B * H_kv):  # the merge kernel: one program per (sequence, KV head)
        sim.hold(R * d + 2 * R, "acc, m and l")
        for s in range(n_splits):
            sim.next_step()
            sim.hold(R * d + R, "acc, m, l, O_part and lse_part")
            sim.load("O_part", R * d, (p, s))
            sim.load("lse_part", R, (p, s))
            sim.compute("O", (p, s))
            sim.release(R * d + R)
        sim.store("O", R * d, (p,))
        sim.store("L", R, (p,))
        sim.release(R * d + 2 * R)
    return sim.result()


def _closed_split_kv(name, B, H_kv, N, d, group, N_q, bc, n_splits, M, paged):
    R = group * N_q
    peak = fit_tiles(name, _phases_split(R, N, d, bc, n_splits), M)
    P, T = B * H_kv, cdiv(N, bc)
    used = sum(1 for n_t in split_tiles(T, n_splits) if n_t)  # splits with keys
    per = {"Q": (P * used * R * d, 0), "K": (P * N * d, 0), "V": (P * N * d, 0)}
    if paged:
        per["block_table"] = (P * T, 0)
    tile_events = (4 if paged else 3) * T
    if n_splits == 1:
        per.update({"O": (0, P * R * d), "L": (0, P * R)})
        return traffic(per, peak, steps=P * T, events=P * (tile_events + 3))
    S = n_splits
    per.update(
        {
            "O_part": (P * S * R * d, P * S * R * d),
            "lse_part": (P * S * R, P * S * R),
            "O": (0, P * R * d),
            "L": (0, P * R),
        }
    )
    return traffic(
        per, peak, steps=P * (T + S), events=P * (used + tile_events + 5 * S + 2)
    )


def _simulate_split(
    B: int,
    H_kv: int,
    N: int,
    d: int,
    group: int = 1,
    N_q: int = 1,
    Bc: int = 64,
    n_splits: int = 1,
    M: int | None = None,
    keep_trace: bool = True,
) -> Traffic:
    """FlashDecoding, GQA-packed: partials per (sequence, KV head, split), then a merge
    per (sequence, KV head)."""
    return _simulate_split_kv(
        "decode_split",
        B,
        H_kv,
        N,
        d,
        group,
        N_q,
        Bc,
        n_splits,
        M,
        keep_trace,
        paged=False,
    )


def _closed_split(
    B: int,
    H_kv: int,
    N: int,
    d: int,
    group: int = 1,
    N_q: int = 1,
    Bc: int = 64,
    n_splits: int = 1,
    M: int | None = None,
    keep_trace: bool = True,
) -> Traffic:
    return _closed_split_kv(
        "decode_split", B, H_kv, N, d, group, N_q, Bc, n_splits, M, paged=False
    )


def _simulate_paged(
    B: int,
    H_kv: int,
    N: int,
    d: int,
    group: int = 1,
    N_q: int = 1,
    page_size: int = 16,
    n_splits: int = 1,
    M: int | None = None,
    keep_trace: bool = True,
) -> Traffic:
    """``decode_split`` over a paged cache: each tile is one page, found through one
    block-table entry (an int32)."""
    return _simulate_split_kv(
        "decode_paged",
        B,
        H_kv,
        N,
        d,
        group,
        N_q,
        page_size,
        n_splits,
        M,
        keep_trace,
        paged=True,
    )


def _closed_paged(
    B: int,
    H_kv: int,
    N: int,
    d: int,
    group: int = 1,
    N_q: int = 1,
    page_size: int = 16,
    n_splits: int = 1,
    M: int | None = None,
    keep_trace: bool = True,
) -> Traffic:
    return _closed_split_kv(
        "decode_paged", B, H_kv, N, d, group, N_q, page_size, n_splits, M, paged=True
    )


register("decode_split", _simulate_split, _closed_split)
register("decode_paged", _simulate_paged, _closed_paged)

DECODE = ["decode_naive", "decode_fa2", "decode_split", "decode_paged"]


# ---------------------------------------------------------------------------------
# The grid against the GPU, and real models' caches
# ---------------------------------------------------------------------------------


def grid_fill(programs: int, sms: int) -> float:
    """Fraction of SM time busy when ``programs`` equal programs run one per SM in
    waves: programs / (ceil(programs / sms) * sms)."""
    programs, sms = check_count("programs", programs), check_count("sms", sms)
    return programs / (cdiv(programs, sms) * sms)


def splits_to_fill(B: int, H_kv: int, sms: int) -> int:
    """The smallest split count whose B x H_kv x splits programs cover every SM."""
    return cdiv(
        check_count("sms", sms), check_count("B", B) * check_count("H_kv", H_kv)
    )


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """The attention shape of a published model: its cache holds 2 (K and V) x layers
    x H_kv x d numbers per token. ``layers``, ``H_q``, ``H_kv``, ``d`` are positive
    ints and H_kv divides H_q (each KV head serves a whole group of query heads)."""

    name: str
    layers: int
    H_q: int
    H_kv: int
    d: int
    cite: str  # references.bib key

    def __post_init__(self):
        for field in ("name", "cite"):
            if not isinstance(getattr(self, field), str):
                raise TypeError(
                    f"{field} must be a str, got {type(getattr(self, field)).__name__}"
                )
        for field in ("layers", "H_q", "H_kv", "d"):
            object.__setattr__(self, field, check_count(field, getattr(self, field)))
        if self.H_q % self.H_kv:
            raise ValueError(
                f"H_kv must divide H_q (grouped-query attention), got "
                f"H_q={self.H_q}, H_kv={self.H_kv}"
            )

    def kv_bytes_per_token(self, bytes_per_elem: int = 2) -> int:
        return (
            2
            * self.layers
            * self.H_kv
            * self.d
            * check_count("bytes_per_elem", bytes_per_elem)
        )

    @property
    def group(self) -> int:
        return self.H_q // self.H_kv


#: From the papers and model cards (``cite``): layers, query heads, KV heads, head dim.
MODELS: dict[str, ModelConfig] = {
    "Llama 2 7B": ModelConfig("Llama 2 7B", 32, 32, 32, 128, "touvron2023llama2"),
    "Llama 2 70B": ModelConfig("Llama 2 70B", 80, 64, 8, 128, "touvron2023llama2"),
    "Llama 3 8B": ModelConfig("Llama 3 8B", 32, 32, 8, 128, "grattafiori2024llama3"),
    "Llama 3 70B": ModelConfig("Llama 3 70B", 80, 64, 8, 128, "grattafiori2024llama3"),
    "Mistral 7B": ModelConfig("Mistral 7B", 32, 32, 8, 128, "jiang2023mistral"),
    "Falcon 7B": ModelConfig("Falcon 7B", 32, 71, 1, 64, "almazrouei2023falcon"),
    # the model that runs through the book (attention.pretrained.smollm2)
    "SmolLM2 135M": ModelConfig("SmolLM2 135M", 30, 9, 3, 64, "allal2025smollm2"),
}
