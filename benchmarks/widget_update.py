"""Time the widget's Python side: one control change -> new estimate, result, options and chart specs.

Usage: ``python benchmarks/widget_update.py [--n 50] [--model llama-3.1-8b] [--inline] [--json]``. Prints medians
(ms); ``--inline`` gives the model as an inline config dict (the preset's config, as the custom model sends it):

* ``update (cold)``: a front-end write of ``scenario_data`` with the caches cleared first (the engine's
  cached parts too), so every estimate (the scenario and the 22 scaling stops) is recomputed from nothing:
  the worst case of moving a control
  (moving the micro-batch or sequence slider reuses that axis' curve: about half of it);
* ``update (warm)``: the same writes again, estimates cached (moving back to a value seen before);
* ``scaling view (cold)``: ``charts.scaling_data`` + ``scaling_spec`` alone, cache cleared;
* ``breakdown + result``: ``breakdown_spec`` + ``build_result`` for one estimate;
* ``update with 3 pins`` (cold and warm): the same writes with three pinned scenarios, so each update also
  rebuilds the comparison (the pins' estimates are kept from when they were pinned);
* the JSON size of what one update sends to the browser (``comparison`` with the three pins).
The browser round trip (kernel message + vega re-embed) is not measured here.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

from memsim_widget import charts
from memsim_widget.catalog.models import PRESETS
from memsim_widget.engine import core
from memsim_widget.widget import MemSim, build_result, merge


def _clear_cache() -> None:
    """Forget cached estimates (the engine memoises them per scenario), the engine's cached parts (model
    states and activation terms, ``engine/caches/parts_cache``) and cached scaling curves."""
    parts = importlib.import_module("memsim_widget.engine.caches.parts_cache") if _has_parts_cache() else None
    for fn in (getattr(core, "_estimate", None), parts, getattr(charts, "_scaling_points", None)):
        clear = getattr(fn, "cache_clear", None)
        if clear is not None:
            clear()


def _has_parts_cache() -> bool:
    """Whether this version of the engine caches its parts (older ones, measured for comparison, do not)."""
    return importlib.util.find_spec("memsim_widget.engine.caches.parts_cache") is not None


def _median_ms(fn: Callable[[int], Any], n: int, cold: bool) -> float:
    """Median wall time of ``fn(i)`` over ``n`` calls, in milliseconds."""
    times = []
    for i in range(n):
        if cold:
            _clear_cache()
        t0 = time.perf_counter()
        fn(i)
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def main() -> None:
    """Run the benchmark and print the medians."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=50, help="updates per measurement (default 50)")
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--inline", action="store_true", help="the model as an inline config dict (its preset's)")
    ap.add_argument("--json", action="store_true", help="print the numbers as JSON")
    args = ap.parse_args()

    model = dict(PRESETS[args.model]) if args.inline else args.model
    sim = MemSim(model=model, charts_js=False)
    mbs = [1, 2, 4, 8, 16]
    seqs = [1024, 2048, 4096, 8192]
    moves = [
        {"micro_batch_size": mbs[i % len(mbs)], "seq_len": seqs[(i // len(mbs)) % len(seqs)]}
        for i in range(args.n)
    ]

    def ui_update(i: int) -> None:
        sim.scenario_data = merge(sim.scenario_data, moves[i])
        assert sim.error == "", sim.error

    ui_update(0)  # warm imports
    cold = _median_ms(ui_update, args.n, cold=True)
    warm = _median_ms(ui_update, args.n, cold=False)
    est = sim.estimate

    def scaling(_: int) -> None:
        charts.scaling_spec(charts.scaling_data(est, sim.headroom), sim.headroom, est.gpu.name)

    def breakdown(_: int) -> None:
        charts.breakdown_spec(est, sim.headroom)
        build_result(est, sim.headroom)

    scale_cold = _median_ms(scaling, args.n, cold=True)
    bd = _median_ms(breakdown, args.n, cold=False)
    for method in ("full", "lora", "qlora"):
        sim.set(method=method).pin()
    pins_cold = _median_ms(ui_update, args.n, cold=True)
    pins_warm = _median_ms(ui_update, args.n, cold=False)
    sizes = {
        name: len(json.dumps(getattr(sim, name)))
        for name in ("scenario_data", "options", "result", "charts", "comparison")
    }
    out = {
        "model": args.model + (" (inline)" if args.inline else ""),
        "n": args.n,
        "update_cold_ms": round(cold, 2),
        "update_warm_ms": round(warm, 2),
        "scaling_view_cold_ms": round(scale_cold, 2),
        "breakdown_and_result_ms": round(bd, 2),
        "update_3_pins_cold_ms": round(pins_cold, 2),
        "update_3_pins_warm_ms": round(pins_warm, 2),
        "update_payload_bytes": sizes,
    }
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print(f"MemSim Python-side update, {out['model']}, median of {args.n}")
    print(f"  update (cold: estimate + 22 scaling stops)  {cold:7.2f} ms")
    print(f"  update (warm: estimates cached)             {warm:7.2f} ms")
    print(f"  scaling view alone (cold)                   {scale_cold:7.2f} ms")
    print(f"  breakdown spec + result                     {bd:7.2f} ms")
    print(f"  update with 3 pins (cold)                   {pins_cold:7.2f} ms")
    print(f"  update with 3 pins (warm)                   {pins_warm:7.2f} ms")
    print("  payload per update: " + ", ".join(f"{k} {v / 1024:.1f} KiB" for k, v in sizes.items()))


if __name__ == "__main__":
    main()
