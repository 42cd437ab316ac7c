"""Engine vs a trace of one rank of a multi-GPU job (FSDP2, replicate, DTensor TP, 2-D, pipeline stages).

Run: python benchmarks/fidelity_parallel.py [--only SUBSTRING] [--write docs/fidelity-parallel.md]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

# the engine-vs-trace case matrices are test data (tests/data), not in the wheel
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "data"))
from fidelity_parallel_cases import CASES, compare  # noqa: E402


def _table(rows: list[dict[str, Any]]) -> list[str]:
    """The markdown table of the compared cases."""
    lines = [
        "| scenario | GPUs | traced rank | engine bytes | trace bytes | error | engine moment | trace phase (op) |",
        "|---|---:|---:|---:|---:|---:|---|---|",
    ]
    lines += [
        f"| {r['name']} | {r['world']} | {r['rank']} | {r['engine']:,} | {r['trace']:,} | {r['error']:+.2%} | "
        f"{r['engine_moment']} | {r['trace_phase']} ({r['trace_op']}) |"
        for r in rows
    ]
    return lines


def _document(rows: list[dict[str, Any]], failed: list[tuple[str, str]]) -> str:
    """docs/fidelity-parallel.md: how the cases were traced, the table, the summary and what failed."""
    import platform

    import torch
    import transformers

    errs = [abs(r["error"]) for r in rows]
    head = [
        "# Fidelity of multi-GPU layouts: engine vs a trace of one rank",
        "",
        "Each row simulates one rank of an N-GPU training step with the engine and traces the same rank in one",
        "CPU process: a fake process group, a CPU device mesh, `FakeTensorMode`, and PyTorch's own FSDP2",
        "(`fully_shard`), FSDP2-based `replicate` for DDP, DTensor tensor-parallel plans (sequence and loss",
        "parallel) and `torch.distributed.pipelining` schedules (see `memsim_widget/trace/`). Compared: the",
        "steady-state (step 2) peak of live tensor bytes on that rank. Shapes as in [fidelity.md](fidelity.md).",
        "",
        f"Reproduce: `python benchmarks/fidelity_parallel.py --write docs/fidelity-parallel.md` (torch "
        f"{torch.__version__}, transformers {transformers.__version__}, Python {platform.python_version()}).",
        "",
    ]
    summary = [
        "",
        f"**Median absolute error {statistics.median(errs):.2%}; worst {max(errs):.2%}** over {len(rows)} "
        "multi-GPU scenarios."
        if rows
        else "No case ran.",
    ]
    if failed:
        summary += ["", "Cases that did not trace:", ""] + [f"- {n}: {e}" for n, e in failed]
    return "\n".join(head + _table(rows) + summary + LEARNED + KNOWN_GAPS + UNTRACED) + "\n"


#: What the traces showed the engine (each rule lives in the engine module named).
LEARNED = [
    "",
    "## What the traces taught the engine",
    "",
    "- **transformers' tp plan** (`base_model_tp_plan`, framework hf/torchtune/deepspeed): the untied embedding "
    "is not in the plan and stays replicated; the LM head is `colwise_gather_output`, so every rank holds the "
    "full-vocabulary logits, their fp32 upcast, the log-softmax and the loss backward's two T x V buffers "
    "(`engine/frameworks.vocab_split`, `embedding_split`). Before: -12% (tp2) to -59% (tp8 sp).",
    "- **torchtitan's plan with loss parallel**: the embedding is vocab-sharded and the loss works on V/tp; "
    "torch's loss-parallel kernels (`tensor/parallel/loss.py`) run inside DTensor's dispatch, where the "
    "tracer's dispatch mode is off: it saw each op's output only, until `trace/tp_plan.local_loss_kernels_seen` "
    "pushed it back. Seen, `_log_softmax` holds `x - x_max` beside the upcast and the saved result, and the fused "
    "nll + log-softmax backward holds `zeros_like`, `exp` and their sum beside the saved log-softmax: four fp32 "
    "T x V/tp, the step's peak at Llama 3.1 70B's widths (`activations/loss.loss_parallel_terms`; before, "
    "engine and trace agreed on one buffer: -31.7% at the 70B-width row, torchtitan's Table 4 70B row -16.7% -> "
    "+5.1%, held out). The loss runs "
    "outside the model, after FSDP2's root post-forward has resharded the root unit and freed the last "
    "all-gather (`reshard_after_forward=True`), so neither is alive while the loss runs "
    "(`engine/frameworks.root_resharded_for_loss`).",
    "- **Sequence parallel under DTensor** is not Megatron's: `PrepareModuleInput` all-gathers a block's input "
    "to the full sequence and the attention and MLP Linears save that gathered tensor (T x h, not T/tp x h); "
    "the block's backward starts by all-gathering its output gradient (the collective's output, its wait and "
    "the cat: 3 x T x h). Norms, the residual stream and checkpointed inputs stay at T/tp. The Megatron "
    "profile keeps Korthikanti et al.'s model (fused kernels that save the sharded input and re-gather).",
    "- **Pipeline stages** (`engine/parallel/pipeline.py`): receive buffers per micro-batch and direction, pending "
    "input-gradient sends, stage outputs (logits on the last stage) kept until their backward, GPipe's last "
    "stage holding every micro-batch's loss, gradients carried only where fewer micro-batches are in flight "
    "than there are; under GPipe the second micro-batch's backward (`backward_next`), which meets every "
    "gradient the first made beside the other micro-batches' activations, outputs and loss tensors (torch 2.13 "
    "`ScheduleGPipe._step_microbatches`: every forward and loss, then the backwards in order).",
    "- **Real vocabularies** (the `V32k`-`V256k` rows: each model's own hidden size and vocabulary, 2 layers): "
    "the project's small shapes (V = 1,000) hide the embedding, head and loss. Three rules came from them. "
    "(1) FSDP2's root unit (embeddings, final norm, head) is reduce-scattered last: `foreach_reduce` allocates "
    "the reduce input (root numel x reduce_dtype) while the unsharded gradients (param_dtype) are alive, after "
    "the root's parameters were resharded (`engine/states/gathered._root_reduce`, moment `root_reduce_scatter`; "
    "torch 2.13 `_fsdp_param_group.post_backward`, `_fsdp_collectives.foreach_reduce`). Before: -12.6% (V128k "
    "torchtitan dp4). (2) A foreach optimizer refuses a param group mixing DTensors and plain tensors, so "
    "under transformers' plan (untied embedding and norms left plain) the step runs two groups and its "
    "buffer is the larger group's (`engine/states/optimizer.step_temporaries`). Before: +10.7% (V152k tp2). "
    "(3) DTensor's `embedding_dense_backward` has no row-sharded strategy: a vocab-sharded embedding's "
    "gradient is `Partial` with a full V x h local tensor, kept as `.grad` until `zero_grad` when no FSDP "
    "redistributes it (`engine/states/gradients.partial_embedding_grad`; torch 2.13 "
    "`distributed/tensor/_ops/_embedding_ops.py`). Before: -6.6% (V128k torchtitan tp2). (4) With an explicit "
    "`reshard_after_forward=True` FSDP2 reshards the root after forward too (it keeps the root gathered "
    "only when the flag is left to its default: torch 2.13 `_fsdp_state._lazy_init`), so the root's "
    "pre-backward all-gather runs beside every saved activation, its all-gather output and the unsharded "
    "copy alive at once (moment `backward_regather`, `engine/states/gathered._root_regather`). Before: "
    "-10.8% (V256k bf16 dp4).",
    "- **torchtitan computes the loss outside the model** (`pred = model(inputs); loss = loss_fn(pred, labels)`, "
    "torchtitan `train.py`), with or without TP: under FSDP2 the root's post-forward reshards the root unit "
    "and frees the last all-gather output before the loss runs (`FrameworkProfile.loss_outside_model`, "
    "`engine/frameworks.root_resharded_for_loss`); the tracer now runs torchtitan's loss that way. Before: "
    "+3.5% (small torchtitan FSDP2 rows).",
    "- **torchtitan with TP and no FSDP computes in fp32**: its `maybe_enable_amp` runs neither FSDP2's "
    '`MixedPrecisionPolicy` nor `torch.autocast` when TP is on without FSDP ("Mixed precision training with '
    'TP or PP is only supported when FSDP/HSDP/CP is enabled", torchtitan `distributed/utils.py`), so an '
    "`amp-*` recipe's activations and logits are fp32 (`engine/frameworks.no_mixed_precision`, "
    "`effective_recipe`). Before: -3.4% (V128k torchtitan tp2 b2 s4096).",
    "- **The plan is a key of its own** (`parallel.tp_plan`: hf | torchtitan | megatron, `parallel.loss_parallel`; "
    "unset, the framework's): an HF model under a torchtitan-shaped DTensor plan (accelerate, a custom loop) "
    "and torchtitan without loss parallel (its plan then gathers the logits: `output_layouts=Replicate()`) are "
    "traced (the hybrid rows). Loss parallel under the hf plan (which gathers the logits) and Megatron without "
    "its vocab-parallel cross-entropy are refused (`engine/frameworks.check_tp_plan`). Under FSDP2 with a "
    "vocab-sharded DTensor embedding the bottom of backward holds the root's unsharded gradients with the "
    "embedding's `Partial` full-vocabulary one beside its `Shard(0)` redistribution (moment `root_grads_made`, "
    "`engine/states/gathered._root_grads_made`). Before: -15.2% (V152k hf dp2 x tp2 torchtitan plan).",
    "- **Pipeline schedules keep outputs** (the `return_outputs` rows): PyTorch's default "
    "`schedule.step(return_outputs=True)` appends every micro-batch's last-stage output to "
    "`PipelineStage.output_chunks`, which only `clear_runtime_states` at the next step empties, and returns "
    "their concatenation, which a loop that keeps its output holds through the optimizer step (torch 2.13 "
    "`pipelining/stage.py` `forward_one_chunk`, `schedules.py` `_merge_outputs`). The engine holds all m "
    "outputs on the last stage through backward and 2m at the step when `output_lifetime` is `step` "
    "(`engine/parallel/pipeline.returns_outputs`); torchtitan's `return_outputs=False` (every other row) keeps one "
    "until its backward. Before: -5.9% (1F1B) and -4.8% (interleaved), V128k last stage.",
    "- **Pipelines over FSDP2** (the `pp2 x dp2 fsdp` rows: a 4-layer Mistral-7B-shaped model, V32k, 1,024 "
    "tokens, 4 micro-batches). torch 2.13 `pipelining/stage.py` `backward_maybe_with_nosync` turns FSDP2's "
    "gradient sync and reshard after backward off before every micro-batch's backward, the last included, "
    "and `perform_reduce_grad` reduce-scatters once after the schedule (the root first, then each layer). "
    "The engine holds the stage's unsharded gradients accumulated over the micro-batches at every backward "
    "moment (the optimizer steps the shards), the layers gathered after their backward until the next "
    "forward (all of them at the bottom, and through GPipe's later backwards), the root's all-gather after "
    "the last layer's and the next one's prefetch on a stage that does not end in the head, and the final "
    "reduce-scatter (`engine/states/gathered.pipeline_fsdp2`). Before: 1F1B -6.53% (stage 0) and -5.74% "
    "(last). Three more rules (`gathered._pipeline_new_grads`): (1) a backward after the first of the step "
    "makes each new gradient apart before `AccumulateGrad` adds it to the unsharded one in place, so the "
    "largest layer parameter's new gradient is a transient beside the accumulation (moment group "
    "`new_grad` at a carried backward's top; under GPipe's later backwards the larger of it and the "
    "loss's backward, which come one after the other, not both). Before: GPipe +2.24% (stage 0) and "
    "+4.19% (last), which summed the largest parameter's new gradient (the 268 MB embedding or head) with "
    "the loss's backward; 1F1B without `reshard_after_forward` -1.59% (stage 0). (2) On an interleaved rank "
    "a chunk's layers stay gathered from its backward until its next forward, so when another chunk's layer "
    "is all-gathered (its forward, or the top of its backward) they are still there, with every saved "
    "activation alive: `ScheduleInterleaved1F1B` runs B(stage 0, mb 0) right before F(stage 2, mb 3) on "
    "rank 0 and B(3, 1) before F(1, 2) and B(1, 0) on rank 1 (moment `chunk_regather`). Before: -3.01% "
    "(stage 0) and -2.99% (last). (3) The pipeline tracer now passes `reshard_after_forward` to FSDP2 (the "
    "`no reshard after forward` rows). The new-gradient transient holds without FSDP too: a plain "
    "pipeline stage's later micro-batches make each new gradient beside the `.grad` an earlier one left "
    "(`states/gradients.new_gradient`, moment group `new_grad`). Before: -1.77% on the middle stage of a "
    "1F1B [2, 2, 2] split (now +0.81%), -0.50% and -0.22% on interleaved first stages (now -0.08% and "
    "+0.45%); the small Llama's 1F1B first stages went from +0.80% and +0.83% to +1.34% and +1.39% (their "
    "layer-backward transient, counted whole beside it, is not all alive at that first op).",
]

#: Known gaps at real vocabularies (the rows above that miss), and why.
KNOWN_GAPS = [
    "",
    "## Known gaps",
    "",
    "- **Pipelines over FSDP2, untraced layouts**: GPipe and interleaved 1F1B without "
    "`reshard_after_forward`, interleaved over more than 2 virtual stages (the other chunks kept gathered "
    "from their backward are counted as every layer of the rank but one chunk's, an upper bound there) and "
    "DeepSpeed ZeRO-3 under a pipeline (formula) carry a caveat (`engine/caveats.pipeline_under_caveat`). "
    "The new-gradient transient (`states/gradients.new_gradient`) is counted for pipelines (with FSDP2 or "
    "no data parallelism) and, for the head's and the embeddings' gradients, for gradient accumulation on "
    'one GPU (traced: docs/fidelity.md, "Gradients '
    'at the head and the embeddings"), not under DDP, where `AccumulateGrad` adds in place alike (untraced '
    "there: the Reducer fails on fake tensors). GPipe's last stage without FSDP, once under "
    "by 7.2% ([2, 2]) and 5.8% ([3, 1]), is modelled and in the table (the `backward_next` rows).",
    "- **torchtitan pipelines without FSDP** (`precision: amp-bf16`, pp > 1, no FSDP, no TP): torchtitan's "
    "`maybe_enable_amp` disables mixed precision there too, but the pipeline tracer autocasts, so the engine "
    "keeps bf16 activations for that case (`no_mixed_precision` covers TP only). Not traced as torchtitan runs it.",
    "- **dp x tp with FSDP2 at a real vocabulary** (V128k torchtitan dp2 x tp2): the trace allocates the root's "
    "reduce-scatter output while one V/tp x h unsharded gradient of the root is still referenced; which "
    "object holds it was not found in the source, so the engine counts it as traced (the largest root "
    "tensor's unsharded gradient, dp x tp only: `engine/states/gathered._root_reduce`). Before: -8.2%.",
    "- **torchtitan on one GPU or DDP** (`precision: amp-bf16`, no FSDP, no TP/PP): `maybe_enable_amp` runs "
    "`torch.autocast` there; the engine assumes FSDP's bf16 casting (no autocast weight copies). Not traced.",
    "- **Interleaved 1F1B with micro-batches that pp does not divide** (V128k pp2 x v2, 3 micro-batches, "
    "the last stage): `ScheduleInterleaved1F1B` runs them (one round of 3), so the engine no longer "
    "refuses them nor fewer micro-batches than pp (the `m1` and `m6` rows: -1.0% to -1.7%, as the even "
    "`m4` row of the small Llama). The schedule's order on that rank (1F0 1F1 1F2 3F0 3B0 3F1 3B1 3F2 3B2 "
    "1B0 1B1 1B2) runs every backward of its first chunk after the last loss, so at a loss only the loss "
    "chunk's gradients exist: with one round (m < 2 pp) the engine carries only those into the loss "
    "moments (`engine/context.interleaved_loss_grad_chunks`, torch 2.13 `pipelining/schedules.py` "
    "`ScheduleInterleaved1F1B.backward_stage_index`). Before: +4.15% (436 MB, one layer's gradients).",
    "- **Uneven pipeline splits** (`parallel.pp_layers`, or `parallel.pp_split` and, where pp x virtual "
    "stages do not divide the layers, torchtitan's split by default: [pipeline-split.md](pipeline-"
    "split.md)): traced for one model chunk per rank (the `uneven` rows) and with chunks of different "
    "sizes on an interleaved rank (the `auto split` rows). There the engine holds a rank's chunks in the "
    "schedule's order of forwards and backwards; on the last rank the loss runs only at the steps that "
    "run its last chunk, so the loss moments hold the largest of those steps' holdings, not the largest "
    "one, which comes at a forward of its first chunk (`interleaved_held_layers(at_loss=True)`, moment "
    "group `saved_at_loss`). Before: +1.57%. The planner searches these splits where even ones do not "
    "exist.",
]

#: What this process cannot trace, and why (the trace refuses these with the same words).
UNTRACED = [
    "",
    "## Formula-only (not traced)",
    "",
    "- ZeRO-1 and ZeRO-2 (`parallel.zero` 1/2 with dp > 1): DeepSpeed's partitioned optimizer and gradient "
    "buckets are not PyTorch modules; the estimate follows DeepSpeed's own arithmetic ([memory facts](memory-facts.md#sharding-zero-and-fsdp), "
    "`reduce_bucket_size` 5e8 elements) and says formula-only.",
    "- DeepSpeed ZeRO-3 (framework deepspeed): its stage-3 parameter coordinator is not FSDP2; formula-only.",
    "- Offload (`parallel.offload`): FSDP2's `CPUOffloadPolicy` keeps host copies on the same cpu device as the "
    "fake GPU here, so resident and offloaded bytes cannot be told apart.",
    "- Context parallel (`parallel.cp`): torch's `context_parallel` shards only CUDA's SDPA kernels; on a CPU "
    "mesh `_scaled_dot_product_flash_attention_for_cpu` has no sharding strategy.",
    "- Expert parallel (`parallel.ep`): PyTorch has no expert-parallel API for transformers' MoE layers; the "
    "estimate holds each rank to 1/ep of the experts, over dp x cp (torchtitan) or folded over the TP group "
    "beyond it, where the experts stay whole (`ParallelConfig.expert_tp`: Megatron-Core's MoE parallel "
    "folding, transformers' expert parallelism on the TP group); formula-only.",
    "- Megatron's fused TP kernels (framework megatron with tp > 1) and MoE experts held as 3-D parameters "
    "(Mixtral's packed plan in transformers 5.24): not `nn.Linear`/`nn.Embedding`, which torch's "
    "Colwise/RowwiseParallel shard.",
]


def main(argv: list[str] | None = None) -> int:
    """Compare every case (or those whose name contains --only) and print or write the table."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", help="run the cases whose name contains this")
    ap.add_argument("--write", help="write the markdown document here")
    ap.add_argument("-v", action="store_true", help="print the traced roles at the peak")
    args = ap.parse_args(argv)
    cases = [c for c in CASES if not args.only or args.only in c[0]]
    rows, failed = [], []
    for name, data, stage in cases:
        try:
            r = compare(name, data, stage)
        except Exception as exc:  # noqa: BLE001 - a case that cannot trace is reported, not fatal
            failed.append((name, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"))
            print(f"{name:<48} FAILED {failed[-1][1]}", flush=True)
            continue
        rows.append(r)
        print(
            f"{name:<48} engine {r['engine']:>12,} trace {r['trace']:>12,} error {r['error']:+7.2%} "
            f"{r['seconds']:5.1f}s engine@{r['engine_moment']} trace@{r['trace_phase']}:{r['trace_op']}",
            flush=True,
        )
        if args.v:
            print("   ", r["role"], r["by_role"])
    if rows:
        errs = [abs(r["error"]) for r in rows]
        print(f"median |error| {statistics.median(errs):.2%}, worst {max(errs):.2%} over {len(rows)} cases")
    if args.write:
        with open(args.write, "w") as fh:
            fh.write(_document(rows, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
