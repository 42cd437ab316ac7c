"""Modelled step time against published training throughput; writes docs/speed.md.

Run: python benchmarks/fidelity_speed.py              (table, median and worst error, docs/speed.md)
     python benchmarks/fidelity_speed.py --fit        (refit the efficiency constants on FIT_ROWS, print them)
     python benchmarks/fidelity_speed.py --normalise  (rebuild data/throughput/published.csv from
                                                       the shared development set, ``SHARED``, and the rules below)
     python benchmarks/fidelity_speed.py --fp8-rows   (rewrite data/throughput/fp8.csv from ``_fp8_row_specs``)

Each shared row becomes a scenario here (``scenario_for``): the model as an inline config from the row's
columns, the GPU, layout, precision, checkpointing, micro-batch and global batch. What the source leaves out
is written in the row's ``assumptions`` (group ``assumed``); rows that cannot be run are ``excluded`` with a
``reason``.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from memsim_widget.engine.speed.gpu_speed import FIT_ROWS, MATMUL_EFFICIENCY  # noqa: E402
from memsim_widget.engine.speed.step_time import ATTENTION_EFFICIENCY  # noqa: E402
from memsim_widget.fidelity_speed import (  # noqa: E402
    ATTENTION_FIT_ROWS,
    DATA,
    Comparison,
    compare,
    fit_constants,
    load,
    summary,
)
from memsim_widget.scenario import Scenario  # noqa: E402

SHARED = ROOT.parent / "shared" / "data" / "throughput-dev.csv"
DOC = ROOT / "docs" / "speed.md"
EXTRA = ("published_tokens_per_s_per_gpu", "group", "reason", "assumptions", "scenario_json")

GPU_IDS = {
    "H100-SXM-80GB": "h100-sxm-80gb",
    "A100-SXM-40GB (1600Gbps RoCE)": "a100-40gb",
    "RTX 4090 24GB": "rtx-4090",
    "RTX A6000 48GB": "rtx-a6000",
    "A100 (80GB implied by 60 GiB peak)": "a100-80gb",
}
#: Llama 3.2 3B's published config.json (the torchtune rows name the model only).
LLAMA_32_3B = {"hidden": 3072, "layers": 28, "heads": 24, "kv_heads": 8, "ffn": 8192, "vocab": 128256}
#: torchtune's LoRA recipes adapt every attention projection and the MLP (apply_lora_to_mlp: True).
TORCHTUNE_LORA_TARGETS = ["q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _gpt(r: dict[str, str], s: int) -> dict[str, Any]:
    """An MPT / Megatron GPT as an inline GPT-2-style config (4h GELU MLP, tied embeddings, no dropout)."""
    return {
        "model_type": "gpt2",
        "n_embd": int(r["hidden"]),
        "n_layer": int(r["layers"]),
        "n_head": int(r["heads"]),
        "n_inner": int(r["ffn"]),
        "vocab_size": int(r["vocab"]),
        "n_positions": s,
        "activation_function": "gelu",
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
    }


def _llama(d: dict[str, int], tied: bool) -> dict[str, Any]:
    return {
        "model_type": "llama",
        "hidden_size": d["hidden"],
        "num_hidden_layers": d["layers"],
        "num_attention_heads": d["heads"],
        "num_key_value_heads": d["kv_heads"],
        "intermediate_size": d["ffn"],
        "vocab_size": d["vocab"],
        "tie_word_embeddings": tied,
    }


def megatron_tokens(r: dict[str, str]) -> float:
    """Tokens/s per GPU from Megatron's published TFLOP/s per GPU and its own FLOP count per token
    (``num_floating_point_operations``: 72 L h^2 + 12 L h s + 6 h V for a 4h MLP, no recomputation)."""
    L, h, s, V = int(r["layers"]), int(r["hidden"]), int(r["seq_len"]), int(r["vocab"])
    return float(r["tflops_per_gpu"]) * 1e12 / (72 * L * h * h + 12 * L * h * s + 6 * h * V)


def scenario_for(r: dict[str, str]) -> tuple[dict | None, float | None, str, str, str]:
    """(scenario dict, published tokens/s/GPU, group, reason, assumptions) of one shared row."""
    src, rid = r["source_id"], r["row_id"]
    if src == "llm-foundry":
        s, n, b = int(r["seq_len"]), int(r["gpu_count"]), int(r["micro_batch"])
        sc = {
            "model": _gpt(r, s),
            "gpu": GPU_IDS[r["gpu"]],
            "precision": "amp-bf16" if r["precision"].startswith("amp") else "bf16",
            "seq_len": s,
            "micro_batch_size": b,
            "grad_accum_steps": int(r["global_batch_seqs"]) // (n * b),
            "activation_checkpointing": "full" if r["activation_checkpointing"] == "full" else "none",
            "framework": "hf",
            "parallel": {"dp": n, "zero": 3 if "FULL_SHARD" in r["fsdp"] else 2},
        }
        return (
            sc,
            float(r["tokens_per_s_per_gpu"]),
            "full",
            "",
            "MPT as a GPT-2-style config (ALiBi: no position table in MPT; the learned one here adds no FLOPs)",
        )
    if src == "megatron-lm" and r["tp"]:
        n, tp, pp, dp = int(r["gpu_count"]), int(r["tp"]), int(r["pp"]), int(r["dp"])
        m = int(r["global_batch_seqs"]) // dp
        par: dict[str, Any] = {"dp": dp, "tp": tp, "pp": pp, "zero": 1, "sequence_parallel": tp > 1}
        if pp > 1:
            par["pp_microbatches"] = m
        sc = {
            "model": _gpt(r, int(r["seq_len"])),
            "gpu": GPU_IDS[r["gpu"]],
            "precision": "mixed-bf16",
            "seq_len": int(r["seq_len"]),
            "micro_batch_size": 1,
            "grad_accum_steps": 1 if pp > 1 else m,
            "activation_checkpointing": "selective",
            "framework": "megatron",
            "parallel": par,
        }
        assumed = ("micro-batch 1, selective recomputation, distributed optimizer (ZeRO-1), 1F1B without "
                   "interleaving, TP communication not overlapped (the run used tp-comm-overlap); "
                   "tokens/s from TFLOP/s by Megatron's FLOP formula")  # fmt: skip
        return sc, megatron_tokens(r), "assumed", "", assumed
    if src == "torchtune" and r["tokens_per_s_per_gpu"] and r["gpu"] in GPU_IDS:
        return _torchtune(r)
    reason = {
        "megatron-lm": "tp/pp/dp at each scale not stated",
        "megatron-paper": "model dimensions and throughput recalled, not in the stored text (trust low)",
        "torchtune": "published tokens/s is for the whole 8-GPU job or per GPU: not stated",
    }.get(src, "not mapped")
    if rid == "tp0368":
        reason = "unpacked batches: tokens/s counts padding of an unknown share"
    return None, None, "excluded", reason, ""


def _torchtune(r: dict[str, str]) -> tuple[dict | None, float | None, str, str, str]:
    """torchtune's README rows: single-device recipes, their defaults where the table is silent."""
    tech = r["compile_fused"]
    is_3b = r["model"].startswith("Llama 3.2 3B")
    if is_3b and "Packed" not in tech and "LoRA" not in tech:
        return None, None, "excluded", "unpacked batches: tokens/s counts padding of an unknown share", ""
    dims = (
        LLAMA_32_3B
        if is_3b
        else {k: int(r[k]) for k in ("hidden", "layers", "heads", "kv_heads", "ffn", "vocab")}
    )
    method = "qlora" if "QLoRA" in r["model"] else "lora" if "LoRA" in r["model"] else "full"
    sc: dict[str, Any] = {
        "model": _llama(dims, tied=is_3b),
        "gpu": GPU_IDS[r["gpu"]],
        "precision": "bf16",
        "method": method,
        "seq_len": int(r["seq_len"]),
        "micro_batch_size": int(r["micro_batch"]),
        "framework": "torchtune",
        "padding": "packed",
    }
    if is_3b:
        sc["compile"] = "Compile" in tech or "LoRA" in tech
        sc["loss"] = "chunked" if "Chunked" in tech or "LoRA" in tech else "standard"
        sc["activation_checkpointing"] = "full" if r["activation_checkpointing"] == "yes" else "none"
        sc["optimizer_in_backward"] = "optimizer step into backward" in tech
        sc["activation_offloading"] = "Activation Offloading" in tech
        sc["optimizer"] = "adamw-8bit" if "8-bit" in tech else "adamw"
        sc["optimizer_impl"] = "fused"
        assumed = "Llama 3.2 3B dimensions from its config.json; torch AdamW until the 8-bit row"
    else:
        sc["compile"] = True
        sc["activation_checkpointing"] = "full"
        sc["optimizer"] = "paged-adamw-8bit" if method == "full" else "adamw"
        sc["optimizer_in_backward"] = method == "full"
        if method == "full":
            sc["optimizer_impl"] = "fused"
        assumed = ("recipe defaults: activation checkpointing on; full: PagedAdamW8bit with the step in "
                   "backward")  # fmt: skip
    if method != "full":
        sc["lora"] = {"rank": 64 if is_3b else 8, "alpha": 128 if is_3b else 16,
                      "targets": TORCHTUNE_LORA_TARGETS, "adapter_dtype": "bf16"}  # fmt: skip
        assumed += "; LoRA rank and targets from the recipe's config"
    return sc, float(r["tokens_per_s_per_gpu"]), "assumed", "", assumed


FP8_DATA = ROOT / "data" / "throughput" / "fp8.csv"
#: The published fp8 runs (and their bf16 twins where the source prints one), as sources print them. Development
#: rows: no constant is fitted on them (docs/speed.md, "fp8"). Each: (row id, source id, repository, file, commit,
#: table, model preset, GPU, GPUs, precision as published, tokens/s/GPU, scenario keys, group, assumptions).
TORCHTITAN = ("torchtitan", "pytorch/torchtitan", "benchmarks/llama3_h100_202412_torchtitan.md",
              "31a17bfdb70bab6f62a13d21816a5339b911d6e3")  # fmt: skip
NEMO = ("nemo-24.07", "NVIDIA/NeMo", "docs/source/performance/performance_summary.md",
        "070a0bb168d405d653b9734c0017cf5078e77c0d")  # fmt: skip
BRIDGE = ("megatron-bridge-25.11", "NVIDIA-NeMo/Megatron-Bridge", "docs/performance-summary.md",
          "00b7660be0254ac6f95f44164ddd0c3e9cc798ed")  # fmt: skip
_TT = {
    "framework": "torchtitan",
    "precision": "amp-bf16",
    "compile": True,
    "seq_len": 8192,
    "gpu": "h100-96gb",
}
_TT_ASSUMED = ("FSDP2 mixed precision (fp32 sharded weights, bf16 compute: amp-bf16), seq_len 8192 (the llama3_8b "
               "config's); the H100s ran at 500 W (the table's note), datasheet peaks used")  # fmt: skip
_MEG = {"framework": "megatron", "seq_len": 8192, "gpu": "h100-sxm-80gb", "micro_batch_size": 1}
_MEG_ASSUMED = ("no activation recomputation (the table does not say), distributed optimizer (ZeRO-1) without "
                "FSDP, TE attention in bf16")  # fmt: skip


#: Rows whose recipe file was read: what it sets, in place of ``_MEG_ASSUMED``.
_ROW_ASSUMED = {
    "f8-15": "recipe read (Megatron-Bridge 00b7660be025, scripts/performance/configs/llama/"
    "llama3_workload_base_configs.py LLAMA3_70B_PRETRAIN_CONFIG_GB200_FP8_CS_BASE_CONFIG, llama3_llm_pretrain.py "
    "llama3_70b_pretrain_config_gb200, utils/overrides.py, utils/precision.py): TP=PP=CP=1, micro-batch 2, "
    "Megatron FSDP optim_grads_params (ZeRO-3, fsdp_double_buffer, keep_fp8_transpose_cache False), fp8 params "
    "gathered in fp8 (bf16_with_fp8_current_scaling_mixed: fp8_param_gather True; first/last layers in fp8 too), "
    "no recomputation; cpu_offloading_num_layers=40 (TransformerEngine 2.9 activation offload of the first 40 of "
    "the 80 layers to Grace memory: activation_offloading_layers 40, an untraced formula); "
    "GBS 256 and GA 2 from the performance table (the base config says 128)",
}


def _fp8_row_specs() -> list[tuple[str, tuple[str, str, str, str], str, str, str, int, str, float, dict]]:
    """(row id, source, table, model, GPU, GPUs, precision as published, tokens/s/GPU, scenario keys)."""
    t1 = "Table 1: FSDP, Llama 3.1 8B, 8 GPUs, local batch 2, selective AC"
    t3 = "Table 3: FSDP, Llama 3.1 8B, 128 GPUs, local batch 2, selective AC"
    tt8 = {**_TT, "model": "llama-3.1-8b", "micro_batch_size": 2, "activation_checkpointing": "selective-op"}
    nemo = "Pretraining, FP8, NeMo 24.07, DGX-H100"
    br = "25.11 NeMo container, pre-training"
    b8 = {**_MEG, "model": "llama-3.1-8b", "micro_batch_size": 2, "precision": "fp8",
          "parallel": {"dp": 8, "zero": 1}, "grad_accum_steps": 8}  # fmt: skip
    return [
        ("f8-01", TORCHTITAN, t1, "Llama 3.1 8B", "H100 96GB HBM2e", 8, "bf16 + torch.compile", 6667,
         {**tt8, "parallel": {"dp": 8, "zero": 3}}),
        ("f8-02", TORCHTITAN, t1, "Llama 3.1 8B", "H100 96GB HBM2e", 8, "float8 (tensorwise) + torch.compile", 8532,
         {**tt8, "fp8_recipe": "tensorwise", "parallel": {"dp": 8, "zero": 3}}),
        ("f8-03", TORCHTITAN, t3, "Llama 3.1 8B", "H100 96GB HBM2e", 128, "bf16 + torch.compile", 6514,
         {**tt8, "parallel": {"dp": 128, "zero": 3}}),
        ("f8-04", TORCHTITAN, t3, "Llama 3.1 8B", "H100 96GB HBM2e", 128, "float8 (tensorwise) + torch.compile", 8380,
         {**tt8, "fp8_recipe": "tensorwise", "parallel": {"dp": 128, "zero": 3}}),
        ("f8-05", TORCHTITAN, "Table 2: FSDP + CP + compile + Float8, Llama 3.1 8B, 8 GPUs, local batch 1, full AC",
         "Llama 3.1 8B", "H100 96GB HBM2e", 8, "float8 (tensorwise) + torch.compile", 3890,
         {**_TT, "model": "llama-3.1-8b", "seq_len": 32768, "activation_checkpointing": "full",
          "fp8_recipe": "tensorwise", "parallel": {"dp": 8, "zero": 3}}),
        ("f8-06", TORCHTITAN, "Table 4: FSDP 32 + TP 8 + compile + Float8, Llama 3.1 70B, 256 GPUs, local batch 16, "
         "full AC", "Llama 3.1 70B", "H100 96GB HBM2e", 256, "float8 (tensorwise) + torch.compile", 829,
         {**_TT, "model": "llama-3.1-70b", "micro_batch_size": 16, "activation_checkpointing": "full",
          "fp8_recipe": "tensorwise", "parallel": {"dp": 32, "tp": 8, "zero": 3, "sequence_parallel": True}}),
        ("f8-07", NEMO, nemo, "Llama 3 8B", "DGX-H100", 8, "FP8 (TE delayed scaling)", 12036,
         {**_MEG, "model": "llama-3.1-8b", "precision": "fp8", "fp8_recipe": "te-delayed",
          "parallel": {"dp": 4, "cp": 2, "zero": 1}, "grad_accum_steps": 32}),
        ("f8-08", NEMO, nemo, "Llama 3 70B", "DGX-H100", 64, "FP8 (TE delayed scaling)", 1533,
         {**_MEG, "model": "llama-3.1-70b", "precision": "fp8", "fp8_recipe": "te-delayed",
          "parallel": {"dp": 2, "tp": 4, "pp": 4, "cp": 2, "zero": 1, "sequence_parallel": True,
                       "pp_schedule": "interleaved", "virtual_stages": 5, "pp_microbatches": 64}}),
        ("f8-09", BRIDGE, br + ", DGX-H100", "Llama 3 8B", "DGX-H100", 8, "FP8-CS", 14451,
         {**_MEG, "model": "llama-3.1-8b", "precision": "fp8", "fp8_recipe": "te-current",
          "parallel": {"dp": 8, "zero": 3}, "grad_accum_steps": 16}),
        ("f8-10", BRIDGE, br + ", DGX-H100", "Llama 3 70B", "DGX-H100", 64, "FP8-CS", 1602,
         {**_MEG, "model": "llama-3.1-70b", "precision": "fp8", "fp8_recipe": "te-current",
          "parallel": {"dp": 2, "tp": 4, "pp": 8, "zero": 1, "sequence_parallel": True,
                       "pp_schedule": "interleaved", "virtual_stages": 5, "pp_microbatches": 64}}),
        ("f8-11", BRIDGE, br + ", DGX-B200", "Llama 3 8B", "DGX-B200", 8, "FP8-CS", 30624,
         {**b8, "gpu": "b200", "fp8_recipe": "te-current"}),
        ("f8-12", BRIDGE, br + ", DGX-B200", "Llama 3 8B", "DGX-B200", 8, "FP8-MX", 29521,
         {**b8, "gpu": "b200", "fp8_recipe": "mxfp8"}),
        ("f8-13", BRIDGE, br + ", DGX-GB200", "Llama 3 8B", "DGX-GB200", 8, "FP8-CS", 31508,
         {**b8, "gpu": "gb200", "fp8_recipe": "te-current"}),
        ("f8-14", BRIDGE, br + ", DGX-GB200", "Llama 3 8B", "DGX-GB200", 8, "FP8-MX", 29789,
         {**b8, "gpu": "gb200", "fp8_recipe": "mxfp8"}),
        ("f8-15", BRIDGE, br + ", DGX-GB200", "Llama 3 70B", "DGX-GB200", 64, "FP8-CS", 4312,
         {**_MEG, "model": "llama-3.1-70b", "gpu": "gb200", "micro_batch_size": 2, "precision": "fp8",
          "fp8_recipe": "te-current", "fp8_all_gather": True, "parallel": {"dp": 64, "zero": 3},
          "grad_accum_steps": 2, "activation_offloading": True, "activation_offloading_layers": 40}),
    ]  # fmt: skip


FP8_FIELDS = ("row_id", "source_id", "source_repo_or_url", "source_file", "source_commit", "table", "model", "gpu",
              "gpu_count", "precision", "tokens_per_s_per_gpu", "metric_as_published",
              "published_tokens_per_s_per_gpu", "group", "reason", "assumptions", "scenario_json")  # fmt: skip


def write_fp8(dst: Path = FP8_DATA) -> int:
    """Write data/throughput/fp8.csv from ``_fp8_row_specs``: each published row with its scenario."""
    with open(dst, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=FP8_FIELDS, lineterminator="\n")
        w.writeheader()
        for rid, (src, repo, path, commit), table, model, gpu, n, prec, tps, keys in _fp8_row_specs():
            titan = keys["framework"] == "torchtitan"
            w.writerow({"row_id": rid, "source_id": src, "source_repo_or_url": repo, "source_file": path,
                        "source_commit": commit, "table": table, "model": model, "gpu": gpu, "gpu_count": n,
                        "precision": prec, "tokens_per_s_per_gpu": tps, "metric_as_published": "Tokens / sec / GPU"
                        if not titan else "TPS/GPU", "published_tokens_per_s_per_gpu": tps, "group": "assumed",
                        "reason": "", "assumptions": _ROW_ASSUMED.get(rid, _TT_ASSUMED if titan else _MEG_ASSUMED),
                        "scenario_json": Scenario.from_dict(keys).to_json(indent=None)})  # fmt: skip
    return len(_fp8_row_specs())


def normalise(src: Path = SHARED, dst: Path = DATA) -> int:
    """Rebuild the repository's copy of the shared rows with their scenarios; returns the row count."""
    with open(src, newline="") as fh:
        reader = csv.DictReader(fh)
        fields = list(reader.fieldnames or []) + list(EXTRA)
        rows = list(reader)
    dst.parent.mkdir(parents=True, exist_ok=True)
    with open(dst, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=fields, lineterminator="\n")
        w.writeheader()
        for r in rows:
            sc, pub, group, reason, assumed = scenario_for(r)
            text = Scenario.from_dict(sc).to_json(indent=None) if sc else ""
            w.writerow({**r, "published_tokens_per_s_per_gpu": "" if pub is None else f"{pub:.6g}",
                        "group": group, "reason": reason, "assumptions": assumed, "scenario_json": text})  # fmt: skip
    return len(rows)


def _line(c: Comparison) -> str:
    r = c.row
    sc = r.scenario
    assert sc is not None
    p = sc.parallel
    lay = f"dp{p.dp} tp{p.tp} pp{p.pp} z{p.zero}"
    return (f"| {r.row_id} | {r.model} | {sc.gpu} | {p.world_size} | {lay} | {sc.method} | {sc.seq_len} | "
            f"{sc.micro_batch_size} | {sc.activation_checkpointing} | {r.published:,.0f} | {c.predicted:,.0f} | "
            f"{c.error:+.1%} | {'fit' if c.fitted_on else ''} |")  # fmt: skip


def report(comps: list[Comparison], rows: list) -> str:
    """docs/speed.md's text."""
    unseen = [c for c in comps if not c.fitted_on]
    full = [c for c in unseen if c.row.group == "full"]
    assumed = [c for c in unseen if c.row.group == "assumed"]
    s_all, s_full, s_ass = summary(unseen), summary(full), summary(assumed)
    worst = max(unseen, key=lambda c: abs(c.error))
    fit_lines = "\n".join(
        f"| `MATMUL_EFFICIENCY[{g!r}]` | {MATMUL_EFFICIENCY[g]} | {', '.join(ids)} |"
        for g, ids in FIT_ROWS.items()
    )
    head = "| row | model | GPU | GPUs | layout | method | seq | micro-batch | checkpointing | published tok/s/GPU | predicted | error | |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    excluded = [r for r in rows if r.group == "excluded"]
    groups: dict[tuple[str, str], list[Comparison]] = {}
    for c in unseen:
        groups.setdefault((c.row.source, str(c.row.scenario.gpu if c.row.scenario else "")), []).append(c)
    by_group = "\n".join(
        f"| {src} | {gpu} | {s['rows']} | {s['median']:.1%} | {s['worst']:.1%} |"
        for (src, gpu), cs in groups.items()
        for s in [summary(cs)]
    )
    return TEMPLATE.format(
        n_unseen=s_all["rows"], med=s_all["median"], worst=s_all["worst"], worst_id=worst.row.row_id,
        worst_model=worst.row.model, n_full=s_full["rows"], med_full=s_full["median"], worst_full=s_full["worst"],
        n_ass=s_ass["rows"], med_ass=s_ass["median"], worst_ass=s_ass["worst"],
        fit_lines=fit_lines, att=ATTENTION_EFFICIENCY, att_rows=", ".join(ATTENTION_FIT_ROWS),
        table_full=head + "\n" + "\n".join(_line(c) for c in comps if c.row.group == "full"),
        table_assumed=head + "\n" + "\n".join(_line(c) for c in comps if c.row.group == "assumed"),
        assumptions="\n".join(f"- {c.row.row_id}: {c.row.assumptions}" for c in comps if c.row.group == "assumed"),
        excluded="\n".join(f"- {r.row_id} ({r.model}): {r.reason}" for r in excluded),
        by_group=by_group, fp8_table=fp8_table(),
    )  # fmt: skip


def fp8_table() -> str:
    """docs/speed.md's fp8 rows: published, predicted before (Linears at the 16-bit peak) and now."""
    from dataclasses import replace

    from memsim_widget.engine.speed.step_time import step_parts
    from memsim_widget.fidelity_speed import _model

    lines = ["| row | source | model | GPU | GPUs | recipe | published tok/s/GPU | before | error | now | error |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in load(FP8_DATA):
        k, cols = _model(r)
        now = float(step_parts(k, cols)["tokens_per_gpu_s"])
        before = float(
            step_parts(replace(k, linear_peak_flops=k.peak_flops, fp8_cast_bytes=0.0), cols)[
                "tokens_per_gpu_s"
            ]
        )
        sc = r.scenario
        assert sc is not None and r.published
        lines.append(f"| {r.row_id} | {r.source} | {r.model} | {sc.gpu} | {sc.parallel.world_size} | "
                     f"{sc.fp8_recipe or 'bf16 (twin)'} | {r.published:,.0f} | {before:,.0f} | "
                     f"{before / r.published - 1:+.1%} | {now:,.0f} | {now / r.published - 1:+.1%} |")  # fmt: skip
    return "\n".join(lines)


TEMPLATE = (
    (ROOT / "benchmarks" / "speed_template.md").read_text()
    if (ROOT / "benchmarks" / "speed_template.md").exists()
    else ""
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--normalise", action="store_true", help="rebuild data/throughput/published.csv")
    ap.add_argument(
        "--shared",
        type=Path,
        default=SHARED,
        help="the development CSV to normalise (default: SHARED, beside the checkout)",
    )
    ap.add_argument("--fit", action="store_true", help="refit the constants on FIT_ROWS and print them")
    ap.add_argument("--fp8-rows", action="store_true", help="rewrite data/throughput/fp8.csv (FP8 row specs)")
    ap.add_argument("--no-write", action="store_true", help="print only, do not write docs/speed.md")
    a = ap.parse_args()
    if a.normalise:
        print(f"{normalise(a.shared)} rows -> {DATA.relative_to(ROOT)}")
    if a.fp8_rows:
        print(f"{write_fp8()} rows -> {FP8_DATA.relative_to(ROOT)}")
    rows = load()
    if a.fit:
        effs, att = fit_constants(rows)
        print(f"MATMUL_EFFICIENCY = {effs}\nATTENTION_EFFICIENCY = {att}")
        print(f"committed: {MATMUL_EFFICIENCY}, {ATTENTION_EFFICIENCY}")
        return
    comps = compare(rows)
    for c in comps:
        print(f"{c.row.row_id} {c.row.group:8s} {c.row.model[:26]:26s} pub {c.row.published:10,.0f} "
              f"pred {c.predicted:10,.0f} {c.error:+7.1%} {'fit' if c.fitted_on else ''}")  # fmt: skip
    unseen = [c for c in comps if not c.fitted_on]
    for name, sel in (("unseen, all", unseen), ("unseen, full config", [c for c in unseen if c.row.group == "full"]),
                      ("unseen, assumed config", [c for c in unseen if c.row.group == "assumed"])):  # fmt: skip
        s = summary(sel)
        print(f"{name}: {s['rows']} rows, median |error| {s['median']:.1%}, worst {s['worst']:.1%}")
    if not a.no_write and TEMPLATE:
        DOC.write_text(report(comps, rows))
        print(f"wrote {DOC.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
