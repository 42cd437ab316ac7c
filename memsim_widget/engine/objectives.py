"""Preference and RL objectives: the extra models, the sequences per sample, and their loss's logits.

One training step of DPO, ORPO, KTO, GRPO or PPO is an SFT step on more sequences with another loss, plus the
frozen (and, for PPO, trainable) models beside the policy. Facts from TRL's trainers (v0.2x):

- DPO/ORPO concatenate chosen and rejected sequences into one batch of 2b (``concatenated_forward``); GRPO trains
  on b x G prompt + completion sequences (``per_device_train_batch_size`` completions, ``num_generations`` G per
  prompt) and asks the model for the logits of the completion only (``logits_to_keep = C + 1``), then cuts the
  last position and divides by the temperature (a new tensor).
- Per-token log-probs come from ``selective_log_softmax``: for 16-bit logits a log-softmax per sequence, whose
  output (compute dtype) is saved for backward, then a gather; the backward stacks the per-row gradients
  (``unbind``), and for GRPO each slice of the logits adds its own ``slice_backward`` buffer (all traced).
- DPO's reference model runs forward *after* the policy, under ``no_grad``, with every policy activation alive
  (``get_batch_loss_metrics`` -> ``compute_ref_log_probs``): its logits and two rows of log-softmax (the loop
  variable keeps the previous row) are the reference's transients; a PEFT policy without ``ref_model`` is its
  own reference with the adapters disabled (no extra weights). GRPO's reference log-probs are computed in the
  generation phase (``_generate_and_score_completions``), outside the training step; TRL's default beta = 0
  loads no reference at all.
- PPO (TRL ``PPOTrainer``, OpenRLHF): a policy and a value model trained together (``PolicyAndValueWrapper``:
  one backward), a frozen reference and a frozen reward model. Formula-only: the value model is taken as a
  copy of the policy's architecture and method (TRL builds it from the reward model's checkpoint) whose
  layers save what the policy's save; its scalar head's outputs are ignored.

Known misses: KTO's and PPO's steps are not traced (formula-only, docs/fidelity.md); fp32 and autocast logits take
the 16-bit rule with 4-byte elements (TRL's fp32 path saves the logits for a per-row logsumexp instead).
"""

from __future__ import annotations

from dataclasses import replace

from memsim_widget.engine.activations import ActivationBudget, Term
from memsim_widget.engine.context import Context, Stage
from memsim_widget.engine.items import Item
from memsim_widget.engine.states import StateBudget
from memsim_widget.engine.timeline import Moment
from memsim_widget.scenario import Scenario

#: Objectives whose training step has a frozen reference model's forward inside it (not GRPO/PPO: theirs runs in
#: the generation phase).
REFERENCE_IN_STEP = ("dpo", "kto")
#: The phase of each moment: the rollout phase holds generation and scoring, the training phase the step.
ROLLOUT_MOMENTS = ("rollout_generate", "rollout_score")


def phase_of(moment: str) -> str:
    """``rollout`` for the generation-phase moments, ``training`` for the step's."""
    return "rollout" if moment in ROLLOUT_MOMENTS else "training"


def training_scenario(sc: Scenario) -> Scenario:
    """The SFT step the engine's core simulates for ``sc``: the same run on micro_batch_size x sequences per
    sample sequences (the objective's own loss and models are added by ``apply``)."""
    if sc.objective_name == "sft":
        return sc
    return replace(sc, micro_batch_size=sc.sequences_per_micro_batch, objective=None, rl=None)


def logit_tokens(ctx: Context, sc: Scenario) -> tuple[int, int]:
    """(tokens whose logits the model computes, tokens whose log-probs the loss takes) on one rank."""
    T = ctx.tokens // ctx.par.cp
    if sc.objective_name in ("grpo", "ppo"):
        B = ctx.scenario.micro_batch_size
        C = sc.rl_config.completion_len
        return B * (C + 1), B * C
    return T, T


def loss_terms(ctx: Context, sc: Scenario, acts: ActivationBudget) -> ActivationBudget:
    """``acts`` with the loss's logits terms replaced by ``selective_log_softmax``'s (traced for 16-bit logits)."""
    V = ctx.arch.vocab_size
    if not V or sc.loss == "chunked":
        return acts
    le = 4 if ctx.recipe.fp32_compute else 2
    Tk, Tc = logit_tokens(ctx, sc)
    rows = ctx.scenario.micro_batch_size
    out = replace(acts)
    if sc.objective_name in ("grpo", "ppo"):
        # the logits, then their tempered copy (the original dies when the name is rebound): the larger pair
        out.loss_forward = [
            Term(
                "logits of the completion (logits_to_keep = C + 1), then their tempered copy",
                le * Tk * V,
                f"{le} B x b(C+1) x V",
                1,
            )
        ]
        out.loss_saved = [
            Term("per-row log-softmax saved (selective_log_softmax)", le * Tc * V, f"{le} B x bC x V", rows)
        ]
        # backward: the slice of the last position and the completion slice each make a zeros buffer
        out.loss_backward = [
            Term(
                "slice_backward buffers of the cut logits",
                le * Tk * V,
                f"{le} B x b(C+1) x V (+ the saved rows' size)",
                2,
            )
        ]
    else:
        out.loss_forward = [Term("logits", le * Tk * V, f"{le} B x T x V, V={V}", 1)]
        out.loss_saved = [
            Term("per-row log-softmax saved (selective_log_softmax)", le * Tc * V, f"{le} B x T x V", rows)
        ]
        out.loss_backward = [
            Term(
                "per-row log-softmax gradients and their stack",
                le * Tc * V,
                f"{le} B x T x V (+ the saved rows' size)",
                rows + 1,
            )
        ]
    out.output_logits = []
    if sc.objective_name == "ppo":  # the value model's layers save what the policy's save (formula-only)
        out.per_layer = acts.per_layer + value_activations(acts)
    return out


def extra_states(ctx: Context, sc: Scenario, stage: Stage, states: StateBudget) -> None:
    """Add the frozen reference/reward models' weights and PPO's value model states to ``states`` (in place)."""
    obj, ref = sc.objective_name, sc.reference
    frozen: list[tuple[str, str]] = []
    if ref in ("gpu", "offload"):
        frozen.append(("reference model", ref))
    if obj == "ppo":
        frozen.append(("reward model", "offload" if ref == "offload" else "gpu"))
    for label, where in frozen:
        items = _frozen_weights(ctx, states, label)
        if where == "offload":
            states.host.extend(replace(i, item=i.item + " (offloaded)", level="host") for i in items)
        else:
            states.persistent.extend(items)
    from memsim_widget.engine.rollout import resident_items

    gpu, host = resident_items(ctx, sc)  # a colocated vLLM engine through the training step
    if obj == "ppo":  # the value model trains beside the policy: weights, gradients, optimizer states
        states.persistent.extend(
            Item(
                i.category,
                f"value model: {i.item}",
                i.bytes,
                f"as the policy's: {i.formula}",
                i.level,
                i.tensors,
            )
            for i in list(states.persistent)
            if not i.item.startswith(("reference model", "reward model"))
        )
        states.grads.extend(replace(i, item=f"value model: {i.item}") for i in list(states.grads))
        states.grads_but_bottom.extend(
            replace(i, item=f"value model: {i.item}") for i in list(states.grads_but_bottom)
        )
    states.persistent.extend(gpu)
    states.host.extend(host)


def _frozen_weights(ctx: Context, states: StateBudget, label: str) -> list[Item]:
    """A frozen copy of the policy's weights on this rank, as the policy holds them (dtype, tp/pp/ZeRO-3 shards,
    QLoRA's NF4 base), without its LoRA adapters: TRL loads the reference like the policy and prepares it with
    the same sharding (``prepare_deepspeed`` / ``prepare_fsdp``)."""
    return [
        Item(
            "parameters",
            f"{label} weights (frozen): {i.item}",
            i.bytes,
            f"as the policy's: {i.formula}",
            "tensor",
            i.tensors,
        )
        for i in states.persistent
        if i.category == "parameters"
        and i.level == "tensor"
        and "LoRA" not in i.item
        and not i.item.startswith(("reference model", "reward model", "value model", "vLLM"))
    ]


def value_activations(acts: ActivationBudget) -> list[Term]:
    """PPO: the value model's saved activations, taken as the policy's per layer (formula-only)."""
    return [replace(t, name=f"value model: {t.name}") for t in acts.per_layer]


def reference_moment(
    ctx: Context, sc: Scenario, acts: ActivationBudget, forward_end: Moment, states: StateBudget
) -> Moment | None:
    """The reference's forward inside the step (DPO, KTO): the policy's forward-end memory less its logits
    (``concatenated_forward`` has returned) plus the reference's transients; None when no reference runs."""
    if sc.objective_name not in REFERENCE_IN_STEP or sc.reference not in ("gpu", "offload", "shared_base"):
        return None
    gone = {t.name for t in acts.loss_forward}
    kept = tuple(i for i in forward_end.items if not (i.category == "activations" and i.item in gone))
    loaded = [  # an offloaded reference comes back to the GPU for its forward (OpenRLHF --ref_reward_offload)
        replace(i, item=i.item.replace(" (offloaded)", " (loaded for its forward)"), level="tensor")
        for i in states.host
        if i.item.startswith("reference model")
    ]
    return Moment("reference_forward", kept + tuple(reference_forward(ctx, sc)) + tuple(loaded))


def reference_forward(ctx: Context, sc: Scenario) -> list[Item]:
    """Transients of the reference's no-grad forward in the step (DPO, KTO): its logits, two rows of log-softmax
    (an offloaded reference's weights come back in ``reference_moment``)."""
    V = ctx.arch.vocab_size
    le = 4 if ctx.recipe.fp32_compute else 2
    T = ctx.tokens // ctx.par.cp
    s = T // ctx.scenario.micro_batch_size
    rows = min(2, ctx.scenario.micro_batch_size)
    mult = 2 if sc.objective_name == "kto" else 1  # KTO's reference also scores the KL (mismatched) batch
    e = 4 if ctx.recipe.fp32_compute else 2
    Tl = T * mult
    # in a layer (under no_grad nothing is saved): the MLP's gate activation, up projection and their product,
    # beside the layer input the caller holds, the residual, the normed input and the embeddings output
    n_mlp = 3 if ctx.arch.mlp_activation in ("swiglu", "geglu") else 2
    I, h = ctx.arch.intermediate_size // ctx.par.tp, ctx.arch.hidden_size
    layer = [
        Item(
            "temporaries",
            "reference forward: one layer's MLP working set (no_grad)",
            n_mlp * e * Tl * I + 4 * e * Tl * h,
            f"{n_mlp} x {e} B x T x I + 4 x {e} B x T x h",
            "tensor",
            n_mlp + 4,
        )
    ]
    head = [
        Item(
            "temporaries",
            "reference logits (no_grad)",
            le * Tl * V,
            f"{le} B x T x V" + (" x 2" if mult > 1 else ""),
            "tensor",
            1,
        ),
        Item(
            "temporaries",
            "reference log-softmax rows (the loop keeps the previous row)",
            le * rows * s * V,
            f"{rows} x {le} B x s x V",
            "tensor",
            rows,
        ),
    ]
    # the larger of the two instants: inside a layer, or at the head's log-softmax
    out = max(layer, head, key=lambda x: sum(i.bytes for i in x))
    return out


def phase_moments(
    ctx: Context,
    sc: Scenario,
    stage: Stage,
    states: StateBudget,
    acts: ActivationBudget,
    overhead: list[Item],
    step: list[Moment],
) -> list[Moment]:
    """The moments an objective adds to the step's: the reference's forward inside it, and the rollout phase's
    generation and scoring (``engine/rollout.py``)."""
    from memsim_widget.engine.rollout import rollout_moments

    out = []
    fwd = next(m for m in step if m.name == "forward_end")
    ref = reference_moment(ctx, sc, acts, fwd, states)
    if ref is not None:
        out.append(ref)
    out += rollout_moments(ctx, sc, stage, states, overhead)
    return out
