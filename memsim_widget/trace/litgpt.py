"""Trace litgpt's own training step: its ``GPT`` (or ``litgpt.lora.GPT``) built from the scenario's dimensions, the
finetune scripts' chunked LM head and ``chunked_cross_entropy``, on fake tensors with the project's tracker.

What runs is litgpt 0.5.13's code (``litgpt/model.py``, ``litgpt/lora.py``, ``litgpt/utils.py``), not a copy:
``finetune/lora.py`` and ``finetune/full.py`` do, per step,

    logits = model(input_ids, lm_head_chunk_size=128)
    logits[-1] = logits[-1][..., :-1, :]
    loss = chunked_cross_entropy(logits, targets[..., 1:])
    fabric.backward(loss); optimizer.step(); optimizer.zero_grad()

and ``logits`` stays bound until the next step's forward has returned (the loop rebinds it), which
:class:`LitgptStep` reproduces. Precision ``bf16`` is Fabric's ``bf16-true`` (the published resource tables'
setting), ``amp-bf16`` its ``bf16-mixed`` (the scripts' default on a bf16 GPU, ``get_default_supported_precision``).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from memsim_widget.errors import ScenarioError

from .run import TraceResult, trace_training

#: litgpt's finetune scripts chunk the LM head into this many tokens (``model(input_ids, lm_head_chunk_size=128)``).
LM_HEAD_CHUNK = 128

#: The HF model types whose layout litgpt's Llama-style config reproduces (RMSNorm, LLaMAMLP, fused qkv, RoPE).
LITGPT_MODEL_TYPES = ("llama", "mistral", "qwen2")

#: peft target names -> litgpt.lora.Config switches (litgpt fuses q, k and v into one ``qkv`` Linear and
#: switches the three MLP Linears together with ``lora_mlp``).
LORA_SWITCHES = {
    "q_proj": "lora_query",
    "k_proj": "lora_key",
    "v_proj": "lora_value",
    "o_proj": "lora_projection",
    "gate_proj": "lora_mlp",
    "up_proj": "lora_mlp",
    "down_proj": "lora_mlp",
    "lm_head": "lora_head",
}


def litgpt_config_kwargs(config: dict[str, Any], seq_len: int) -> dict[str, Any]:
    """``litgpt.Config`` keywords for an HF Llama-style config dict (the preset's dimensions, no download)."""
    mt = config.get("model_type")
    if mt not in LITGPT_MODEL_TYPES:
        raise ScenarioError(
            "framework", f"litgpt traces Llama-style models ({', '.join(LITGPT_MODEL_TYPES)}), not {mt!r}"
        )
    h, nh = config["hidden_size"], config["num_attention_heads"]
    return {
        "name": f"memsim-{mt}",
        "block_size": max(seq_len, 16),
        "vocab_size": config["vocab_size"],
        "padded_vocab_size": config["vocab_size"],
        "n_layer": config["num_hidden_layers"],
        "n_embd": h,
        "n_head": nh,
        "n_query_groups": config.get("num_key_value_heads") or nh,
        "head_size": config.get("head_dim") or h // nh,
        "rotary_percentage": 1.0,
        "parallel_residual": False,
        "bias": False,
        "attn_bias": mt == "qwen2",
        "norm_class_name": "RMSNorm",
        "norm_eps": config.get("rms_norm_eps", 1e-6),
        "mlp_class_name": "LLaMAMLP",
        "intermediate_size": config["intermediate_size"],
        "rope_base": int(config.get("rope_theta", 10000)),
    }


def lora_switches(lora: dict[str, Any]) -> dict[str, Any]:
    """``litgpt.lora.Config`` keywords for the scenario's LoRA (rank, alpha, which weights)."""
    targets = lora.get("target_modules", ["q_proj", "v_proj"])
    names = list(LORA_SWITCHES)[:-1] if targets == "all-linear" else list(targets)
    unknown = [t for t in names if t not in LORA_SWITCHES]
    if unknown:
        raise ScenarioError(
            "lora.targets", f"litgpt's LoRA has no switch for {unknown}; use {list(LORA_SWITCHES)}"
        )
    kw: dict[str, Any] = {
        "lora_r": lora.get("r", 8),
        "lora_alpha": lora.get("lora_alpha", 16),
        "lora_dropout": 0.0,
    }
    for t in names:
        kw[LORA_SWITCHES[t]] = True
    return kw


class LitgptStep(torch.nn.Module):
    """One litgpt finetune step's forward and loss (``finetune/lora.py``): the chunked LM head and
    ``chunked_cross_entropy``; the logits list is kept until the next forward returns, as the loop's ``logits``."""

    def __init__(self, gpt: torch.nn.Module, chunk: int = LM_HEAD_CHUNK) -> None:
        super().__init__()
        self.gpt = gpt
        self.chunk = chunk
        self.held: Any = None

    def forward(self, input_ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The loss of one micro-batch, as litgpt's loop computes it."""
        from litgpt.utils import chunked_cross_entropy

        logits = self.gpt(input_ids, lm_head_chunk_size=self.chunk)
        self.held = logits  # the loop's ``logits`` binding: the previous step's list dies only now
        logits[-1] = logits[-1][..., :-1, :]
        return chunked_cross_entropy(logits, targets[..., 1:])


def _lm_head(model: torch.nn.Module) -> torch.nn.Module:
    """litgpt's output layer (``model.gpt.lm_head`` under the finetune wrapper): where the loss starts."""
    return model.get_submodule("gpt.lm_head")


def trace_litgpt(
    config: dict[str, Any],
    *,
    micro_batch_size: int,
    seq_len: int,
    precision: str = "bf16",
    optimizer: str = "adamw",
    optimizer_impl: str = "foreach",
    gradient_checkpointing: bool = False,
    lora: dict[str, Any] | None = None,
    steps: int = 2,
    fake: bool = True,
    **kwargs: Any,
) -> TraceResult:
    """Trace litgpt's model and finetune loop on ``config``'s dimensions (see the module docstring).

    ``lora``: {"r", "lora_alpha", "target_modules"} as for ``trace_hf``; the adapters take the model's dtype
    (litgpt builds them with the model under Fabric's precision, no fp32 upcast as in peft). Extra keyword
    arguments go to :func:`trace_training`."""
    try:
        import litgpt.lora as litgpt_lora
        from litgpt.config import Config
        from litgpt.model import GPT
    except ImportError as exc:
        raise ScenarioError(
            "framework", f"tracing litgpt needs litgpt installed ({exc.name} is missing)"
        ) from None
    if gradient_checkpointing:
        raise ScenarioError(
            "activation_checkpointing", "litgpt's single-device finetune scripts do not checkpoint"
        )
    notes = [
        "litgpt 0.5.13: GPT with lm_head_chunk_size=128 and chunked_cross_entropy (finetune/lora.py loop)"
    ]
    cfg_kw = litgpt_config_kwargs(config, seq_len)

    def model_factory() -> torch.nn.Module:
        with torch.device("meta") if fake else contextlib.nullcontext():
            if lora:
                cfg = litgpt_lora.Config(**cfg_kw, **lora_switches(lora))
                gpt = litgpt_lora.GPT(cfg)
                litgpt_lora.mark_only_lora_as_trainable(gpt)
            else:
                gpt = GPT(Config(**cfg_kw))
        return LitgptStep(gpt)

    def input_factory() -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.randint(0, config["vocab_size"], (micro_batch_size, seq_len))
        return ids, ids.clone()

    return trace_training(
        model_factory,
        input_factory,
        precision=precision,
        optimizer=optimizer,
        optimizer_impl=optimizer_impl,
        steps=steps,
        fake=fake,
        notes=notes,
        loss_module=_lm_head,
        cast_model=True,  # Fabric's *-true precisions: parameters and buffers in the 16-bit dtype
        **kwargs,
    )
