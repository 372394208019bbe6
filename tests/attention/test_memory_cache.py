"""attention.memory.cache: compulsory traffic bounds every schedule from below, and the
L2 policy says when a GPU gets near it."""

import itertools

import pytest

from attention import memory

CORE = [
    "standard",
    "flash1",
    "flash2",
    "standard_bwd",
    "flash2_bwd",
    "flash2_bwd_split",
]


@pytest.mark.parametrize("alg", CORE)
def test_compulsory_is_a_lower_bound_of_every_schedule(alg):
    for N, n_k, d, Br, Bc in itertools.product(
        (16, 100, 257), (None, 64, 300), (8, 64), (16, 64), (16, 32)
    ):
        low = memory.compulsory(alg, N, d, N_k=n_k)
        sim = memory.closed_form(alg, N, d, Br=Br, Bc=Bc, N_k=n_k)
        assert low.total <= sim.total, (alg, N, n_k, d, Br, Bc)
        for name, (r, w) in low.per_tensor.items():
            if name in sim.per_tensor:  # what the schedule moves of it, at least once
                assert sim.per_tensor[name][0] >= r and sim.per_tensor[name][1] >= w


def test_flash2_with_all_of_q_resident_moves_exactly_the_compulsory_traffic():
    # one query block (Br >= N): K and V are read once, nothing is re-read
    for N, n_k, d in [(64, 64, 16), (100, 37, 32), (128, 500, 64)]:
        assert (
            memory.closed_form("flash2", N, d, Br=N, Bc=32, N_k=n_k).per_tensor
            == memory.compulsory("flash2", N, d, N_k=n_k).per_tensor
        )


def test_compulsory_counts():
    N, n_k, d = 1000, 300, 64
    fwd = memory.compulsory("flash2", N, d, N_k=n_k)
    assert (fwd.reads, fwd.writes) == (N * d + 2 * n_k * d, N * d + N)
    bwd = memory.compulsory("flash2_bwd_split", N, d, N_k=n_k)
    assert (bwd.reads, bwd.writes) == (3 * N * d + 2 * n_k * d + N, N * d + 2 * n_k * d)


def test_fa2_forward_is_compute_bound_by_compulsory_traffic_not_by_the_no_cache_model():
    """The chapter's claim, as numbers: bf16, d = 128, N = 16384 on an H100."""
    N, d, h100 = 16384, 128, memory.GPUS["H100"]
    flops = memory.matmul_flops("flash2", N, d)
    low = memory.compulsory("flash2", N, d).bytes(2)
    high = memory.closed_form("flash2", N, d, Br=128, Bc=64).bytes(2)
    assert flops / high < h100.ridge < flops / low
    assert memory.kv_fits_in_l2(N, d, 128, "H100")


def test_l2_policy():
    h100 = memory.GPUS["H100"]
    assert h100.l2_mb == 50 and memory.GPUS["A100"].l2_mb == 40
    # 132 SMs over ceil(16384 / 128) = 128 programs per head: 2 heads in flight
    assert memory.heads_in_flight(16384, 128, "H100") == 2
    assert memory.heads_in_flight(128, 128, "H100") == 132
    # 132 heads of 2 x 128 x 128 bf16 K/V (8.6 MB) fit; a 1M-token K/V
    # (512 MiB) does not
    assert memory.kv_fits_in_l2(128, 128, 128, "H100")
    assert not memory.kv_fits_in_l2(2**20, 128, 128, "H100")


def test_compulsory_refuses_what_it_does_not_model():
    with pytest.raises(ValueError, match="no compulsory-traffic model"):
        memory.compulsory("topk", 64, 16)
    with pytest.raises(ValueError, match="N"):
        memory.compulsory("flash2", 0, 16)
    with pytest.raises(TypeError, match="d"):
        memory.compulsory("flash2", 64, 16.0)
