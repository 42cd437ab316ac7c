"""Time one ``estimate`` and 10,000 distinct scenarios. Prints the figures.

* ``new scenario``: an estimate the engine has not made (its result cache cleared) of a model whose states and
  activation terms another scenario already computed (``engine/caches/parts_cache``: they are shared by scenarios that
  differ only in fields they do not read, e.g. the micro-batch for the states, the ZeRO stage for the
  activations; so are the timeline's state groups and the model rules' check, ``engine/caches/model_rules_cache``):
  the case of a widget control moved, a scaling curve or a sweep (target 0.1 ms);
* ``new shape (replayed)``: the same, with the allocator replay of the step (``engine/counters/alloc_stream``, cached
  per shape) not cached: a one-GPU step whose shape the engine has not replayed (target 0.5 ms);
* ``cold``: every cache cleared first, the parts computed too;
* ``a control moved``: what the widget computes when a control other than the micro-batch or the length moves, the
  estimate and its scaling curves (11 micro-batches, 11 lengths: each a new shape);
* ``distinct scenarios``: 10,000 different scenarios of 6 models one after another, construction included.

Run: python benchmarks/estimate_speed.py
"""

from __future__ import annotations

import itertools
import statistics
import time
from typing import Any

from memsim_widget.engine.caches import parts_cache
from memsim_widget.engine.core import _estimate, estimate
from memsim_widget.engine.counters import alloc_stream
from memsim_widget.errors import ScenarioError
from memsim_widget.scenario import Scenario


def one_estimate_ms(
    scenario: Scenario, repeats: int = 200, cold: bool = False, new_shape: bool = False
) -> float:
    """Median wall time of an estimate not in the result cache (``cold``: no cached part either;
    ``new_shape``: the parts cached but not the allocator replay, ``engine/counters/alloc_stream``), in ms."""
    times = []
    for _ in range(repeats):
        _estimate.cache_clear()
        if cold:
            parts_cache.cache_clear()
            alloc_stream.cache_clear()
        if new_shape:
            alloc_stream.cache_clear()
        t0 = time.perf_counter()
        estimate(scenario)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def scaling_ms(scenario: Scenario, repeats: int = 3) -> tuple[float, int]:
    """The fastest of ``repeats`` wall times, in ms, of what the widget computes when a control other than the
    micro-batch or the length moves: the estimate and its "how it scales" curves (``charts.scaling_data``: 11
    micro-batches and 11 lengths, each a new shape), the parts cached, the replays not; and the shapes."""
    from memsim_widget.charts import _scaling_points, scaling_data

    estimate(scenario)
    best, shapes = float("inf"), 0
    for _ in range(repeats):
        _scaling_points.cache_clear()
        _estimate.cache_clear()
        alloc_stream.cache_clear()
        t0 = time.perf_counter()
        scaling_data(estimate(scenario))
        best = min(best, time.perf_counter() - t0)
        shapes = alloc_stream._replay_cached.cache_info().misses  # noqa: SLF001 (the shapes replayed)
    return best * 1e3, shapes


def many(n: int = 10_000) -> tuple[float, int, int]:
    """Seconds to estimate ``n`` distinct scenarios (scenario construction included), and how many of the grid's
    the engine refused on the way (their one-line errors are timed too)."""
    models = ["llama-3.1-8b", "llama-3.1-70b", "qwen2.5-7b", "mixtral-8x7b", "gpt2", "llama-3.2-1b"]
    grid = itertools.product(
        models,
        [1, 2, 4, 8],
        [512, 1024, 2048, 4096, 8192],
        ["bf16", "amp-bf16", "fp32"],
        ["none", "full"],
        [0, 1, 2, 3],
        [1, 8],
        ["full", "lora"],
    )
    _estimate.cache_clear()
    parts_cache.cache_clear()
    alloc_stream.cache_clear()
    t0 = time.perf_counter()
    count = refused = 0
    for model, b, s, prec, ck, zero, dp, method in grid:
        if count >= n:
            break
        if model == "gpt2" and s > 1024:  # past GPT-2's 1024-row position table: an error, not a scenario
            continue
        try:
            sc = Scenario.from_dict(
                {
                    "model": model,
                    "micro_batch_size": b,
                    "seq_len": s,
                    "precision": prec,
                    "activation_checkpointing": ck,
                    "method": method,
                    "lora": {"targets": ["all-linear"]},
                    "parallel": {"dp": dp, "zero": zero},
                }
            )
            estimate(sc)
        except (
            ScenarioError
        ):  # e.g. Mixtral's all-linear LoRA (its fused experts) outside bf16: refused, timed too
            refused += 1
            continue
        count += 1
    return time.perf_counter() - t0, count, refused


#: The shapes timed one by one: the widget's usual one-GPU models, a LoRA, FSDP2 and DeepSpeed ZeRO-3 on 8 GPUs
#: (issue 22: a new shape's estimate under 0.5 ms), then the large ones.
SHAPES: dict[str, dict[str, Any]] = {
    "llama-3.2-1b": {"model": "llama-3.2-1b", "seq_len": 2048},
    "llama-3.1-8b": {"model": "llama-3.1-8b", "seq_len": 4096},
    "qwen2.5-7b LoRA": {
        "model": "qwen2.5-7b",
        "seq_len": 4096,
        "method": "lora",
        "lora": {"targets": ["all-linear"]},
    },
    "8B FSDP2 dp8": {
        "model": "llama-3.1-8b",
        "seq_len": 4096,
        "framework": "torchtitan",
        "parallel": {"dp": 8, "zero": 3},
    },
    "8B ZeRO-3 dp8": {"model": "llama-3.1-8b", "seq_len": 4096, "parallel": {"dp": 8, "zero": 3}},
    "llama-3.1-405b": {"model": "llama-3.1-405b", "seq_len": 4096},
    "mixtral-8x7b": {"model": "mixtral-8x7b", "seq_len": 4096},
}

if __name__ == "__main__":
    for name, d in SHAPES.items():
        sc = Scenario.from_dict(d)
        new, cold = one_estimate_ms(sc), one_estimate_ms(sc, cold=True, repeats=20)
        shape = one_estimate_ms(sc.replace(reserved_model="replay"), new_shape=True, repeats=20)
        print(
            f"one estimate ({name}): new scenario {new:.3f} ms (target 0.1 ms), new shape (replayed) "
            f"{shape:.3f} ms (target 0.5 ms), cold {cold:.3f} ms"
        )
    for name in ("llama-3.2-1b", "llama-3.1-8b"):
        ms, shapes = scaling_ms(Scenario.from_dict(SHAPES[name]))
        print(f"a control moved ({name}): the estimate and its scaling curves, {shapes} shapes, {ms:.0f} ms")
    sc = Scenario.from_dict(
        {"model": "llama-3.1-70b", "parallel": {"dp": 4, "tp": 4, "pp": 4, "zero": 1, "pp_microbatches": 8}}
    )
    new, cold = one_estimate_ms(sc), one_estimate_ms(sc, cold=True)
    print(f"one estimate (llama-3.1-70b, 4 pipeline stages): new scenario {new:.3f} ms, cold {cold:.3f} ms")
    secs, count, refused = many()
    print(
        f"{count} distinct scenarios: {secs:.2f} s ({count / secs:,.0f} per second; {refused} refused on the way)"
    )
