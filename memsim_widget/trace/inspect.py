"""Inspect a traced HF training step: what is alive at the end of forward, per layer and op; backward and optimizer.

Run ``python -m memsim_widget.trace.inspect --preset llama`` (or ``--config '{"model_type": ...}'``).
"""

from __future__ import annotations

import argparse
import json
import re
from collections import defaultdict
from typing import Any

from .run import TraceResult
from .tracker import MemoryTracker, StorageRecord

_SMALL: dict[str, Any] = dict(
    hidden_size=256,
    intermediate_size=688,
    num_attention_heads=4,
    num_key_value_heads=2,
    num_hidden_layers=2,
    vocab_size=1000,
)
PRESETS: dict[str, dict[str, Any]] = {
    "llama": dict(model_type="llama", **_SMALL),
    "mistral": dict(model_type="mistral", **_SMALL, sliding_window=None),
    "qwen2": dict(model_type="qwen2", **_SMALL),
    "mixtral": dict(
        model_type="mixtral", **_SMALL, num_local_experts=4, num_experts_per_tok=2, sliding_window=None
    ),
    "gpt2": dict(model_type="gpt2", n_embd=256, n_layer=2, n_head=4, vocab_size=1000, n_positions=256),
}


def _short(module: str) -> str:
    """Module path relative to its decoder layer (``self_attn.q_proj``), or the full path outside layers."""
    m = re.search(r"\.(?:layers|layer|h|block|blocks)\.\d+\.?(.*)$", "." + module)
    return (m.group(1) or "<layer>") if m else (module or "<top>")


def _fmt(r: StorageRecord) -> str:
    """One line describing a record."""
    shape = "x".join(map(str, r.shape)) or "scalar"
    flag = "S" if r.saved else "-"
    return f"{r.nbytes:>12,d} {flag} {r.dtype:<9} {shape:<22} {r.op:<34} {_short(r.module)}"


def forward_survivors(tracker: MemoryTracker, step: int) -> list[StorageRecord]:
    """Storages created in forward/loss of ``step`` that are still alive when backward starts."""
    bwd = tracker.mark_seq(step, "backward")
    return [
        r
        for r in tracker.records
        if r.step == step and r.phase in ("forward", "loss") and r.role is None and r.alive_at(bwd - 1)  # pyright: ignore[reportOptionalOperand]
    ]


def report(res: TraceResult, step: int | None = None, *, first_backward: int = 12, file: Any = None) -> dict:
    """Print (and return) the end-of-forward survivors per layer, first backward allocations, optimizer temps."""
    tr: MemoryTracker = res.tracker
    step = step or max(s for s in tr.step_peaks)
    out: dict[str, Any] = {"layers": defaultdict(list), "model": [], "backward_first": [], "optimizer": {}}
    surv = forward_survivors(tr, step)
    for r in surv:
        (out["layers"][r.layer] if r.layer is not None else out["model"]).append(r)

    def p(*a: Any) -> None:
        print(*a, file=file)

    bwd = tr.mark_seq(step, "backward")
    p(
        f"== step {step}: alive at start of backward = {tr.live_bytes_at(bwd):,d} B; peak {res.peak_bytes:,d} B "  # pyright: ignore[reportArgumentType]
        f"({res.peak_phase} / {res.peak_op} / {res.peak_module})"
    )
    p("   columns: bytes, S = saved for backward by autograd, dtype, shape, creating op, module")
    for layer in sorted(out["layers"]):
        recs = sorted(out["layers"][layer], key=lambda r: r.alloc_seq)
        p(f"-- layer {layer}: {len(recs)} storages, {sum(r.nbytes for r in recs):,d} B")
        if layer == min(out["layers"]) or layer == max(out["layers"]):
            for r in recs:
                p("   " + _fmt(r))
    recs = sorted(out["model"], key=lambda r: r.alloc_seq)
    p(f"-- outside layers: {len(recs)} storages, {sum(r.nbytes for r in recs):,d} B")
    for r in recs:
        p("   " + _fmt(r))
    # first allocations of backward
    bw = sorted(
        (r for r in tr.records if r.step == step and r.phase == "backward"), key=lambda r: r.alloc_seq
    )
    p(f"-- first {first_backward} backward allocations (live bytes right after each):")
    for r in bw[:first_backward]:
        p(f"   live {tr.live_bytes_at(r.alloc_seq):>12,d} " + _fmt(r))
        out["backward_first"].append(r)
    # optimizer temporaries
    o0 = tr.mark_seq(step, "optimizer_step")
    o1 = tr.mark_seq(step, "zero_grad")
    if o0 is not None and o1 is not None:
        start = tr.live_bytes_at(o0)
        top = max((e[4] for e in tr.events if o0 <= e[0] < o1), default=start)
        temps = [
            r
            for r in tr.records
            if r.step == step and r.phase == "optimizer_step" and tr.final_role(r) == "temporary"
        ]
        big = sorted(temps, key=lambda r: r.nbytes, reverse=True)[:6]
        out["optimizer"] = {"start": start, "max": top, "extra": top - start, "temps": big}
        p(
            f"-- optimizer step: live at start {start:,d}, max {top:,d}, extra {top - start:,d} B; largest temps:"
        )
        for r in big:
            p("   " + _fmt(r))
    p("-- phase peaks: " + json.dumps(res.phase_peaks))
    p("-- model state bytes: " + json.dumps(res.model_state_bytes))
    for n in res.notes:
        p("   note: " + n)
    return out


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point."""
    from .hf import trace_hf

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--preset", choices=sorted(PRESETS), default="llama")
    ap.add_argument("--config", help="JSON dict overriding/adding config keys")
    ap.add_argument("-b", "--batch", type=int, default=2)
    ap.add_argument("-s", "--seq", type=int, default=64)
    ap.add_argument("--precision", default="bf16")
    ap.add_argument("--attention", default="sdpa")
    ap.add_argument("--optimizer", default="adamw")
    ap.add_argument("--impl", default="foreach")
    ap.add_argument("--gc", action="store_true", help="gradient checkpointing")
    ap.add_argument("--lora", help='JSON, e.g. {"r": 8, "target_modules": ["q_proj", "v_proj"]}')
    ap.add_argument("--output-lifetime", default="trainer", choices=("trainer", "backward", "step"))
    ap.add_argument("--real", action="store_true", help="run for real on CPU instead of fake tensors")
    ap.add_argument("--steps", type=int, default=2)
    a = ap.parse_args(argv)
    cfg = dict(PRESETS[a.preset])
    if a.config:
        cfg.update(json.loads(a.config))
    res = trace_hf(
        cfg,
        micro_batch_size=a.batch,
        seq_len=a.seq,
        precision=a.precision,
        attention=a.attention,
        optimizer=a.optimizer,
        optimizer_impl=a.impl,
        gradient_checkpointing=a.gc,
        lora=json.loads(a.lora) if a.lora else None,
        steps=a.steps,
        fake=not a.real,
        output_lifetime=a.output_lifetime,
        mark_saved=True,
        progress=False,
    )
    report(res)


if __name__ == "__main__":
    main()
