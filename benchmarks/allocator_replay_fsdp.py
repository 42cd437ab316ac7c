"""FSDP2 ranks: the engine's allocation stream (``alloc_stream.rank_stream`` with ``fsdp_stream``'s buffers on
their CUDA streams) replayed against the fake-tensor trace of one rank of the same job
(``trace/distributed.py``, PyTorch's own ``fully_shard`` under a fake process group, each storage on the stream
FSDP2 allocates it on), replayed the same way (docs/allocator.md, "FSDP2's streams").

For each case: the trace's peak reserved per stream and on one stream (what the replay gave before the trace
carried streams), the engine stream's, and the fitted rule's reserved (``reserved_model: fitted``: what the
estimate gave FSDP2 ranks before the replay covered them); the figures are ``tests/data/stream_vs_trace.figures``.
Nothing is fitted.

Run: python benchmarks/allocator_replay_fsdp.py [-k TEXT]; ``--record`` traces the cases the tests read as
recordings (``stream_vs_trace.RECORDED``: eager attention on FSDP2 and DDP ranks) and writes them to
tests/data/stream_traces/, then prints each recording's replay beside the engine's stream.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "data"))
from fidelity_cases import LLAMA_H512_V32K as SMALL_LLAMA  # noqa: E402  (the test's case, written once)
from stream_vs_trace import BASE, change, figures  # noqa: E402  (the comparison the tests hold, written once)


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


_TT_QKVO = {
    "framework": "torchtune",
    "lora": {"rank": 16, "targets": ["q_proj", "k_proj", "v_proj", "o_proj"], "adapter_dtype": "bf16"},
}
#: torchtune's QLoRA (torchao NF4 on the LoRA-wrapped Linears) beside its LoRA over a bf16 base: traced, not
#: replayed by default (docs/allocator.md, "FSDP2's streams": the stream is ~7% over under both)
TORCHTUNE: list[tuple[str, dict[str, Any]]] = [
    (f"llama L4 h512 V32k dp4 torchtune {m} qkvo", {**BASE, "model": SMALL_LLAMA, **_fsdp(4), **_TT_QKVO, "method": m})
    for m in ("qlora", "lora")
] + [
    (f"llama-3.2-1b dp4 b1 s1024 torchtune {m} qkvo", {**_REAL, **_fsdp(4), **_TT_QKVO, "method": m})
    for m in ("qlora", "lora")
]  # fmt: skip


def cases() -> list[tuple[str, dict[str, Any]]]:
    """This file's cases (each one the engine's stream models), then the cases of the multi-GPU fidelity suite
    (tests/data/fidelity_parallel_cases.py, real vocabularies included) whose rank the engine's stream models:
    its FSDP2 ranks, and its DDP and tensor-parallel ones since those entered the replay; last torchtune's
    QLoRA and LoRA ranks (``TORCHTUNE``: traced, the QLoRA one not replayed by default)."""
    from fidelity_parallel_cases import CASES

    from memsim_widget.engine.context import Context
    from memsim_widget.engine.counters.replayable import replayable
    from memsim_widget.scenario import Scenario

    out = list(OWN) + ACCUM + LORA
    for name, d in out:
        assert replayable(Context(Scenario.from_dict(d))), name
    for name, d, _stage in CASES:
        d = {**d, "reserved_model": "replay"}
        if replayable(Context(Scenario.from_dict(d))):
            out.append((name, d))
    return out + TORCHTUNE


def record() -> None:
    """Write each of ``RECORDED``'s recordings and print its replay beside the engine's stream."""
    from stream_vs_trace import RECORDED, recorded_figures, write_recorded

    print("| recording | bytes | trace reserved | engine stream | trace allocated | engine stream |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in RECORDED:
        path = write_recorded(name)
        t, s = recorded_figures(name)
        print(
            f"| {name} | {path.stat().st_size:,} | {t.peak_reserved:,} B | {change(s.peak_reserved, t.peak_reserved)} "
            f"| {t.peak_allocated:,} B | {change(s.peak_allocated, t.peak_allocated)} |",
            flush=True,
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-k", default="", help="only the cases whose name contains this")
    ap.add_argument(
        "--record", action="store_true", help="write the recordings the tests read, then print them"
    )
    args = ap.parse_args()
    if args.record:
        record()
        return
    print(
        "| case | trace replay (per stream) | on one stream | engine stream | fitted rule | allocated: trace, stream |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for name, d in cases():
        if args.k not in name:
            continue
        r = figures(d)
        t, ta = r["trace"], r["trace_allocated"]
        print(
            f"| {name} | {t:,} B | {change(r['one_stream'], t)} | {change(r['stream'], t)} | "
            f"{change(r['fitted'], t)} | {ta:,}, {change(r['stream_allocated'], ta)} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
