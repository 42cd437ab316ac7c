"""The scenario: one validated, immutable description of a training run, with a lossless JSON form.

The JSON keys are a public contract (saved files, the CLI, the widget). Omitted keys take the
defaults in ``DEFAULTS``; ``Scenario.to_dict()`` always echoes every key, resolved, and the
``OPTIONAL_KEYS`` (unset means another key decides) when they are set.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import field, fields, replace
from pathlib import Path
from typing import Any

from memsim_widget.errors import MAX_PATH_CHARS, ScenarioError, check_text, choice_error
from memsim_widget.errors import short_repr as _short
from memsim_widget.fast_dataclass import dataclass
from memsim_widget.fp8 import (
    FP8_BASE_PRECISIONS,
    FP8_RECIPES,
    MEGATRON_FP8_PARAM_RECIPES,
    Fp8Recipe,
    fp8_recipe_for,
    fp8_recipe_name,
)
from memsim_widget.frozen import FrozenDict
from memsim_widget.frozen import freeze as _freeze
from memsim_widget.frozen import thaw as _thaw
from memsim_widget.jsonio import parse_json_object, read_json_object
from memsim_widget.optimizers import OPTIMIZER_IMPLS, OPTIMIZERS
from memsim_widget.precision import PRECISIONS
from memsim_widget.rules import ScenarioView, check
from memsim_widget.rules.pipeline_split import PP_SPLITS

METHODS = ("full", "lora", "qlora")
#: ``selective``: Megatron's (recompute the attention core, Korthikanti et al. 2022); ``selective-op``: torchtitan's
#: per-op policy (save the outputs of every other matmul and of attention, recompute the rest); ``full``: one
#: checkpoint per layer, or per ``checkpoint_every``-th layer (torchtitan's ``selective_ac_option="N"``).
CHECKPOINTING = ("none", "selective", "full", "selective-op")
ATTENTIONS = ("sdpa", "eager")
#: What runs a state-space layer (Mamba, Mamba-2, Jamba's Mamba layers): ``cuda`` -- mamba-ssm's and
#: causal-conv1d's fused kernels (what transformers takes on a GPU with them installed; the default), which save
#: their inputs and recompute the scan states in backward; ``torch`` -- transformers' pure-PyTorch path (no
#: kernels, or a CPU), which saves every per-step (Mamba) or per-chunk (Mamba-2) state.
SSM_KERNELS = ("cuda", "torch")
LOSSES = ("standard", "chunked")
FRAMEWORKS = ("hf", "torchtune", "torchtitan", "megatron", "deepspeed", "litgpt", "liger", "unsloth")
#: How long the training loop holds the model output (logits, any KV cache): dropped before backward (HF
#: Trainer), until backward ends, or through the optimizer step (a plain ``for`` loop). None: the framework's own.
OUTPUT_LIFETIMES = ("trainer", "backward", "step")
#: What ``zero_grad`` does to the gradients after each optimizer step: ``set_to_none`` frees them (the default of
#: ``torch.optim.Optimizer.zero_grad`` and ``nn.Module.zero_grad`` since PyTorch 2.0, pytorch#92731; HF Trainer's
#: call since transformers 4.27, transformers#22136); ``zeros`` keeps every ``.grad`` as a zero-filled tensor
#: through the next step's forward and backward (their default before PyTorch 2.0: HF Trainer's ``model.zero_grad()``
#: of 2020-2022). None: ``set_to_none``.
ZERO_GRADS = ("set_to_none", "zeros")
ADAPTER_DTYPES = ("fp32", "bf16", "fp16")
#: Where LoRA's target names are matched (``lora.target_scope``): ``model`` -- every module of the model whose name
#: is a target, as peft's ``get_peft_model`` matches ``target_modules`` (a multimodal model's vision tower and
#: projector included: CLIP's, SigLIP's and Llama 4's towers name their attention Linears ``q_proj`` ... ``v_proj``
#: too); ``language`` -- the language model only (the tower and projector left without adapters, as peft's
#: ``exclude_modules`` or a ``target_modules`` regex on the language model's path does, and LLaVA's own
#: ``find_all_linear_names``).
LORA_SCOPES = ("model", "language")
PP_SCHEDULES = ("1f1b", "gpipe", "interleaved")
#: Tensor-parallel plans (``parallel.tp_plan``; unset: the framework's, engine/frameworks.py).
TP_PLANS = ("hf", "torchtitan", "megatron")
OFFLOADS = ("none", "optimizer", "optimizer+params")
#: How batches are shaped: padded to ``seq_len`` (or packed to it: same shapes every step), or padded to the
#: longest sample of each batch (shapes change every step; ``seq_len`` is then the longest batch).
PADDINGS = ("max_length", "packed", "longest")
ZERO_STAGES = (0, 1, 2, 3)
#: What the training step optimises (``objective``; ``method`` says which weights train): supervised
#: fine-tuning, the preference losses (DPO and KTO with a frozen reference model, ORPO without one) and the
#: online RL losses (GRPO: G completions per prompt, no value model; PPO: policy, reference, reward and value).
OBJECTIVES = ("sft", "dpo", "orpo", "kto", "grpo", "ppo")
#: Where the frozen reference model lives: its own copy on the GPU, offloaded to host memory between uses,
#: log-probs precomputed before training (TRL ``precompute_ref_log_probs``), the LoRA policy's own frozen
#: base with the adapters disabled (TRL's default for a PEFT policy), or none (ORPO; GRPO with beta = 0).
REFERENCES = ("gpu", "offload", "precomputed", "shared_base", "none")
#: Where completions are generated: no rollout engine (completions from elsewhere; TRL's ``use_vllm=False`` path,
#: HF ``generate`` on the policy with its own KV cache, is not modelled), a
#: vLLM engine colocated on the training GPUs (TRL ``vllm_mode="colocate"``, OpenRLHF ``--colocate_all_models``),
#: or vLLM on a separate GPU group (TRL ``vllm_mode="server"``, OpenRLHF's ``vllm_num_engines``).
ROLLOUTS = ("none", "vllm_colocate", "vllm_separate")
#: How the colocated vLLM engine sizes its KV cache: ``utilization`` takes gpu_memory_utilization x the card
#: less its other usage (vLLM's default); ``needed`` counts the blocks the generation batch needs.
KV_CACHE_SIZING = ("utilization", "needed")
ROLLOUT_DTYPES = ("bf16", "fp16", "fp8")
#: Upper bounds that keep every figure a sane 64-bit integer (the planner's numpy columns are int64): a
#: sequence of 16M tokens (2**24) is beyond any published context window; a million GPUs (2**20) beyond any
#: cluster; the micro-batch at 2**16 keeps tokens x vocabulary x 4 B far below 2**63.
MAX_SEQ_LEN = 2**24
MAX_GPUS = 2**20
MAX_MICRO_BATCH = 2**16
MAX_ACCUM_STEPS = 2**20
#: At most 1,024 pipeline stages (pp x virtual_stages): the largest published pipelines have a few dozen, and
#: the per-stage schedule the engine walks grows with the square of the stage count (8,192 stages: 4 s).
MAX_PP_STAGES = 2**10


def _int(field_name: str, value: Any, minimum: int = 1, maximum: int | None = None) -> int:
    """An integer in [minimum, maximum]. A float with an integral value (``2.0``, as JSON writers and
    sliders may send) is normalised to the int; true/false, fractions, NaN and strings are refused."""
    span = f"an integer >= {minimum}" + ("" if maximum is None else f" and <= {maximum:,}")
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise ScenarioError(field_name, f"must be {span}, got {_short(value)}")
    if value < minimum or (maximum is not None and value > maximum):
        raise ScenarioError(field_name, f"must be {span}, got {_short(value)}")
    return value


def check_headroom(value: Any, field_name: str = "headroom") -> float:
    """The share of GPU memory kept free: a finite number in [0, 1) (1 would leave nothing usable)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1:
        raise ScenarioError(field_name, f"must be a number in [0, 1), e.g. 0.1, got {_short(value)}")
    return float(value)


def check_memory_budget(value: Any, compiled: bool) -> float:
    """``activation_memory_budget``: a number in [0, 1], the share of the default partitioner's saved activations
    Inductor's min-cut partitioner may keep (``torch._functorch.config.activation_memory_budget``; 0 recomputes
    all it can, 1 is torch's default), for a compiled step only."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise ScenarioError(
            "activation_memory_budget", f"must be a number in [0, 1], e.g. 0.5, got {_short(value)}"
        )
    if not compiled:
        raise ScenarioError(
            "activation_memory_budget",
            "is torch.compile's partitioner budget: set compile to true, or unset it",
        )
    return float(value)


def _bool(field_name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ScenarioError(field_name, f"must be true or false, got {value!r}")
    return value


#: At most 2**40 elements in DeepSpeed's reduce bucket (``parallel.reduce_bucket_size``): 2 TB of bf16, more than
#: any GPU holds.
MAX_BUCKET_ELEMENTS = 2**40


def check_reduce_bucket_size(value: Any) -> int | str:
    """``parallel.reduce_bucket_size``: a whole number of elements (>= 1; ``5e8`` as DeepSpeed configs write it is
    taken), or "auto" (HF / accelerate: hidden_size x hidden_size, resolved by the engine)."""
    if value == "auto":
        return "auto"
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        raise ScenarioError(
            "parallel.reduce_bucket_size",
            f'must be a whole number of elements or "auto", got {_short(value)}',
        )
    return _int("parallel.reduce_bucket_size", value, maximum=MAX_BUCKET_ELEMENTS)


def _choice(field_name: str, value: Any, allowed: tuple[str, ...] | list[str]) -> str:
    if value not in allowed:
        raise choice_error(field_name, value, allowed)
    return value


@dataclass(frozen=True)
class LoraConfig:
    """LoRA adapters: rank, scaling alpha, target module names (or ``all-linear``), adapter dtype, and where the
    names are matched (``target_scope``, ``LORA_SCOPES``; written out only when not peft's ``model``)."""

    rank: int = 16
    alpha: float = 32
    targets: tuple[str, ...] = ("q_proj", "v_proj")
    adapter_dtype: str = "fp32"
    target_scope: str = "model"

    def __post_init__(self) -> None:
        object.__setattr__(self, "rank", _int("lora.rank", self.rank, maximum=2**16))
        alpha = self.alpha
        if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not 0 < alpha < math.inf:
            raise ScenarioError("lora.alpha", f"must be a positive finite number, got {_short(alpha)}")
        targets = self.targets
        if isinstance(targets, str):
            targets = (targets,)
        if (
            not isinstance(targets, tuple | list)
            or not targets
            or not all(isinstance(t, str) for t in targets)
        ):
            raise ScenarioError(
                "lora.targets", f"must be a non-empty list of module names, got {_short(targets)}"
            )
        for i, t in enumerate(targets):
            check_text(f"lora.targets[{i}]", t)
        object.__setattr__(self, "targets", tuple(targets))
        _choice("lora.adapter_dtype", self.adapter_dtype, ADAPTER_DTYPES)
        _choice("lora.target_scope", self.target_scope, LORA_SCOPES)

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "alpha": self.alpha,
            "targets": list(self.targets),
            "adapter_dtype": self.adapter_dtype,
            **({"target_scope": self.target_scope} if self.target_scope != "model" else {}),
        }


@dataclass(frozen=True)
class RLConfig:
    """The knobs of a preference or RL objective (``rl`` block; read only when ``objective`` is not ``sft``).

    ``num_generations`` G: completions per prompt (GRPO; ``micro_batch_size`` then counts prompts, and the
    trained micro-batch is micro_batch_size x G sequences, TRL's ``per_device_train_batch_size``);
    ``completion_len``: the generated part of each ``seq_len``-token sequence (GRPO/PPO: the logits are kept
    for it only, TRL's ``logits_to_keep``); ``reference``: where the frozen reference model lives (None: the
    objective's default, ``gpu`` for DPO/KTO/PPO, ``none`` for ORPO and GRPO whose TRL default is beta = 0);
    ``rollout``: the generation engine; ``gpu_memory_utilization``, ``kv_cache``, ``rollout_dtype``,
    ``sleep_mode`` (0 off, 1 offload weights and discard the KV cache, 2 discard both) and ``cuda_graphs``
    describe a colocated vLLM engine (``engine/rl/rollout.py``).
    """

    num_generations: int = 8
    completion_len: int = 512
    reference: str | None = None
    rollout: str = "none"
    gpu_memory_utilization: float = 0.3
    kv_cache: str = "utilization"
    rollout_dtype: str = "bf16"
    sleep_mode: int = 0
    cuda_graphs: bool = True
    #: GRPO: completions per training micro-batch (TRL's ``per_device_train_batch_size``, which may split a
    #: prompt's G completions over micro-batches); None: micro_batch_size x G, every group whole.
    completions_per_micro_batch: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "num_generations", _int("rl.num_generations", self.num_generations, maximum=2**12)
        )
        object.__setattr__(
            self, "completion_len", _int("rl.completion_len", self.completion_len, maximum=MAX_SEQ_LEN)
        )
        if self.reference is not None:
            _choice("rl.reference", self.reference, REFERENCES)
        _choice("rl.rollout", self.rollout, ROLLOUTS)
        u = self.gpu_memory_utilization
        if isinstance(u, bool) or not isinstance(u, int | float) or not 0 < u <= 1:
            raise ScenarioError("rl.gpu_memory_utilization", f"must be a number in (0, 1], got {_short(u)}")
        object.__setattr__(self, "gpu_memory_utilization", float(u))
        _choice("rl.kv_cache", self.kv_cache, KV_CACHE_SIZING)
        _choice("rl.rollout_dtype", self.rollout_dtype, ROLLOUT_DTYPES)
        mode = self.sleep_mode
        if isinstance(mode, float) and mode.is_integer():
            mode = int(mode)
        if isinstance(mode, bool) or mode not in (0, 1, 2):
            raise ScenarioError(
                "rl.sleep_mode", f"must be 0 (off), 1 or 2 (vLLM sleep level), got {_short(mode)}"
            )
        object.__setattr__(self, "sleep_mode", mode)
        _bool("rl.cuda_graphs", self.cuda_graphs)
        if self.completions_per_micro_batch is not None:
            object.__setattr__(
                self,
                "completions_per_micro_batch",
                _int(
                    "rl.completions_per_micro_batch",
                    self.completions_per_micro_batch,
                    maximum=MAX_MICRO_BATCH,
                ),
            )

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


#: The ``parallel`` keys echoed only when set (None: the framework's default).
OPTIONAL_PARALLEL = (
    "pp_layers",
    "pp_split",
    "tp_plan",
    "loss_parallel",
    "overlap_comm",
    "reduce_bucket_size",
    "dp_shard",
)


@dataclass(frozen=True)
class ParallelConfig:
    """The parallel layout: degrees, ZeRO stage, pipeline schedule and offload."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    zero: int = 0
    sequence_parallel: bool = False
    pp_schedule: str = "1f1b"
    pp_microbatches: int = 1
    virtual_stages: int = 1
    offload: str = "none"
    #: FSDP2 ``fully_shard(reshard_after_forward=...)``: False keeps every unit unsharded from its forward to
    #: its backward (no re-gather, more memory); only ZeRO-3 with FSDP2 reads it.
    reshard_after_forward: bool = True
    #: Layers per pipeline rank, first to last (None: an even split). Uneven splits as the frameworks make
    #: them: torchtitan's per-stage layer lists (``module_fqns_per_model_part``), Megatron's
    #: ``--decoder-first/last-pipeline-num-layers`` and, with embedding and loss counted as layers
    #: (``--account-for-embedding/loss-in-pipeline-split``), one layer fewer on the first and last rank.
    #: Each rank's memory follows its own layers; ``rules/model.py`` checks they add up to the model's.
    pp_layers: tuple[int, ...] | None = None
    #: How the layers are split when ``pp_layers`` is not given (None: even where pp x virtual_stages divides
    #: the layers, else torchtitan's split): "even", "torchtitan" (embedding and head counted as one layer
    #: each, the rest spread) or "megatron" (``--account-for-embedding/loss-in-pipeline-split``); the rule and
    #: its sources: ``rules/pipeline_split.py``.
    pp_split: str | None = None
    #: The tensor-parallel plan (None: the framework's): "hf" (the model's transformers ``base_model_tp_plan``),
    #: "torchtitan" (vocab-sharded embedding and head) or "megatron" (Megatron-Core's vocab-parallel layers).
    #: Lets a hybrid be said: an HF model under a DTensor plan of torchtitan's shape (accelerate, a custom loop).
    tp_plan: str | None = None
    #: The cross-entropy on vocab-sharded logits (torch ``loss_parallel()``; None: on under the torchtitan and
    #: megatron plans, off under "hf", whose head gathers the full logits).
    loss_parallel: bool | None = None
    #: DeepSpeed ZeRO-1/2's ``zero_optimization.overlap_comm`` (None: DeepSpeed's default, false): true keeps a
    #: second ipg buffer of ``reduce_bucket_size`` elements to fill while the first is reduced
    #: (``engine/counters/zero_stream.py``). Read only under a DeepSpeed ZeRO-1/2 layout.
    overlap_comm: bool | None = None
    #: DeepSpeed ZeRO-1/2's ``zero_optimization.reduce_bucket_size`` in elements, or "auto" (HF Trainer and
    #: accelerate fill it with hidden_size x hidden_size; None: DeepSpeed's default, 5e8). Read only under a
    #: DeepSpeed ZeRO-1/2 layout (``engine/frameworks.reduce_bucket_elements``).
    reduce_bucket_size: int | str | None = None
    #: The ZeRO/FSDP sharding degree within ``dp`` (None: shard over every data-parallel rank): hybrid sharding,
    #: the states sharded over groups of ``dp_shard`` ranks and replicated over ``dp / dp_shard`` such groups --
    #: torchtitan's ``data_parallel_shard_degree`` x ``data_parallel_replicate_degree`` (FSDP2 ``fully_shard``
    #: on a 2-D mesh, HSDP), FSDP1 / accelerate ``HYBRID_SHARD`` and ``_HYBRID_SHARD_ZERO2`` (one node's GPUs),
    #: DeepSpeed MiCS (``mics_shard_size``). It must divide ``dp``; with ``cp`` the shard group is dp_shard x cp
    #: (``shard_degree``). Read only under ZeRO >= 1; the replicas' extra all-reduce and communicator are the
    #: engine's (``engine/states/gathered.py``, ``engine/counters/overhead.py``).
    dp_shard: int | None = None

    def __post_init__(self) -> None:
        for name in ("dp", "tp", "pp", "cp", "ep", "virtual_stages"):
            object.__setattr__(self, name, _int(f"parallel.{name}", getattr(self, name), maximum=MAX_GPUS))
        object.__setattr__(
            self,
            "pp_microbatches",
            _int("parallel.pp_microbatches", self.pp_microbatches, maximum=MAX_ACCUM_STEPS),
        )
        zero = self.zero
        if isinstance(zero, float) and zero.is_integer():
            zero = int(zero)
        if isinstance(zero, bool) or not isinstance(zero, int) or zero not in ZERO_STAGES:
            raise ScenarioError("parallel.zero", f"must be one of 0, 1, 2, 3, got {_short(self.zero)}")
        object.__setattr__(self, "zero", zero)
        _bool("parallel.sequence_parallel", self.sequence_parallel)
        _bool("parallel.reshard_after_forward", self.reshard_after_forward)
        _choice("parallel.pp_schedule", self.pp_schedule, PP_SCHEDULES)
        _choice("parallel.offload", self.offload, OFFLOADS)
        if self.pp * self.virtual_stages > MAX_PP_STAGES:
            name = "parallel.pp" if self.virtual_stages == 1 else "parallel.virtual_stages"
            raise ScenarioError(
                name,
                f"pp x virtual_stages = {self.pp * self.virtual_stages:,} stages is more than {MAX_PP_STAGES:,}",
            )
        self._check_pp_layers()
        if self.pp_split is not None:
            _choice("parallel.pp_split", self.pp_split, PP_SPLITS)
            if self.pp_layers is not None:
                raise ScenarioError(
                    "parallel.pp_split", "parallel.pp_layers lists the split already: leave pp_split unset"
                )
        if self.tp_plan is not None:
            _choice("parallel.tp_plan", self.tp_plan, TP_PLANS)
        if self.loss_parallel is not None:
            _bool("parallel.loss_parallel", self.loss_parallel)
        if self.overlap_comm is not None:
            _bool("parallel.overlap_comm", self.overlap_comm)
        if self.reduce_bucket_size is not None:
            object.__setattr__(self, "reduce_bucket_size", check_reduce_bucket_size(self.reduce_bucket_size))
        if self.dp_shard is not None:
            object.__setattr__(self, "dp_shard", _int("parallel.dp_shard", self.dp_shard, maximum=MAX_GPUS))
            if self.dp % self.dp_shard:
                raise ScenarioError(
                    "parallel.dp_shard",
                    f"must divide parallel.dp (the shard groups tile the data-parallel ranks): dp = {self.dp}, "
                    f"got {self.dp_shard}",
                )
        check("parallel", ScenarioView(parallel=self))
        if self.world_size > MAX_GPUS:
            raise ScenarioError(
                "parallel", f"dp*tp*pp*cp = {self.world_size:,} GPUs is more than {MAX_GPUS:,} (2**20)"
            )

    def _check_pp_layers(self) -> None:
        """``pp_layers``: None, or one layer count (>= 0) per pipeline rank (kept as a tuple); which counts the
        model allows (0 only on the first or last stage) is the rules table's."""
        if self.pp_layers is None:
            return
        v = self.pp_layers
        if isinstance(v, (str, bytes, Mapping)) or not hasattr(v, "__iter__"):
            raise ScenarioError(
                "parallel.pp_layers", f"must be a list of layer counts per stage, got {_short(v)}"
            )
        counts = tuple(v)
        if self.pp == 1:
            raise ScenarioError("parallel.pp_layers", "needs pp > 1 (layers per pipeline stage)")
        if len(counts) != self.pp:
            raise ScenarioError(
                "parallel.pp_layers",
                f"must list one layer count per stage (pp = {self.pp}), got {len(counts)}",
            )
        for i, c in enumerate(counts):
            _int(f"parallel.pp_layers[{i}]", c, minimum=0, maximum=MAX_GPUS)
        object.__setattr__(self, "pp_layers", tuple(int(c) for c in counts))

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    @property
    def shard_degree(self) -> int:
        """The ranks ZeRO/FSDP shards the states over: dp_shard x cp (hybrid sharding), else dp x cp."""
        return (self.dp if self.dp_shard is None else self.dp_shard) * self.cp

    @property
    def dp_replicate(self) -> int:
        """The replicas of each shard group (hybrid sharding: dp / dp_shard; 1 when the states shard over all dp)."""
        return 1 if self.dp_shard is None else self.dp // self.dp_shard

    @property
    def expert_tp(self) -> int:
        """How many ways the tensor-parallel group splits each expert (expert TP).

        Expert parallelism spans dp x cp (torchtitan); what ``ep`` has beyond dp x cp it takes from the TP
        group, whose GPUs then hold whole experts: Megatron-Core's MoE parallel folding (EP x expert-TP x
        expert-DP spans TP x CP x DP: Liu et al. 2025, arXiv 2504.14960; ``--expert-tensor-parallel-size``)
        and transformers' expert parallelism over the TP group (``tp_plan`` "ep_router"/"grouped_gemm"
        entries: ep = tp on the same GPUs). ``rules/parallel.py`` checks that ``ep`` divides dp x cp x tp.
        """
        over = self.ep // math.gcd(self.ep, self.dp * self.cp)
        return max(1, self.tp // over)

    def to_dict(self) -> dict[str, Any]:
        """Every field; ``pp_layers`` (as a list), ``pp_split``, ``tp_plan``, ``loss_parallel``, ``overlap_comm``,
        ``reduce_bucket_size`` and ``dp_shard`` only when set, so scenarios that leave them to their defaults read and print as
        before the keys existed."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        for key in OPTIONAL_PARALLEL:  # optional: echoed only when set
            if out[key] is None:
                del out[key]
        if "pp_layers" in out:
            out["pp_layers"] = list(out["pp_layers"])
        return out


#: Every scenario key with its default; the resolved scenario echoes all of them.
DEFAULTS: dict[str, Any] = {
    "model": "llama-3.1-8b",
    "method": "full",
    "lora": LoraConfig().to_dict(),
    "precision": "bf16",
    "optimizer": "adamw",
    "optimizer_impl": "foreach",
    "optimizer_in_backward": False,
    "micro_batch_size": 1,
    "seq_len": 2048,
    "grad_accum_steps": 1,
    "activation_checkpointing": "none",
    "attention": "sdpa",
    "loss": "standard",
    "framework": "hf",
    "compile": False,
    "activation_offloading": False,
    "padding": "max_length",
    "cuda_lazy_loading": True,
    "parallel": ParallelConfig().to_dict(),
    "gpu": "h100-sxm-80gb",
    "num_gpus": None,
}
#: Keys that may stay unset (None: another key decides, e.g. the framework); ``to_dict`` echoes them only
#: when set, so every scenario saved before such a key existed reads and prints byte for byte the same.
OPTIONAL_KEYS: dict[str, Any] = {
    "output_lifetime": None,
    "zero_grad": None,
    "checkpoint_every": None,
    "objective": None,
    "rl": None,
    # multimodal models only (unset: the model's default; engine/context.py checks them against the model)
    "images_per_sample": None,
    "freeze_vision": None,
    # state-space layers only (Mamba, Mamba-2; unset: "cuda", see SSM_KERNELS)
    "ssm_kernel": None,
    # the fp8/fp4 recipe of the Linear matmuls (memsim_widget/fp8.py; unset: te-delayed under precision fp8)
    "fp8_recipe": None,
    # FSDP2 gathers torchao float8 weights in fp8 (unset: off, torchtitan's and torchao's default)
    "fp8_all_gather": None,
    # PYTORCH_CUDA_ALLOC_CONF of the run (unset: the framework's launcher default, engine/frameworks.py)
    "allocator_conf": None,
    # how the reserved counter is computed (RESERVED_MODELS; unset: DEFAULT_RESERVED_MODEL, Scenario.replays_reserved)
    "reserved_model": None,
    # compile: true only: torch._functorch.config.activation_memory_budget (unset: torch's default, 1.0)
    "activation_memory_budget": None,
    # compile: true only, a loop that computes the loss outside the model (torchtitan): the loss compiled apart
    # (unset: the framework's default, engine/frameworks.py FrameworkProfile.compiles_loss)
    "compile_loss": None,
    # activation_offloading: true only: offload the first N layers (TransformerEngine / Megatron-Core's
    # cpu_offloading_num_layers); unset: every layer (torchtune)
    "activation_offloading_layers": None,
}
#: How the estimate computes the reserved counter: ``replay`` (a replay of the step's allocation stream through the
#: caching allocator's rules, engine/counters/alloc_stream.py: median +0.0% on the H200 runs; on the steps the stream
#: models, the fitted rule elsewhere) or ``fitted`` (the allocated bytes plus the waste rule of
#: engine/counters/overhead.py, two constants fitted on published long runs: +22% median over the H200 runs).
#: docs/allocator.md.
RESERVED_MODELS = ("fitted", "replay")
#: The reserved model of a scenario that names none (``Scenario.replays_reserved`` reads it; one place to switch),
#: except for batches padded to their longest sample (over a long run their cache ratchets with the lengths and
#: their order, which a two-step replay cannot know: docs/allocator.md#variable-lengths; the fitted rule was
#: fitted on such runs), compiled steps whose stream is not held to its compiled trace
#: (``replayable.compiled_stream_held`` says which, and why): those keep the fitted rule. Pipeline stages replay
#: by default since 2026-12-06 (a GPipe or 1F1B stage's stream is within 1% of its trace on all 36 traced stages,
#: none under: docs/allocator.md#pipeline-stages).
DEFAULT_RESERVED_MODEL = "replay"
#: At most this many layers offloaded (``activation_offloading_layers``; the model check bounds it by its layers).
MAX_LAYERS = 2**16
#: At most this many images per sample (each adds hundreds of tokens to the sequence).
MAX_IMAGES = 2**10


@dataclass(frozen=True)
class Scenario:
    """A training run to simulate. Build with ``Scenario.from_dict`` / ``from_json`` or keywords.

    Runtime keys (defaults reproduce the plain eager HF loop): ``compile`` -- the step runs under
    ``torch.compile`` (Inductor's partitioner: a traced rule per family, else an untraced formula;
    engine/activations/compiled.py); ``compile_loss`` (optional, compile only) -- where the loop computes the loss
    outside the model (torchtitan), whether its loss function is compiled on its own too (torchtitan's
    ``compile.components`` holds ``"loss"``; unset: the framework's, ``FrameworkProfile.compiles_loss``);
    ``activation_offloading`` --
    saved activations go to pinned host memory as forward proceeds (torchtune ``OffloadActivations``);
    ``activation_offloading_layers`` (optional) -- with offloading on, only the first N layers' saved activations
    go to the host (TransformerEngine's ``get_cpu_offload_context``, Megatron-Core ``cpu_offloading_num_layers``;
    ``engine/step/timeline.resident_count``): 0 offloads none, the model's layer count every one (as unset);
    ``padding`` -- ``max_length`` or ``packed`` (every batch b x seq_len) or ``longest`` (padded per batch:
    shapes change every step, which fragments the caching allocator); ``cuda_lazy_loading`` -- false for
    CUDA 11 / ``CUDA_MODULE_LOADING=EAGER``, whose context is about 1.3 GiB; ``allocator_conf`` (optional) --
    the run's ``PYTORCH_CUDA_ALLOC_CONF`` (e.g. ``"expandable_segments:True,max_split_size_mb:128"``), parsed
    as PyTorch parses it (``engine/counters/allocator.py``); unset: the framework's launcher default (torchtitan
    ``expandable_segments:True``, the others PyTorch's defaults); ``reserved_model`` (optional) -- ``fitted``
    or ``replay``, how the reserved counter is computed (``RESERVED_MODELS``; unset: ``DEFAULT_RESERVED_MODEL``
    but the fitted rule for ``padding: longest``, ``replays_reserved``, and compiled steps whose stream is not held
    to its trace, ``replayable.compiled_stream_held``).

    ``output_lifetime`` -- how long the loop keeps the model output (logits and any KV cache the model
    returns): ``trainer`` drops it before backward (HF Trainer keeps only the loss), ``backward`` until
    ``loss.backward()`` returns, ``step`` through ``optimizer.step()`` (``outputs = model(**batch);
    outputs.loss.backward(); optimizer.step()``); None (the default) means the framework's own
    (``engine/frameworks.py``: torchtune ``backward``, the others ``trainer``).

    ``zero_grad`` -- ``set_to_none`` (the default when unset) frees the gradients after each optimizer step;
    ``zeros`` keeps them as zero-filled tensors through the next step (PyTorch before 2.0, HF Trainer before
    transformers 4.27), so every gradient is alive at the next step's peak as under gradient accumulation. See
    ``ZERO_GRADS``.

    ``ssm_kernel`` -- for state-space layers only (Mamba): ``cuda`` (mamba-ssm's fused kernels, what a GPU user
    with mamba-ssm and causal-conv1d installed gets; the default when unset) or ``torch`` (transformers'
    pure-PyTorch scan, which keeps every step's state: far more memory). See ``SSM_KERNELS``.

    ``fp8_recipe`` -- which fp8 (fp4) training recipe runs the Linear matmuls (``memsim_widget/fp8.py``):
    ``tensorwise`` or ``rowwise`` (torchao's ``convert_to_float8_training``, torchtitan's float8 converter; traced),
    ``te-delayed``, ``te-current``, ``mxfp8`` or ``nvfp4`` (TransformerEngine, Megatron/NeMo; formulas). It runs on
    a bf16-compute precision (``bf16``, ``amp-bf16``, ``mixed-bf16`` or ``fp8``, which fix the weights', gradients'
    and states' dtypes); unset, ``precision: fp8`` means ``te-delayed`` and the others run no fp8 matmul.

    ``fp8_all_gather`` -- FSDP2 gathers the float8 Linear weights in fp8 (torchao's
    ``enable_fsdp_float8_all_gather``, torchtitan's ``float8.enable_fsdp_float8_all_gather``): 1 B per Linear
    weight element plus a 4 B scale per weight gathered instead of 2 B (traced, docs/fidelity.md "fp8"). Needs
    ``fp8_recipe: tensorwise`` (torchao gathers tensorwise scales only) and ZeRO-3; unset means off, the default of
    both. Under ``framework: megatron`` it is Megatron FSDP's ``fp8_param_gather`` with ``te-current`` or
    ``te-delayed``: the weights are fp8 parameters, gathered in fp8, and TransformerEngine keeps no separate
    whole-model fp8 weight cache (``memsim_widget/fp8.py``, ``MEGATRON_FP8_PARAM_RECIPES``).

    ``activation_checkpointing`` -- ``none``; ``selective`` (Megatron: recompute the attention core);
    ``selective-op`` (torchtitan's per-op policy: each layer keeps its input, the outputs of its 1st, 3rd, 5th...
    matmul and of SDPA, and recomputes the rest); ``full`` (each layer keeps only its input). With ``full``,
    ``checkpoint_every`` N (optional, unset = 1) checkpoints every N-th layer only (layers N, 2N, ... counted
    from 1, torchtitan's ``selective_ac_option="N"``); the others keep all their activations.

    ``objective`` (optional, unset = ``sft``) -- ``sft``, ``dpo``, ``orpo``, ``kto``, ``grpo`` or ``ppo``,
    orthogonal to ``method`` (which weights train); ``rl`` (optional) -- its knobs, see ``RLConfig``.

    Multimodal models (CLIP, LLaVA, LLaVA-NeXT, Qwen2-VL, Qwen2.5-VL, Gemma 3) only; a text model refuses them:
    ``images_per_sample`` -- images per sample (unset: 1); the VLMs add each image's tokens to the ``seq_len`` text
    tokens (Qwen2-VL and LLaVA-NeXT from the model config's ``image_size``), CLIP trains image-text pairs (1).
    ``freeze_vision`` -- under full training, the vision tower is frozen: no gradient, no optimizer state, and (its
    input being pixels) nothing saved for its backward; unset: the model's recipe (LLaVA true, CLIP false). Under
    LoRA every base weight is frozen, the tower's too; whether the tower and projector get adapters is
    ``lora.target_scope`` (peft's default: wherever a target name matches).
    """

    model: str | FrozenDict = "llama-3.1-8b"
    method: str = "full"
    lora: LoraConfig = field(default_factory=LoraConfig)
    precision: str = "bf16"
    optimizer: str = "adamw"
    optimizer_impl: str = "foreach"
    optimizer_in_backward: bool = False
    micro_batch_size: int = 1
    seq_len: int = 2048
    grad_accum_steps: int = 1
    activation_checkpointing: str = "none"
    attention: str = "sdpa"
    loss: str = "standard"
    framework: str = "hf"
    output_lifetime: str | None = None
    zero_grad: str | None = None
    checkpoint_every: int | None = None
    ssm_kernel: str | None = None  # None: "cuda" (see SSM_KERNELS); read by state-space layers only
    fp8_recipe: str | None = (
        None  # None: te-delayed under precision fp8, else no fp8 matmul (memsim_widget/fp8.py)
    )
    fp8_all_gather: bool | None = None  # None: off (torchtitan's and torchao's default)
    images_per_sample: int | None = None
    freeze_vision: bool | None = None
    compile: bool = False
    activation_offloading: bool = False
    activation_offloading_layers: int | None = None  # None: every layer (torchtune); else the first N (TE)
    padding: str = "max_length"
    cuda_lazy_loading: bool = True
    allocator_conf: str | None = None
    reserved_model: str | None = None  # None: DEFAULT_RESERVED_MODEL (see replays_reserved)
    activation_memory_budget: float | None = None  # compile only; None: torch's default (1.0)
    compile_loss: bool | None = None  # compile only; None: the framework's (FrameworkProfile.compiles_loss)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    gpu: str | FrozenDict = "h100-sxm-80gb"
    objective: str | None = None
    rl: RLConfig | None = None

    def __post_init__(self) -> None:
        if isinstance(self.model, Mapping):
            if "model_type" not in self.model:
                raise ScenarioError("model.model_type", "an inline model config needs 'model_type'")
            object.__setattr__(self, "model", _freeze(self.model))
        elif not isinstance(self.model, str) or not self.model:
            raise ScenarioError(
                "model", f"must be a preset id, a config.json path or a dict, got {_short(self.model)}"
            )
        else:  # a preset id or a path: printable, one line, at most PATH_MAX characters
            check_text("model", self.model, MAX_PATH_CHARS)
        if isinstance(self.lora, Mapping):
            object.__setattr__(self, "lora", _lora_from(self.lora))
        elif not isinstance(self.lora, LoraConfig):
            raise ScenarioError(
                "lora",
                f'must be an object like {{"rank": 16, "alpha": 32, "targets": ["q_proj"]}}, '
                f"got {_short(self.lora)}",
            )
        if isinstance(self.parallel, Mapping):
            object.__setattr__(self, "parallel", _parallel_from(self.parallel))
        elif not isinstance(self.parallel, ParallelConfig):
            raise ScenarioError(
                "parallel",
                f'must be an object like {{"dp": 8, "tp": 2, "zero": 3}}, got {_short(self.parallel)}',
            )
        object.__setattr__(self, "gpu", _gpu_spec(self.gpu))
        _choice("method", self.method, METHODS)
        _choice("precision", self.precision, list(PRECISIONS))
        self._check_fp8_recipe()
        self._check_fp8_all_gather()
        _choice("optimizer", self.optimizer, list(OPTIMIZERS))
        _choice("optimizer_impl", self.optimizer_impl, OPTIMIZER_IMPLS)
        _bool("optimizer_in_backward", self.optimizer_in_backward)
        for name, top in (
            ("micro_batch_size", MAX_MICRO_BATCH),
            ("seq_len", MAX_SEQ_LEN),
            ("grad_accum_steps", MAX_ACCUM_STEPS),
        ):
            object.__setattr__(self, name, _int(name, getattr(self, name), maximum=top))
        _choice("activation_checkpointing", self.activation_checkpointing, CHECKPOINTING)
        if self.checkpoint_every is not None:
            object.__setattr__(self, "checkpoint_every", _int("checkpoint_every", self.checkpoint_every))
        if self.images_per_sample is not None:
            object.__setattr__(
                self,
                "images_per_sample",
                _int("images_per_sample", self.images_per_sample, minimum=0, maximum=MAX_IMAGES),
            )
        if self.freeze_vision is not None:
            _bool("freeze_vision", self.freeze_vision)
        _choice("attention", self.attention, ATTENTIONS)
        if self.ssm_kernel is not None:
            _choice("ssm_kernel", self.ssm_kernel, SSM_KERNELS)
        _choice("loss", self.loss, LOSSES)
        _choice("framework", self.framework, FRAMEWORKS)
        if self.output_lifetime is not None:
            _choice("output_lifetime", self.output_lifetime, OUTPUT_LIFETIMES)
        if self.zero_grad is not None:
            _choice("zero_grad", self.zero_grad, ZERO_GRADS)
        _bool("compile", self.compile)
        _bool("activation_offloading", self.activation_offloading)
        if self.activation_offloading_layers is not None:
            object.__setattr__(
                self,
                "activation_offloading_layers",
                _int(
                    "activation_offloading_layers",
                    self.activation_offloading_layers,
                    minimum=0,
                    maximum=MAX_LAYERS,
                ),
            )
        _choice("padding", self.padding, PADDINGS)
        _bool("cuda_lazy_loading", self.cuda_lazy_loading)
        if self.allocator_conf is not None and not isinstance(self.allocator_conf, str):
            raise ScenarioError(
                "allocator_conf",
                f"must be a string like 'expandable_segments:True', got {_short(self.allocator_conf)}",
            )
        if self.reserved_model is not None:
            _choice("reserved_model", self.reserved_model, RESERVED_MODELS)
        if self.activation_memory_budget is not None:
            object.__setattr__(
                self,
                "activation_memory_budget",
                check_memory_budget(self.activation_memory_budget, self.compile),
            )
        if self.compile_loss is not None:  # the framework's side: engine/frameworks.check_compile_loss
            _bool("compile_loss", self.compile_loss)
            if not self.compile:
                raise ScenarioError(
                    "compile_loss",
                    "says whether torch.compile covers the loss: set compile to true, or unset it",
                )
        check("scenario", ScenarioView(self))  # the rules among these keys (rules/step.py)
        self._check_objective()

    def _check_fp8_recipe(self) -> None:
        """``fp8_recipe``: a known recipe, on a precision that computes in bf16."""
        if self.fp8_recipe is None:
            return
        _choice("fp8_recipe", self.fp8_recipe, list(FP8_RECIPES))
        if self.precision not in FP8_BASE_PRECISIONS:
            raise ScenarioError(
                "fp8_recipe",
                f"{self.fp8_recipe!r} runs on a bf16-compute precision ({', '.join(FP8_BASE_PRECISIONS)}), "
                f"not {self.precision!r}",
            )

    def _check_fp8_all_gather(self) -> None:
        """``fp8_all_gather``: a bool; on, torchao's tensorwise recipe or, under ``framework: megatron``,
        TransformerEngine's per-tensor recipes (Megatron FSDP's ``fp8_param_gather``), under ZeRO-3."""
        if self.fp8_all_gather is None:
            return
        _bool("fp8_all_gather", self.fp8_all_gather)
        if not self.fp8_all_gather:
            return
        recipe = fp8_recipe_name(self.precision, self.fp8_recipe)
        megatron = self.framework == "megatron" and recipe in MEGATRON_FP8_PARAM_RECIPES
        if recipe != "tensorwise" and not megatron:
            raise ScenarioError(
                "fp8_all_gather",
                f"needs fp8_recipe 'tensorwise' (torchao gathers tensorwise-scaled weights only), or under "
                f"framework 'megatron' one of {', '.join(MEGATRON_FP8_PARAM_RECIPES)} (fp8_param_gather), got "
                f"{self.fp8_recipe!r}",
            )
        if self.parallel.zero < 3:
            raise ScenarioError("fp8_all_gather", f"needs ZeRO-3 (FSDP), got zero {self.parallel.zero}")

    def _check_objective(self) -> None:
        """``objective`` and its ``rl`` block: valid names, and the combinations the rules model."""
        if self.objective is not None:
            _choice("objective", self.objective, OBJECTIVES)
        if isinstance(self.rl, Mapping):
            object.__setattr__(self, "rl", _rl_from(self.rl))
        elif self.rl is not None and not isinstance(self.rl, RLConfig):
            raise ScenarioError(
                "rl",
                f'must be an object like {{"num_generations": 8, "reference": "gpu"}}, got {_short(self.rl)}',
            )
        check("objective", ScenarioView(self))  # rules/objective.py
        obj = self.objective_name
        if self.sequences_per_micro_batch > MAX_MICRO_BATCH:
            raise ScenarioError(
                "rl.num_generations" if obj == "grpo" else "micro_batch_size",
                f"micro_batch_size x sequences per sample is over {MAX_MICRO_BATCH:,}",
            )

    @property
    def fp8(self) -> Fp8Recipe | None:
        """The fp8/fp4 recipe the Linear matmuls run (``fp8_recipe``; ``te-delayed`` under ``precision: fp8``)."""
        return fp8_recipe_for(self.precision, self.fp8_recipe)

    @property
    def offloads_activations(self) -> bool:
        """Whether any layer's saved activations are offloaded (``activation_offloading`` on and
        ``activation_offloading_layers`` unset, meaning every layer, or at least one)."""
        return self.activation_offloading and self.activation_offloading_layers != 0

    @property
    def replays_reserved(self) -> bool:
        """Whether the reserved counter comes from the allocator's replay (``reserved_model``, unset:
        ``DEFAULT_RESERVED_MODEL`` but for ``padding: longest``); the step must also be one the
        stream models (``replayable.replayable``: a compiled step by default only where its stream is held to its
        compiled trace, ``replayable.compiled_stream_held``)."""
        if self.reserved_model is not None:
            return self.reserved_model == "replay"
        return DEFAULT_RESERVED_MODEL == "replay" and self.padding != "longest"

    @property
    def objective_name(self) -> str:
        """The objective, ``sft`` when unset."""
        return self.objective or "sft"

    @property
    def rl_config(self) -> RLConfig:
        """The ``rl`` block, its defaults when unset."""
        return self.rl if self.rl is not None else RLConfig()

    @property
    def reference(self) -> str:
        """Where the frozen reference model lives, the objective's default resolved."""
        obj = self.objective_name
        ref = self.rl_config.reference
        if obj in ("sft", "orpo"):
            return "none"
        if ref is None:
            return "none" if obj == "grpo" else "gpu"
        return ref

    @property
    def sequences_per_micro_batch(self) -> int:
        """Sequences one training micro-batch puts through the policy: micro_batch_size x sequences per sample,
        or GRPO's ``rl.completions_per_micro_batch`` when set."""
        n = self.rl_config.completions_per_micro_batch if self.objective_name == "grpo" else None
        return n if n is not None else self.micro_batch_size * self.sequences_per_sample

    @property
    def sequences_per_sample(self) -> int:
        """Sequences each sample of the micro-batch puts through the policy: chosen and rejected (DPO, ORPO),
        G completions of a prompt (GRPO), one otherwise."""
        obj = self.objective_name
        if obj in ("dpo", "orpo"):
            return 2
        if obj == "grpo":
            return self.rl_config.num_generations
        return 1

    # ----- JSON form -------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The resolved scenario as plain JSON-ready data: every key of ``DEFAULTS``, and the ``OPTIONAL_KEYS``
        that are set."""
        return {
            "model": _thaw(self.model),
            "method": self.method,
            "lora": self.lora.to_dict(),
            "precision": self.precision,
            "optimizer": self.optimizer,
            "optimizer_impl": self.optimizer_impl,
            "optimizer_in_backward": self.optimizer_in_backward,
            "micro_batch_size": self.micro_batch_size,
            "seq_len": self.seq_len,
            "grad_accum_steps": self.grad_accum_steps,
            "activation_checkpointing": self.activation_checkpointing,
            **({"checkpoint_every": self.checkpoint_every} if self.checkpoint_every is not None else {}),
            "attention": self.attention,
            "loss": self.loss,
            "framework": self.framework,
            **({"output_lifetime": self.output_lifetime} if self.output_lifetime is not None else {}),
            **({"zero_grad": self.zero_grad} if self.zero_grad is not None else {}),
            **({"ssm_kernel": self.ssm_kernel} if self.ssm_kernel is not None else {}),
            **({"fp8_recipe": self.fp8_recipe} if self.fp8_recipe is not None else {}),
            **({"fp8_all_gather": self.fp8_all_gather} if self.fp8_all_gather is not None else {}),
            **({"images_per_sample": self.images_per_sample} if self.images_per_sample is not None else {}),
            **({"freeze_vision": self.freeze_vision} if self.freeze_vision is not None else {}),
            "compile": self.compile,
            "activation_offloading": self.activation_offloading,
            **(
                {"activation_offloading_layers": self.activation_offloading_layers}
                if self.activation_offloading_layers is not None
                else {}
            ),
            "padding": self.padding,
            "cuda_lazy_loading": self.cuda_lazy_loading,
            **({"allocator_conf": self.allocator_conf} if self.allocator_conf is not None else {}),
            **({"reserved_model": self.reserved_model} if self.reserved_model is not None else {}),
            **(
                {"activation_memory_budget": self.activation_memory_budget}
                if self.activation_memory_budget is not None
                else {}
            ),
            **({"compile_loss": self.compile_loss} if self.compile_loss is not None else {}),
            "parallel": self.parallel.to_dict(),
            "gpu": _thaw(self.gpu),
            "num_gpus": self.parallel.world_size,
            **({"objective": self.objective} if self.objective is not None else {}),
            **({"rl": self.rl.to_dict()} if self.rl is not None else {}),
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Scenario:
        """Validate a JSON-style mapping; unknown keys and bad values raise ``ScenarioError``."""
        if not isinstance(data, Mapping):
            raise ScenarioError("scenario", f"must be a JSON object, got {type(data).__name__}")
        unknown = [k for k in data if k not in DEFAULTS and k not in OPTIONAL_KEYS]
        if unknown:
            raise _unknown_key(unknown[0], [*DEFAULTS, *OPTIONAL_KEYS])
        kwargs = {k: v for k, v in data.items() if k != "num_gpus"}
        scenario = cls(**kwargs)
        num_gpus = data.get("num_gpus")
        if num_gpus is not None:
            num_gpus = _int("num_gpus", num_gpus, maximum=MAX_GPUS)
            if num_gpus != scenario.parallel.world_size:
                p = scenario.parallel
                raise ScenarioError(
                    "num_gpus",
                    f"{num_gpus} != dp*tp*pp*cp = {p.dp}*{p.tp}*{p.pp}*{p.cp} = {p.world_size}",
                )
        return scenario

    @classmethod
    def from_json(cls, text_or_path: str | Path) -> Scenario:
        """Parse JSON text, or read it from a file path."""
        text = str(text_or_path)
        if isinstance(text_or_path, Path) or not text.lstrip().startswith("{"):
            data = read_json_object(text_or_path, "scenario")
        else:
            data = parse_json_object(text, "scenario", "the scenario text")
        return cls.from_dict(data)

    def replace(self, **changes: Any) -> Scenario:
        """A copy with some keys changed (nested ``parallel``/``lora`` accept partial dicts)."""
        if isinstance(changes.get("parallel"), Mapping):
            changes["parallel"] = {**self.parallel.to_dict(), **changes["parallel"]}
        if isinstance(changes.get("lora"), Mapping):
            changes["lora"] = {**self.lora.to_dict(), **changes["lora"]}
        if isinstance(changes.get("rl"), Mapping):
            changes["rl"] = {**self.rl_config.to_dict(), **changes["rl"]}
        return replace(self, **changes)

    @property
    def tokens(self) -> int:
        """Tokens per micro-batch (b * s)."""
        return self.micro_batch_size * self.seq_len


def _gpu_spec(spec: Any) -> str | FrozenDict:
    """The scenario's ``gpu``: a catalog id (a name as nvidia-smi or a cloud prints it becomes the id), a
    size string, or a custom ``{"memory_gib": N}`` checked now. An unknown string is kept: cards may be
    registered later, and ``resolve_gpu`` names the field when the scenario is estimated."""
    from memsim_widget.catalog.gpus import canonical_gpu_id, resolve_gpu

    if isinstance(spec, Mapping):
        frozen = _freeze(spec, "gpu")
        for key in ("name", "id"):  # printed in every output and exported file's header
            if isinstance(frozen.get(key), str):
                check_text(f"gpu.{key}", frozen[key])
        resolve_gpu(dict(frozen))
        return frozen
    if not isinstance(spec, str) or not spec:
        raise ScenarioError("gpu", f"must be a GPU id or {{'memory_gib': N}}, got {_short(spec)}")
    check_text("gpu", spec)
    return canonical_gpu_id(spec) or spec


def _lora_from(data: Mapping[str, Any]) -> LoraConfig:
    allowed = [f.name for f in fields(LoraConfig)]
    for k in data:
        if k not in allowed:
            raise _unknown_key(f"lora.{k}", allowed)
    return LoraConfig(**data)


def _rl_from(data: Mapping[str, Any]) -> RLConfig:
    allowed = [f.name for f in fields(RLConfig)]
    for k in data:
        if k not in allowed:
            raise _unknown_key(f"rl.{k}", allowed)
    return RLConfig(**data)


def _parallel_from(data: Mapping[str, Any]) -> ParallelConfig:
    allowed = [f.name for f in fields(ParallelConfig)]
    for k in data:
        if k not in allowed:
            raise _unknown_key(f"parallel.{k}", allowed)
    return ParallelConfig(**data)


def _unknown_key(dotted: str, allowed: list[str]) -> ScenarioError:
    prefix, _, key = dotted.rpartition(".")
    import difflib  # on an error only (every CLI start imports this module)

    close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    if not key:
        key = '""'  # an empty key: named as such, never an empty field
    elif not key.isprintable() or len(key) > 64:  # a key with newlines or 10 kB of junk: named, on one line
        key = ascii(key)[:64]
    field = f"{prefix}.{key}" if prefix else key
    return ScenarioError(field, f"unknown key{hint}; allowed keys: {', '.join(allowed)}")
