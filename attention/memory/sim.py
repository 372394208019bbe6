"""The simulator: ``HBMSim`` counts every load and store,
``Traffic`` holds the counts, and the registry makes ``simulate(name, ...)``
and ``closed_form(name, ...)`` reach every algorithm in the book.
The shared argument checks and SRAM budgets live here too."""

from __future__ import annotations

import dataclasses
import inspect
import numbers
from collections.abc import Callable

import numpy as np

#: Work ``simulate`` accepts, in trace events (loads, stores and compute marks; what
#: ``Traffic.events`` counts). The simulator handles one event at a time in Python, and
#: a kept trace holds one ``Transfer`` per event, so both its time and its trace grow
#: with the count. Above these budgets ``simulate`` refuses at once (the count comes
#: from the closed form, before anything runs) and points to ``closed_form``, which
#: gives the same counts from a formula.
MAX_TRACE_EVENTS = 2_000_000  # keep_trace=True
MAX_EVENTS = 2_000_000  # keep_trace=False


@dataclasses.dataclass(frozen=True, slots=True)
class Transfer:
    """One event of a schedule: a tile crossing the HBM <-> SRAM
    boundary, or on-chip work.

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
    """Result of a simulation or a closed form: HBM reads and writes, in elements.

    ``closed_form`` gives every field but ``trace``, equal to what ``simulate`` gives.
    """

    reads: int
    writes: int
    per_tensor: dict  # name -> (reads, writes)
    trace: list = dataclasses.field(default_factory=list)
    sram_peak: int | None = None  # most elements resident in SRAM at once
    steps: int | None = None  # steps of the schedule (the last Transfer.step + 1)
    events: int | None = None  # loads, stores and compute marks (len(trace) when kept)

    def __post_init__(self):
        if not isinstance(self.per_tensor, dict):
            raise TypeError(
                "per_tensor must be a dict name -> (reads, writes), got "
                f"{type(self.per_tensor).__name__}"
            )
        for tensor, rw in self.per_tensor.items():
            if not isinstance(rw, tuple) or len(rw) != 2:
                raise ValueError(
                    f"per_tensor[{tensor!r}] must be a (reads, writes) pair, got {rw!r}"
                )
            _check_elems(f"per_tensor[{tensor!r}] reads", rw[0])
            _check_elems(f"per_tensor[{tensor!r}] writes", rw[1])
        for name in ("reads", "writes"):
            _check_elems(name, getattr(self, name))
        for name in ("sram_peak", "steps", "events"):
            if getattr(self, name) is not None:
                _check_elems(name, getattr(self, name))

    @property
    def total(self) -> int:
        return self.reads + self.writes

    def bytes(self, bytes_per_elem: int = 2) -> int:
        """Total traffic in bytes at ``bytes_per_elem`` (a positive int) per element."""
        return self.total * check_count("bytes_per_elem", bytes_per_elem)


def _check_elems(name: str, value) -> int:
    """An element count: a non-negative int (NumPy integers accepted)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(
        value, (numbers.Integral, np.integer)
    ):
        raise TypeError(
            f"{name} must be a non-negative int (elements), got "
            f"{type(value).__name__} {value!r}"
        )
    if value < 0:
        raise ValueError(f"{name} must be a non-negative int (elements), got {value}")
    return int(value)


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
        self.events = 0

    def load(self, tensor: str, elems: int, block: tuple = ()) -> None:
        if elems < 0:
            raise ValueError(f"load of {tensor}: elems must be >= 0, got {elems}")
        self.reads[tensor] = self.reads.get(tensor, 0) + elems
        self.events += 1
        if self.keep_trace:
            self.trace.append(Transfer("load", tensor, elems, block, self.step))

    def store(self, tensor: str, elems: int, block: tuple = ()) -> None:
        if elems < 0:
            raise ValueError(f"store of {tensor}: elems must be >= 0, got {elems}")
        self.writes[tensor] = self.writes.get(tensor, 0) + elems
        self.events += 1
        if self.keep_trace:
            self.trace.append(Transfer("store", tensor, elems, block, self.step))

    def compute(self, tensor: str, block: tuple = ()) -> None:
        """Record that ``tensor``'s ``block`` was produced on chip
        at the current step."""
        self.events += 1
        if self.keep_trace:
            self.trace.append(Transfer("compute", tensor, 0, block, self.step))

    def next_step(self) -> None:
        self.step += 1

    def hold(self, elems: int, what: str = "tiles") -> None:
        if elems < 0:
            raise ValueError(f"hold of {what}: elems must be >= 0, got {elems}")
        self.resident += elems
        if self.resident > self.peak:
            self.peak = self.resident
        if self.capacity is not None and self.resident > self.capacity:
            raise ValueError(
                f"{what} need {self.resident} elements of SRAM but M holds "
                f"{self.capacity}"
            )

    def release(self, elems: int) -> None:
        """Free ``elems`` of SRAM: 0 <= elems <= what is held (ValueError otherwise)."""
        if not 0 <= elems <= self.resident:
            raise ValueError(
                f"release: elems must be in 0..{self.resident} (the "
                f"elements held in SRAM), got {elems}"
            )
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
            events=self.events,
        )


def traffic(
    per_tensor: dict,
    sram_peak: int | None = None,
    steps: int | None = None,
    events: int | None = None,
) -> Traffic:
    """Build a Traffic from a {tensor: (reads, writes)} dict (used by closed forms)."""
    per = {k: (int(r), int(w)) for k, (r, w) in per_tensor.items() if r or w}
    return Traffic(
        reads=sum(r for r, _ in per.values()),
        writes=sum(w for _, w in per.values()),
        per_tensor=per,
        sram_peak=sram_peak,
        steps=steps,
        events=events,
    )


@dataclasses.dataclass(frozen=True)
class _Algorithm:
    simulate: Callable[..., Traffic]
    closed_form: Callable[..., Traffic]
    signature: inspect.Signature


_ALGORITHMS: dict[str, _Algorithm] = {}


def register(
    name: str,
    simulate_fn: Callable[..., Traffic],
    closed_form_fn: Callable[..., Traffic],
) -> None:
    """Make ``simulate(name, ...)`` and ``closed_form(name, ...)`` reach an algorithm.

    Both functions take the same parameters, all by the same names and defaults. Every
    parameter is a count (a positive int; NumPy integers are accepted, bools and floats
    are not), except ``keep_trace`` (a bool) and the ones that default to None (``M``,
    ``N_k``: a positive int or None). ``simulate`` and ``closed_form`` check every
    argument that way, in one place, before the algorithm sees it. The closed form
    returns the simulation's counts, SRAM peak (raising like the simulation when the
    tiles do not fit in ``M``), steps and events.
    """
    sig = inspect.signature(simulate_fn)
    other = inspect.signature(closed_form_fn)
    if [(p.name, p.default) for p in sig.parameters.values()] != [
        (p.name, p.default) for p in other.parameters.values()
    ]:
        raise ValueError(
            f"register({name!r}): the simulation takes {sig} but the "
            f"closed form takes {other}; they must take the same "
            "parameters"
        )
    _ALGORITHMS[name] = _Algorithm(simulate_fn, closed_form_fn, sig)


def algorithms() -> list[str]:
    return sorted(_ALGORITHMS)


def _lookup(name: str) -> _Algorithm:
    if not isinstance(name, str) or name not in _ALGORITHMS:
        known = ", ".join(algorithms())
        raise ValueError(f"unknown algorithm {name!r}; known: {known}")
    return _ALGORITHMS[name]


def check_count(name: str, value, optional: bool = False) -> int | None:
    """``value`` as a positive Python int (NumPy integers accepted; bools, floats and
    strings refused with TypeError, values < 1 with ValueError); None if
    ``optional``."""
    if value is None and optional:
        return None
    what = "a positive int or None" if optional else "a positive int"
    if isinstance(value, (bool, np.bool_)) or not isinstance(
        value, (numbers.Integral, np.integer)
    ):
        raise TypeError(f"{name} must be {what}, got {type(value).__name__} {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be {what}, got {int(value)}")
    return int(value)


def _bind(algorithm: str, args: tuple, kwargs: dict) -> tuple[_Algorithm, dict]:
    """The one validation path: bind the arguments to the algorithm's parameters and
    check each (see ``register``). Returns the algorithm and the checked arguments."""
    alg = _lookup(algorithm)
    try:
        bound = alg.signature.bind(*args, **kwargs)
    except TypeError as err:
        raise TypeError(f"{algorithm}: {err}; it takes {alg.signature}") from None
    bound.apply_defaults()
    checked = {}
    for name, value in bound.arguments.items():
        param = alg.signature.parameters[name]
        if name == "keep_trace":
            if not isinstance(value, (bool, np.bool_)):
                raise TypeError(
                    f"keep_trace must be a bool, got {type(value).__name__} {value!r}"
                )
            checked[name] = bool(value)
        elif name == "M":
            try:
                checked[name] = check_count(name, value, optional=True)
            except (TypeError, ValueError) as err:
                raise type(err)(
                    "M (SRAM capacity in elements) must be a positive int "
                    f"or None, got {value!r}"
                ) from None
        else:
            checked[name] = check_count(name, value, optional=param.default is None)
    return alg, checked


def _call(algorithm: str, kw: dict) -> str:
    return f"{algorithm!r}, " + ", ".join(
        f"{k}={v!r}" for k, v in kw.items() if k != "keep_trace"
    )


_DEFAULT = object()


def simulate(algorithm: str, *args, max_events=_DEFAULT, **kwargs) -> Traffic:
    """Run ``algorithm`` tile by tile against a simulated HBM/SRAM
    and count every transfer.

    For this module's algorithms: ``simulate(algorithm, N, d, Br=64, Bc=64, M=None,
    N_k=None, keep_trace=True)``. ``keep_trace=False`` skips the ordered trace (faster).
    Arguments are checked as ``register`` says; tiles that do not fit in ``M`` raise
    ValueError. A schedule of more than ``max_events`` events (default:
    ``MAX_TRACE_EVENTS`` with the trace, ``MAX_EVENTS`` without; None: no limit) is
    refused before it runs, with ValueError pointing to ``closed_form``, which gives the
    same counts at once.
    """
    alg, kw = _bind(algorithm, args, kwargs)
    form = alg.closed_form(**kw)  # cheap; raises first if the tiles do not fit in M
    if max_events is _DEFAULT:
        max_events = MAX_TRACE_EVENTS if kw.get("keep_trace", True) else MAX_EVENTS
    elif max_events is not None:
        max_events = check_count("max_events", max_events)
    if max_events is not None and form.events is not None and form.events > max_events:
        trace = (
            f", about {form.events * 100 / 2**30:.1f} GiB of trace"
            if kw.get("keep_trace", True)
            else ""
        )
        raise ValueError(
            f"simulate({_call(algorithm, kw)}) would record {form.events:,} events "
            f"(loads, stores and computes{trace}), more than its budget of max_events "
            f"= {max_events:,}: too slow to simulate in Python. memory.closed_form("
            f"{_call(algorithm, kw)}) gives the same counts at once; or use larger "
            "blocks, a shorter sequence, keep_trace=False, or max_events=None to "
            "insist"
        )
    return alg.simulate(**kw)


def closed_form(algorithm: str, *args, **kwargs) -> Traffic:
    """The same reads, writes, per-tensor counts, SRAM peak, steps and events as
    ``simulate``, from a formula (no trace). Checks its arguments as ``simulate`` does
    and raises as it does when the tiles do not fit in ``M``."""
    alg, kw = _bind(algorithm, args, kwargs)
    return alg.closed_form(**kw)


def sram_need(algorithm: str, *args, **kwargs) -> int:
    """Peak SRAM elements the algorithm's tiles need
    (what ``simulate`` reports as ``sram_peak``), for the same arguments as ``simulate``
    (``M`` is ignored). E.g. ``sram_need("flash2", N, d, Br, Bc)``,
    ``sram_need("msda", 4096, 32, Bq=64)``."""
    alg, kw = _bind(algorithm, args, kwargs)
    if "M" in kw:
        kw["M"] = None
    peak = alg.closed_form(**kw).sram_peak
    if peak is None:
        raise ValueError(
            f"algorithm {algorithm!r} has no SRAM model: its closed form "
            f"reports no sram_peak"
        )
    return peak


# ---------------------------------------------------------------------------------
# Shared helpers: argument checks, ragged blocks, SRAM budgets.
# ---------------------------------------------------------------------------------


def _check_args(N, d, Br, Bc, M, N_k) -> int:
    for name, val in (("N", N), ("d", d), ("Br", Br), ("Bc", Bc)):
        if isinstance(val, bool) or not isinstance(val, int) or val < 1:
            raise ValueError(f"{name} must be a positive int, got {val!r}")
    if M is not None and (isinstance(M, bool) or not isinstance(M, int) or M < 1):
        raise ValueError(
            f"M (SRAM capacity in elements) must be a positive int or None, got {M!r}"
        )
    n_k = N if N_k is None else N_k
    if isinstance(n_k, bool) or not isinstance(n_k, int) or n_k < 1:
        raise ValueError(f"N_k must be a positive int or None, got {N_k!r}")
    return n_k


def blocks(n: int, b: int) -> list[int]:
    """Sizes of the blocks of a length-n axis cut into blocks of b
    (the last may be ragged). n >= 0, b >= 1."""
    n, b = _check_elems("n", n), check_count("b", b)
    return [b] * (n // b) + ([n % b] if n % b else [])


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for ints a >= 0 and b >= 1 (a count of blocks)."""
    a, b = _check_elems("a", a), check_count("b", b)
    return -(-a // b)


def fit_tiles(algorithm: str, phases: dict[str, dict[str, int]], M: int | None) -> int:
    """Peak SRAM need over an algorithm's phases; ValueError naming the tiles if > M.

    ``phases`` maps a phase name to {tile description: elements} at the largest blocks.
    """
    needs = {ph: sum(parts.values()) for ph, parts in phases.items()}
    peak = max(needs.values())
    if M is not None and peak > M:
        ph = max(needs, key=needs.get)
        parts = " + ".join(f"{k} ({v})" for k, v in phases[ph].items())
        raise ValueError(
            f"{algorithm}: the tiles of {ph} need {parts} = {peak} "
            f"elements of SRAM, but M holds {M}; choose smaller Br/Bc or "
            "a larger M"
        )
    return peak
