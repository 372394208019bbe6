"""Cost and memory traffic of dense, DAT (fused and unfused) and MSDA attention over an
image. Importing this module registers the algorithms ``dense-image``, ``dat``,
``dat-unfused`` and ``msda`` with ``attention.memory`` (simulator and closed form)."""

from __future__ import annotations

from .. import memory
from ..checks import check_int
from .sampling import CORNERS


def attention_cost(
    height: int,
    width: int,
    d_model: int,
    r: int = 8,
    n_levels: int = 4,
    n_points: int = 4,
) -> dict:
    """Keys (or samples) per query and multiply-adds of the attention itself, per
    variant.

    Dense attends to all H*W positions, DAT to ceil(H/r)*ceil(W/r) sampled keys (each
    read as four corners), MSDA to L*P points (each four corners, no keys: the weights
    are a softmax over the L*P samples of a linear map of the query). Counts for H*W
    queries; projections excluded. Every argument is a positive int.
    """
    height, width = check_int("height", height, 1), check_int("width", width, 1)
    d_model, r = check_int("d_model", d_model, 1), check_int("r", r, 1)
    n_levels = check_int("n_levels", n_levels, 1)
    n_points = check_int("n_points", n_points, 1)
    n = height * width
    n_s = -(-height // r) * -(-width // r)
    lp = n_levels * n_points
    return {
        "dense": {"keys": n, "macs": 2 * n * n * d_model},
        "dat": {
            "keys": n_s,
            "macs": 2 * n * n_s * d_model + 2 * CORNERS * n_s * d_model,
        },
        "msda": {"keys": lp, "macs": n * lp * (CORNERS + 1) * d_model},
    }


# --------------------------------------------------------------------------------------
# Memory traffic (per batch element and head; counts in elements, see attention.memory)
# --------------------------------------------------------------------------------------


def _sim_dense_image(
    height: int,
    width: int,
    d: int,
    Br: int = 64,
    Bc: int = 64,
    M: int | None = None,
    keep_trace: bool = True,
) -> memory.Traffic:
    """Fused (FlashAttention-style) dense attention of all H*W queries over all H*W
    keys."""
    n = height * width
    sim = memory.HBMSim(M, keep_trace)
    for i, br in enumerate(memory.blocks(n, Br)):
        sim.step = i
        sim.hold(br * d * 2, "the Q tile and the O accumulator")
        sim.load("Q", br * d, (i,))
        for j, bc in enumerate(memory.blocks(n, Bc)):
            sim.hold(2 * bc * d, "K and V tiles")
            sim.load("K", bc * d, (j,))
            sim.load("V", bc * d, (j,))
            sim.release(2 * bc * d)
        sim.store("O", br * d, (i,))
        sim.release(br * d * 2)
    return sim.result()


def _closed_dense_image(
    height: int,
    width: int,
    d: int,
    Br: int = 64,
    Bc: int = 64,
    M: int | None = None,
    keep_trace: bool = True,
) -> memory.Traffic:
    n = height * width
    peak = memory.fit_tiles(
        "dense-image",
        {
            "the loop over K, V": {
                "Q_i, O_i": 2 * min(Br, n) * d,
                "K_j, V_j": 2 * min(Bc, n) * d,
            }
        },
        M,
    )
    t_r, t_c = memory.cdiv(n, Br), memory.cdiv(n, Bc)
    return memory.traffic(
        {
            "Q": (n * d, 0),
            "K": (t_r * n * d, 0),
            "V": (t_r * n * d, 0),
            "O": (0, n * d),
        },
        peak,
        steps=t_r,
        events=2 * t_r * t_c + 2 * t_r,
    )


def _sim_dat(
    height: int,
    width: int,
    d: int,
    r: int = 8,
    Br: int = 64,
    Bc: int = 64,
    M: int | None = None,
    keep_trace: bool = True,
) -> memory.Traffic:
    """Fused DAT: every query block gathers the four corners of each sample from the K
    and V maps inside its loop; sampled keys are never written."""
    n = height * width
    n_s = -(-height // r) * -(-width // r)
    sim = memory.HBMSim(M, keep_trace)
    for i, br in enumerate(memory.blocks(n, Br)):
        sim.step = i
        sim.hold(br * d * 2, "the Q tile and the O accumulator")
        sim.load("Q", br * d, (i,))
        for j, bc in enumerate(memory.blocks(n_s, Bc)):
            sim.hold(2 * bc + 2 * bc * d, "points and sampled K, V tiles")
            sim.load("points", 2 * bc, (j,))
            sim.load("K", CORNERS * bc * d, (j,))  # four corners per sample
            sim.load("V", CORNERS * bc * d, (j,))
            sim.release(2 * bc + 2 * bc * d)
        sim.store("O", br * d, (i,))
        sim.release(br * d * 2)
    return sim.result()


def _closed_dat(
    height: int,
    width: int,
    d: int,
    r: int = 8,
    Br: int = 64,
    Bc: int = 64,
    M: int | None = None,
    keep_trace: bool = True,
) -> memory.Traffic:
    n = height * width
    n_s = -(-height // r) * -(-width // r)
    bc = min(Bc, n_s)
    peak = memory.fit_tiles(
        "dat",
        {
            "the loop over samples": {
                "Q_i, O_i": 2 * min(Br, n) * d,
                "points": 2 * bc,
                "sampled K_j, V_j": 2 * bc * d,
            }
        },
        M,
    )
    t_r, t_s = memory.cdiv(n, Br), memory.cdiv(n_s, Bc)
    return memory.traffic(
        {
            "Q": (n * d, 0),
            "points": (t_r * 2 * n_s, 0),
            "K": (t_r * CORNERS * n_s * d, 0),
            "V": (t_r * CORNERS * n_s * d, 0),
            "O": (0, n * d),
        },
        peak,
        steps=t_r,
        events=3 * t_r * t_s + 2 * t_r,
    )


def _sim_dat_unfused(
    height: int,
    width: int,
    d: int,
    r: int = 8,
    Br: int = 64,
    Bc: int = 64,
    M: int | None = None,
    keep_trace: bool = True,
) -> memory.Traffic:
    """grid_sample writes the sampled K̃, Ṽ to HBM; fused attention then reads them
    back."""
    n = height * width
    n_s = -(-height // r) * -(-width // r)
    sim = memory.HBMSim(M, keep_trace)
    sim.step = 0
    for j, bc in enumerate(memory.blocks(n_s, Bc)):  # 1. grid_sample
        sim.hold(2 * bc + 2 * bc * d, "points and sampled K, V tiles")
        sim.load("points", 2 * bc, (j,))
        sim.load("K", CORNERS * bc * d, (j,))
        sim.load("V", CORNERS * bc * d, (j,))
        sim.store("K̃", bc * d, (j,))
        sim.store("Ṽ", bc * d, (j,))
        sim.release(2 * bc + 2 * bc * d)
    for i, br in enumerate(memory.blocks(n, Br)):  # 2. attention over the N_s samples
        sim.step = i + 1
        sim.hold(br * d * 2, "the Q tile and the O accumulator")
        sim.load("Q", br * d, (i,))
        for j, bc in enumerate(memory.blocks(n_s, Bc)):
            sim.hold(2 * bc * d, "K̃ and Ṽ tiles")
            sim.load("K̃", bc * d, (j,))
            sim.load("Ṽ", bc * d, (j,))
            sim.release(2 * bc * d)
        sim.store("O", br * d, (i,))
        sim.release(br * d * 2)
    return sim.result()


def _closed_dat_unfused(
    height: int,
    width: int,
    d: int,
    r: int = 8,
    Br: int = 64,
    Bc: int = 64,
    M: int | None = None,
    keep_trace: bool = True,
) -> memory.Traffic:
    n = height * width
    n_s = -(-height // r) * -(-width // r)
    bc = min(Bc, n_s)
    peak = memory.fit_tiles(
        "dat-unfused",
        {
            "grid_sample": {"points": 2 * bc, "sampled K_j, V_j": 2 * bc * d},
            "the attention over the samples": {
                "Q_i, O_i": 2 * min(Br, n) * d,
                "K̃_j, Ṽ_j": 2 * bc * d,
            },
        },
        M,
    )
    t_r, t_s = memory.cdiv(n, Br), memory.cdiv(n_s, Bc)
    return memory.traffic(
        {
            "Q": (n * d, 0),
            "points": (2 * n_s, 0),
            "K": (CORNERS * n_s * d, 0),
            "V": (CORNERS * n_s * d, 0),
            "K̃": (t_r * n_s * d, n_s * d),
            "Ṽ": (t_r * n_s * d, n_s * d),
            "O": (0, n * d),
        },
        peak,
        steps=t_r + 1,
        events=5 * t_s + 2 * t_r * t_s + 2 * t_r,
    )


def _sim_msda(
    n_queries: int,
    d: int,
    n_levels: int = 4,
    n_points: int = 4,
    Bq: int = 64,
    M: int | None = None,
    keep_trace: bool = True,
) -> memory.Traffic:
    """MSDA: each query reads its L*P locations and weights and four corners per
    sample."""
    lp = n_levels * n_points
    sim = memory.HBMSim(M, keep_trace)
    for i, bq in enumerate(memory.blocks(n_queries, Bq)):
        sim.step = i
        sim.hold(
            bq * d + 3 * bq, "the accumulator, one location and one weight per query"
        )
        for _ in range(lp):
            sim.load("points", 2 * bq, (i,))
            sim.load("P", bq, (i,))  # attention weights
            sim.load("V", CORNERS * bq * d, (i,))
        sim.store("O", bq * d, (i,))
        sim.release(bq * d + 3 * bq)
    return sim.result()


def _closed_msda(
    n_queries: int,
    d: int,
    n_levels: int = 4,
    n_points: int = 4,
    Bq: int = 64,
    M: int | None = None,
    keep_trace: bool = True,
) -> memory.Traffic:
    lp = n_levels * n_points
    bq = min(Bq, n_queries)
    peak = memory.fit_tiles(
        "msda",
        {
            "the loop over samples": {
                "the O accumulator": bq * d,
                "one location and one weight per query": 3 * bq,
            }
        },
        M,
    )
    t_q = memory.cdiv(n_queries, Bq)
    return memory.traffic(
        {
            "points": (2 * n_queries * lp, 0),
            "P": (n_queries * lp, 0),
            "V": (CORNERS * n_queries * lp * d, 0),
            "O": (0, n_queries * d),
        },
        peak,
        steps=t_q,
        events=t_q * (3 * lp + 1),
    )


memory.register("dense-image", _sim_dense_image, _closed_dense_image)
memory.register("dat", _sim_dat, _closed_dat)
memory.register("dat-unfused", _sim_dat_unfused, _closed_dat_unfused)
memory.register("msda", _sim_msda, _closed_msda)
