"""The catalog table of docs/gpus.md, written from catalog/gpus.json (the records are the one source): the docs
build puts it where the page says ``<!-- generated: gpu table -->`` (scripts/mkdocs_hooks.py);
``python scripts/gpu_table.py`` prints it."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from memsim_widget.catalog.gpus import GPUS  # noqa: E402


def table() -> str:
    """The markdown table of every catalog card, then each card's capacity source."""
    rows = [
        "| id | label | total_memory (bytes) | GiB | kind | 16-bit / fp8 / fp4 TFLOP/s | HBM GB/s | link GB/s | price $/h |",
        "|---|---|---:|---:|---|---|---:|---:|---:|",
    ]
    for g in GPUS.values():
        p = dict(g.speed.peak_tflops) if g.speed else {}

        def f(k: str, p: dict[str, float] = p) -> str:
            return f"{p[k]:g}" if k in p else "-"

        half = f("bf16") if "bf16" in p else f"{f('fp16')} (fp16)"
        price = f"{g.price.usd_per_gpu_hour:.2f} ({g.price.date})" if g.price else "unknown"
        hbm, link = (f"{g.speed.hbm_gb_s:g}", f"{g.speed.link_gb_s:g}") if g.speed else ("-", "-")
        rows.append(
            f"| {g.id} | {g.label_gb:g} GB | {g.memory_bytes:,} | {g.memory_gib:.2f} | {g.memory_source.kind} | "
            f"{half} / {f('fp8')} / {f('fp4')} | {hbm} | {link} | {price} |"
        )
    rows += ["", "### Sources of the capacities", ""]
    rows += [f"- **{g.id}** ({g.memory_source.kind}): {g.memory_source.source}" for g in GPUS.values()]
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(table(), end="")
