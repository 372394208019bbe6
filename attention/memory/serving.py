"""A serving step's bytes (chapter 5): MLA's latent cache and fp8 caches per token, the
whole decode step's roofline (weights against KV cache), the compulsory KV traffic
beside the FA2 grid's per-program count, cascade attention's bytes, and the vLLM
paper's reported memory use beside the book's paging model.

Counts are bytes of HBM traffic or storage; every function is exact arithmetic on its
arguments (no measurement). The roofline is a model: a step costs max(bytes /
bandwidth, FLOPs / peak) per part, weights read once per step, the KV cache once per
sequence, nothing cached in L2 across the step.
"""

from __future__ import annotations

import dataclasses

from ..checks import check_int, check_real
from .decode import MODELS, ModelConfig
from .sim import check_count


@dataclasses.dataclass(frozen=True)
class MLAConfig:
    """Multi-head latent attention's cache (DeepSeek-V2/V3): one latent row a token per
    layer, ``kv_rank`` compressed columns (the values' source) + ``rope_dim`` decoupled
    rotary key columns, read by all ``H_q`` query heads."""

    name: str
    layers: int
    H_q: int
    kv_rank: int
    rope_dim: int
    cite: str

    def __post_init__(self):
        for field in ("layers", "H_q", "kv_rank", "rope_dim"):
            object.__setattr__(self, field, check_count(field, getattr(self, field)))

    @property
    def d(self) -> int:
        """The absorbed decode's head dim: kv_rank + rope_dim (576 for DeepSeek-V3)."""
        return self.kv_rank + self.rope_dim

    def kv_bytes_per_token(self, bytes_per_elem: int = 2) -> int:
        return self.layers * self.d * check_count("bytes_per_elem", bytes_per_elem)


#: From the technical reports: layers, query heads, latent rank, rotary dims.
MLA_MODELS: dict[str, MLAConfig] = {
    "DeepSeek-V2": MLAConfig("DeepSeek-V2", 60, 128, 512, 64, "deepseekai2024v2"),
    "DeepSeek-V3": MLAConfig("DeepSeek-V3", 61, 128, 512, 64, "deepseekai2024v3"),
}


def fp8_bytes_per_token(cfg: ModelConfig, block: int = 0) -> float:
    """An fp8 cache's bytes per token: 1 byte an element, plus one fp32 descale per
    (layer, K or V, KV head) amortised over ``block`` tokens (0: one per sequence,
    counted as free, as flash-attn's (B, H_kv) descales)."""
    base = cfg.kv_bytes_per_token(1)
    if check_int("block", block, 0) == 0:
        return float(base)
    return base + 2 * cfg.layers * cfg.H_kv * 4 / block


# ---------------------------------------------------------------------------------
# The whole decode step
# ---------------------------------------------------------------------------------


def step_roofline(
    params: float,
    kv_bytes_per_token: float,
    attn_flops_per_token: float,
    B: int,
    context: int,
    N_q: int = 1,
    weight_bytes: float = 2.0,
) -> dict:
    """One decode step of a dense model, split in its two parts.

    Weights: 2 ``params`` FLOPs per new token, B N_q tokens, ``params * weight_bytes``
    bytes read once (shared by the batch). Attention: ``attn_flops_per_token`` (4 H_q d
    layers) per (new token, cached token), B ``context`` cached tokens of
    ``kv_bytes_per_token`` each, read once per sequence. Returns bytes, FLOPs and
    intensity (FLOPs a byte) of each: the weights' grows with B N_q, attention's with
    N_q only (B cancels).
    """
    B, context, N_q = (check_count(n, x) for n, x in (("B", B), ("context", context),
                                                      ("N_q", N_q)))  # fmt: skip
    # amounts: bytes and FLOPs, finite; those the intensities divide by, > 0
    params = check_real("params", params, positive=True)
    kv_bytes_per_token = check_real("kv_bytes_per_token", kv_bytes_per_token,
                                    positive=True)  # fmt: skip
    attn_flops_per_token = check_real("attn_flops_per_token", attn_flops_per_token, 0)
    weight_bytes = check_real("weight_bytes", weight_bytes, positive=True)
    w_bytes = params * weight_bytes
    w_flops = 2 * params * B * N_q
    kv = B * context * kv_bytes_per_token
    a_flops = attn_flops_per_token * B * N_q * context
    return {
        "weight_bytes": w_bytes,
        "weight_flops": w_flops,
        "weight_intensity": w_flops / w_bytes,
        "kv_bytes": kv,
        "attn_flops": a_flops,
        "attn_intensity": a_flops / kv,
    }


def step_time(step: dict, hbm_bytes_per_s: float, flops_per_s: float) -> dict:
    """Roofline time of each part of ``step_roofline``'s step, in seconds; the HBM
    bandwidth and the peak FLOP rate are finite numbers > 0."""
    hbm_bytes_per_s = check_real("hbm_bytes_per_s", hbm_bytes_per_s, positive=True)
    flops_per_s = check_real("flops_per_s", flops_per_s, positive=True)
    w = max(step["weight_bytes"] / hbm_bytes_per_s, step["weight_flops"] / flops_per_s)
    a = max(step["kv_bytes"] / hbm_bytes_per_s, step["attn_flops"] / flops_per_s)
    return {"weights": w, "attention": a, "total": w + a}


def model_step(
    cfg: ModelConfig,
    params: float,
    B: int,
    context: int,
    N_q: int = 1,
    kv_bytes=2,
    weight_bytes: float = 2.0,
):
    """``step_roofline`` for a GQA model: attention FLOPs 4 H_q d layers per pair;
    ``weight_bytes`` per parameter (2 for bf16, 0.625 for 4-bit Q4_1, ...)."""
    return step_roofline(
        params,
        cfg.kv_bytes_per_token(kv_bytes),
        4 * cfg.H_q * cfg.d * cfg.layers,
        B,
        context,
        N_q,
        weight_bytes,
    )


# ---------------------------------------------------------------------------------
# Compulsory traffic, cascade, paging as reported
# ---------------------------------------------------------------------------------


def compulsory_elements(
    B: int, H_kv: int, N: int, d: int, group: int = 1, N_q: int = 1
) -> int:
    """Elements one decode step must move at least: every K and V element once, Q read
    and O written once (what an L2 that kept a KV head for its group would give)."""
    B, H_kv, N, d = (check_count(n, x) for n, x in
                     (("B", B), ("H_kv", H_kv), ("N", N), ("d", d)))  # fmt: skip
    rows = B * H_kv * check_count("group", group) * check_count("N_q", N_q)
    return 2 * B * H_kv * N * d + 2 * rows * d


def cascade_bytes(B: int, prefix: int, suffix: int, kv_bytes_per_token: float) -> dict:
    """KV bytes one step reads with ``B`` requests sharing a ``prefix``-token prompt and
    ``suffix`` tokens of their own: per request (the prefix read B times) against
    cascade (the shared prefix's partial computed once for all B, then merged)."""
    B, suffix = check_count("B", B), check_count("suffix", suffix)
    prefix = check_count("prefix", prefix)
    kv_bytes_per_token = check_real("kv_bytes_per_token", kv_bytes_per_token, 0)
    return {
        "per_request": B * (prefix + suffix) * kv_bytes_per_token,
        "cascade": (prefix + B * suffix) * kv_bytes_per_token,
    }


#: The vLLM paper's Figure 2 (kwon2023efficient): the share of KV-cache memory that
#: holds token states in prior systems (Orca's three reservation policies span it)
#: and in vLLM, whose waste is under 4% (only the last page of a sequence is partly
#: empty).
VLLM_REPORTED = {"prior_used": (0.204, 0.382), "vllm_waste_below": 0.04}


__all__ = [
    "MLAConfig",
    "MLA_MODELS",
    "MODELS",
    "VLLM_REPORTED",
    "cascade_bytes",
    "compulsory_elements",
    "fp8_bytes_per_token",
    "model_step",
    "step_roofline",
    "step_time",
]
