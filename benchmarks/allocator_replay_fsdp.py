"""FSDP2 ranks: the engine's allocation stream (``alloc_stream.rank_stream`` with ``fsdp_stream``'s buffers on
their CUDA streams) replayed against the fake-tensor trace of one rank of the same job
(``trace/distributed.py``, PyTorch's own ``fully_shard`` under a fake process group, each storage on the stream
FSDP2 allocates it on), replayed the same way (docs/allocator.md, "FSDP2's streams").

For each case: the trace's peak reserved per stream and on one stream (what the replay gave before the trace
carried streams), the engine stream's, and the fitted rule's reserved (``reserved_model`` unset: what the
estimate gives FSDP2 ranks without the replay). Nothing is fitted.

Run: python benchmarks/allocator_replay_fsdp.py [-k TEXT]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "data"))
from fidelity_cases import LLAMA_H512_V32K as SMALL_LLAMA  # noqa: E402  (the test's case, written once)

BASE = {"micro_batch_size": 2, "seq_len": 512, "precision": "bf16", "reserved_model": "replay"}


def _fsdp(dp: int, reshard: bool = True) -> dict[str, Any]:
    return {"parallel": {"dp": dp, "zero": 3, "reshard_after_forward": reshard}}


OWN: list[tuple[str, dict[str, Any]]] = [
    ("llama L4 h512 V32k dp2", {**BASE, "model": SMALL_LLAMA, **_fsdp(2)}),
    ("llama L4 h512 V32k dp8", {**BASE, "model": SMALL_LLAMA, **_fsdp(8)}),
    ("llama L4 h512 V32k dp4 no reshard", {**BASE, "model": SMALL_LLAMA, **_fsdp(4, False)}),
    (
        "llama L4 h512 V32k dp4 tied",
        {**BASE, "model": {**SMALL_LLAMA, "tie_word_embeddings": True}, **_fsdp(4)},
    ),
    (
        "llama L4 h512 V32k dp4 ckpt",
        {**BASE, "model": SMALL_LLAMA, **_fsdp(4), "activation_checkpointing": "full"},
    ),
    (
        "llama L4 h512 V32k dp4 torchtitan amp",
        {**BASE, "model": SMALL_LLAMA, **_fsdp(4), "precision": "amp-bf16", "framework": "torchtitan"},
    ),
]


_TIED = {**SMALL_LLAMA, "tie_word_embeddings": True}
_REAL = {"model": "llama-3.2-1b", "micro_batch_size": 1, "seq_len": 1024, "precision": "bf16"}
#: gradient accumulation (docs/allocator.md, "FSDP2's streams"): HF Trainer's loop (``no_sync`` on all but the
#: last micro-batch) and torchtitan's (every micro-batch reduce-scattered), small layers and a real model
ACCUM: list[tuple[str, dict[str, Any]]] = [
    (
        "llama L4 h512 V32k dp4 a3 hf no_sync",
        {**BASE, "model": SMALL_LLAMA, **_fsdp(4), "grad_accum_steps": 3},
    ),
    (
        "llama L4 h512 V32k dp4 a2 hf no_sync tied",
        {**BASE, "model": _TIED, **_fsdp(4), "grad_accum_steps": 2},
    ),
    (
        "llama L4 h512 V32k dp4 a2 hf no_sync ckpt",
        {**BASE, "model": SMALL_LLAMA, **_fsdp(4), "grad_accum_steps": 2, "activation_checkpointing": "full"},
    ),
    (
        "llama L4 h512 V32k dp4 a3 torchtitan",
        {**BASE, "model": SMALL_LLAMA, **_fsdp(4), "grad_accum_steps": 3, "framework": "torchtitan"},
    ),
    (
        "llama L4 h512 V32k dp4 a3 torchtitan amp",
        {
            **BASE,
            "model": SMALL_LLAMA,
            **_fsdp(4),
            "grad_accum_steps": 3,
            "framework": "torchtitan",
            "precision": "amp-bf16",
        },
    ),  # fmt: skip
    (
        "llama-3.2-1b dp4 b1 s1024 a2 hf no_sync",
        {**_REAL, "reserved_model": "replay", **_fsdp(4), "grad_accum_steps": 2},
    ),
    (
        "llama-3.2-1b dp4 b1 s1024 a2 torchtitan",
        {**_REAL, "reserved_model": "replay", **_fsdp(4), "grad_accum_steps": 2, "framework": "torchtitan"},
    ),
]


_QKVO = {"method": "lora", "lora": {"rank": 16, "targets": ["q_proj", "k_proj", "v_proj", "o_proj"]}}
_ALL = {"method": "lora", "lora": {"rank": 16, "targets": ["all-linear"]}}
#: LoRA: peft's adapters (fp32) beside the frozen bf16 base in each unit (docs/allocator.md, "FSDP2's streams")
LORA: list[tuple[str, dict[str, Any]]] = [
    ("llama L4 h512 V32k dp4 LoRA qkvo", {**BASE, "model": SMALL_LLAMA, **_fsdp(4), **_QKVO}),
    ("llama L4 h512 V32k dp4 LoRA all-linear", {**BASE, "model": SMALL_LLAMA, **_fsdp(4), **_ALL}),
    ("llama L4 h512 V32k dp8 LoRA qkvo tied", {**BASE, "model": _TIED, **_fsdp(8), **_QKVO}),
    ("llama L4 h512 V32k dp4 LoRA all-linear tied", {**BASE, "model": _TIED, **_fsdp(4), **_ALL}),
    ("llama L4 h512 V32k dp8 LoRA all-linear tied", {**BASE, "model": _TIED, **_fsdp(8), **_ALL}),
    ("llama L4 h512 V32k dp4 LoRA qkvo no reshard", {**BASE, "model": SMALL_LLAMA, **_fsdp(4, False), **_QKVO}),
    ("llama L4 h512 V32k dp4 LoRA qkvo a2 hf no_sync", {**BASE, "model": SMALL_LLAMA, **_fsdp(4), **_QKVO,
                                                          "grad_accum_steps": 2}),
    ("llama-3.2-1b dp4 b1 s1024 LoRA qkvo", {**_REAL, "reserved_model": "replay", **_fsdp(4), **_QKVO}),
    ("llama-3.2-1b dp4 b1 s1024 LoRA all-linear ckpt", {**_REAL, "reserved_model": "replay", **_fsdp(4), **_ALL,
                                                         "activation_checkpointing": "full"}),
]  # fmt: skip


def cases() -> list[tuple[str, dict[str, Any]]]:
    """This file's cases, then the FSDP2 cases of the multi-GPU fidelity suite (tests/data/
    fidelity_parallel_cases.py, real vocabularies included) whose rank the engine's stream models."""
    from fidelity_parallel_cases import CASES

    from memsim_widget.engine.context import Context
    from memsim_widget.engine.counters.alloc_stream import replayable
    from memsim_widget.scenario import Scenario

    out = list(OWN) + ACCUM + LORA
    for name, d, _stage in CASES:
        d = {**d, "reserved_model": "replay"}
        if replayable(Context(Scenario.from_dict(d))):
            out.append((name, d))
    return out


def compare(d: dict[str, Any]) -> dict[str, Any]:
    """The trace's replay (per stream and on one stream), the engine stream's and the fitted rule's reserved
    for scenario ``d``."""
    from memsim_widget import estimate
    from memsim_widget.engine.context import Context
    from memsim_widget.engine.counters.alloc_stream import rank_stream, replay_stream, replayable
    from memsim_widget.engine.counters.allocator import replay
    from memsim_widget.engine.frameworks import allocator_conf
    from memsim_widget.scenario import Scenario
    from memsim_widget.trace.api import trace_scenario
    from memsim_widget.trace.replay import _prepared

    sc = Scenario.from_dict(d)
    result = trace_scenario(sc, progress=False)
    events, _outside, conf, _ = _prepared(result.tracker, sc, None)
    traced = replay(events, conf=conf)
    one = replay([(h, size, 0) for h, size, _ in events], conf=conf)
    ctx = Context(sc)
    assert replayable(ctx), d
    rep = replay_stream(rank_stream(ctx, ctx.stages[0]), allocator_conf(ctx))
    fitted = estimate(Scenario.from_dict({**d, "reserved_model": "fitted"})).ranks[0]
    return {
        "trace": traced.peak_reserved,
        "trace_allocated": traced.peak_allocated,
        "one_stream": one.peak_reserved,
        "stream": rep.peak_reserved,
        "stream_allocated": rep.peak_allocated,
        "at": rep.at,
        "fitted": fitted.peak_reserved_bytes,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-k", default="", help="only the cases whose name contains this")
    args = ap.parse_args()
    print(
        "| case | trace replay (per stream) | on one stream | engine stream | fitted rule | allocated: trace, stream |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for name, d in cases():
        if args.k not in name:
            continue
        r = compare(d)
        t = r["trace"]

        def pct(x: int, t: int = t) -> str:
            return f"{(x - t) / t:+.2%}"

        print(
            f"| {name} | {t:,} B | {pct(r['one_stream'])} | {pct(r['stream'])} | {pct(r['fitted'])} | "
            f"{r['trace_allocated']:,}, {(r['stream_allocated'] - r['trace_allocated']) / r['trace_allocated']:+.2%} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
