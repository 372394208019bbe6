"""The simulator: ``HBMSim`` counts every load and store, ``Traffic`` holds the counts, and
the registry makes ``simulate(name, ...)`` and ``closed_form(name, ...)`` reach every
algorithm in the book. The shared argument checks and SRAM budgets live here too."""

from __future__ import annotations

import dataclasses
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


def blocks(n: int, b: int) -> list[int]:
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
