"""DTensor tensor-parallel plans for the HF decoders the tracer builds (Llama, Mistral, Qwen2, tied or not).

Two plan styles, each applied with PyTorch's own ``parallelize_module`` on one rank of a fake process group:

- ``"hf"``: the model's ``base_model_tp_plan`` from its transformers config, as transformers 5.x reads it
  (``transformers/distributed/tensor_parallel.py``): "colwise" = weight Shard(0), replicated input, output
  sharded on the last dim (a local tensor); "rowwise" = weight Shard(1), input sharded on the last dim, output
  all-reduced to Replicate; the LM head is "colwise_gather_output" (every rank all-gathers the full logits).
  Embeddings and norms are not in the plan: they stay replicated.
- ``"torchtitan"``: torchtitan's Llama plan (``torchtitan/models/llama3/infra/parallelize.py``, ``apply_tp``):
  the embedding RowwiseParallel (vocab-sharded, output Shard(1) under sequence parallel), norms
  SequenceParallel, attention/feed-forward inputs PrepareModuleInput Shard(1) -> Replicate, wq/wk/wv/w1/w3
  colwise, wo/w2 rowwise with Shard(1) output, the output layer colwise with Shard(-1) DTensor logits under
  loss parallel. HF names: tok_embeddings=embed_tokens, attention=self_attn, feed_forward=mlp,
  attention_norm=input_layernorm, ffn_norm=post_attention_layernorm, output=lm_head.

Sequence parallel (Korthikanti et al. 2022, arXiv 2205.05198) adds the torchtitan norm/input layouts to the
"hf" plan too: the residual stream and the norms hold T/tp tokens per rank; the embedding output is split on
the sequence (a local chunk of the replicated lookup). docs/memory-facts.md#tracing-one-rank-on-a-cpu,
pitfall (5): the batch then carries ``position_ids`` for the global sequence (``tp_inputs``) and SDPA runs
with ``is_causal`` (no mask).

Tied embeddings (Qwen2): a colwise LM head shards the tied weight on the vocabulary (Shard(0)); the
embedding takes transformers' "embedding_rowwise" style (the same Shard(0)) and the tie is restored, so the
one parameter is stored once per rank at V*h/tp.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from memsim_widget.errors import ScenarioError
from memsim_widget.trace.run import drop_labels

TP_STYLES = ("hf", "torchtitan")

#: torchtitan's per-block plan in HF module names: linear -> "colwise" | "rowwise".
TORCHTITAN_LAYER_PLAN = {
    "self_attn.q_proj": "colwise",
    "self_attn.k_proj": "colwise",
    "self_attn.v_proj": "colwise",
    "self_attn.o_proj": "rowwise",
    "mlp.gate_proj": "colwise",
    "mlp.up_proj": "colwise",
    "mlp.down_proj": "rowwise",
}
#: The "hf" plan strings this module applies (others, e.g. Mixtral's "packed_colwise", are refused).
HF_LINEAR_STYLES = ("colwise", "rowwise")


def tp_style_for(sc: Any) -> tuple[str, bool]:
    """(plan style, loss parallel) the trace uses for a scenario with tp > 1: ``parallel.tp_plan`` and
    ``parallel.loss_parallel``, else the framework's (engine/frameworks ``tp_plan``, ``loss_parallel``).

    "torchtitan" -> torchtitan's plan, loss parallel on unless turned off (its default,
    ``disable_loss_parallel=False``); "hf" -> the model's own transformers plan with the full logits gathered
    on every rank; "megatron" is refused (Megatron's fused TP kernels and its vocab-parallel loss are not
    PyTorch modules to trace). Sequence parallel follows ``parallel.sequence_parallel``.
    """
    from memsim_widget.engine.frameworks import check_tp_plan, loss_parallel, tp_plan

    check_tp_plan(sc)
    plan = tp_plan(sc)
    if plan == "megatron":
        field = "parallel.tp_plan" if sc.parallel.tp_plan else "framework"
        raise ScenarioError(
            field,
            "megatron's fused tensor-parallel kernels are not traced; use the hf or torchtitan plan for a tp trace",
        )
    return plan, loss_parallel(sc)


def check_tp_shape(cfg: Any, tp: int) -> None:
    """Refuse a tp degree that does not split whole attention and key/value heads (parallel.tp)."""
    heads = cfg.num_attention_heads
    kv = getattr(cfg, "num_key_value_heads", None) or heads
    if heads % tp or kv % tp:
        raise ScenarioError(
            "parallel.tp",
            f"a traced tp plan splits whole heads: {heads} attention and {kv} key/value heads, tp={tp}",
        )


def _layer_linears(model: Any, style: str) -> dict[str, str]:  # an HF model (config is not Module's)
    """Per-decoder-layer linear -> "colwise"/"rowwise" for ``style`` (the config's plan for "hf")."""
    if style == "torchtitan":
        return dict(TORCHTITAN_LAYER_PLAN)
    plan = getattr(model.config, "base_model_tp_plan", None) or {}
    out: dict[str, str] = {}
    for pattern, kind in plan.items():
        if not pattern.startswith("layers.*."):
            raise ScenarioError(
                "parallel.tp", f"base_model_tp_plan entry {pattern!r} is not per layer; not traced"
            )
        if kind not in HF_LINEAR_STYLES:
            raise ScenarioError(
                "parallel.tp",
                f"{model.config.model_type}'s tp plan uses {kind!r} for {pattern!r}; traced styles: "
                f"{', '.join(HF_LINEAR_STYLES)} (torch's Colwise/RowwiseParallel shard nn.Linear and "
                "nn.Embedding only; MoE experts held as 3-D parameters need transformers' own local kernels)",
            )
        out[pattern.removeprefix("layers.*.")] = kind
    if not out:
        raise ScenarioError("parallel.tp", f"{model.config.model_type} has no base_model_tp_plan to trace")
    return out


def _layer_plan(linears: dict[str, str], sp: bool) -> dict[str, Any]:
    """The parallelize_module plan of one decoder layer: linears, plus norms and input layouts under SP."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    plan: dict[str, Any] = {
        name: ColwiseParallel()
        if kind == "colwise"
        else RowwiseParallel(output_layouts=Shard(1) if sp else Replicate())
        for name, kind in linears.items()
    }
    if sp:
        plan["input_layernorm"] = SequenceParallel()
        plan["post_attention_layernorm"] = SequenceParallel()
        # HF decoder layers call self_attn(hidden_states=...) by keyword and mlp(x) positionally.
        plan["self_attn"] = PrepareModuleInput(
            input_kwarg_layouts={"hidden_states": Shard(1)},
            desired_input_kwarg_layouts={"hidden_states": Replicate()},
        )
        plan["mlp"] = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
    return plan


def _root_plan(style: str, sp: bool, loss_parallel: bool, tied: bool) -> dict[str, Any]:
    """The plan of the embedding, the final norm and the LM head (module names of ``*ForCausalLM``)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleOutput,
        RowwiseParallel,
        SequenceParallel,
    )

    seq_or_rep = Shard(1) if sp else Replicate()
    plan: dict[str, Any] = {
        "lm_head": ColwiseParallel(
            input_layouts=seq_or_rep,
            output_layouts=Shard(-1) if loss_parallel else Replicate(),
            use_local_output=not loss_parallel,
        )
    }
    if style == "torchtitan" or tied:
        plan["model.embed_tokens"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=seq_or_rep)
    elif sp:
        plan["model.embed_tokens"] = PrepareModuleOutput(
            output_layouts=Replicate(), desired_output_layouts=Shard(1), use_local_output=True
        )
    if sp:
        plan["model.norm"] = SequenceParallel()
    return plan


def apply_tensor_parallel(
    model: Any, tp_mesh: Any, *, sequence_parallel: bool, loss_parallel: bool, style: str
) -> list[str]:
    """Shard ``model`` (an HF ``*ForCausalLM`` with real or fake cpu tensors) over ``tp_mesh``; return notes.
    (``Any``: torch's stubs type the model's submodules, config and methods as ``Tensor | Module``.)

    Call inside FakeTensorMode after the meta tensors were replaced (``fakeify_meta``): DTensor shards are
    made from the full tensors. Under ``loss_parallel`` the LM head returns Shard(-1) DTensor logits, labels
    are kept from the model (a forward pre-hook) and :func:`loss_parallel_loss` computes the loss.
    """
    from torch.distributed.tensor.parallel import parallelize_module

    if style not in TP_STYLES:
        raise ScenarioError(
            "framework", f"unknown tp plan style {style!r}; expected one of {', '.join(TP_STYLES)}"
        )
    tp = tp_mesh.size()
    check_tp_shape(model.config, tp)
    emb, head = model.get_input_embeddings(), model.get_output_embeddings()
    tied = head is not None and head.weight is emb.weight
    linears = _layer_linears(model, style)
    for layer in model.model.layers:
        parallelize_module(layer, tp_mesh, _layer_plan(linears, sequence_parallel))
    parallelize_module(model, tp_mesh, _root_plan(style, sequence_parallel, loss_parallel, tied))
    notes = [
        f"tp={tp} {style} plan ({', '.join(f'{k}={v}' for k, v in linears.items())}); "
        f"sequence_parallel={sequence_parallel}, loss_parallel={loss_parallel}"
    ]
    if tied:
        model.lm_head.weight = model.model.embed_tokens.weight
        notes.append("tied embeddings: embedding vocab-sharded like the LM head (Shard(0)); one parameter")
    if loss_parallel:
        model.register_forward_pre_hook(drop_labels, with_kwargs=True)
        notes.append("loss parallel: Shard(-1) logits, cross-entropy under torch's loss_parallel()")
    elif style == "hf":
        notes.append("LM head colwise_gather_output: full logits all-gathered on every rank")
    return notes


def tp_inputs(
    batch: dict[str, torch.Tensor], *, seq_len: int, sequence_parallel: bool
) -> dict[str, torch.Tensor]:
    """The batch one tp rank feeds the model: under SP, ``position_ids`` of the global sequence are added.

    Every tp rank reads the same tokens; with sequence parallel the embedding output is split on the sequence,
    so the model cannot infer positions from its local length (docs/memory-facts.md#tracing-one-rank-on-a-cpu,
    pitfall 5).
    """
    if not sequence_parallel:
        return batch
    ids = batch["input_ids"]
    return {
        **batch,
        "position_ids": torch.arange(seq_len, device=ids.device).unsqueeze(0).expand(ids.shape[0], -1),
    }


def loss_parallel_loss(out: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Mean next-token cross-entropy on Shard(-1) DTensor logits (call under ``loss_parallel()``).

    The same shift as transformers' ForCausalLMLoss (labels padded with -100, shifted by one) and the same
    fp32 upcast of the logits as torchtitan's ``cross_entropy_loss``; no full-vocabulary tensor is made.
    """
    logits = out.logits if hasattr(out, "logits") else out
    labels = torch.nn.functional.pad(batch["labels"], (0, 1), value=-100)[..., 1:]
    return torch.nn.functional.cross_entropy(
        logits.flatten(0, 1).float(), labels.flatten(0, 1), ignore_index=-100
    )


#: The functions of torch 2.13.0 ``distributed/tensor/parallel/loss.py`` that compute loss parallel's
#: cross-entropy on the local shards, called by its DTensor handlers from inside the op's dispatch.
_LOCAL_LOSS_KERNELS = ("_log_softmax", "_nll_loss_forward", "_nll_loss_and_log_softmax_backward")


@contextlib.contextmanager
def loss_context(loss_parallel: bool) -> Iterator[None]:
    """torch's ``loss_parallel()`` around the whole step when loss parallel is on (it must cover the loss and
    its backward; it only changes DTensor's cross-entropy ops, so covering the forward too changes nothing),
    with its local kernels seen by the tracker (``local_loss_kernels_seen``)."""
    from torch.distributed.tensor.parallel import loss_parallel as torch_loss_parallel

    if not loss_parallel:
        yield
        return
    with torch_loss_parallel(), local_loss_kernels_seen():
        yield


@contextlib.contextmanager
def local_loss_kernels_seen() -> Iterator[None]:
    """Run loss parallel's local kernels (``_LOCAL_LOSS_KERNELS``) with the dispatching tracker pushed again
    (``MemoryTracker.inside_dispatch``): DTensor's handlers call them inside the dispatch of ``_log_softmax``,
    ``nll_loss_forward`` and ``nll_loss_backward``, where the tracker sees only each op's output, not the
    T x V/tp temporaries they make on the way (``x - x_max``, ``exp``, ``zeros_like``, ...)."""
    import torch.distributed.tensor.parallel.loss as lp

    from .tracker import MemoryTracker

    def seen(fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            tracker = MemoryTracker.dispatching
            if tracker is None:
                return fn(*args, **kwargs)
            with tracker.inside_dispatch():
                return fn(*args, **kwargs)

        return run

    originals = {name: getattr(lp, name) for name in _LOCAL_LOSS_KERNELS}
    for name, fn in originals.items():
        setattr(lp, name, seen(fn))
    try:
        yield
    finally:
        for name, fn in originals.items():
            setattr(lp, name, fn)


@contextlib.contextmanager
def real_mesh_layouts() -> Iterator[None]:
    """Let DeviceMesh concatenate meshes from real tensors inside the trace's FakeTensorMode.

    FSDP2 on a TP-sharded model joins the dp and tp meshes (``_fsdp_param._init_sharding_spec_tp`` ->
    ``DeviceMesh._concatenate``), which indexes the meshes' real int rank tensors; FakeTensorMode refuses
    real inputs. The concatenation runs with the fake mode unset; the original is always restored.
    """
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.distributed.device_mesh import DeviceMesh

    orig = DeviceMesh.__dict__["_concatenate"]

    def concatenate(device_mesh_list: list[Any]) -> Any:  # DeviceMesh._concatenate's parameter name
        with unset_fake_temporarily():
            return orig.__func__(device_mesh_list)

    DeviceMesh._concatenate = staticmethod(concatenate)
    try:
        yield
    finally:
        DeviceMesh._concatenate = orig


@contextlib.contextmanager
def tp_trace_context(loss_parallel: bool) -> Iterator[None]:
    """The patches a tp trace runs inside: real mesh concatenation (2-D meshes) and, if on, loss parallel."""
    with real_mesh_layouts(), loss_context(loss_parallel):
        yield


def trace_hooks(
    sc: Any, input_factory: Callable[[], dict]
) -> tuple[Callable[[], dict], Callable[[Any, Any], torch.Tensor] | None, contextlib.AbstractContextManager]:
    """What a tp trace loop needs besides the plan: (input factory, loss_fn or None, context to run in).

    The input factory adds the global ``position_ids`` under sequence parallel; under loss parallel the loss is
    :func:`loss_parallel_loss` and the context is ``loss_parallel()``.
    """
    _style, lp = tp_style_for(sc)
    sp, seq_len = sc.parallel.sequence_parallel, sc.seq_len

    def make() -> dict:
        return tp_inputs(input_factory(), seq_len=seq_len, sequence_parallel=sp)

    return make, (loss_parallel_loss if lp else None), tp_trace_context(lp)
