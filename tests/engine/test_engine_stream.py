"""The experiment of benchmarks/allocator_replay.py: an allocation stream built from the engine's own groups
(``engine_stream``), replayed. Not the engine's path (docs/allocator.md reports how far it is from the traces);
these tests hold the stream to what it claims to be: well formed, holding the engine's tensors."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import allocator_replay as ar  # noqa: E402

from memsim_widget import Scenario, estimate  # noqa: E402
from memsim_widget.engine.allocator import FREE, replay  # noqa: E402

LLAMA = {"model": "llama-3.2-1b", "micro_batch_size": 4, "seq_len": 1024, "precision": "bf16"}


def test_every_free_follows_its_allocation_once() -> None:
    live: set[object] = set()
    events = ar.engine_stream(Scenario.from_dict(LLAMA))
    for handle, size, _ in events:
        if size == FREE:
            assert handle in live
            live.remove(handle)
        else:
            assert handle not in live and size > 0
            live.add(handle)


def test_the_stream_holds_the_engines_tensors() -> None:
    """The replayed peak allocated is the engine's peak allocated within 1%: the same items, cut into tensors
    (each rounded to 512 B on its own) and ordered per layer instead of summed per moment."""
    sc = Scenario.from_dict(LLAMA)
    got = replay(ar.engine_stream(sc)).peak_allocated
    want = estimate(sc).ranks[0].peak_allocated_bytes
    assert abs(got / want - 1) < 0.01


def test_checkpointing_replays_the_layer_in_forward_and_backward() -> None:
    """Under full checkpointing each layer's saved terms are allocated twice per step (forward, dropped; its
    recompute in backward) beside the checkpointed inputs: more events than without, a lower allocated peak."""
    plain = ar.engine_stream(Scenario.from_dict(LLAMA), steps=1)
    ckpt = ar.engine_stream(Scenario.from_dict({**LLAMA, "activation_checkpointing": "full"}), steps=1)
    assert len(ckpt) > len(plain)
    assert replay(ckpt).peak_allocated < replay(plain).peak_allocated
