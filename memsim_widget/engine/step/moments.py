"""The moments of a training step as one table: which named groups of items are live at each instant.

docs/memory-facts.md#where-the-peak-falls. ``engine/step/timeline.py`` builds each group's items (the breakdown)
and ``plan/vector.py``
each group's byte sums for many candidates at once; both read the moments from ``MOMENT_TABLE``, so the
step is written down once. A group belongs to one side: the model states of a rank (``STATE_GROUPS``: they
vary with the layout, ZeRO stage, optimizer and offload) or one micro-batch's activation terms scaled to the
stage (``ACTIVATION_GROUPS``: micro-batch, tp, cp, checkpointing, loss, pipeline position).
"""

from __future__ import annotations

from memsim_widget.fast_dataclass import dataclass

#: Model-state groups (``engine/states.StateBudget`` and the workspace items).
STATE_GROUPS = (
    "persistent",  # parameters and optimizer states held for the run (step 1: no optimizer states yet)
    "overhead",  # cuBLAS workspaces and other allocator-level buffers held for the run
    "grads_carried",  # gradients an earlier micro-batch already accumulated (grad accumulation, 1F1B)
    "gathered_at_loss",  # the units held gathered while the loss runs (FSDP2: none if the root resharded)
    "kept_unsharded",  # FSDP without reshard after forward: every layer stays gathered until its backward
    "kept_unsharded_last",  # ... and the last stage's head and final norm
    "head_grads",  # at the top of backward: the carried gradients, else the head's (on the last stage)
    "gathered",  # the FSDP units gathered during backward
    "gathered_grads",  # their unsharded gradients before the reduce-scatter
    "kept_after_backward",  # a pipeline over FSDP2: the layers kept gathered after their backward
    "step_in_backward",  # optimizer-in-backward: the step's temporaries during backward
    "root_regather",  # FSDP2's root unit gathered again when backward starts, with its all-gather output
    "root_made",  # FSDP2 at the bottom of backward: the root unit's unsharded gradients, all made
    "root_reduce",  # FSDP2's root unit in its reduce-scatter: its unsharded gradients and the reduce input
    "root_reduce_out",  # ... a little later: the reduce input and output (and a gradient still referenced)
    "grads_but_root",  # ... beside every gradient but the root unit's own shard (not made yet)
    "grads_but_bottom",  # every gradient but layer 0's and the embeddings'
    "grads",  # every gradient
    "tied_sum",  # a tied embedding's backward: its gradient and the head's, beside their sum
    "step_persistent",  # parameters and optimizer states at the optimizer step (they exist from step 1 on)
    "step_temps",  # the optimizer step's temporaries (tensor level; the allocation streams read them)
    "step_temps_sub",  # ... as the step's moment meets them (DeepSpeed ZeRO-3: one sub group's; else the same)
    "step_grads",  # the gradients the optimizer steps (a pipeline over FSDP2: the shards, not the accumulation)
    "grads_next",  # GPipe's second backward: every gradient, made by the first (none with optimizer-in-backward)
    "gathered_next",  # ... over FSDP2: the root and every layer still gathered from the first backward
    "prefetched",  # a pipeline over FSDP2: the next layer's all-gather output, prefetched (top of backward only)
    "new_grad",  # ... a layer's new gradient beside the carried accumulation, before AccumulateGrad adds it
    "new_grad_next",  # ... the same in GPipe's later backwards
    "chunk_gathered",  # ... an interleaved rank: a chunk's layer gathered, its other chunks' still from backward
    "head_made",  # one GPU: the gradients alive as the head's weight gradient is made (a later micro-batch: it too)
    "tied_head_part",  # one GPU: the tied head's part of the embeddings' gradient, in autograd's buffer
    "bottom_new",  # one GPU: the embeddings' gradient parts (tied) or new gradient (a later micro-batch)
    "top_layer_made",  # one GPU, eager attention: the top layer's gradients made before its attention's backward
    "top_down_new",  # one GPU: the top layer's down projection's weight gradient as its matmul makes it
    "top_down_made",  # ... and as its .grad, made (none where gradients are carried: added in place)
)

#: State groups no moment reads, built for the allocation streams: the step's temporaries as the optimizer's
#: items count them, which a stream spreads per parameter or per partition element (``alloc_stream``,
#: ``zero3_stream.per_element``); the step's moment reads ``step_temps_sub``.
STREAM_GROUPS = ("step_temps",)

#: Activation groups (``engine/activations.ActivationBudget`` terms times layers and micro-batches).
ACTIVATION_GROUPS = (
    "stage_io",  # a pipeline stage's receive buffers, pending sends and kept outputs
    "receive_buffers",  # the receive buffers alone (kept through the optimizer step)
    "pre",  # the embedding's saved tensors and the inputs of the micro-batches in flight
    "saved",  # every layer's saved activations (checkpointed inputs under checkpointing) on the GPU
    "saved_at_loss",  # ... while the loss runs (an interleaved last rank of uneven chunks: fewer than at its peak)
    "post",  # the final norm's and head's saved tensors
    "loss_saved",  # what the loss keeps for its backward
    "loss_forward",  # the loss's forward transients (last stage)
    "forward_top",  # the top of the forward: the last layers' own transients and what the stack holds (last stage)
    "cache_per_layer",  # the model output's KV cache built during forward
    "loss_backward",  # the loss's backward transients (last stage)
    "held_logits",  # the model output's logits the training loop still holds
    "held_cache_extra",  # the part of the held KV cache the saved activations do not hold anyway
    "top_backward",  # the final norm's backward transients (last stage)
    "recompute",  # the last layer recomputed for its backward (under checkpointing)
    "layer_backward",  # a layer in backward: the larger of its MLP and its attention transients
    "mlp_out_backward",  # ... as its MLP down projection's backward ends (the layer's first)
    "attention_in_backward",  # ... its attention's transients alone
    "rest",  # the other micro-batches' saved activations at the bottom of backward
    # GPipe's second micro-batch's backward (engine/parallel/pipeline next_backward_count; empty elsewhere): one
    # micro-batch fewer of the stage's buffers and outputs, inputs, saved activations, head and loss tensors
    "stage_io_next",
    "pre_next",
    "saved_next",
    "post_next",
    "loss_saved_next",
    "loss_backward_next",  # ... and the loss's backward transients (last stage)
    "own",  # layer 0's saved activations of this micro-batch (recomputed under checkpointing)
    "cache_but_own",  # the held KV cache less layer 0's own part
    "cache_all",  # the whole held KV cache
    "bottom_backward",  # the embedding's backward transients (calibrated models only)
    "bottom_layer",  # the bottom layer in backward (compiled autocast: its own steps' peak; else layer_backward)
    "tangents_top",  # compiled autocast: every layer's KV-cache zero gradients (the top layer's backward)
    "tangents_own",  # ... the bottom layer's own (its backward)
    "kept_above",  # ... what the layers above the bottom one keep to the bottom
    "kept_top",  # ... what the top of the backward keeps to the bottom (last stage)
    "held_through_step",  # output_lifetime "step": the held output (logits and KV cache) at the step
    "batch_through_step",  # the batch the loop holds through the optimizer step (its last micro-batch's inputs)
    "logits_grad",  # the logits' gradient in their dtype, alive while the head's backward runs (last stage)
)

#: The condition of a moment that only some steps have: an optimizer that steps after backward.
OPTIMIZER_STEPS = "optimizer_steps"


@dataclass(frozen=True)
class MomentRule:
    """One instant of the step: the groups ``live`` throughout, then the largest (in raw bytes; the first of
    equals) of the ``larger_of`` alternatives (instants close together), then the groups ``after``.
    ``only_if`` names a condition the step must meet (``OPTIMIZER_STEPS``), empty for every step."""

    name: str
    live: tuple[str, ...]
    larger_of: tuple[tuple[str, ...], ...] = ()
    after: tuple[str, ...] = ()
    only_if: str = ""

    @property
    def groups(self) -> tuple[str, ...]:
        """Every group the moment may hold, each once."""
        seen = [*self.live, *(g for alt in self.larger_of for g in alt), *self.after]
        return tuple(dict.fromkeys(seen))


#: Held at every moment but the optimizer step (which holds the receive buffers only).
_COMMON = ("persistent", "overhead", "stage_io")
_FORWARD_LAYERS = ("grads_carried", "gathered_at_loss", "kept_unsharded", "kept_unsharded_last", "pre",
                   "saved_at_loss")  # fmt: skip
_FORWARD = (*_FORWARD_LAYERS, "post", "loss_saved")

MOMENT_TABLE = (
    # the end of forward: every saved activation and the loss's forward, or (where larger, T5: engine/activations/
    # t5._forward_top) the top of the forward, the last layers' own transients before the head and loss run
    MomentRule(
        "forward_end",
        live=(*_COMMON, *_FORWARD_LAYERS),
        larger_of=(
            ("post", "loss_saved", "loss_forward", "cache_per_layer"),
            ("forward_top", "cache_per_layer"),
        ),
    ),
    # the loss's backward, the output the loop holds alive beside it
    MomentRule(
        "backward_start", live=(*_COMMON, *_FORWARD, "loss_backward", "held_logits", "held_cache_extra")
    ),
    # the head's backward: its weight gradient made beside the logits' gradient, the loss's buffers freed, every
    # saved activation alive (one GPU: states/gradients.one_gpu_backward; empty elsewhere, less than the loss)
    MomentRule(
        "head_backward",
        live=(
            *_COMMON,
            "head_made",
            "pre",
            "saved_at_loss",
            "post",
            "logits_grad",
            "held_logits",
            "held_cache_extra",
        ),
    ),  # fmt: skip
    # FSDP2's root re-gathered as backward starts (resharded after forward): every saved activation alive
    MomentRule(
        "backward_regather",
        live=(
            *_COMMON,
            "grads_carried",
            "kept_unsharded",
            "pre",
            "saved_at_loss",
            "post",
            "loss_saved",
            "root_regather",
            "held_logits",
        ),
    ),  # fmt: skip
    # the top of backward: the final norm's backward, or the last layer's (recomputed first under
    # checkpointing): as its down projection's backward ends (that matmul's weight gradient just made, one GPU),
    # or later, the down projection's gradient made (one GPU), or its attention's backward, by when (one GPU,
    # eager attention) the layer's o_proj, MLP and post-attention norm gradients are made (torch 2.13.0 runs the
    # layer's backward in reverse of its forward); every other saved activation alive and only the head's
    # gradients made so far
    MomentRule(
        "backward_top",
        live=(
            *_COMMON,
            "head_grads",
            "tied_head_part",
            "gathered",
            "prefetched",
            "kept_unsharded",
            "gathered_grads",
            "pre",
            "saved",
        ),
        larger_of=(
            ("top_backward",),
            ("recompute", "layer_backward", "new_grad", "kept_top", "top_down_made"),
            ("recompute", "attention_in_backward", "top_layer_made", "new_grad", "kept_top"),
            ("recompute", "mlp_out_backward", "new_grad", "kept_top", "top_down_new"),
        ),
        after=("held_logits", "held_cache_extra", "tangents_top"),
    ),
    # an interleaved rank over FSDP2: one chunk's layer gathered (its forward, or the top of its backward,
    # with the all-gather output) while the rank's other chunks are still gathered from their backward,
    # every saved activation alive (engine/states/gathered._pipeline_new_grads)
    MomentRule(
        "chunk_regather",
        live=(*_COMMON, "grads_carried", "gathered", "prefetched", "chunk_gathered", "pre", "saved"),
    ),
    # the bottom of backward: (a) layer 0's backward, its own gradients and the embeddings' not yet made;
    # (b) the embedding's backward, every gradient made and no layer activation of this micro-batch left
    MomentRule(
        "backward_end",
        live=(
            *_COMMON,
            "gathered",
            "gathered_grads",
            "kept_after_backward",
            "step_in_backward",
            "pre",
            "rest",
        ),
        larger_of=(
            (
                "grads_but_bottom",
                "tied_head_part",
                "own",
                "bottom_layer",
                "held_logits",
                "cache_but_own",
                "tangents_own",
                "kept_above",
                "kept_top",
            ),
            ("grads", "tied_sum", "bottom_new", "held_logits", "cache_all", "bottom_backward"),
        ),
    ),
    # GPipe: the second micro-batch's (loss) backward, every gradient made by the first's backward, one
    # micro-batch fewer held (engine/parallel/pipeline next_backward_count; only its model states where it is no moment,
    # less than backward_end holds)
    MomentRule(
        "backward_next",
        live=(
            "persistent",
            "overhead",
            "stage_io_next",
            "grads_next",
            "gathered_next",
            "pre_next",
            "saved_next",
            "post_next",
            "loss_saved_next",
        ),
        # the loss's backward, then (one after the other) a layer's new gradient beside the accumulation
        larger_of=(("loss_backward_next",), ("new_grad_next",)),
    ),
    # FSDP2 at the bottom of backward: the embedding's gradient made, the root's unsharded gradients waiting
    # for its post-backward beside the unsharded root (engine/states/gathered._root_grads_made)
    MomentRule(
        "root_grads_made", live=(*_COMMON, "gathered", "grads_but_root", "root_made", "pre", "held_logits")
    ),
    # FSDP2's last reduce-scatter, the root unit's (embeddings, final norm, head): its unsharded gradients
    # and the reduce input, every activation freed (engine/states/gathered._root_reduce)
    MomentRule(
        "root_reduce_scatter",
        live=(*_COMMON, "grads_but_root", "held_logits"),
        larger_of=(("root_reduce",), ("root_reduce_out",)),
    ),
    # the optimizer step: states, gradients and the step's temporaries; activations freed, but for the batch the
    # loop still holds (traced: the "input" role at the step; transformers 5.24 ``trainer.py`` keeps the step's
    # ``batch_samples`` referenced through ``self.optimizer.step()``, every accumulated micro-batch of it: one
    # counted, as the backward moments count one)
    MomentRule(
        "optimizer_step",
        live=(
            "step_persistent",
            "overhead",
            "receive_buffers",
            "step_grads",
            "step_temps_sub",
            "held_through_step",
            "batch_through_step",
        ),
        only_if=OPTIMIZER_STEPS,
    ),
)

#: The moments' names in table order (``Estimate.peak_phase`` and the planner's ``peak_moment`` index).
MOMENTS = tuple(rule.name for rule in MOMENT_TABLE)
