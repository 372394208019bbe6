"""The forward algorithms, tile by tile and in closed form: standard (materialising)
attention, FlashAttention-1 (Algorithm 1) and the FlashAttention-2 forward."""

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
# Standard (materialising) attention: the four steps, S and P round-trip through HBM.
#   1. load Q, K by blocks, compute S = Q K^T, write S to HBM
#   2. read S, compute P = softmax(S), write P to HBM
#   3. load P and V by blocks, compute O = P V, write O to HBM
#   4. return O
# ---------------------------------------------------------------------------------


def _phases_standard(N, n_k, d, Br, Bc):
    br, bc = min(Br, N), min(Bc, n_k)
    return {
        "step 1 (S = Q K^T)": {"Q_i": br * d, "K_j": bc * d, "S_ij": br * bc},
        "step 2 (P = softmax(S))": {"one row of S": n_k},
        "step 3 (O = P V)": {"O_i": br * d, "P_ij": br * bc, "V_j": bc * d},
    }


def _simulate_standard(
    N: int,
    d: int,
    Br: int = 64,
    Bc: int = 64,
    M: int | None = None,
    N_k: int | None = None,
    keep_trace: bool = True,
) -> Traffic:
    """Standard attention for N queries over N_k (default N) keys of head dim d.

    Step 1 keeps Q_i in SRAM while it streams every K_j (Q read once, K T_r times);
    step 2 softmaxes one row at a time; step 3 keeps the O_i accumulator while it
    streams P_ij and V_j (P read once, V T_r times).
    """
    n_k = _check_args(N, d, Br, Bc, M, N_k)
    fit_tiles("standard", _phases_standard(N, n_k, d, Br, Bc), M)
    sim = HBMSim(M, keep_trace)
    rows, cols = blocks(N, Br), blocks(n_k, Bc)
    # Step 1: S = Q K^T, one (Br x Bc) tile at a time;
    # Q_i stays for the whole row block.
    for i, br in enumerate(rows):
        sim.hold(br * d, "Q_i")
        for j, bc in enumerate(cols):
            if i or j:
                sim.next_step()
            if j == 0:
                sim.load("Q", br * d, (i,))
            sim.hold(bc * d + br * bc, "Q_i, K_j and S_ij")
            sim.load("K", bc * d, (j,))
            sim.compute("S", (i, j))
            sim.store("S", br * bc, (i, j))
            sim.release(bc * d + br * bc)
        sim.release(br * d)
    # Step 2: P = softmax(S), row by row (one row of N_k scores resident), counted per
    # block of Br rows.
    for i, br in enumerate(rows):
        sim.next_step()
        sim.hold(n_k, "one row of S")
        sim.load("S", br * n_k, (i,))
        sim.compute("P", (i,))
        sim.store("P", br * n_k, (i,))
        sim.release(n_k)
    # Step 3: O = P V, accumulating O_i in SRAM over the key blocks.
    for i, br in enumerate(rows):
        sim.hold(br * d, "O_i")
        for j, bc in enumerate(cols):
            sim.next_step()
            sim.hold(br * bc + bc * d, "O_i, P_ij and V_j")
            sim.load("P", br * bc, (i, j))
            sim.load("V", bc * d, (j,))
            sim.compute("O", (i, j))
            sim.release(br * bc + bc * d)
        sim.store("O", br * d, (i,))
        sim.release(br * d)
    return sim.result()


def _closed_standard(
    N: int,
    d: int,
    Br: int = 64,
    Bc: int = 64,
    M: int | None = None,
    N_k: int | None = None,
    keep_trace: bool = True,
) -> Traffic:
    n_k = _check_args(N, d, Br, Bc, M, N_k)
    peak = fit_tiles("standard", _phases_standard(N, n_k, d, Br, Bc), M)
    t_r, t_c = cdiv(N, Br), cdiv(n_k, Bc)
    return traffic(
        {
            "Q": (N * d, 0),  # once: Q_i stays in SRAM while K streams past
            "K": (t_r * n_k * d, 0),  # once per query block
            "S": (N * n_k, N * n_k),  # written by step 1, read by step 2
            "P": (N * n_k, N * n_k),  # written by step 2, read by step 3
            "V": (t_r * n_k * d, 0),
            "O": (0, N * d),
        },
        peak,
        steps=2 * t_r * t_c + t_r,
        events=6 * t_r * t_c + 5 * t_r,
    )


register("standard", _simulate_standard, _closed_standard)


# ---------------------------------------------------------------------------------
# FlashAttention-1, Algorithm 1 (Dao et al. 2022), line by line:
#   2: initialise O = 0, l = 0, m = -inf in HBM
#   5: for j in 1..T_c:  6: load K_j, V_j
#   7:   for i in 1..T_r:  8: load Q_i, O_i, l_i, m_i
#   9-11: S_ij, m~, P~, l~, m_new, l_new on chip
#   12-13: write O_i, l_i, m_i back to HBM
# ---------------------------------------------------------------------------------


def _phases_flash(N, n_k, d, Br, Bc):
    br, bc = min(Br, N), min(Bc, n_k)
    return {
        "the inner loop": {
            "K_j, V_j": 2 * bc * d,
            "Q_i, O_i": 2 * br * d,
            "m_i, l_i": 2 * br,
            "S_ij": br * bc,
        }
    }


def _simulate_flash1(
    N: int,
    d: int,
    Br: int = 64,
    Bc: int = 64,
    M: int | None = None,
    N_k: int | None = None,
    keep_trace: bool = True,
) -> Traffic:
    """FlashAttention-1's Algorithm 1: O, l and m live in HBM and are
    updated per (j, i)."""
    n_k = _check_args(N, d, Br, Bc, M, N_k)
    fit_tiles("flash1", _phases_flash(N, n_k, d, Br, Bc), M)
    sim = HBMSim(M, keep_trace)
    rows, cols = blocks(N, Br), blocks(n_k, Bc)
    sim.store("O", N * d)  # line 2: O = 0, l = 0, m = -inf written to HBM
    sim.store("l", N)
    sim.store("m", N)
    for j, bc in enumerate(cols):
        sim.hold(2 * bc * d, "K_j, V_j")
        for i, br in enumerate(rows):
            if i or j:
                sim.next_step()
            if i == 0:
                sim.load("K", bc * d, (j,))
                sim.load("V", bc * d, (j,))
            sim.hold(
                2 * br * d + 2 * br + br * bc, "K_j, V_j, Q_i, O_i, l_i, m_i and S_ij"
            )
            sim.load("Q", br * d, (i,))
            sim.load("O", br * d, (i,))
            sim.load("l", br, (i,))
            sim.load("m", br, (i,))
            sim.compute("S", (i, j))
            sim.store("O", br * d, (i,))
            sim.store("l", br, (i,))
            sim.store("m", br, (i,))
            sim.release(2 * br * d + 2 * br + br * bc)
        sim.release(2 * bc * d)
    return sim.result()


def _closed_flash1(
    N: int,
    d: int,
    Br: int = 64,
    Bc: int = 64,
    M: int | None = None,
    N_k: int | None = None,
    keep_trace: bool = True,
) -> Traffic:
    n_k = _check_args(N, d, Br, Bc, M, N_k)
    peak = fit_tiles("flash1", _phases_flash(N, n_k, d, Br, Bc), M)
    t_r, t_c = cdiv(N, Br), cdiv(n_k, Bc)
    return traffic(
        {
            "K": (n_k * d, 0),  # once: K_j, V_j stay for the whole inner loop
            "V": (n_k * d, 0),
            "Q": (t_c * N * d, 0),  # once per key block
            "O": (
                t_c * N * d,
                N * d + t_c * N * d,
            ),  # initialised, then read+written per j
            "l": (t_c * N, N + t_c * N),
            "m": (t_c * N, N + t_c * N),
        },
        peak,
        steps=t_r * t_c,
        events=8 * t_r * t_c + 2 * t_c + 3,
    )


register("flash1", _simulate_flash1, _closed_flash1)


# ---------------------------------------------------------------------------------
# FlashAttention-2 forward (Dao 2023, Algorithm 1): the loops swapped.
#   for i in 1..T_r: load Q_i; O_i, l_i, m_i start on chip
#     for j in 1..T_c: load K_j, V_j; update m_i, l_i, O_i on chip (O_i unnormalised)
#     O_i /= l_i; L_i = m_i + log l_i; write O_i, L_i
# ---------------------------------------------------------------------------------


def _simulate_flash2(
    N: int,
    d: int,
    Br: int = 64,
    Bc: int = 64,
    M: int | None = None,
    N_k: int | None = None,
    keep_trace: bool = True,
) -> Traffic:
    """FlashAttention-2's forward: Q_i, O_i, l_i, m_i stay on chip;
    O and L are written once."""
    n_k = _check_args(N, d, Br, Bc, M, N_k)
    fit_tiles("flash2", _phases_flash(N, n_k, d, Br, Bc), M)
    sim = HBMSim(M, keep_trace)
    rows, cols = blocks(N, Br), blocks(n_k, Bc)
    for i, br in enumerate(rows):
        sim.hold(2 * br * d + 2 * br, "Q_i, O_i, l_i and m_i")
        for j, bc in enumerate(cols):
            if i or j:
                sim.next_step()
            if j == 0:
                sim.load("Q", br * d, (i,))
            sim.hold(2 * bc * d + br * bc, "Q_i, O_i, l_i, m_i, K_j, V_j and S_ij")
            sim.load("K", bc * d, (j,))
            sim.load("V", bc * d, (j,))
            sim.compute("S", (i, j))
            sim.release(2 * bc * d + br * bc)
        sim.store("O", br * d, (i,))
        sim.store("L", br, (i,))
        sim.release(2 * br * d + 2 * br)
    return sim.result()


def _closed_flash2(
    N: int,
    d: int,
    Br: int = 64,
    Bc: int = 64,
    M: int | None = None,
    N_k: int | None = None,
    keep_trace: bool = True,
) -> Traffic:
    n_k = _check_args(N, d, Br, Bc, M, N_k)
    peak = fit_tiles("flash2", _phases_flash(N, n_k, d, Br, Bc), M)
    t_r, t_c = cdiv(N, Br), cdiv(n_k, Bc)
    return traffic(
        {
            "Q": (N * d, 0),
            "K": (t_r * n_k * d, 0),  # once per query block
            "V": (t_r * n_k * d, 0),
            "O": (0, N * d),
            "L": (0, N),
        },
        peak,
        steps=t_r * t_c,
        events=3 * t_r * t_c + 3 * t_r,
    )


register("flash2", _simulate_flash2, _closed_flash2)
