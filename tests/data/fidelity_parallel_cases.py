"""Hold the engine to a trace of one rank of a multi-GPU job: the same step simulated and traced.

Each case is a scenario with a parallel layout and the pipeline stage whose rank is traced; the trace runs
PyTorch's own FSDP2, replicate, DTensor tensor-parallel plans and pipelining schedules on fake tensors
(``memsim_widget.trace.api.trace_scenario``). The benchmark (``benchmarks/fidelity_parallel.py``, every case)
and the tests (a fast subset) share this matrix. Shapes are the small ones of ``fidelity_cases`` (beside it).
"""

from __future__ import annotations

import time
from typing import Any

from fidelity_cases import LLAMA, MISTRAL, MIXTRAL, QWEN2

from memsim_widget.engine.core import estimate
from memsim_widget.scenario import Scenario

#: Llama with as many kv heads as heads, so that tp=8 splits whole heads.
LLAMA_MHA = {**LLAMA, "num_key_value_heads": 8}

_BASE: dict[str, Any] = {"micro_batch_size": 2, "seq_len": 512}

#: Real vocabularies at their models' hidden sizes (so the embedding, head, logits and loss weigh against the
#: layers as they do in the real model), with 2 layers to keep each trace a few seconds (fake tensors: the
#: cost is the number of ops, not their size). Sources: each model's config.json on the Hugging Face hub.
LLAMA3_V128K = {  # Llama 3.1 8B: h 4096, V 128,256
    "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 2,
    "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256, "tie_word_embeddings": False,
}  # fmt: skip
QWEN25_V152K = {  # Qwen2.5 7B: h 3584, V 152,064
    "model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 2,
    "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064, "tie_word_embeddings": False,
}  # fmt: skip
MISTRAL_V32K = {  # Mistral 7B v0.3: h 4096, V 32,768
    "model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 2,
    "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32768, "tie_word_embeddings": False,
    "sliding_window": None,
}  # fmt: skip
LLAMA_V256K = {  # a 256k vocabulary at Gemma 3 12B's ratio (h 3840, V 262,208) on a Llama body
    "model_type": "llama", "hidden_size": 3840, "intermediate_size": 15360, "num_hidden_layers": 2,
    "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 256, "vocab_size": 262208,
    "tie_word_embeddings": False,
}  # fmt: skip
#: Llama 3.1 70B's widths (h 8192, I 28672, 64 heads, 8 kv heads, V 128,256) at 2 of its 80 layers: torchtitan's
#: Table 4 shape (16 x 8192 tokens, full checkpointing) where the loss-parallel loss decides the peak.
LLAMA31_70B_L2 = {
    "model_type": "llama", "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 2,
    "num_attention_heads": 64, "num_key_value_heads": 8, "vocab_size": 128256, "tie_word_embeddings": False,
}  # fmt: skip
_REAL: dict[str, Any] = {"micro_batch_size": 1, "seq_len": 1024}


def _case(name: str, model: dict, parallel: dict, stage: int = 0, **keys: Any) -> tuple[str, dict, int]:
    """One case: a name, the scenario dict and the pipeline stage to trace."""
    return name, {"model": model, **_BASE, **keys, "parallel": parallel}, stage


def _fsdp_cases() -> list[tuple[str, dict, int]]:
    """FSDP2 (ZeRO-3) data parallelism at world sizes 2-64, several families and precision policies, and
    with ``reshard_after_forward=False``."""
    z3 = {"zero": 3}
    keep = {**z3, "reshard_after_forward": False}
    return [
        _case("llama bf16 fsdp dp2", LLAMA, {"dp": 2, **z3}),
        _case("llama bf16 fsdp dp4", LLAMA, {"dp": 4, **z3}),
        _case("llama bf16 fsdp dp8", LLAMA, {"dp": 8, **z3}),
        _case("llama bf16 fsdp dp64", LLAMA, {"dp": 64, **z3}),
        _case("llama bf16 fsdp dp8 b4 s1024", LLAMA, {"dp": 8, **z3}, micro_batch_size=4, seq_len=1024),
        _case("llama fp32 fsdp dp4", LLAMA, {"dp": 4, **z3}, precision="fp32"),
        _case("llama amp-bf16 autocast fsdp dp4", LLAMA, {"dp": 4, **z3}, precision="amp-bf16"),
        _case(
            "llama torchtitan fsdp mixed precision dp4",
            LLAMA,
            {"dp": 4, **z3},
            precision="amp-bf16",
            framework="torchtitan",
        ),
        _case(
            "llama torchtitan fsdp mixed precision dp16",
            LLAMA,
            {"dp": 16, **z3},
            precision="amp-bf16",
            framework="torchtitan",
        ),
        _case("llama bf16 fsdp dp4 ckpt full", LLAMA, {"dp": 4, **z3}, activation_checkpointing="full"),
        _case(
            "llama bf16 fsdp dp4 lora qv",
            LLAMA,
            {"dp": 4, **z3},
            method="lora",
            lora={"rank": 8, "targets": ["q_proj", "v_proj"]},
        ),
        _case("qwen2 bf16 fsdp dp2 (tied)", QWEN2, {"dp": 2, **z3}),
        _case("qwen2 bf16 fsdp dp8 (tied)", QWEN2, {"dp": 8, **z3}),
        _case("mistral bf16 fsdp dp8", MISTRAL, {"dp": 8, **z3}),
        _case("mixtral bf16 fsdp dp4", MIXTRAL, {"dp": 4, **z3}),
        _case("llama bf16 fsdp dp4 no reshard", LLAMA, {"dp": 4, **keep}),
        _case(
            "llama bf16 fsdp dp4 no reshard ckpt full",
            LLAMA,
            {"dp": 4, **keep},
            activation_checkpointing="full",
        ),
        _case(
            "llama torchtitan fsdp dp8 no reshard",
            LLAMA,
            {"dp": 8, **keep},
            precision="amp-bf16",
            framework="torchtitan",
        ),
    ]


def _replicate_cases() -> list[tuple[str, dict, int]]:
    """DDP-style replication (zero 0), traced with FSDP2-based replicate."""
    return [
        _case("llama bf16 ddp dp2", LLAMA, {"dp": 2}),
        _case("llama bf16 ddp dp8", LLAMA, {"dp": 8}),
        _case("qwen2 bf16 ddp dp4 (tied)", QWEN2, {"dp": 4}),
    ]


def _tp_cases() -> list[tuple[str, dict, int]]:
    """DTensor tensor parallelism: the model's own plan, sequence parallel, torchtitan's plan with loss parallel."""
    sp = {"sequence_parallel": True}
    return [
        _case("llama bf16 tp2", LLAMA, {"tp": 2}),
        _case("llama bf16 tp4", LLAMA, {"tp": 4}),
        _case("llama-mha bf16 tp8", LLAMA_MHA, {"tp": 8}),
        _case("llama bf16 tp2 sp", LLAMA, {"tp": 2, **sp}),
        _case("llama bf16 tp4 sp", LLAMA, {"tp": 4, **sp}),
        _case("llama-mha bf16 tp8 sp", LLAMA_MHA, {"tp": 8, **sp}),
        _case("qwen2 bf16 tp2 (tied)", QWEN2, {"tp": 2}),
        _case("mistral bf16 tp4 sp", MISTRAL, {"tp": 4, **sp}),
        _case("llama bf16 tp2 ckpt full", LLAMA, {"tp": 2}, activation_checkpointing="full"),
        _case("llama torchtitan tp2 sp loss-parallel", LLAMA, {"tp": 2, **sp}, framework="torchtitan"),
        _case("llama torchtitan tp4 sp loss-parallel", LLAMA, {"tp": 4, **sp}, framework="torchtitan"),
    ]


def _two_d_cases() -> list[tuple[str, dict, int]]:
    """FSDP2 over dp x DTensor TP over tp (torchtitan's order: TP first, then FSDP on the dp dimension)."""
    z3 = {"zero": 3}
    return [
        _case("llama bf16 dp2 x tp2 fsdp", LLAMA, {"dp": 2, "tp": 2, **z3}),
        _case(
            "llama bf16 dp2 x tp2 fsdp no reshard",
            LLAMA,
            {"dp": 2, "tp": 2, **z3, "reshard_after_forward": False},
        ),
        _case("llama bf16 dp2 x tp4 fsdp sp", LLAMA, {"dp": 2, "tp": 4, "sequence_parallel": True, **z3}),
        _case("qwen2 bf16 dp2 x tp2 fsdp (tied)", QWEN2, {"dp": 2, "tp": 2, **z3}),
        _case(
            "llama torchtitan dp4 x tp2 sp",
            LLAMA,
            {"dp": 4, "tp": 2, "sequence_parallel": True, **z3},
            precision="amp-bf16",
            framework="torchtitan",
        ),
        _case(
            "llama-mha torchtitan dp8 x tp8 sp (64 GPUs)",
            LLAMA_MHA,
            {"dp": 8, "tp": 8, "sequence_parallel": True, **z3},
            precision="amp-bf16",
            framework="torchtitan",
        ),
    ]


def _pp_cases() -> list[tuple[str, dict, int]]:
    """Pipeline stages under 1F1B, GPipe and interleaved 1F1B: the first and the last stage of each."""
    out = []
    layouts = [
        ("pp2 1f1b m4", {"pp": 2, "pp_microbatches": 4}),
        ("pp4 1f1b m8", {"pp": 4, "pp_microbatches": 8}),
        ("pp2 gpipe m4", {"pp": 2, "pp_schedule": "gpipe", "pp_microbatches": 4}),
        (
            "pp2 interleaved v2 m4",
            {"pp": 2, "pp_schedule": "interleaved", "virtual_stages": 2, "pp_microbatches": 4},
        ),
    ]
    for label, par in layouts:
        last = par["pp"] - 1
        out.append(_case(f"llama bf16 {label} stage 0", LLAMA, par, 0))
        out.append(_case(f"llama bf16 {label} stage {last} (last)", LLAMA, par, last))
    out.append(
        _case("qwen2 bf16 pp2 1f1b m4 stage 1 (tied, last)", QWEN2, {"pp": 2, "pp_microbatches": 4}, 1)
    )
    # ScheduleInterleaved1F1B runs micro-batches in rounds of pp, fewer than pp as one round
    inter = {"pp_schedule": "interleaved", "virtual_stages": 2}
    m1 = {"pp": 2, **inter, "pp_microbatches": 1}
    out.append(_case("llama bf16 pp2 interleaved v2 m1 stage 0", LLAMA, m1, 0))
    out.append(_case("llama bf16 pp2 interleaved v2 m1 stage 1 (last)", LLAMA, m1, 1))
    eight = {**LLAMA, "num_hidden_layers": 8}
    out.append(
        _case("llama bf16 pp4 interleaved v2 m6 stage 0", eight, {"pp": 4, **inter, "pp_microbatches": 6}, 0)
    )
    return out


def _real(name: str, model: dict, parallel: dict, stage: int = 0, **keys: Any) -> tuple[str, dict, int]:
    """One case at a real vocabulary (``_REAL`` shapes unless ``keys`` say otherwise)."""
    return name, {"model": model, **_REAL, **keys, "parallel": parallel}, stage


def _real_vocab_cases() -> list[tuple[str, dict, int]]:
    """Real vocabularies (32k, 128k, 152k, 256k): FSDP2's root unit, torchtitan's loss parallel (dp x tp and
    tp alone), transformers' plan, pipeline last and first stages with 2+ micro-batches in flight."""
    tt: dict[str, Any] = {"precision": "amp-bf16", "framework": "torchtitan"}
    sp = {"sequence_parallel": True}
    inter = {"pp": 2, "pp_schedule": "interleaved", "virtual_stages": 2, "pp_microbatches": 4}
    four = {**LLAMA3_V128K, "num_hidden_layers": 4}
    return [
        _real("V128k llama3 torchtitan fsdp dp4", LLAMA3_V128K, {"dp": 4, "zero": 3}, **tt),
        _real(
            "V128k llama3 torchtitan fsdp dp4 b2 s4096 (loss outside the model)",
            LLAMA3_V128K,
            {"dp": 4, "zero": 3},
            **tt,
            micro_batch_size=2,
            seq_len=4096,
        ),
        _real("V32k mistral bf16 fsdp dp8", MISTRAL_V32K, {"dp": 8, "zero": 3}),
        _real("V256k bf16 fsdp dp4", LLAMA_V256K, {"dp": 4, "zero": 3}),
        _real("V128k llama3 torchtitan tp2 sp loss-parallel", LLAMA3_V128K, {"tp": 2, **sp}, **tt),
        _real(
            "V128k llama3 torchtitan tp2 sp loss-parallel b2 s4096",
            LLAMA3_V128K,
            {"tp": 2, **sp},
            **tt,
            micro_batch_size=2,
            seq_len=4096,
        ),
        _real(
            "V128k llama3 torchtitan dp2 x tp2 sp loss-parallel",
            LLAMA3_V128K,
            {"dp": 2, "tp": 2, "zero": 3, **sp},
            **tt,
        ),
        _real(
            "Llama 3.1 70B widths L2 torchtitan dp2 x tp8 sp loss-parallel full ckpt b16 s8192",
            LLAMA31_70B_L2,
            {"dp": 2, "tp": 8, "zero": 3, **sp},
            **tt,
            micro_batch_size=16,
            seq_len=8192,
            activation_checkpointing="full",
        ),
        _real("V152k qwen2.5 bf16 tp2 (hf plan)", QWEN25_V152K, {"tp": 2}),
        _real(
            "V128k llama3 bf16 pp2 1f1b m4 stage 1 (last)", LLAMA3_V128K, {"pp": 2, "pp_microbatches": 4}, 1
        ),
        _real(
            "V128k llama3 bf16 pp2 1f1b m4 stage 1 (last) b2 s4096",
            LLAMA3_V128K,
            {"pp": 2, "pp_microbatches": 4},
            1,
            micro_batch_size=2,
            seq_len=4096,
        ),
        _real("V128k llama3 bf16 pp2 interleaved v2 m4 stage 1 (last)", four, inter, 1),
        _real("V128k llama3 bf16 pp2 interleaved v2 m4 stage 0", four, inter, 0),
        _real(
            "V128k llama3 bf16 pp2 interleaved v2 m4 stage 0 b2 s4096",
            four,
            inter,
            0,
            micro_batch_size=2,
            seq_len=4096,
        ),
        _real(
            "V152k qwen2.5 bf16 pp2 1f1b m4 stage 1 (last)", QWEN25_V152K, {"pp": 2, "pp_microbatches": 4}, 1
        ),
        _real(
            "V128k llama3 bf16 tp2 sp torchtitan plan (hybrid: tp_plan key)",
            LLAMA3_V128K,
            {"tp": 2, **sp, "tp_plan": "torchtitan"},
        ),
        _real(
            "V128k llama3 torchtitan dp2 x tp2 sp without loss parallel",
            LLAMA3_V128K,
            {"dp": 2, "tp": 2, "zero": 3, **sp, "loss_parallel": False},
            **tt,
        ),
        _real(
            "V152k qwen2.5 bf16 dp2 x tp2 fsdp torchtitan plan (hybrid)",
            QWEN25_V152K,
            {"dp": 2, "tp": 2, "zero": 3, "tp_plan": "torchtitan"},
        ),
        _real(
            "V128k llama3 bf16 pp2 1f1b m4 uneven [1, 3] stage 0",
            four,
            {"pp": 2, "pp_microbatches": 4, "pp_layers": [1, 3]},
            0,
        ),
        _real(
            "V128k llama3 bf16 pp2 1f1b m4 uneven [3, 1] stage 1 (last)",
            four,
            {"pp": 2, "pp_microbatches": 4, "pp_layers": [3, 1]},
            1,
        ),
        _real(
            "V128k llama3 bf16 pp2 1f1b m4 stage 1 (last) return_outputs",
            LLAMA3_V128K,
            {"pp": 2, "pp_microbatches": 4},
            1,
            output_lifetime="step",
        ),
        _real(
            "V128k llama3 bf16 pp2 interleaved v2 m4 stage 1 (last) return_outputs",
            four,
            inter,
            1,
            output_lifetime="step",
        ),
    ]


def _split_cases() -> list[tuple[str, dict, int]]:
    """Pipelines at a real vocabulary that PyTorch runs and the trace or the engine once refused: interleaved
    micro-batches that pp does not divide, no pp_layers with layers that pp x virtual stages do not divide
    (torchtitan's split, rules/pipeline_split), and a first or last stage of no layer."""
    inter = {"pp": 2, "pp_schedule": "interleaved", "virtual_stages": 2, "pp_microbatches": 4}
    four = {**LLAMA3_V128K, "num_hidden_layers": 4}
    four_v32k = {**MISTRAL_V32K, "num_hidden_layers": 4}
    return [
        _real(
            "V128k llama3 bf16 pp2 interleaved v2 m3 stage 1 (last)",
            four,
            {**inter, "pp_microbatches": 3},
            1,
        ),
        _real(
            "V128k llama3 bf16 pp3 1f1b m4 auto split [2, 2, 1] (5 layers) stage 0",
            {**LLAMA3_V128K, "num_hidden_layers": 5},
            {"pp": 3, "pp_microbatches": 4},
            0,
        ),
        _real(
            "V128k llama3 bf16 pp2 interleaved v2 m4 auto split [1+2, 2+1] (6 layers) stage 1 (last)",
            {**LLAMA3_V128K, "num_hidden_layers": 6},
            inter,
            1,
        ),
        # a first stage of only the embedding, a last of only the final norm, head and loss (torchtitan's
        # module_fqns_per_model_part, Megatron's "E|t*4|L"-style layouts)
        _real(
            "V32k mistral bf16 pp2 1f1b m4 [0, 4] stage 0 (embedding only)",
            four_v32k,
            {"pp": 2, "pp_microbatches": 4, "pp_layers": [0, 4]},
            0,
        ),
        _real(
            "V32k mistral bf16 pp3 1f1b m4 [2, 2, 0] stage 2 (head and loss only)",
            four_v32k,
            {"pp": 3, "pp_microbatches": 4, "pp_layers": [2, 2, 0]},
            2,
        ),
        # a middle stage: its later micro-batches' backward makes each new gradient beside the carried ones
        _real(
            "V32k mistral bf16 pp3 1f1b m4 [2, 2, 2] stage 1 (middle)",
            {**MISTRAL_V32K, "num_hidden_layers": 6},
            {"pp": 3, "pp_microbatches": 4, "pp_layers": [2, 2, 2]},
            1,
        ),
        # GPipe runs every micro-batch's forward and loss before the first backward (ScheduleGPipe)
        _real(
            "V32k mistral bf16 pp2 gpipe m4 [2, 2] stage 1 (last)",
            four_v32k,
            {"pp": 2, "pp_schedule": "gpipe", "pp_microbatches": 4, "pp_layers": [2, 2]},
            1,
        ),
        _real(
            "V32k mistral bf16 pp2 gpipe m4 [3, 1] stage 1 (last)",
            four_v32k,
            {"pp": 2, "pp_schedule": "gpipe", "pp_microbatches": 4, "pp_layers": [3, 1]},
            1,
        ),
    ]


def _pp_fsdp_cases() -> list[tuple[str, dict, int]]:
    """Pipelines over FSDP2 (pp 2 x dp 2, ZeRO-3) at a real vocabulary: the schedule turns gradient sync and
    the reshard after backward off for every micro-batch and reduce-scatters once at its end (torch 2.13
    ``pipelining/stage.py``; engine/states/gathered ``pipeline_fsdp2``), under 1F1B, GPipe (its later
    backwards), interleaved 1F1B (a chunk gathered beside the other's, kept from its backward) and 1F1B
    without reshard after forward."""
    four_v32k = {**MISTRAL_V32K, "num_hidden_layers": 4}
    par = {"pp": 2, "dp": 2, "zero": 3, "pp_microbatches": 4}
    gpipe = {**par, "pp_schedule": "gpipe"}
    inter = {**par, "pp_schedule": "interleaved", "virtual_stages": 2}
    keep = {**par, "reshard_after_forward": False}
    return [
        _real("V32k mistral bf16 pp2 x dp2 fsdp 1f1b m4 stage 0", four_v32k, par, 0),
        _real("V32k mistral bf16 pp2 x dp2 fsdp 1f1b m4 stage 1 (last)", four_v32k, par, 1),
        _real("V32k mistral bf16 pp2 x dp2 fsdp gpipe m4 stage 0", four_v32k, gpipe, 0),
        _real("V32k mistral bf16 pp2 x dp2 fsdp gpipe m4 stage 1 (last)", four_v32k, gpipe, 1),
        _real("V32k mistral bf16 pp2 x dp2 fsdp interleaved v2 m4 stage 0", four_v32k, inter, 0),
        _real("V32k mistral bf16 pp2 x dp2 fsdp interleaved v2 m4 stage 1 (last)", four_v32k, inter, 1),
        _real(
            "V32k mistral bf16 pp2 x dp2 fsdp no reshard after forward 1f1b m4 stage 0", four_v32k, keep, 0
        ),
        _real(
            "V32k mistral bf16 pp2 x dp2 fsdp no reshard after forward 1f1b m4 stage 1 (last)",
            four_v32k,
            keep,
            1,
        ),
    ]


#: (name, scenario dict, pipeline stage traced).
CASES: list[tuple[str, dict[str, Any], int]] = (
    _fsdp_cases()
    + _replicate_cases()
    + _tp_cases()
    + _two_d_cases()
    + _pp_cases()
    + _real_vocab_cases()
    + _split_cases()
    + _pp_fsdp_cases()
)
#: The subset the tests run (one of each layout kind, a few seconds each).
FAST = (
    "llama bf16 fsdp dp4",
    "llama bf16 ddp dp2",
    "llama bf16 tp2 sp",
    "llama bf16 dp2 x tp2 fsdp",
    "llama torchtitan tp2 sp loss-parallel",
    "llama bf16 pp2 1f1b m4 stage 1 (last)",
    "V128k llama3 torchtitan fsdp dp4",
    "V152k qwen2.5 bf16 tp2 (hf plan)",
    "V128k llama3 bf16 pp2 1f1b m4 stage 1 (last)",
    "V128k llama3 bf16 pp2 interleaved v2 m4 stage 0",
    "V128k llama3 bf16 pp2 interleaved v2 m4 auto split [1+2, 2+1] (6 layers) stage 1 (last)",
    "V32k mistral bf16 pp2 x dp2 fsdp interleaved v2 m4 stage 0",
)


def rank_of_stage(sc: Scenario, stage: int) -> int:
    """The first global rank of a pipeline stage (pp is the outermost mesh dimension, as in torchtitan)."""
    return stage * (sc.parallel.world_size // sc.parallel.pp)


def compare(name: str, data: dict[str, Any], stage: int = 0) -> dict[str, Any]:
    """Trace one rank of the scenario and simulate the same stage."""
    from memsim_widget.trace.api import trace_scenario

    sc = Scenario.from_dict(data)
    rank_est = estimate(sc).ranks[stage]
    t0 = time.perf_counter()
    tr = trace_scenario(sc, rank=rank_of_stage(sc, stage))
    secs = time.perf_counter() - t0
    err = (rank_est.peak_tensor_bytes - tr.peak_bytes) / tr.peak_bytes
    moment = max(rank_est.moments, key=lambda m: m.tensor_bytes).name
    return {
        "name": name,
        "world": sc.parallel.world_size,
        "rank": tr.rank,
        "engine": rank_est.peak_tensor_bytes,
        "trace": tr.peak_bytes,
        "error": err,
        "engine_moment": moment,
        "trace_phase": tr.peak_phase,
        "trace_op": tr.peak_op,
        "seconds": secs,
        "by_role": tr.by_role,
        "role": tr.rank_role,
    }
