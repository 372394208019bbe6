"""Draw the recorded FlashAttention GPU results: figures/gpu_flash_<gpu>_<what>.png.

Reads every ``benchmarks/results/*.json`` (written by ``benchmarks/run.py`` on a GPU)
and, for each GPU that recorded the ``flash`` suite, draws forward and forward+backward
TFLOP/s against N (fp16, d = 64 and 128, causal and not) and peak memory against N, each
titled with the provenance (GPU, torch, triton, CUDA, date). With no recorded results it
says so and exits 0: nothing is drawn from anything but a measurement.
"""

from __future__ import annotations

import pathlib
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from attention.plots import recorded_timing_figure, use_book_style  # noqa: E402
from kernels.timing.results import (  # noqa: E402
    load_results,
    provenance_label,
    suite_records,
    summarize,
    summary_line,
)

OUT_DIR = ROOT / "figures"


def draw(
    prov: dict, records: list[dict], out_dir: pathlib.Path = OUT_DIR
) -> list[pathlib.Path]:
    """Write this GPU's figures; return their paths."""
    slug = prov.get("gpu_slug") or "".join(
        c if c.isalnum() else "-" for c in (prov.get("gpu") or "gpu").lower()
    )
    label = provenance_label(prov)
    paths = []
    seen, unique = set(), []
    for r in records:  # the goal shapes recur in the sweeps: one point per case
        key = (
            r.get("op"),
            r.get("impl"),
            r.get("mode"),
            r.get("dtype"),
            repr(sorted((r.get("shape") or {}).items())),
        )
        if key not in seen:
            seen.add(key)
            unique.append(r)
    records = unique
    dtypes = sorted({r["dtype"] for r in records if r.get("op") == "attention"})
    for dtype in dtypes:
        for mode in ("fwd", "fwd+bwd"):
            fig, axes = plt.subplots(2, 2, figsize=(10, 7.5), sharex=True)
            for i, d in enumerate((64, 128)):
                for j, causal in enumerate((False, True)):
                    ax = axes[i, j]
                    if (
                        recorded_timing_figure(
                            records,
                            label,
                            d=d,
                            causal=causal,
                            dtype=dtype,
                            metric="tflops",
                            modes=[mode],
                            memory=False,
                            axes=[ax],
                        )
                        is None
                    ):
                        ax.set_axis_off()
                    ax.set_title(f"d = {d}, {'causal' if causal else 'full'}")
            fig.suptitle(
                f"attention {mode}, {dtype}: TFLOP/s (higher is better)\n{label}",
                fontsize=10,
            )
            fig.tight_layout()
            path = out_dir / f"gpu_flash_{slug}_{mode.replace('+', '_')}_{dtype}.png"
            fig.savefig(path)
            plt.close(fig)
            paths.append(path)
    if any(r.get("op") == "attention-memory" for r in records):
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        recorded_timing_figure(records, label, dtype="float16", modes=[], axes=[ax])
        ax.set_title(f"peak memory of one forward, fp16, B=1, H=16, d=64\n{label}")
        fig.tight_layout()
        path = out_dir / f"gpu_flash_{slug}_memory.png"
        fig.savefig(path)
        plt.close(fig)
        paths.append(path)
    return paths


def main() -> int:
    found = suite_records(load_results(), "flash")
    if not found:
        print(
            "no recorded results for the flash suite (run `make bench` on a CUDA "
            "machine)"
        )
        return 0
    use_book_style()
    for prov, records in found:
        for row in summarize(records):
            if row["stage"] == "goal":
                print(summary_line(row))
        for path in draw(prov, records):
            print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
