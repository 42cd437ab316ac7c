"""The scenario: one validated, immutable description of a training run, with a lossless JSON form.

The JSON keys are a public contract (saved files, the CLI, the widget). Omitted keys take the
defaults in ``DEFAULTS``; ``Scenario.to_dict()`` always echoes every key, resolved, and the
``OPTIONAL_KEYS`` (unset means another key decides) when they are set.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from memsim_widget.errors import ScenarioError, choice_error
from memsim_widget.jsonio import parse_json_object, read_json_object
from memsim_widget.optimizers import OPTIMIZERS
from memsim_widget.precision import PRECISIONS

METHODS = ("full", "lora", "qlora")
OPTIMIZER_IMPLS = ("foreach", "fused", "for-loop")
#: ``selective``: Megatron's (recompute the attention core, Korthikanti et al. 2022); ``selective-op``: torchtitan's
#: per-op policy (save the outputs of every other matmul and of attention, recompute the rest); ``full``: one
#: checkpoint per layer, or per ``checkpoint_every``-th layer (torchtitan's ``selective_ac_option="N"``).
CHECKPOINTING = ("none", "selective", "full", "selective-op")
ATTENTIONS = ("sdpa", "eager")
LOSSES = ("standard", "chunked")
FRAMEWORKS = ("hf", "torchtune", "torchtitan", "megatron", "deepspeed")
#: How long the training loop holds the model output (logits, any KV cache): dropped before backward (HF
#: Trainer), until backward ends, or through the optimizer step (a plain ``for`` loop). None: the framework's own.
OUTPUT_LIFETIMES = ("trainer", "backward", "step")
ADAPTER_DTYPES = ("fp32", "bf16", "fp16")
PP_SCHEDULES = ("1f1b", "gpipe", "interleaved")
OFFLOADS = ("none", "optimizer", "optimizer+params")
#: How batches are shaped: padded to ``seq_len`` (or packed to it: same shapes every step), or padded to the
#: longest sample of each batch (shapes change every step; ``seq_len`` is then the longest batch).
PADDINGS = ("max_length", "packed", "longest")
ZERO_STAGES = (0, 1, 2, 3)


class FrozenDict(dict):  # type: ignore[type-arg]
    """A read-only, hashable dict for inline HF configs held by a frozen scenario."""

    def _readonly(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("scenario model config is immutable; use Scenario.replace(model=...)")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = _readonly  # type: ignore[assignment]

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(json.dumps(self, sort_keys=True, default=str))


def _freeze(value: Any) -> Any:
    if isinstance(value, Mapping):
        return FrozenDict({k: _freeze(v) for k, v in value.items()})
    if isinstance(value, list | tuple):
        return tuple(_freeze(v) for v in value)
    return value


def _thaw(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _thaw(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [_thaw(v) for v in value]
    return value


def _int(field_name: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise ScenarioError(field_name, f"must be an integer >= {minimum}, got {value!r}")
    if value < minimum:
        raise ScenarioError(field_name, f"must be an integer >= {minimum}, got {value}")
    return value


def _bool(field_name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ScenarioError(field_name, f"must be true or false, got {value!r}")
    return value


def _choice(field_name: str, value: Any, allowed: tuple[str, ...] | list[str]) -> str:
    if value not in allowed:
        raise choice_error(field_name, value, allowed)
    return value


@dataclass(frozen=True)
class LoraConfig:
    """LoRA adapters: rank, scaling alpha, target module names (or ``all-linear``), adapter dtype."""

    rank: int = 16
    alpha: float = 32
    targets: tuple[str, ...] = ("q_proj", "v_proj")
    adapter_dtype: str = "fp32"

    def __post_init__(self) -> None:
        _int("lora.rank", self.rank)
        if isinstance(self.alpha, bool) or not isinstance(self.alpha, int | float) or self.alpha <= 0:
            raise ScenarioError("lora.alpha", f"must be a positive number, got {self.alpha!r}")
        targets = self.targets
        if isinstance(targets, str):
            targets = (targets,)
        if (
            not isinstance(targets, tuple | list)
            or not targets
            or not all(isinstance(t, str) for t in targets)
        ):
            raise ScenarioError("lora.targets", f"must be a non-empty list of module names, got {targets!r}")
        object.__setattr__(self, "targets", tuple(targets))
        _choice("lora.adapter_dtype", self.adapter_dtype, ADAPTER_DTYPES)

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "alpha": self.alpha,
            "targets": list(self.targets),
            "adapter_dtype": self.adapter_dtype,
        }


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

    def __post_init__(self) -> None:
        for name in ("dp", "tp", "pp", "cp", "ep", "pp_microbatches", "virtual_stages"):
            _int(f"parallel.{name}", getattr(self, name))
        if self.zero not in ZERO_STAGES or isinstance(self.zero, bool):
            raise ScenarioError("parallel.zero", f"must be one of 0, 1, 2, 3, got {self.zero!r}")
        _bool("parallel.sequence_parallel", self.sequence_parallel)
        _choice("parallel.pp_schedule", self.pp_schedule, PP_SCHEDULES)
        _choice("parallel.offload", self.offload, OFFLOADS)
        if self.sequence_parallel and self.tp == 1:
            raise ScenarioError("parallel.sequence_parallel", "needs tp > 1")
        if self.ep > 1 and (self.dp * self.cp) % self.ep:
            raise ScenarioError("parallel.ep", f"must divide dp*cp = {self.dp * self.cp}, got {self.ep}")
        if self.pp_schedule == "interleaved" and self.virtual_stages < 2:
            raise ScenarioError(
                "parallel.virtual_stages", "the interleaved schedule needs virtual_stages >= 2"
            )
        if self.virtual_stages > 1 and self.pp_schedule != "interleaved":
            raise ScenarioError(
                "parallel.virtual_stages", "virtual_stages > 1 needs pp_schedule 'interleaved'"
            )
        if self.offload != "none" and self.zero == 0:
            raise ScenarioError(
                "parallel.offload", "offload needs ZeRO stage >= 1 (DeepSpeed ZeRO-Offload / FSDP)"
            )
        if self.offload == "optimizer+params" and self.zero != 3:
            raise ScenarioError("parallel.offload", "offloading parameters needs zero 3")

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


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
OPTIONAL_KEYS: dict[str, Any] = {"output_lifetime": None, "checkpoint_every": None}


@dataclass(frozen=True)
class Scenario:
    """A training run to simulate. Build with ``Scenario.from_dict`` / ``from_json`` or keywords.

    Runtime keys (defaults reproduce the plain eager HF loop): ``compile`` -- the step runs under
    ``torch.compile`` (recorded; no memory rule yet, see docs/accuracy.md); ``activation_offloading`` --
    saved activations go to pinned host memory as forward proceeds (torchtune ``OffloadActivations``);
    ``padding`` -- ``max_length`` or ``packed`` (every batch b x seq_len) or ``longest`` (padded per batch:
    shapes change every step, which fragments the caching allocator); ``cuda_lazy_loading`` -- false for
    CUDA 11 / ``CUDA_MODULE_LOADING=EAGER``, whose context is about 1.3 GiB.

    ``output_lifetime`` -- how long the loop keeps the model output (logits and any KV cache the model
    returns): ``trainer`` drops it before backward (HF Trainer keeps only the loss), ``backward`` until
    ``loss.backward()`` returns, ``step`` through ``optimizer.step()`` (``outputs = model(**batch);
    outputs.loss.backward(); optimizer.step()``); None (the default) means the framework's own
    (``engine/frameworks.py``: torchtune ``backward``, the others ``trainer``).

    ``activation_checkpointing`` -- ``none``; ``selective`` (Megatron: recompute the attention core);
    ``selective-op`` (torchtitan's per-op policy: each layer keeps its input, the outputs of its 1st, 3rd, 5th...
    matmul and of SDPA, and recomputes the rest); ``full`` (each layer keeps only its input). With ``full``,
    ``checkpoint_every`` N (optional, unset = 1) checkpoints every N-th layer only (layers N, 2N, ... counted
    from 1, torchtitan's ``selective_ac_option="N"``); the others keep all their activations.
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
    checkpoint_every: int | None = None
    compile: bool = False
    activation_offloading: bool = False
    padding: str = "max_length"
    cuda_lazy_loading: bool = True
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    gpu: str | FrozenDict = "h100-sxm-80gb"

    def __post_init__(self) -> None:
        if isinstance(self.model, Mapping):
            if "model_type" not in self.model:
                raise ScenarioError("model.model_type", "an inline model config needs 'model_type'")
            object.__setattr__(self, "model", _freeze(self.model))
        elif not isinstance(self.model, str) or not self.model:
            raise ScenarioError(
                "model", f"must be a preset id, a config.json path or a dict, got {self.model!r}"
            )
        if isinstance(self.lora, Mapping):
            object.__setattr__(self, "lora", _lora_from(self.lora))
        if isinstance(self.parallel, Mapping):
            object.__setattr__(self, "parallel", _parallel_from(self.parallel))
        if isinstance(self.gpu, Mapping):
            object.__setattr__(self, "gpu", _freeze(self.gpu))
        elif not isinstance(self.gpu, str):
            raise ScenarioError("gpu", f"must be a GPU id or {{'memory_gib': N}}, got {self.gpu!r}")
        _choice("method", self.method, METHODS)
        _choice("precision", self.precision, list(PRECISIONS))
        _choice("optimizer", self.optimizer, list(OPTIMIZERS))
        _choice("optimizer_impl", self.optimizer_impl, OPTIMIZER_IMPLS)
        _bool("optimizer_in_backward", self.optimizer_in_backward)
        _int("micro_batch_size", self.micro_batch_size)
        _int("seq_len", self.seq_len)
        _int("grad_accum_steps", self.grad_accum_steps)
        _choice("activation_checkpointing", self.activation_checkpointing, CHECKPOINTING)
        if self.activation_checkpointing == "selective-op" and self.framework == "megatron":
            raise ScenarioError(
                "activation_checkpointing",
                "'selective-op' is torchtitan's per-op policy; Megatron's are 'selective' and 'full'",
            )
        if self.checkpoint_every is not None:
            _int("checkpoint_every", self.checkpoint_every)
            if self.checkpoint_every > 1 and self.activation_checkpointing != "full":
                raise ScenarioError(
                    "checkpoint_every",
                    f"applies to activation_checkpointing 'full' only, got {self.activation_checkpointing!r}",
                )
        _choice("attention", self.attention, ATTENTIONS)
        _choice("loss", self.loss, LOSSES)
        _choice("framework", self.framework, FRAMEWORKS)
        if self.output_lifetime is not None:
            _choice("output_lifetime", self.output_lifetime, OUTPUT_LIFETIMES)
        _bool("compile", self.compile)
        _bool("activation_offloading", self.activation_offloading)
        _choice("padding", self.padding, PADDINGS)
        _bool("cuda_lazy_loading", self.cuda_lazy_loading)
        if self.method == "qlora" and self.precision in ("fp32", "amp-bf16", "amp-fp16"):
            pass  # QLoRA computes in the precision's compute dtype; all recipes are allowed
        if (self.checkpoint_every or 1) > 1 and self.activation_offloading:
            raise ScenarioError(
                "checkpoint_every", "every-N checkpointing with activation_offloading is not modelled"
            )
        if self.optimizer_in_backward and self.grad_accum_steps > 1:
            raise ScenarioError("optimizer_in_backward", "cannot be combined with grad_accum_steps > 1")

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
            "compile": self.compile,
            "activation_offloading": self.activation_offloading,
            "padding": self.padding,
            "cuda_lazy_loading": self.cuda_lazy_loading,
            "parallel": self.parallel.to_dict(),
            "gpu": _thaw(self.gpu),
            "num_gpus": self.parallel.world_size,
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
            _int("num_gpus", num_gpus)
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
        return replace(self, **changes)

    @property
    def tokens(self) -> int:
        """Tokens per micro-batch (b * s)."""
        return self.micro_batch_size * self.seq_len


def _lora_from(data: Mapping[str, Any]) -> LoraConfig:
    allowed = [f.name for f in fields(LoraConfig)]
    for k in data:
        if k not in allowed:
            raise _unknown_key(f"lora.{k}", allowed)
    return LoraConfig(**data)


def _parallel_from(data: Mapping[str, Any]) -> ParallelConfig:
    allowed = [f.name for f in fields(ParallelConfig)]
    for k in data:
        if k not in allowed:
            raise _unknown_key(f"parallel.{k}", allowed)
    return ParallelConfig(**data)


def _unknown_key(dotted: str, allowed: list[str]) -> ScenarioError:
    key = dotted.rsplit(".", 1)[-1]
    close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return ScenarioError(dotted, f"unknown key{hint}; allowed keys: {', '.join(allowed)}")
