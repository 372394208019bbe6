"""The backward algorithms, tile by tile and in closed form: the standard backward (P
stored), FlashAttention-2's Algorithm 2 (P recomputed, dQ updated in HBM) and the
two-kernel backward of the Triton tutorial and ``kernels.flash``."""

from __future__ import annotations

from .sim import (
    HBMSim,
    Traffic,
    _check_args,
    blocks,
    cdiv,
    fit_tiles,
    register,
    traffic,
)

# ---------------------------------------------------------------------------------
# Standard backward (FlashAttention paper, Appendix B, Algorithm 3), P stored in HBM:
#   1. dV = P^T dO     2. dP = dO V^T     3. dS = P o (dP - rowsum(P o dP))
#   4. dQ = dS K       5. dK = dS^T Q      (the softmax scale folds into dS)
# ---------------------------------------------------------------------------------


def _phases_standard_bwd(N, n_k, d, Br, Bc):
    br, bc = min(Br, N), min(Bc, n_k)
    return {
        "step 1 (dV = P^T dO)": {"dV_j": bc * d, "P_ij": br * bc, "dO_i": br * d},
        "step 2 (dP = dO V^T)": {"dO_i": br * d, "V_j": bc * d, "dP_ij": br * bc},
        "step 3 (dS)": {"one row of P and of dP": 2 * n_k},
        "step 4 (dQ = dS K)": {"dQ_i": br * d, "dS_ij": br * bc, "K_j": bc * d},
        "step 5 (dK = dS^T Q)": {"dK_j": bc * d, "dS_ij": br * bc, "Q_i": br * d},
    }


def _simulate_standard_bwd(
    N: int,
    d: int,
    Br: int = 64,
    Bc: int = 64,
    M: int | None = None,
    N_k: int | None = None,
    keep_trace: bool = True,
) -> Traffic:
    """The standard backward: five passes, reading the P the forward
    stored (N x N_k)."""
    n_k = _check_args(N, d, Br, Bc, M, N_k)
    fit_tiles("standard_bwd", _phases_standard_bwd(N, n_k, d, Br, Bc), M)
    sim = HBMSim(M, keep_trace)
    rows, cols = blocks(N, Br), blocks(n_k, Bc)
    first = True

    def step():
        nonlocal first
        if not first:
            sim.next_step()
        first = False

    # 1. dV_j = sum_i P_ij^T dO_i: dV_j stays, P_ij and dO_i stream.
    for j, bc in enumerate(cols):
        sim.hold(bc * d, "dV_j")
        for i, br in enumerate(rows):
            step()
            sim.hold(br * bc + br * d, "dV_j, P_ij and dO_i")
            sim.load("P", br * bc, (i, j))
            sim.load("dO", br * d, (i,))
            sim.compute("dV", (i, j))
            sim.release(br * bc + br * d)
        sim.store("dV", bc * d, (j,))
        sim.release(bc * d)
    # 2. dP_ij = dO_i V_j^T: dO_i stays, V_j streams.
    for i, br in enumerate(rows):
        sim.hold(br * d, "dO_i")
        for j, bc in enumerate(cols):
            step()
            if j == 0:
                sim.load("dO", br * d, (i,))
            sim.hold(bc * d + br * bc, "dO_i, V_j and dP_ij")
            sim.load("V", bc * d, (j,))
            sim.compute("dP", (i, j))
            sim.store("dP", br * bc, (i, j))
            sim.release(bc * d + br * bc)
        sim.release(br * d)
    # 3. dS = P o (dP - rowsum(P o dP)), row by row (counted per block of Br rows).
    for i, br in enumerate(rows):
        step()
        sim.hold(2 * n_k, "one row of P and of dP")
        sim.load("P", br * n_k, (i,))
        sim.load("dP", br * n_k, (i,))
        sim.compute("dS", (i,))
        sim.store("dS", br * n_k, (i,))
        sim.release(2 * n_k)
    # 4. dQ_i = sum_j dS_ij K_j: dQ_i stays, dS_ij and K_j stream.
    for i, br in enumerate(rows):
        sim.hold(br * d, "dQ_i")
        for j, bc in enumerate(cols):
            step()
            sim.hold(br * bc + bc * d, "dQ_i, dS_ij and K_j")
            sim.load("dS", br * bc, (i, j))
            sim.load("K", bc * d, (j,))
            sim.compute("dQ", (i, j))
            sim.release(br * bc + bc * d)
        sim.store("dQ", br * d, (i,))
        sim.release(br * d)
    # 5. dK_j = sum_i dS_ij^T Q_i: dK_j stays, dS_ij and Q_i stream.
    for j, bc in enumerate(cols):
        sim.hold(bc * d, "dK_j")
        for i, br in enumerate(rows):
            step()
            sim.hold(br * bc + br * d, "dK_j, dS_ij and Q_i")
            sim.load("dS", br * bc, (i, j))
            sim.load("Q", br * d, (i,))
            sim.compute("dK", (i, j))
            sim.release(br * bc + br * d)
        sim.store("dK", bc * d, (j,))
        sim.release(bc * d)
    return sim.result()


def _closed_standard_bwd(
    N: int,
    d: int,
    Br: int = 64,
    Bc: int = 64,
    M: int | None = None,
    N_k: int | None = None,
    keep_trace: bool = True,
) -> Traffic:
    n_k = _check_args(N, d, Br, Bc, M, N_k)
    peak = fit_tiles("standard_bwd", _phases_standard_bwd(N, n_k, d, Br, Bc), M)
    t_r, t_c = cdiv(N, Br), cdiv(n_k, Bc)
    nn = N * n_k
    return traffic(
        {
            "P": (2 * nn, 0),  # steps 1 and 3
            "dO": (t_c * N * d + N * d, 0),  # step 1 (per key block) and step 2 (once)
            "dV": (0, n_k * d),
            "V": (t_r * n_k * d, 0),
            "dP": (nn, nn),
            "dS": (2 * nn, nn),  # written by step 3, read by steps 4 and 5
            "K": (t_r * n_k * d, 0),
            "dQ": (0, N * d),
            "Q": (t_c * N * d, 0),
            "dK": (0, n_k * d),
        },
        peak,
        steps=4 * t_r * t_c + t_r,
        events=12 * t_r * t_c + 2 * t_c + 6 * t_r,
    )


register("standard_bwd", _simulate_standard_bwd, _closed_standard_bwd)


# ---------------------------------------------------------------------------------
# FlashAttention-2 backward (Dao 2023, Algorithm 2): P recomputed from Q, K and L.
#   D = rowsum(dO o O), written to HBM; dQ = 0 written to HBM
#   for j: load K_j, V_j; dK_j = dV_j = 0 on chip
#     for i: load Q_i, dO_i, dQ_i, L_i, D_i
#       S_ij, P_ij = exp(S_ij - L_i), dV_j +=, dP_ij, dS_ij, dK_j += on chip;
#       dQ_i += dS_ij K_j, written back to HBM
#     write dK_j, dV_j
# The paper's inner-loop load also lists O_i; once D is precomputed no line uses it, so
# it is not loaded here (nor by the Triton tutorial's backward).
# ---------------------------------------------------------------------------------


def _phases_flash2_bwd(N, n_k, d, Br, Bc):
    br, bc = min(Br, N), min(Bc, n_k)
    return {
        "the D = rowsum(dO o O) pass": {"O_i, dO_i": 2 * br * d, "D_i": br},
        "the main loop": {
            "K_j, V_j, dK_j, dV_j": 4 * bc * d,
            "Q_i, dO_i, dQ_i": 3 * br * d,
            "L_i, D_i": 2 * br,
            "P_ij, dS_ij": 2 * br * bc,
        },
    }


def _preprocess_D(sim: HBMSim, rows: list[int], d: int) -> None:
    """D_i = rowsum(dO_i o O_i) for every query block, written to HBM."""
    for i, br in enumerate(rows):
        if i:
            sim.next_step()
        sim.hold(2 * br * d + br, "O_i, dO_i and D_i")
        sim.load("O", br * d, (i,))
        sim.load("dO", br * d, (i,))
        sim.compute("D", (i,))
        sim.store("D", br, (i,))
        sim.release(2 * br * d + br)


def _simulate_flash2_bwd(
    N: int,
    d: int,
    Br: int = 64,
    Bc: int = 64,
    M: int | None = None,
    N_k: int | None = None,
    keep_trace: bool = True,
) -> Traffic:
    """FlashAttention-2's Algorithm 2: K/V blocks outside,
    dQ_i updated in HBM per (j, i)."""
    n_k = _check_args(N, d, Br, Bc, M, N_k)
    fit_tiles("flash2_bwd", _phases_flash2_bwd(N, n_k, d, Br, Bc), M)
    sim = HBMSim(M, keep_trace)
    rows, cols = blocks(N, Br), blocks(n_k, Bc)
    _preprocess_D(sim, rows, d)
    sim.store("dQ", N * d)  # line 4: dQ = 0 in HBM
    for j, bc in enumerate(cols):
        sim.hold(4 * bc * d, "K_j, V_j, dK_j and dV_j")
        for i, br in enumerate(rows):
            sim.next_step()
            if i == 0:
                sim.load("K", bc * d, (j,))
                sim.load("V", bc * d, (j,))
            need = 3 * br * d + 2 * br + 2 * br * bc
            sim.hold(
                need, "K_j, V_j, dK_j, dV_j, Q_i, dO_i, dQ_i, L_i, D_i, P_ij and dS_ij"
            )
            sim.load("Q", br * d, (i,))
            sim.load("dO", br * d, (i,))
            sim.load("L", br, (i,))
            sim.load("D", br, (i,))
            sim.compute("P", (i, j))
            sim.load("dQ", br * d, (i,))
            sim.store("dQ", br * d, (i,))
            sim.release(need)
        sim.store("dK", bc * d, (j,))
        sim.store("dV", bc * d, (j,))
        sim.release(4 * bc * d)
    return sim.result()


def _closed_flash2_bwd(
    N: int,
    d: int,
    Br: int = 64,
    Bc: int = 64,
    M: int | None = None,
    N_k: int | None = None,
    keep_trace: bool = True,
) -> Traffic:
    n_k = _check_args(N, d, Br, Bc, M, N_k)
    peak = fit_tiles("flash2_bwd", _phases_flash2_bwd(N, n_k, d, Br, Bc), M)
    t_r, t_c = cdiv(N, Br), cdiv(n_k, Bc)
    return traffic(
        {
            "O": (N * d, 0),  # only for D
            "dO": (N * d + t_c * N * d, 0),
            "D": (t_c * N, N),
            # initialised, then read+written per j
            "dQ": (t_c * N * d, N * d + t_c * N * d),
            "K": (n_k * d, 0),
            "V": (n_k * d, 0),
            "Q": (t_c * N * d, 0),
            "L": (t_c * N, 0),
            "dK": (0, n_k * d),
            "dV": (0, n_k * d),
        },
        peak,
        steps=t_r + t_r * t_c,
        events=7 * t_r * t_c + 4 * t_c + 4 * t_r + 1,
    )


register("flash2_bwd", _simulate_flash2_bwd, _closed_flash2_bwd)


# ---------------------------------------------------------------------------------
# The two-kernel backward (Triton tutorial "Fused Attention"; kernels.flash):
#   D = rowsum(dO o O)
#   dK, dV: for j: keep K_j, V_j, dK_j, dV_j; for i: load Q_i, dO_i, L_i, D_i
#   dQ:     for i: keep Q_i, dO_i, dQ_i, L_i, D_i; for j: load K_j, V_j; write dQ_i once
# No read-modify-write of dQ (no atomics), at the price of computing S and dP twice.
# ---------------------------------------------------------------------------------


def _phases_flash2_bwd_split(N, n_k, d, Br, Bc):
    br, bc = min(Br, N), min(Bc, n_k)
    return {
        "the D = rowsum(dO o O) pass": {"O_i, dO_i": 2 * br * d, "D_i": br},
        "the dK, dV loop": {
            "K_j, V_j, dK_j, dV_j": 4 * bc * d,
            "Q_i, dO_i": 2 * br * d,
            "L_i, D_i": 2 * br,
            "P_ij, dS_ij": 2 * br * bc,
        },
        "the dQ loop": {
            "Q_i, dO_i, dQ_i": 3 * br * d,
            "L_i, D_i": 2 * br,
            "K_j, V_j": 2 * bc * d,
            "P_ij, dS_ij": 2 * br * bc,
        },
    }


def _simulate_flash2_bwd_split(
    N: int,
    d: int,
    Br: int = 64,
    Bc: int = 64,
    M: int | None = None,
    N_k: int | None = None,
    keep_trace: bool = True,
) -> Traffic:
    """The two-loop FlashAttention-2 backward: dK, dV by key blocks,
    then dQ by query blocks."""
    n_k = _check_args(N, d, Br, Bc, M, N_k)
    fit_tiles("flash2_bwd_split", _phases_flash2_bwd_split(N, n_k, d, Br, Bc), M)
    sim = HBMSim(M, keep_trace)
    rows, cols = blocks(N, Br), blocks(n_k, Bc)
    _preprocess_D(sim, rows, d)
    for j, bc in enumerate(cols):
        sim.hold(4 * bc * d, "K_j, V_j, dK_j and dV_j")
        for i, br in enumerate(rows):
            sim.next_step()
            if i == 0:
                sim.load("K", bc * d, (j,))
                sim.load("V", bc * d, (j,))
            need = 2 * br * d + 2 * br + 2 * br * bc
            sim.hold(need, "K_j, V_j, dK_j, dV_j, Q_i, dO_i, L_i, D_i, P_ij and dS_ij")
            sim.load("Q", br * d, (i,))
            sim.load("dO", br * d, (i,))
            sim.load("L", br, (i,))
            sim.load("D", br, (i,))
            sim.compute("P", (i, j))
            sim.release(need)
        sim.store("dK", bc * d, (j,))
        sim.store("dV", bc * d, (j,))
        sim.release(4 * bc * d)
    for i, br in enumerate(rows):
        sim.hold(3 * br * d + 2 * br, "Q_i, dO_i, dQ_i, L_i and D_i")
        for j, bc in enumerate(cols):
            sim.next_step()
            if j == 0:
                sim.load("Q", br * d, (i,))
                sim.load("dO", br * d, (i,))
                sim.load("L", br, (i,))
                sim.load("D", br, (i,))
            need = 2 * bc * d + 2 * br * bc
            sim.hold(need, "Q_i, dO_i, dQ_i, L_i, D_i, K_j, V_j, P_ij and dS_ij")
            sim.load("K", bc * d, (j,))
            sim.load("V", bc * d, (j,))
            sim.compute("dS", (i, j))
            sim.release(need)
        sim.store("dQ", br * d, (i,))
        sim.release(3 * br * d + 2 * br)
    return sim.result()


def _closed_flash2_bwd_split(
    N: int,
    d: int,
    Br: int = 64,
    Bc: int = 64,
    M: int | None = None,
    N_k: int | None = None,
    keep_trace: bool = True,
) -> Traffic:
    n_k = _check_args(N, d, Br, Bc, M, N_k)
    peak = fit_tiles("flash2_bwd_split", _phases_flash2_bwd_split(N, n_k, d, Br, Bc), M)
    t_r, t_c = cdiv(N, Br), cdiv(n_k, Bc)
    return traffic(
        {
            "O": (N * d, 0),
            "dO": (N * d + t_c * N * d + N * d, 0),  # D pass, dK/dV loop, dQ loop
            "D": (t_c * N + N, N),
            "K": (n_k * d + t_r * n_k * d, 0),
            "V": (n_k * d + t_r * n_k * d, 0),
            "Q": (t_c * N * d + N * d, 0),
            "L": (t_c * N + N, 0),
            "dK": (0, n_k * d),
            "dV": (0, n_k * d),
            "dQ": (0, N * d),
        },
        peak,
        steps=t_r + 2 * t_r * t_c,
        events=8 * t_r * t_c + 4 * t_c + 9 * t_r,
    )


register("flash2_bwd_split", _simulate_flash2_bwd_split, _closed_flash2_bwd_split)
