"""The recorded-results files the book plots, and the GPU provenance in them.

``gpu_provenance`` adds the GPU's state (SM count, clocks, power limit, MIG mode,
driver) to ``runtime.describe()``; ``summarize`` names the best SDPA backend that ran
and the speed-up against naive per case (causal and not apart). ``save_results`` merges
a suite's rows into ``benchmarks/results/<gpu-slug>.json`` and ``validate_results``
checks such a file (the schema is in ``kernels.timing.bench``'s docstring).
``load_results`` reads every recorded file back for the chapters; it never invents a
number: with no files it returns an empty list, and chapters say so. Every name here is
also reachable as ``kernels.timing.bench.<name>``.
"""

from __future__ import annotations

import json
import math
import pathlib
import warnings
from collections.abc import Callable, Iterable

import torch

from .. import runtime
from .records import MIN_REPS, RESULTS_DIR, STAT_KEYS, Record, clip_text


def results_path(gpu: str | None = None) -> pathlib.Path:
    gpu = gpu or runtime.gpu_name()
    if gpu is None:
        raise RuntimeError("no GPU: nothing to name a results file after")
    return RESULTS_DIR / f"{runtime.slug(gpu)}.json"


# ---------------------------------------------------------------------------------
# Provenance: which GPU, in what state.
# ---------------------------------------------------------------------------------

#: provenance key -> the ``nvidia-smi --query-gpu`` field it comes from.
SMI_FIELDS = {
    "driver": "driver_version",
    "clock_sm_mhz": "clocks.sm",
    "clock_mem_mhz": "clocks.mem",
    "clock_sm_max_mhz": "clocks.max.sm",
    "clock_mem_max_mhz": "clocks.max.mem",
    "power_limit_w": "power.limit",
    "power_max_limit_w": "power.max_limit",
    "mig_mode": "mig.mode.current",
    "persistence_mode": "persistence_mode",
    "pstate": "pstate",
    "temperature_c": "temperature.gpu",
    "pci_bus_id": "pci.bus_id",
}
#: provenance key -> ``torch.cuda.get_device_properties`` attribute.
PROP_FIELDS = {
    "sm_count": "multi_processor_count",
    "total_memory_bytes": "total_memory",
    "l2_cache_bytes": "L2_cache_size",
}
#: Every key ``gpu_provenance`` adds to ``runtime.describe()`` (a value or null).
GPU_FIELDS = (*PROP_FIELDS, *SMI_FIELDS)


def _run_nvidia_smi(fields: list[str]) -> str:
    import shutil
    import subprocess

    exe = shutil.which("nvidia-smi")
    if exe is None:
        raise FileNotFoundError("nvidia-smi not found on PATH")
    return subprocess.run(
        [exe, f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=True,
        timeout=20,
    ).stdout


def gpu_provenance(smi: Callable[[list[str]], str] | None = None) -> dict:
    """``runtime.describe()`` plus the GPU's state: SM count, memory, L2 (torch),
    driver, current and max clocks, power limit, MIG mode, persistence, pstate,
    temperature (``nvidia-smi --query-gpu``). Every key of ``GPU_FIELDS`` is present;
    one that could not be read is null, and ``missing[key]`` says why.
    ``smi(fields) -> csv text`` stands in for nvidia-smi in tests."""
    prov = runtime.describe()
    missing: dict[str, str] = {}
    props = None
    if runtime.HAS_CUDA:
        try:
            props = torch.cuda.get_device_properties(torch.cuda.current_device())
        except Exception as e:  # noqa: BLE001 - recorded as the reason
            reason = f"get_device_properties: {type(e).__name__}: {e}"
    else:
        reason = "no CUDA device (torch.cuda.is_available() is False)"
    for key, attr in PROP_FIELDS.items():
        value = getattr(props, attr, None) if props is not None else None
        prov[key] = int(value) if value is not None else None
        if value is None:
            missing[key] = (
                reason if props is None else f"torch has no device property {attr}"
            )
    keys, fields = list(SMI_FIELDS), list(SMI_FIELDS.values())
    try:
        lines = [
            ln for ln in (smi or _run_nvidia_smi)(fields).splitlines() if ln.strip()
        ]
        if not lines:
            raise RuntimeError("nvidia-smi listed no GPU")
        rows = [[c.strip() for c in ln.split(",")] for ln in lines]
        bus = getattr(props, "pci_bus_id", None)
        row = rows[0]
        if len(rows) > 1 and bus is not None:  # the GPU torch uses (by PCI bus id)
            for r in rows:
                if len(r) == len(fields) and r[-1].lower().endswith(
                    f"{int(bus):02x}:00.0"
                ):
                    row = r
        if len(row) != len(fields):
            raise RuntimeError(f"nvidia-smi gave {len(row)} fields for {len(fields)}")
        for key, field, value in zip(keys, fields, row):
            if value in ("", "[N/A]", "N/A", "[Not Supported]", "[Unknown Error]"):
                prov[key] = None
                missing[key] = f"nvidia-smi {field}: {value or 'empty'}"
            else:
                try:
                    numeric = key.endswith(("_mhz", "_w", "_c"))
                    prov[key] = float(value) if numeric else value
                except ValueError:
                    prov[key] = value
    except Exception as e:  # noqa: BLE001 - recorded as the reason
        why = f"{type(e).__name__}: {clip_text(str(e), 200)}"
        for key in keys:
            prov[key], missing[key] = None, why
    prov["missing"] = missing
    return prov


# ---------------------------------------------------------------------------------
# Summaries of a suite's records: best SDPA backend and speed-up against naive.
# ---------------------------------------------------------------------------------


def _shape_key(shape: dict) -> str:
    return json.dumps(shape, sort_keys=True, default=str)


def summarize(records: Iterable) -> list[dict]:
    """One row per attention case (op, mode, dtype, shape; causal and not are separate
    rows) with each implementation's median: ``triton_ms``, ``naive_ms``,
    ``speedup_vs_naive`` (naive time / Triton time), ``sdpa`` (every SDPA backend: its
    ms, or its error), ``best_sdpa`` (the fastest backend that ran, by name, or None)
    with ``best_sdpa_ms``, and ``best_sdpa_vs_triton`` (best SDPA time / Triton time:
    above 1 the Triton kernel is faster). Tile sweeps (BLOCK_M in the shape) are
    left out."""
    groups: dict = {}
    for r in records:
        r = r.to_dict() if isinstance(r, Record) else r
        sh = r.get("shape") or {}
        if not str(r.get("op", "")).startswith("attention") or "BLOCK_M" in sh:
            continue
        key = (r["op"], r["mode"], r["dtype"], _shape_key(sh))
        groups.setdefault(key, {"stage": r.get("stage"), "shape": sh, "impls": {}})
        groups[key]["impls"][r["impl"]] = r
    rows = []
    for (op, mode, dtype, _), g in groups.items():
        impls = g["impls"]

        def ms(name, impls=impls):
            r = impls.get(name)
            return r["ms"] if r and r.get("error") is None else None

        sdpa = {
            n: (r["ms"] if r.get("error") is None else None)
            for n, r in impls.items()
            if n.startswith("sdpa")
        }
        sdpa_errors = {
            n: {"error": r.get("error"), "detail": r.get("detail")}
            for n, r in impls.items()
            if n.startswith("sdpa") and r.get("error")
        }
        ran = {n: t for n, t in sdpa.items() if t is not None}
        best = min(ran, key=ran.get) if ran else None
        tri, naive = ms("triton"), ms("naive")
        rows.append(
            {
                "op": op,
                "mode": mode,
                "dtype": dtype,
                "shape": g["shape"],
                "stage": g["stage"],
                "causal": bool(g["shape"].get("causal", False)),
                "triton_ms": tri,
                "naive_ms": naive,
                "speedup_vs_naive": naive / tri if tri and naive else None,
                "sdpa_ms": sdpa,
                "sdpa_failed": sdpa_errors,
                "best_sdpa": best,
                "best_sdpa_ms": ran.get(best),
                "best_sdpa_vs_triton": ran[best] / tri if best and tri else None,
            }
        )
    return rows


# ---------------------------------------------------------------------------------
# Results files.
# ---------------------------------------------------------------------------------


def summary_line(row: dict) -> str:
    """One ``summarize`` row (a goal shape) as a line of text."""

    def f(x, spec=".3f"):
        return "n/a" if x is None else format(x, spec)

    sh = row["shape"]
    return (
        f"goal {row['mode']} {'causal' if row['causal'] else 'non-causal'} "
        f"{row['dtype']} N={sh.get('N_q')} d={sh.get('d')}: "
        f"triton {f(row['triton_ms'])} ms, "
        f"best SDPA {row['best_sdpa'] or 'none ran'} {f(row['best_sdpa_ms'])} ms "
        f"(best SDPA / triton {f(row['best_sdpa_vs_triton'], '.2f')}), naive "
        f"{f(row['naive_ms'])} ms "
        f"(speed-up vs naive {f(row['speedup_vs_naive'], '.2f')}x)"
    )


def save_results(
    suite: str,
    records: list[Record],
    correctness: list[dict],
    path: pathlib.Path | None = None,
    provenance: dict | None = None,
    extra: dict | None = None,
    top: dict | None = None,
) -> pathlib.Path:
    """Merge one suite's rows into the GPU's results file (other suites are kept).

    The suite's section holds its provenance, correctness checks, records, ``summary``
    (``summarize``) and whatever ``extra`` adds; ``top`` adds keys at the top level (a
    run's ``protocol``)."""
    prov = provenance or runtime.describe()
    path = path or results_path(prov.get("gpu"))
    path.parent.mkdir(parents=True, exist_ok=True)
    data = json.loads(path.read_text()) if path.exists() else {}
    data.update(
        {
            k: prov.get(k)
            for k in ("gpu", "capability", "torch", "triton", "cuda", "date")
        }
    )
    data["gpu_slug"] = runtime.slug(prov.get("gpu") or "unknown")
    data.update(top or {})
    rows = [r.to_dict() if isinstance(r, Record) else r for r in records]
    data.setdefault("suites", {})[suite] = {
        "provenance": prov,
        "correctness": correctness,
        "records": rows,
        "summary": summarize(rows),
        **(extra or {}),
    }
    # strict JSON: json.dumps writes a float NaN/inf as a bare NaN/Infinity (never
    # passing it to ``default``), which is not JSON; they are written as null
    path.write_text(
        json.dumps(
            _finite(data),
            indent=1,
            sort_keys=True,
            default=_json_default,
            allow_nan=False,
        )
        + "\n"
    )
    return path


_RECORD_TYPES = {
    "suite": str,
    "op": str,
    "impl": str,
    "mode": str,
    "dtype": str,
    "shape": dict,
}


def validate_results(data: dict, *, full_provenance: bool = True) -> list[str]:
    """Problems with a ``benchmarks/run.py`` results file (an empty list: none).

    Checks the top-level keys, each suite's provenance (with ``full_provenance``, every
    ``GPU_FIELDS`` key, null only with a reason in ``missing``), correctness entries,
    each record's fields and types (a timed record has ``stats`` with every
    ``STAT_KEYS`` key and at least ``MIN_REPS`` reps; a failed one an ``error``), and
    the summary rows."""
    bad: list[str] = []
    for k in (
        "gpu",
        "gpu_slug",
        "capability",
        "torch",
        "triton",
        "cuda",
        "date",
        "suites",
    ):
        if k not in data:
            bad.append(f"top level: no {k!r}")
    for name, s in (data.get("suites") or {}).items():
        where = f"suites.{name}"
        for k in ("provenance", "correctness", "records", "summary"):
            if k not in s:
                bad.append(f"{where}: no {k!r}")
        prov = s.get("provenance") or {}
        if full_provenance:
            missing = prov.get("missing")
            if not isinstance(missing, dict):
                bad.append(f"{where}.provenance: no 'missing' reasons")
                missing = {}
            for k in GPU_FIELDS:
                if k not in prov:
                    bad.append(f"{where}.provenance: no {k!r}")
                elif prov[k] is None and not missing.get(k):
                    bad.append(f"{where}.provenance: {k!r} is null with no reason")
        for i, c in enumerate(s.get("correctness") or []):
            if set(c) < {"name", "max_err", "tol", "ok"} or not isinstance(
                c.get("ok"), bool
            ):
                bad.append(
                    f"{where}.correctness[{i}]: needs name, max_err, tol, ok (bool)"
                )
        for i, r in enumerate(s.get("records") or []):
            w = f"{where}.records[{i}]"
            for k, t in _RECORD_TYPES.items():
                if not isinstance(r.get(k), t):
                    bad.append(f"{w}: {k!r} is not {t.__name__}")
            if r.get("mode") not in ("fwd", "fwd+bwd"):
                bad.append(f"{w}: mode {r.get('mode')!r}")
            if r.get("stage") not in ("goal", "sweep"):
                bad.append(f"{w}: stage {r.get('stage')!r}")
            if r.get("ms") is None:
                if not r.get("error"):
                    bad.append(f"{w}: neither ms nor error")
                continue
            st = r.get("stats")
            if not isinstance(st, dict) or set(STAT_KEYS) - set(st):
                bad.append(f"{w}: stats lacks {sorted(set(STAT_KEYS) - set(st or {}))}")
            elif (
                st["reps"] < MIN_REPS
                or not st["min_ms"] <= st["median_ms"] <= st["max_ms"]
            ):
                bad.append(
                    f"{w}: stats reps {st['reps']} or order min <= median <= max"
                )
            elif abs(st["median_ms"] - r["ms"]) > 1e-9 * max(1.0, r["ms"]):
                bad.append(f"{w}: ms is not the median")
        for i, row in enumerate(s.get("summary") or []):
            if (
                row.get("best_sdpa") is not None
                and row["best_sdpa"] not in row["sdpa_ms"]
            ):
                bad.append(f"{where}.summary[{i}]: best_sdpa not among sdpa_ms")
    return bad


def _finite(x):
    """``x`` with every non-finite float (NaN, +-inf) replaced by None, recursively."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


def _json_default(x):
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if hasattr(x, "item") and getattr(x, "ndim", None) == 0:  # NumPy / torch scalars
        return _finite(x.item())
    return str(x)


def load_results(results_dir: pathlib.Path | None = None) -> list[dict]:
    """Every recorded results file, newest first (empty when none are recorded).

    A file that is not readable JSON holding an object is skipped with a warning that
    names it: one damaged file must not stop a chapter from plotting the others."""
    d = results_dir or RESULTS_DIR
    files = sorted(d.glob("*.json")) if d.exists() else []
    out = []
    for f in files:
        try:
            data = json.loads(f.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            warnings.warn(
                f"skipping results file {f}: not readable JSON ({err})", stacklevel=2
            )
            continue
        if not isinstance(data, dict):
            warnings.warn(
                f"skipping results file {f}: expected a JSON object, got "
                f"{type(data).__name__}",
                stacklevel=2,
            )
            continue
        out.append(data)
    return sorted(out, key=lambda r: str(r.get("date") or ""), reverse=True)


def suite_records(results: list[dict], suite: str) -> list[tuple[dict, list[dict]]]:
    """(provenance, records) for each GPU that recorded ``suite``."""
    out = []
    for r in results:
        s = r.get("suites", {}).get(suite)
        if s and s.get("records"):
            out.append((s.get("provenance", r), s["records"]))
    return out


def provenance_label(prov: dict) -> str:
    """A figure caption's provenance line:
    'NVIDIA H200 · torch 2.11 · triton 3.6 · CUDA 12.8 · 2026-11-29'."""
    date = (prov.get("date") or "")[:10]
    return (
        f"{prov.get('gpu')} · torch {prov.get('torch')}"
        f" · triton {prov.get('triton')} · CUDA {prov.get('cuda')} · {date}"
    )
