"""attention.memory.serving: MLA and fp8 bytes per token from the configs, the whole
step roofline's intensities (weights grow with B N_q, attention with N_q only), the
compulsory count against the FA2 grid's, cascade bytes; attention.decode's cascade
attention equals attention over prefix + suffix (fp64 reference)."""

import numpy as np
import pytest

from attention import core, decode
from attention.memory import closed_form, decode_bytes, serving


def test_bytes_per_token_from_the_configs():
    v3 = serving.MLA_MODELS["DeepSeek-V3"]
    assert v3.d == 576 and v3.kv_bytes_per_token() == (512 + 64) * 61 * 2
    llama = serving.MODELS["Llama 3 70B"]
    assert llama.kv_bytes_per_token() == 320 * 1024  # 2 x 80 x 8 x 128 x 2 bytes
    assert round(v3.kv_bytes_per_token() / 1024) == 69
    assert serving.fp8_bytes_per_token(llama) == llama.kv_bytes_per_token() / 2
    # a descale per (layer, K/V, KV head) every 16 tokens: 2 x 80 x 8 x 4 / 16 bytes
    assert serving.fp8_bytes_per_token(llama, 16) == 163840 + 2 * 80 * 8 * 4 / 16
    with pytest.raises(ValueError, match="^layers"):
        serving.MLAConfig("x", 0, 1, 1, 1, "c")


def test_attention_intensity_does_not_grow_with_the_batch():
    llama = serving.MODELS["Llama 3 70B"]
    steps = {B: serving.model_step(llama, 70e9, B, 8192) for B in (1, 8, 64)}
    assert steps[64]["weight_intensity"] == 64 * steps[1]["weight_intensity"]
    assert steps[64]["attn_intensity"] == steps[1]["attn_intensity"]
    # 2 FLOPs a weight of 2 bytes: intensity B N_q; attention: 4 H_q d / (2 H_kv d 2)
    assert steps[1]["weight_intensity"] == 1.0
    assert steps[1]["attn_intensity"] == llama.group
    spec = serving.model_step(llama, 70e9, 8, 8192, N_q=5)
    assert spec["attn_intensity"] == 5 * llama.group
    t = serving.step_time(steps[64], 4.8e12, 989e12)
    assert t["total"] == pytest.approx(t["weights"] + t["attention"])
    assert t["attention"] > t["weights"]  # 64 x 8k tokens of cache outweigh 140 GB


def test_compulsory_count_against_the_fa2_grid():
    B, H_kv, N, d, g = 2, 2, 300, 16, 4
    fa2 = closed_form("decode_fa2", B=B, H_kv=H_kv, N=N, d=d, group=g)
    split = closed_form("decode_split", B=B, H_kv=H_kv, N=N, d=d, group=g)
    least = serving.compulsory_elements(B, H_kv, N, d, g)
    kv = 2 * B * H_kv * N * d
    assert fa2.per_tensor["K"][0] + fa2.per_tensor["V"][0] == g * kv
    assert split.per_tensor["K"][0] + split.per_tensor["V"][0] == kv
    assert least == kv + 2 * B * H_kv * g * d
    assert decode_bytes(fa2) > decode_bytes(split)


def test_cascade_bytes_and_attention():
    c = serving.cascade_bytes(8, 1000, 50, 2.0)
    assert c["per_request"] == 8 * 1050 * 2 and c["cascade"] == (1000 + 8 * 50) * 2
    rng = np.random.default_rng(0)
    B, n_q, h_q, h_kv, d, P, n_max = 3, 2, 4, 2, 8, 13, 9
    q = rng.standard_normal((B, n_q, h_q, d))
    kp, vp = (rng.standard_normal((P, h_kv, d)) for _ in range(2))
    ks, vs = (rng.standard_normal((B, n_max, h_kv, d)) for _ in range(2))
    lens = np.array([9, 4, 2])
    out, lse = decode.cascade_attention(q, kp, vp, ks, vs, lens)
    for b in range(B):
        n = P + lens[b]
        k = np.concatenate([kp, ks[b, : lens[b]]]).transpose(1, 0, 2)  # (H_kv, n, d)
        v = np.concatenate([vp, vs[b, : lens[b]]]).transpose(1, 0, 2)
        k, v = np.repeat(k, h_q // h_kv, 0), np.repeat(v, h_q // h_kv, 0)
        s = q[b].transpose(1, 0, 2) @ k.transpose(0, 2, 1) / np.sqrt(d)
        s = np.where(np.arange(n) <= np.arange(n - n_q, n)[:, None], s, -np.inf)
        ref = core.softmax(s) @ v  # (H_q, N_q, d)
        np.testing.assert_allclose(out[b], ref.transpose(1, 0, 2), atol=1e-12, rtol=0)
        np.testing.assert_allclose(lse[b], core.logsumexp(s), atol=1e-12, rtol=0)
    with pytest.raises(ValueError, match="^k_prefix and v_prefix"):
        decode.cascade_attention(q, kp[:, :1], vp, ks, vs, lens)
