"""The HBM/SRAM simulator: simulate == closed_form,
the papers' leading terms, SRAM limits."""

import random
import time

import pytest

from attention import memory

pytestmark = pytest.mark.xdist_group("memory_flash")

OURS = [
    "standard",
    "flash1",
    "flash2",
    "standard_bwd",
    "flash2_bwd",
    "flash2_bwd_split",
]


def _same(a: memory.Traffic, b: memory.Traffic) -> None:
    assert a.per_tensor == b.per_tensor
    assert (a.reads, a.writes) == (b.reads, b.writes)
    assert a.sram_peak == b.sram_peak


def test_all_algorithms_registered():
    assert set(OURS) <= set(memory.algorithms())


@pytest.mark.parametrize("algorithm", OURS)
def test_simulate_equals_closed_form_random(algorithm):
    rng = random.Random(hash(algorithm) % 1000)
    for _ in range(40):
        N, d = rng.randint(1, 300), rng.randint(1, 80)
        Br, Bc = rng.randint(1, 96), rng.randint(1, 96)
        N_k = rng.choice([None, rng.randint(1, 300)])
        kw = dict(Br=Br, Bc=Bc, N_k=N_k)
        _same(
            memory.simulate(algorithm, N, d, **kw),
            memory.closed_form(algorithm, N, d, **kw),
        )


@pytest.mark.parametrize("algorithm", OURS)
@pytest.mark.parametrize(
    "N,d,Br,Bc,N_k",
    [
        (1, 1, 1, 1, None),  # smallest
        (64, 64, 64, 64, None),  # one block each way
        (65, 16, 64, 64, None),  # a one-row ragged last block
        (200, 32, 48, 80, 333),  # cross lengths, ragged both ways
        (10, 8, 128, 128, 7),  # blocks larger than the sequence
    ],
)
def test_simulate_equals_closed_form_edges(algorithm, N, d, Br, Bc, N_k):
    kw = dict(Br=Br, Bc=Bc, N_k=N_k)
    sim = memory.simulate(algorithm, N, d, **kw)
    _same(sim, memory.closed_form(algorithm, N, d, **kw))
    _same(sim, memory.simulate(algorithm, N, d, keep_trace=False, **kw))
    # The trace adds up to the counters.
    loads = sum(t.elems for t in sim.trace if t.op == "load")
    stores = sum(t.elems for t in sim.trace if t.op == "store")
    assert (loads, stores) == (sim.reads, sim.writes)


def test_standard_matches_paper_accounting():
    # With all of Q resident (T_r = 1) the standard forward moves exactly 4Nd + 4N^2:
    # Q, K, V read once, O written once, S and P each written once and read once.
    for N, d in [(256, 64), (1024, 64), (300, 128)]:
        t = memory.closed_form("standard", N, d, Br=N, Bc=64)
        assert t.total == 4 * N * d + 4 * N * N
    # In general: 2Nd + 2 T_r N d + 4 N^2; ~ 4N^2 once N >> d and Br >> d.
    N, d, Br = 8192, 64, 1024
    t = memory.closed_form("standard", N, d, Br=Br, Bc=64)
    assert t.total == 2 * N * d + 2 * (N // Br) * N * d + 4 * N * N
    assert abs(t.total / (4 * N * d + 4 * N * N) - 1) < d / (2 * Br) + 1e-12
    assert t.per_tensor["S"] == (N * N, N * N) and t.per_tensor["P"] == (N * N, N * N)


def test_flash1_matches_algorithm_1():
    # K, V once (2Nd); per key block: Q_i, O_i, l_i, m_i read and O_i, l_i, m_i written
    # (3Nd + 4N); line 2 initialises O, l, m in HBM (Nd + 2N).
    for N, d, Br, Bc in [(1024, 64, 64, 128), (1000, 48, 40, 96), (4096, 128, 128, 64)]:
        t_c = memory.cdiv(N, Bc)
        t = memory.closed_form("flash1", N, d, Br=Br, Bc=Bc)
        assert t.total == 2 * N * d + t_c * (3 * N * d + 4 * N) + (N * d + 2 * N)
        assert t.per_tensor["K"] == (N * d, 0) and t.per_tensor["Q"] == (t_c * N * d, 0)


def test_flash2_forward_leading_terms():
    # Q read once, O and L written once (2Nd + N); K and V once per query block.
    for N, d, Br, Bc in [(1024, 64, 128, 64), (999, 80, 64, 32)]:
        t_r = memory.cdiv(N, Br)
        t = memory.closed_form("flash2", N, d, Br=Br, Bc=Bc)
        assert t.total == 2 * N * d + N + t_r * 2 * N * d
        assert t.writes == N * d + N


def test_standard_and_flash2_differ_by_s_and_p_round_trips():
    for N, d, Br, Bc in [(512, 64, 64, 64), (777, 32, 128, 48)]:
        std = memory.closed_form("standard", N, d, Br=Br, Bc=Bc)
        fa2 = memory.closed_form("flash2", N, d, Br=Br, Bc=Bc)
        assert std.total - fa2.total == 4 * N * N - N


def test_theorem_2_scaling():
    # Flash: Theta(N^2 d^2 / M) with the FA1 block rule; standard:
    # Theta(Nd + N^2), no M.
    d = 64
    totals = {}
    for M in (2**14, 2**15, 2**16, 2**17):
        Br, Bc = memory.fa1_block_sizes(M // 2, d)  # half of M keeps the tiles inside M
        totals[M] = memory.closed_form("flash1", 8192, d, Br=Br, Bc=Bc, M=M).total
    # Doubling M halves the dominant T_c * 3Nd term: the ratio tends to 2.
    for M in (2**14, 2**15, 2**16):
        assert 1.8 < totals[M] / totals[2 * M] <= 2.0
    std = [
        memory.closed_form("standard", 8192, d, Br=128, M=M).total
        for M in (2**15, 2**17)
    ]
    assert std[0] == std[1]
    # Quadratic in N for both, at fixed M.
    for alg in ("standard", "flash2"):
        a = memory.closed_form(alg, 4096, d, Br=128, Bc=64).total
        b = memory.closed_form(alg, 8192, d, Br=128, Bc=64).total
        assert 3.5 < b / a < 4.0


def test_backward_accounting():
    N, d, Br, Bc = 1024, 64, 128, 64
    t_r, t_c = N // Br, N // Bc
    std = memory.closed_form("standard_bwd", N, d, Br=Br, Bc=Bc)
    # P read twice, dP written and read, dS written and read twice:
    # 7 N^2 of the N^2 terms.
    n2 = sum(std.per_tensor[k][0] + std.per_tensor[k][1] for k in ("P", "dP", "dS"))
    assert n2 == 7 * N * N
    fa2 = memory.closed_form("flash2_bwd", N, d, Br=Br, Bc=Bc)
    assert "P" not in fa2.per_tensor and "dS" not in fa2.per_tensor
    assert fa2.per_tensor["dQ"] == (t_c * N * d, N * d + t_c * N * d)
    split = memory.closed_form("flash2_bwd_split", N, d, Br=Br, Bc=Bc)
    assert split.per_tensor["dQ"] == (0, N * d)
    assert split.per_tensor["K"] == (N * d + t_r * N * d, 0)


def test_sram_capacity():
    need = memory.sram_need("flash2", 1024, 64, Br=128, Bc=64)
    assert need == 2 * 64 * 64 + 2 * 128 * 64 + 2 * 128 + 128 * 64
    # Exactly enough fits; one element less raises, naming the tiles and M.
    memory.simulate("flash2", 1024, 64, Br=128, Bc=64, M=need)
    memory.closed_form("flash2", 1024, 64, Br=128, Bc=64, M=need)
    for fn in (memory.simulate, memory.closed_form):
        with pytest.raises(
            ValueError, match=rf"K_j, V_j .* = {need} elements.*M holds {need - 1}"
        ):
            fn("flash2", 1024, 64, Br=128, Bc=64, M=need - 1)
    # The standard forward's softmax needs one whole row of S on chip.
    with pytest.raises(ValueError, match="one row of S"):
        memory.simulate("standard", 4096, 16, Br=16, Bc=16, M=2048)
    # The simulator's tracked peak is what the closed form predicts.
    sim = memory.simulate("flash2_bwd", 300, 40, Br=64, Bc=32)
    assert sim.sram_peak == memory.sram_need("flash2_bwd", 300, 40, Br=64, Bc=32)


def test_fa1_block_rule():
    assert memory.fa1_block_sizes(4 * 64 * 100, 64) == (64, 100)
    assert memory.fa1_block_sizes(1000, 64) == (4, 4)
    Br, Bc = memory.fa1_block_sizes(25_000, 64)
    assert (Br, Bc) == (64, 98)


@pytest.mark.parametrize(
    "bad",
    [
        dict(N=0),
        dict(d=-1),
        dict(Br=0),
        dict(Bc=1.5),
        dict(M=0),
        dict(N_k=0),
        dict(N=True),
    ],
)
def test_bad_arguments_raise(bad):
    kw = dict(N=64, d=16, Br=16, Bc=16, M=None, N_k=None)
    kw.update(bad)
    name = next(iter(bad))
    with pytest.raises((ValueError, TypeError), match=name):
        memory.simulate("flash2", **kw)
    with pytest.raises(ValueError, match="unknown algorithm"):
        memory.simulate("flash3", 64, 16)


def test_trace_orders_steps():
    sim = memory.simulate("flash1", 100, 8, Br=32, Bc=50)
    computes = [t for t in sim.trace if t.op == "compute"]
    # FA1: key blocks outside, query blocks inside.
    assert [t.block for t in computes] == [(i, j) for j in range(2) for i in range(4)]
    assert [t.step for t in computes] == list(range(8))
    steps = [t.step for t in sim.trace]
    assert steps == sorted(steps)
    fa2 = memory.simulate("flash2", 100, 8, Br=32, Bc=50)
    assert [t.block for t in fa2.trace if t.op == "compute"] == [
        (i, j) for i in range(4) for j in range(2)
    ]


def test_fast_enough_for_a_slider():
    t0 = time.perf_counter()
    for alg in ("standard", "flash1", "flash2"):
        memory.simulate(alg, 16384, 128, Br=64, Bc=64, keep_trace=False)
    assert time.perf_counter() - t0 < 3.0  # ~0.1 s each on one core


def test_roofline_is_max_of_compute_and_memory():
    spec = memory.GPUS["A100"]
    flops, nbytes = 1e12, 1e9
    ms = memory.roofline_ms(flops, nbytes, "A100")
    assert ms == pytest.approx(max(flops / 312e12, nbytes / 1.555e12) * 1e3)
    assert spec.sram_tbps == pytest.approx(19.49, abs=0.01)  # the paper's "19 TB/s"
    assert memory.matmul_flops("flash2_bwd", 128, 64) == 10 * 128 * 128 * 64
    with pytest.raises(ValueError):
        memory.matmul_flops("nope", 1, 1)


@pytest.mark.parametrize(
    "alg, N, d, Br, Bc",
    [
        ("standard", 96, 16, 16, 32),
        ("flash1", 128, 16, 16, 16),
        ("flash2", 80, 8, 32, 16),
        ("standard_bwd", 64, 16, 16, 16),
        ("flash2_bwd", 64, 16, 16, 16),
        ("flash2_bwd_split", 64, 16, 32, 16),
    ],
)
def test_the_schedule_does_not_depend_on_the_sram_that_holds_it(alg, N, d, Br, Bc):
    """The tile explorer keeps the last simulated schedule across SRAM sizes
    (``plots.schedule._schedule``): every size that holds the tiles gives the same
    trace, counts, peak and steps as no size at all; one too small raises."""
    free = memory.simulate(alg, N, d, Br=Br, Bc=Bc, keep_trace=True)
    for M in (free.sram_peak, 2 * free.sram_peak, 10**6):
        assert memory.simulate(alg, N, d, Br=Br, Bc=Bc, M=M, keep_trace=True) == free
    with pytest.raises(ValueError):
        memory.simulate(alg, N, d, Br=Br, Bc=Bc, M=free.sram_peak - 1)
