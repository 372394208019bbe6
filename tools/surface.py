"""The book's public surface and the outputs a refactor must keep, as one JSON.

    python tools/surface.py --write   # regenerate tests/data/surface.json
    python tools/surface.py --check   # compare with it; print what changed (exit 1)

The snapshot holds:

* ``surface``: for each family package ``kernels.<family>`` (every package directly
  under ``kernels/`` but the engines ``timing`` and ``machine_code``), for
  ``kernels.common``, ``kernels.naive``, ``kernels.runtime`` and every public module
  under ``attention/`` (``attention.explorers``' own modules by their ``__all__`` only):
  its public names (``__all__`` if defined, else the names without ``_`` that the
  module defines itself, its submodules left out) with the ``inspect.signature`` of
  each callable, or a description of each constant;
* ``files``: the sha256 of ``kernels/flash/compile_peaks.json`` and of the
  committed SASS reports ``benchmarks/static/*.json``;
* ``explorers``: the sha256 of the JSON each static twin puts on the page
  (``Explorer.to_json``) for the arguments the chapters and the landing page use;
  calls whose arguments a chapter computes (a trained model, a photograph) are taken
  with their defaults, or left out (``EXPLORER_CALLS`` says which);
* ``results``: the results-file schema: the key structure of a file ``save_results``
  writes (records of every kind, the summary), ``STAT_KEYS``, ``GPU_FIELDS``,
  ``MIN_REPS``, ``Record``'s fields, the suites ``benchmarks/run.py`` knows, and what
  ``validate_results`` says about planted bad files.

Nothing here names a module that the families' refactor moves
(``kernels.timing.<family>``, ``kernels.machine_code.<x>_check``,
``benchmarks/suite_*``): only the family packages' public names, the engines' results
API and the files.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import importlib
import inspect
import json
import pathlib
import re
import sys
import tempfile
import types

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
SNAPSHOT = ROOT / "tests" / "data" / "surface.json"
ENGINES = ("timing", "machine_code")
KERNEL_MODULES = ("kernels.common", "kernels.naive", "kernels.runtime")

#: (explorer module, static twin, keyword arguments, where the call comes from)
EXPLORER_CALLS = [
    ("naive_traffic", "static_naive_traffic_explorer",
     dict(n=1024, m=None, d=64, dtype="float16"), "ch1"),
    ("maps", "static_mask_explorer", dict(n_q=4, n_k=7, kind="causal"), "ch1"),
    ("pretrained", "static_pretrained_explorer", {}, "defaults (ch1 picks its head)"),
    ("online_softmax", "static_online_softmax_explorer", dict(block=4), "ch2"),
    ("tile_size", "static_tile_size_explorer",
     dict(N=1024, d=64, sram_kib=192, Br=64, Bc=64), "ch2"),
    ("roofline", "static_roofline_explorer",
     dict(gpu="H100", N=4096, d=128, dtype="float16", algorithm="flash2"), "ch2"),
    ("temperature", "static_temperature_explorer", dict(tau=1.0),
     "defaults (ch3 passes its own scores)"),
    ("estimators", "static_estimator_explorer",
     dict(method="Gumbel-softmax ST", tau=1.0), "defaults (ch3 passes its own logits)"),
    ("topk_traffic", "static_topk_traffic_explorer", dict(N=4096, d=64, k=8), "ch3"),
    ("deformable_traffic", "static_deformable_traffic_explorer",
     dict(side=64, d=32, r=4, n_points=4, n_levels=4), "ch4"),
    ("decode", "static_decode_explorer",
     dict(B=8, N=8192, H_q=32, H_kv=8, d=128, dtype="float16", n_splits=4,
          page_size=16, gpu="H100"), "ch5"),
    ("ring", "static_context_parallel_explorer",
     dict(N=262144, P=8, heads=2, d=128, causal=True, layout="zigzag",
          link="NVLink 4", gpu="H100"), "ch6"),
    ("blockmask", "static_block_mask_explorer",
     dict(kind="window", N=8192, block_size=128, window=1024), "ch7"),
    ("sparse", "static_sparse_explorer", {}, "ch8"),
    ("landing", "static_teaser", {}, "intro.md"),
]  # fmt: skip
# Left out: attention_map_explorer (ch1's trained maps) and sampling_points_explorer
# (ch4's photograph and trained offsets) have no call without the chapter's state.


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _clean(text: str) -> str:
    """A repr without memory addresses (they change from run to run)."""
    return re.sub(r" at 0x[0-9a-fA-F]+", "", text)


def _describe(value, depth: int = 0):
    """A JSON description of a constant: plain values as they are (sets sorted),
    anything else by its type."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value if not isinstance(value, float) or value == value else "nan"
    if depth > 3:
        return f"<{type(value).__name__}>"
    if isinstance(value, (list, tuple)):
        return [_describe(v, depth + 1) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((_describe(v, depth + 1) for v in value), key=repr)
    if isinstance(value, dict):
        return {str(k): _describe(v, depth + 1) for k, v in value.items()}
    return f"<{type(value).__module__}.{type(value).__qualname__}>"


def _signature(obj) -> str:
    try:
        return _clean(str(inspect.signature(obj)))
    except (TypeError, ValueError):
        return "<no signature>"


def public_names(mod: types.ModuleType) -> dict:
    """Name -> its signature (callables) or description (constants)."""
    names = getattr(mod, "__all__", None)
    if names is None:
        names = [
            n
            for n, v in vars(mod).items()
            if not n.startswith("_")
            and not isinstance(v, types.ModuleType)
            and getattr(v, "__module__", mod.__name__) == mod.__name__
            and type(v).__name__ != "_Feature"  # from __future__ import annotations
        ]
    out = {}
    for n in sorted(names):
        v = getattr(mod, n)
        if isinstance(v, types.ModuleType):
            out[n] = f"<module {v.__name__}>"
        elif callable(v):
            kind = "class" if inspect.isclass(v) else "call"
            out[n] = f"{kind} {n}{_signature(v)}"
        else:
            out[n] = _describe(v)
    return out


def surface_modules() -> list[str]:
    """The modules whose public names the snapshot holds."""
    families = sorted(
        f"kernels.{p.parent.name}"
        for p in (ROOT / "kernels").glob("*/__init__.py")
        if p.parent.name not in ENGINES
    )
    attention = []
    for path in sorted((ROOT / "attention").rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if any(p.startswith("_") for p in parts):
            continue
        attention.append(".".join(parts))
    return families + list(KERNEL_MODULES) + attention


def surface() -> dict:
    out = {}
    for name in surface_modules():
        mod = importlib.import_module(name)
        if name.startswith("attention.explorers.") and not hasattr(mod, "__all__"):
            continue  # an explorer's internals: only what it lends by __all__
        out[name] = public_names(mod)
    return out


def files() -> dict:
    paths = [ROOT / "kernels" / "flash" / "compile_peaks.json"]
    paths += sorted((ROOT / "benchmarks" / "static").glob("*.json"))
    return {str(p.relative_to(ROOT)): _sha(p.read_bytes()) for p in paths}


def explorers() -> dict:
    out = {}
    for module, twin, kwargs, where in EXPLORER_CALLS:
        mod = importlib.import_module(f"attention.explorers.{module}")
        text = getattr(mod, twin)(**kwargs).to_json()
        call = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
        out[f"{module}.{twin}({call})"] = {"from": where, "sha256": _sha(text.encode())}
    return out


def structure(x):
    """The key structure of a JSON value: dicts by their keys (recursively), lists by
    the union of their items' structures, scalars by their JSON type."""
    if isinstance(x, dict):
        return {k: structure(v) for k, v in sorted(x.items())}
    if isinstance(x, list):
        kinds = {json.dumps(structure(v), sort_keys=True) for v in x}
        return [json.loads(k) for k in sorted(kinds)]
    return {bool: "bool", int: "number", float: "number", str: "string"}.get(
        type(x), "null" if x is None else type(x).__name__
    )


def results_schema() -> dict:
    from kernels.timing import records, results

    run = importlib.import_module("benchmarks.run")
    rec = records.Record
    stats = {k: 1.0 for k in records.STAT_KEYS} | {"reps": records.MIN_REPS}
    shape = {"B": 1, "H": 2, "N": 128, "d": 64, "causal": False}
    common = dict(suite="flash", op="attention", mode="fwd", dtype="float16")
    rows = [
        rec(impl="triton", shape=shape, ms=1.0, tflops=1.0, gbps=1.0,
            peak_mem_bytes=1, stats=stats, stage="goal", **common),
        rec(impl="naive", shape=shape, ms=1.0, stats=stats, stage="goal", **common),
        rec(impl="sdpa-flash", shape=shape, ms=1.0, stats=stats, stage="sweep",
            **common),
        rec(impl="sdpa-math", shape=shape, error="unsupported", detail="why",
            stage="sweep", **common),
    ]  # fmt: skip
    prov = {k: None for k in results.GPU_FIELDS} | {
        "gpu": "Fake GPU",
        "capability": [9, 0],
        "torch": "t",
        "triton": "t",
        "cuda": "c",
        "date": "2026-01-01",
        "missing": {k: "planted" for k in results.GPU_FIELDS},
    }
    check = [{"name": "fwd", "max_err": 0.0, "tol": 1e-3, "ok": True}]
    with tempfile.TemporaryDirectory() as tmp:
        path = pathlib.Path(tmp) / "fake.json"
        results.save_results("flash", rows, check, path=path, provenance=prov)
        data = json.loads(path.read_text())
    bad_record = json.loads(json.dumps(data))
    r0 = bad_record["suites"]["flash"]["records"][0]
    r0.update(mode="bwd", stage=None, ms=2.0)
    del r0["stats"]["p20_ms"]
    return {
        "file": structure(data),
        "valid": results.validate_results(data),
        "problems": {
            "empty": results.validate_results({}),
            "no provenance": results.validate_results({"suites": {"x": {}}}),
            "bad record": results.validate_results(bad_record),
        },
        "STAT_KEYS": list(records.STAT_KEYS),
        "GPU_FIELDS": list(results.GPU_FIELDS),
        "MIN_REPS": records.MIN_REPS,
        "Record": [f.name for f in dataclasses.fields(rec)],
        "suites": list(run.SUITES),
    }


def snapshot() -> dict:
    return {
        "surface": surface(),
        "files": files(),
        "explorers": explorers(),
        "results": results_schema(),
    }


def dumps(snap: dict) -> str:
    return json.dumps(snap, indent=1, sort_keys=True) + "\n"


def _flat(x, path=""):
    if isinstance(x, dict) and x:
        for k, v in x.items():
            yield from _flat(v, f"{path}/{k}")
    else:
        yield path, json.dumps(x, sort_keys=True)


def diff(old: dict, new: dict) -> list[str]:
    """What changed from ``old`` to ``new``, one readable line per leaf."""
    a, b = dict(_flat(old)), dict(_flat(new))
    lines = [f"- {p}: {a[p]}" for p in sorted(a.keys() - b.keys())]
    lines += [f"+ {p}: {b[p]}" for p in sorted(b.keys() - a.keys())]
    lines += [
        f"~ {p}:\n    was {a[p]}\n    now {b[p]}"
        for p in sorted(a.keys() & b.keys())
        if a[p] != b[p]
    ]
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    what = ap.add_mutually_exclusive_group(required=True)
    what.add_argument("--write", action="store_true", help=f"write {SNAPSHOT}")
    what.add_argument("--check", action="store_true", help="compare with it")
    args = ap.parse_args(argv)
    snap = json.loads(dumps(snapshot()))
    if args.write:
        SNAPSHOT.parent.mkdir(parents=True, exist_ok=True)
        SNAPSHOT.write_text(dumps(snap))
        print(f"wrote {SNAPSHOT.relative_to(ROOT)}")
        return 0
    changes = diff(json.loads(SNAPSHOT.read_text()), snap)
    print("\n".join(changes) if changes else "the surface is unchanged")
    return 1 if changes else 0


if __name__ == "__main__":
    sys.exit(main())
