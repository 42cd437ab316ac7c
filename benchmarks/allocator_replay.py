"""The caching-allocator replay of fake-tensor traces against the H200 measurements (data/measured/gpu_h200.csv).

For each scenario ``benchmarks/gpu_measure.py`` ran on the GPU (torch.compile runs too: the trace runs the compiled
step, trace/compiled.py), trace the same steps (the same number, the same per-step lengths) on fake tensors on the CPU, replay
the allocations and frees through ``engine/counters/allocator.py`` and compare its peak reserved, and reserved plus
what lives outside the allocator (``overhead.device_items``), with ``max_memory_reserved`` and nvidia-smi.
Nothing here is fitted: the rows are the test. Also prints the replay's cost per trace.

Run: python benchmarks/allocator_replay.py [-k TEXT] [--json out.json] [--conf expandable_segments:True]
     python benchmarks/allocator_replay.py -k compile [--inductor-passes] --json benchmarks/allocator_replay_h200_compiled.json
         (the compiled runs; --inductor-passes: Inductor's joint-graph passes and kernel lifetimes, an experiment)
     python benchmarks/allocator_replay.py --cost   (the replay's cost per event, no trace)
     python benchmarks/allocator_replay.py --engine-stream benchmarks/allocator_replay_h200.json
         (an experiment: a per-layer stream built from the engine's groups, replayed; no trace)
     python benchmarks/allocator_replay.py --compare qwen05b-bf16
         (trace one run; the large requests of its stream and of the engine's: new segment or cached)
     python benchmarks/allocator_replay.py --update benchmarks/allocator_replay_h200.json [-k a,b]
         (trace each chosen run once, replay it in both modes, default and expandable_segments:True, and
          rewrite those runs' entries of the file docs/accuracy.md reads; the others are kept)
"""

from __future__ import annotations

import argparse
import bisect
import csv
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_measure import MEASUREMENTS, Measurement, resolved  # noqa: E402

from memsim_widget.catalog.models import resolve_model_config  # noqa: E402
from memsim_widget.engine.counters.allocator import parse_alloc_conf  # noqa: E402
from memsim_widget.scenario import Scenario  # noqa: E402

ROWS = Path(__file__).resolve().parents[1] / "data" / "measured" / "gpu_h200.csv"


def measured(path: Path = ROWS) -> dict[str, int]:
    """Row id -> measured bytes."""
    with path.open() as fh:
        return {r["id"]: int(r["measured_bytes"]) for r in csv.DictReader(fh)}


def trace_and_replay(m: Measurement, conf_text: str | None = None, inductor: bool = False) -> dict[str, Any]:
    """Trace ``m``'s steps on fake tensors and replay them: the three counters and the costs (``inductor``: a
    compiled step traced under ``trace/compiled.inductor_passes``)."""
    import contextlib

    from memsim_widget.trace.compiled import inductor_passes
    from memsim_widget.trace.hf import trace_hf
    from memsim_widget.trace.replay import allocation_stream, replay_trace
    from memsim_widget.trace.traceable import trace_kwargs

    sc = Scenario.from_dict(resolved(m))
    t0 = time.perf_counter()
    kw = trace_kwargs(sc)
    with inductor_passes() if inductor else contextlib.nullcontext():
        r = trace_hf(dict(resolve_model_config(sc.model)), steps=m.steps, lengths=tuple(m.lengths), **kw)
    t1 = time.perf_counter()
    conf = parse_alloc_conf(conf_text) if conf_text is not None else None
    res, outside = replay_trace(r.tracker, sc, conf)
    t2 = time.perf_counter()
    n = len(allocation_stream(r.tracker))
    return {
        "name": m.name,
        "allocated": res.peak_allocated,
        "reserved": res.peak_reserved,
        "nvidia-smi": res.peak_reserved + outside,
        "events": n,
        "trace_s": round(t1 - t0, 2),
        "replay_ms": round((t2 - t1) * 1e3, 1),
    }


def replay_cost(sizes: tuple[int, ...] = (100, 1_000, 10_000), repeat: int = 5) -> list[tuple[int, float]]:
    """(events, best ms per replay) of synthetic streams: a layered step (per layer a few MiB-sized saved
    tensors, freed in reverse in backward, small temporaries in between), the shape of an engine-built stream.
    The budget of a new estimate is 0.5 ms: what the engine replays must be cached per shape."""
    import random

    from memsim_widget.engine.counters.allocator import alloc, free, replay

    out = []
    for n in sizes:
        rng = random.Random(0)
        events, saved = [], []
        for i in range(n // 4):  # forward: a saved tensor and a temporary per op
            saved.append(i)
            events += [
                alloc(i, rng.choice((2, 8, 32)) << 20),
                alloc(-i - 1, rng.randint(1, 1 << 20)),
                free(-i - 1),
            ]
        events += [free(h) for h in reversed(saved)]
        best = float("inf")
        for _ in range(repeat):
            t = time.perf_counter()
            replay(events)
            best = min(best, time.perf_counter() - t)
        out.append((len(events), best * 1e3))
    return out


def moment_stream(rank: Any, steps: int = 3) -> list[Any]:
    """An experiment, not the engine's path: the allocations and frees between the engine's moments (each item
    as ``tensors`` equal blocks, freed when a moment no longer holds it, frees before allocations), ``steps``
    times over. Too coarse: docs/allocator.md reports how far its replay is from the trace's."""
    from memsim_widget.engine.counters.allocator import alloc, free
    from memsim_widget.engine.items import Level

    events, live, handle = [], {}, 0
    for moment in list(rank.moments) * steps:
        want = {(i.category, i.item, i.bytes, i.tensors): i for i in moment.items
                if i.level != Level.DEVICE and i.bytes > 0}  # fmt: skip
        for key in [k for k in live if k not in want]:
            events += [free(h) for h in live.pop(key)]
        for key, item in want.items():
            if key not in live:
                n = max(item.tensors, 1)
                live[key] = list(range(handle, handle + n))
                events += [alloc(h, -(-item.bytes // n)) for h in live[key]]
                handle += n
    return events


def engine_moments_vs_trace(path: Path) -> None:
    """Print the replay of ``moment_stream`` next to the replayed traces in ``path`` (allocator_replay_h200.json)."""
    from memsim_widget.engine.core import estimate
    from memsim_widget.engine.counters.allocator import replay

    traced = {r["name"]: r for r in json.loads(path.read_text())["default"]}
    errs = []
    for m in MEASUREMENTS:
        if m.name not in traced:
            continue
        rank = estimate(Scenario.from_dict(resolved(m))).ranks[0]
        got, want = replay(moment_stream(rank)).peak_reserved, traced[m.name]["reserved"]
        errs.append(got / want - 1)
        print(
            f"{m.name:<26} moment stream {got / 2**30:7.2f} GiB, trace {want / 2**30:7.2f} GiB ({errs[-1]:+.1%})"
        )
    print(
        f"median {statistics.median(errs):+.1%}, median |error| {statistics.median(abs(e) for e in errs):.1%}"
    )


def engine_stream(sc: Scenario, steps: int | None = None) -> list[Any]:
    """The engine's allocation stream of ``sc``'s first stage (``engine/counters/alloc_stream.rank_stream``)."""
    from memsim_widget.engine.context import Context
    from memsim_widget.engine.counters.alloc_stream import STEPS, rank_stream
    from memsim_widget.engine.rl import objectives

    ctx = Context(objectives.training_scenario(sc))
    return rank_stream(ctx, ctx.stages[0], steps or STEPS).events


def engine_stream_vs_trace(path: Path) -> None:
    """Print the engine's reserved (the replay of ``engine/counters/alloc_stream``'s stream) next to the replayed traces
    in ``path`` and the measured reserved and nvidia-smi, whether a third step changes the replayed peak, and the
    cost of a new shape's replay (stream built and replayed, no cache)."""
    from memsim_widget.engine.context import Context
    from memsim_widget.engine.core import estimate
    from memsim_widget.engine.counters.alloc_stream import rank_stream, replay_stream
    from memsim_widget.engine.frameworks import allocator_conf
    from memsim_widget.engine.rl import objectives

    traced = {r["name"]: r for r in json.loads(path.read_text())["default"]}
    rows = measured()
    errs: dict[str, list[float]] = {"trace": [], "measured": [], "nvidia-smi": []}
    costs = []
    for m in MEASUREMENTS:
        if m.name not in traced:
            continue
        sc = Scenario.from_dict({**resolved(m), "reserved_model": "replay"})
        rank = estimate(sc).ranks[0]
        got = rank.peak_reserved_bytes
        ctx = Context(objectives.training_scenario(sc))
        conf = allocator_conf(ctx)
        t = time.perf_counter()
        stream = rank_stream(ctx, ctx.stages[0])
        rep = replay_stream(stream, conf)
        costs.append((time.perf_counter() - t) * 1e3)
        third = (
            replay_stream(rank_stream(ctx, ctx.stages[0], steps=3), conf).peak_reserved - rep.peak_reserved
        )
        want, meas = traced[m.name]["reserved"], rows[f"g-{m.name}-reserved"]
        smi = rows.get(f"g-{m.name}-nvidia-smi")
        errs["trace"].append(got / want - 1)
        errs["measured"].append(got / meas - 1)
        if smi:
            errs["nvidia-smi"].append(rank.device_total_bytes / smi - 1)
        print(
            f"{m.name:<24} engine {got / 2**30:6.2f} GiB: measured {meas / 2**30:6.2f} ({errs['measured'][-1]:+6.1%}),"
            f" trace {want / 2**30:6.2f} ({errs['trace'][-1]:+6.1%}), nvidia-smi "
            + (f"{errs['nvidia-smi'][-1]:+6.1%}" if smi else "  n/a ")
            + f"; peak at {rep.at}; a third step adds {third} B; {rep.events} events, {costs[-1]:.0f} ms"
        )
    for key, e in errs.items():
        print(
            f"{key}: median {statistics.median(e):+.1%}, median |error| {statistics.median(abs(x) for x in e):.1%}, "
            f"range {min(e):+.1%} .. {max(e):+.1%}"
        )
    print(f"a new shape's replay: median {statistics.median(costs):.1f} ms (stream built and replayed)")


def large_requests(events: list[Any], marks: list[tuple[int, str]], conf: Any, at_least: int) -> None:
    """Replay ``events`` (``marks``: (event index, phase) pairs) and print each request of ``at_least`` bytes or
    more: its phase, whether it took a cached block or a new segment, and the largest cached block then."""
    from memsim_widget.engine.counters.allocator import ADDR_BITS, FREE, CachingAllocator

    a, m, label = CachingAllocator(None, conf), 0, ""
    for n, (handle, size, stream) in enumerate(events):
        while m < len(marks) and marks[m][0] <= n:
            label, m = marks[m][1], m + 1
        if size == FREE:
            a.free(handle)
            continue
        cached = a.free_lists.get((stream, False))
        largest = cached[-1] >> ADDR_BITS if cached else 0  # sorted by size, then address
        seg = a.segments
        a.malloc(handle, size, stream)
        if size >= at_least:
            print(
                f"  {label:<28} {size / 2**20:9.1f} MiB: {'new segment' if a.segments > seg else 'cached     '}"
                f" (largest cached {largest / 2**20:7.1f} MiB), reserved {a.reserved / 2**30:6.2f} GiB"
            )
    print(
        f"  peak reserved {a.peak_reserved / 2**30:.3f} GiB, peak allocated {a.peak_allocated / 2**30:.3f} GiB"
    )


def compare(name: str, at_least_mib: float = 500) -> None:
    """Trace measurement ``name`` and print the large requests of its traced stream and of the engine's
    (``engine/counters/alloc_stream``) side by side: where each stream needs a new segment the other serves from its
    cache (docs/allocator.md reads the runs this way)."""
    from memsim_widget.engine.context import Context
    from memsim_widget.engine.counters.alloc_stream import rank_stream
    from memsim_widget.engine.frameworks import allocator_conf
    from memsim_widget.engine.rl import objectives
    from memsim_widget.trace.hf import trace_hf
    from memsim_widget.trace.replay import _prepared
    from memsim_widget.trace.traceable import trace_kwargs

    m = next(x for x in MEASUREMENTS if x.name == name)
    sc = Scenario.from_dict({**resolved(m), "reserved_model": "replay"})
    r = trace_hf(
        dict(resolve_model_config(sc.model)), steps=m.steps, lengths=tuple(m.lengths), **trace_kwargs(sc)
    )
    events, _, conf, _ = _prepared(r.tracker, sc, None)
    recs = [rec for rec in r.tracker.records if rec.nbytes > 0]
    keyed = sorted([(rec.alloc_seq, 1) for rec in recs] + [(rec.free_seq, 0) for rec in recs if rec.free_seq])
    seqs = [k[0] for k in keyed]  # each event's tracker sequence number, to place the phase marks
    marks = []
    for mk in r.tracker.marks:
        marks.append((bisect.bisect_left(seqs, mk["seq"]), f"step {mk['step']} {mk['phase']}"))
    print(f"== {name}: the trace's stream ({len(events)} events; phase marks approximate by the workspaces)")
    large_requests(events, marks, conf, int(at_least_mib * 2**20))
    ctx = Context(objectives.training_scenario(sc))
    stream = rank_stream(ctx, ctx.stages[0], m.steps)
    print(f"== {name}: the engine's stream ({len(stream.events)} events, {m.steps} steps)")
    large_requests(stream.events, stream.marks, allocator_conf(ctx), int(at_least_mib * 2**20))
    print(
        f"the trace replayed without its forward transients: {without_forward_transients(r.tracker, events, conf)}"
    )


def without_forward_transients(tracker: Any, events: list[Any], conf: Any) -> str:
    """The peak reserved of the traced stream less the tensors a forward makes and frees before it ends (the
    engine's stream holds only what each layer saves): the share of a gap the forward's transients make."""
    from memsim_widget.engine.counters.allocator import replay

    starts = sorted((mk["seq"], mk["phase"]) for mk in tracker.marks)
    bounds = [seq for seq, _ in starts]

    def phase(seq: int) -> str:
        i = bisect.bisect_right(bounds, seq) - 1
        return f"{i}:{starts[i][1]}" if i >= 0 else ""

    drop = {
        i
        for i, rec in enumerate(tracker.records)
        if rec.nbytes > 0
        and rec.free_seq is not None
        and phase(rec.alloc_seq) == phase(rec.free_seq)
        and phase(rec.alloc_seq).endswith("forward")
    }
    kept = [e for e in events if e[0] not in drop]
    return (
        f"{replay(kept, conf=conf).peak_reserved / 2**30:.2f} GiB ({len(drop)} tensors dropped; "
        f"with them {replay(events, conf=conf).peak_reserved / 2**30:.2f} GiB)"
    )


def stage_layers(sc: Scenario) -> int:
    """The first stage's layer count."""
    from memsim_widget.engine.context import Context
    from memsim_widget.engine.rl import objectives

    return Context(objectives.training_scenario(sc)).stages[0].layers


EXPANDABLE = "expandable_segments:True"


def update(path: Path, names: list[str] | None) -> None:
    """Trace each chosen eager run once, replay it in both allocator modes and rewrite its entries in ``path``
    (``{"source", "default": [...], "expandable": [...]}``, in MEASUREMENTS order), keeping the others."""
    import torch
    import transformers

    from memsim_widget.trace.hf import trace_hf
    from memsim_widget.trace.replay import allocation_stream, replay_trace
    from memsim_widget.trace.traceable import trace_kwargs

    data = json.loads(path.read_text()) if path.exists() else {}
    modes: dict[str, dict[str, Any]] = {
        m: {r["name"]: r for r in data.get(m, [])} for m in ("default", "expandable")
    }
    rows = measured()
    for m in MEASUREMENTS:
        if m.scenario.get("compile") or (names and m.name not in names):
            continue
        sc = Scenario.from_dict(resolved(m))
        t0 = time.perf_counter()
        r = trace_hf(
            dict(resolve_model_config(sc.model)), steps=m.steps, lengths=tuple(m.lengths), **trace_kwargs(sc)
        )
        trace_s = round(time.perf_counter() - t0, 2)
        n = len(allocation_stream(r.tracker))
        for mode, conf in (("default", None), ("expandable", parse_alloc_conf(EXPANDABLE))):
            t1 = time.perf_counter()
            res, outside = replay_trace(r.tracker, sc, conf)
            out = {"name": m.name, "allocated": res.peak_allocated, "reserved": res.peak_reserved,
                   "nvidia-smi": res.peak_reserved + outside, "events": n, "trace_s": trace_s,
                   "replay_ms": round((time.perf_counter() - t1) * 1e3, 1)}  # fmt: skip
            modes[mode][m.name] = out
        got = rows.get(f"g-{m.name}-reserved")
        err = f"({modes['default'][m.name]['reserved'] / got - 1:+.2%})" if got else ""
        print(
            f"{m.name:<26} reserved {modes['default'][m.name]['reserved'] / 2**30:7.3f} GiB {err}", flush=True
        )
    order = [m.name for m in MEASUREMENTS]
    data = {
        "source": f"python benchmarks/allocator_replay.py --update (torch {torch.__version__} CPU fake tensors, "
        f"transformers {transformers.__version__}, {time.strftime('%Y-%m-%d')})",
        **{mode: sorted(runs.values(), key=lambda r: order.index(r["name"])) for mode, runs in modes.items()},
    }
    path.write_text(json.dumps(data, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cost", action="store_true", help="only print the replay's cost on synthetic streams")
    ap.add_argument(
        "--engine-moments",
        metavar="JSON",
        help="replay the engine's moments as a stream against these traces",
    )
    ap.add_argument(
        "--engine-stream",
        metavar="JSON",
        help="replay a per-layer stream built from the engine's groups against these traces and the rows",
    )
    ap.add_argument(
        "--compare",
        metavar="NAME",
        help="trace this measurement and print the large requests of its stream and of the engine's",
    )
    ap.add_argument("-k", metavar="TEXT", help="only the scenarios whose name contains TEXT")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--conf", help="replay under this PYTORCH_CUDA_ALLOC_CONF (default: the scenario's)")
    ap.add_argument(
        "--update", metavar="JSON", help="trace once, replay in both modes, rewrite these runs here"
    )
    ap.add_argument(
        "--inductor-passes",
        action="store_true",
        help="trace compiled steps with Inductor's joint-graph passes and kernel lifetimes (an experiment)",
    )
    args = ap.parse_args(argv)
    if args.update:
        update(Path(args.update), args.k.split(",") if args.k else None)
        return 0
    if args.compare:
        compare(args.compare)
        return 0
    if args.engine_stream:
        engine_stream_vs_trace(Path(args.engine_stream))
        return 0
    if args.engine_moments:
        engine_moments_vs_trace(Path(args.engine_moments))
        return 0
    if args.cost:
        for n, ms in replay_cost():
            print(f"replay of {n:>6} events: {ms:8.2f} ms ({ms / n * 1e3:.2f} us per event)")
        return 0
    rows = measured()
    out = []
    for m in MEASUREMENTS:
        if args.k and args.k not in m.name:
            continue
        r = trace_and_replay(m, args.conf, args.inductor_passes)
        for counter in ("allocated", "reserved", "nvidia-smi"):
            got = rows.get(f"g-{m.name}-{counter}")
            r[f"measured_{counter}"] = got
            r[f"error_{counter}"] = (r[counter] / got - 1) if got else None
        out.append(r)
        print(
            f"{m.name:<26} reserved {r['reserved'] / 2**30:7.3f} GiB vs {r['measured_reserved'] / 2**30:7.3f} "
            f"({r['error_reserved']:+6.2%})  nvidia-smi {r['error_nvidia-smi']:+6.2%}  allocated "
            f"{r['error_allocated']:+6.2%}  {r['events']} events, trace {r['trace_s']} s, replay {r['replay_ms']} ms",
            flush=True,
        )
    for counter in ("reserved", "nvidia-smi"):
        errs = [r[f"error_{counter}"] for r in out if r[f"error_{counter}"] is not None]
        if errs:
            print(
                f"{counter}: median {statistics.median(errs):+.2%}, median |error| "
                f"{statistics.median(abs(e) for e in errs):.2%}, range {min(errs):+.2%} .. {max(errs):+.2%}"
            )
    per_event = [r["replay_ms"] / r["events"] * 1e3 for r in out if r["events"]]
    if per_event:
        print(f"replay cost: median {statistics.median(per_event):.2f} us per event")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
