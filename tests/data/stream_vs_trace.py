"""A rank's allocation stream as the engine writes it beside the fake-tensor trace of the same rank, both replayed
through the same caching allocator (docs/allocator.md): the comparison the tests hold within a tolerance
(tests/engine/test_alloc_stream.py, test_fsdp_stream.py, test_tp_stream.py) and the benchmarks print
(benchmarks/allocator_replay_accum.py, _compiled.py, _fsdp.py, _tp.py), written once.

The trace is ``trace/api.trace_scenario``'s (one GPU, or one rank of a multi-GPU job on a fake process group),
replayed per CUDA stream with the cuBLAS workspaces (``trace/replay``); the engine's stream is
``alloc_stream.rank_stream`` of the first stage, replayed with the scenario's allocator settings. Nothing is fitted.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from memsim_widget.engine.context import Context
from memsim_widget.engine.counters.alloc_stream import PoolReplay
from memsim_widget.engine.counters.allocator import AllocatorConf, Event, ReplayResult

#: The step of the benchmarks' small cases (two sequences of 512 tokens in bf16) under the replay, the model added
#: per case (benchmarks/allocator_replay_accum.py, _fsdp.py, _tp.py).
BASE: dict[str, Any] = {
    "micro_batch_size": 2,
    "seq_len": 512,
    "precision": "bf16",
    "reserved_model": "replay",
}


@dataclass(frozen=True)
class StreamAndTrace:
    """The traced run (``tracker``), its allocation stream (``events``: handle, bytes, CUDA stream) and that
    stream's replay (``traced``) under the scenario's allocator settings (``conf``); the engine's context of the
    same step (``ctx``) and its stream's replay (``stream``)."""

    tracker: Any
    events: list[Event]
    conf: AllocatorConf
    traced: ReplayResult
    ctx: Context
    stream: PoolReplay


def stream_and_trace(d: dict[str, Any], inductor: bool = False) -> StreamAndTrace:
    """Trace scenario ``d`` (``inductor``: a compiled step under ``trace/compiled.inductor_passes``, the order of
    the compiled loss backward the stream follows) and replay it beside the engine's stream of the same step
    (``objectives.training_scenario``: the SFT step the engine simulates)."""
    from memsim_widget.engine.counters.alloc_stream import rank_stream, replay_stream
    from memsim_widget.engine.counters.allocator import replay
    from memsim_widget.engine.frameworks import allocator_conf
    from memsim_widget.engine.rl import objectives
    from memsim_widget.scenario import Scenario
    from memsim_widget.trace.api import trace_scenario
    from memsim_widget.trace.replay import _prepared

    sc = Scenario.from_dict(d)
    with _inductor_passes() if inductor else contextlib.nullcontext():
        tracker = trace_scenario(sc, progress=False).tracker
    events, _outside, conf, _ = _prepared(tracker, sc, None)
    ctx = Context(objectives.training_scenario(sc))
    stream = replay_stream(rank_stream(ctx, ctx.stages[0]), allocator_conf(ctx))
    return StreamAndTrace(tracker, events, conf, replay(events, conf=conf), ctx, stream)


def figures(d: dict[str, Any], traced_only: bool = False, inductor: bool = False) -> dict[str, Any]:
    """What the benchmarks print for scenario ``d`` (under ``reserved_model: replay``): the trace's peak reserved
    and allocated replayed per CUDA stream (``trace``, ``trace_allocated``) and on one stream (``one_stream``:
    what the replay gave before the trace carried streams), the CUDA streams it allocates on (``streams``), the
    engine stream's (``stream``, ``stream_allocated``, the phase of its peak ``at``), the fitted rule's reserved
    (``fitted``); with ``traced_only`` also the engine stream's reserved without the CUDA-only scratch a CPU
    trace cannot see (``stream_traced_only``, its allocated ``stream_traced_only_allocated``:
    ``rank_stream(traced_only=True)``, flash attention's fp32 dq accumulator)."""
    from memsim_widget.engine.core import estimate
    from memsim_widget.engine.counters.alloc_stream import rank_stream, replay_stream
    from memsim_widget.engine.counters.allocator import replay
    from memsim_widget.engine.frameworks import allocator_conf
    from memsim_widget.scenario import Scenario

    d = {**d, "reserved_model": "replay"}
    r = stream_and_trace(d, inductor=inductor)
    one = replay([(h, size, 0) for h, size, _ in r.events], conf=r.conf)
    ctx = r.ctx
    out: dict[str, Any] = {
        "trace": r.traced.peak_reserved,
        "trace_allocated": r.traced.peak_allocated,
        "one_stream": one.peak_reserved,
        "streams": sorted({st for _h, size, st in r.events if size >= 0}),
        "stream": r.stream.peak_reserved,
        "stream_allocated": r.stream.peak_allocated,
        "at": r.stream.at,
        "fitted": estimate(Scenario.from_dict({**d, "reserved_model": "fitted"}))
        .ranks[0]
        .peak_reserved_bytes,
    }
    if traced_only:
        seen = replay_stream(rank_stream(ctx, ctx.stages[0], traced_only=True), allocator_conf(ctx))
        out["stream_traced_only"] = seen.peak_reserved
        out["stream_traced_only_allocated"] = seen.peak_allocated
    return out


def _inductor_passes() -> Any:
    """``trace/compiled.inductor_passes``, imported only for a compiled trace."""
    from memsim_widget.trace.compiled import inductor_passes

    return inductor_passes()


def compiled_figures(name: str, inductor: bool = False, timeout: float | None = 600) -> dict[str, Any]:
    """``figures`` of the compiled case ``name`` (``fidelity_cases.COMPILED_CASES``) with ``traced_only``,
    computed in a fresh interpreter: one compiled trace per interpreter (``fresh_interpreter`` says why)."""
    from fresh_interpreter import run_json

    code = (
        "import json, sys\n"
        "from fidelity_cases import COMPILED_CASES\n"
        "from stream_vs_trace import figures\n"
        "d = dict(COMPILED_CASES)[sys.argv[1]]\n"
        f"print(json.dumps(figures(d, traced_only=True, inductor={inductor!r})))\n"
    )
    return run_json(code, name, timeout=timeout)


def change(x: int, base: int) -> str:
    """``x`` against ``base`` as the benchmarks print it: a signed percentage, two decimals."""
    return f"{(x - base) / base:+.2%}"


#: Scenarios whose traced rank is kept as a recording (``tests/data/stream_traces/<name>.json.gz``: the trace's
#: allocation stream, handles renumbered in order of first use, with the torch and transformers versions it ran
#: under), so that a test holds the engine's stream to it without tracing (``recorded_events``);
#: ``benchmarks/allocator_replay_fsdp.py --record`` writes them. Eager attention (the T x T scores) on an FSDP2
#: and a DDP rank of the small Llama with the real 32k vocabulary, without and with full checkpointing; on the
#: FSDP2 rank Megatron's selective checkpointing too (``_selective_traced``).
RECORDED: dict[str, dict[str, Any]] = {
    f"{kind}-dp4-eager{'-ckpt' if ckpt else ''}": {
        **BASE,
        "model": "llama-h512-v32k",
        "parallel": {"dp": 4, **({"zero": 3} if kind == "fsdp2" else {})},
        "attention": "eager",
        **({"activation_checkpointing": "full"} if ckpt else {}),
    }
    for kind in ("fsdp2", "ddp")
    for ckpt in (False, True)
} | {
    "fsdp2-dp4-eager-selective": {
        **BASE,
        "model": "llama-h512-v32k",
        "parallel": {"dp": 4, "zero": 3},
        "attention": "eager",
        "activation_checkpointing": "selective",
    }
}


def recorded_scenario(name: str) -> dict[str, Any]:
    """``RECORDED[name]`` with its model's config (``fidelity_cases.LLAMA_H512_V32K``)."""
    from fidelity_cases import LLAMA_H512_V32K

    return {**RECORDED[name], "model": LLAMA_H512_V32K}


def _recording(name: str) -> Any:
    from pathlib import Path

    return Path(__file__).resolve().parent / "stream_traces" / f"{name}.json.gz"


def write_recorded(name: str) -> Any:
    """Trace ``RECORDED[name]`` and write its allocation stream (``stream_and_trace``'s events, the cuBLAS
    workspaces included) as gzip'd JSON, byte for byte the same for the same trace; its path."""
    import gzip
    import json

    import torch
    import transformers

    d = recorded_scenario(name)
    with (
        _selective_traced() if d.get("activation_checkpointing") == "selective" else contextlib.nullcontext()
    ):
        r = stream_and_trace({**d, "activation_checkpointing": "none"} if "selective" in name else d)
    ids: dict[object, int] = {}
    events = [[ids.setdefault(h, len(ids)), size, st] for h, size, st in r.events]
    body = {
        "scenario": RECORDED[name],
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "events": events,
    }
    path = _recording(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(json.dumps(body, separators=(",", ":")).encode(), 9, mtime=0))
    return path


@contextlib.contextmanager
def _selective_traced() -> Any:
    """HF's models have no Megatron selective checkpointing to trace (``trace_scenario`` refuses it): while this
    runs, the traced model's attention is ``benchmarks/zero_trace._selective_attention``'s (eager's core under a
    non-reentrant checkpoint of its own, with eager's causal mask), so a trace without checkpointing is the
    selective one."""
    import sys
    from pathlib import Path

    import memsim_widget.trace.distributed as dist
    import memsim_widget.trace.hf as hf

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from zero_trace import _selective_attention  # pyright: ignore[reportMissingImports]

    core, build = _selective_attention(), hf.build_hf_model

    def selective(cfg: Any, dtype: Any, attention: str) -> Any:
        cfg._attn_implementation = core
        return build(cfg, dtype, core)

    hf.build_hf_model = dist.build_hf_model = selective  # type: ignore[assignment]
    try:
        yield
    finally:
        hf.build_hf_model = dist.build_hf_model = build  # type: ignore[assignment]


def recorded_events(name: str) -> list[Event]:
    """The recorded allocation stream of ``RECORDED[name]`` (``write_recorded``): (handle, bytes, CUDA stream)."""
    import gzip
    import json

    body = json.loads(gzip.decompress(_recording(name).read_bytes()))
    assert body["scenario"] == RECORDED[name], f"{name}: recorded for another scenario: rerun --record"
    return [(h, size, st) for h, size, st in body["events"]]


def recorded_figures(name: str) -> tuple[ReplayResult, PoolReplay]:
    """The recorded trace of ``RECORDED[name]`` replayed (per CUDA stream, the scenario's allocator settings) and
    the engine's stream of the same step (``stream_and_trace``'s, without tracing)."""
    from memsim_widget.engine.counters.alloc_stream import rank_stream, replay_stream
    from memsim_widget.engine.counters.allocator import replay
    from memsim_widget.engine.frameworks import allocator_conf
    from memsim_widget.engine.rl import objectives
    from memsim_widget.scenario import Scenario

    sc = Scenario.from_dict({**recorded_scenario(name), "reserved_model": "replay"})
    conf = allocator_conf(Context(sc))
    ctx = Context(objectives.training_scenario(sc))
    stream = replay_stream(rank_stream(ctx, ctx.stages[0]), allocator_conf(ctx))
    return replay(recorded_events(name), conf=conf), stream
