"""``recommend`` speed: seconds per answer on the README's and issue 23's cases, cold and warm.

Cold: every engine cache cleared first (``estimate``'s, the parts cache, the planner's vector rows), as on a
fresh scenario in the widget; warm: the same call again. The target is under 1 s cold for each case.

Run: python benchmarks/recommend_speed.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from memsim_widget.engine.caches import parts_cache
from memsim_widget.engine.core import _estimate
from memsim_widget.plan import recommend, vector

#: The cases users bring: the README's example, issue 23's, and the test suite's larger ones.
CASES: dict[str, dict[str, Any]] = {
    "8b-4090-2k (README)": {"model": "llama-3.1-8b", "gpu": "rtx-4090", "seq_len": 2048},
    "70b-qlora-2x4090-4k": {
        "model": "llama-3.1-70b",
        "gpu": "rtx-4090",
        "seq_len": 4096,
        "method": "qlora",
        "parallel": {"dp": 2},
    },  # fmt: skip
    "qwen3-30b-a3b-8xh100": {
        "model": "qwen3-30b-a3b",
        "gpu": "h100-sxm-80gb",
        "seq_len": 8192,
        "micro_batch_size": 4,
        "parallel": {"dp": 8},
    },  # fmt: skip
    "70b-8xh100": {"model": "llama-3.1-70b", "parallel": {"dp": 8}},
    "mixtral-ep2": {"model": "mixtral-8x7b", "parallel": {"dp": 8, "ep": 2}, "seq_len": 4096},
    "1b-a100 (fits)": {"model": "llama-3.2-1b", "gpu": "a100-80gb"},
    # min GPUs with any knobs searched furthest: 1, 2, 4, the top (1024), then 8 and 16 GPUs
    "70b-full-l4-8k": {"model": "llama-3.1-70b", "gpu": "l4", "seq_len": 8192},
}


def clear_caches() -> None:
    """Forget every cached engine result (the model architectures stay parsed)."""
    vector.state_row.cache_clear()
    vector.act_row.cache_clear()
    vector.state_parts.cache_clear()
    vector.KEY_TABLES.clear()
    _estimate.cache_clear()
    parts_cache.cache_clear()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3, help="runs per case; the best is printed")
    args = ap.parse_args()
    print(f"{'case':<24} {'cold s':>7} {'warm s':>7}  answer")
    worst = 0.0
    for name, sc in CASES.items():
        recommend(sc)  # import and parse once
        cold = warm = float("inf")
        for _ in range(args.repeat):
            clear_caches()
            t0 = time.perf_counter()
            rec = recommend(sc)
            cold = min(cold, time.perf_counter() - t0)
            t0 = time.perf_counter()
            recommend(sc)
            warm = min(warm, time.perf_counter() - t0)
        worst = max(worst, cold)
        answer = (
            "fits"
            if rec.fits
            else (rec.changes[0].label if rec.changes else f"no lever fits: {getattr(rec, 'bound', None)}")
        )
        print(f"{name:<24} {cold:>7.3f} {warm:>7.3f}  {answer[:90]}")
    print(f"slowest cold answer: {worst:.3f} s (target: under 1 s)")


if __name__ == "__main__":
    main()
