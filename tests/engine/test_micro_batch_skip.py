"""The replay's skip of identical micro-batches (``alloc_stream._run_micro_batches``) gives exactly what replaying
every event gives: each figure ``replay_stream`` reports, over accumulating steps of every layout the stream
writes."""

from __future__ import annotations

from dataclasses import astuple
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memsim_widget.engine.context import Context
from memsim_widget.engine.counters import alloc_stream
from memsim_widget.engine.counters.allocator import CachingAllocator
from memsim_widget.engine.counters.replayable import replayable
from memsim_widget.engine.frameworks import allocator_conf
from memsim_widget.errors import ScenarioError
from memsim_widget.scenario import Scenario


def _both(d: dict[str, Any]) -> tuple[tuple[Any, ...], tuple[Any, ...], alloc_stream.StreamWriter]:
    ctx = Context(Scenario.from_dict({**d, "reserved_model": "replay"}))
    stream = alloc_stream.rank_stream(ctx, ctx.stages[0])
    conf = allocator_conf(ctx)
    skipped = alloc_stream.replay_stream(stream, conf)
    return astuple(skipped), astuple(alloc_stream.replay_stream(stream, conf, every_event=True)), stream


def test_a_long_accumulation_is_skipped_and_replays_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    replayed: list[int] = []
    run_from = CachingAllocator.run_from
    monkeypatch.setattr(
        CachingAllocator,
        "run_from",
        lambda a, ev, start, end: (replayed.append(max(end - start, 0)), run_from(a, ev, start, end)),
    )
    got, want, stream = _both({"model": "qwen2.5-0.5b", "seq_len": 1024, "grad_accum_steps": 16})
    assert got == want
    assert [len(b) for b in stream.micro_bounds] == [16, 16]  # micro-batches 2..16 and the end, per step
    per_micro_batch = stream.micro_bounds[0][2][0] - stream.micro_bounds[0][1][0]
    # each step replays its first three micro-batches and skips the 13 after: events of 26 micro-batches unread
    assert len(stream.events) - sum(replayed) == 26 * per_micro_batch


@settings(max_examples=25, deadline=None)
@given(
    model=st.sampled_from(["qwen2.5-0.5b", "llama-3.2-1b", "gpt2"]),
    accum=st.integers(1, 9),
    micro=st.sampled_from([1, 2]),
    seq=st.sampled_from([128, 512, 1024]),
    method=st.sampled_from(["full", "lora"]),
    ckpt=st.sampled_from(["none", "full"]),
    layout=st.sampled_from([{}, {"dp": 2}, {"dp": 2, "zero": 3}, {"tp": 2}]),
    conf=st.sampled_from(
        [None, "expandable_segments:True", "max_split_size_mb:64", "roundup_power2_divisions:4"]
    ),
)
def test_skipping_identical_micro_batches_changes_no_figure(
    model: str, accum: int, micro: int, seq: int, method: str, ckpt: str, layout: dict, conf: str | None
) -> None:
    d: dict[str, Any] = {
        "model": model,
        "grad_accum_steps": accum,
        "micro_batch_size": micro,
        "seq_len": seq,
        "method": method,
        "activation_checkpointing": ckpt,
        "parallel": layout,
    }
    if conf:
        d["allocator_conf"] = conf
    try:
        ctx = Context(Scenario.from_dict({**d, "reserved_model": "replay"}))
    except (
        ScenarioError
    ):  # a combination the scenario refuses (GPT-2 has no q_proj for LoRA's default targets)
        return
    if not replayable(ctx):
        return
    got, want, _ = _both(d)
    assert got == want
