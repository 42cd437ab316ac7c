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
- KTO (TRL ``KTOTrainer``): b unpaired completions; the policy's and the reference's no-grad passes over the
  mismatched KL batch come and go before the loss; the policy's ``outputs`` (logits, KV cache: TRL passes the
  batch's attention mask and no ``use_cache=False``) and the reference's ``ref_outputs`` stay referenced to the
  end of the loss, where the logged metrics copy the policy's cut logits (``kto_metrics_moment``; traced).
- PPO (TRL ``experimental/ppo`` ``PPOTrainer``; chosen over OpenRLHF because every other objective here follows
  TRL, and both train a separate critic): a policy and a value model trained together
  (``PolicyAndValueWrapper``: one optimizer, one backward), a frozen reference and a frozen reward model resident
  through training. The value and reward models are ``AutoModelForSequenceClassification`` (num_labels=1): the
  backbone plus an h x 1 ``score``, no vocabulary head; the engine takes the policy's architecture for them
  (TRL's example loads both from the reward model's checkpoint). PEFT applies to the policy only: the value model
  is fully trained. The loop holds ``output`` (the whole sequence's logits, every hidden state, the KV cache) to
  after the optimizer step. Traced (``trace/objectives.py``).

Known misses: PPO with gradient checkpointing (TRL checkpoints the policy only; the engine checkpoints the value
model's layers too; not traced); fp32 and autocast logits take the 16-bit rule with 4-byte elements (TRL's fp32
path saves the logits for a per-row logsumexp instead); a value/reward model of another architecture than the
policy's.
"""

from __future__ import annotations

from dataclasses import replace

from memsim_widget.engine.activations.budget import ActivationBudget, Term
from memsim_widget.engine.context import Context, Stage
from memsim_widget.engine.items import Category, Item, Level
from memsim_widget.engine.states import StateBudget, model_states
from memsim_widget.engine.step.timeline import Moment
from memsim_widget.errors import ScenarioError
from memsim_widget.names import Name
from memsim_widget.rules import ScenarioView
from memsim_widget.rules.multimodal import SFT_ONLY
from memsim_widget.scenario import Scenario

#: Objectives whose training step has a frozen reference model's forward inside it (not GRPO/PPO: theirs runs in
#: the generation phase).
REFERENCE_IN_STEP = ("dpo", "kto")
#: The phase of each moment: the rollout phase holds generation and scoring, the training phase the step.
ROLLOUT_MOMENTS = ("rollout_generate", "rollout_score")


class Phase(Name):
    """The two phases of a preference or RL step: generation and scoring (``rollout``), and the training step."""

    TRAINING = "training"
    ROLLOUT = "rollout"


def phase_of(moment: str) -> Phase:
    """``rollout`` for the generation-phase moments, ``training`` for the step's."""
    return Phase.ROLLOUT if moment in ROLLOUT_MOMENTS else Phase.TRAINING


def training_scenario(sc: Scenario) -> Scenario:
    """The SFT step the engine's core simulates for ``sc``: the same run on micro_batch_size x sequences per
    sample sequences (the objective's own loss and models are added by ``apply``)."""
    if sc.objective_name == "sft":
        return sc
    # PPO's loop keeps the model outputs (logits, hidden states, the KV cache HF builds) until after the
    # optimizer step (TRL ``del output, ...`` at the end of the mini-batch)
    lifetime = "step" if sc.objective_name == "ppo" else sc.output_lifetime
    return replace(
        sc, micro_batch_size=sc.sequences_per_micro_batch, objective=None, rl=None, output_lifetime=lifetime
    )


def check_model(ctx: Context, sc: Scenario) -> None:
    """Refuse a preference/RL objective on a model its rules do not cover: multimodal (the table's rule,
    ``rules/multimodal.py``: the rules know text sequences only) and calibrated (the fit traced a supervised step
    only). ``ctx`` is the SFT step's (``training_scenario``), so the objective is read from ``sc``."""
    SFT_ONLY.check(ScenarioView(sc, arch=ctx.arch))
    name, model_type = sc.objective_name, ctx.arch.model_type
    if ctx.arch.facts.calibration is not None:
        raise ScenarioError(
            "objective",
            f"{name!r} is not calibrated for {model_type!r} (a model calibrated from a trace): sft only",
        )


def logit_tokens(ctx: Context, sc: Scenario) -> tuple[int, int]:
    """(tokens whose logits the model computes, tokens whose log-probs the loss takes) on one rank."""
    T = ctx.tokens // ctx.par.cp
    B = ctx.scenario.micro_batch_size
    C = sc.rl_config.completion_len
    if sc.objective_name == "grpo":
        return B * (C + 1), B * C
    if sc.objective_name == "ppo":  # TRL's PPO asks for every position's logits (no logits_to_keep)
        return T, B * C
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
    if sc.objective_name == "ppo":
        # the whole sequence's logits, held by the loop's ``output`` through the step (``output_logits``, from
        # output_lifetime "step"); the response view is divided by the temperature in place (no copy)
        out.loss_forward = [
            Term(
                "logits (every position; the response view tempered in place)",
                le * Tk * V,
                f"{le} B x T x V",
                1,
            )
        ]
        out.loss_saved = [
            Term("per-row log-softmax saved (selective_log_softmax)", le * Tc * V, f"{le} B x bC x V", rows)
        ]
        # backward, at the in-place division's: the response slice's slice_backward (full size), CopySlices'
        # buffer for the whole logits, the slice's clone and its quotient (2 x bC x V); the saved rows are
        # freed by then (traced)
        out.loss_backward = [
            Term(
                "slice_backward and CopySlices buffers of the logits (the in-place tempered view)",
                2 * le * Tk * V,
                f"2 x {le} B x T x V",
                2,
            ),
            Term(
                "the division's backward: the slice's clone and quotient, less the freed saved rows",
                le * Tc * V,
                f"{le} B x bC x V (2 buffers less the saved rows)",
                2,
            ),
        ]
        saved, cache, hidden = padded_forward_terms(ctx)
        padded, held = [*saved, cache, hidden], [cache, hidden]
        # gradient checkpointing is the policy's only; HF then turns its use_cache off
        mine = [t for t in padded if t is not cache] if _policy_checkpointed(ctx) else padded
        out.per_layer = acts.per_layer + mine
        # the value model is fully trained even beside a LoRA policy (TRL applies PEFT to the policy only)
        vacts = acts
        if ctx.scenario.method != "full":
            from memsim_widget.engine.activations import activations

            vacts = activations(Context(replace(ctx.scenario, method="full")))
        out.per_layer = out.per_layer + value_activations(vacts) + value_activations_of(padded)
        out.post = acts.post + [replace(t, name=f"value model: {t.name}") for t in vacts.post]
        out.output_cache = [t for t in held if t in mine] + value_activations_of(held)
        return out
    if sc.objective_name == "grpo":
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
    # the head's backward with the logits' gradient (the SFT step's, ``loss.py``) is untraced under these losses;
    # their traced peaks are the forward's end and the loss's backward, where the figures agree (docs/fidelity.md)
    out.logits_grad = []
    if (
        sc.objective_name == "kto"
    ):  # the batch's attention mask, and the KV cache ``outputs`` holds to the loss's end
        saved, cache, _ = padded_forward_terms(ctx)
        out.per_layer = acts.per_layer + saved
        if not _policy_checkpointed(ctx):
            out.cache_per_layer = acts.cache_per_layer + [cache]
    return out


def _policy_checkpointed(ctx: Context) -> bool:
    """HF sets ``use_cache=False`` on a model whose gradient checkpointing is on."""
    return ctx.scenario.activation_checkpointing in ("full", "selective-op")


def padded_forward_terms(ctx: Context) -> tuple[list[Term], Term, Term]:
    """Per layer, what a forward with TRL's padding ``attention_mask``, the config's ``use_cache`` and
    ``output_hidden_states=True`` (PPO's ``forward``) keeps beyond the plain step's rules (traced): SDPA's float
    bias made from the mask (b x 1 x s x s), k and v saved at full width (``repeat_kv``: HF leaves SDPA's GQA
    path when a mask is given), the KV cache's copies of k and v (``DynamicCache`` concatenates), and the layer's
    output in the hidden-states tuple. Returns (saved per layer, the cache's term, the hidden state's term).
    KTO's forward (the batch's mask, no ``use_cache``, no hidden states) keeps the first two."""
    a = ctx.arch
    e = 4 if ctx.recipe.fp32_compute else 2
    T = ctx.tokens // ctx.par.cp
    b = ctx.scenario.micro_batch_size
    s = T // max(b, 1)
    d = a.head_dim
    heads, kv = a.num_heads // ctx.par.tp, max(a.num_kv_heads // ctx.par.tp, 1)
    cache = Term(
        "KV cache's k and v (use_cache: the config's default)", 2 * e * T * kv * d, f"2 x {e} B x T x kv*d", 2
    )
    hidden = Term("layer output in the hidden-states tuple", e * T * a.hidden_size, f"{e} B x T x h", 1)
    saved = [Term("SDPA's float bias from the padding mask", e * b * s * s, f"{e} B x b x s^2", 1)]
    if kv < heads:
        saved.append(
            Term(
                "k and v saved at full width (repeat_kv)",
                2 * e * T * (heads - kv) * d,
                f"2 x {e} B x T x (a - kv)*d",
                2,
            )
        )
    return saved, cache, hidden


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
        if label == "reward model":  # a sequence classifier: the backbone and a scalar score head
            items = _score_head(ctx, items, label)
        if where == "offload":
            states.host.extend(replace(i, item=i.item + " (offloaded)", level=Level.HOST) for i in items)
        else:
            states.persistent.extend(items)
    from memsim_widget.engine.rl.rollout import resident_items

    gpu, host = resident_items(ctx, sc)  # a colocated vLLM engine through the training step
    if obj == "ppo":
        _add_value_model(ctx, stage, states)
    states.persistent.extend(gpu)
    states.host.extend(host)


def _add_value_model(ctx: Context, stage: Stage, states: StateBudget) -> None:
    """PPO's value model, trained beside the policy (TRL ``PolicyAndValueWrapper``, one optimizer): an
    ``AutoModelForSequenceClassification`` with ``num_labels=1`` -- the policy's backbone (the engine assumes the
    policy's architecture; TRL's example loads it from the reward model's checkpoint) and a scalar ``score``
    head (h weights) instead of the vocabulary head. TRL applies the PEFT config to the policy only, so the value
    model is fully trained even beside a LoRA policy: its states are a full fine-tune's, scaled from the whole
    model to the backbone + score parameters (exact for a recipe with one byte size per parameter)."""
    vctx = ctx if ctx.scenario.method == "full" else Context(replace(ctx.scenario, method="full"))
    vst = states if vctx is ctx else model_states(vctx, stage)
    V = max(vctx.arch.vocab_size, 1)
    weights = [
        i
        for i in vst.persistent
        if i.category == Category.PARAMETERS
        and i.level == Level.TENSOR
        and not i.item.startswith(_NOT_POLICY)
    ]
    total = sum(i.bytes for i in weights)
    head = next((i for i in weights if i.item == "head weights"), None)
    emb = next((i for i in weights if i.item == "embedding weights"), None)
    scored = head or emb
    score = scored.bytes // V if scored else 0
    kept = total - (head.bytes if head else 0) + score
    ratio = kept / total if total else 1.0

    def scaled(i: Item) -> Item:
        return replace(
            i,
            item=f"value model: {i.item}",
            bytes=round(i.bytes * ratio),
            formula=f"backbone + score share: {i.formula}",
        )

    out = [
        replace(i, item=f"value model: {i.item}", formula=f"as the policy's: {i.formula}")
        for i in weights
        if i is not head
    ]
    if score:
        out.append(
            Item(
                Category.PARAMETERS,
                "value model: score head (h x 1)",
                score,
                "h x 1 weights",
                Level.TENSOR,
                1,
            )
        )
    out += [
        scaled(i)
        for i in vst.persistent
        if i.category != Category.PARAMETERS and not i.item.startswith(_NOT_POLICY)
    ]
    grads, below, temps = (
        [scaled(i) for i in vst.grads],
        [scaled(i) for i in vst.grads_but_bottom],
        [scaled(i) for i in vst.step_temps],
    )
    states.persistent.extend(out)
    states.grads.extend(grads)
    states.grads_but_bottom.extend(below)
    states.step_temps.extend(temps)  # one optimizer over both: foreach's temporary spans both


def _score_head(ctx: Context, items: list[Item], label: str) -> list[Item]:
    """A sequence classifier's weights from a copy of the policy's: the vocabulary head (untied) replaced by
    an h x 1 ``score`` (TRL's reward and value models are ``AutoModelForSequenceClassification``, num_labels=1)."""
    V = max(ctx.arch.vocab_size, 1)
    head = next((i for i in items if i.item.endswith(": head weights")), None)
    emb = next((i for i in items if i.item.endswith(": embedding weights")), None)
    ref = head or emb
    out = [i for i in items if i is not head]
    if ref is not None:
        out.append(
            replace(
                ref,
                item=f"{label} weights (frozen): score head (h x 1)",
                bytes=ref.bytes // V,
                formula="h x 1 weights",
            )
        )
    return out


#: Items of the extra models, not the policy's own.
_NOT_POLICY = ("reference model", "reward model", "value model", "vLLM")


def _frozen_weights(ctx: Context, states: StateBudget, label: str) -> list[Item]:
    """A frozen copy of the policy's weights on this rank, as the policy holds them (dtype, tp/pp/ZeRO-3 shards,
    QLoRA's NF4 base), without its LoRA adapters: TRL loads the reference like the policy and prepares it with
    the same sharding (``prepare_deepspeed`` / ``prepare_fsdp``)."""
    return [
        Item(
            Category.PARAMETERS,
            f"{label} weights (frozen): {i.item}",
            i.bytes,
            f"as the policy's: {i.formula}",
            Level.TENSOR,
            i.tensors,
        )
        for i in states.persistent
        if i.category == Category.PARAMETERS
        and i.level == Level.TENSOR
        and "LoRA" not in i.item
        and not i.item.startswith(("reference model", "reward model", "value model", "vLLM"))
    ]


def value_activations(acts: ActivationBudget) -> list[Term]:
    """PPO: the value model's saved activations per layer: a full fine-tune's of the policy's architecture
    (traced: its backbone runs the same layers; its scalar head saves only the final norm's output)."""
    return value_activations_of(acts.per_layer)


def value_activations_of(terms: list[Term]) -> list[Term]:
    """``terms`` labelled as the value model's."""
    return [replace(t, name=f"value model: {t.name}") for t in terms]


def _kept_at_forward_end(sc: Scenario, acts: ActivationBudget, forward_end: Moment) -> tuple[Item, ...]:
    """What stays alive from the policy's forward while the loss runs: DPO's ``concatenated_forward`` has
    returned (its logits are gone, the saved log-softmax rows stay); KTO's ``outputs`` stay referenced to the end
    of ``_compute_loss`` (its logits stay)."""
    if sc.objective_name == "kto":
        return forward_end.items
    gone = {t.name for t in acts.loss_forward}
    return tuple(i for i in forward_end.items if not (i.category == Category.ACTIVATIONS and i.item in gone))


def reference_moment(
    ctx: Context, sc: Scenario, acts: ActivationBudget, forward_end: Moment, states: StateBudget
) -> Moment | None:
    """The reference's forward inside the step (DPO, KTO): the policy's forward-end memory (DPO: less its logits)
    plus the reference's transients; None when no reference runs."""
    if sc.objective_name not in REFERENCE_IN_STEP or sc.reference not in ("gpu", "offload", "shared_base"):
        return None
    kept = _kept_at_forward_end(sc, acts, forward_end)
    return Moment(
        "reference_forward", kept + tuple(reference_forward(ctx, sc)) + tuple(_loaded_reference(states))
    )


def _loaded_reference(states: StateBudget) -> list[Item]:
    """An offloaded reference comes back to the GPU for its forward (OpenRLHF --ref_reward_offload)."""
    return [
        replace(i, item=i.item.replace(" (offloaded)", " (loaded for its forward)"), level=Level.TENSOR)
        for i in states.host
        if i.item.startswith("reference model")
    ]


def kto_metrics_moment(
    ctx: Context, sc: Scenario, acts: ActivationBudget, forward_end: Moment, states: StateBudget
) -> Moment | None:
    """KTO's loss after both forwards (traced, ``trace/objectives.py``): the policy's logits and saved rows, the
    reference's logits (``ref_outputs`` is still referenced), and the metrics' copies of the cut policy logits:
    ``index_select`` of one label's rows, then its completion-masked rows. The worst batch has every sample under
    one label and every position in the completion mask (2 copies of b(s-1) x V); the reshape copy that
    ``entropy_from_logits`` makes before them is freed by then."""
    if sc.objective_name != "kto" or not ctx.arch.vocab_size or sc.loss == "chunked":
        return None
    V = ctx.arch.vocab_size
    le = 4 if ctx.recipe.fp32_compute else 2
    T = ctx.tokens // ctx.par.cp
    b = ctx.scenario.micro_batch_size
    items = list(forward_end.items)
    if sc.reference in ("gpu", "offload", "shared_base"):
        items.append(_ref_cache(ctx))
        items.append(
            Item(
                Category.TEMPORARIES,
                "reference logits (no_grad; ref_outputs kept)",
                le * T * V,
                f"{le} B x T x V",
                Level.TENSOR,
                1,
            )
        )
    items.append(
        Item(
            Category.TEMPORARIES,
            "metrics: index_select of one label's cut logits, then its masked rows",
            2 * le * (T - b) * V,
            f"2 x {le} B x b(s-1) x V",
            Level.TENSOR,
            2,
        )
    )
    return Moment("kto_loss_metrics", tuple(items) + tuple(_loaded_reference(states)))


def reference_forward(ctx: Context, sc: Scenario) -> list[Item]:
    """Transients of the reference's no-grad forward in the step (DPO, KTO): its logits, two rows of log-softmax
    (an offloaded reference's weights come back in ``reference_moment``). KTO's reference runs two forwards one
    after the other (the KL batch, whose logits die on return, then the completion batch): one batch's worth."""
    V = ctx.arch.vocab_size
    le = 4 if ctx.recipe.fp32_compute else 2
    T = ctx.tokens // ctx.par.cp
    s = T // ctx.scenario.micro_batch_size
    rows = min(2, ctx.scenario.micro_batch_size)
    e = 4 if ctx.recipe.fp32_compute else 2
    Tl = T
    # in a layer (under no_grad nothing is saved): the MLP's gate activation, up projection and their product,
    # beside the layer input the caller holds, the residual, the normed input and the embeddings output
    n_mlp = 3 if ctx.arch.mlp_activation in ("swiglu", "geglu") else 2
    I, h = ctx.arch.intermediate_size // ctx.par.tp, ctx.arch.hidden_size
    layer = [
        Item(
            Category.TEMPORARIES,
            "reference forward: one layer's MLP working set (no_grad)",
            n_mlp * e * Tl * I + 4 * e * Tl * h,
            f"{n_mlp} x {e} B x T x I + 4 x {e} B x T x h",
            Level.TENSOR,
            n_mlp + 4,
        )
    ]
    head = [
        Item(
            Category.TEMPORARIES,
            "reference logits (no_grad)",
            le * Tl * V,
            f"{le} B x T x V",
            Level.TENSOR,
            1,
        ),
        Item(
            Category.TEMPORARIES,
            "reference log-softmax rows (the loop keeps the previous row)",
            le * rows * s * V,
            f"{rows} x {le} B x s x V",
            Level.TENSOR,
            rows,
        ),
    ]
    if (
        sc.objective_name == "kto"
    ):  # ref_outputs holds its KV cache (no use_cache=False); the mask's float bias
        cache = _ref_cache(ctx)
        layer += [
            cache,
            Item(
                Category.TEMPORARIES,
                "reference forward: SDPA's float bias from the padding mask",
                e * T * s,
                f"{e} B x b x s^2",
                Level.TENSOR,
                1,
            ),
        ]
        head.append(cache)
    # the larger of the two instants: inside a layer, or at the head's log-softmax
    out = max(layer, head, key=lambda x: sum(i.bytes for i in x))
    return out


def _ref_cache(ctx: Context) -> Item:
    """KTO: the KV cache the reference's ``ref_outputs`` holds (k and v copies, every layer)."""
    _, cache, _ = padded_forward_terms(ctx)
    L = ctx.arch.num_layers
    return Item(
        Category.TEMPORARIES,
        f"reference {cache.name}",
        int(cache.bytes * L),  # an int already (Term.bytes is typed float)
        f"{L} layers x {cache.formula}",
        Level.TENSOR,
        2 * L,
    )


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
    generation and scoring (``engine/rl/rollout.py``)."""
    from memsim_widget.engine.rl.rollout import rollout_moments

    out = []
    fwd = next(m for m in step if m.name == "forward_end")
    ref = reference_moment(ctx, sc, acts, fwd, states)
    if ref is not None:
        out.append(ref)
    metrics = kto_metrics_moment(ctx, sc, acts, fwd, states)
    if metrics is not None:
        out.append(metrics)
    out += rollout_moments(ctx, sc, stage, states, overhead)
    return out
