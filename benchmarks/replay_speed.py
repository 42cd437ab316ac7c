"""The caching-allocator replay's cost (``reserved_model: replay``), before and after its fast path, in one run.

For the replay, "before" is the simulator kept as the tests' reference (tests/data/allocator_reference.py: the code before the
fast path) driven as ``alloc_stream.replay_stream`` was (the phase looked up at every event, the largest cached
blocks at every new peak); "after" is the engine's own. Both replay the same streams and must give the same
figures (the benchmark stops if not). Prints, per scenario:

* ``new shape``: ms of an estimate whose parts are cached but whose replay is not (the case of a new micro-batch
  or sequence length), its stream written layer by layer (before) and with its layers copied (after), target
  0.5 ms; ``cached shape``: the same with the replay cached (a new card, a new
  scenario of the same shape);
* the stream: its events, ms to build it (written layer by layer as before, ``step_stream(repeat=False)``, then
  with its third to last layers copied from the second, ``StreamWriter.repeat``: the same events, checked here),
  ms to replay it (and us per event);
* per trace: the replay of a trace-shaped synthetic stream (``allocator_replay.replay_cost``) through
  ``allocator.replay``, before and after.

* with ``--trace RUN ...``: a measured run traced on fake tensors (torch needed), its stream's replays.
* per scenario, its events and the segments made per kind of phase (forward, loss, backward, optimizer step);
* per scenario, whether its layers could be fast-forwarded (replay a few layer copies, extrapolate the rest):
  per copied section (``StreamWriter.repeat``: forward and backward of each step), in how many of its copies
  the allocator's cached blocks (sizes per stream and pool) came out as after the copy before, and how many
  cached blocks it held before its copies and after. An exact fast-forward needs the state to repeat (up to
  an address shift): where the cached blocks differ from one copy to the next, the state does not.

* with ``--vs REV``: this tree against git revision ``REV`` (``git archive`` into a temporary folder, imported
  with ``PYTHONPATH``), each timed in fresh processes taken in turn, ``--rounds`` times (the machine is shared:
  the best of each counts): a new shape's estimate (``VS_CASES``: its replay not cached), the stream's replay
  alone, and ``plan("llama-3.1-8b", "h100-80gb", 8)`` cold; prints REV's ms, this tree's, and their ratio.
  Both must give the same figures (the benchmark stops if not).

Run: python benchmarks/replay_speed.py [--repeats 5] [--trace llama1b-bf16 qwen05b-bf16] [--vs 62ae549]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import astuple
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "data"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import allocator_reference as ref  # noqa: E402

from memsim_widget.engine.context import Context  # noqa: E402
from memsim_widget.engine.core import _estimate, estimate  # noqa: E402
from memsim_widget.engine.counters import alloc_stream  # noqa: E402
from memsim_widget.engine.counters.allocator import AllocatorConf, alloc, free, replay  # noqa: E402
from memsim_widget.engine.counters.replayable import replayable  # noqa: E402
from memsim_widget.engine.frameworks import allocator_conf  # noqa: E402
from memsim_widget.engine.rl import objectives  # noqa: E402
from memsim_widget.scenario import Scenario  # noqa: E402

CASES: dict[str, dict[str, Any]] = {
    "llama-3.2-1b": {"model": "llama-3.2-1b", "seq_len": 2048},
    "llama-3.1-8b": {"model": "llama-3.1-8b", "seq_len": 4096},
    "qwen2.5-0.5b b4": {"model": "qwen2.5-0.5b", "seq_len": 2048, "micro_batch_size": 4},
    "8b checkpointed": {"model": "llama-3.1-8b", "seq_len": 4096, "activation_checkpointing": "full"},
    "8b LoRA": {
        "model": "llama-3.1-8b",
        "seq_len": 4096,
        "method": "lora",
        "lora": {"targets": ["all-linear"]},
    },
    "8b expandable": {"model": "llama-3.1-8b", "seq_len": 4096, "allocator_conf": "expandable_segments:True"},
    "405b": {"model": "llama-3.1-405b", "seq_len": 4096},
    "mixtral-8x7b": {"model": "mixtral-8x7b", "seq_len": 4096},
    "70b dp8 zero3": {"model": "llama-3.1-70b", "seq_len": 4096, "parallel": {"dp": 8, "zero": 3}},
}


def best_ms(fn: Callable[[], object], repeats: int) -> float:
    """The fastest of ``repeats`` calls, in ms of this process's CPU time (the machine is shared: the minimum
    of the time it ran is the cost)."""
    times = []
    for _ in range(repeats):
        t = time.process_time()
        fn()
        times.append(time.process_time() - t)
    return min(times) * 1e3


def estimate_ms(sc: Scenario, repeats: int, new_shape: bool) -> float:
    """An estimate not in the result cache, its parts cached; ``new_shape``: its replay not cached either."""
    estimate(sc)

    def one() -> None:
        _estimate.cache_clear()
        if new_shape:
            alloc_stream.cache_clear()
        estimate(sc)

    return best_ms(one, repeats)


def new_shape_ms(sc: Scenario, repeats: int) -> tuple[float, float]:
    """(before, after) ms of a new shape's estimate, the two timed in turn (the shared machine's load moves):
    before, its stream written layer by layer (``step_stream(repeat=False)``); after, as the engine writes it."""
    step_stream, before, after = alloc_stream.step_stream, float("inf"), float("inf")
    for _ in range(repeats):
        alloc_stream.step_stream = partial(step_stream, repeat=False)  # type: ignore[assignment]
        try:
            before = min(before, estimate_ms(sc, 1, True))
        finally:
            alloc_stream.step_stream = step_stream  # type: ignore[assignment]
        after = min(after, estimate_ms(sc, 1, True))
    return before, after


def scenario_rows(repeats: int) -> None:
    """Per scenario: the estimate's cost before and after, the stream's build and replay costs."""
    fast = alloc_stream.replay_stream
    print(
        f"{'scenario':<17}{'events':>7} build before -> after | replay before -> after (us/event) | new shape "
        "before -> after"
    )
    for name, d in CASES.items():
        sc = Scenario.from_dict({**d, "reserved_model": "replay"})
        ctx = Context(objectives.training_scenario(sc))
        if not replayable(ctx):
            print(f"{name:<17} not replayed (the fitted rule: the stream models one GPU): "
                  f"estimate {estimate_ms(sc, repeats, True):.3f} ms")  # fmt: skip
            continue
        conf = allocator_conf(ctx)
        stream = alloc_stream.rank_stream(ctx, ctx.stages[0])
        n = len(stream.events)
        if fast(stream, conf) != ref.replay_stream(stream, conf):
            raise SystemExit(f"{name}: the fast replay's figures differ from the reference's")
        if plain_stream(ctx).events != stream.events:
            raise SystemExit(
                f"{name}: the stream with its layers copied differs from the one written layer by layer"
            )
        build_before = best_ms(partial(plain_stream, ctx), repeats)
        build = best_ms(partial(alloc_stream.rank_stream, ctx, ctx.stages[0]), repeats)
        before = best_ms(partial(ref.replay_stream, stream, conf), repeats)
        after = best_ms(partial(fast, stream, conf), repeats)
        shape_before, shape_after = new_shape_ms(sc, repeats)
        cached = estimate_ms(sc, repeats * 20, False)
        print(
            f"{name:<17}{n:>7} {build_before:6.2f} -> {build:5.2f} ms | {before:7.2f} -> {after:6.2f} ms ({before / n * 1e3:.2f} -> "
            f"{after / n * 1e3:.2f}) | {shape_before:7.2f} -> {shape_after:6.2f} ms (target 0.5); "
            f"cached shape {cached:.3f} ms"
        )


def plain_stream(ctx: Context) -> alloc_stream.StreamWriter:
    """``alloc_stream.rank_stream`` with every layer written by its own loop iteration (the builder before
    ``StreamWriter.repeat``)."""
    step_stream = alloc_stream.step_stream
    alloc_stream.step_stream = partial(step_stream, repeat=False)  # type: ignore[assignment]
    try:
        return alloc_stream.rank_stream(ctx, ctx.stages[0])
    finally:
        alloc_stream.step_stream = step_stream  # type: ignore[assignment]


def trace_shaped(n: int) -> list[Any]:
    """``allocator_replay.replay_cost``'s stream: per op a saved tensor of 2-32 MiB and a temporary, then the
    saved ones freed in reverse (the shape of a traced step)."""
    import random

    rng = random.Random(0)
    events, saved = [], []
    for i in range(n // 4):
        saved.append(i)
        events += [
            alloc(i, rng.choice((2, 8, 32)) << 20),
            alloc(-i - 1, rng.randint(1, 1 << 20)),
            free(-i - 1),
        ]
    return events + [free(h) for h in reversed(saved)]


def trace_rows(repeats: int) -> None:
    """Per trace-shaped stream: ``allocator.replay`` before and after, default settings and expandable."""
    for conf in (AllocatorConf(), AllocatorConf(expandable_segments=True)):
        for n in (1_000, 10_000, 100_000):
            events = trace_shaped(n)
            if astuple(replay(events, conf=conf)) != astuple(ref.replay(events, conf=conf)):
                raise SystemExit("the fast replay of a trace differs from the reference's")
            before = best_ms(partial(ref.replay, events, conf=conf), max(repeats // 2, 1))
            after = best_ms(partial(replay, events, conf=conf), max(repeats // 2, 1))
            label = "expandable" if conf.expandable_segments else "default"
            print(
                f"trace replay, {len(events):>6} events ({label}): {before:8.2f} -> {after:8.2f} ms "
                f"({before / len(events) * 1e3:.2f} -> {after / len(events) * 1e3:.2f} us per event)"
            )


def real_trace_rows(names: list[str], repeats: int) -> None:
    """Per measured run named (benchmarks/gpu_measure.py): its fake-tensor trace (seconds, torch needed) and the
    replay of the traced stream on an unlimited card and on the card (``trace/replay.trace_counters``' two
    replays), before and after."""
    from gpu_measure import MEASUREMENTS, resolved

    from memsim_widget.catalog.models import resolve_model_config
    from memsim_widget.trace.hf import trace_hf
    from memsim_widget.trace.replay import _prepared
    from memsim_widget.trace.traceable import trace_kwargs

    for m in (m for m in MEASUREMENTS if m.name in names):
        sc = Scenario.from_dict(resolved(m))
        t = time.perf_counter()
        r = trace_hf(
            dict(resolve_model_config(sc.model)), steps=m.steps, lengths=tuple(m.lengths), **trace_kwargs(sc)
        )
        traced = time.perf_counter() - t
        events, outside, conf, memory = _prepared(r.tracker, sc, None)
        cap = max(memory - outside, 0)
        for capacity in (None, cap):
            if astuple(replay(events, capacity, conf)) != astuple(ref.replay(events, capacity, conf)):
                raise SystemExit(f"{m.name}: the fast replay of its trace differs from the reference's")
        before = sum(best_ms(partial(ref.replay, events, c, conf), repeats) for c in (None, cap))
        after = sum(best_ms(partial(replay, events, c, conf), repeats) for c in (None, cap))
        print(
            f"trace {m.name}: {len(events)} events, traced in {traced:.1f} s; its two replays {before:.1f} -> "
            f"{after:.1f} ms ({before / len(events) / 2 * 1e3:.2f} -> {after / len(events) / 2 * 1e3:.2f} us per event)"
        )


def copied_sections(ctx: Context) -> tuple[alloc_stream.StreamWriter, list[tuple[int, int, int]]]:
    """``rank_stream`` and its copied sections: (first event of the copied block, its events, its copies)."""
    sections: list[tuple[int, int, int]] = []
    repeat = alloc_stream.StreamWriter.repeat

    def recorded(self: alloc_stream.StreamWriter, begin: tuple[int, int], times: int, **kw: int) -> int:
        n = len(self.events)
        sections.append((begin[0], n - begin[0], times))
        return repeat(self, begin, times, **kw)

    alloc_stream.StreamWriter.repeat = recorded  # type: ignore[method-assign]
    try:
        return alloc_stream.rank_stream(ctx, ctx.stages[0]), sections
    finally:
        alloc_stream.StreamWriter.repeat = repeat  # type: ignore[method-assign]


def layer_rows() -> None:
    """Per scenario and copied section: the copies after which the cached blocks repeat the copy before's."""
    from memsim_widget.engine.counters.allocator import ADDR_BITS, CachingAllocator

    def cached(a: CachingAllocator) -> tuple[Any, ...]:
        return tuple(sorted((k, tuple(e >> ADDR_BITS for e in v)) for k, v in a.free_lists.items() if v))

    for name, d in CASES.items():
        ctx = Context(objectives.training_scenario(Scenario.from_dict({**d, "reserved_model": "replay"})))
        if not replayable(ctx):
            continue
        stream, sections = copied_sections(ctx)
        a, at, rows = CachingAllocator(None, allocator_conf(ctx)), 0, []
        for start, length, times in sections:
            a.run(stream.events[at : start + length])
            at, before, same = start + length, cached(a), 0
            blocks = sum(map(len, a.free_lists.values()))
            for _ in range(times):
                a.run(stream.events[at : at + length])
                at, now = at + length, cached(a)
                same, before = same + (now == before), now
            rows.append(f"{same}/{times} ({blocks} -> {sum(map(len, a.free_lists.values()))} cached)")
        print(f"layer copies whose cached blocks repeat, {name}: " + ("; ".join(rows) or "no copied layers"))


def phase_rows() -> None:
    """Per scenario: the share of its stream's events per kind of phase (forward, loss, backward, optimizer step,
    the rest) and the segments each makes (added 2026-12-07: backward is most events and makes few segments)."""
    from memsim_widget.engine.counters.allocator import CachingAllocator

    for name, d in CASES.items():
        ctx = Context(objectives.training_scenario(Scenario.from_dict({**d, "reserved_model": "replay"})))
        if not replayable(ctx):
            continue
        stream = alloc_stream.rank_stream(ctx, ctx.stages[0])
        a, kinds = CachingAllocator(None, allocator_conf(ctx)), {}
        marks = [*stream.marks, (len(stream.events), "")]
        for (start, label), (end, _) in zip(marks, marks[1:], strict=False):
            kind = next((k for k in ("backward", "forward", "loss", "optimizer") if k in label), "other")
            segments = a.segments
            a.run(stream.events[start:end])
            events, made = kinds.get(kind, (0, 0))
            kinds[kind] = (events + end - start, made + a.segments - segments)
        n = len(stream.events)
        print(
            f"phases, {name}: "
            + ", ".join(f"{k} {e / n:.0%} of {n} events ({m} segments)" for k, (e, m) in kinds.items())
        )


#: ``--vs``'s new shapes: one GPU 8B, torchtitan FSDP2 on 8 GPUs (expandable segments), one GPU 0.5B with 16
#: micro-batches per step.
VS_CASES: dict[str, dict[str, Any]] = {
    "8B b4 s2048": {"model": "llama-3.1-8b", "seq_len": 2048, "micro_batch_size": 4},
    "8B FSDP2 dp8": {
        "model": "llama-3.1-8b",
        "seq_len": 4096,
        "framework": "torchtitan",
        "parallel": {"dp": 8, "zero": 3},
    },
    "0.5B x16 micro": {"model": "qwen2.5-0.5b", "seq_len": 2048, "grad_accum_steps": 16},
}


def vs_child(repeats: int) -> dict[str, Any]:
    """One process's timings (ms) and figures for ``--vs``: per ``VS_CASES`` scenario a new shape's estimate
    and its stream's replay alone, then the 8-GPU plan, cold."""
    from memsim_widget.engine.caches import parts_cache
    from memsim_widget.engine.counters.allocator import CachingAllocator
    from memsim_widget.plan import plan

    out: dict[str, Any] = {}
    for name, d in VS_CASES.items():
        sc = Scenario.from_dict({**d, "reserved_model": "replay"})
        ctx = Context(objectives.training_scenario(sc))
        conf, stream = allocator_conf(ctx), alloc_stream.rank_stream(ctx, ctx.stages[0])

        def run(events: list[Any] = stream.events, conf: AllocatorConf = conf) -> CachingAllocator:
            a = CachingAllocator(None, conf)
            a.run(events)
            return a

        a = run()
        r = estimate(sc)
        out[f"estimate {name}"] = estimate_ms(sc, repeats, True)
        out[f"replay {name}"] = best_ms(run, repeats)
        out[f"figures {name}"] = [a.peak_reserved, a.peak_allocated, a.peak_event, repr(r)]
    _estimate.cache_clear()
    parts_cache.cache_clear()
    alloc_stream.cache_clear()
    t = time.process_time()
    p = plan("llama-3.1-8b", "h100-80gb", 8)
    out["plan 8B on 8 x H100"] = (time.process_time() - t) * 1e3
    out["figures plan"] = {k: v.tolist() for k, v in sorted(p.columns.items())}
    import memsim_widget

    out["where"] = memsim_widget.__file__
    return out


def vs_rows(rev: str, rounds: int, repeats: int) -> None:
    """``--vs``: REV's tree and this one, each in fresh processes taken in turn, the best of ``rounds``."""
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(["git", "archive", rev], cwd=ROOT, capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        best: dict[str, dict[str, Any]] = {rev: {}, "this tree": {}}
        for _ in range(rounds):
            for label, path in ((rev, tmp), ("this tree", str(ROOT))):
                env = {**os.environ, "PYTHONPATH": path}
                cmd = [sys.executable, __file__, "--vs-child", "--repeats", str(repeats)]
                got = json.loads(
                    subprocess.run(cmd, env=env, capture_output=True, check=True, text=True).stdout
                )
                if not got.pop("where").startswith(path):
                    raise SystemExit(f"{label}: memsim_widget was not imported from {path}")
                for k, v in got.items():
                    best[label][k] = min(best[label].get(k, v), v) if not k.startswith("figures") else v
    old, new = best[rev], best["this tree"]
    for k in old:
        if k.startswith("figures"):
            if old[k] != new[k]:
                raise SystemExit(f"{k[8:]}: this tree's figures differ from {rev}'s")
            continue
        print(f"{k:<28} {rev}: {old[k]:9.2f} ms  this tree: {new[k]:9.2f} ms  ratio {old[k] / new[k]:.2f}x")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--trace", nargs="*", default=[], metavar="RUN", help="also trace these measured runs")
    ap.add_argument("--vs", metavar="REV", help="time this tree against git revision REV, nothing else")
    ap.add_argument("--rounds", type=int, default=3, help="--vs: processes per tree, taken in turn")
    ap.add_argument("--vs-child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.vs_child:
        print(json.dumps(vs_child(args.repeats)))
        return 0
    if args.vs:
        vs_rows(args.vs, args.rounds, args.repeats)
        return 0
    scenario_rows(args.repeats)
    phase_rows()
    layer_rows()
    trace_rows(args.repeats)
    real_trace_rows(args.trace, args.repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
