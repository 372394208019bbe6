"""A simulated GPU memory hierarchy: tensors live in HBM, tiles are loaded into an SRAM of
fixed capacity, and every load and store is counted (elements, per tensor, in order).

Each algorithm is written block by block against ``HBMSim`` and has a closed form
beside it that gives exactly the same counts from a formula, for every N, d, Br, Bc
(ragged last blocks included). Counts are in *elements*; multiply by the dtype's size
for bytes (``Traffic.bytes``). Registered algorithms (``algorithms()``):

``standard``          the four steps of standard attention: S and P go to HBM and back.
``flash1``            FlashAttention-1, Algorithm 1: K/V blocks outside, Q blocks inside;
                      O, l, m are read and re-written in HBM for every (j, i).
``flash2``            FlashAttention-2 forward: Q blocks outside; O and L written once.
``standard_bwd``      the standard backward: reads the stored P, writes dP and dS.
``flash2_bwd``        FlashAttention-2, Algorithm 2: recomputes P from Q, K and L;
                      dQ is read-modified-written in HBM for every (j, i).
``flash2_bwd_split``  the two-kernel backward of the Triton tutorial (and kernels/flash.py):
                      one loop writes dK, dV; a second loop over Q blocks writes dQ once.

The model, stated once (it is the same for every algorithm, so comparisons are fair):

* N queries attend to N_k keys (``N_k=None``: N_k = N) of head dim d; T_r = ceil(N/Br)
  query blocks, T_c = ceil(N_k/Bc) key blocks; the last block of each may be ragged.
* A matrix product runs the loop order its algorithm states. In a loop nest, the block
  of the outer loop is loaded once per outer step and stays in SRAM; the blocks of the
  inner loop are re-loaded at every inner step. So the standard step S = Q K^T reads Q
  once and K T_r times, exactly as FlashAttention-2 does: the only difference between
  the two forwards is the N x N round trips of S and P.
* Row-wise passes (softmax, dS = P o (dP - rowsum(P o dP))) hold one row (N_k elements)
  at a time and read and write each element once.
* "SRAM" is all on-chip storage (shared memory and registers): a tile is resident while
  the loop that uses it runs. Capacity ``M`` is in elements; ``M=None`` is unbounded.
  Tiles that do not fit raise ValueError saying what they need and what M holds.
* Nothing else is modelled: no caches (L2), no bank conflicts, no causal tile skipping,
  no dropout, no masking kernels, no fp32 accumulator buffers.

With T_r = 1 (all of Q resident) the standard forward moves exactly 4 N d + 4 N^2
elements, the count in the FlashAttention paper's analysis; in general it moves
2 N d + 2 T_r N_k d + 4 N N_k. The flash forwards move
    flash1: 2 N_k d + T_c (3 N d + 4 N) + (N d + 2 N)   (the last term: O, l, m initialised)
    flash2: 2 N d + N + 2 T_r N_k d.

Chapter modules register their own algorithms with ``register`` (e.g. hard and top-k
attention in ``attention.hard``), so ``simulate(name, ...)`` and ``closed_form(name, ...)``
reach every algorithm in the book. The roofline helpers at the end (``GPUS``,
``roofline_ms``) turn counts into time ESTIMATES from published peak numbers; they
measure nothing.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable


@dataclasses.dataclass(frozen=True)
class Transfer:
    """One event of a schedule: a tile crossing the HBM <-> SRAM boundary, or on-chip work.

    ``op`` is "load" (HBM -> SRAM), "store" (SRAM -> HBM) or "compute" (a tile produced
    on chip; it moves nothing and is not counted). ``step`` numbers the compute events:
    the loads of step s come before its compute event, its stores after.
    """

    op: str
    tensor: str  # "Q", "K", "V", "S", "P", "O", "l", "m", "L", "dO", ...
    elems: int
    block: tuple = ()  # (i,) a query-row block, (j,) a key block, (i, j) a tile of S
    step: int = 0


@dataclasses.dataclass
class Traffic:
    """Result of a simulation or a closed form: HBM reads and writes, in elements."""

    reads: int
    writes: int
    per_tensor: dict  # name -> (reads, writes)
    trace: list = dataclasses.field(default_factory=list)
    sram_peak: int | None = None  # most elements resident in SRAM at once
    steps: int | None = None  # compute steps of the schedule (simulations only)

    @property
    def total(self) -> int:
        return self.reads + self.writes

    def bytes(self, bytes_per_elem: int = 2) -> int:
        return self.total * bytes_per_elem


class HBMSim:
    """Counts every element moved between HBM and an SRAM of ``capacity`` elements.

    ``load``/``store`` count traffic; ``hold``/``release`` track what is resident in
    SRAM so that a tiling that does not fit raises ValueError saying what it needs.
    ``compute`` marks a tile produced on chip (trace only) and ends the current step.
    """

    def __init__(self, capacity: int | None = None, keep_trace: bool = True):
        self.capacity = capacity
        self.keep_trace = keep_trace
        self.reads: dict[str, int] = {}
        self.writes: dict[str, int] = {}
        self.trace: list[Transfer] = []
        self.resident = 0
        self.peak = 0
        self.step = 0

    def load(self, tensor: str, elems: int, block: tuple = ()) -> None:
        self.reads[tensor] = self.reads.get(tensor, 0) + elems
        if self.keep_trace:
            self.trace.append(Transfer("load", tensor, elems, block, self.step))

    def store(self, tensor: str, elems: int, block: tuple = ()) -> None:
        self.writes[tensor] = self.writes.get(tensor, 0) + elems
        if self.keep_trace:
            self.trace.append(Transfer("store", tensor, elems, block, self.step))

    def compute(self, tensor: str, block: tuple = ()) -> None:
        """Record that ``tensor``'s ``block`` was produced on chip at the current step."""
        if self.keep_trace:
            self.trace.append(Transfer("compute", tensor, 0, block, self.step))

    def next_step(self) -> None:
        self.step += 1

    def hold(self, elems: int, what: str = "tiles") -> None:
        self.resident += elems
        if self.resident > self.peak:
            self.peak = self.resident
        if self.capacity is not None and self.resident > self.capacity:
            raise ValueError(
                f"{what} need {self.resident} elements of SRAM but M holds {self.capacity}"
            )

    def release(self, elems: int) -> None:
        self.resident -= elems

    def result(self) -> Traffic:
        names = list(dict.fromkeys([*self.reads, *self.writes]))
        per = {n: (self.reads.get(n, 0), self.writes.get(n, 0)) for n in names}
        return Traffic(
            reads=sum(self.reads.values()),
            writes=sum(self.writes.values()),
            per_tensor=per,
            trace=self.trace,
            sram_peak=self.peak,
            steps=self.step + 1,
        )


def traffic(per_tensor: dict, sram_peak: int | None = None) -> Traffic:
    """Build a Traffic from a {tensor: (reads, writes)} dict (used by closed forms)."""
    per = {k: (int(r), int(w)) for k, (r, w) in per_tensor.items() if r or w}
    return Traffic(
        reads=sum(r for r, _ in per.values()), writes=sum(w for _, w in per.values()),
        per_tensor=per, sram_peak=sram_peak,
    )


# name -> (simulate_fn, closed_form_fn); both take the same keyword arguments.
_ALGORITHMS: dict[str, tuple[Callable[..., Traffic], Callable[..., Traffic]]] = {}


def register(name: str, simulate_fn: Callable[..., Traffic],
             closed_form_fn: Callable[..., Traffic]) -> None:
    """Make ``simulate(name, ...)`` and ``closed_form(name, ...)`` reach an algorithm."""
    _ALGORITHMS[name] = (simulate_fn, closed_form_fn)


def algorithms() -> list[str]:
    return sorted(_ALGORITHMS)


def _lookup(name: str):
    if name not in _ALGORITHMS:
        raise ValueError(f"unknown algorithm {name!r}; known: {', '.join(algorithms())}")
    return _ALGORITHMS[name]


def simulate(algorithm: str, *args, **kwargs) -> Traffic:
    """Run ``algorithm`` tile by tile against a simulated HBM/SRAM and count every transfer.

    For this module's algorithms: ``simulate(algorithm, N, d, Br=64, Bc=64, M=None,
    N_k=None, keep_trace=True)``. ``keep_trace=False`` skips the ordered trace (faster).
    """
    return _lookup(algorithm)[0](*args, **kwargs)


def closed_form(algorithm: str, *args, **kwargs) -> Traffic:
    """The same reads, writes, per-tensor counts and SRAM peak as ``simulate``, from a formula."""
    return _lookup(algorithm)[1](*args, **kwargs)


# ---------------------------------------------------------------------------------
# Shared helpers: argument checks, ragged blocks, SRAM budgets.
# ---------------------------------------------------------------------------------


def _check_args(N, d, Br, Bc, M, N_k) -> int:
    for name, val in (("N", N), ("d", d), ("Br", Br), ("Bc", Bc)):
        if isinstance(val, bool) or not isinstance(val, int) or val < 1:
            raise ValueError(f"{name} must be a positive int, got {val!r}")
    if M is not None and (isinstance(M, bool) or not isinstance(M, int) or M < 1):
        raise ValueError(f"M (SRAM capacity in elements) must be a positive int or None, "
                         f"got {M!r}")
    n_k = N if N_k is None else N_k
    if isinstance(n_k, bool) or not isinstance(n_k, int) or n_k < 1:
        raise ValueError(f"N_k must be a positive int or None, got {N_k!r}")
    return n_k


def _blocks(n: int, b: int) -> list[int]:
    """Sizes of the blocks of a length-n axis cut into blocks of b (the last may be ragged)."""
    return [b] * (n // b) + ([n % b] if n % b else [])


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for positive ints."""
    return -(-a // b)


def _fit(algorithm: str, phases: dict[str, dict[str, int]], M: int | None) -> int:
    """Peak SRAM need over an algorithm's phases; ValueError naming the tiles if > M.

    ``phases`` maps a phase name to {tile description: elements} at the largest blocks.
    """
    needs = {ph: sum(parts.values()) for ph, parts in phases.items()}
    peak = max(needs.values())
    if M is not None and peak > M:
        ph = max(needs, key=needs.get)
        parts = " + ".join(f"{k} ({v})" for k, v in phases[ph].items())
        raise ValueError(f"{algorithm}: the tiles of {ph} need {parts} = {peak} elements of "
                         f"SRAM, but M holds {M}; choose smaller Br/Bc or a larger M")
    return peak


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


def _simulate_standard(N: int, d: int, Br: int = 64, Bc: int = 64, M: int | None = None,
                       N_k: int | None = None, keep_trace: bool = True) -> Traffic:
    """Standard attention for N queries over N_k (default N) keys of head dim d.

    Step 1 keeps Q_i in SRAM while it streams every K_j (Q read once, K T_r times);
    step 2 softmaxes one row at a time; step 3 keeps the O_i accumulator while it
    streams P_ij and V_j (P read once, V T_r times).
    """
    n_k = _check_args(N, d, Br, Bc, M, N_k)
    _fit("standard", _phases_standard(N, n_k, d, Br, Bc), M)
    sim = HBMSim(M, keep_trace)
    rows, cols = _blocks(N, Br), _blocks(n_k, Bc)
    # Step 1: S = Q K^T, one (Br x Bc) tile at a time; Q_i stays for the whole row block.
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


def _closed_standard(N: int, d: int, Br: int = 64, Bc: int = 64, M: int | None = None,
                     N_k: int | None = None, keep_trace: bool = True) -> Traffic:
    n_k = _check_args(N, d, Br, Bc, M, N_k)
    peak = _fit("standard", _phases_standard(N, n_k, d, Br, Bc), M)
    t_r = cdiv(N, Br)
    return traffic({
        "Q": (N * d, 0),  # once: Q_i stays in SRAM while K streams past
        "K": (t_r * n_k * d, 0),  # once per query block
        "S": (N * n_k, N * n_k),  # written by step 1, read by step 2
        "P": (N * n_k, N * n_k),  # written by step 2, read by step 3
        "V": (t_r * n_k * d, 0),
        "O": (0, N * d),
    }, peak)


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
    return {"the inner loop": {"K_j, V_j": 2 * bc * d, "Q_i, O_i": 2 * br * d,
                               "m_i, l_i": 2 * br, "S_ij": br * bc}}


def _simulate_flash1(N: int, d: int, Br: int = 64, Bc: int = 64, M: int | None = None,
                     N_k: int | None = None, keep_trace: bool = True) -> Traffic:
    """FlashAttention-1's Algorithm 1: O, l and m live in HBM and are updated per (j, i)."""
    n_k = _check_args(N, d, Br, Bc, M, N_k)
    _fit("flash1", _phases_flash(N, n_k, d, Br, Bc), M)
    sim = HBMSim(M, keep_trace)
    rows, cols = _blocks(N, Br), _blocks(n_k, Bc)
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
            sim.hold(2 * br * d + 2 * br + br * bc, "K_j, V_j, Q_i, O_i, l_i, m_i and S_ij")
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


def _closed_flash1(N: int, d: int, Br: int = 64, Bc: int = 64, M: int | None = None,
                   N_k: int | None = None, keep_trace: bool = True) -> Traffic:
    n_k = _check_args(N, d, Br, Bc, M, N_k)
    peak = _fit("flash1", _phases_flash(N, n_k, d, Br, Bc), M)
    t_c = cdiv(n_k, Bc)
    return traffic({
        "K": (n_k * d, 0),  # once: K_j, V_j stay for the whole inner loop
        "V": (n_k * d, 0),
        "Q": (t_c * N * d, 0),  # once per key block
        "O": (t_c * N * d, N * d + t_c * N * d),  # initialised, then read+written per j
        "l": (t_c * N, N + t_c * N),
        "m": (t_c * N, N + t_c * N),
    }, peak)


register("flash1", _simulate_flash1, _closed_flash1)


# ---------------------------------------------------------------------------------
# FlashAttention-2 forward (Dao 2023, Algorithm 1): the loops swapped.
#   for i in 1..T_r: load Q_i; O_i, l_i, m_i start on chip
#     for j in 1..T_c: load K_j, V_j; update m_i, l_i, O_i on chip (O_i unnormalised)
#     O_i /= l_i; L_i = m_i + log l_i; write O_i, L_i
# ---------------------------------------------------------------------------------


def _simulate_flash2(N: int, d: int, Br: int = 64, Bc: int = 64, M: int | None = None,
                     N_k: int | None = None, keep_trace: bool = True) -> Traffic:
    """FlashAttention-2's forward: Q_i, O_i, l_i, m_i stay on chip; O and L are written once."""
    n_k = _check_args(N, d, Br, Bc, M, N_k)
    _fit("flash2", _phases_flash(N, n_k, d, Br, Bc), M)
    sim = HBMSim(M, keep_trace)
    rows, cols = _blocks(N, Br), _blocks(n_k, Bc)
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


def _closed_flash2(N: int, d: int, Br: int = 64, Bc: int = 64, M: int | None = None,
                   N_k: int | None = None, keep_trace: bool = True) -> Traffic:
    n_k = _check_args(N, d, Br, Bc, M, N_k)
    peak = _fit("flash2", _phases_flash(N, n_k, d, Br, Bc), M)
    t_r = cdiv(N, Br)
    return traffic({
        "Q": (N * d, 0),
        "K": (t_r * n_k * d, 0),  # once per query block
        "V": (t_r * n_k * d, 0),
        "O": (0, N * d),
        "L": (0, N),
    }, peak)


register("flash2", _simulate_flash2, _closed_flash2)


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


def _simulate_standard_bwd(N: int, d: int, Br: int = 64, Bc: int = 64, M: int | None = None,
                           N_k: int | None = None, keep_trace: bool = True) -> Traffic:
    """The standard backward: five passes, reading the P the forward stored (N x N_k)."""
    n_k = _check_args(N, d, Br, Bc, M, N_k)
    _fit("standard_bwd", _phases_standard_bwd(N, n_k, d, Br, Bc), M)
    sim = HBMSim(M, keep_trace)
    rows, cols = _blocks(N, Br), _blocks(n_k, Bc)
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


def _closed_standard_bwd(N: int, d: int, Br: int = 64, Bc: int = 64, M: int | None = None,
                         N_k: int | None = None, keep_trace: bool = True) -> Traffic:
    n_k = _check_args(N, d, Br, Bc, M, N_k)
    peak = _fit("standard_bwd", _phases_standard_bwd(N, n_k, d, Br, Bc), M)
    t_r, t_c = cdiv(N, Br), cdiv(n_k, Bc)
    nn = N * n_k
    return traffic({
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
    }, peak)


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
        "the main loop": {"K_j, V_j, dK_j, dV_j": 4 * bc * d, "Q_i, dO_i, dQ_i": 3 * br * d,
                          "L_i, D_i": 2 * br, "P_ij, dS_ij": 2 * br * bc},
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


def _simulate_flash2_bwd(N: int, d: int, Br: int = 64, Bc: int = 64, M: int | None = None,
                         N_k: int | None = None, keep_trace: bool = True) -> Traffic:
    """FlashAttention-2's Algorithm 2: K/V blocks outside, dQ_i updated in HBM per (j, i)."""
    n_k = _check_args(N, d, Br, Bc, M, N_k)
    _fit("flash2_bwd", _phases_flash2_bwd(N, n_k, d, Br, Bc), M)
    sim = HBMSim(M, keep_trace)
    rows, cols = _blocks(N, Br), _blocks(n_k, Bc)
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
            sim.hold(need, "K_j, V_j, dK_j, dV_j, Q_i, dO_i, dQ_i, L_i, D_i, P_ij and dS_ij")
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


def _closed_flash2_bwd(N: int, d: int, Br: int = 64, Bc: int = 64, M: int | None = None,
                       N_k: int | None = None, keep_trace: bool = True) -> Traffic:
    n_k = _check_args(N, d, Br, Bc, M, N_k)
    peak = _fit("flash2_bwd", _phases_flash2_bwd(N, n_k, d, Br, Bc), M)
    t_c = cdiv(n_k, Bc)
    return traffic({
        "O": (N * d, 0),  # only for D
        "dO": (N * d + t_c * N * d, 0),
        "D": (t_c * N, N),
        "dQ": (t_c * N * d, N * d + t_c * N * d),  # initialised, then read+written per j
        "K": (n_k * d, 0),
        "V": (n_k * d, 0),
        "Q": (t_c * N * d, 0),
        "L": (t_c * N, 0),
        "dK": (0, n_k * d),
        "dV": (0, n_k * d),
    }, peak)


register("flash2_bwd", _simulate_flash2_bwd, _closed_flash2_bwd)


# ---------------------------------------------------------------------------------
# The two-kernel backward (Triton tutorial "Fused Attention"; kernels/flash.py):
#   D = rowsum(dO o O)
#   dK, dV: for j: keep K_j, V_j, dK_j, dV_j; for i: load Q_i, dO_i, L_i, D_i
#   dQ:     for i: keep Q_i, dO_i, dQ_i, L_i, D_i; for j: load K_j, V_j; write dQ_i once
# No read-modify-write of dQ (no atomics), at the price of computing S and dP twice.
# ---------------------------------------------------------------------------------


def _phases_flash2_bwd_split(N, n_k, d, Br, Bc):
    br, bc = min(Br, N), min(Bc, n_k)
    return {
        "the D = rowsum(dO o O) pass": {"O_i, dO_i": 2 * br * d, "D_i": br},
        "the dK, dV loop": {"K_j, V_j, dK_j, dV_j": 4 * bc * d, "Q_i, dO_i": 2 * br * d,
                            "L_i, D_i": 2 * br, "P_ij, dS_ij": 2 * br * bc},
        "the dQ loop": {"Q_i, dO_i, dQ_i": 3 * br * d, "L_i, D_i": 2 * br,
                        "K_j, V_j": 2 * bc * d, "P_ij, dS_ij": 2 * br * bc},
    }


def _simulate_flash2_bwd_split(N: int, d: int, Br: int = 64, Bc: int = 64,
                               M: int | None = None, N_k: int | None = None,
                               keep_trace: bool = True) -> Traffic:
    """The two-loop FlashAttention-2 backward: dK, dV by key blocks, then dQ by query blocks."""
    n_k = _check_args(N, d, Br, Bc, M, N_k)
    _fit("flash2_bwd_split", _phases_flash2_bwd_split(N, n_k, d, Br, Bc), M)
    sim = HBMSim(M, keep_trace)
    rows, cols = _blocks(N, Br), _blocks(n_k, Bc)
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


def _closed_flash2_bwd_split(N: int, d: int, Br: int = 64, Bc: int = 64,
                             M: int | None = None, N_k: int | None = None,
                             keep_trace: bool = True) -> Traffic:
    n_k = _check_args(N, d, Br, Bc, M, N_k)
    peak = _fit("flash2_bwd_split", _phases_flash2_bwd_split(N, n_k, d, Br, Bc), M)
    t_r, t_c = cdiv(N, Br), cdiv(n_k, Bc)
    return traffic({
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
    }, peak)


register("flash2_bwd_split", _simulate_flash2_bwd_split, _closed_flash2_bwd_split)


# ---------------------------------------------------------------------------------
# Block sizes, FLOPs and the roofline model.
# ---------------------------------------------------------------------------------


def fa1_block_sizes(M: int, d: int) -> tuple[int, int]:
    """FlashAttention-1's rule (Algorithm 1, line 1): Bc = ceil(M/4d), Br = min(ceil(M/4d), d).

    Returns (Br, Bc). The rule sizes Q_i, K_j, V_j, O_i to about M/4 each; its constants
    are the paper's big-O ones, so with S_ij and l, m the tiles can exceed M slightly
    (``sram_need`` says by how much).
    """
    if M < 1 or d < 1:
        raise ValueError(f"M and d must be positive, got M={M}, d={d}")
    bc = cdiv(M, 4 * d)
    return min(bc, d), bc


def sram_need(algorithm: str, N: int, d: int, Br: int = 64, Bc: int = 64,
              N_k: int | None = None) -> int:
    """Peak SRAM elements the algorithm's tiles need (what ``simulate`` reports as sram_peak)."""
    return closed_form(algorithm, N, d, Br=Br, Bc=Bc, M=None, N_k=N_k).sram_peak


def matmul_flops(algorithm: str, N: int, d: int, N_k: int | None = None) -> int:
    """Matrix-multiply FLOPs (2 per multiply-add) of one head, without the causal saving.

    Forward: S = Q K^T and O = P V, 4 N N_k d. Backward from a stored P: dV, dP, dQ, dK,
    8 N N_k d. FlashAttention-2's backward recomputes S first: 10 N N_k d. The two-kernel
    backward computes S and dP = dO V^T in both kernels: 14 N N_k d.
    """
    n_k = N if N_k is None else N_k
    per = {"standard": 4, "flash1": 4, "flash2": 4, "standard_bwd": 8, "flash2_bwd": 10,
           "flash2_bwd_split": 14}
    if algorithm not in per:
        raise ValueError(f"no FLOP count for algorithm {algorithm!r}; known: {sorted(per)}")
    return per[algorithm] * N * n_k * d


@dataclasses.dataclass(frozen=True)
class GPUSpec:
    """Published peak numbers of one GPU (dense fp16/bf16 tensor-core FLOP/s, HBM).

    ``sram_tbps`` is DERIVED, not published: SMs x 128 bytes/clock (shared memory) x the
    boost clock at which the tensor-core peak is quoted. For the A100 it gives 19.5 TB/s,
    the 19 TB/s of the FlashAttention paper's Figure 1.
    """

    name: str
    peak_tflops: float  # dense fp16/bf16 tensor cores, TFLOP/s
    hbm_tbps: float  # HBM bandwidth, TB/s
    hbm_gb: float  # HBM capacity, GB
    sms: int
    smem_kb_per_sm: int  # max shared memory per SM (KB)
    l1_smem_kb_per_sm: int  # combined L1 cache + shared memory per SM (KB)
    boost_ghz: float
    source: str

    @property
    def sram_mib(self) -> float:
        """On-chip L1 + shared memory over all SMs, in MiB (the paper's "SRAM, 20 MB")."""
        return self.sms * self.l1_smem_kb_per_sm / 1024

    @property
    def sram_tbps(self) -> float:
        return self.sms * 128 * self.boost_ghz * 1e9 / 1e12

    @property
    def ridge(self) -> float:
        """FLOPs per byte above which the roofline model says a kernel is compute-bound."""
        return self.peak_tflops / self.hbm_tbps


#: Spec-sheet numbers (SXM parts). A100: 40 GB HBM2 as in the FlashAttention paper.
GPUS: dict[str, GPUSpec] = {
    "A100": GPUSpec("A100 SXM4 40GB", 312.0, 1.555, 40, 108, 164, 192, 1.41,
                    "NVIDIA A100 datasheet; Ampere tuning guide (192 KB L1/shared per SM, "
                    "up to 164 KB shared)"),
    "H100": GPUSpec("H100 SXM5 80GB", 989.4, 3.35, 80, 132, 228, 256, 1.83,
                    "NVIDIA H100 datasheet; Hopper tuning guide (256 KB L1/shared per SM, "
                    "up to 228 KB shared)"),
    "H200": GPUSpec("H200 SXM 141GB", 989.4, 4.8, 141, 132, 228, 256, 1.83,
                    "NVIDIA H200 datasheet (the H100's GH100 compute with HBM3e)"),
}


def roofline_ms(flops: float, hbm_bytes: float, gpu: str | GPUSpec) -> float:
    """ESTIMATED milliseconds from the roofline model: max(FLOPs/peak, bytes/bandwidth).

    An estimate, not a measurement: it assumes the kernel reaches the GPU's peak
    tensor-core throughput or its peak HBM bandwidth, whichever binds.
    """
    spec = GPUS[gpu] if isinstance(gpu, str) else gpu
    return max(flops / (spec.peak_tflops * 1e12), hbm_bytes / (spec.hbm_tbps * 1e12)) * 1e3


def arithmetic_intensity(flops: float, hbm_bytes: float) -> float:
    """FLOPs per byte of HBM traffic."""
    return flops / hbm_bytes if hbm_bytes else math.inf
