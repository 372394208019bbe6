"""A simulated GPU memory hierarchy: tensors live in HBM, tiles are loaded into an SRAM of
fixed capacity, and every load and store is counted (elements, per tensor, in order).

Each algorithm is written block by block against ``HBMSim`` and has a closed form
beside it that gives the same counts from a formula. Counts are in *elements*;
multiply by the dtype's size for bytes (``Traffic.bytes``).

Chapter modules register their own algorithms with ``register`` (e.g. hard and top-k
attention in ``attention.hard``), so ``simulate(name, ...)`` and ``closed_form(name, ...)``
reach every algorithm in the book.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable


@dataclasses.dataclass(frozen=True)
class Transfer:
    """One tile crossing the HBM <-> SRAM boundary."""

    op: str  # "load" (HBM -> SRAM) or "store" (SRAM -> HBM)
    tensor: str  # "Q", "K", "V", "S", "P", "O", "l", "m", "L", ...
    elems: int
    block: tuple = ()  # e.g. (i,) a row block, (i, j) a tile of S; () the whole tensor
    step: int = 0  # outer-loop step, for animations


@dataclasses.dataclass
class Traffic:
    """Result of a simulation or a closed form: HBM reads and writes, in elements."""

    reads: int
    writes: int
    per_tensor: dict  # name -> (reads, writes)
    trace: list = dataclasses.field(default_factory=list)
    sram_peak: int | None = None  # most elements resident in SRAM at once

    @property
    def total(self) -> int:
        return self.reads + self.writes

    def bytes(self, bytes_per_elem: int = 2) -> int:
        return self.total * bytes_per_elem


class HBMSim:
    """Counts every element moved between HBM and an SRAM of ``capacity`` elements.

    ``load``/``store`` count traffic; ``hold``/``release`` track what is resident in
    SRAM so that a tiling that does not fit raises ValueError saying what it needs.
    """

    def __init__(self, capacity: int | None = None, keep_trace: bool = True):
        self.capacity = capacity
        self.keep_trace = keep_trace
        self.reads: Counter = Counter()
        self.writes: Counter = Counter()
        self.trace: list[Transfer] = []
        self.resident = 0
        self.peak = 0
        self.step = 0

    def load(self, tensor: str, elems: int, block: tuple = ()) -> None:
        self.reads[tensor] += int(elems)
        if self.keep_trace:
            self.trace.append(Transfer("load", tensor, int(elems), block, self.step))

    def store(self, tensor: str, elems: int, block: tuple = ()) -> None:
        self.writes[tensor] += int(elems)
        if self.keep_trace:
            self.trace.append(Transfer("store", tensor, int(elems), block, self.step))

    def hold(self, elems: int, what: str = "tiles") -> None:
        self.resident += int(elems)
        self.peak = max(self.peak, self.resident)
        if self.capacity is not None and self.resident > self.capacity:
            raise ValueError(
                f"{what} need {self.resident} elements of SRAM but M holds {self.capacity}"
            )

    def release(self, elems: int) -> None:
        self.resident -= int(elems)

    def result(self) -> Traffic:
        names = list(dict.fromkeys([*self.reads, *self.writes]))
        per = {n: (self.reads.get(n, 0), self.writes.get(n, 0)) for n in names}
        return Traffic(
            reads=sum(self.reads.values()),
            writes=sum(self.writes.values()),
            per_tensor=per,
            trace=self.trace,
            sram_peak=self.peak,
        )


def traffic(per_tensor: dict) -> Traffic:
    """Build a Traffic from a {tensor: (reads, writes)} dict (used by closed forms)."""
    per = {k: (int(r), int(w)) for k, (r, w) in per_tensor.items() if r or w}
    return Traffic(
        reads=sum(r for r, _ in per.values()), writes=sum(w for _, w in per.values()),
        per_tensor=per,
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
    """Run ``algorithm`` tile by tile against a simulated HBM/SRAM and count every transfer."""
    return _lookup(algorithm)[0](*args, **kwargs)


def closed_form(algorithm: str, *args, **kwargs) -> Traffic:
    """The same counts as ``simulate`` from a formula."""
    return _lookup(algorithm)[1](*args, **kwargs)


# ---------------------------------------------------------------------------------
# Standard (materialising) attention: the four steps, S and P round-trip through HBM.
#   1. load Q, K by blocks, compute S = Q K^T, write S to HBM
#   2. read S, compute P = softmax(S), write P to HBM
#   3. load P and V by blocks, compute O = P V, write O to HBM
#   4. return O
# ---------------------------------------------------------------------------------


def _simulate_standard(N: int, d: int, Br: int = 64, Bc: int = 64, M: int | None = None,
                       N_k: int | None = None, keep_trace: bool = True) -> Traffic:
    """Standard attention for N queries over N_k (default N) keys of head dim d."""
    n_k = N if N_k is None else N_k
    sim = HBMSim(M, keep_trace)
    t_r, t_c = -(-N // Br), -(-n_k // Bc)
    rows = lambda i, n, b: min(b, n - i * b)  # noqa: E731  (ragged last block)
    # Step 1: S = Q K^T, one (Br x Bc) tile at a time.
    sim.step = 1
    for i in range(t_r):
        for j in range(t_c):
            br, bc = rows(i, N, Br), rows(j, n_k, Bc)
            sim.hold(br * d + bc * d + br * bc, "Q, K and S tiles")
            sim.load("Q", br * d, (i,))
            sim.load("K", bc * d, (j,))
            sim.store("S", br * bc, (i, j))
            sim.release(br * d + bc * d + br * bc)
    # Step 2: P = softmax(S), one row block at a time (needs the whole row).
    sim.step = 2
    for i in range(t_r):
        br = rows(i, N, Br)
        sim.hold(br * n_k, "a block of full rows of S")
        sim.load("S", br * n_k, (i,))
        sim.store("P", br * n_k, (i,))
        sim.release(br * n_k)
    # Step 3: O = P V, accumulating over key blocks in SRAM.
    sim.step = 3
    for i in range(t_r):
        br = rows(i, N, Br)
        sim.hold(br * d, "the O accumulator")
        for j in range(t_c):
            bc = rows(j, n_k, Bc)
            sim.hold(br * bc + bc * d, "P and V tiles")
            sim.load("P", br * bc, (i, j))
            sim.load("V", bc * d, (j,))
            sim.release(br * bc + bc * d)
        sim.store("O", br * d, (i,))
        sim.release(br * d)
    return sim.result()


def _closed_standard(N: int, d: int, Br: int = 64, Bc: int = 64, M: int | None = None,
                     N_k: int | None = None, keep_trace: bool = True) -> Traffic:
    n_k = N if N_k is None else N_k
    t_r, t_c = -(-N // Br), -(-n_k // Bc)
    return traffic({
        "Q": (t_c * N * d, 0),  # every Q block is re-read for each K block
        "K": (t_r * n_k * d, 0),
        "V": (t_r * n_k * d, 0),
        "S": (N * n_k, N * n_k),
        "P": (N * n_k, N * n_k),
        "O": (0, N * d),
    })


register("standard", _simulate_standard, _closed_standard)
