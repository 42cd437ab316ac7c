"""Write the catalog table of docs/gpus.md from catalog/gpus.json (the records are the one source; a test checks
the page holds this table): ``python scripts/gpu_table.py`` rewrites everything below "## The table"."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from memsim_widget.catalog.gpus import GPUS  # noqa: E402

DOC = ROOT / "docs" / "gpus.md"
MARK = "## The table\n"


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


def page() -> str:
    """docs/gpus.md with its table rewritten."""
    head = DOC.read_text().split(MARK)[0]
    return f"{head}{MARK}\n{table()}"


if __name__ == "__main__":
    DOC.write_text(page())
    print(f"wrote {DOC}")
