"""The scenario's fields, declared once: key, type, what it means, allowed values, its CLI flag, its widget control.

``memsim_widget.scenario`` validates the values; this table says which fields exist and how they are offered. The
CLI's scenario flags (``cli.OVERRIDES``) and the widget's controls (``widget.controls.CONTROLS`` and the select
choices of its ``options``) are generated from ``SCHEMA``, so a field added here appears in both, and a test
(tests/test_scenario_schema.py) checks that every key the scenario accepts has exactly one entry.

The module imports nothing of the package, and its records are named tuples (``typing`` is loaded anyway; a frozen
dataclass would add ``dataclasses`` and ``inspect``, ~7 ms): the CLI reads it at start. Allowed values that live with their own
registry (precisions, optimizers, fp8 recipes, the scenario's name tuples) are named as ``"module:NAME"`` and
imported on use (``allowed``).
"""

from __future__ import annotations

import importlib
from typing import Any, NamedTuple

#: The widget's fieldsets, in the order the front end draws them.
FIELDSETS = ("Model", "Hardware", "Batch", "Training", "Method", "Objective", "Parallel")


class Control(NamedTuple):
    """How the widget draws a field: its label, the input kind and the fieldset it sits in.

    Kinds: ``model`` (preset name or "custom"), ``dim`` (a custom model dimension), ``gpu``, ``number`` (a
    float), ``headroom`` (a percent slider), ``log`` (a slider over ``stops``), ``int``, ``select`` (one of the
    field's choices), ``bool`` (a checkbox), ``targets`` (LoRA target checkboxes)."""

    label: str
    kind: str
    fieldset: str


class Field(NamedTuple):
    """One scenario key (dotted for the nested blocks: ``parallel.dp``), or one widget input that is part of a key's
    value or no scenario key at all (``scenario=False``: a custom model's dimensions, a custom GPU's memory, the
    headroom)."""

    key: str
    #: The type of one value, as the CLI parses it (``list`` and ``dict`` values have no flag).
    type: type
    doc: str
    #: The allowed values: a tuple, or ``"module:NAME"`` of the registry that holds them (``allowed``).
    choices: tuple[Any, ...] | str | None = None
    #: The key may stay unset (None): another key decides, or the value's absence is the default.
    optional: bool = False
    #: The CLI flag's name (``lora_rank`` is ``--lora-rank``), None where the CLI has no flag for it.
    cli: str | None = None
    widget: Control | None = None
    scenario: bool = True

    def allowed(self) -> tuple[Any, ...]:
        """The allowed values (a registry's keys, in its order), ``()`` for a field with no fixed set."""
        if self.choices is None:
            return ()
        if isinstance(self.choices, tuple):
            return self.choices
        module, _, name = self.choices.partition(":")
        return tuple(getattr(importlib.import_module(f"memsim_widget.{module}"), name))


def _w(label: str, kind: str, fieldset: str) -> Control:
    return Control(label, kind, fieldset)


_DIMS = (
    ("hidden_size", "hidden size", "width"),
    ("num_hidden_layers", "layers", "decoder layers"),
    ("num_attention_heads", "heads", "attention heads"),
    ("num_key_value_heads", "kv heads", "key/value heads (grouped-query attention)"),
    ("intermediate_size", "intermediate", "MLP inner width"),
    ("vocab_size", "vocab", "vocabulary size"),
)

#: Every field, in the order the CLI lists its flags; the widget draws its controls by fieldset (``FIELDSETS``),
#: in this order within each.
SCHEMA: tuple[Field, ...] = (
    Field("model", str, "a preset id, a config.json path, or an inline model config (a dict with model_type)",
          cli="model", widget=_w("model", "model", "Model")),
    *(Field(f"model.{k}", int, f"a custom (inline llama-style) model's {doc}", scenario=False,
            widget=_w(label, "dim", "Model")) for k, label, doc in _DIMS),
    Field("gpu", str, "a catalog GPU id (or a name as nvidia-smi prints it), or a custom {memory_gib: N}",
          cli="gpu", widget=_w("GPU", "gpu", "Hardware")),
    Field("gpu.memory_gib", float, "a custom GPU's memory in GiB", scenario=False,
          widget=_w("memory (GiB)", "number", "Hardware")),
    Field("headroom", float, "the share of GPU memory kept free, in [0, 1) (an estimate's setting, not a key)",
          scenario=False, widget=_w("headroom", "headroom", "Hardware")),
    Field("method", str, "which weights train: all, LoRA adapters, or LoRA on an NF4 base (QLoRA)",
          "scenario:METHODS", cli="method", widget=_w("method", "select", "Method")),
    Field("precision", str, "the dtypes of weights, gradients, optimizer states and compute (precision.py)",
          "precision:PRECISIONS", cli="precision", widget=_w("precision", "select", "Training")),
    Field("fp8_recipe", str, "the fp8/fp4 recipe of the Linear matmuls (fp8.py); unset: te-delayed under "
          "precision fp8, else none", "fp8:FP8_RECIPES", optional=True, cli="fp8_recipe",
          widget=_w("fp8 recipe", "select", "Training")),
    Field("fp8_all_gather", bool, "the weights are all-gathered in fp8: torchao float8 under FSDP2 (tensorwise) "
          "or Megatron FSDP's fp8_param_gather (te-current, te-delayed); ZeRO-3; unset: off", optional=True,
          cli="fp8_all_gather"),
    Field("optimizer", str, "the optimizer, whose states take memory (optimizers.py)", "optimizers:OPTIMIZERS",
          cli="optimizer", widget=_w("optimizer", "select", "Training")),
    Field("optimizer_impl", str, "torch's optimizer implementation (foreach keeps temporaries)",
          "optimizers:OPTIMIZER_IMPLS", cli="optimizer_impl", widget=_w("implementation", "select", "Training")),
    Field("optimizer_in_backward", bool, "each parameter is stepped as its gradient is ready, then the "
          "gradient freed", widget=_w("optimizer in backward", "bool", "Training")),
    Field("micro_batch_size", int, "sequences per micro-batch (GRPO: prompts)", cli="micro_batch_size",
          widget=_w("micro-batch", "log", "Batch")),
    Field("seq_len", int, "tokens per sequence", cli="seq_len", widget=_w("sequence length", "log", "Batch")),
    Field("grad_accum_steps", int, "micro-batches accumulated before each optimizer step",
          cli="grad_accum_steps", widget=_w("grad accumulation", "int", "Batch")),
    Field("activation_checkpointing", str, "what forward keeps for backward (scenario.CHECKPOINTING)",
          "scenario:CHECKPOINTING", cli="activation_checkpointing",
          widget=_w("checkpointing", "select", "Training")),
    Field("checkpoint_every", int, "with full checkpointing, checkpoint every N-th layer only (unset: 1)",
          optional=True, widget=_w("checkpoint every N layers", "int", "Training")),
    Field("attention", str, "the attention kernel: SDPA (flash/memory-efficient) or eager (keeps the scores)",
          "scenario:ATTENTIONS", cli="attention", widget=_w("attention", "select", "Training")),
    Field("loss", str, "the cross-entropy: standard, or chunked (fused head and loss in chunks)",
          "scenario:LOSSES", cli="loss", widget=_w("loss", "select", "Training")),
    Field("framework", str, "the training framework whose conventions apply (engine/frameworks.py)",
          "scenario:FRAMEWORKS", cli="framework", widget=_w("framework", "select", "Training")),
    Field("output_lifetime", str, "how long the loop holds the model output (scenario.OUTPUT_LIFETIMES); unset: "
          "the framework's own", "scenario:OUTPUT_LIFETIMES", optional=True, cli="output_lifetime",
          widget=_w("outputs kept", "select", "Training")),
    Field("zero_grad", str, "what zero_grad does to the gradients after the optimizer step: set_to_none frees "
          "them, zeros keeps them through the next step (PyTorch < 2.0); unset: set_to_none",
          "scenario:ZERO_GRADS", optional=True, cli="zero_grad"),
    Field("images_per_sample", int, "multimodal models: images per sample (unset: 1)", optional=True,
          cli="images_per_sample"),
    Field("freeze_vision", bool, "multimodal models under full training: the vision tower is frozen (unset: the "
          "model's recipe)", optional=True, cli="freeze_vision"),
    Field("ssm_kernel", str, "state-space layers: mamba-ssm's fused kernels or transformers' torch scan "
          "(unset: cuda)", "scenario:SSM_KERNELS", optional=True, cli="ssm_kernel"),
    Field("allocator_conf", str, "the run's PYTORCH_CUDA_ALLOC_CONF (engine/counters/allocator.py); unset: the "
          "framework's launcher default", optional=True, cli="allocator_conf"),
    Field("reserved_model", str, "how the reserved counter is computed: replay (the step's allocations replayed through "
          "the caching allocator) or fitted (a fitted waste share); unset: replay (fitted for padding longest and compile)",
          "scenario:RESERVED_MODELS", optional=True, cli="reserved_model",
          widget=_w("reserved counter", "select", "Hardware")),
    Field("compile", bool, "the step runs under torch.compile", cli="compile",
          widget=_w("torch.compile", "bool", "Training")),
    Field("activation_memory_budget", float, "compile only: Inductor's activation_memory_budget in [0, 1] "
          "(unset: torch's default, 1)", optional=True, cli="activation_memory_budget"),
    Field("compile_loss", bool, "compile only, a loop that computes the loss outside the model (torchtitan): the "
          "loss function compiled apart too (torchtitan's compile.components; unset: the framework's default)",
          optional=True, cli="compile_loss"),
    Field("activation_offloading", bool, "saved activations go to pinned host memory (torchtune: every layer)",
          cli="activation_offloading", widget=_w("activation offloading", "bool", "Training")),
    Field("activation_offloading_layers", int, "with activation offloading, offload the first N layers only "
          "(TransformerEngine / Megatron cpu_offloading_num_layers; 0 to the model's layers; unset: every layer)",
          optional=True, cli="activation_offloading_layers",
          widget=_w("offloaded layers", "int", "Training")),
    Field("padding", str, "how batches are shaped (scenario.PADDINGS)", "scenario:PADDINGS"),
    Field("cuda_lazy_loading", bool, "CUDA's lazy module loading (false: CUDA 11 or CUDA_MODULE_LOADING=EAGER, a "
          "larger context)"),
    Field("lora.rank", int, "the adapters' rank", cli="lora_rank", widget=_w("LoRA rank", "int", "Method")),
    Field("lora.alpha", float, "the adapters' scaling alpha", widget=_w("LoRA alpha", "number", "Method")),
    Field("lora.adapter_dtype", str, "the adapters' dtype", "scenario:ADAPTER_DTYPES",
          widget=_w("adapter dtype", "select", "Method")),
    Field("lora.targets", list, "the module names that get adapters, or all-linear",
          widget=_w("LoRA targets", "targets", "Method")),
    Field("lora.target_scope", str, "where target names are matched: the whole model or the language model "
          "only (scenario.LORA_SCOPES)", "scenario:LORA_SCOPES"),
    *(Field(f"parallel.{k}", int, doc, cli=k, widget=_w(k, "int", "Parallel")) for k, doc in (
        ("dp", "data-parallel degree"),
        ("tp", "tensor-parallel degree"),
        ("pp", "pipeline-parallel degree"),
        ("cp", "context-parallel degree"),
        ("ep", "expert-parallel degree"),
    )),
    Field("parallel.zero", int, "the ZeRO stage (3: FSDP full shard), sharded over dp x cp (dp_shard x cp under hybrid "
          "sharding)",
          "scenario:ZERO_STAGES", cli="zero", widget=_w("ZeRO stage", "select", "Parallel")),
    Field("parallel.dp_shard", int, "hybrid sharding (HSDP, HYBRID_SHARD, MiCS): ZeRO shards over groups of "
          "dp_shard data-parallel ranks, replicated dp / dp_shard times; must divide dp (unset: shard over all dp)",
          optional=True, cli="dp_shard"),
    Field("parallel.sequence_parallel", bool, "Megatron sequence parallelism over the tp group",
          widget=_w("sequence parallel", "bool", "Parallel")),
    Field("parallel.reshard_after_forward", bool, "FSDP2 reshards each unit after its forward (ZeRO-3 only)",
          cli="reshard_after_forward", widget=_w("reshard after forward", "bool", "Parallel")),
    Field("parallel.offload", str, "what ZeRO offloads to host memory", "scenario:OFFLOADS", cli="offload",
          widget=_w("offload", "select", "Parallel")),
    Field("parallel.pp_schedule", str, "the pipeline schedule", "scenario:PP_SCHEDULES",
          widget=_w("pp schedule", "select", "Parallel")),
    Field("parallel.pp_microbatches", int, "micro-batches in flight through the pipeline per step",
          widget=_w("pp micro-batches", "int", "Parallel")),
    Field("parallel.virtual_stages", int, "pipeline stages per rank (interleaved schedule)",
          widget=_w("virtual stages", "int", "Parallel")),
    Field("parallel.pp_split", str, "how layers that do not divide are split over the stages (unset: even where "
          "they divide, else torchtitan's)", "scenario:PP_SPLITS", optional=True, cli="pp_split"),
    Field("parallel.pp_layers", list, "layers per pipeline rank, first to last (unset: an even split)",
          optional=True),
    Field("parallel.tp_plan", str, "the tensor-parallel plan (unset: the framework's)", "scenario:TP_PLANS",
          optional=True),
    Field("parallel.loss_parallel", bool, "the cross-entropy on vocab-sharded logits (unset: the plan's)",
          optional=True),
    Field("parallel.overlap_comm", bool, "DeepSpeed ZeRO-1/2 overlap_comm: a second reduce bucket to fill while "
          "the first is reduced (unset: DeepSpeed's default, false)", optional=True),
    Field("parallel.reduce_bucket_size", int, "DeepSpeed ZeRO-1/2 reduce_bucket_size in elements, or \"auto\" "
          "(HF / accelerate: hidden_size x hidden_size; unset: DeepSpeed's default, 5e8)", optional=True),
    Field("objective", str, "what the step optimises: SFT, a preference loss or an online RL loss (unset: sft)",
          "scenario:OBJECTIVES", optional=True, cli="objective", widget=_w("objective", "select", "Objective")),
    Field("rl.num_generations", int, "GRPO: completions per prompt (G)", cli="num_generations",
          widget=_w("G (completions per prompt)", "int", "Objective")),
    Field("rl.completion_len", int, "the generated tokens of each sequence", cli="completion_len",
          widget=_w("completion length", "int", "Objective")),
    Field("rl.reference", str, "where the frozen reference model lives (unset: the objective's default)",
          "scenario:REFERENCES", optional=True, cli="reference",
          widget=_w("reference model", "select", "Objective")),
    Field("rl.rollout", str, "the generation engine (scenario.ROLLOUTS)", "scenario:ROLLOUTS", cli="rollout",
          widget=_w("rollout engine", "select", "Objective")),
    Field("rl.gpu_memory_utilization", float, "a colocated vLLM engine's gpu_memory_utilization, in (0, 1]",
          cli="gpu_memory_utilization", widget=_w("vLLM gpu_memory_utilization", "number", "Objective")),
    Field("rl.kv_cache", str, "how a colocated vLLM engine sizes its KV cache", "scenario:KV_CACHE_SIZING",
          cli="kv_cache"),
    Field("rl.rollout_dtype", str, "the vLLM engine's weight dtype", "scenario:ROLLOUT_DTYPES"),
    Field("rl.sleep_mode", int, "vLLM sleep mode: 0 off, 1 weights to host, 2 discard weights", (0, 1, 2),
          cli="sleep_mode", widget=_w("vLLM sleep mode", "select", "Objective")),
    Field("rl.cuda_graphs", bool, "the vLLM engine captures CUDA graphs"),
    Field("rl.completions_per_micro_batch", int, "GRPO: completions per training micro-batch (unset: "
          "micro_batch_size x G)", optional=True, cli="completions_per_micro_batch"),
    Field("num_gpus", int, "the GPU count, dp x tp x pp x cp (checked when given)", optional=True),
)  # fmt: skip

#: Each field by key.
BY_KEY: dict[str, Field] = {f.key: f for f in SCHEMA}


def cli_fields() -> tuple[Field, ...]:
    """The fields with a CLI flag, in flag order."""
    return tuple(f for f in SCHEMA if f.cli is not None)


def widget_fields() -> tuple[Field, ...]:
    """The fields with a widget control, in the order the front end draws them: by fieldset, then as listed."""
    drawn = [f for f in SCHEMA if f.widget is not None]
    return tuple(sorted(drawn, key=lambda f: FIELDSETS.index(f.widget.fieldset) if f.widget else 0))


def field_table() -> str:
    """The schema as a Markdown table (docs/scenario.md's, written by the docs build: scripts/mkdocs_hooks.py): key,
    type, allowed values, CLI flag, widget control, meaning. The values of a registry are those registered when it
    is called (the engine adds ``paged-adamw``: call it with the engine loaded, as the CLI and the widget run)."""
    rows = [
        "| key | type | allowed values | CLI flag | widget control | what it is |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for f in SCHEMA:
        values = ", ".join(f"`{v}`" for v in f.allowed())
        if f.optional:
            values = f"{values} (or unset)" if values else "(or unset)"
        flag = f"`--{f.cli.replace('_', '-')}`" if f.cli else ""
        control = f"{f.widget.label} ({f.widget.fieldset})" if f.widget else ""
        key = f"`{f.key}`" if f.scenario else f"`{f.key}` (widget input)"
        rows.append(f"| {key} | {f.type.__name__} | {values} | {flag} | {control} | {f.doc} |")
    return "\n".join(rows)
