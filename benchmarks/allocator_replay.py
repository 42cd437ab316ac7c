"""The caching-allocator replay of fake-tensor traces against the H200 measurements (data/measured/gpu_h200.csv).

For each scenario ``benchmarks/gpu_measure.py`` ran on the GPU (torch.compile runs excluded: the trace runs
eager), trace the same steps (the same number, the same per-step lengths) on fake tensors on the CPU, replay
the allocations and frees through ``engine/allocator.py`` and compare its peak reserved, and reserved plus
what lives outside the allocator (``overhead.device_items``), with ``max_memory_reserved`` and nvidia-smi.
Nothing here is fitted: the rows are the test. Also prints the replay's cost per trace.

Run: python benchmarks/allocator_replay.py [-k TEXT] [--json out.json] [--conf expandable_segments:True]
     python benchmarks/allocator_replay.py --cost   (the replay's cost per event, no trace)
     python benchmarks/allocator_replay.py --engine-stream benchmarks/allocator_replay_h200.json
         (an experiment: a per-layer stream built from the engine's groups, replayed; no trace)
"""

from __future__ import annotations

import argparse
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
from memsim_widget.engine.allocator import parse_alloc_conf  # noqa: E402
from memsim_widget.scenario import Scenario  # noqa: E402

ROWS = Path(__file__).resolve().parents[1] / "data" / "measured" / "gpu_h200.csv"


def measured(path: Path = ROWS) -> dict[str, int]:
    """Row id -> measured bytes."""
    with path.open() as fh:
        return {r["id"]: int(r["measured_bytes"]) for r in csv.DictReader(fh)}


def trace_and_replay(m: Measurement, conf_text: str | None = None) -> dict[str, Any]:
    """Trace ``m``'s steps on fake tensors and replay them: the three counters and the costs."""
    from memsim_widget.trace.hf import trace_hf
    from memsim_widget.trace.replay import allocation_stream, replay_trace
    from memsim_widget.trace.traceable import trace_kwargs

    sc = Scenario.from_dict(resolved(m))
    t0 = time.perf_counter()
    kw = trace_kwargs(sc)
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

    from memsim_widget.engine.allocator import alloc, free, replay

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
    from memsim_widget.engine.allocator import alloc, free
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
    from memsim_widget.engine.allocator import replay
    from memsim_widget.engine.core import estimate

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


class _Stream:
    """An allocation stream being written: handles numbered in allocation order."""

    def alloc(self, size: float, n: int = 1) -> list[int]:
        """``n`` allocations of ``size`` bytes each; their handles."""
        from memsim_widget.engine.allocator import alloc

        out = []
        for _ in range(n):
            self.handle += 1
            self.events.append(alloc(self.handle, max(int(size), 1)))
            out.append(self.handle)
        return out

    def free(self, handles: list[int]) -> None:
        from memsim_widget.engine.allocator import free

        self.events += [free(h) for h in handles]

    def __init__(self, cuts: dict[str, tuple[float, ...]] | None = None) -> None:
        self.events: list[Any] = []
        self.handle = 0
        self.cuts = cuts or {}

    def items(self, items: Any, numels: tuple[int, ...] = (), share: int = 1) -> list[int]:
        """Allocate ``1/share`` of each counted item (a layer's share when ``share`` is the layer count). Per-tensor
        sizes: proportional to the parameter tensors' elements when the item has k tensors per parameter
        (gradients, optimizer states and their step temporaries), else ``bytes / tensors`` each (the activation
        terms carry a count, not each tensor's size: the uncertain part of this stream)."""
        out: list[int] = []
        for i in items:
            if i.level not in ("tensor", "allocator") or i.bytes <= 0:
                continue
            n, total = max(i.tensors, 1), sum(numels)
            cut = self.cuts.get(i.item, ())
            if len(cut) == max(n // share, 1):  # the term's own tensors, by their share of its bytes
                for x in cut:
                    out += self.alloc(i.bytes / share * x)
            elif share == 1 and numels and n % len(numels) == 0 and total:
                per = i.bytes / (n // len(numels) * total)
                for _ in range(n // len(numels)):
                    for x in numels:
                        out += self.alloc(x * per)
            else:
                k = max(n // share, 1)
                out += self.alloc(i.bytes / share / k, k)
        return out


def engine_stream(
    sc: Scenario, steps: int = 3, layers: int | None = None, cuts: dict[str, tuple[float, ...]] | None = None
) -> list[Any]:
    """An experiment, not the engine's path: the allocations and frees of ``steps`` training steps of ``sc``'s
    first stage built from the engine's own groups (``engine/timeline``), in step order: weights (optimizer
    states at the end of step 1's backward), workspaces; per step the inputs, per layer its share of the saved
    activations (under checkpointing the recomputed layer's terms allocated and freed around each checkpointed
    input), the final norm and head, the loss's T x V buffers (forward, saved, backward), the output the loop
    holds; per layer in backward (top down) the recomputed layer, the layer's backward transients and
    gradients, then its saved activations freed; the optimizer step's temporaries; gradients freed
    (``zero_grad(set_to_none=True)``). ``layers``: replay that many layers of the stage's per-layer sizes;
    ``cuts``: term name -> each tensor's share of the term's bytes (default: equal tensors)."""
    from memsim_widget.engine import objectives
    from memsim_widget.engine.context import Context
    from memsim_widget.engine.parts_cache import cached_activation_groups, cached_state_groups
    from memsim_widget.engine.states.budget import local_groups

    ctx = Context(objectives.training_scenario(sc))
    stage = ctx.stages[0]
    ag = {k: g.entries for k, g in cached_activation_groups(ctx, stage).items()}
    groups, step1 = cached_state_groups(ctx, stage)
    sg = {k: g.entries for k, g in groups.items()}
    numels = tuple(lg.numel_each for lg in local_groups(ctx, stage) for _ in range(lg.count))
    s, Ls = _Stream(cuts), stage.layers
    n_layers = layers or Ls
    first = step1.entries if step1 is not None else sg["persistent"]
    s.items(first, numels)
    s.items(sg["overhead"])
    later = [i for i in sg["persistent"] if i not in first]  # optimizer states, made by the first step
    for step in range(steps):
        pre = s.items(ag["pre"])
        saved = []
        for _ in range(n_layers):
            transient = s.items(ag["recompute"])  # a checkpointed layer's forward, dropped but its input
            saved.append(s.items(ag["saved"], share=Ls))
            s.free(transient)
        post = s.items(ag["post"])
        logits = s.items(ag["loss_forward"])
        held = s.items(ag["held_logits"]) + s.items(ag["held_cache_extra"])
        kept = s.items(ag["loss_saved"])
        s.free(logits)
        grad_out = s.items(ag["loss_backward"])
        s.free(kept + grad_out)
        top = s.items(ag["top_backward"])
        grads = s.items(sg["head_grads"])
        s.free(top + post)
        for layer in reversed(saved):
            recomputed = s.items(ag["recompute"])
            transient = s.items(ag["layer_backward"])
            grads += s.items(sg["grads"], share=Ls + 2)
            s.free(transient + recomputed + layer)
        grads += s.items(sg["grads"], share=Ls + 2)
        s.free(pre)
        if not ag["held_through_step"]:
            s.free(held)
            held = []
        if step == 0:
            s.items(later, numels)
        s.free(s.items(sg["step_temps"], numels))
        s.free(grads + held)
    return s.events


def real_cuts(sc: Scenario) -> dict[str, tuple[float, ...]]:
    """The tensors of five terms of an SDPA decoder with RMSNorm (engine/activations: attention.py, norms.py,
    loss.py, as their formulas add them), as shares of each term's bytes: q, k, v at their widths; the output and
    the fp32 logsumexp; each norm's fp32 input and rsqrt; the logits and their fp32 upcast; the final norm's
    fp32 input, rsqrt and normalised tensor. A sensitivity check of the equal cut, not a general rule."""
    from memsim_widget.engine import objectives
    from memsim_widget.engine.activations.dims import Dims
    from memsim_widget.engine.context import Context

    ctx = Context(objectives.training_scenario(sc))
    D, ec = Dims(ctx), ctx.recipe.act_bytes
    le = 4 if ctx.recipe.fp32_compute else 2

    def shares(*parts: float) -> tuple[float, ...]:
        return tuple(p / sum(parts) for p in parts)

    return {
        "attention q, k, v saved by SDPA": shares(D.hq, D.hkv, D.hkv),
        "attention output and logsumexp": shares(ec * D.T * D.hq, 4 * D.b * D.a * D.s),
        "RMSNorm fp32 inputs and rsqrt": shares(D.h, 1, D.h, 1),
        "logits and their fp32 upcast": shares(le, 4),
        "final norm": shares(4 * D.h, 4, ec * D.h),
    }


def engine_stream_vs_trace(path: Path) -> None:
    """Print the replay of ``engine_stream`` next to the replayed traces in ``path`` and the measured reserved,
    the same stream with five terms cut by their tensors' sizes (``real_cuts``) against the trace, and the
    replay extrapolated from 6 layers by the growth of the sixth (whether layers repeat exactly)."""
    from memsim_widget.engine.allocator import replay
    from memsim_widget.engine.core import estimate

    traced = {r["name"]: r for r in json.loads(path.read_text())["default"]}
    rows = measured()
    errs: dict[str, list[float]] = {"trace": [], "measured": [], "engine today": [], "cut, trace": []}
    for m in MEASUREMENTS:
        if m.name not in traced:
            continue
        sc = Scenario.from_dict(resolved(m))
        t = time.perf_counter()
        events = engine_stream(sc)
        got = replay(events).peak_reserved
        ms = (time.perf_counter() - t) * 1e3
        r6, r5 = (replay(engine_stream(sc, layers=k)).peak_reserved for k in (6, 5))
        cut = replay(engine_stream(sc, cuts=real_cuts(sc))).peak_reserved
        extrapolated = r6 + (r6 - r5) * (stage_layers(sc) - 6)
        want, meas = traced[m.name]["reserved"], rows[f"g-{m.name}-reserved"]
        today = estimate(sc).ranks[0].peak_reserved_bytes
        pairs = (
            ("trace", want, got),
            ("measured", meas, got),
            ("engine today", meas, today),
            ("cut, trace", want, cut),
        )
        for key, ref, val in pairs:
            errs[key].append(val / ref - 1)
        print(
            f"{m.name:<24} engine stream {got / 2**30:6.2f} GiB: trace {want / 2**30:6.2f} "
            f"({errs['trace'][-1]:+6.1%}), measured {meas / 2**30:6.2f} ({errs['measured'][-1]:+6.1%}; engine "
            f"today {errs['engine today'][-1]:+6.1%}); cut by size: trace {errs['cut, trace'][-1]:+6.1%}; "
            f"from 6 layers {extrapolated / got - 1:+6.1%}; "
            f"{len(events)} events, {ms:.0f} ms"
        )
    for key, e in errs.items():
        print(
            f"{key}: median {statistics.median(e):+.1%}, median |error| {statistics.median(abs(x) for x in e):.1%}, "
            f"range {min(e):+.1%} .. {max(e):+.1%}"
        )


def stage_layers(sc: Scenario) -> int:
    """The first stage's layer count."""
    from memsim_widget.engine import objectives
    from memsim_widget.engine.context import Context

    return Context(objectives.training_scenario(sc)).stages[0].layers


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
    ap.add_argument("-k", metavar="TEXT", help="only the scenarios whose name contains TEXT")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--conf", help="replay under this PYTORCH_CUDA_ALLOC_CONF (default: the scenario's)")
    args = ap.parse_args(argv)
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
        if m.scenario.get("compile") or (args.k and args.k not in m.name):
            continue
        r = trace_and_replay(m, args.conf)
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
