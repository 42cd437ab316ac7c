"""Batches of varying lengths (``padding: "longest"``) replayed step after step through the caching allocator,
against the runs that measured ``max_memory_reserved`` (docs/allocator.md, "Variable lengths"). Nothing is
fitted: the lengths are the run's own (the H200 run) or drawn from the data set's published statistics under
each of ms-swift's two truncation strategies (``engine/counters/batch_lengths.length_schedule``).

Prints:

* the H200 run with per-step lengths (data/measured/gpu_h200.csv, ``qwen05b-bf16-longest``: a test row): its
  measured reserved, the estimate's two-step replay and the fitted rule, and the replay of its eight steps at
  their measured lengths;
* the ms-swift rows (data/measured/published.csv 107-121: odd ids development, even ids test): the published
  reserved, the earlier ms-swift table of the same settings run with ``--truncation_strategy truncation_left``
  on 1000 samples (``EARLIER``), the fitted rule, the estimate's two-step replay, and replays of the run's
  micro-batches with lengths cut at max_length (``truncate``) and with longer samples dropped (``delete``,
  ms-swift 1.x's default, which the published table's run used), with the number of micro-batches each run
  had (``micro_batches``), each replayed on the run's A100 80GB (less the CUDA context: a failed cudaMalloc
  frees the cache and retries, as PyTorch does);
* the growth of the replayed reserved with the steps replayed (``--growth ID``, on an unlimited card);
* one row's run in three random orders of the same lengths, and with one micro-batch a step (``--order ID``);
* what a replay of a whole run costs (events, ms to build, ms to replay).

Run: python benchmarks/allocator_replay_varlen.py [--ids 107,109] [--growth 119]
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import random
import sys
import time
from pathlib import Path
from statistics import NormalDist

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from memsim_widget import estimate  # noqa: E402
from memsim_widget.engine.context import Context  # noqa: E402
from memsim_widget.engine.counters.batch_lengths import (  # noqa: E402
    DELETE,
    TRUNCATE,
    length_schedule,
    lengths_stream,
    reserved_by_step,
)
from memsim_widget.engine.frameworks import allocator_conf  # noqa: E402
from memsim_widget.scenario import Scenario  # noqa: E402

GiB = 2**30
#: cls-fudan-news-zh as ms-swift's data set table gives it (ms-swift docs, supported datasets:
#: damo/zh_cls_fudan-news, 4959 train rows, 3234.4 +- 2547.5 tokens by Qwen's tokenizer, min 91, max 19548;
#: the benchmark page repeats the statistics: docs/source/LLM/Benchmark.md, ms-swift commit
#: 145bf08311c67bca2ffcd33ecf487938160d447a).
ROWS, MEAN, SD, SHORTEST = 4959, 3234.4, 2547.5, 91
#: ms-swift's benchmark script (scripts/benchmark/test_memory_time/run_single.py) trains one epoch of the
#: whole data set when max_length <= 2048, of 1000 samples above.
SAMPLED_ABOVE_2048 = 1000
#: The same ms-swift tables one version earlier (docs/source/LLM/Benchmark.md at ms-swift commit
#: 069db578ee6278b3a2fceadd57b444856b425b01: 1000 samples, ``--truncation_strategy truncation_left``, torch
#: 2.1.1, A100), MiB, by the published row they match (same model, method, max_length, batch size, flash
#: attention and checkpointing). Not in data/measured: a check of the engine, not fitted.
EARLIER = {
    "107": 15926, "108": 17096, "109": 19362, "110": 29264, "111": 48560, "112": 24842, "113": 34842,
    "114": 54844, "115": 19422, "116": 30316, "117": 42260, "118": 32186, "119": 7624, "120": 76520,
    "121": 13616,
}  # fmt: skip


def rows(name: str) -> list[dict[str, str]]:
    """The rows of data/measured/``name``."""
    with open(ROOT / "data/measured" / name) as f:
        return list(csv.DictReader(f))


def micro_batches(sc: Scenario, over: str) -> int:
    """The micro-batches of one epoch of ms-swift's benchmark run at ``sc``'s max_length, whole steps of
    ``grad_accum_steps``: the samples drawn, less (``DELETE``) those over max_length under the log-normal of
    ``length_schedule``, in batches of ``micro_batch_size``."""
    n = ROWS if sc.seq_len <= 2048 else SAMPLED_ABOVE_2048
    if over == DELETE:
        s2 = math.log(1 + (SD / MEAN) ** 2)
        n = round(n * NormalDist(math.log(MEAN) - s2 / 2, math.sqrt(s2)).cdf(math.log(sc.seq_len)))
    per_step = sc.micro_batch_size * max(sc.grad_accum_steps, 1)
    return max(round(n / per_step), 1) * max(sc.grad_accum_steps, 1)


def run_replay(
    sc: Scenario, lengths: tuple[int, ...], on_card: bool = True
) -> tuple[tuple[int, ...], str, int, float, float]:
    """The replay of ``lengths`` on the scenario's card (its memory less what lives outside the allocator: a
    failed cudaMalloc releases the cache, as on the GPU; ``on_card`` False: unlimited): the peak reserved after
    each step, "" or the failure in words, the events, ms to build, ms to replay."""
    ctx = Context(sc)
    e = estimate(sc.replace(reserved_model="fitted"))
    capacity = ctx.gpu.memory_bytes - (e.device_total_bytes - e.peak_reserved_bytes) if on_card else None
    t = time.process_time()
    stream = lengths_stream(ctx, ctx.stages[0], lengths)
    built = time.process_time() - t
    t = time.process_time()
    by_step, failure = reserved_by_step(stream, allocator_conf(ctx), capacity)
    oom = f"OOM at step {len(by_step)}" if failure else ""
    return by_step, oom, len(stream.events), built * 1e3, (time.process_time() - t) * 1e3


def pct(x: float, ref: float) -> str:
    return f"{100 * (x / ref - 1):+6.1f}%"


def h200_run() -> None:
    """The H200 run whose per-step lengths are known: its eight steps replayed at those lengths."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from gpu_measure import MEASUREMENTS

    m = next(m for m in MEASUREMENTS if m.name == "qwen05b-bf16-longest")
    row = next(r for r in rows("gpu_h200.csv") if r["id"] == "g-qwen05b-bf16-longest-reserved")
    measured = float(row["measured_bytes"])
    sc = Scenario.from_dict({**json.loads(row["scenario_json"]), "reserved_model": "replay"})
    two = estimate(sc).peak_reserved_bytes
    fitted = estimate(sc.replace(reserved_model="fitted")).peak_reserved_bytes
    by_step, _, events, built, replayed = run_replay(sc, tuple(m.step_lengths()))
    print(f"H200 {m.name}, lengths {list(m.step_lengths())}: measured {measured / GiB:.2f} GiB")
    print(f"  fitted rule       {fitted / GiB:7.2f} {pct(fitted, measured)}")
    print(f"  two-step replay   {two / GiB:7.2f} {pct(two, measured)}")
    print(f"  its 8 steps       {by_step[-1] / GiB:7.2f} {pct(by_step[-1], measured)}  by step: "
          + " ".join(f"{b / GiB:.2f}" for b in by_step) + f"  ({events} events, {built:.0f} + {replayed:.0f} ms)")  # fmt: skip


def swift_rows(ids: set[str] | None) -> None:
    """The ms-swift rows: published, earlier table, fitted, two-step replay, the run replayed both ways."""
    print("\nms-swift (published.csv), GiB and error against the published reserved:")
    print(f"{'id':>4} {'len':>5} {'b':>2} {'published':>9} {'earlier':>8} {'fitted':>15} {'2-step':>15}"
          f" {'truncate (steps)':>24} {'delete (steps)':>24}  cost")  # fmt: skip
    for r in rows("published.csv"):
        if r["counter"] != "reserved" or r["id"] not in EARLIER or (ids and r["id"] not in ids):
            continue
        sc = Scenario.from_dict({**json.loads(r["scenario_json"]), "reserved_model": "replay"})
        measured = float(r["measured_bytes"])
        fitted = estimate(sc.replace(reserved_model="fitted")).peak_reserved_bytes
        two = estimate(sc).peak_reserved_bytes
        cells: list[str] = []
        cost = ""
        for over in (TRUNCATE, DELETE):
            n = micro_batches(sc, over)
            lengths = length_schedule(n, sc.seq_len, MEAN, SD, SHORTEST, over, sc.micro_batch_size)
            by_step, oom, events, built, replayed = run_replay(sc, lengths)
            cells.append(oom or f"{by_step[-1] / GiB:7.2f} {pct(by_step[-1], measured)} ({len(by_step):3d})")
            cost = f"{events} events, {built:.0f} + {replayed:.0f} ms"
        print(f"{r['id']:>4} {sc.seq_len:5d} {sc.micro_batch_size:2d} {measured / GiB:9.2f}"
              f" {EARLIER[r['id']] / 1024:8.2f} {fitted / GiB:7.2f} {pct(fitted, measured)}"
              f" {two / GiB:7.2f} {pct(two, measured)} {cells[0]:>24} {cells[1]:>24}  {cost}", flush=True)  # fmt: skip


def growth(row_id: str) -> None:
    """The replayed reserved after 1, 2, 5, ... steps of one row's run, both truncation strategies."""
    r = next(r for r in rows("published.csv") if r["id"] == row_id)
    sc = Scenario.from_dict(json.loads(r["scenario_json"]))
    print(f"\nrow {row_id}: replayed reserved (GiB) after k optimizer steps; published {float(r['measured_bytes']) / GiB:.2f}")  # fmt: skip
    for over in (TRUNCATE, DELETE):
        n = micro_batches(sc, over)
        lengths = length_schedule(n, sc.seq_len, MEAN, SD, SHORTEST, over, sc.micro_batch_size)
        by_step = run_replay(sc, lengths, on_card=False)[0]
        ks = [k for k in (1, 2, 3, 5, 10, 20, 40, 80, 160, 320) if k <= len(by_step)] + [len(by_step)]
        print(f"  {over:8s} " + " ".join(f"{k}:{by_step[k - 1] / GiB:.2f}" for k in dict.fromkeys(ks)))
        rise = [(k + 1, (by_step[k] - by_step[k - 1]) / GiB) for k in range(1, len(by_step))]
        jumps = [(k, g) for k, g in rise if g > 0.25]
        print("           rises over 0.25 GiB (step: GiB): " + " ".join(f"{k}:+{g:.2f}" for k, g in jumps))
        print("           micro-batches longer than all before (step: tokens): "
              + " ".join(f"{k}:{n}" for k, n in new_longest(lengths, max(sc.grad_accum_steps, 1))))  # fmt: skip


def new_longest(lengths: tuple[int, ...], micro: int) -> list[tuple[int, int]]:
    """The micro-batches longer than every one before them: (their optimizer step, their length)."""
    out: list[tuple[int, int]] = []
    for i, n in enumerate(lengths):
        if not out or n > out[-1][1]:
            out.append((i // micro + 1, n))
    return out


def order_and_accumulation(row_id: str) -> None:
    """One row's ``delete`` run replayed (unlimited card) in three random orders of the same lengths, and with one
    micro-batch a step instead of ``grad_accum_steps``: what the order and the accumulation change."""
    r = next(r for r in rows("published.csv") if r["id"] == row_id)
    sc = Scenario.from_dict(json.loads(r["scenario_json"]))
    lengths = length_schedule(
        micro_batches(sc, DELETE), sc.seq_len, MEAN, SD, SHORTEST, DELETE, sc.micro_batch_size
    )
    out = [f"golden-ratio order {run_replay(sc, lengths, on_card=False)[0][-1] / GiB:.2f}"]
    for seed in (1, 2, 3):
        shuffled = list(lengths)
        random.Random(seed).shuffle(shuffled)
        out.append(f"shuffle {seed} {run_replay(sc, tuple(shuffled), on_card=False)[0][-1] / GiB:.2f}")
    one = run_replay(sc.replace(grad_accum_steps=1), lengths, on_card=False)[0]
    out.append(f"1 micro-batch a step ({len(one)} steps) {one[-1] / GiB:.2f}")
    print(f"\nrow {row_id}, delete, {len(lengths)} micro-batches, GiB: " + ", ".join(out))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ids", default="", help="published.csv ids to replay (comma-separated; default all)")
    p.add_argument("--growth", default="119,109", help="ids whose reserved is printed step by step")
    p.add_argument("--order", default="109", help="ids replayed in other orders and without accumulation")
    args = p.parse_args(argv)
    h200_run()
    swift_rows(set(args.ids.split(",")) if args.ids else None)
    for row_id in filter(None, args.growth.split(",")):
        growth(row_id)
    for row_id in filter(None, args.order.split(",")):
        order_and_accumulation(row_id)


if __name__ == "__main__":
    main()
