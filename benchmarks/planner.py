"""Planner speed: candidates per second, search times, and the vectorised path against ``estimate``.

Prints, on one core (numpy's elementwise work is single-threaded; BLAS threads are pinned to 1):
* a 70B search over 1-1024 GPUs (powers of two), cold (engine parts not yet cached) and warm;
* a 70B search on 64 GPUs and an 8B QLoRA search on one RTX 4090;
* an 8B search on one H100 under ``reserved_model: replay`` (every one-GPU shape's allocator replayed,
  engine/counters/alloc_stream), cold (no replay cached), beside the same search under the fitted rule, and how
  many streams it built, how many it replayed (a stream whose requested bytes exceed the room is not: out
  of memory, ``alloc_stream.stream_asks``) and how many again on the card where ``card_runs`` cannot tell;
* the vectorised engine alone on the 1-1024 candidates (candidates per second);
* ``estimate`` called one candidate at a time on a sample, its per-candidate time, and whether every
  figure agrees with the vectorised path (allocated, reserved, nvidia-smi bytes, peak moment, worst stage).

Run: python benchmarks/planner.py [--sample 2000]
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import argparse  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

from memsim_widget.engine.caches import parts_cache  # noqa: E402
from memsim_widget.engine.core import _estimate, estimate  # noqa: E402
from memsim_widget.plan import plan, vector  # noqa: E402
from memsim_widget.plan.search import base_scenario  # noqa: E402
from memsim_widget.plan.space import SearchSpace, candidates, gpu_counts, layouts  # noqa: E402
from memsim_widget.plan.vector import COLUMNS, candidate_scenario, evaluate  # noqa: E402

BIG = {"model": "llama-3.1-70b", "gpu": "h100-sxm-80gb", "seq_len": 8192, "global_batch_tokens": 1 << 22}


def clear_caches() -> None:
    """Forget every engine part the vectorised path caches (the model architecture stays parsed)."""
    vector.state_row.cache_clear()
    vector.act_row.cache_clear()
    vector.state_parts.cache_clear()
    vector.KEY_TABLES.clear()
    _estimate.cache_clear()
    parts_cache.cache_clear()


def timed(fn, *args, **kwargs):  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - t0


def replay_search() -> None:
    """The 8B search on one H100 with every one-GPU shape replayed, cold, against the fitted rule."""
    from memsim_widget.engine.counters import alloc_stream, card_replay

    kw = {"seq_len": 4096}
    clear_caches()
    _, fitted = timed(plan, "llama-3.1-8b", "h100-sxm-80gb", 1, **kw)
    clear_caches()
    alloc_stream.cache_clear()
    cpu = time.process_time()
    p, replayed = timed(plan, "llama-3.1-8b", "h100-sxm-80gb", 1, reserved_model="replay", **kw)
    cpu = time.process_time() - cpu
    shapes = alloc_stream._replay_cached.cache_info().misses
    cards = card_replay._card_cached.cache_info().misses
    asked = alloc_stream._asks_cached.cache_info().misses
    print(
        f"8B, 1 x H100, reserved_model replay: {p.evaluated:,} candidates, {asked} shapes' streams built, "
        f"{shapes} replayed (the others out of memory by their requested bytes alone), {cards} of "
        f"them again on the card; cold {replayed:.2f} s ({cpu:.2f} s of CPU: the machine is shared), the fitted "
        f"rule: {fitted:.2f} s"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sample", type=int, default=2000, help="candidates checked one by one with estimate")
    args = ap.parse_args()

    print("== plan() searches ==")
    clear_caches()
    p, cold = timed(plan, gpus=(1, 1024), **BIG)
    _, warm = timed(plan, gpus=(1, 1024), **BIG)
    print(
        f"70B, 1-1024 GPUs ({len(p.gpu_counts)} counts): {p.evaluated:,} candidates, {p.fitting:,} fit; "
        f"cold {cold:.2f} s ({p.evaluated / cold:,.0f}/s), warm {warm:.2f} s ({p.evaluated / warm:,.0f}/s)"
    )
    clear_caches()
    p64, cold64 = timed(plan, "llama-3.1-70b", "h100-sxm-80gb", 64, seq_len=8192, global_batch_tokens=1 << 20)
    _, warm64 = timed(plan, "llama-3.1-70b", "h100-sxm-80gb", 64, seq_len=8192, global_batch_tokens=1 << 20)
    print(f"70B, 64 x H100: {p64.evaluated:,} candidates; cold {cold64:.3f} s, warm {warm64:.3f} s")
    clear_caches()
    pq, coldq = timed(plan, "llama-3.1-8b", "rtx-4090", 1, method="qlora", seq_len=2048)
    print(f"8B QLoRA, 1 x RTX 4090: {pq.evaluated:,} candidates, {pq.fitting} fit; cold {coldq * 1e3:.0f} ms")

    replay_search()

    print("\n== the vectorised engine alone ==")
    base = base_scenario(model=BIG["model"], gpu=BIG["gpu"], seq_len=BIG["seq_len"])
    space = SearchSpace()
    seqs = BIG["global_batch_tokens"] // BIG["seq_len"]
    cols = candidates(base, layouts(base, gpu_counts((1, 1024)), space), space, seqs)
    n = cols["dp"].shape[0]
    clear_caches()
    ev, cold_e = timed(evaluate, base, cols, space.optimizers)
    _, warm_e = timed(evaluate, base, cols, space.optimizers)
    print(
        f"{n:,} candidates (offload included): cold {cold_e:.2f} s = {n / cold_e:,.0f} candidates/s; "
        f"warm {warm_e:.2f} s = {n / warm_e:,.0f} candidates/s"
    )

    print("\n== against estimate, one candidate at a time ==")
    rng = np.random.default_rng(0)
    idx = rng.choice(n, size=min(args.sample, n), replace=False)
    _estimate.cache_clear()
    t0 = time.perf_counter()
    mismatches = 0
    for i in idx.tolist():
        row = {k: int(cols[k][i]) for k in COLUMNS}
        est = estimate(candidate_scenario(base, space.optimizers, row))
        got = (
            int(ev.peak_allocated_bytes[i]),
            int(ev.peak_reserved_bytes[i]),
            int(ev.device_total_bytes[i]),
            str(ev.peak_phase[i]),
            int(ev.worst_stage[i]),
        )
        want = (
            est.peak_allocated_bytes,
            est.peak_reserved_bytes,
            est.device_total_bytes,
            est.peak_phase,
            est.worst.stage.index,
        )
        mismatches += got != want
    per = (time.perf_counter() - t0) / len(idx)
    print(
        f"{len(idx):,} sampled candidates: estimate {per * 1e3:.2f} ms each ({1 / per:,.0f}/s); "
        f"vectorised path {warm_e / n * 1e6:.2f} us each, {per / (warm_e / n):,.0f}x faster; "
        f"mismatching figures: {mismatches}"
    )
    if mismatches:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
