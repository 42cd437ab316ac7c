"""Engine vs fake-tensor trace: peak live tensor bytes of the same HF training step, per scenario.

Run: python benchmarks/fidelity_trace.py [--quick] [--compiled | --litgpt | --fp8] [-k TEXT] [--write docs/fidelity.md]
(``--compiled``: the compiled steps, ``COMPILED_CASES``, whose table is in docs/fidelity.md's compiled section;
``--litgpt``: litgpt's own step, ``LITGPT_CASES``, in its litgpt section; ``--fp8``: torchao's float8 training,
``FP8_CASES``, in its fp8 section)
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

# the engine-vs-trace case matrices are test data (tests/data), not in the wheel
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "data"))
from fidelity_cases import CASES, COMPILED_CASES, FP8_CASES, LITGPT_CASES, compare  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--write", help="write a markdown table here")
    ap.add_argument("-v", action="store_true")
    ap.add_argument("-k", metavar="TEXT", help="only the cases whose name contains TEXT")
    ap.add_argument("--compiled", action="store_true", help="the compiled steps (COMPILED_CASES) instead")
    ap.add_argument("--litgpt", action="store_true", help="litgpt's own step (LITGPT_CASES) instead")
    ap.add_argument("--fp8", action="store_true", help="torchao's float8 training (FP8_CASES) instead")
    args = ap.parse_args(argv)
    if (args.compiled or args.litgpt or args.fp8) and args.write:
        ap.error(
            "--write writes the eager table; the compiled, litgpt and fp8 ones are edited in docs/fidelity.md by hand"
        )
    cases = (
        COMPILED_CASES
        if args.compiled
        else LITGPT_CASES
        if args.litgpt
        else FP8_CASES
        if args.fp8
        else CASES[:5]
        if args.quick
        else CASES
    )
    if args.k:
        cases = [(name, data) for name, data in cases if args.k in name]
    rows = []
    for name, data in cases:
        r = compare(name, data)
        rows.append(r)
        print(
            f"{name:<34} engine {r['engine']:>12,} trace {r['trace']:>12,} error {r['error']:+7.2%}  "
            f"engine@{r['engine_moment']} trace@{r['trace_phase']}:{r['trace_op']}",
            flush=True,
        )
        if args.v:
            print("   ", r["by_role"], r["phase_peaks"])
    errs = [abs(r["error"]) for r in rows]
    print(f"median |error| {statistics.median(errs):.2%}, worst {max(errs):.2%}")
    if args.write:
        import platform

        import torch
        import transformers

        lines = [
            "# Fidelity: engine vs fake-tensor trace",
            "",
            "Each row simulates one HF transformers training step with the engine and traces the same step",
            "with `memsim_widget.trace` (the real model under `FakeTensorMode` on the cpu device, two full steps:",
            "forward + loss, backward, optimizer step, `zero_grad(set_to_none=True)`, outputs dropped before",
            "backward as HF Trainer does). Compared: the steady-state (step 2) peak of live tensor bytes,",
            "`peak_tensor_bytes`. Small model shapes (h=256, I=688, 8 heads, 4 kv heads, 4 layers, V=1000 unless",
            "noted) keep the suite fast; every formula is in T, h, I, V, so the shapes separate the terms.",
            "Rows marked *outputs kept* trace the hand-written loop instead (`output_lifetime`: the logits and KV",
            "cache stay alive until backward ends, or through the optimizer step).",
            "",
            f"Reproduce: `python benchmarks/fidelity_trace.py --write docs/fidelity.md` (torch {torch.__version__},",
            f"transformers {transformers.__version__}, Python {platform.python_version()}).",
            "",
            "| scenario | engine bytes | trace bytes | error | engine moment | trace phase (op) |",
            "|---|---:|---:|---:|---|---|",
        ]
        lines += [
            f"| {r['name']} | {r['engine']:,} | {r['trace']:,} | {r['error']:+.2%} | {r['engine_moment']} | "
            f"{r['trace_phase']} ({r['trace_op']}) |"
            for r in rows
        ]
        lines += [
            "",
            f"**Median absolute error {statistics.median(errs):.2%}; worst {max(errs):.2%}** over {len(rows)} scenarios.",
            "",
            "## How the tracker itself is checked (tests/trace/test_trace.py)",
            "",
            "- A hand-counted toy (two Linear layers, fp32, SGD and AdamW): peak and end-of-forward bytes exact.",
            "- Fake vs real execution on the CPU with the same tracker: identical peak, step-1 peak, end-of-forward",
            "  bytes and peak phase/op on 25 configurations (Llama in five precisions, SDPA/eager, checkpointing,",
            "  LoRA, five optimizer variants; Mistral, Qwen2, Mixtral, GPT-2, BERT, ViT, T5).",
            "- Against PyTorch's own `torch.distributed._tools.mem_tracker.MemTracker` on a small Llama: the same",
            "  overall peak to the byte (it files the foreach temporary under optimizer state; we call it temporary).",
            "",
            "## What the trace cannot see (modelled from other sources)",
            "",
            "- Kernel scratch allocated inside CUDA kernels (the flash-attention backward's fp32 dq accumulator,",
            "  cuBLAS workspaces): in `peak_allocated_bytes`, not in `peak_tensor_bytes`.",
            "- Allocator rounding (512 B) and fragmentation, CUDA context, NCCL: the allocated, reserved and",
            "  device counters, checked against published GPU measurements, not against traces.",
            "- QLoRA: bitsandbytes' 4-bit kernels need CUDA, so NF4 storage follows Dettmers et al. 2023 and is",
            "  not traced.",
            "- GPT-2 with attention dropout: on CPU, SDPA falls back to the math kernel and keeps s^2 tensors;",
            "  CUDA's flash kernel applies dropout inside the kernel. The cases above set dropout to 0.",
            "- Mixtral in fp32: transformers' grouped-mm experts need bf16 on CPU, so that case is not traced.",
            "",
            "## Known gap",
            "",
            "- Autocast LoRA on every Linear with full checkpointing (`amp-bf16`, `all-linear`, `ckpt full`, the Llama",
            "  shapes above, b2 s512): the engine is about 10% under the trace (38.4 vs 42.7 MB). At that peak the",
            "  recomputed layer holds 16-bit weight and input copies that the layer-backward moment does not all",
            "  count; without checkpointing, and with adapters on q and v only, the cases above agree.",
            "- Autocast full training with full checkpointing: autocast's cache holds the 16-bit copy of every trained",
            "  Linear weight until the forward and loss end (traced: +5.8 MB at the loss on the Llama shapes, b2 s512);",
            "  the engine counts that cache under `selective-op` only, so `full` under-counts the end of forward (the",
            "  peak is later in the step in the cases above).",
            "",
            "## What each checkpointing policy keeps (`activation_checkpointing`)",
            "",
            "- `none`: every tensor each layer saves for backward (the terms above).",
            "- `selective`: Megatron's selective recompute (Korthikanti et al. 2022): the attention core (scores,",
            "  softmax, dropout) is recomputed, the rest kept; HF models have no such mode, so it is not traced.",
            "- `full`: each layer keeps only its input; backward recomputes one layer at a time. `checkpoint_every` N",
            '  does this for layers N, 2N, ... (torchtitan\'s `selective_ac_option="N"`), the others keep everything.',
            "- `selective-op`: torchtitan's per-op policy (`_save_list` and `_apply_ac_to_transformer_block`): each",
            "  layer keeps its input and the outputs of its 1st, 3rd, 5th... `aten.mm` (on an HF Llama layer: q_proj,",
            "  v_proj, gate_proj and down_proj; Linears with a bias run `addmm` and are neither kept nor counted), of",
            "  SDPA (output and logsumexp) and of reduce-scatter; recomputing a layer then adds what the layer saves",
            "  less what the cache already holds (v, gate_proj's output, the SDPA outputs). Traced by wrapping each",
            "  decoder layer in `torch.utils.checkpoint.checkpoint(..., use_reentrant=False, context_fn=...)` with the",
            "  same policy (`memsim_widget/trace/checkpointing.py`).",
        ]
        with open(args.write, "w") as fh:
            fh.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
