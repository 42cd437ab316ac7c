"""What an estimate does not model, in words: the caveats shown beside the verdict and beside the step time
(never a silent exact-looking number; docs/accuracy.md, docs/fidelity.md and docs/speed.md say more)."""

from __future__ import annotations

from memsim_widget.architecture import Architecture
from memsim_widget.catalog.gpus import GPU
from memsim_widget.engine.activations.calibrated import caveat
from memsim_widget.engine.activations.compiled import compiled_rule_applies
from memsim_widget.engine.activations.liger import liger_applies, liger_layers_apply
from memsim_widget.engine.activations.litgpt import litgpt_rule_applies
from memsim_widget.engine.context import Context
from memsim_widget.engine.frameworks import PROFILES
from memsim_widget.engine.rl.objectives import training_scenario
from memsim_widget.engine.rl.rollout import engine_items
from memsim_widget.engine.speed.gpu_speed import SPEED_ASSUMED_FROM, speed_known
from memsim_widget.engine.speed.step_time import DEQUANT_BYTES, OVERLAPPING_FRAMEWORKS, PCIE_EFFICIENCY
from memsim_widget.scenario import Scenario


def _compiled_math_sdpa_note(scenario: Scenario, arch: Architecture) -> str:
    """The compiled encoders whose SDPA runs CUDA's math kernel under transformers before 5.24 (its stride-0
    mask under compile, traced on fake CUDA tensors: ``compiled_layernorm.CUDA_MATH_SDPA``), with what it adds:
    the fp32 probabilities each layer saves, 4 B x b x heads x s x s. Empty where it does not apply."""
    from memsim_widget.engine.activations.compiled_layernorm import CUDA_MATH_SDPA, attention_softmax_term
    from memsim_widget.engine.activations.dims import Dims

    if (arch.family, scenario.precision) not in CUDA_MATH_SDPA:
        return ""
    ctx = Context(scenario)
    D, layers = Dims(ctx), arch.num_layers
    extra = attention_softmax_term(ctx, D.a, math_sdpa=True).bytes * layers
    return (
        f"; with transformers before 5.24 a compiled {arch.family} sends CUDA's SDPA to its math kernel (a "
        f"stride-0 mask built under compile): about {extra / 2**30:.2f} GiB more allocated, the fp32 attention "
        f"probabilities each layer saves (4 B x b x heads x s x s x layers = 4 x {D.b} x {D.a} x {D.s} x "
        f"{D.s_full} x {layers}; the H200's ViT-B run on transformers 5.17: +15% over eager, docs/fidelity.md)"
    )


def pipeline_under_caveat(scenario: Scenario) -> str:
    """The pipeline-over-FSDP layouts not checked against a trace (the fidelity suite's held-out fake-tensor
    traces: a 4-layer Mistral-7B-shaped model at a 32k vocabulary, 1,024 tokens, pp 2 x dp 2, 4 micro-batches,
    within 1.3% at every stage: 1F1B with and without ``reshard_after_forward``, GPipe and interleaved 1F1B
    over 2 virtual stages with it; ``engine/states/gathered.pipeline_fsdp2`` and ``_pipeline_new_grads``,
    torch 2.13 ``pipelining/stage.py`` ``backward_maybe_with_nosync``). Untraced: GPipe or interleaved
    without reshard after forward, and interleaved over more than 2 virtual stages (the chunks kept gathered
    from their backward are an upper bound there). Empty where it does not apply."""
    p = scenario.parallel
    if p.pp <= 1 or not (p.zero == 3 and p.dp * p.cp > 1):
        return ""
    if p.pp_schedule == "1f1b" or (p.reshard_after_forward and p.virtual_stages <= 2):
        return ""
    return (
        "pipeline over FSDP: traced for 1F1B, GPipe and interleaved over 2 virtual stages with "
        "reshard_after_forward (unsharded gradients accumulated over the micro-batches, layers kept gathered "
        "after backward: torch 2.13 pipelining/stage.py); this schedule"
        + (" without reshard_after_forward" if not p.reshard_after_forward else f" over {p.virtual_stages} "
           "virtual stages") + " is untraced (docs/fidelity-parallel.md, Known gaps): plan on some headroom"
    )  # fmt: skip


def tp_ddp_caveat(scenario: Scenario) -> str:
    """TP beside plain data parallelism (tp > 1, dp > 1, no ZeRO) under a framework that wraps with torch DDP (HF
    Trainer / accelerate): the figures count DDP's buckets of the rank's TP shards, as torch 2.13's DDP over a
    device mesh would hold them (``tensor/parallel/ddp.py``), but transformers 5.24 shards the data-parallel
    dimension beside TP with FSDP2 (``distributed/fsdp.py``) and accelerate 1.16 skips the DDP wrap under TP
    (docs/allocator.md, Tensor parallel ranks). Empty elsewhere."""
    p = scenario.parallel
    if not (p.tp > 1 and p.dp > 1 and p.zero == 0 and PROFILES[scenario.framework].ddp_buckets):
        return ""
    return (
        f"tp {p.tp} x dp {p.dp} without ZeRO under {scenario.framework}: transformers 5.24 and accelerate 1.16 do "
        "not wrap a tensor-parallel model in DDP (they shard data parallelism beside TP with FSDP2: parallel.zero "
        "3); these figures count DDP's gradient buckets of this rank's TP shards, as torch's DDP over a device mesh "
        "would hold them, untraced, with the fitted reserved rule (docs/allocator.md)"
    )


def hybrid_caveat(scenario: Scenario) -> str:
    """Hybrid sharding (``parallel.dp_shard``) where the figures miss a buffer: FSDP2's HSDP all-reduce output of a
    later micro-batch, held by ``FSDPParamGroup._all_reduce_state`` until that backward ends when every
    micro-batch reduces (torch 2.13 ``_fsdp_param_group.py``; seen in a CPU trace of a 2 x 4 mesh under
    torchtitan's accumulation), and DeepSpeed's MiCS, whose buffers are not DeepSpeed ZeRO-3's. Empty elsewhere."""
    p, prof = scenario.parallel, PROFILES[scenario.framework]
    if p.zero == 0 or p.dp_replicate == 1:
        return ""
    if (
        p.zero == 3
        and prof.zero3 == "fsdp2"
        and scenario.grad_accum_steps > 1
        and prof.fsdp2_accumulation != "no_sync"
    ):
        return (
            "HSDP with gradient accumulation: after the first micro-batch FSDP2 keeps each unit's all-reduce "
            "output (its new gradient shard, before it is added) until that backward ends, up to one more "
            "sharded gradient late in backward: not counted (a CPU trace of a 2 x 4 mesh peaked before it)"
        )
    if p.zero == 3 and prof.zero3 == "deepspeed":
        return (
            f"dp_shard {p.dp_shard} under DeepSpeed ZeRO-3 reads as MiCS (mics_shard_size): the states shard "
            "over the sub-group, its hierarchical all-gather buffers are not modelled (the fitted rule)"
        )
    return ""


def _loss_apart_note(scenario: Scenario) -> str:
    """Under a loop that computes the loss outside the model (torchtitan), what the compiled step's loss is:
    compiled apart (traced alone), eager by ``compile_loss`` false, or eager under loss parallel."""
    from memsim_widget.engine.frameworks import PROFILES

    if not PROFILES[scenario.framework].loss_outside_model:
        return ""
    blocks = (
        "; Verify traces each block compiled apart as torchtitan does, whose saved tensors are a few percent under "
        "the eager ones counted here (the small Llama: +3.3% over the trace)"
        if PROFILES[scenario.framework].compiles_blocks
        else ""
    )
    return blocks + _loss_kind(scenario)


def _loss_kind(scenario: Scenario) -> str:
    """The loop's loss under compile: compiled apart, eager under loss parallel, or eager (``compile_loss``)."""
    from memsim_widget.engine.frameworks import loss_compiled_apart, loss_parallel

    if loss_compiled_apart(scenario):
        return (
            "; the loop's loss is compiled apart: traced alone (trace/compiled.trace_compiled_loss), its saved "
            "logits and one fp32 T x V buffer in its backward, which Inductor's joint-graph pass removes on the "
            "GPU (the reserved replay follows Inductor)"
        )
    if loss_parallel(scenario) and scenario.compile_loss is not False:
        return (
            "; the loop's loss under loss parallel keeps eager's kernels' buffers (DTensor's cross-entropy "
            "compiled is untraced: likely fewer)"
        )
    return "; the loop's loss runs eager (compile_loss false)"


def memory_caveats(scenario: Scenario, arch: Architecture) -> tuple[str, ...]:
    """What the memory figures do not model for this scenario (``Estimate.caveats``)."""
    out = []
    hybrid_miss = hybrid_caveat(scenario)
    if hybrid_miss:
        out.append(hybrid_miss)
    if arch.facts.calibration is not None:
        out.append(caveat(arch, scenario))
    tp_ddp = tp_ddp_caveat(scenario)
    if tp_ddp:
        out.append(tp_ddp)
    pipeline_miss = pipeline_under_caveat(scenario)
    if pipeline_miss:
        out.append(pipeline_miss)
    if scenario.compile and compiled_rule_applies(scenario, arch):
        out.append(
            "compile: Inductor's partitioner's saved tensors for this model, traced (docs/fidelity.md); the "
            "layers' backward transients are eager's"
            + ("; traced on one GPU: data parallel (DDP's graph split at gradient buckets, FSDP's gathers) is "
               "untraced"
               if scenario.parallel.dp > 1 else "")
            + ("; traced on one GPU: each pipeline stage compiling its own layers is untraced"
               if scenario.parallel.pp > 1 else "")
            + ("; attention dropout runs inside CUDA's fused SDPA kernel (its Philox seed and offset saved, no "
               "mask), untraced: on a CPU SDPA falls back to the math kernel, so the traces ran without it"
               if arch.attention_dropout > 0 else "")
        )  # fmt: skip
    elif scenario.compile:
        out.append(
            "compile: untraced for this scenario, a formula (docs/fidelity.md): the layers keep eager's saved "
            "tensors (no compiled trace saved more: 0-48% less on decoders) "
            "and a causal LM's loss is the compiled loss traced on Llama-layout decoders; the trace (memsim trace, "
            "Verify) runs the compiled step with Inductor's partitioner"
            + _compiled_math_sdpa_note(scenario, arch)
            + _loss_apart_note(scenario)
        )
    budget = scenario.activation_memory_budget
    if budget is not None and budget < 1:
        out.append(
            f"activation_memory_budget {budget:g}: untraced in the engine, the figures are torch's default budget's "
            "(1), an upper bound on the compiled traces at 0.5, 0.2 and 0 (24-67% over; not monotonic: at 0 the "
            "backward recomputes the whole forward); memsim trace runs the budget"
        )
    n_off = scenario.activation_offloading_layers
    if scenario.activation_offloading and n_off is not None and 0 < n_off < arch.num_layers:
        out.append(
            f"activation_offloading_layers {n_off}: the first {n_off} of {arch.num_layers} layers offloaded as "
            "TransformerEngine 2.9 schedules it (Megatron-Core cpu_offloading_num_layers; one offloaded layer "
            "brought back from the last layer's backward on, which TransformerEngine 2.10+ avoids), untraced: "
            "a formula from TransformerEngine's source (docs/memory-facts.md)"
        )
    if scenario.fp8 is not None:
        out.append(fp8_caveat(scenario))
    if scenario.framework == "litgpt":
        out.append(litgpt_caveat(scenario, arch))
    if scenario.framework == "liger":
        out.append(liger_caveat(scenario, arch))
    if scenario.framework == "unsloth":
        out.append(unsloth_caveat(scenario))
    if arch.facts.ssm is not None:
        if (scenario.ssm_kernel or "cuda") == "cuda":
            out.append(
                "ssm_kernel cuda (the default: mamba-ssm + causal-conv1d installed): the Mamba layers' "
                "activations are a formula from mamba-ssm's saved tensors, not traced; without those "
                "packages transformers runs its torch path (ssm_kernel: torch), which keeps every scan state"
            )
        else:
            out.append(
                "ssm_kernel torch: transformers' pure-PyTorch Mamba scan (no mamba-ssm), held to a CPU "
                "fake-tensor trace; it keeps every step's state (b x I x N per token)"
            )
        if arch.facts.hybrid is not None and arch.num_experts and scenario.precision.startswith("amp"):
            out.append(
                "Jamba's MoE layers under autocast are not traced (their grouped_mm experts do not autocast on a "
                "CPU): the HF MoE rule, traced on the dense-MLP Jamba and on the other MoE families"
            )
    obj = scenario.objective_name
    if obj == "ppo" and scenario.activation_checkpointing in ("full", "selective-op"):
        out.append(
            "objective ppo with checkpointing: TRL checkpoints the policy only; the value model's layers are "
            "taken as checkpointed too (not traced; docs/fidelity.md)"
        )
    if obj in ("grpo", "ppo") and scenario.rl_config.rollout != "none":
        out.append("rollout phase: formula-only, vLLM's documented arithmetic (engine/rl/rollout.py)")
        kv = engine_items(Context(training_scenario(scenario)), scenario)["kv"]
        if "refuses to start" in kv.formula:
            out.append("vLLM: gpu_memory_utilization leaves no memory for the KV cache; it would not start")
    out += vision_caveats(scenario, arch)
    return tuple(out)


def fp8_caveat(scenario: Scenario) -> str:
    """What the fp8 recipe's memory rule is (memsim_widget/fp8.py): torchao's traced, TransformerEngine's a formula."""
    fp8 = scenario.fp8
    assert fp8 is not None
    if fp8.traced:
        return (
            f"fp8_recipe {fp8.name}: torchao float8, traced on CPU fake tensors: the bf16 step's saved tensors "
            "(bf16 input and weight saved, recast in backward); the forward's cast transients and FSDP2's fp8 "
            "all-gather are not counted (docs/fidelity.md)"
        )
    return (
        f"fp8_recipe {fp8.name}: TransformerEngine's quantised weight copies are a formula (untraced: CUDA only); "
        "activations counted in bf16 (TE saves its Linear inputs quantised: an over-estimate)"
    )


def litgpt_caveat(scenario: Scenario, arch: Architecture) -> str:
    """What the litgpt profile covers: its traced rule (bf16, full or LoRA q/v) or HF's rules otherwise."""
    untied = " litgpt holds a separate lm_head for a model HF ties (convert_hf_checkpoint copies wte): not modelled."
    tied = untied if arch.tied_embeddings else ""
    if litgpt_rule_applies(scenario, arch):
        amp = (
            " Under amp-bf16 each chunk's cross-entropy runs as CUDA's autocast does: a 16-bit log-softmax and "
            "nll_loss's fp32 copy of it saved per chunk (traced within 0.2%)."
            if scenario.precision == "amp-bf16"
            else ""
        )
        return (
            "litgpt: its model, LoRA layers and chunked loss as traced (litgpt 0.5.13, docs/fidelity.md; under "
            "amp-bf16 the layers are HF's autocast rule, traced within 0.2%); litgpt builds LoRA adapters in the "
            "model's dtype (lora.adapter_dtype bf16 under bf16, fp32 under amp-bf16)." + amp + tied
        )
    return (
        "litgpt: HF's activation rules (litgpt's own are traced for bf16 and amp-bf16, full or LoRA on q_proj/v_proj, "
        "no checkpointing, no tp/cp; docs/fidelity.md)." + tied
    )


def liger_caveat(scenario: Scenario, arch: Architecture) -> str:
    """The Liger profile is a formula from Liger-Kernel's source, never traced (its kernels need Triton on a GPU)."""
    if not liger_applies(scenario, arch):
        return (
            "liger: no Liger rule for this configuration (Llama, Mistral, Qwen2/3 decoders, standard loss, no tp/cp, "
            "no compile); HF's rules"
        )
    layers = (
        "its RMSNorm and SwiGLU saved sets and fused linear cross-entropy"
        if liger_layers_apply(scenario)
        else "its fused linear cross-entropy only (layers keep HF's rules outside bf16 without checkpointing)"
    )
    return f"liger: {layers} are a formula from Liger-Kernel's source, untraced (Triton kernels need a GPU)"


def unsloth_caveat(scenario: Scenario) -> str:
    """Unsloth: only its offloaded gradient checkpointing has a rule (a formula), its kernels are HF's rules."""
    offloaded = scenario.activation_checkpointing == "full" and scenario.activation_offloading
    ckpt = (
        "its offloaded gradient checkpointing is full checkpointing with the layer inputs offloaded to the host "
        "(a formula from unsloth_zoo's Unsloth_Offloaded_Gradient_Checkpointer, untraced)"
        if offloaded
        else "its offloaded gradient checkpointing (use_gradient_checkpointing='unsloth') is "
        "activation_checkpointing full with activation_offloading true; this scenario does not set both"
    )
    return f"unsloth: {ckpt}; its fused kernels (cross-entropy, RMSNorm, SwiGLU, RoPE, LoRA MLP) are not modelled: HF's rules"


def vision_caveats(scenario: Scenario, arch: Architecture) -> list[str]:
    """A multimodal model's parts no trace has checked (docs/fidelity.md, "Multimodal")."""
    v = arch.facts.vision
    if v is None:
        return []
    s, out = scenario, []
    if (
        s.method != "full"
        and any(t in s.lora.targets for t in ("linear_1", "linear_2", "all-linear"))
        and v.projector
    ):
        out.append("LoRA adapters on the projector (linear_1/linear_2) are modelled but not traced")
    if v.caveat:  # Llama 4: one tile per image; transformers 5.24's forward (families/llama4_vlm.py)
        out.append(v.caveat)
    if v.image_note:  # Qwen2-VL, LLaVA-NeXT: the image size the token count assumes (the family's text)
        out.append(v.image_note)
    if v.resized_to_tower:  # LLaVA 1.5 (LLaVA-NeXT names its crops in image_note)
        out.append(
            f"every image is {v.patches.image_size}px ({v.tokens_per_image} tokens): LLaVA 1.5 pads "
            "or resizes to it; the vision tower's own backward transients are not modelled"
        )
    return out


def tp_exposed(scenario: Scenario) -> bool:
    """True when tensor-parallel communication is in the step (and counted as not overlapped)."""
    return scenario.parallel.tp > 1 and scenario.framework not in OVERLAPPING_FRAMEWORKS


#: Cards whose published runs held the step-time model (docs/speed.md, "Errors on rows no constant saw": the
#: llm-foundry and Megatron-LM rows of data/throughput/published.csv, A100 and H100 SXM). Time figures on any
#: other card, and for QLoRA or offloaded runs (no such row either), are labelled untraced.
TIME_HELD_GPUS = ("a100-40gb", "a100-80gb", "h100-sxm-80gb")


def untraced_time(scenario: Scenario, gpu: GPU | None) -> list[str]:
    """Why a step time (and its MFU, tokens/s) was not held to a published run: the card, QLoRA, offload."""
    from memsim_widget.engine.speed.gpu_speed import EFFICIENCY_BORROWED, gpu_speed

    out = []
    if gpu is not None and gpu.id not in TIME_HELD_GPUS:
        borrowed = EFFICIENCY_BORROWED.get(gpu.generation)
        out.append(
            f"untraced on {gpu.name}: no published run on this card held the step-time model"
            + (f" (matmul efficiency borrowed from {borrowed})" if borrowed else "")
        )
    if scenario.method == "qlora":
        out.append(
            f"untraced for QLoRA: NF4 dequantisation modelled as {DEQUANT_BYTES:g} B of HBM traffic per weight "
            "per pass; no QLoRA run held the step-time model"
        )
    if scenario.parallel.offload != "none":
        pcie = "" if gpu is None else f" at {gpu_speed(gpu).pcie_gb_s:g} GB/s x {PCIE_EFFICIENCY:g}"
        out.append(
            f"untraced for offload ({scenario.parallel.offload}): PCIe copies{pcie} and a host Adam step, "
            "added to the step (no overlap); no offloaded run held the step-time model"
        )
    return out


def time_caveats(scenario: Scenario, arch: Architecture, gpu: GPU | None = None) -> tuple[str, ...]:
    """What the step time does not model for this scenario (``Estimate.time_caveats``; docs/speed.md, "Where it
    misses"), and why it is untraced (``untraced_time``); ``gpu``: the resolved card, whose speeds may be
    unknown."""
    s, out = scenario, untraced_time(scenario, gpu)
    if gpu is not None and not speed_known(gpu):
        out.append(
            f"{gpu.name}: speeds unknown (a custom size, or a card registered without them); the step time, "
            f"MFU and cost use an {SPEED_ASSUMED_FROM} card's datasheet speeds"
        )
    if s.compile:
        out.append(
            "compile: only its fusion of elementwise ops is modelled, not the eager overheads it removes"
        )
    if s.fp8 is not None:
        out.append(
            f"fp8_recipe {s.fp8.name}: the layers' Linear matmuls at the card's {s.fp8.matmul_dtype} peak x the "
            "16-bit efficiency, attention and head in bf16; "
            + (
                "torchao's amax and cast traffic at HBM speed"
                if s.fp8.framework == "torchao"
                else "TransformerEngine's casts taken as fused into their neighbours"
            )
            + " (docs/speed.md, fp8)"
        )
    if s.activation_offloading:
        out.append("activation offloading: its PCIe copies are assumed hidden behind compute")
    if s.method != "full":
        out.append(
            "MFU counts what LoRA computes: 4N (no weight gradients for the frozen base) + the adapters"
        )
    if tp_exposed(scenario):
        out.append("tensor-parallel collectives are counted as exposed (no --tp-comm-overlap)")
    if "paged" in s.optimizer:
        out.append("paged optimizer states moved to and from the host are not modelled")
    if arch.facts.ssm is not None:
        out.append(
            "state-space scan (Mamba: 9 x I x N FLOPs per token and layer, mamba's own count; Mamba-2: the SSD "
            "chunk einsums) run at attention's efficiency; no scan kernel was timed (and the torch paths are far "
            "slower)"
        )
    if arch.facts.vision is not None:
        out.append(
            "the vision tower's and projector's compute is not in the step time (the language model's is)"
        )
    if s.objective_name != "sft":
        out.append(
            f"objective {s.objective_name}: the training step's time on its sequences only; generation, scoring "
            "and the reference's forward are not timed"
        )
    return tuple(out)
