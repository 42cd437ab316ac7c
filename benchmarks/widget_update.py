"""Time the widget's Python side: one control change -> new estimate, result, options and chart specs.

Usage: ``python benchmarks/widget_update.py [--n 50] [--model llama-3.1-8b] [--inline] [--json]``. Prints medians
(ms); ``--inline`` gives the model as an inline config dict (the preset's config, as the custom model sends it).
An update is timed twice: ``holds the kernel`` is the front-end write of ``scenario_data`` itself (the time the
kernel and the widget's lock are held), ``published`` runs until the scaling chart and summary are published too
(``MemSim.wait_scaling``: a background job computes a scaling view not memoised yet, ``widget/scaling_panel``;
versions without it compute the view inside the write, and both figures are then the same). Between two updates
the previous one's job is waited for, untimed, so that no job competes with the write timed:

* ``update (cold)``: caches cleared first (the estimates, the engine's cached parts and the scaling curves; not the
  allocator replays of a shape, ``alloc_stream``), so every estimate (the scenario and the 22 scaling stops) is
  recomputed (moving the micro-batch or sequence slider reuses that axis' curve: about half of it);
* ``update (new shapes)``: the estimates, scaling curves and allocator replays cleared, the parts kept: what a
  control other than the micro-batch or the length moved to a value never seen costs (22 + 1 new shapes;
  ``benchmarks/estimate_speed.py``'s ``a control moved``);
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


def _clear_cache(shapes: bool = False) -> None:
    """Forget cached estimates (the engine memoises them per scenario), the engine's cached parts (model
    states and activation terms, ``engine/caches/parts_cache``) and cached scaling curves; ``shapes``: the
    estimates, curves and allocator replays (``engine/counters/alloc_stream``), the parts kept."""
    parts = importlib.import_module("memsim_widget.engine.caches.parts_cache") if _has_parts_cache() else None
    if shapes:
        parts = importlib.import_module("memsim_widget.engine.counters.alloc_stream")
    for fn in (getattr(core, "_estimate", None), parts, getattr(charts, "_scaling_points", None)):
        clear = getattr(fn, "cache_clear", None)
        if clear is not None:
            clear()


def _has_parts_cache() -> bool:
    """Whether this version of the engine caches its parts (older ones, measured for comparison, do not)."""
    return importlib.util.find_spec("memsim_widget.engine.caches.parts_cache") is not None


def _median_ms(
    fn: Callable[[int], Any],
    n: int,
    cold: bool,
    shapes: bool = False,
    before: Callable[[], Any] | None = None,
) -> float:
    """Median wall time of ``fn(i)`` over ``n`` calls, in milliseconds (``cold``/``shapes``: ``_clear_cache``
    first; ``before``: called first, untimed)."""
    times = []
    for i in range(n):
        if before is not None:
            before()
        if cold:
            _clear_cache(shapes)
        t0 = time.perf_counter()
        fn(i)
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def _settle(sim: MemSim) -> None:
    """Wait for the scaling view of the last update (nothing to wait for where the write computed it)."""
    wait = getattr(sim, "wait_scaling", None)
    if wait is not None:
        assert wait(120), "the scaling view was not published within 2 minutes"


def _update_ms(
    sim: MemSim, moves: list[dict[str, Any]], n: int, cold: bool, shapes: bool = False
) -> tuple[float, float]:
    """Medians (ms) of a front-end write: the time it holds the kernel, and until its scaling view is published."""

    def hold(i: int) -> None:
        sim.scenario_data = merge(sim.scenario_data, moves[i])
        assert sim.error == "", sim.error

    def published(i: int) -> None:
        hold(i)
        _settle(sim)

    def settle() -> None:
        _settle(sim)

    if not cold:  # each move once first: the estimates and curves the timed writes find cached
        for i in range(n):
            published(i)
    return (
        _median_ms(hold, n, cold, shapes, before=settle),
        _median_ms(published, n, cold, shapes, before=settle),
    )


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

    sim.scenario_data = merge(sim.scenario_data, moves[0])  # warm imports
    _settle(sim)
    cold = _update_ms(sim, moves, args.n, cold=True)
    shapes = _update_ms(sim, moves, args.n, cold=True, shapes=True)
    warm = _update_ms(sim, moves, args.n, cold=False)
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
    pins_cold = _update_ms(sim, moves, args.n, cold=True)
    pins_warm = _update_ms(sim, moves, args.n, cold=False)
    _settle(sim)
    sizes = {
        name: len(json.dumps(getattr(sim, name)))
        for name in ("scenario_data", "options", "result", "charts", "comparison")
    }
    rows = {
        "update_cold": ("update (cold: estimate + 22 scaling stops)", cold),
        "update_new_shapes": ("update (new shapes: 23 replays)", shapes),
        "update_warm": ("update (warm: estimates cached)", warm),
        "update_3_pins_cold": ("update with 3 pins (cold)", pins_cold),
        "update_3_pins_warm": ("update with 3 pins (warm)", pins_warm),
    }
    out: dict[str, Any] = {"model": args.model + (" (inline)" if args.inline else ""), "n": args.n}
    for key, (_, (hold, published)) in rows.items():
        out[f"{key}_ms"] = round(hold, 2)
        out[f"{key}_published_ms"] = round(published, 2)
    out["scaling_view_cold_ms"] = round(scale_cold, 2)
    out["breakdown_and_result_ms"] = round(bd, 2)
    out["update_payload_bytes"] = sizes
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print(f"MemSim Python-side update, {out['model']}, median of {args.n} (ms)")
    print(f"  {'':44s} {'holds the kernel':>16s} {'published':>10s}")
    for label, (hold, published) in rows.values():
        print(f"  {label:44s} {hold:16.2f} {published:10.2f}")
    print(f"  scaling view alone (cold)                    {scale_cold:16.2f}")
    print(f"  breakdown spec + result                      {bd:16.2f}")
    print("  payload per update: " + ", ".join(f"{k} {v / 1024:.1f} KiB" for k, v in sizes.items()))


if __name__ == "__main__":
    main()
