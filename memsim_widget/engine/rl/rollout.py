"""The rollout phase of online RL (GRPO, PPO): generation by a vLLM engine, then scoring, before the step.

Formula-only: no trace runs vLLM; each rule is the engines' documented arithmetic, with its source.

- **Budget** (vLLM's memory profiling, ``Worker.determine_available_memory``; its startup log reads "the current
  vLLM instance can use total_gpu_memory x gpu_memory_utilization ... model weights take ...; PyTorch activation
  peak memory takes ...; the rest of the memory reserved for KV Cache is ...", vllm-project/vllm#12330, #11251):
  a colocated engine takes ``gpu_memory_utilization`` x the card for itself ("a per-instance limit", vLLM's
  ``CacheConfig`` docs); its KV cache is that budget less its weights, its profiled activation peak and (since
  vLLM 0.21, ``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS`` on by default, gpustack/runner#251's log) its CUDA
  graphs. TRL: ``GRPOConfig(use_vllm=True, vllm_mode="colocate", vllm_gpu_memory_utilization=0.3)`` (TRL's
  vLLM integration docs; the HF blog "No GPU left behind", 2025); OpenRLHF: ``--colocate_all_models
  --vllm_gpu_memory_utilization``.
- **KV cache blocks** (vLLM PagedAttention): 16 tokens a block (the CUDA default ``block_size``); each token
  holds a key and a value per layer: 2 x layers x kv_heads x head_dim x 2 B (``kv_cache_dtype="auto"``: the
  model's 16-bit dtype, also for fp8 weights). ``kv_cache="needed"`` counts the blocks of the generation batch:
  the micro-batch's sequences (micro_batch_size x G, or ``rl.completions_per_micro_batch``) x grad_accum_steps
  sequences of seq_len tokens (TRL generates for
  ``per_device_train_batch_size x steps_per_generation`` completions, ``steps_per_generation`` defaulting to
  ``gradient_accumulation_steps``), as vLLM's ``kv_cache_memory_bytes`` would pin it.
- **CUDA graphs**: a stated typical size, 0.4 GiB (logs: "Graph capturing finished ... took 0.21 GiB" for Llama
  3.2 1B, vllm-project/vllm#11349; "Estimated CUDA graph memory: 0.36 GiB", gpustack/runner#251); none with
  ``enforce_eager`` (``cuda_graphs: false``).
- **Sleep mode** (vLLM docs, "Sleep Mode"): level 1 offloads the weights to CPU RAM and discards the KV cache;
  level 2 discards both (the weights are reloaded or synced from the trainer on wake-up). TRL:
  ``vllm_enable_sleep_mode``; OpenRLHF: ``--vllm_enable_sleep``. Without it the engine's weights, KV cache and
  graphs stay on the card through the training step. The graphs stay in either level (they are not in the
  sleep allocator's weights/KV pools).
- **Activation peak**: vLLM profiles one forward of ``max_num_batched_tokens`` plus the sampler's fp32 logits for
  ``max_num_seqs`` sequences; their defaults for the offline ``LLM`` class that TRL's colocate mode builds are
  16384 tokens and 1024 sequences on cards of 70 GiB or more other than the A100, else 8192 and 256
  (``EngineArgs.get_batch_defaults``, vllm/engine/arg_utils.py). Taken as the no-grad working set of a layer at
  that many tokens (the gated MLP's three T x I tensors and four T x h ones): an estimate, not vLLM's number.
- **Separate group** (TRL ``vllm_mode="server"``, OpenRLHF ``--vllm_num_engines``): the engine sits on other
  GPUs; the training GPUs hold nothing of it. Its own card is reported, not added to the training peak.

Known misses: prefix caching sharing a prompt's blocks between its G completions (it lowers ``needed``); MLA
models' compressed KV; OpenRLHF's ``--deepspeed_enable_sleep`` (the trainer's states offloaded while generating);
vLLM's non-torch memory (NCCL, its own CUDA context in server mode).
"""

from __future__ import annotations

import math

from memsim_widget.engine.context import Context, Stage
from memsim_widget.engine.items import Category, Item, Level
from memsim_widget.engine.states import StateBudget
from memsim_widget.engine.step.timeline import Moment
from memsim_widget.scenario import Scenario
from memsim_widget.units import GiB, fmt_int

#: vLLM's KV cache block size on CUDA (tokens).
BLOCK_SIZE = 16
#: Bytes per weight element of the engine's copy.
WEIGHT_BYTES = {"bf16": 2, "fp16": 2, "fp8": 1}
#: KV cache bytes per element (``kv_cache_dtype="auto"``: the 16-bit model dtype).
KV_BYTES = 2
#: A typical captured-graph pool (stated: vLLM logs, see the module docstring).
CUDA_GRAPH_BYTES = int(0.4 * GiB)
#: vLLM's profiling forward: the ``LLM`` class's ``max_num_batched_tokens`` and ``max_num_seqs`` defaults, on a
#: card of 70 GiB or more other than the A100 / on the others (``EngineArgs.get_batch_defaults``).
PROFILE_LARGE = (16384, 1024)
PROFILE_SMALL = (8192, 256)


def profile_batch(ctx: Context) -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) vLLM's LLM class defaults to on the scenario's card."""
    large = ctx.gpu.memory_bytes >= 70 * GiB and "a100" not in f"{ctx.gpu.id} {ctx.gpu.name}".lower()
    return PROFILE_LARGE if large else PROFILE_SMALL


def kv_bytes_per_token(ctx: Context) -> int:
    """A key and a value per layer, at kv width: 2 x L x kv_heads x head_dim x 2 B."""
    a = ctx.arch
    return 2 * a.num_layers * a.num_kv_heads * a.head_dim * KV_BYTES


def generation_sequences(sc: Scenario) -> int:
    """Sequences the engine generates per GPU for one optimizer step (the generation batch): the training
    micro-batch's sequences x grad_accum_steps (TRL: per_device_train_batch_size x steps_per_generation)."""
    return sc.sequences_per_micro_batch * sc.grad_accum_steps


def engine_items(ctx: Context, sc: Scenario) -> dict[str, Item]:
    """The vLLM engine's memory while it generates: weights, KV cache, CUDA graphs, activation peak."""
    rl, a = sc.rl_config, ctx.arch
    wb = WEIGHT_BYTES[rl.rollout_dtype]
    weights = Item(
        Category.PARAMETERS,
        f"vLLM weights ({rl.rollout_dtype})",
        wb * a.parameters,
        f"{wb} B x {fmt_int(a.parameters)} params (the engine's own copy, LoRA merged)",
    )
    n_mlp = 3 if a.mlp_activation in ("swiglu", "geglu") else 2
    tokens, seqs = profile_batch(ctx)
    act_bytes = tokens * (n_mlp * 2 * a.intermediate_size + 8 * a.hidden_size) + seqs * a.vocab_size * 4
    act = Item(
        Category.ACTIVATIONS,
        "vLLM activation peak (profiled forward)",
        act_bytes,
        f"{tokens} tokens x ({n_mlp} x 2 B x I + 4 x 2 B x h) + {seqs} seqs x 4 B x V",
    )
    graphs = Item(
        Category.OVERHEAD,
        "vLLM CUDA graphs",
        CUDA_GRAPH_BYTES if rl.cuda_graphs else 0,
        "0.4 GiB typical (vLLM capture logs)" if rl.cuda_graphs else "enforce_eager: none",
    )
    per_tok = kv_bytes_per_token(ctx)
    if rl.kv_cache == "needed":
        n = generation_sequences(sc)
        blocks = n * math.ceil(ctx.seq_len / BLOCK_SIZE)
        kv = Item(
            Category.ACTIVATIONS,
            "vLLM KV cache (blocks needed)",
            blocks * BLOCK_SIZE * per_tok,
            f"{n} seqs x ceil({ctx.seq_len}/{BLOCK_SIZE}) blocks x {BLOCK_SIZE} tokens x "
            f"{fmt_int(per_tok)} B (2 x L x kv x d x 2 B)",
        )
    else:
        budget = int(rl.gpu_memory_utilization * ctx.gpu.memory_bytes)
        left = budget - weights.bytes - act.bytes - graphs.bytes
        blocks = max(0, left) // (BLOCK_SIZE * per_tok)
        kv = Item(
            Category.ACTIVATIONS,
            "vLLM KV cache (gpu_memory_utilization)",
            blocks * BLOCK_SIZE * per_tok,
            f"{rl.gpu_memory_utilization:g} x {ctx.gpu.memory_bytes / GiB:.0f} GiB - weights - activation peak "
            f"- graphs = {blocks:,} blocks of {BLOCK_SIZE} tokens"
            + (
                "; none left: vLLM refuses to start ('No available memory for the cache blocks')"
                if left <= 0
                else ""
            ),
        )
    return {"weights": weights, "kv": kv, "graphs": graphs, "act": act}


def resident_items(ctx: Context, sc: Scenario) -> tuple[list[Item], list[Item]]:
    """(on the GPU, on the host) of a colocated engine while the training step runs: everything without sleep
    mode; only its CUDA graphs asleep (level 1 keeps the weights in host RAM, level 2 discards them)."""
    if sc.rl_config.rollout != "vllm_colocate":
        return [], []
    e = engine_items(ctx, sc)
    mode = sc.rl_config.sleep_mode
    asleep = " (kept through the training step: no sleep mode)"
    if mode == 0:
        kept = [e["weights"], e["kv"], e["graphs"]]
        return [_named(i, i.item + asleep) for i in kept if i.bytes], []
    gpu = [_named(e["graphs"], "vLLM CUDA graphs (kept asleep)")] if e["graphs"].bytes else []
    host = (
        [_named(e["weights"], "vLLM weights (sleep level 1: in host RAM)", Level.HOST)] if mode == 1 else []
    )
    return gpu, host


def _named(i: Item, name: str, level: Level | None = None) -> Item:
    return Item(i.category, name, i.bytes, i.formula, level or i.level, i.tensors)


def _scoring(ctx: Context, sc: Scenario) -> list[Item]:
    """Transients of a no-grad forward over one micro-batch of completions (reference, old policy, reward and
    value scoring in TRL's ``_generate_and_score_completions``, OpenRLHF's make_experience): the larger of a
    layer's working set and the logits of the completion with their tempered copy and two log-softmax rows."""
    a = ctx.arch
    e = 4 if ctx.recipe.fp32_compute else 2
    B = ctx.scenario.micro_batch_size
    T = ctx.tokens
    C = sc.rl_config.completion_len
    V = a.vocab_size
    n_mlp = 3 if a.mlp_activation in ("swiglu", "geglu") else 2
    layer = n_mlp * e * T * a.intermediate_size + 4 * e * T * a.hidden_size
    head = e * V * (B * (C + 1) + B * C + min(2, B) * C)
    if layer >= head:
        return [
            Item(
                Category.TEMPORARIES,
                "scoring forward: one layer's working set (no_grad)",
                layer,
                f"{n_mlp} x {e} B x T x I + 4 x {e} B x T x h",
            )
        ]
    return [
        Item(
            Category.TEMPORARIES,
            "scoring forward: completion logits, tempered copy, two log-softmax rows (no_grad)",
            head,
            f"{e} B x V x (b(C+1) + bC + 2C)",
        )
    ]


def rollout_moments(
    ctx: Context, sc: Scenario, stage: Stage, states: StateBudget, overhead: list[Item]
) -> list[Moment]:
    """The rollout phase's moments on a training GPU (GRPO, PPO): generation (a colocated engine awake beside
    the trainer's weights and optimizer states) and scoring (the engine asleep or resident)."""
    if sc.objective_name not in ("grpo", "ppo"):
        return []
    persistent = [i for i in states.persistent if i.level == Level.TENSOR]
    trainer = [i for i in persistent if not i.item.startswith("vLLM")]
    out = []
    if sc.rl_config.rollout == "vllm_colocate":
        e = engine_items(ctx, sc)
        engine = [
            _named(i, i.item + " (generating)")
            for i in (e["weights"], e["kv"], e["graphs"], e["act"])
            if i.bytes
        ]
        out.append(Moment("rollout_generate", tuple(trainer + overhead + engine)))
    scoring = sc.objective_name == "ppo" or sc.reference != "none"
    if scoring:
        out.append(Moment("rollout_score", tuple(persistent + overhead + _scoring(ctx, sc))))
    return out


def separate_group(ctx: Context, sc: Scenario) -> dict[str, int] | None:
    """The engine on its own GPU group (``vllm_separate``): its items on one of its cards, or None."""
    if sc.objective_name not in ("grpo", "ppo") or sc.rl_config.rollout != "vllm_separate":
        return None
    e = engine_items(ctx, sc)
    return {i.item: i.bytes for i in e.values() if i.bytes}
