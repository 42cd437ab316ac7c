"""Trace a preference (DPO, ORPO) or GRPO training step on fake tensors, written as the loop TRL runs.

Our own code, following the order of operations in TRL's trainers (facts, not copied code):

- DPO (``DPOTrainer.get_batch_loss_metrics``): the policy runs forward on the chosen and rejected sequences
  concatenated into one batch of 2b (``concatenated_forward``), per-token log-probs come from
  ``selective_log_softmax`` (for 16-bit logits: a log-softmax per row, then a gather), summed over the
  completion mask; *then* the reference model runs forward on the same batch under ``torch.no_grad()``
  (``compute_ref_log_probs``; a PEFT policy without a ``ref_model`` uses its own base with the adapters
  disabled), unless the batch carries precomputed reference log-probs; the sigmoid loss
  ``-logsigmoid(beta x margin)``. ORPO: the same concatenated forward, no reference, the odds-ratio term plus
  the chosen sequences' NLL.
- GRPO (``GRPOTrainer._compute_loss``): the micro-batch holds b x G prompt + completion sequences; the policy
  runs forward with ``logits_to_keep = C + 1``, the logits are cut to the C completion positions and divided by
  the sampling temperature, ``selective_log_softmax`` gives per-token log-probs; the clipped ratio to the old
  log-probs, plus beta x the k3 KL estimate to the reference log-probs, which the generation phase computed
  before the step (they arrive with the batch: no reference forward in the training step).

Every forward passes ``use_cache=False`` (TRL's trainers do not keep a KV cache in training).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch.nn.functional as F

from .hf import _apply_lora, _real_mode_shims, build_hf_config, build_hf_model
from .run import TraceResult, _precision_dtypes, trace_training

#: DPO's beta and GRPO's clipping and KL coefficients (TRL defaults; they set no memory).
DPO_BETA = 0.1
GRPO_EPSILON = 0.2
GRPO_BETA = 0.04
TEMPERATURE = 1.0


def selective_log_softmax(logits: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Log-probs of ``index`` under ``logits``: for fp32 a gather minus a per-row logsumexp, for 16-bit logits a
    log-softmax per row then a gather (TRL ``trainer/utils.selective_log_softmax``: logsumexp is unstable in
    bf16)."""
    if logits.dtype in (torch.float32, torch.float64):
        picked = torch.gather(logits, dim=-1, index=index.unsqueeze(-1)).squeeze(-1)
        lse = torch.stack([torch.logsumexp(row, dim=-1) for row in logits])
        return picked - lse
    rows = []
    for row_logits, row_index in zip(logits, index, strict=True):
        row = F.log_softmax(row_logits, dim=-1)
        rows.append(row.gather(dim=-1, index=row_index.unsqueeze(-1)).squeeze(-1))
    return torch.stack(rows)


class _Step(torch.nn.Module):
    """A training step around a policy: gradient checkpointing is the policy's (HF's, one per layer)."""

    policy: torch.nn.Module

    def gradient_checkpointing_enable(self) -> None:
        self.policy.gradient_checkpointing_enable()


class PreferenceStep(_Step):
    """One DPO/ORPO loss on a concatenated chosen + rejected batch; the forward returns the loss."""

    def __init__(self, policy: torch.nn.Module, reference: torch.nn.Module | None, objective: str, ref: str):
        super().__init__()
        self.policy = policy
        self.reference = reference  # a separate frozen copy (its parameters count as the step's)
        self.objective = objective
        self.ref = ref

    def _logps(self, model: torch.nn.Module, input_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        logits = model(input_ids=input_ids, use_cache=False).logits
        labels = torch.roll(input_ids, shifts=-1, dims=1)
        per_token = selective_log_softmax(logits, labels)
        del logits
        return (per_token * mask).sum(-1)

    def forward(
        self, input_ids: torch.Tensor, loss_mask: torch.Tensor, **ref_logps: torch.Tensor
    ) -> torch.Tensor:
        logps = self._logps(self.policy, input_ids, loss_mask)
        chosen, rejected = logps.chunk(2)
        if self.objective == "orpo":
            n = loss_mask.shape[0] // 2
            nll = -(chosen / loss_mask[:n].sum(-1)).mean()
            log_odds = (chosen - rejected) - (
                torch.log1p(-torch.exp(chosen.clamp(max=-1e-4)))
                - torch.log1p(-torch.exp(rejected.clamp(max=-1e-4)))
            )
            return nll - DPO_BETA * F.logsigmoid(log_odds).mean()
        if self.ref == "precomputed":
            ref_chosen, ref_rejected = ref_logps["ref_chosen_logps"], ref_logps["ref_rejected_logps"]
        else:
            with torch.no_grad():
                if self.ref == "shared_base":
                    with self.policy.disable_adapter():
                        ref = self._logps(self.policy, input_ids, loss_mask)
                else:
                    ref = self._logps(self.reference, input_ids, loss_mask)
            ref_chosen, ref_rejected = ref.chunk(2)
        margin = (chosen - ref_chosen) - (rejected - ref_rejected)
        return -F.logsigmoid(DPO_BETA * margin).mean()


class GRPOStep(_Step):
    """One GRPO loss on b x G prompt + completion sequences; the forward returns the loss."""

    def __init__(self, policy: torch.nn.Module, completion_len: int, beta: float):
        super().__init__()
        self.policy = policy
        self.completion_len = completion_len
        self.beta = beta

    def forward(
        self,
        input_ids: torch.Tensor,
        completion_mask: torch.Tensor,
        advantages: torch.Tensor,
        old_logps: torch.Tensor,
        ref_logps: torch.Tensor | None = None,
    ) -> torch.Tensor:
        c = self.completion_len
        logits = self.policy(input_ids=input_ids, use_cache=False, logits_to_keep=c + 1).logits
        logits = logits[:, :-1, :]  # the last position predicts a token not in the batch
        logits = logits[:, -c:]
        logits = logits / TEMPERATURE
        logps = selective_log_softmax(logits, input_ids[:, -c:])
        del logits
        ratio = torch.exp(logps - old_logps)
        clipped = torch.clamp(ratio, 1 - GRPO_EPSILON, 1 + GRPO_EPSILON)
        a = advantages.unsqueeze(1)
        per_token = -torch.min(ratio * a, clipped * a)
        if ref_logps is not None:
            per_token = per_token + self.beta * (torch.exp(ref_logps - logps) - (ref_logps - logps) - 1)
        return ((per_token * completion_mask).sum(-1) / completion_mask.sum(-1).clamp(min=1.0)).mean()


def trace_objective(
    config: dict[str, Any],
    *,
    objective: str,
    micro_batch_size: int,
    seq_len: int,
    reference: str = "gpu",
    num_generations: int = 8,
    completion_len: int = 512,
    sequences: int | None = None,
    precision: str = "bf16",
    optimizer: str = "adamw",
    optimizer_impl: str = "foreach",
    attention: str = "sdpa",
    gradient_checkpointing: bool = False,
    lora: dict[str, Any] | None = None,
    steps: int = 2,
    **kwargs: Any,
) -> TraceResult:
    """Trace ``steps`` DPO, ORPO or GRPO training steps of the transformers model built from ``config``.

    ``micro_batch_size`` counts preference pairs (DPO/ORPO: 2b sequences) or prompts (GRPO: b x G sequences of
    ``seq_len`` tokens, the last ``completion_len`` of them generated). ``reference``: ``gpu`` (a separate frozen
    copy in the weight dtype), ``precomputed``, ``shared_base`` (a LoRA policy with its adapters disabled) or
    ``none``; for GRPO anything but ``none`` means beta > 0 with reference log-probs in the batch. ``sequences``
    (GRPO) sets the micro-batch's completions directly (TRL's ``per_device_train_batch_size``).
    """
    if objective not in ("dpo", "orpo", "grpo"):
        raise ValueError(f"objective {objective!r} is not traced; traced: dpo, orpo, grpo")
    notes: list[str] = [f"objective {objective} (TRL's loop, our code); reference {reference}"]
    wdtype, _amp = _precision_dtypes(precision)
    cfg = build_hf_config(config, attention)
    cfg.use_cache = False

    def model_factory() -> torch.nn.Module:
        with torch.device("meta"):
            policy = build_hf_model(cfg, wdtype, attention)
            if lora:
                policy = _apply_lora(policy, lora, notes)
            if objective == "grpo":
                return GRPOStep(policy, completion_len, GRPO_BETA)
            ref_model = None
            if objective == "dpo" and reference == "gpu":
                ref_model = build_hf_model(cfg, wdtype, attention)
                ref_model.requires_grad_(False)
                ref_model.eval()
            return PreferenceStep(policy, ref_model, objective, reference)

    per_sample = 2 if objective in ("dpo", "orpo") else num_generations
    n = sequences if sequences is not None else micro_batch_size * per_sample
    vocab = cfg.vocab_size

    def make_batch() -> dict[str, torch.Tensor]:
        ids = torch.randint(0, vocab, (n, seq_len))
        if objective == "grpo":
            batch = {
                "input_ids": ids,
                "completion_mask": torch.ones(n, completion_len, dtype=torch.int64),
                "advantages": torch.randn(n),
                "old_logps": torch.randn(n, completion_len),
            }
            if reference != "none":
                batch["ref_logps"] = torch.randn(n, completion_len)
            return batch
        batch = {"input_ids": ids, "loss_mask": torch.ones(n, seq_len, dtype=torch.int64)}
        if objective == "dpo" and reference == "precomputed":
            batch["ref_chosen_logps"] = torch.randn(micro_batch_size)
            batch["ref_rejected_logps"] = torch.randn(micro_batch_size)
        return batch

    def loss_module(step: torch.nn.Module) -> torch.nn.Module | None:
        try:
            return step.policy.get_output_embeddings()
        except (AttributeError, NotImplementedError):
            return None

    def loss_fn(out: Any, _batch: Any) -> torch.Tensor:
        return out

    with _real_mode_shims(True, notes), contextlib.ExitStack():
        return trace_training(
            model_factory,
            make_batch,
            precision=precision,
            optimizer=optimizer,
            optimizer_impl=optimizer_impl,
            steps=steps,
            gradient_checkpointing=gradient_checkpointing,
            loss_module=loss_module,
            loss_fn=loss_fn,
            notes=notes,
            cast_model=False,
            **kwargs,
        )
