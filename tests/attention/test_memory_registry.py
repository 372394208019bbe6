"""Every registered algorithm (the core six and the eleven chapter ones) goes
through one validation path; closed_form == simulate in every field it promises;
sram_need and M behave the same everywhere; simulate refuses work above its budget
(issue 10, items 9-10)."""

import inspect
import random
import time

import numpy as np
import pytest

# importing deformable and hard registers the chapter algorithms
from attention import deformable, hard, memory  # noqa: F401
from attention.memory import sim as memsim

pytestmark = pytest.mark.xdist_group("memory_flash")

CHAPTER = [
    "soft",
    "hard",
    "topk",
    "dense-image",
    "dat",
    "dat-unfused",
    "msda",
    "decode_naive",
    "decode_fa2",
    "decode_split",
    "decode_paged",
]
CORE = [
    "standard",
    "flash1",
    "flash2",
    "standard_bwd",
    "flash2_bwd",
    "flash2_bwd_split",
]
ALL = memory.algorithms()
FIELDS = ("reads", "writes", "per_tensor", "sram_peak", "steps", "events")

# Small values per parameter name; "cross"/"ragged" come from independent draws.
DRAW = {
    "N": (1, 150),
    "N_k": (1, 150),
    "n_queries": (1, 150),
    "d": (1, 40),
    "Br": (4, 80),
    "Bc": (4, 80),
    "Bq": (1, 80),
    "k": (1, 12),
    "height": (1, 20),
    "width": (1, 20),
    "r": (1, 6),
    "n_levels": (1, 4),
    "n_points": (1, 4),
    "B": (1, 3),
    "H_kv": (1, 3),
    "group": (1, 6),
    "N_q": (1, 8),
    "n_splits": (1, 9),
    "page_size": (1, 40),
}


def _params(alg):
    return memsim._lookup(alg).signature.parameters


def _counts(alg):
    """The count parameters of ``alg`` (everything but keep_trace)."""
    return [p for p in _params(alg) if p != "keep_trace"]


def _draw(alg, rng):
    kw = {}
    for name, p in _params(alg).items():
        if name in ("keep_trace", "M"):
            continue
        if p.default is None and rng.random() < 0.4:
            continue  # N_k=None: self-attention
        lo, hi = DRAW[name]
        kw[name] = rng.randint(lo, hi)
    return kw


def _minimal(alg):
    return {
        n: 3
        for n, p in _params(alg).items()
        if n not in ("keep_trace", "M", "N_k") and p.default is inspect.Parameter.empty
    }


def _fields(t):
    return {f: getattr(t, f) for f in FIELDS}


def test_every_chapter_algorithm_is_registered():
    assert set(CORE + CHAPTER) <= set(ALL)


@pytest.mark.parametrize("alg", ALL)
def test_closed_form_equals_simulate_in_every_field(alg):
    rng = random.Random(sum(map(ord, alg)))
    for _ in range(25):
        kw = _draw(alg, rng)
        sim = memory.simulate(alg, **kw)
        form = memory.closed_form(alg, **kw)
        assert _fields(form) == _fields(sim), kw
        assert form.sram_peak is not None and form.steps is not None
        assert (
            form.events
            == len(sim.trace)
            == memory.simulate(alg, keep_trace=False, **kw).events
        )
        assert form.trace == []
        assert memory.sram_need(alg, **kw) == sim.sram_peak
        # The trace adds up to the counters, and its steps to ``steps``.
        assert sum(t.elems for t in sim.trace if t.op == "load") == sim.reads
        assert sum(t.elems for t in sim.trace if t.op == "store") == sim.writes
        assert max(t.step for t in sim.trace) + 1 == sim.steps


@pytest.mark.parametrize("alg", ALL)
def test_M_is_honoured_the_same_way(alg):
    rng = random.Random(7)
    for _ in range(5):
        kw = _draw(alg, rng)
        need = memory.sram_need(alg, **kw)
        for fn in (memory.simulate, memory.closed_form):
            assert fn(alg, M=need, **kw).sram_peak == need  # exactly enough fits
            with pytest.raises(
                ValueError, match=rf"= {need} elements.*M holds {need - 1}"
            ):
                fn(alg, M=need - 1, **kw)
        # sram_need ignores M: it says what the tiles need.
        assert memory.sram_need(alg, M=1, **kw) == need


def test_issue_examples():
    with pytest.raises(ValueError, match=r"^k must be a positive int, got -3"):
        memory.closed_form("topk", 64, 16, k=-3)
    with pytest.raises(ValueError, match=r"^k "):
        memory.simulate("topk", 64, 16, k=-3)
    assert memory.sram_need("soft", 64, 16) == memory.simulate("soft", 64, 16).sram_peak
    with pytest.raises(ValueError, match="M holds 100"):
        memory.closed_form("soft", 256, 64, M=100)
    f = memory.closed_form("flash2", np.int64(64), np.int32(16), Br=np.int16(16))
    assert _fields(f) == _fields(memory.closed_form("flash2", 64, 16, Br=16))


@pytest.mark.parametrize("alg", ALL)
def test_one_validation_path(alg):
    base = _minimal(alg)
    for fn in (memory.simulate, memory.closed_form, memory.sram_need):
        for name in _counts(alg):
            optional = _params(alg)[name].default is None
            for bad, err in (
                (0, ValueError),
                (-3, ValueError),
                (True, TypeError),
                (np.bool_(True), TypeError),
                (2.0, TypeError),
                (2.5, TypeError),
                ("3", TypeError),
                (np.float64(4), TypeError),
            ):
                if name == "M" and fn is memory.sram_need:
                    continue  # sram_need ignores M
                with pytest.raises(err, match=rf"^{name}\b"):
                    fn(alg, **{**base, name: bad})
            if optional:
                fn(alg, **{**base, name: None})
        with pytest.raises(
            TypeError, match=rf"{alg}: .*unexpected keyword argument 'nope'"
        ):
            fn(alg, **base, nope=1)
    with pytest.raises(TypeError, match="^keep_trace must be a bool"):
        memory.simulate(alg, **base, keep_trace="False")
    # NumPy integers are counts like any other.
    as_np = {k: np.int64(v) for k, v in base.items()}
    assert _fields(memory.closed_form(alg, **as_np)) == _fields(
        memory.closed_form(alg, **base)
    )
    assert _fields(memory.simulate(alg, **as_np)) == _fields(
        memory.simulate(alg, **base)
    )
    assert memory.sram_need(alg, **as_np) == memory.sram_need(alg, **base)


def test_numpy_integers_in_the_helpers():
    assert memory.fa1_block_sizes(np.int64(4 * 64 * 100), np.int32(64)) == (64, 100)
    assert (
        memory.matmul_flops("flash2", np.int64(128), np.int64(64)) == 4 * 128 * 128 * 64
    )
    for bad in (True, 1.5, 0):
        with pytest.raises((TypeError, ValueError), match="^M"):
            memory.fa1_block_sizes(bad, 64)


def test_sram_need_without_a_model_is_a_clear_error():
    def sim_fn(N, d, keep_trace=True):
        s = memory.HBMSim(None, keep_trace)
        s.load("Q", N * d)
        return s.result()

    def form_fn(N, d, keep_trace=True):
        return memory.traffic({"Q": (N * d, 0)})

    memory.register("test-no-sram", sim_fn, form_fn)
    try:
        with pytest.raises(ValueError, match="'test-no-sram' has no SRAM model"):
            memory.sram_need("test-no-sram", 4, 4)
    finally:
        memsim._ALGORITHMS.pop("test-no-sram")


def test_register_refuses_mismatched_functions():
    with pytest.raises(ValueError, match="same parameters"):
        memory.register("test-bad", lambda N, d, Br=64: None, lambda N, d, Br=32: None)
    assert "test-bad" not in memory.algorithms()
    with pytest.raises(ValueError, match="unknown algorithm"):
        memory.closed_form("flash3", 64, 16)


def test_simulate_refuses_work_above_its_budget():
    t0 = time.perf_counter()
    for kw in ({}, {"keep_trace": False}):
        with pytest.raises(
            ValueError, match=r"max_events.*memory\.closed_form\('flash2'"
        ):
            memory.simulate("flash2", 10**6, 64, **kw)
    with pytest.raises(ValueError, match=r"GiB of trace"):
        memory.simulate("standard_bwd", 10**5, 64)
    with pytest.raises(ValueError, match="max_events"):
        memory.simulate("msda", 10**8, 32, keep_trace=False)
    assert time.perf_counter() - t0 < 1.0  # refused up front, nothing simulated
    big = memory.closed_form("flash2", 10**6, 64)
    assert big.events > memory.MAX_EVENTS
    assert big.total == 2 * 10**6 * 64 * (1 + 15625) + 10**6
    # The budget is a keyword; None lifts it, an int sets it.
    memory.simulate("flash2", 256, 16, max_events=None)
    with pytest.raises(ValueError, match="max_events = 10"):
        memory.simulate("flash2", 256, 16, max_events=10)
    form = memory.closed_form("flash2", 256, 16)
    assert (
        memory.simulate("flash2", 256, 16, max_events=form.events).events == form.events
    )
    with pytest.raises(TypeError, match="^max_events"):
        memory.simulate("flash2", 256, 16, max_events=1.5)
    # Under the budget nothing changes: the book's largest simulations still run.
    assert memory.closed_form("flash1", 16384, 128).events < memory.MAX_TRACE_EVENTS
