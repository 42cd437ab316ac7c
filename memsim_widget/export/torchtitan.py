"""torchtitan job config, in the form torchtitan 0.3 reads: a Python ``config_registry`` function.

Since 2026 torchtitan has no TOML job files: ``--module M --config F`` imports ``M.config_registry`` (or ``M``)
and calls ``F()`` for a ``Trainer.Config``; CLI flags then override it (torchtitan/config/manager.py
``ConfigManager._load_config``). The export is such a module: it starts from the model's own registry function
and sets the fields memsim modelled (torchtitan/config/configs.py ``TrainingConfig``, ``ParallelismConfig``,
``CompileConfig``; distributed/activation_checkpoint.py ``FullAC`` / ``SelectiveAC``; components/loss.py;
components/optimizer/optimizer.py ``OptimizersContainer.Config.implementation``).
"""

from __future__ import annotations

from typing import Any

from memsim_widget.export.common import Draft, check_common, comment, framework_note, header_lines, refuse
from memsim_widget.rules.pipeline_split import split_style

FILE = "memsim_torchtitan.py"
FUNCTION = "memsim_job"
#: memsim preset -> (torchtitan model module, its config_registry function).
MODELS: dict[str, tuple[str, str]] = {
    "llama-3.1-8b": ("llama3", "llama3_8b"),
    "llama-3.1-70b": ("llama3", "llama3_70b"),
    "llama-3.1-405b": ("llama3", "llama3_405b"),
    "qwen3-0.6b": ("qwen3", "qwen3_0_6b"),
    "qwen3-1.7b": ("qwen3", "qwen3_1_7b"),
    "qwen3-14b": ("qwen3", "qwen3_14b"),
    "qwen3-32b": ("qwen3", "qwen3_32b"),
    "qwen3-30b-a3b": ("qwen3", "qwen3_30b_a3b"),
    "deepseek-v3": ("deepseek_v3", "deepseek_v3_671b"),
    "gpt-oss-20b": ("gpt_oss", "gpt_oss_20b"),
    "gpt-oss-120b": ("gpt_oss", "gpt_oss_120b"),
}
#: memsim precision -> (``training.dtype``, ``training.mixed_precision_param``).
PRECISION = {
    "bf16": ("bfloat16", "bfloat16"),
    "amp-bf16": ("float32", "bfloat16"),
    "fp32": ("float32", "float32"),
}
SCHEDULES = {"1f1b": "1F1B", "gpipe": "GPipe", "interleaved": "Interleaved1F1B"}
OPTIMIZERS = {"adamw": "AdamW", "adam": "Adam"}


def fields(draft: Draft) -> dict[str, Any]:
    """The ``Trainer.Config`` fields the scenario sets, by dotted path (values as Python literals)."""
    sc, fmt, p = draft.scenario, draft.fmt, draft.scenario.parallel
    if sc.method != "full":
        raise refuse("method", fmt, "torchtitan trains full models; use torchtune or hf for LoRA/QLoRA")
    if sc.precision not in PRECISION:
        raise refuse("precision", fmt, f"torchtitan's are {', '.join(PRECISION)}, got {sc.precision!r}")
    if sc.attention != "sdpa":
        raise refuse("attention", fmt, "torchtitan's attention is SDPA (or flex/varlen), not eager")
    if p.zero in (1, 2):
        raise refuse(
            "parallel.zero", fmt, "torchtitan shards fully (FSDP2, zero 3) or replicates (DDP, zero 0)"
        )
    if p.offload == "optimizer":
        raise refuse("parallel.offload", fmt, "training.enable_cpu_offload offloads parameters, gradients and "
                     "states together; use 'optimizer+params'")  # fmt: skip
    if sc.optimizer not in OPTIMIZERS:
        raise refuse("optimizer", fmt, f"{sc.optimizer!r}; allowed: {', '.join(OPTIMIZERS)}")
    if sc.optimizer_in_backward:
        # 0.3 selects it by the optimizer container's class (OptimizersInBackwardContainer), whose Config this
        # writer has not been checked against; the import reads it, and older TOML's early_step_in_backward
        raise refuse("optimizer_in_backward", fmt, "the 0.3 module export does not write "
                     "OptimizersInBackwardContainer; set config.optimizer to it by hand")  # fmt: skip
    if sc.activation_offloading:
        raise refuse("activation_offloading", fmt, "torchtitan has no activation-offloading field")
    check_common(draft, peft=False)
    draft.note("training.disable_cuda_graphs = True matches memsim's eager step; torchtitan's default CUDA graphs "
               "keep the gradients allocated between steps (more memory than predicted)")  # fmt: skip
    dtype, param = PRECISION[sc.precision]
    out: dict[str, Any] = {
        "training.local_batch_size": sc.micro_batch_size * p.pp_microbatches,
        "training.global_batch_size": sc.micro_batch_size * p.pp_microbatches * sc.grad_accum_steps * p.dp,
        "training.seq_len": sc.seq_len,
        "training.dtype": dtype,
        "training.mixed_precision_param": param,
        "training.enable_cpu_offload": p.offload == "optimizer+params",
        # memsim models the eager step; torchtitan 0.3 captures it in CUDA graphs by default and then zeroes the
        # gradients in place (trainer.py: zero_grad(set_to_none=disable_cuda_graphs)), keeping them all step
        "training.disable_cuda_graphs": True,
        "parallelism.data_parallel_replicate_degree": p.dp if p.zero == 0 else p.dp_replicate,
        "parallelism.data_parallel_shard_degree": p.dp // p.dp_replicate if p.zero == 3 else 1,
        "parallelism.fsdp_reshard_after_forward": "always" if p.reshard_after_forward else "never",
        "parallelism.tensor_parallel_degree": p.tp,
        "parallelism.enable_sequence_parallel": p.sequence_parallel,
        "parallelism.context_parallel_degree": p.cp,
        "parallelism.expert_parallel_degree": p.ep,
        "parallelism.pipeline_parallel_degree": p.pp,
        "compile.enable": sc.compile,
        "optimizer.implementation": sc.optimizer_impl,
    }
    if sc.compile and sc.compile_loss is not None:  # unset: torchtitan's default, ["model", "loss"]
        out["compile.components"] = ["model", "loss"] if sc.compile_loss else ["model"]
    if p.pp > 1:
        out.update(_pipeline(draft))
    return out


def _pipeline(draft: Draft) -> dict[str, Any]:
    """Schedule, microbatch size, and the split of the layers (``rules/pipeline_split``): torchtitan's own
    rule counts the embedding and the head as ``pipeline_parallel_first/last_stage_less_layers`` layers (1
    by default); an even split sets both to 0, torchtitan's split keeps 1, and the interleaved schedule gets
    the ``pipeline_parallel_layers_per_stage`` that makes ``pp x virtual_stages`` chunks
    (``_get_pipeline_metadata``: ceil((layers + first + last) / per stage) chunks)."""
    p = draft.scenario.parallel
    out: dict[str, Any] = {
        "parallelism.pipeline_parallel_schedule": SCHEDULES[p.pp_schedule],
        "parallelism.pipeline_parallel_microbatch_size": draft.scenario.micro_batch_size,
    }
    if p.pp_layers is not None:
        raise refuse("parallel.pp_layers", draft.fmt, "a listed split takes torchtitan's per-chunk module lists "
                     "(module_fqns_per_model_part), which this export does not write")  # fmt: skip
    layers, n = draft.estimate.arch.num_layers, p.pp * p.virtual_stages
    ends = 0 if split_style(p.pp_split, layers, n) == "even" else 1
    out["parallelism.pipeline_parallel_first_stage_less_layers"] = ends
    out["parallelism.pipeline_parallel_last_stage_less_layers"] = ends
    if p.virtual_stages > 1:
        eff = layers + 2 * ends
        per = -(-eff // n)  # torchtitan spreads eff over the chunks itself; per only sets how many there are
        if -(-eff // per) != n:
            raise refuse("parallel.virtual_stages", draft.fmt, f"no pipeline_parallel_layers_per_stage makes "
                         f"torchtitan cut {eff} layer-equivalents into {n} chunks")  # fmt: skip
        out["parallelism.pipeline_parallel_layers_per_stage"] = per
    return out


def _checkpointing(draft: Draft) -> str:
    """The ``activation_checkpoint`` expression: FullAC, SelectiveAC (the per-op policy) or None."""
    sc = draft.scenario
    if (sc.checkpoint_every or 1) > 1:
        raise refuse("checkpoint_every", draft.fmt, "torchtitan 0.3's FullAC checkpoints every layer")
    policies = {"none": "None", "full": "FullAC.Config()", "selective-op": "SelectiveAC.Config()"}
    if sc.activation_checkpointing not in policies:
        raise refuse("activation_checkpointing", draft.fmt, "Megatron's 'selective' has no torchtitan policy; "
                     "use 'selective-op' (torchtitan's per-op SAC), 'full' or 'none'")  # fmt: skip
    return policies[sc.activation_checkpointing]


def source(draft: Draft) -> str:
    """The Python module: imports, then one function returning the edited registry config."""
    sc = draft.scenario
    if not isinstance(sc.model, str) or sc.model not in MODELS:
        raise refuse("model", draft.fmt, f"torchtitan defines its own models; presets: {', '.join(MODELS)}")
    module, base = MODELS[sc.model]
    values = fields(draft)
    ac = _checkpointing(draft)
    loss = "CrossEntropyLoss.Config(global_vocab_size=vocab)"
    if sc.loss == "chunked":
        loss = f"ChunkedLossWrapper.Config(loss_fn={loss})"
    framework_note(draft, "torchtitan")
    body = [
        f"    config = {base}()",
        "    vocab = decoder_vocab_size(config.model_spec)",
        *(f"    config.{k} = {v!r}" for k, v in values.items()),
        f"    config.activation_checkpoint = {ac}",
        f"    config.loss = {loss}",
        "    for group in config.optimizer.param_groups:",
        f"        group.optimizer_name = {OPTIMIZERS[sc.optimizer]!r}",
        "    return config",
    ]
    return "\n".join([
        f"from torchtitan.models.{module}.config_registry import {base}",
        "from torchtitan.components.loss import ChunkedLossWrapper, CrossEntropyLoss",
        "from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC",
        "from torchtitan.models.common.config_utils import decoder_vocab_size",
        "",
        "",
        f"def {FUNCTION}():",
        f'    """{base} with the fields memsim estimated."""',
        *body,
    ]) + "\n"  # fmt: skip


def render(draft: Draft) -> dict[str, str]:
    """``memsim_torchtitan.py`` with the run command in its header."""
    code = source(draft)
    n = draft.scenario.parallel.world_size
    run = (f"Run: PYTHONPATH=. torchrun --nproc_per_node {n} -m torchtitan.train --module memsim_torchtitan "
           f"--config {FUNCTION}")  # fmt: skip
    return {FILE: comment([*header_lines(draft), run]) + code}
