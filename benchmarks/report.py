"""The benchmarks page's tables, as Markdown: the machine-code report of
``python -m kernels.flash.compile_check --report``
(``benchmarks/static/static-*.json``) and the recorded GPU timings
(``benchmarks/results/*.json``, written by ``make bench``).

Both read files the repository records; neither measures nor invents a number. With
no file there is nothing to show, and the page says which command records one.
"""

from __future__ import annotations

import json
import pathlib

from kernels.machine_code.sass import per_score
from kernels.timing.results import load_results, summarize

ROOT = pathlib.Path(__file__).resolve().parents[1]
STATIC_DIR = ROOT / "benchmarks" / "static"


def load_static(target: str, static_dir: pathlib.Path | None = None) -> dict | None:
    """The recorded machine-code report for ``target`` ("sm90", "sm80"), or None."""
    path = (static_dir or STATIC_DIR) / f"static-{target}.json"
    return json.loads(path.read_text()) if path.is_file() else None


def _cfg(c: dict) -> str:
    return f"{c['BLOCK_M']}x{c['BLOCK_N']} w{c['num_warps']} s{c['num_stages']}"


def _yes(flag) -> str:
    return "yes" if flag else "no"


STATIC_COLUMNS = (
    "kernel",
    "d",
    "mask",
    "tile",
    "regs",
    "spill B",
    "smem KB",
    "loop instr.",
    "thread instr. / score",
    "MMA",
    "FMUL",
    "FFMA",
    "EX2",
    "int",
    "TMA",
    "warp spec.",
)


def static_rows(rep: dict, kernels: tuple[str, ...] | None = None) -> list[tuple]:
    """One row (cells in ``STATIC_COLUMNS`` order) per compiled kernel and shape of a
    machine-code report: tile, registers, spills, shared memory and the hot loop's
    SASS instruction counts: per iteration, and per score element per thread
    (``thread_instructions_per_score``: the loop's count x 32 x warps / (BLOCK_M x
    BLOCK_N), recomputed here from the row's fields by ``sass.per_score``, so tiles of
    4 and 8 warps compare). ``kernels`` filters by kernel name. The mask cell is the
    row's ``mask`` where it has one (the flex report's), else causal or full."""
    rows = []
    for r in rep["kernels"]:
        if kernels and r["kernel"] not in kernels:
            continue
        hl = r.get("hot_loop") or {}
        c = r["config"]
        per = (
            None
            if not hl
            else per_score(
                hl["instructions"], c["BLOCK_M"], c["BLOCK_N"], c["num_warps"]
            )
        )
        rows.append(
            (
                r["kernel"],
                r["head_dim"],
                r.get("mask") or ("causal" if r["causal"] else "full"),
                _cfg(r["config"]),
                r["registers"],
                r["spill_bytes"],
                f"{r['shared_bytes'] / 1024:.0f}",
                hl.get("instructions", "-"),
                "-" if per is None else f"{per:.2f}",
                hl.get("tensor_core", "-"),
                hl.get("FMUL", "-"),
                hl.get("FFMA", "-"),
                hl.get("MUFU.EX2", "-"),
                hl.get("integer", "-"),
                _yes(r.get("tma")),
                _yes(r.get("warp_specialized")),
            )
        )
    return rows


def static_table(rep: dict, kernels: tuple[str, ...] | None = None) -> str:
    """``static_rows`` as a Markdown table."""
    lines = [
        "| " + " | ".join(STATIC_COLUMNS) + " |",
        "|"
        + "|".join("---" if i < 4 else "--:" for i in range(len(STATIC_COLUMNS)))
        + "|",
    ]
    lines += [
        "| " + " | ".join(str(c) for c in row) + " |"
        for row in static_rows(rep, kernels)
    ]
    return "\n".join(lines)


def html_table(columns, rows) -> str:
    """A compact HTML table that scrolls sideways on a narrow screen instead of being
    clipped (the page's Markdown tables would be squeezed into the text column)."""
    import html

    cell = 'style="padding:2px 5px; text-align:right"'
    head = "".join(f"<th {cell}>{html.escape(str(c))}</th>" for c in columns)
    body = "".join(
        "<tr>"
        + "".join(f"<td {cell}>{html.escape(str(c))}</td>" for c in row)
        + "</tr>"
        for row in rows
    )
    return (
        '<div class="report-table" style="overflow-x:auto; max-width:100%">'
        '<table style="font-size:0.7em; white-space:nowrap; '
        'border-collapse:collapse">'
        f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>"
    )


def reference_line(rep: dict) -> str:
    """The recorded figure to beat, in words."""
    ref = rep.get("reference")
    if not ref:
        return ""
    hl = ref["hot_loop"]
    return (
        f"To beat: {ref['what']}: {hl['instructions']} instructions per hot-loop "
        f"iteration, {hl['tensor_core']} tensor-core (HGMMA), {hl['FMUL']} FMUL, "
        f"{hl['FFMA']} FFMA, {hl['MUFU.EX2']} MUFU.EX2, {hl['integer']} integer; "
        f"TMA loads: {_yes(ref.get('tma'))}."
    )


def _ms(x) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def gpu_table(results: list[dict] | None = None) -> str | None:
    """The recorded attention timings (every GPU, every suite), one row per case:
    the Triton kernel, the best PyTorch SDPA backend that ran (named) and naive
    attention, in milliseconds (medians). None when nothing is recorded."""
    results = load_results() if results is None else results
    lines = []
    for res in results:
        for suite, s in sorted(res.get("suites", {}).items()):
            prov = s.get("provenance", res)
            for row in summarize(s.get("records", [])):
                sh = row["shape"]
                lines.append(
                    "| "
                    + " | ".join(
                        str(c)
                        for c in (
                            prov.get("gpu"),
                            suite,
                            row["mode"],
                            "causal" if row["causal"] else "full",
                            row["dtype"],
                            f"{sh.get('B')}x{sh.get('H')}x{sh.get('N_q')}x{sh.get('d')}",
                            _ms(row["triton_ms"]),
                            f"{row['best_sdpa'] or 'none ran'} "
                            f"{_ms(row['best_sdpa_ms'])}",
                            _ms(row["naive_ms"]),
                        )
                    )
                    + " |"
                )
    if not lines:
        return None
    head = (
        "| GPU | suite | pass | mask | dtype | B x H x N x d | Triton ms "
        "| best SDPA ms | naive ms |\n|---|---|---|---|---|---|--:|--:|--:|"
    )
    return head + "\n" + "\n".join(lines)


def load_decode_static(
    target: str, static_dir: pathlib.Path | None = None
) -> dict | None:
    """The recorded machine-code report of the decode kernels for ``target``
    (``kernels.decode.compile_check --report``), or None."""
    path = (static_dir or STATIC_DIR) / f"decode-{target}.json"
    return json.loads(path.read_text()) if path.is_file() else None


DECODE_COLUMNS = (
    "kernel",
    "d",
    "dtype",
    "query rows",
    "cache",
    "tile",
    "regs",
    "spill B",
    "smem KB",
    "loop instr.",
    "MMA",
    "EX2",
    "int",
    "async copies",
    "KV KB / iter.",
)


def decode_rows(rep: dict) -> list[tuple]:
    """One row (cells in ``DECODE_COLUMNS`` order) per compiled case of a decode
    machine-code report: the split-KV kernel's packed query rows (``block_m``: the GQA
    group padded to a tensor-core tile), its cache layout, its key tile (BLOCK_N, warps,
    stages), registers, spills, shared memory and the hot loop's SASS counts, with the
    K/V bytes one loop iteration brings in."""
    rows = []
    for r in rep["kernels"]:
        c, hl = r["case"], r.get("hot_loop") or {}
        block_n, warps, stages = c["tile"]
        kv = r.get("kv_bytes_per_iteration")
        rows.append(
            (
                c["kernel"],
                c["head_dim"],
                c["dtype"],
                c["block_m"],
                c["layout"],
                f"{block_n} w{warps} s{stages}",
                c["registers"],
                c["spills"],
                f"{c['shared'] / 1024:.0f}",
                hl.get("instructions", "-"),
                hl.get("tensor_core", "-"),
                hl.get("MUFU.EX2", "-"),
                hl.get("integer", "-"),
                hl.get("LDGSTS", "-"),
                "-" if kv is None else f"{kv / 1024:.0f}",
            )
        )
    return rows


def load_flex_static(
    target: str, static_dir: pathlib.Path | None = None
) -> dict | None:
    """The recorded machine-code report of the kernels.flex forward for ``target``
    (``kernels.flex.compile_check --report``), or None."""
    path = (static_dir or STATIC_DIR) / f"flex-{target}.json"
    return json.loads(path.read_text()) if path.is_file() else None


def flex_rows(rep: dict) -> list[tuple]:
    """``static_rows`` of a flex machine-code report, two rows per compiled forward:
    its full tiles' loop (``hot_loop``, no mask evaluated) and its partial tiles' loop
    (``partial_loop``, the mask function evaluated per score), so they sit in one
    table with kernels.flash's rows."""
    parts = []
    for r in rep["kernels"]:
        parts.append({**r, "kernel": f"{r['kernel']} full tiles"})
        parts.append(
            {
                **r,
                "kernel": f"{r['kernel']} partial tiles",
                "hot_loop": r["partial_loop"],
            }
        )
    return static_rows({"kernels": parts})


def _per(hl: dict, c: dict) -> float:
    return per_score(hl["instructions"], c["BLOCK_M"], c["BLOCK_N"], c["num_warps"])


def flex_vs_flash(flex: dict, flash: dict, mask: str = "causal") -> str:
    """One line comparing the flex forward for ``mask`` (a flex report's row) with
    kernels.flash's causal ``fwd`` rows of the same head dim (a ``load_static``
    report): flex's full and partial tiles' loops, and flash's loop at the same tile
    (instructions per iteration) or, where flash ships other tiles on the target, its
    lowest instructions per score per thread."""
    r = next(r for r in flex["kernels"] if r["mask"] == mask)
    c, full, part = r["config"], r["hot_loop"], r["partial_loop"]
    line = (
        f"{flex['target']}, flex {mask} forward, d = {r['head_dim']}, tile {_cfg(c)}: "
        f"full tiles {full['instructions']} instructions per iteration "
        f"({_per(full, c):.2f} per score per thread), partial tiles "
        f"{part['instructions']} ({part['instructions'] - full['instructions']:+d}, "
        f"integer {full['integer']} -> {part['integer']}: the mask function)"
    )
    dense = [
        f
        for f in flash["kernels"]
        if (f["kernel"], f["head_dim"], f["causal"]) == ("fwd", r["head_dim"], True)
        and f.get("hot_loop")
    ]
    same = [f for f in dense if f["config"] == c]
    if same:
        hl = same[0]["hot_loop"]
        return line + (
            f"; kernels.flash's causal fwd at the same tile: {hl['instructions']} "
            f"({_per(hl, c):.2f} per score), flex's full tiles "
            f"{full['instructions'] - hl['instructions']:+d} (FMUL {hl['FMUL']} -> "
            f"{full['FMUL']}, integer {hl['integer']} -> {full['integer']})"
        )
    if not dense:
        return line + "; kernels.flash: no causal fwd row recorded"
    best = min(dense, key=lambda f: _per(f["hot_loop"], f["config"]))
    return line + (
        f"; kernels.flash's causal fwd ships other tiles here, its lowest per score: "
        f"{_cfg(best['config'])}, {best['hot_loop']['instructions']} instructions "
        f"({_per(best['hot_loop'], best['config']):.2f} per score)"
    )
