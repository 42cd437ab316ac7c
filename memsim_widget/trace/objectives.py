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
- KTO (``KTOTrainer._compute_loss``, loss_type ``kto``): b unpaired completions, each with a mismatched "KL"
  completion (the batch's completions cycled by one, ``add_kl_completion_ids``). In order: the policy scores the
  KL batch under ``torch.no_grad()`` (``_compute_kl_logps``: logits, shift, ``selective_log_softmax``, masked sum;
  its logits die on return); the policy's forward on the completion batch, whose ``outputs`` stay referenced to
  the end of the loss; under ``no_grad`` the reference scores the KL batch (``_compute_kl_logps`` again) and then
  the completion batch (``ref_outputs`` also stays referenced to the end), or neither when the batch carries
  precomputed ``ref_logps``/``ref_KL_logps`` (``precompute_ref_log_probs``); a PEFT policy without a
  ``ref_model`` is its own reference with the adapters disabled. The loss ``1 - sigmoid(beta (logratio - kl))``
  per chosen sample, ``1 - sigmoid(beta (kl - logratio))`` per rejected one. The metrics then read the policy's
  logits: ``entropy_from_logits`` (a ``reshape(-1, V)`` of the cut logits, a copy when b > 1, then 128-row
  chunks) and ``index_select`` of the chosen and of the rejected rows (copies), each masked by its completion
  mask (another copy) before a mean.
- PPO (TRL ``experimental/ppo/ppo_trainer.py``, ``PPOTrainer.train``'s inner micro-batch loop): the policy and a
  separate value model (an ``AutoModelForSequenceClassification`` with ``num_labels=1``: its own backbone and a
  scalar ``score`` head, no vocabulary head; the example script loads it from the reward model's checkpoint) are
  wrapped in ``PolicyAndValueWrapper``, one optimizer over both, one backward. Its ``forward`` runs the value
  backbone then ``score`` on its last hidden state, then the policy; both with ``output_hidden_states=True`` and
  without ``use_cache=False`` (and no ``logits_to_keep``: the whole sequence's logits). The loop cuts the logits to
  the response (``[:, context_length - 1 : -1]``), divides that view by the temperature *in place*, takes
  ``selective_log_softmax``, the clipped policy loss plus ``vf_coef`` x the clipped value loss on the value
  head's response positions, ``backward``, ``optimizer.step()``, ``optimizer.zero_grad()``, then the metrics under
  ``no_grad`` (``softmax`` of the cut logits and the entropy), and only then ``del output, vpred_temp, logits, ...``:
  the model outputs (logits and every hidden state of both models) live through backward and the optimizer
  step. Generation, the reference's and the reward model's scoring run before (the rollout phase), under no_grad.
  Gradient checkpointing is enabled on the policy only (the wrapper's ``gradient_checkpointing_enable``).

DPO's, ORPO's and GRPO's forwards pass ``use_cache=False``; KTO's (non-Liger path) and PPO's pass the batch's
``attention_mask`` and no ``use_cache``: HF's default builds a KV cache that the outputs hold, and a mask HF
cannot prove all-ones (a padded batch; always under fake tensors) becomes SDPA's float bias with k and v
repeated to every head.
"""

from __future__ import annotations

import contextlib
import copy
from typing import Any

import torch
import torch.nn.functional as F

from .hf import apply_lora, build_hf_config, build_hf_model, real_mode_shims
from .run import TraceResult, trace_training
from .torch_recipe import precision_dtypes

#: DPO's beta and GRPO's clipping and KL coefficients (TRL defaults; they set no memory).
DPO_BETA = 0.1
GRPO_EPSILON = 0.2
GRPO_BETA = 0.04
TEMPERATURE = 1.0
#: PPO's clip ranges and value-loss coefficient (TRL ``PPOConfig`` defaults), its pad id and masked log-prob.
PPO_CLIP = 0.2
PPO_CLIP_VALUE = 0.2
PPO_VF_COEF = 0.1
PAD_ID = -1
INVALID_LOGPROB = 1.0


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

    #: A transformers (or peft) model: its methods (gradient_checkpointing_enable, disable_adapter,
    #: get_output_embeddings) are not torch.nn.Module's, whose stubs type such attributes as Tensor | Module.
    policy: Any

    def gradient_checkpointing_enable(
        self, gradient_checkpointing_kwargs: dict[str, Any] | None = None
    ) -> None:
        self.policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs)


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
                    assert self.reference is not None, "a separate reference model is built for this ref"
                    ref = self._logps(self.reference, input_ids, loss_mask)
            ref_chosen, ref_rejected = ref.chunk(2)
        margin = (chosen - ref_chosen) - (rejected - ref_rejected)
        return -F.logsigmoid(DPO_BETA * margin).mean()


def _entropy(logits: torch.Tensor, chunk_size: int = 128) -> torch.Tensor:
    """Per-token entropy in 128-row chunks of the flattened logits (TRL ``entropy_from_logits``)."""
    flat = logits.reshape(-1, logits.shape[-1])
    out = []
    for chunk in flat.split(chunk_size, dim=0):
        logps = F.log_softmax(chunk, dim=-1)
        out.append(-(torch.exp(logps) * logps).sum(-1))
    return torch.cat(out).reshape(logits.shape[:-1])


class KTOStep(_Step):
    """One KTO loss on b completions and their mismatched KL completions; the forward returns the loss."""

    def __init__(self, policy: torch.nn.Module, reference: torch.nn.Module | None, ref: str):
        super().__init__()
        self.policy = policy
        self.reference = reference
        self.ref = ref

    @staticmethod
    def _sum_logps(logits: torch.Tensor, input_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        per_token = selective_log_softmax(logits[:, :-1, :], input_ids[:, 1:])
        per_token.masked_fill_(
            mask[:, 1:] == 0, 0.0
        )  # TRL: per_token[mask == 0] = 0.0 (no data-dependent shape)
        return per_token.sum(-1)

    def _kl_logps(self, model: torch.nn.Module, kl_ids: torch.Tensor, kl_mask: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            kl_logits = model(input_ids=kl_ids, attention_mask=torch.ones_like(kl_ids)).logits
        return self._sum_logps(kl_logits, kl_ids, kl_mask)

    @staticmethod
    def _masked_rows(logits: torch.Tensor) -> torch.Tensor:
        """``logits[mask.bool()]`` for a completion mask of ones: a (rows x positions, V) copy (an index_select of
        every position stands in for the boolean index, whose shape depends on the data)."""
        flat = logits.flatten(0, 1)
        return flat.index_select(0, torch.arange(flat.shape[0], device=flat.device))

    def forward(
        self,
        input_ids: torch.Tensor,
        completion_mask: torch.Tensor,
        kl_input_ids: torch.Tensor,
        kl_completion_mask: torch.Tensor,
        chosen_idx: torch.Tensor,
        rejected_idx: torch.Tensor,
        ref_logps: torch.Tensor | None = None,
        ref_kl_logps: torch.Tensor | None = None,
    ) -> torch.Tensor:
        # chosen_idx/rejected_idx: TRL's torch.nonzero of the labels, which the batch carries (fake tensors
        # cannot give a data-dependent shape)
        kl_logps = self._kl_logps(self.policy, kl_input_ids, kl_completion_mask)
        # TRL passes the collator's attention_mask and no use_cache (the config's default builds a KV cache)
        mask_in = torch.ones_like(input_ids)
        outputs = self.policy(input_ids=input_ids, attention_mask=mask_in)
        shift_logits = outputs.logits[:, :-1, :]
        per_token = selective_log_softmax(shift_logits, input_ids[:, 1:])
        per_token.masked_fill_(completion_mask[:, 1:] == 0, 0.0)
        logps = per_token.sum(-1)
        chosen, rejected = logps.index_select(0, chosen_idx), logps.index_select(0, rejected_idx)
        ref_outputs = None
        if self.ref == "precomputed":
            assert ref_logps is not None and ref_kl_logps is not None, (
                "the batch carries precomputed log-probs"
            )
            ref_all, ref_kl = ref_logps, ref_kl_logps
        else:
            with torch.no_grad():
                if self.ref == "shared_base":
                    with self.policy.disable_adapter():
                        ref_kl = self._kl_logps(self.policy, kl_input_ids, kl_completion_mask)
                        ref_outputs = self.policy(input_ids=input_ids, attention_mask=mask_in)
                else:
                    assert self.reference is not None, "a separate reference model is built for this ref"
                    ref_kl = self._kl_logps(self.reference, kl_input_ids, kl_completion_mask)
                    ref_outputs = self.reference(input_ids=input_ids, attention_mask=mask_in)
            ref_all = self._sum_logps(ref_outputs.logits, input_ids, completion_mask)
        ref_chosen, ref_rejected = ref_all.index_select(0, chosen_idx), ref_all.index_select(0, rejected_idx)
        kl = (kl_logps - ref_kl).mean().detach().clamp(min=0)
        chosen_losses = 1 - torch.sigmoid(DPO_BETA * ((chosen - ref_chosen) - kl))
        rejected_losses = 1 - torch.sigmoid(DPO_BETA * (kl - (rejected - ref_rejected)))
        losses = torch.cat((chosen_losses, rejected_losses), 0)
        # the metrics TRL logs, with both models' outputs still referenced
        mask = completion_mask[:, 1:]
        (_entropy(shift_logits.detach()) * mask).sum()
        chosen_logits = shift_logits.detach().index_select(0, chosen_idx)
        rejected_logits = shift_logits.detach().index_select(0, rejected_idx)
        self._masked_rows(chosen_logits).mean(-1).sum()
        self._masked_rows(rejected_logits).mean(-1).sum()
        del chosen_logits, rejected_logits, ref_outputs, outputs
        return losses.nanmean()


class PPOStep(_Step):
    """One PPO micro-batch of TRL's loop: the value model and the policy forward, the clipped losses; the model
    outputs are kept on the module until the next step's forward starts, where the previous step's no-grad
    metrics run first (TRL: after ``zero_grad``, before the ``del``)."""

    def __init__(
        self,
        policy: torch.nn.Module,
        value_model: torch.nn.Module,
        completion_len: int,
        frozen: list[torch.nn.Module],
    ):
        super().__init__()
        self.policy = policy
        # a transformers model with a value head: base_model_prefix and score are not Module's (see _Step.policy)
        self.value_model: Any = value_model
        # the reference and reward models stay on the GPU through training (``.to(device)`` in ``__init__``);
        # they run in the rollout phase only
        self.frozen = torch.nn.ModuleList(frozen)
        self.completion_len = completion_len
        self._kept: tuple[Any, ...] | None = None

    def _metrics(self) -> None:
        if self._kept is None:
            return
        logits = self._kept[0]
        with torch.no_grad():
            prob_dist = F.softmax(logits, dim=-1)
            (torch.logsumexp(logits, dim=-1) - torch.sum(prob_dist * logits, dim=-1)).mean()
            del prob_dist
        self._kept = None

    def forward(
        self,
        query_responses: torch.Tensor,
        old_logps: torch.Tensor,
        advantages: torch.Tensor,
        returns: torch.Tensor,
        values: torch.Tensor,
        padding_mask: torch.Tensor,
        padding_mask_p1: torch.Tensor,
    ) -> torch.Tensor:
        self._metrics()
        c = self.completion_len
        ctx = query_responses.shape[1] - c
        attention_mask = query_responses != PAD_ID
        position_ids = attention_mask.cumsum(1) - attention_mask.long()
        input_ids = torch.masked_fill(query_responses, ~attention_mask, 0)
        kw = {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "position_ids": position_ids,
            "return_dict": True,
            "output_hidden_states": True,
        }
        backbone = getattr(self.value_model, self.value_model.base_model_prefix)
        v_out = backbone(**kw)
        vpred_temp = self.value_model.score(v_out.hidden_states[-1])
        output = self.policy(**kw)
        logits = output.logits[:, ctx - 1 : -1]
        logits /= TEMPERATURE + 1e-7
        new_logps = selective_log_softmax(logits, query_responses[:, ctx:])
        new_logps = torch.masked_fill(new_logps, padding_mask, INVALID_LOGPROB)
        vpred = vpred_temp[:, ctx - 1 : -1].squeeze(-1)
        vpred = torch.masked_fill(vpred, padding_mask_p1, 0)
        vclipped = torch.clamp(vpred, values - PPO_CLIP_VALUE, values + PPO_CLIP_VALUE)
        vf1, vf2 = torch.square(vpred - returns), torch.square(vclipped - returns)
        vf_loss = 0.5 * _masked_mean(torch.max(vf1, vf2), ~padding_mask_p1)
        ratio = torch.exp(new_logps - old_logps)
        pg1 = -advantages * ratio  # per-token (GAE) advantages
        pg2 = -advantages * torch.clamp(ratio, 1.0 - PPO_CLIP, 1.0 + PPO_CLIP)
        pg_loss = _masked_mean(torch.max(pg1, pg2), ~padding_mask)
        self._kept = (logits, output, v_out, vpred_temp)
        return pg_loss + PPO_VF_COEF * vf_loss


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (values * mask).sum() / mask.sum()


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


def _ppo_step(
    policy: torch.nn.Module,
    cfg: Any,
    reference: str,
    wdtype: torch.dtype,
    attention: str,
    completion_len: int,
) -> PPOStep:
    """PPO's step: the policy, a value model (a sequence classifier with one label), and the frozen reward
    model and reference (``reference`` gpu) that stay on the GPU; built on the current (meta) device."""
    import transformers
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    vcfg = copy.deepcopy(cfg)
    vcfg.num_labels = 1
    vcfg.use_cache = True  # TRL's forward passes no use_cache: the config's default (HF: true)

    def classifier() -> torch.nn.Module:
        with unset_fake_temporarily():
            return transformers.AutoModelForSequenceClassification.from_config(
                vcfg, dtype=wdtype, attn_implementation=attention
            )

    frozen = [] if reference == "none" else [classifier()]  # the reward model
    if reference == "gpu":
        frozen.append(build_hf_model(cfg, wdtype, attention))
    for m in frozen:
        m.requires_grad_(False)
        m.eval()
    return PPOStep(policy, classifier(), completion_len, frozen)


def _step_model(
    cfg: Any,
    *,
    objective: str,
    reference: str,
    lora: dict[str, Any] | None,
    wdtype: torch.dtype,
    attention: str,
    completion_len: int,
    notes: list[str],
) -> torch.nn.Module:
    """The objective's step module on the meta device: the policy (with LoRA adapters when asked) and the
    models the step holds besides it (a frozen reference copy for DPO/KTO ``gpu``; PPO's value and reward)."""
    with torch.device("meta"):
        policy = build_hf_model(cfg, wdtype, attention)
        if lora:
            policy = apply_lora(policy, lora, notes)
        if objective == "grpo":
            return GRPOStep(policy, completion_len, GRPO_BETA)
        if objective == "ppo":
            return _ppo_step(policy, cfg, reference, wdtype, attention, completion_len)
        ref_model = None
        if objective in ("dpo", "kto") and reference == "gpu":
            ref_model = build_hf_model(cfg, wdtype, attention)
            ref_model.requires_grad_(False)
            ref_model.eval()
        if objective == "kto":
            return KTOStep(policy, ref_model, reference)
        return PreferenceStep(policy, ref_model, objective, reference)


def _step_batch(
    objective: str, reference: str, *, n: int, seq_len: int, completion_len: int, vocab: int, pairs: int
) -> dict[str, torch.Tensor]:
    """One micro-batch of ``n`` sequences of ``seq_len`` tokens as the objective's step reads it (``pairs``:
    the preference pairs, for DPO's precomputed reference log-probs)."""
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
    if objective == "ppo":
        c = completion_len
        return {
            "query_responses": ids,
            "old_logps": torch.randn(n, c),
            "advantages": torch.randn(n, c),
            "returns": torch.randn(n, c),
            "values": torch.randn(n, c),
            "padding_mask": torch.zeros(n, c, dtype=torch.bool),
            "padding_mask_p1": torch.zeros(n, c, dtype=torch.bool),
        }
    if objective == "kto":
        # every sample desirable: the worst batch for the metrics' copies (one label holds every row)
        batch = {
            "input_ids": ids,
            "completion_mask": torch.ones(n, seq_len, dtype=torch.int64),
            "kl_input_ids": torch.roll(ids, 1, dims=0),
            "kl_completion_mask": torch.ones(n, seq_len, dtype=torch.int64),
            "chosen_idx": torch.arange(n),
            "rejected_idx": torch.zeros(0, dtype=torch.int64),
        }
        if reference == "precomputed":
            batch["ref_logps"] = torch.randn(n)
            batch["ref_kl_logps"] = torch.randn(n)
        return batch
    batch = {"input_ids": ids, "loss_mask": torch.ones(n, seq_len, dtype=torch.int64)}
    if objective == "dpo" and reference == "precomputed":
        batch["ref_chosen_logps"] = torch.randn(pairs)
        batch["ref_rejected_logps"] = torch.randn(pairs)
    return batch


def _policy_head(step: torch.nn.Module) -> torch.nn.Module | None:
    """The policy's output embeddings: after their forward the phase is "loss" (None when it has none)."""
    policy: Any = step.policy  # a transformers model (see _Step.policy)
    try:
        return policy.get_output_embeddings()
    except (AttributeError, NotImplementedError):
        return None


def _output_is_loss(out: Any, _batch: Any) -> torch.Tensor:
    """The step modules' forward returns the loss."""
    return out


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
    if objective not in ("dpo", "orpo", "kto", "grpo", "ppo"):
        raise ValueError(f"objective {objective!r} is not traced; traced: dpo, orpo, kto, grpo, ppo")
    notes: list[str] = [f"objective {objective} (TRL's loop, our code); reference {reference}"]
    wdtype, _amp = precision_dtypes(precision)
    cfg = build_hf_config(config, attention)
    cfg.use_cache = objective in ("kto", "ppo")  # TRL's KTO and PPO forwards pass no use_cache=False

    def model_factory() -> torch.nn.Module:
        return _step_model(
            cfg, objective=objective, reference=reference, lora=lora, wdtype=wdtype, attention=attention,
            completion_len=completion_len, notes=notes,
        )  # fmt: skip

    per_sample = {"dpo": 2, "orpo": 2, "kto": 1, "ppo": 1}.get(objective, num_generations)
    n = sequences if sequences is not None else micro_batch_size * per_sample
    vocab = cfg.vocab_size

    def make_batch() -> dict[str, torch.Tensor]:
        return _step_batch(
            objective, reference, n=n, seq_len=seq_len, completion_len=completion_len, vocab=vocab,
            pairs=micro_batch_size,
        )  # fmt: skip

    with real_mode_shims(True, notes), contextlib.ExitStack():
        return trace_training(
            model_factory,
            make_batch,
            precision=precision,
            optimizer=optimizer,
            optimizer_impl=optimizer_impl,
            steps=steps,
            gradient_checkpointing=gradient_checkpointing,
            loss_module=_policy_head,
            loss_fn=_output_is_loss,
            notes=notes,
            cast_model=False,
            **kwargs,
        )
