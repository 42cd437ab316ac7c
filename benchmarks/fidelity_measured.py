"""Engine vs published GPU measurements: each row's counter predicted and compared, written to docs/accuracy.md.

The rows live in ``data/measured/*.csv``: ``published.csv`` is the normalised form of the shared
development set (kept outside the repository, read from ``SOURCE`` by ``--normalise``; docs/memory-facts.md
#development-data) -- its columns plus the scenario JSON the engine
runs, the counter the row measured, exact bytes, and whether the row can be reproduced at all -- and
``gpu_*.csv`` files are rows measured by ``benchmarks/gpu_measure.py`` on a real GPU.

Run:
    python benchmarks/fidelity_measured.py                        # print the comparison
    python benchmarks/fidelity_measured.py --normalise            # rebuild data/measured/published.csv
    python benchmarks/fidelity_measured.py --fit                  # refit the two fragmentation constants
    python benchmarks/fidelity_measured.py --write docs/accuracy.md
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import re
import statistics
import sys
import textwrap
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memsim_widget.engine import core
from memsim_widget.engine.counters import overhead
from memsim_widget.engine.estimate import Estimate
from memsim_widget.engine.frameworks import PROFILES
from memsim_widget.errors import ScenarioError
from memsim_widget.measure import COLUMNS as COLUMNS  # the data/measured columns, read by the tests
from memsim_widget.measure import SOURCE_COLUMNS, write_csv
from memsim_widget.scenario import Scenario

ROOT = Path(__file__).resolve().parents[1]
DATA_DIR = ROOT / "data" / "measured"
PUBLISHED = DATA_DIR / "published.csv"
SOURCE = ROOT.parent / "shared" / "data" / "measured-dev.csv"
GiB = 2**30

#: Accuracy target of issue #5 on the evaluation rows.
TARGET_MEDIAN = 0.08
TARGET_WORST_UNDER = -0.15
#: Scored rows under-predicted beyond ``TARGET_WORST_UNDER`` whose cause was investigated and is written up
#: under "Known misses" instead of being tuned away (issue #5: "Where a row cannot be reproduced, explain why
#: in the doc rather than tuning a constant to it"). They stay in the statistics, flagged.
#: tests/engine/test_accuracy.py fails if any other row crosses the bound, or if one of these no longer does.
EXPLAINED_UNDER: dict[str, str] = {
    "121": "bitsandbytes QLoRA run holding about 5 GiB its stated configuration does not account for",
}

#: Targets on the project's own GPU runs (``benchmarks/gpu_measure.py``, ids ``g-...``): the allocated counter
#: is what the engine computes exactly, so its median must stay under 1% and every row within 2%, except the
#: rows below, whose cause is written up under "The project's own GPU runs" (tests/engine/test_accuracy.py).
GPU_TARGET_ALLOCATED_MEDIAN = 0.01
GPU_TARGET_ALLOCATED_ROW = 0.02
GPU_EXPLAINED_ALLOCATED: dict[str, str] = {
    "g-vitb-amp-compile-allocated": "torch.compile, an untraced formula (eager's layers): the GPU ran 15% over eager "
    "while the CPU trace of the compiled step saves less than eager (docs/fidelity.md, compiled steps)",
    "g-llama1b-bf16-compile-allocated": "torch.compile: the partitioner's saved set (engine equals the compiled trace), "
    "+3.9%: the trace itself is +3.5% over the run (its emulated Inductor fusion keeps some buffers Inductor does not)",
}

#: Issue #22's bar for the engine's reserved and nvidia-smi by replay (``reserved_model: replay``) on the
#: project's eager GPU runs: median error within 3%, no run under by more than 3% except a run whose allocated
#: miss is explained above (its replay replays the same missing tensors). tests/engine/test_accuracy_replay.py.
GPU_TARGET_REPLAY_MEDIAN = 0.03
GPU_TARGET_REPLAY_UNDER = -0.03
#: Replayed counters under the bar for a stated cause other than an allocated miss (run-counter -> why). Empty
#: since the Hopper cards' context comes from public readings of a training step's memory outside PyTorch
#: (docs/memory-facts.md#memory-outside-the-tensors); vitb-amp-nvidia-smi was -3.9% with the former 512 MiB.
GPU_EXPLAINED_REPLAY: dict[str, str] = {}

#: Bytes per unit as the sources use them (GB = 1e9, GiB = 2^30).
UNIT_BYTES = {"B": 1, "MB": 10**6, "GB": 10**9, "MiB": 2**20, "GiB": 2**30}
#: The engine counter that predicts each measured counter ("unknown": the lowest, allocated, so that an
#: under-prediction is never hidden; "active" is within ~1% of allocated, docs/memory-facts.md#counters).
COUNTER_KEY = {
    "allocated": "peak_allocated_bytes",
    "active": "peak_allocated_bytes",
    "unknown": "peak_allocated_bytes",
    "reserved": "peak_reserved_bytes",
    "nvidia-smi": "device_total_bytes",
}
#: Columns of every data/measured CSV (the source's, then what the benchmark needs): memsim_widget/measure.py.


# ----- normalisation: units, counters ---------------------------------------------------------------------
def to_bytes(value: str | float, unit: str) -> int:
    """Exact bytes of a measured figure in the source's unit (GB = 1e9 B, GiB = 2^30 B, MiB = 2^20 B)."""
    if unit not in UNIT_BYTES:
        raise ValueError(f"unknown unit {unit!r}; expected one of {', '.join(UNIT_BYTES)}")
    return round(float(value) * UNIT_BYTES[unit])


def classify_counter(what_measured: str) -> str:
    """Which GPU counter a ``what_measured`` note describes: nvidia-smi | reserved | allocated | active | unknown."""
    text = what_measured.lower()
    if "nvidia-smi" in text or "pynvml" in text or "mem_get_info" in text:
        return "nvidia-smi"
    if "unstated" in text or "which stat" in text:
        return "unknown"
    if "max_memory_reserved" in text or "memory_reserved" in text:
        return "reserved"
    if "active_bytes" in text or re.search(r"\bactive\b", text):
        return "active"
    if "max_memory_allocated" in text or "tracemalloc" in text or re.search(r"\ballocated\b", text):
        return "allocated"
    return "unknown"


# ----- the scenario of each published row -------------------------------------------------------------------
@dataclass(frozen=True)
class RowSpec:
    """How one published row becomes a scenario: the JSON, or why it cannot be reproduced, and what was assumed."""

    scenario: dict[str, Any] | None
    reproducible: bool = True
    reason: str = ""
    assumptions: str = ""


def _qwen_v1(h: int, layers: int, heads: int, inter: int, vocab: int) -> dict[str, Any]:
    """Qwen v1 (remote code, model_type 'qwen') in the phi3 layout: fused qkv Linear (c_attn), RMSNorm, RoPE,
    SwiGLU, untied head; parameter counts match the published 1.84B / 7.72B / 14.17B within 0.01%."""
    return {
        "model_type": "phi3",
        "hidden_size": h,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": heads,
        "intermediate_size": inter,
        "vocab_size": vocab,
        "tie_word_embeddings": False,
        "max_position_embeddings": 32768,
    }


QWEN_7B = _qwen_v1(4096, 32, 32, 11008, 151936)
QWEN_14B = _qwen_v1(5120, 40, 40, 13696, 152064)
QWEN_1_8B = _qwen_v1(2048, 24, 16, 5504, 151936)
#: BertForSequenceClassification(bert-large, 2 labels) expressed with the engine's BERT (masked-LM layout):
#: a 2-entry "vocabulary" is the 2-label classifier (its transform dense + LayerNorm stand for the pooler),
#: and the 30,522 word embeddings sit in the position table, which is trained and read the same way.
#: 335,145,986 parameters vs 335,143,938 in transformers (2,048 apart); logits b x s x 2 instead of b x 2.
BERT_LARGE_CLS = {
    "model_type": "bert",
    "hidden_size": 1024,
    "num_hidden_layers": 24,
    "num_attention_heads": 16,
    "intermediate_size": 4096,
    "vocab_size": 2,
    "max_position_embeddings": 512 + 30522,
}
#: bigscience/T0_3B: T5 v1.1 XL layout (gated-GELU, untied head), 2.85B parameters.
T0_3B = {
    "model_type": "t5",
    "d_model": 2048,
    "d_ff": 5120,
    "d_kv": 64,
    "num_heads": 32,
    "num_layers": 24,
    "vocab_size": 32128,
    "feed_forward_proj": "gated-gelu",
    "tie_word_embeddings": False,
}
#: bigscience/mt0-xxl: mT5-XXL layout (model_type mt5 is T5 v1.1 with a 250k vocabulary), 12.9B parameters.
MT0_XXL = {**T0_3B, "d_model": 4096, "d_ff": 10240, "num_heads": 64, "vocab_size": 250112}
#: timm vit_huge_patch14_224 with a 45-class head (resisc45), as the engine's ViT (HF layout).
VIT_H14 = {
    "model_type": "vit",
    "hidden_size": 1280,
    "num_hidden_layers": 32,
    "num_attention_heads": 16,
    "intermediate_size": 5120,
    "patch_size": 14,
    "image_size": 224,
    "num_labels": 45,
}

_SWIFT = {
    "model": QWEN_7B,
    "method": "lora",
    "lora": {"rank": 8, "alpha": 32, "targets": ["qkv_proj"], "adapter_dtype": "bf16"},
    "precision": "bf16",
    "optimizer": "adamw",
    "optimizer_impl": "foreach",
    "grad_accum_steps": 16,
    "activation_checkpointing": "full",
    "attention": "sdpa",
    "padding": "longest",
    "gpu": "a100-80gb",
}
_SWIFT_NOTE = (
    "Qwen v1 in the phi3 layout (fused qkv = c_attn); bf16 weights under Trainer bf16 autocast = the engine's "
    "bf16 path; peft of the time cast adapters to the base dtype; LoRA dropout 0.05 not modelled; batches "
    "padded per batch (cls-fudan-news-zh, 3234+-2547 tokens): padding 'longest'"
)
_BERT = {
    "model": BERT_LARGE_CLS,
    "micro_batch_size": 4,
    "seq_len": 512,
    "attention": "eager",
    "optimizer": "adamw",
    "optimizer_impl": "for-loop",
    "gpu": "v100-16gb",
    "cuda_lazy_loading": False,
    "zero_grad": "zeros",
}
_BERT_NOTE = (
    "BertForSequenceClassification as the engine's BERT with a 2-entry vocabulary (see BERT_LARGE_CLS); "
    "transformers' own AdamW of 2022 steps tensor by tensor (for-loop); CUDA 11 loads modules eagerly; "
    "the 2022 Trainer's model.zero_grad() zeroed the gradients in place (torch < 2.0), so they live through "
    "the next step"
)
_VIT = {
    "model": VIT_H14,
    "precision": "amp-bf16",
    "optimizer": "adamw",
    "optimizer_impl": "fused",
    "micro_batch_size": 8,
    "compile": True,
    "gpu": {"memory_gib": 16, "name": "RTX 4070 Ti SUPER 16GB"},
}
_VIT_NOTE = (
    "timm ViT-H/14 as HF's ViT: timm fuses q, k, v into one Linear (one autocast input copy instead of "
    "three, -0.31 GiB) and the model was compiled, whose effect the engine does not model"
)
_TORCHTUNE_LEN = (
    "input length unknown: the recipe padded alpaca samples to the longest in each batch, not to the stated "
    "2048 (PR #961 could not reproduce the table with inputs forced to 2048)"
)
_LLAMA2_7B_TT = {
    "model": "llama-2-7b",
    "framework": "torchtune",
    "precision": "bf16",
    "micro_batch_size": 4,
    "seq_len": 2048,
    "activation_checkpointing": "full",
    "gpu": "rtx-4090",
}
_PEFT_T5 = {
    "model": T0_3B,
    "precision": "fp32",
    "optimizer": "adamw",
    "optimizer_impl": "for-loop",
    "micro_batch_size": 8,
    "seq_len": 64,
    "attention": "eager",
    "padding": "longest",
    "gpu": "a100-80gb",
}
_T5_LEN = (
    "input lengths unknown (tweets padded to the longest of each batch, labels of a few tokens) and the engine "
    "gives T5's encoder and decoder one sequence length: the activations, about a fifth of this figure, "
    "cannot be pinned down"
)
_DS_OFFLOAD = (
    "DeepSpeed ZeRO-3 with parameter and optimizer offload on one GPU: how many fetched parameters stay "
    "resident is set by stage3_max_live_parameters / max_reuse_distance (1e9 each) and the order modules "
    "run, which the engine does not model; the printed TorchTracemalloc field is also not stated"
)


def _lora(rank: int, alpha: int, targets: list[str], dtype: str = "bf16") -> dict[str, Any]:
    """A LoRA block for a scenario."""
    return {"rank": rank, "alpha": alpha, "targets": targets, "adapter_dtype": dtype}


ROWS: dict[int, RowSpec] = {
    # ----- torchtune README table (2024-05) and PR #961 -------------------------------------------------
    18: RowSpec(
        {
            **_LLAMA2_7B_TT,
            "method": "qlora",
            "lora": _lora(
                8, 16, ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
            ),
            "compile": True,
        },
        False,
        _TORCHTUNE_LEN + "; compiled",
    ),
    19: RowSpec(
        {**_LLAMA2_7B_TT, "method": "lora", "lora": _lora(8, 16, ["q_proj", "v_proj"])}, False, _TORCHTUNE_LEN
    ),
    20: RowSpec(
        {
            **_LLAMA2_7B_TT,
            "method": "lora",
            "lora": _lora(8, 16, ["q_proj", "v_proj"]),
            "activation_checkpointing": "none",
            "parallel": {"dp": 2, "zero": 3},
        },
        False,
        _TORCHTUNE_LEN + "; without checkpointing 4 x 2048 tokens of a 7B model cannot fit a 24 GB card",
    ),
    21: RowSpec(
        {
            **_LLAMA2_7B_TT,
            "optimizer": "paged-adamw",
            "optimizer_impl": "fused",
            "optimizer_in_backward": True,
        },
        False,
        _TORCHTUNE_LEN + " (rows 25 and 26 are this recipe with inputs forced to 2048)",
    ),
    22: RowSpec(
        {**_LLAMA2_7B_TT, "parallel": {"dp": 4, "zero": 3}},
        False,
        _TORCHTUNE_LEN + "; 24.1 GB on a 24 GB card is the card, not the step",
    ),
    23: RowSpec(
        {
            **_LLAMA2_7B_TT,
            "model": "llama-2-70b",
            "method": "lora",
            "lora": _lora(16, 32, ["q_proj", "k_proj", "v_proj"]),
            "seq_len": 4096,
            "parallel": {"dp": 8, "zero": 3},
            "gpu": "a100-80gb",
        },
        False,
        _TORCHTUNE_LEN,
    ),
    24: RowSpec(
        {
            **_LLAMA2_7B_TT,
            "model": "llama-2-70b",
            "optimizer": "paged-adamw",
            "optimizer_impl": "fused",
            "seq_len": 4096,
            "parallel": {"dp": 8, "zero": 3},
            "gpu": "a100-80gb",
        },
        False,
        _TORCHTUNE_LEN + "; custom config not in the repository",
    ),
    25: RowSpec(
        {
            **_LLAMA2_7B_TT,
            "optimizer": "paged-adamw",
            "optimizer_impl": "fused",
            "optimizer_in_backward": True,
            "gpu": "a100-80gb",
        },
        assumptions="inputs forced to 4 x 2048 tokens; GPU unspecified (an A100 assumed: the counter does not "
        "depend on the card); paged states live outside the caching allocator",
    ),
    26: RowSpec(
        {
            **_LLAMA2_7B_TT,
            "optimizer": "paged-adamw",
            "optimizer_impl": "fused",
            "optimizer_in_backward": True,
            "gpu": "a100-80gb",
        },
        assumptions="same setup as row 25 on an A100; which counter is not stated (compared with allocated)",
    ),
    # ----- torchao low-bit optimizers, ViT-H/14 -------------------------------------------------------------
    50: RowSpec(_VIT, assumptions=_VIT_NOTE),
    51: RowSpec({**_VIT, "optimizer": "adamw-8bit"}, assumptions=_VIT_NOTE),
    52: RowSpec({**_VIT, "optimizer": "adamw-4bit"}, assumptions=_VIT_NOTE),
    # ----- transformers docs (2022), BERT-large on a V100 -----------------------------------------------------
    81: RowSpec({**_BERT, "precision": "fp32"}, assumptions=_BERT_NOTE),
    82: RowSpec(
        {**_BERT, "precision": "fp32", "micro_batch_size": 1, "grad_accum_steps": 4}, assumptions=_BERT_NOTE
    ),
    83: RowSpec(
        {
            **_BERT,
            "precision": "fp32",
            "micro_batch_size": 1,
            "grad_accum_steps": 4,
            "activation_checkpointing": "full",
        },
        assumptions=_BERT_NOTE,
    ),
    84: RowSpec({**_BERT, "precision": "amp-fp16"}, assumptions=_BERT_NOTE),
    85: RowSpec(
        {
            **_BERT,
            "precision": "amp-fp16",
            "micro_batch_size": 1,
            "grad_accum_steps": 4,
            "activation_checkpointing": "full",
        },
        assumptions=_BERT_NOTE,
    ),
    86: RowSpec({**_BERT, "precision": "fp32", "optimizer": "adafactor"}, assumptions=_BERT_NOTE),
    87: RowSpec(
        {
            **_BERT,
            "precision": "amp-fp16",
            "optimizer": "adafactor",
            "micro_batch_size": 1,
            "grad_accum_steps": 4,
            "activation_checkpointing": "full",
        },
        assumptions=_BERT_NOTE,
    ),
    88: RowSpec(
        {**_BERT, "precision": "fp32", "optimizer": "adamw-8bit", "optimizer_impl": "fused"},
        assumptions=_BERT_NOTE + "; bitsandbytes Adam8bit = the adamw-8bit state layout",
    ),
    89: RowSpec(
        {
            **_BERT,
            "precision": "amp-fp16",
            "optimizer": "adamw-8bit",
            "optimizer_impl": "fused",
            "micro_batch_size": 1,
            "grad_accum_steps": 4,
            "activation_checkpointing": "full",
        },
        assumptions=_BERT_NOTE + "; bitsandbytes Adam8bit = the adamw-8bit state layout",
    ),
    # ----- peft README (2022) -----------------------------------------------------------------------------
    90: RowSpec(
        _PEFT_T5,
        assumptions="input length unknown (short tweets): 64 assumed; the figure is 97% weights, gradients and "
        "Adam states, so the assumption moves it by under 1%; torch 1.13's AdamW steps tensor by tensor",
    ),
    91: RowSpec({**_PEFT_T5, "method": "lora", "lora": _lora(8, 32, ["q", "v"], "fp32")}, False, _T5_LEN),
    92: RowSpec(
        {
            **_PEFT_T5,
            "method": "lora",
            "lora": _lora(8, 32, ["q", "v"], "fp32"),
            "framework": "deepspeed",
            "parallel": {"zero": 3, "offload": "optimizer+params"},
        },
        False,
        _DS_OFFLOAD,
    ),
    93: RowSpec(
        {**_PEFT_T5, "model": MT0_XXL, "method": "lora", "lora": _lora(8, 32, ["q", "v"], "fp32")},
        False,
        _T5_LEN + "; the figure is rounded",
    ),
    94: RowSpec(
        {
            **_PEFT_T5,
            "model": MT0_XXL,
            "method": "lora",
            "lora": _lora(8, 32, ["q", "v"], "fp32"),
            "framework": "deepspeed",
            "parallel": {"zero": 3, "offload": "optimizer+params"},
        },
        False,
        _DS_OFFLOAD,
    ),
    95: RowSpec(
        None,
        False,
        "BLOOM (ALiBi, fused query_key_value, embedding LayerNorm) is not a model family of the engine",
    ),
    96: RowSpec(None, False, "BLOOM is not a model family of the engine; " + _DS_OFFLOAD),
    # ----- ms-swift benchmark (A100 80GB, Dec 2023) -----------------------------------------------------------
    107: RowSpec({**_SWIFT, "seq_len": 512}, assumptions=_SWIFT_NOTE),
    108: RowSpec({**_SWIFT, "seq_len": 1024}, assumptions=_SWIFT_NOTE),
    109: RowSpec({**_SWIFT, "seq_len": 2048}, assumptions=_SWIFT_NOTE),
    110: RowSpec({**_SWIFT, "seq_len": 4096}, assumptions=_SWIFT_NOTE),
    111: RowSpec({**_SWIFT, "seq_len": 8192}, assumptions=_SWIFT_NOTE),
    112: RowSpec({**_SWIFT, "seq_len": 2048, "micro_batch_size": 2}, assumptions=_SWIFT_NOTE),
    113: RowSpec({**_SWIFT, "seq_len": 2048, "micro_batch_size": 4}, assumptions=_SWIFT_NOTE),
    114: RowSpec({**_SWIFT, "seq_len": 2048, "micro_batch_size": 8}, assumptions=_SWIFT_NOTE),
    115: RowSpec({**_SWIFT, "seq_len": 2048, "attention": "eager"}, assumptions=_SWIFT_NOTE),
    116: RowSpec({**_SWIFT, "seq_len": 2048, "activation_checkpointing": "none"}, assumptions=_SWIFT_NOTE),
    117: RowSpec(
        {**_SWIFT, "seq_len": 2048, "activation_checkpointing": "none", "attention": "eager"},
        assumptions=_SWIFT_NOTE,
    ),
    118: RowSpec({**_SWIFT, "model": QWEN_14B, "seq_len": 2048}, assumptions=_SWIFT_NOTE),
    119: RowSpec({**_SWIFT, "model": QWEN_1_8B, "seq_len": 2048}, assumptions=_SWIFT_NOTE),
    120: RowSpec(
        {k: v for k, v in {**_SWIFT, "seq_len": 2048, "method": "full"}.items() if k != "lora"},
        assumptions=_SWIFT_NOTE + "; AdamW states in bf16 (bf16 parameters); the card is nearly full "
        "(512 -> 73.37, 4096 -> 78.76 GiB in the same table)",
    ),
    121: RowSpec(
        {**_SWIFT, "seq_len": 2048, "method": "qlora", "lora": {**_SWIFT["lora"], "adapter_dtype": "fp32"}},
        assumptions=_SWIFT_NOTE
        + "; bitsandbytes NF4 with double quantisation, adapters fp32 on a quantised base",
    ),
}

#: Published rows this repository carries itself (not in the shared development set): litgpt's resource tables,
#: development rows like the rest (nothing is fitted on them). Source: Lightning-AI/litgpt
#: tutorials/resource-tables.md (LitGPT commit 8641822, 2023-10-20, 1 x A100-SXM4-40GB, PyTorch 2.1.0,
#: ``--precision bf16-true``, finetune/lora.py on Alpaca). ``--normalise`` appends them to the source's rows.
_LITGPT_TABLE = (
    "Lightning-AI/litgpt tutorials/resource-tables.md 'Finetuning with LoRA on 1 GPU' (LitGPT commit 8641822, "
    "2023-10-20)"
)
_LITGPT_WHAT = (
    "'Max GPU RAM' (GB = 1e9): lit-gpt's finetune scripts print torch.cuda.max_memory_allocated() / 1e9 as "
    "'Memory used' at the end of training (assumed to be the table's figure)"
)
_LITGPT_NOTE = (
    "Alpaca, longest Llama 2 sample 1304 tokens; lit-gpt's first iteration runs the longest sample "
    "(longest_seq_ix), so the peak batch is padded to 1304"
)
REPO_SOURCE_ROWS: list[dict[str, str]] = [
    {"id": str(rid), "source": _LITGPT_TABLE, "model": model, "params_b": params, "method": "lora",
     "precision": "bf16-true", "optimizer": "adamw (torch)", "micro_batch": str(mb), "seq_len": "1304",
     "grad_accum": "128 / micro batch", "activation_checkpointing": "none", "attention": "sdpa", "lora_rank": "8",
     "lora_targets": "query, value (alpha 16)", "quant": "none", "parallelism": "single", "num_gpus": "1",
     "gpu": "A100-SXM4-40GB", "measured_peak_gb": gb, "what_measured": _LITGPT_WHAT, "notes": _LITGPT_NOTE,
     "unit": "GB", "peak_gib": f"{float(gb) * 1e9 / 2**30:.2f}", "trust": "medium"}
    for rid, model, params, mb, gb in (
        (201, "meta-llama/Llama-2-7b-hf", "6.74", 1, "21.30"),
        (202, "meta-llama/Llama-2-7b-hf", "6.74", 2, "29.07"),
        (203, "meta-llama/Llama-2-13b-hf", "13.0", 1, "38.12"),
    )
]  # fmt: skip
_LITGPT_LORA = {
    "precision": "bf16",
    "framework": "litgpt",
    "method": "lora",
    "lora": _lora(8, 16, ["q_proj", "v_proj"]),
    "seq_len": 1304,
    "padding": "max_length",
    "gpu": "a100-40gb",
}
_LITGPT_ASSUMED = (
    "litgpt 0.5.13's model, LoRA and chunked loss stand for the 2023 lit-gpt the table ran (same fused qkv, "
    "LoRAQKVLinear, 128-token lm_head chunks); AdamW foreach; the table's counter assumed max_memory_allocated"
)
ROWS.update(
    {
        201: RowSpec(
            {**_LITGPT_LORA, "model": "llama-2-7b", "micro_batch_size": 1}, assumptions=_LITGPT_ASSUMED
        ),
        202: RowSpec(
            {**_LITGPT_LORA, "model": "llama-2-7b", "micro_batch_size": 2}, assumptions=_LITGPT_ASSUMED
        ),
        203: RowSpec(
            {**_LITGPT_LORA, "model": "llama-2-13b", "micro_batch_size": 1}, assumptions=_LITGPT_ASSUMED
        ),
    }
)


def normalise(source_rows: Iterable[dict[str, str]]) -> list[dict[str, str]]:
    """The published rows with exact bytes, the counter measured, and the scenario (or why there is none)."""
    out = []
    for src in source_rows:
        row = {c: src.get(c, "") for c in SOURCE_COLUMNS}
        rid = int(row["id"])
        spec = ROWS.get(rid, RowSpec(None, False, "no scenario written for this row yet"))
        scenario = spec.scenario
        reproducible, reason = spec.reproducible, spec.reason
        if scenario is not None:
            try:
                scenario = Scenario.from_dict(scenario).to_dict()
            except ScenarioError as exc:
                scenario, reproducible, reason = None, False, f"not expressible: {exc}"
        row.update(
            measured_bytes=str(to_bytes(row["measured_peak_gb"], row["unit"])),
            counter=classify_counter(row["what_measured"]),
            framework=(scenario or {}).get("framework", ""),
            reproducible="true" if reproducible else "false",
            reason=reason,
            assumptions=spec.assumptions,
            scenario_json=json.dumps(scenario, sort_keys=True, separators=(",", ":")) if scenario else "",
        )
        out.append(row)
    return out


def read_csv(path: Path) -> list[dict[str, str]]:
    """Rows of one CSV file as dicts."""
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def load_rows(data_dir: Path = DATA_DIR) -> list[dict[str, str]]:
    """Every measured row of ``data_dir/*.csv`` (the published set first, then GPU runs); the OOM-boundary
    files (``oom_boundary_*.csv``, another format) are read by ``benchmarks/oom_boundary_compare.py``."""
    files = sorted(
        (p for p in data_dir.glob("*.csv") if not p.name.startswith("oom_boundary_")),
        key=lambda p: (p.name != PUBLISHED.name, p.name),
    )
    return [r for p in files for r in read_csv(p)]


# ----- prediction and error -------------------------------------------------------------------------------
def role(row: dict[str, str]) -> str:
    """``fit`` (odd-id published rows that measure reserved or nvidia-smi: the fragmentation constants are
    fitted on them), ``gpu`` (the project's own runs, ids ``g-...``), ``eval`` (every other reproducible
    published row), or ``excluded``."""
    if row["reproducible"] != "true":
        return "excluded"
    if row["id"].startswith("g-"):
        return "gpu"  # the project's own runs: reported apart, no constant is fitted on them
    if row["id"].isdigit() and int(row["id"]) % 2 == 1 and row["counter"] in ("reserved", "nvidia-smi"):
        return "fit"
    return "eval"


def predict(row: dict[str, str]) -> dict[str, Any]:
    """The engine's prediction of the row's counter, its band, and the row's error."""
    result: dict[str, Any] = {"row": row, "role": role(row), "predicted": None, "error": None}
    if not row["scenario_json"]:
        return result
    est: Estimate = core.estimate(Scenario.from_dict(json.loads(row["scenario_json"])))
    key = COUNTER_KEY[row["counter"]]
    predicted = getattr(est, key)
    measured = int(row["measured_bytes"])
    lo, hi = est.worst.uncertainty()[key].values()
    result.update(
        estimate=est,
        key=key,
        predicted=predicted,
        measured=measured,
        error=predicted / measured - 1,
        low=lo,
        high=hi,
        inside=lo <= measured <= hi,
    )
    return result


def evaluate(rows: Iterable[dict[str, str]]) -> list[dict[str, Any]]:
    """Predictions for every row."""
    return [predict(r) for r in rows]


def replay_errors(rows: Iterable[dict[str, str]]) -> dict[str, dict[str, float]]:
    """The engine's reserved and nvidia-smi under ``reserved_model: replay`` against each eager GPU run's rows:
    run -> counter -> error (compiled runs left out: issue #22's bar is on the eager runs)."""
    out: dict[str, dict[str, float]] = {}
    for row in rows:
        if role(row) != "gpu" or row["counter"] not in ("reserved", "nvidia-smi") or not row["scenario_json"]:
            continue
        d = json.loads(row["scenario_json"])
        if d.get("compile"):
            continue
        est = core.estimate(Scenario.from_dict({**d, "reserved_model": "replay"}))
        run = row["id"].removeprefix("g-").removesuffix(f"-{row['counter']}")
        out.setdefault(run, {})[row["counter"]] = (
            getattr(est, COUNTER_KEY[row["counter"]]) / int(row["measured_bytes"]) - 1
        )
    return out


def summarise(results: list[dict[str, Any]], roles: tuple[str, ...] = ("eval",)) -> dict[str, Any]:
    """Median and worst |error|, under-predictions and band coverage over the rows of ``roles``."""
    scored = [r for r in results if r["role"] in roles and r["error"] is not None]
    if not scored:
        return {"n": 0}
    errs = [abs(r["error"]) for r in scored]
    worst = max(scored, key=lambda r: abs(r["error"]))
    unders = [r for r in scored if r["error"] < 0]
    worst_under = min((r["error"] for r in unders), default=0.0)
    return {
        "n": len(scored),
        "median": statistics.median(errs),
        "worst": worst["error"],
        "worst_id": worst["row"]["id"],
        "under": len(unders),
        "worst_under": worst_under,
        "under_over_15": sorted(
            (r["row"]["id"] for r in unders if r["error"] < TARGET_WORST_UNDER), key=_id_key
        ),
        "inside_band": sum(r["inside"] for r in scored),
    }


def _id_key(rid: str) -> tuple[int, str]:
    """Sort ids numerically, GPU-run ids after the published ones."""
    return (int(rid), "") if rid.isdigit() else (10**9, rid)


def per_source(results: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """The summary of scored rows (fit and eval) per source, in first-seen order."""
    names: list[str] = []
    for r in results:
        s = short_source(r["row"]["source"])
        if s not in names:
            names.append(s)
    return [
        (n, summarise([r for r in results if short_source(r["row"]["source"]) == n], ("fit", "eval")))
        for n in names
    ]


def short_source(source: str) -> str:
    """A short label for a source string."""
    for key, label in (
        ("gpu_measure", "benchmarks/gpu_measure.py"),
        ("torchtune", "torchtune README / PR #961"),
        ("pytorch/ao", "torchao low-bit optimizers"),
        ("transformers", "transformers docs (BERT)"),
        ("peft", "peft README"),
        ("ms-swift", "ms-swift benchmark"),
    ):
        if key in source:
            return label
    return source[:40]


# ----- fitting the two fragmentation constants ----------------------------------------------------------------
@contextmanager
def constants(**values: float) -> Iterator[None]:
    """Temporarily set overhead constants (and clear the engine's cache) to evaluate another fit."""
    old = {k: getattr(overhead, k) for k in values}
    try:
        for k, v in values.items():
            setattr(overhead, k, v)
        core._estimate.cache_clear()
        yield
    finally:
        for k, v in old.items():
            setattr(overhead, k, v)
        core._estimate.cache_clear()


def implied(row: dict[str, str], name: str, hi: float = 20.0) -> float | None:
    """The value of constant ``name`` at which the engine reproduces this row exactly (bisection in [0, hi]):
    None if the row is over-predicted even with the constant at 0, ``hi`` if under-predicted at ``hi``. The
    row is predicted by the fitted rule (``reserved_model: fitted``), whose constants these are, whatever the
    default reserved model."""
    sc = json.loads(row["scenario_json"])
    row = {**row, "scenario_json": json.dumps({**sc, "reserved_model": "fitted"})}

    def err(x: float) -> float:
        with constants(**{name: x}):
            return predict(row)["error"]

    lo_err, hi_err = err(0.0), err(hi)
    if hi_err < 0 and not math.isclose(lo_err, hi_err):
        return hi  # under-predicted even at the top of the range
    if lo_err > 0 or math.isclose(lo_err, hi_err):
        return None  # over-predicted with no fragmentation at all, or the constant does not act on this row
    lo, up = 0.0, hi
    for _ in range(40):
        mid = (lo + up) / 2
        if err(mid) < 0:
            lo = mid
        else:
            up = mid
    return (lo + up) / 2


def fit(rows: list[dict[str, str]]) -> dict[str, dict[str, Any]]:
    """Fit FRAGMENTATION_TRANSIENT on fixed-shape fit rows and FRAGMENTATION_VARIABLE on variable-shape ones.

    Each constant is the median of the per-row implied values (rows whose value is undefined count as 0).
    The transient constant is fitted first; the variable one is fitted with it in place.
    """
    fits: dict[str, dict[str, Any]] = {}
    fit_rows = [r for r in rows if role(r) == "fit"]
    groups = (
        ("FRAGMENTATION_TRANSIENT", lambda sc: sc.get("padding") != "longest"),
        ("FRAGMENTATION_VARIABLE", lambda sc: sc.get("padding") == "longest"),
    )
    fitted: dict[str, float] = {}
    for name, pick in groups:
        chosen = [r for r in fit_rows if pick(json.loads(r["scenario_json"]))]
        with constants(**fitted):
            values = {r["id"]: implied(r, name) for r in chosen}
        median = statistics.median(v or 0.0 for v in values.values()) if values else getattr(overhead, name)
        fitted[name] = median
        fits[name] = {"value": median, "rows": values, "current": getattr(overhead, name)}
    return fits


# ----- report -----------------------------------------------------------------------------------------------
def _gib(n: float | None) -> str:
    """GiB with two decimals."""
    return "" if n is None else f"{n / GiB:.2f}"


def _pct(x: float | None) -> str:
    """A signed percentage."""
    return "" if x is None else f"{x:+.1%}"


def _scenario_label(sc: dict[str, Any]) -> str:
    """A compact description of a scenario for the tables."""
    model = sc["model"] if isinstance(sc["model"], str) else _inline_name(sc["model"])
    fixed = Scenario.from_dict(sc)
    patches = core.estimate(fixed).arch.fixed_seq_len
    bits = [model, sc["method"]]
    if sc["method"] != "full":
        bits.append(f"r{sc['lora']['rank']} {'+'.join(sc['lora']['targets'])}")
    bits += [
        sc["precision"],
        sc["optimizer"] + ("/" + sc["optimizer_impl"] if sc["optimizer"] != "none" else ""),
    ]
    bits.append(f"b{sc['micro_batch_size']} " + (f"{patches} patches" if patches else f"s{sc['seq_len']}"))
    if sc["grad_accum_steps"] > 1:
        bits.append(f"ga{sc['grad_accum_steps']}")
    if sc["activation_checkpointing"] != "none":
        bits.append(f"ckpt {sc['activation_checkpointing']}")
    bits.append(sc["attention"])
    if sc["optimizer_in_backward"]:
        bits.append("opt-in-bwd")
    par = sc["parallel"]
    if par["dp"] > 1 or par["zero"]:
        bits.append(
            f"dp{par['dp']} zero{par['zero']}"
            + (f" offload {par['offload']}" if par["offload"] != "none" else "")
        )
    if sc["compile"]:
        bits.append("compile")
    if sc.get("output_lifetime"):
        bits.append(f"outputs kept to {sc['output_lifetime']}")
    if sc["padding"] != "max_length":
        bits.append(f"pad {sc['padding']}")
    bits.append(sc["framework"])
    return ", ".join(bits)


def _inline_name(cfg: dict[str, Any]) -> str:
    """A readable name for the inline configs of this file."""
    for name, ref in (
        ("Qwen-7B (v1)", QWEN_7B),
        ("Qwen-14B (v1)", QWEN_14B),
        ("Qwen-1.8B (v1)", QWEN_1_8B),
        ("BERT-large cls", BERT_LARGE_CLS),
        ("T0_3B", T0_3B),
        ("mt0-xxl", MT0_XXL),
        ("ViT-H/14 (45 cls)", VIT_H14),
    ):
        if cfg == ref:
            return name
    return f"{cfg.get('model_type', 'custom')} (inline)"


def render(results: list[dict[str, Any]], fits: dict[str, dict[str, Any]] | None = None) -> str:
    """docs/accuracy.md: protocol, summary, per-source medians, per-row table, excluded rows, profiles."""
    ev, fi, al = summarise(results), summarise(results, ("fit",)), summarise(results, ("fit", "eval"))
    lines = [
        "# Accuracy: engine vs published GPU measurements",
        "",
        "Each row of `data/measured/*.csv` is a peak memory figure someone measured on a real GPU, with the",
        "configuration they ran. The engine simulates the same training step and predicts **the counter that row",
        "measured**: `torch.cuda.max_memory_allocated` (allocated), `max_memory_reserved` (reserved), or what",
        "nvidia-smi showed (device). A row whose counter is not stated is compared with allocated, the lowest, so",
        "that an under-prediction is never hidden. Error = predicted / measured - 1; negative = under-prediction",
        "(the out-of-memory a user would hit).",
        "",
        "Reproduce: `python benchmarks/fidelity_measured.py --write docs/accuracy.md`; the data is rebuilt from",
        "the shared development set with `--normalise` and the two fitted constants with `--fit`.",
        "`tests/engine/test_accuracy.py` fails if the median error of the evaluation rows or of all reproducible rows",
        "rises above 8%, if an evaluation row is under-predicted by more than 15%, or if any reproducible row",
        "other than those explained under *Known misses* is (and if one of those no longer is, so that the",
        "explanation cannot go stale).",
        "",
        "## Summary",
        "",
        "| rows | n | median abs error | worst | under-predictions | worst under-prediction | inside the band |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for label, s in (
        ("**evaluation** (not used by any fit)", ev),
        ("fit (odd ids measuring reserved / nvidia-smi)", fi),
        ("all reproducible", al),
    ):
        if s["n"]:
            lines.append(
                f"| {label} | {s['n']} | {s['median']:.1%} | {s['worst']:+.1%} (row {s['worst_id']}) | "
                f"{s['under']} | {s['worst_under']:+.1%} | {s['inside_band']}/{s['n']} |"
            )

    def verdict(ok: bool) -> str:
        return "**met**" if ok else "**not met**"

    by_id = {r["row"]["id"]: r for r in results}
    beyond = ", ".join(
        f"row {rid} ({by_id[rid]['role']}, {_pct(by_id[rid]['error'])}"
        + (", explained under *Known misses*, not tuned" if rid in EXPLAINED_UNDER else ", not explained")
        + ")"
        for rid in al["under_over_15"]
    )
    lines += [
        "",
        "Targets of issue #5:",
        "",
        f"- median absolute error under {TARGET_MEDIAN:.0%}: "
        f"{verdict(bool(ev['n']) and ev['median'] < TARGET_MEDIAN)} on the evaluation rows ({ev['median']:.1%}), "
        f"{verdict(al['median'] < TARGET_MEDIAN)} on all reproducible rows ({al['median']:.1%});",
        f"- no under-prediction worse than {TARGET_WORST_UNDER:.0%}: "
        f"{verdict(not ev['under_over_15'])} on the evaluation rows (worst {_pct(ev['worst_under'])}), "
        + (
            f"{verdict(True)} on all reproducible rows (worst {_pct(al['worst_under'])})."
            if not al["under_over_15"]
            else f"{verdict(False)} on all reproducible rows: {beyond}."
        ),
        "",
        "## Per source (fit and evaluation rows)",
        "",
        "| source | n | median abs error | worst | under-predictions |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, s in per_source(results):
        if s["n"]:
            lines.append(f"| {name} | {s['n']} | {s['median']:.1%} | {s['worst']:+.1%} | {s['under']} |")
    lines += [
        "",
        "## Rows",
        "",
        "Band: the low and high bytes the engine gives for that counter (`Estimate.uncertainty()`).",
        "Flags: `UNDER` an under-prediction, `UNDER>15%` one worse than the target allows (`explained`: see",
        "*Known misses*).",
        "",
        "| id | role | trust | scenario | counter | measured GiB | predicted GiB | error | band GiB | flag |",
        "|---|---|---|---|---|---:|---:|---:|---|---|",
    ]
    for r in sorted(results, key=lambda r: _id_key(r["row"]["id"])):
        if r["role"] == "excluded":
            continue
        row, err = r["row"], r["error"]
        flag = "" if err >= 0 else ("UNDER>15%" if err < TARGET_WORST_UNDER else "UNDER")
        if flag == "UNDER>15%" and row["id"] in EXPLAINED_UNDER:
            flag += " explained"
        sc = json.loads(row["scenario_json"])
        lines.append(
            f"| {row['id']} | {r['role']} | {row['trust']} | {_scenario_label(sc)} | {row['counter']} | "
            f"{_gib(r['measured'])} | {_gib(r['predicted'])} | {_pct(err)} | "
            f"{_gib(r['low'])}-{_gib(r['high'])} | {flag} |"
        )
    lines += _misses(results, fits)
    lines += ["", "### What each row assumes", ""]
    seen: dict[str, list[str]] = {}
    for r in sorted(results, key=lambda r: _id_key(r["row"]["id"])):
        if r["role"] != "excluded" and r["row"]["assumptions"]:
            seen.setdefault(r["row"]["assumptions"], []).append(r["row"]["id"])
    for text, ids in seen.items():
        lines.append(f"- rows {', '.join(ids)}: {text}.")
    lines += [
        "",
        "## Rows that cannot be reproduced",
        "",
        "Not scored. Where the stated configuration can still be written as a scenario, the engine's figure for",
        "it is shown for information only.",
        "",
        "| id | trust | counter | measured GiB | engine at the stated config, GiB | why not reproducible |",
        "|---|---|---|---:|---:|---|",
    ]
    for r in sorted(results, key=lambda r: _id_key(r["row"]["id"])):
        if r["role"] != "excluded":
            continue
        row = r["row"]
        meas = int(row["measured_bytes"])
        lines.append(
            f"| {row['id']} | {row['trust']} | {row['counter']} | {_gib(meas)} | {_gib(r['predicted'])} | "
            f"{row['reason']} |"
        )
    lines += _fit_section(fits)
    lines += _profiles_section()
    lines += _gpu_section(results)
    return "\n".join(lines) + "\n"


def gpu_summary(results: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per counter, the summary of the project's own GPU rows."""
    gpu = [r for r in results if r["role"] == "gpu"]
    return {c: summarise([r for r in gpu if r["row"]["counter"] == c], ("gpu",)) for c in GPU_COUNTERS}


GPU_COUNTERS = ("allocated", "reserved", "nvidia-smi")


#: The replays of the fake-tensor traces of the same runs through the caching allocator
#: (``python benchmarks/allocator_replay.py --json``; docs/allocator.md).
REPLAY = Path(__file__).resolve().parent / "allocator_replay_h200.json"
#: Expandable segments read on two runs (not in the csv: no row scored; docs/allocator.md): reserved GiB.
EXPANDABLE_READ = {"llama1b-bf16-ckpt": 16.13, "llama1b-bf16": 20.60}


def _replay_runs() -> dict[str, dict[str, dict[str, Any]]]:
    """Mode (``default``, ``expandable``) -> run -> the replay's counters; empty without the file."""
    if not REPLAY.exists():
        return {}
    data = json.loads(REPLAY.read_text())
    return {mode: {r["name"]: r for r in rows} for mode, rows in data.items() if isinstance(rows, list)}


def _replay_section(results: list[dict[str, Any]]) -> list[str]:
    """Reserved and nvidia-smi per run: measured, the engine's (fitted constants), and the replay of the
    traced run through the caching allocator, in both allocator modes."""
    modes = _replay_runs()
    if not modes:
        return []
    measured = {r["row"]["id"]: r for r in results if r["role"] == "gpu"}
    default, expandable = modes.get("default", {}), modes.get("expandable", {})
    lines = [
        "",
        "### Reserved and nvidia-smi by replay (per run and mode)",
        "",
        "The same runs traced on fake tensors (CPU) and their allocations and frees replayed through PyTorch's",
        "caching allocator (`engine/counters/allocator.py`, docs/allocator.md); nvidia-smi adds the engine's context and",
        "NCCL figures. `engine` is `memsim estimate` (reserved by the replay of its own stream where",
        "`replayable.replayable` holds, else the fitted constants).",
        "`expandable` replays the trace with `expandable_segments:True` (a prediction: the csv has no such rows;",
        "two were read by hand, in brackets).",
        "",
        "`engine replay` is `memsim estimate` with `reserved_model: replay` (the engine's own stream replayed, also",
        "where the default keeps the fitted rule).",
        "",
        "| run | reserved measured | engine | error | replay | error | engine replay | expandable | nvidia-smi measured |"
        " engine | error | replay | error | engine replay |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    eng = replay_errors(r["row"] for r in results)
    errs: dict[str, list[float]] = {"res": [], "smi": [], "eng_res": [], "eng_smi": []}
    for run, rep in default.items():
        res, smi = measured.get(f"g-{run}-reserved"), measured.get(f"g-{run}-nvidia-smi")
        if res is None or smi is None:
            continue
        e_res, e_smi = rep["reserved"] / res["measured"] - 1, rep["nvidia-smi"] / smi["measured"] - 1
        errs["res"].append(e_res)
        errs["smi"].append(e_smi)
        errs["eng_res"].append(res["error"])
        errs["eng_smi"].append(smi["error"])
        exp = expandable.get(run)
        read = f" ({EXPANDABLE_READ[run]:.2f})" if run in EXPANDABLE_READ else ""
        lines.append(
            f"| {run} | {_gib(res['measured'])} | {_gib(res['predicted'])} | {_pct(res['error'])} | "
            f"{_gib(rep['reserved'])} | {_pct(e_res)} | {_pct(eng.get(run, {}).get('reserved'))} | "
            f"{_gib(exp['reserved']) if exp else ''}{read} | "
            f"{_gib(smi['measured'])} | {_gib(smi['predicted'])} | {_pct(smi['error'])} | "
            f"{_gib(rep['nvidia-smi'])} | {_pct(e_smi)} | {_pct(eng.get(run, {}).get('nvidia-smi'))} |"
        )
    med = statistics.median
    e_res_eng = [e["reserved"] for e in eng.values() if "reserved" in e]
    e_smi_eng = [e["nvidia-smi"] for e in eng.values() if "nvidia-smi" in e]
    lines += [
        "",
        f"Median error over {len(errs['res'])} runs: reserved engine {_pct(med(errs['eng_res']))}, replay "
        f"{_pct(med(errs['res']))} (worst under {_pct(min(errs['res']))}); nvidia-smi engine "
        f"{_pct(med(errs['eng_smi']))}, replay {_pct(med(errs['smi']))} (worst under {_pct(min(errs['smi']))}).",
        f"Engine replay over the same runs: reserved median {_pct(med(e_res_eng))} (worst under "
        f"{_pct(min(e_res_eng))}), nvidia-smi median {_pct(med(e_smi_eng))} (worst under {_pct(min(e_smi_eng))}); "
        f"issue #22's bar: median within {GPU_TARGET_REPLAY_MEDIAN:.0%}, no run under by more than "
        f"{-GPU_TARGET_REPLAY_UNDER:.0%} but a run whose allocated miss is explained above"
        + "".join(f"; {k}: {why}" for k, why in GPU_EXPLAINED_REPLAY.items())
        + " (tests/engine/test_accuracy_replay.py).",
        "The traces run SDPA and dropout as CUDA does (`trace/cuda_sdpa.py`), and a cross-entropy on 16-bit logits",
        "under autocast as CUDA's autocast does (`trace/cuda_autocast.py`: roberta-base-amp was +9.8% allocated).",
        "The autograd thread's cuBLAS workspace is made at the first backward matmul, among the first step's freed",
        "loss buffers (docs/allocator.md).",
    ]
    return lines


def _expandable_gib(by_id: dict[str, dict[str, Any]], rid: str) -> str:
    """The engine's reserved GiB for run ``rid`` under ``expandable_segments:True`` ("n/a" without the run)."""
    if rid not in by_id:
        return "n/a"
    d = json.loads(by_id[rid]["row"]["scenario_json"])
    return _gib(
        core.estimate(
            Scenario.from_dict({**d, "allocator_conf": "expandable_segments:True"})
        ).peak_reserved_bytes
    )


def _gpu_section(results: list[dict[str, Any]]) -> list[str]:
    """The project's own runs: per-counter summary, the rows side by side, and what the misses mean."""
    gpu = [r for r in results if r["role"] == "gpu"]
    lines = [
        "",
        "## The project's own GPU runs",
        "",
        "`python benchmarks/gpu_measure.py --out data/measured/gpu_<card>.csv` trains each scenario below for three",
        "real steps on CUDA (random weights from the config, HF-style loop, each in a fresh process) and writes",
        "allocated, reserved and nvidia-smi rows; without CUDA it exits with status 2. These rows are reported",
        "here, apart from the published ones, and no constant is fitted on them.",
    ]
    if not gpu:
        return lines + ["", "No project-measured rows yet."]
    lines += [
        f"Source: {gpu[0]['row']['source']}.",
        "",
        "| counter | n | median abs error | worst | under-predictions | worst under-prediction | inside the band |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for counter, s in gpu_summary(results).items():
        if s["n"]:
            lines.append(
                f"| {counter} | {s['n']} | {s['median']:.1%} | {s['worst']:+.1%} ({s['worst_id']}) | "
                f"{s['under']} | {s['worst_under']:+.1%} | {s['inside_band']}/{s['n']} |"
            )
    lines += [
        "",
        f"Targets: allocated median under {GPU_TARGET_ALLOCATED_MEDIAN:.0%} and every allocated row within "
        f"{GPU_TARGET_ALLOCATED_ROW:.0%} except the explained ones below; no reserved or nvidia-smi row "
        f"under-predicted by more than {-TARGET_WORST_UNDER:.0%} (tests/engine/test_accuracy.py).",
        "",
        "| run | scenario | allocated: measured / predicted GiB | error | reserved: measured / predicted GiB | "
        "error | nvidia-smi: measured / predicted GiB | error |",
        "|---|---|---|---:|---|---:|---|---:|",
    ]
    runs: dict[str, dict[str, dict[str, Any]]] = {}
    for r in gpu:
        run = r["row"]["id"].removeprefix("g-").removesuffix(f"-{r['row']['counter']}")
        runs.setdefault(run, {})[r["row"]["counter"]] = r
    for run, by in runs.items():
        sc = json.loads(next(iter(by.values()))["row"]["scenario_json"])
        cells = [
            f"{_gib(by[c]['measured'])} / {_gib(by[c]['predicted'])} | {_pct(by[c]['error'])}"
            if c in by
            else " | "
            for c in GPU_COUNTERS
        ]
        lines.append(f"| {run} | {_scenario_label(sc)} | " + " | ".join(cells) + " |")
    by_id = {r["row"]["id"]: r for r in gpu}

    def e(rid: str) -> str:
        return _pct(by_id[rid]["error"]) if rid in by_id else "n/a"

    lines += [
        "",
        "What they show:",
        "",
        "- **Allocated** is what the engine computes from who-saves-what: on every run without `torch.compile`",
        "  it is within 0.1% of `torch.cuda.max_memory_allocated` on the decoders (Llama, Qwen2, Qwen3, OLMo 2, Phi,",
        "  GPT-2; bf16, fp32, autocast, eager, checkpointing, LoRA, dropout, the plain loop that keeps its outputs,",
        f"  an 8B full fine-tune and an 8B LoRA) and {e('g-vitb-amp-allocated')} on ViT-B.",
        "- **The families added in issue 12**: Gemma 2 2B at its default attention (transformers runs it eager)"
        f" {e('g-gemma2-2b-bf16-default-allocated')}, Gemma 3 1B {e('g-gemma3-1b-bf16-allocated')}, ModernBERT-base "
        f"{e('g-modernbert-base-bf16-allocated')}, gpt-oss-20b LoRA (bf16, eager with sinks) "
        f"{e('g-gpt-oss-20b-lora-allocated')}.",
        f"- **T5-base** ({e('g-t5-base-bf16-allocated')}) was -57.7% on this run: the engine treated T5 like a",
        "  decoder. Its rules now follow what T5Attention runs: with the trained position bias SDPA takes the",
        "  math path (fp32 q, k, v and probabilities, dropout masks), cross-attention reads the encoder output kept",
        "  for every decoder block, three norms per decoder block (docs/fidelity.md, T5 section). That CUDA takes",
        "  the math path too is inferred from this one run (its 11.87 GiB fits it; the fused kernels would give 5).",
        f"- **RoBERTa-base under autocast** ({e('g-roberta-base-amp-allocated')}) was +9.6%, one 16-bit T x V",
        "  buffer: its masked-LM loss is `nn.CrossEntropyLoss` on the 16-bit logits. CPU autocast (which the trace",
        "  used) has `cross_entropy_loss` on its fp32 list and runs the whole loss in fp32; CUDA autocast has no entry",
        "  for it, so the composite runs a 16-bit `log_softmax` (its dtype argument is kept) and `nll_loss` (fp32",
        "  list) saves an fp32 copy: 2 + 4 bytes per T x V element saved, one fp32 gradient at backward's start, 10",
        "  in all against the CPU path's 12. The engine's loss terms (`autocast_ce_terms`) and the trace",
        "  (`trace/cuda_autocast.py`) now follow CUDA; reserved by replay was -8.4%.",
        "- **GPT-2 medium under autocast** (gpt2m-amp-eager, -nodrop, -sdpa) was under-predicted by 10-17% until",
        "  these runs: CUDA autocast runs `pow` in fp32 (CPU autocast, which the trace used, does not), so",
        "  gelu_new keeps an fp32 chain, 6 B more per T x I element and layer. The engine's rule",
        "  (`gelu_tanh_autocast`) and the trace's CUDA-like autocast (trace/cuda_autocast.py) now follow it; the",
        "  eager dropout share (measured 3.38 GiB with dropout 0.1 against 0) was already right.",
        f"- **compile** (vitb-amp-compile {e('g-vitb-amp-compile-allocated')}, llama1b-bf16-compile "
        f"{e('g-llama1b-bf16-compile-allocated')}):",
        "  the compiled ViT allocated 15% more than eager, the compiled Llama 23% less. The Llama layout in bf16",
        "  now has a rule traced on the compiled step (Inductor's partitioner; docs/fidelity.md), nothing fitted",
        "  to these runs; the ViT (autocast) gets the untraced formula (eager's layers) and its caveat: traced",
        "  compiled at the run's shape on the CPU, the partitioner saves nothing eager does not (9% under eager);",
        "  the GPU's +15% is transformers 5.17's mask under compile (last-dim stride 0), which sends CUDA's SDPA",
        "  to its math kernel: fp32 s x s probabilities saved per layer (traced on fake CUDA tensors, its rule held",
        "  back: +1.2% here, docs/fidelity.md). Reserved and nvidia-smi of the compiled Llama",
        f"  ({e('g-llama1b-bf16-compile-reserved')}, {e('g-llama1b-bf16-compile-nvidia-smi')}) come from the"
        " replay of its compiled stream, held to the compiled trace",
        "  within 1% (`replayable.compiled_stream_held`;",
        "  the fitted rule gave +22.5% and +19.9%); the ViT keeps the fitted rule: its compiled stream is not held",
        "  to a trace, and its replay is 12.6% under this run's reserved (docs/allocator.md, compiled steps).",
        "- **Reserved** comes from a replay: the engine writes its step as a stream of allocations and frees",
        "  (per layer in forward and backward, the loss, the optimizer step) and runs it through PyTorch's caching",
        "  allocator's rules (`engine/counters/allocator.py`, docs/allocator.md). Where the stream does not model",
        "  the step (`replayable.replayable`) a fitted rule stays: weights and states plus 1%, everything else",
        f"  plus {overhead.FRAGMENTATION_TRANSIENT:.0%} (fitted on published BERT rows), and with variable batch lengths"
        f" {overhead.FRAGMENTATION_VARIABLE:.1f} x the loss buffers (fitted",
        "  on ms-swift rows). Of these runs only qwen05b-bf16-longest (padding to the longest sample) and the",
        "  compiled ViT keep it; the variable-length term over-predicts the first",
        f"  ({e('g-qwen05b-bf16-longest-reserved')}: PyTorch 2.11 reused the fixed-length run's segments; the",
        "  replay of the engine's stream for it is in the table below, not the default because the ms-swift rows'",
        "  longer varying lengths are not held to it).",
        "- **Expandable segments** (`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`, the scenario key",
        "  `allocator_conf`; the torchtitan profile's default) were read on two runs, not scored: llama1b-bf16-ckpt",
        "  reserved 16.13 GiB (18.44 without), llama1b-bf16 20.60 GiB (19.88 without), allocated unchanged. The",
        "  replay of the trace gives 16.13 and 20.58 GiB, `memsim estimate` with the key "
        f"{_expandable_gib(by_id, 'g-llama1b-bf16-ckpt-reserved')} and {_expandable_gib(by_id, 'g-llama1b-bf16-reserved')}"
        " GiB.",
        *_replay_section(results),
    ]
    return lines


def _misses(results: list[dict[str, Any]], fits: dict[str, dict[str, Any]] | None = None) -> list[str]:
    """What the largest errors say (prose keyed to rows; the numbers are this run's)."""
    by_id = {r["row"]["id"]: r for r in results}

    def e(rid: str) -> str:
        return _pct(by_id[rid]["error"]) if rid in by_id and by_id[rid]["error"] is not None else "n/a"

    return [
        "",
        "### Known misses",
        "",
        *_row_121(by_id, fits),
        f"- **Rows 110, 111, 117** ({e('110')}, {e('111')}, {e('117')}): over-predictions of reserved memory with",
        "  variable-length batches. The variable-shape term is one multiple of the loss's T x V buffers; the",
        "  measured reserved memory grows 7.4 MiB per token from 512 to 1024 tokens but 3.3 MiB per token from",
        "  4096 to 8192, which one multiple cannot follow. For row 117 (eager attention, no checkpointing) the",
        "  engine's allocated figure alone is about 50 GiB. They err on the side of a user not running out of memory.",
        f"- **Row 26** ({e('26')}): the same setup as row 25 ({e('25')}) measured 2.1 GB higher on an A100 with",
        "  an unstated counter: the run-to-run and hardware spread the 10% allocated band is there for.",
        "- The BERT rows measure nvidia-smi on CUDA 11, so the eager-loading context (1343 MiB, measured by the",
        "  same source) is part of every figure; BERT's attention dropout keeps b x a x s x s masks, which the",
        "  engine counts (1 B each).",
        *_bert_zero_grad(by_id),
    ]


#: The BERT rows of one micro-batch a step: the ones whose gradients the 2022 Trainer's zero_grad kept alive
#: through the next forward (with accumulation they are alive anyway).
BERT_ONE_MICRO_BATCH = ("81", "84", "86", "88")


def _bert_zero_grad(by_id: dict[str, dict[str, Any]]) -> list[str]:
    """The BERT rows' replay as marked (``zero_grad: zeros``: the 2022 Trainer's ``model.zero_grad()`` on torch
    < 2.0 kept every gradient) and with ``set_to_none`` (what the row would give unmarked)."""
    rows = [by_id[rid]["row"] for rid in BERT_ONE_MICRO_BATCH if rid in by_id]
    if not rows:
        return []
    cells = []
    for row in rows:
        measured = float(row["measured_bytes"])
        spec = json.loads(row["scenario_json"])
        errs = [
            _pct(
                core.estimate({**spec, "reserved_model": "replay", **kept}).device_total_bytes / measured - 1
            )
            for kept in ({"zero_grad": "set_to_none"}, {"zero_grad": "zeros"})
        ]
        cells.append(f"{row['id']} {errs[0]} -> {errs[1]}")
    return [
        "- The Trainer of these rows (January 2022: before transformers 4.27) called `model.zero_grad()`, which on torch",
        "  < 2.0 zeroes the gradients in place, so every gradient is alive through the next step's forward",
        "  (docs/memory-facts.md#the-training-loop). With one micro-batch a step, nvidia-smi by replay with",
        f"  `zero_grad: set_to_none` -> `zeros` (as the rows are marked): {', '.join(cells)}. The fitted constants",
        "  are fitted on the odd rows as marked.",
    ]


def _row_121(by_id: dict[str, dict[str, Any]], fits: dict[str, dict[str, Any]] | None) -> list[str]:
    """Row 121 (ms-swift, bitsandbytes QLoRA) against its LoRA twin, row 109: what was checked and why the
    row is explained rather than tuned to. Sources read: ms-swift 1.4.0 and 1.5.0 (``llm/sft.py``,
    ``llm/utils/model.py``, ``trainers/trainers.py``), transformers 4.36.2 (``modeling_utils.from_pretrained``),
    peft 0.7.1 (``tuners/lora/bnb.py``) and bitsandbytes 0.41.3 (``MatMul4Bit``, ``Params4bit.cuda``)."""
    q, lo = by_id.get("121"), by_id.get("109")
    if not q or not lo or q.get("estimate") is None or lo.get("estimate") is None:
        return []
    qe, le = q["estimate"], lo["estimate"]
    meas_gap = (lo["measured"] - q["measured"]) / GiB
    pred_gap = (lo["predicted"] - q["predicted"]) / GiB
    nf4_gap = (le.components()["parameters"] - qe.components()["parameters"]) / GiB
    unexplained = pred_gap - meas_gap
    head = 2 * qe.arch.vocab_size * qe.arch.hidden_size  # bf16 copy of the V x h head
    head_reserved = head * (1 + overhead.FRAGMENTATION_TRANSIENT)
    with_head = (q["predicted"] + head_reserved) / q["measured"] - 1
    short = (q["measured"] - q["predicted"] - head_reserved) / GiB
    fit_note = ""
    f = (fits or {}).get("FRAGMENTATION_VARIABLE")
    if f and "121" in f["rows"]:
        others = [v or 0.0 for k, v in f["rows"].items() if k != "121"]
        fit_note = (
            f" `FRAGMENTATION_VARIABLE` does not lean on it: the median of the other fit rows is "
            f"{statistics.median(others):.2f} ({f['value']:.2f} with it)."
        )
    intro = (
        f"**Row 121** (ms-swift QLoRA, a fit row, {_pct(q['error'])}; kept in the statistics and flagged). "
        "Qwen-7B-Chat (Qwen v1) in bitsandbytes NF4 with double quantisation (`quantization_bit 4`), LoRA r8 on "
        "`c_attn` with fp32 adapters, batch 1, max_length 2048 padded to each batch's longest sample, HF "
        "gradient checkpointing, flash-attn 2, Trainer bf16 autocast with `adamw_torch`, A100 80GB, torch "
        "2.1.1; counter `max_memory_reserved`. Row 109 is the same run without quantisation (same model, data, "
        f"batch, length, checkpointing and counter), and the engine matches it ({_pct(lo['error'])}; a fit row "
        "too, but the LoRA evaluation rows of the same table up to 2048 tokens are at "
        + ", ".join(_pct(by_id[i]["error"]) for i in ("108", "112", "116", "118") if i in by_id)
        + "). Measured, "
        f"the QLoRA run is {meas_gap:.2f} GiB below the LoRA run; in the engine it is {pred_gap:.2f} GiB below, "
        f"of which {nf4_gap:.2f} GiB is NF4 storage of the 6.48B Linear weights. At the engine's peak (start "
        "of backward: checkpointed layer inputs, the loss's T x V buffers, the variable-shape term) nothing "
        f"else differs between the two rows. So the QLoRA run held about {unexplained:.1f} GiB that its stated "
        "configuration does not account for. Checked against the sources of the software of the time "
        "(ms-swift 1.4.0 and 1.5.0, the releases around the benchmark; transformers 4.36; peft 0.7.1; "
        "bitsandbytes 0.41.3):"
    )
    checks = [
        "peft's `prepare_model_for_kbit_training` (fp32 embeddings, norms and head, +2.3 GiB): ms-swift's "
        "`llm_sft` does not call it in either release. Ruled out.",
        "bitsandbytes' dequantisation: `MatMul4Bit` dequantises the weight to bf16 in forward and again in "
        "backward (96 MiB for the largest, `c_attn`) and frees it inside the layer; the engine carries one "
        "during a layer's backward. It cannot reach the loss peak. Ruled out as the cause.",
        "loading: `Params4bit.cuda` stages each weight as an fp16 copy (at most 96 MiB), quantises it and frees "
        "it; the caching allocator reuses the freed staging segment for the next weight, and what stays cached "
        "is of the order of the staging sizes (96, 86 and 32 MiB) plus partly filled 20 MiB segments holding "
        "the small quantisation statistics: about 0.2 GiB by the allocator's rules (docs/memory-facts.md#caching-allocator). "
        "Ruled out.",
        "a paged optimizer: ms-swift's default is the Trainer's `adamw_torch`; paged states would sit outside "
        "the caching allocator and lower reserved memory, not raise it. Ruled out.",
        "checkpointing (ms-swift's default is on), the loss buffers, variable batch shapes, flash attention: "
        "the same in row 109. Ruled out.",
        "the software version, partly: ms-swift 1.5.0 loads Qwen v1 with `torch_dtype=None`, which "
        "transformers 4.36 replaces with fp16 for bitsandbytes models, so the unquantised embeddings, norms and "
        "head are fp16 under the Trainer's bf16 autocast. The head's Linear then keeps a bf16 copy of its "
        "weight for backward (a frozen Linear whose weight is not in the autocast dtype saves the cast copy; "
        f"checked with saved-tensor hooks): {head / GiB:.2f} GiB allocated, {head_reserved / GiB:.2f} GiB "
        f"reserved with the engine's transient fragmentation, which would bring the row to {_pct(with_head)}, "
        f"still {short:.1f} GiB short. ms-swift 1.4.0 passes bf16 and has no such copy. The source does not "
        "say which release ran (its GiB unit and `max_memory_reserved` match 1.5.0; 1.4.0 printed "
        '`memory_reserved()` after 20 steps in "GB"). The engine counts such copies under the `amp-*` '
        "recipes, whose frozen weights are fp32, but has no scenario key for fp16 unquantised weights under "
        "bf16 autocast; one added for a single row of unknown version would be a knob tuned to it, so it is "
        "left out.",
    ]
    verdict = (
        "No constant was tuned to the row. It stays in the fit and in *all reproducible rows*: the engine can "
        "run its configuration as stated; what the row lacks is the software version and whatever the run "
        f"held beyond its stated configuration.{fit_note} Read it as a warning that the engine can "
        "under-predict bitsandbytes QLoRA runs of this era by about a fifth of reserved memory, until a QLoRA "
        "step is measured by the project (bitsandbytes needs CUDA; `benchmarks/gpu_measure.py` has no QLoRA "
        "scenario yet)."
    )
    wrap = textwrap.TextWrapper(width=110, break_long_words=False, break_on_hyphens=False)
    out = wrap.fill(intro).replace("\n", "\n  ").splitlines()
    out[0] = "- " + out[0]
    for c in checks:
        lines = wrap.fill(c).splitlines()
        out += ["  - " + lines[0]] + ["    " + x for x in lines[1:]]
    out += [""] + ["  " + x for x in wrap.fill(verdict).splitlines()]
    return out


def _fit_section(fits: dict[str, dict[str, Any]] | None) -> list[str]:
    """The fitted constants, their values and the rows behind them."""
    out = [
        "",
        "## Fitted constants",
        "",
        "Two constants in `memsim_widget/engine/counters/overhead.py` are fitted; everything else is stated from a source.",
        "Each is the median, over its fit rows, of the value at which the engine reproduces that row exactly",
        "(a row already over-predicted with the constant at 0 counts as 0). Fit rows are the odd ids among rows",
        "that measure reserved or nvidia-smi; all other rows measure the error.",
        "",
        "| constant | value in overhead.py | fit | fit rows (implied value) |",
        "|---|---:|---:|---|",
    ]
    for name in ("FRAGMENTATION_TRANSIENT", "FRAGMENTATION_VARIABLE"):
        f = (fits or {}).get(name)
        implied_txt = (
            ", ".join(f"{k}: {'-' if v is None else f'{v:.2f}'}" for k, v in f["rows"].items()) if f else ""
        )
        out.append(
            f"| `{name}` | {getattr(overhead, name):g} | {'' if not f else format(f['value'], '.3f')} | "
            f"{implied_txt} |"
        )
    out += [
        "",
        "- `FRAGMENTATION_TRANSIENT`: reserved minus allocated as a share of the memory that churns in a step",
        "  (everything but weights and optimizer states), fixed batch shapes.",
        '- `FRAGMENTATION_VARIABLE`: with batches padded to their longest sample (`padding: "longest"`), extra',
        "  reserved memory as a multiple of the loss's T x V buffers, the largest blocks of a step, whose size",
        "  changes every step.",
        "",
        "Stated (not fitted): `FRAGMENTATION_PERSISTENT` 0.01 (with expandable segments the transient rate is",
        "`FRAGMENTATION_TRANSIENT` too, without the variable term: docs/allocator.md), `EAGER_CONTEXT_BYTES` 1343 MiB (measured by the transformers docs on the",
        "V100 of rows 81-89, after `torch.ones(1).cuda()`), `NCCL_PER_COMMUNICATOR` 0.5 GiB (nccl#864),",
        "`VERSION_SPREAD` 10% (the width of the allocated band; PR #961's 20.2 vs 22.3 GB).",
    ]
    return out


def _profiles_section() -> list[str]:
    """The framework profiles and their sources."""
    out = [
        "",
        "## Framework profiles",
        "",
        "`memsim_widget/engine/frameworks.py`; the fields are documented there. Beyond `hf`, each profile changes",
        "only what its sources say.",
        "",
    ]
    for p in PROFILES.values():
        out.append(f"- **{p.name}**: {p.description}. Sources: " + "; ".join(p.sources) + ".")
    out += [
        "",
        "Other rules added with this report (all frameworks): bitsandbytes' paged optimizer states live in",
        "unified memory outside the caching allocator (in nvidia-smi, not in allocated/reserved); CUDA autocast",
        "runs softmax in fp32 for every model (the CPU trace keeps it 16-bit for GPT-2, BERT and ViT); ZeRO-3",
        "with parameter offload gathers each unit on the GPU also at dp=1; reserved is the largest pool over the",
        "step's moments, capped by the card; `cuda_lazy_loading: false` uses the eager-loading context;",
        "`activation_offloading` keeps two layers of saved activations on the GPU and reports the rest as host",
        "memory. `compile` has its own rules where a compiled step was traced (the Llama layout, its LoRA, OLMo 2,",
        "Gemma 3: Inductor's partitioner on fake tensors, docs/fidelity.md); elsewhere eager's rules with a caveat.",
        "The compiled ViT-H rows agree with the eager rules within 3%.",
    ]
    return out


def print_table(results: list[dict[str, Any]]) -> None:
    """One line per row on stdout."""
    for r in sorted(results, key=lambda r: _id_key(r["row"]["id"])):
        row = r["row"]
        pred = "" if r["predicted"] is None else f"{r['predicted'] / GiB:7.2f}"
        err = "" if r["error"] is None else f"{r['error']:+7.1%}"
        print(
            f"{row['id']:>5} {r['role']:<8} {row['counter']:<10} meas {int(row['measured_bytes']) / GiB:7.2f} "
            f"pred {pred:>7} {err:>8}  {short_source(row['source'])}"
        )
    for label, roles in (("eval", ("eval",)), ("fit", ("fit",)), ("all", ("fit", "eval"))):
        s = summarise(results, roles)
        if s["n"]:
            print(
                f"{label:>4}: n={s['n']} median |error| {s['median']:.1%}, worst {s['worst']:+.1%} "
                f"(row {s['worst_id']}), {s['under']} under, worst under {s['worst_under']:+.1%}, "
                f"inside band {s['inside_band']}/{s['n']}"
            )


def main(argv: list[str] | None = None) -> int:
    """Command line: normalise, fit, compare, write the report."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--normalise", nargs="?", const=str(SOURCE), help="rebuild published.csv from this source CSV"
    )
    ap.add_argument("--fit", action="store_true", help="fit the two fragmentation constants and print them")
    ap.add_argument("--write", help="write the markdown report here")
    args = ap.parse_args(argv)
    if args.normalise:
        rows = normalise([*read_csv(Path(args.normalise)), *REPO_SOURCE_ROWS])
        write_csv(rows, PUBLISHED)
        print(
            f"wrote {PUBLISHED} ({len(rows)} rows, {sum(r['reproducible'] == 'true' for r in rows)} reproducible)"
        )
    rows = load_rows()
    fits = fit(rows) if (args.fit or args.write) else None
    if fits:
        for name, f in fits.items():
            print(f"{name}: fit {f['value']:.3f} (overhead.py has {f['current']:g}) from {f['rows']}")
    results = evaluate(rows)
    print_table(results)
    if args.write:
        Path(args.write).write_text(render(results, fits))
        print(f"wrote {args.write}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
