"""The step-time model: exact FLOP counts, how its terms compose, its hours and dollars, and its fidelity
against published runs (data/throughput/published.csv): the median error on rows no constant saw, and the
fit that reproduces the committed constants."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memsim_widget.architecture import build_architecture
from memsim_widget.cost import PRICES, TrainingCost, train_tokens, training_cost
from memsim_widget.engine.context import Context
from memsim_widget.engine.core import estimate
from memsim_widget.engine.speed.flops import model_flops
from memsim_widget.engine.speed.gpu_speed import FIT_ROWS, MATMUL_EFFICIENCY
from memsim_widget.engine.speed.step_time import (
    ATTENTION_EFFICIENCY,
    TIME_CATEGORIES,
    optimizer_step_bytes,
    scenario_columns,
    step_parts,
)
from memsim_widget.engine.speed.time_breakdown import context_time_model
from memsim_widget.errors import ScenarioError
from memsim_widget.fidelity_speed import compare, fit_constants, load, summary
from memsim_widget.plan import plan
from memsim_widget.scenario import Scenario

TINY = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 100, "tie_word_embeddings": False}  # fmt: skip


def parts(scenario: Scenario, **fixed: object) -> dict:
    """``step_parts`` of a scenario, with fields of its TimeModel replaced."""
    ctx = Context(scenario)
    k = replace(context_time_model(ctx), **fixed)
    return step_parts(k, scenario_columns(scenario, optimizer_step_bytes(ctx.recipe, ctx.opt)))


# ----- FLOPs, by hand ---------------------------------------------------------------------------------------
def test_dense_flops_per_token_by_hand():
    f = model_flops(build_architecture(TINY))
    # per layer: q 64x64, k and v 32x64 (2 kv heads x 16), o 64x64, gate/up 128x64, down 64x128
    weights = 64 * 64 + 2 * 32 * 64 + 64 * 64 + 3 * 128 * 64
    assert f.linear_per_layer == 2 * weights == 73728
    assert f.io_per_layer == (64 + 64) + 2 * (64 + 32) + (64 + 64) + 3 * (64 + 128)
    assert f.head == 2 * 64 * 100
    # causal attention, s = 8: 2 x heads x (d_qk + d_v) x (s + 1) / 2 keys on average
    assert f.attention_per_layer(8) == 2 * 4 * (16 + 16) * 9 / 2
    # PaLM's convention: 6 N + 12 L H Q s (no causal halving), N = layer matmuls + head
    assert f.model_flops_per_token(8) == 6 * (2 * weights + 64 * 100) + 12 * 2 * 4 * 16 * 8


def test_moe_counts_the_routed_experts_only():
    moe = {**TINY, "model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 2}
    f = model_flops(build_architecture(moe))
    attention, router, experts = 64 * 64 + 2 * 32 * 64 + 64 * 64, 4 * 64, 4 * 3 * 128 * 64
    assert f.linear_per_layer == 2 * (attention + router + experts * 2 / 4)


def test_mla_reads_its_query_key_and_value_widths():
    arch = Context(Scenario(model="deepseek-v2-lite")).arch
    mla = arch.extra["mla"]
    f = model_flops(arch)
    assert (f.d_qk, f.d_v) == (mla["qk_nope_head_dim"] + mla["qk_rope_head_dim"], mla["v_head_dim"])


# ----- how the terms compose ---------------------------------------------------------------------------------
BASE = Scenario(model=TINY, gpu="a100-80gb", seq_len=512, micro_batch_size=4)


def test_backward_is_twice_the_forward_for_trained_weights_and_once_for_frozen_ones():
    for method, factor in (("full", 2.0), ("lora", 1.0)):
        s = BASE.replace(method=method, lora={"targets": ["all-linear"]})
        p = parts(s)
        v = p["_"]
        want = (v["lin"] + v["head"]) * factor / v["rate"] + 2.0 * v["ada"] / v["rate"]
        want += v["io"] / v["hbm"] * factor + v["t_att"] * 2.5
        assert p["backward"] == pytest.approx(want, rel=1e-12)
        assert (v["ada"] > 0) == (method == "lora")


def test_full_checkpointing_reruns_the_forward_once_and_selective_the_attention():
    full = parts(BASE.replace(activation_checkpointing="full"))
    assert full["recompute"] == full["forward"]
    sel = parts(BASE.replace(activation_checkpointing="selective"))
    assert sel["recompute"] == sel["_"]["m"] * sel["_"]["t_att"]
    assert parts(BASE)["recompute"] == 0


def test_pipeline_bubble_is_p_minus_1_micro_batch_times_over_the_virtual_stages():
    s = BASE.replace(parallel={"pp": 2, "pp_microbatches": 8})
    p = parts(s)
    assert p["pipeline bubble"] == p["_"]["t_pipe"] * (2 - 1)
    four = {**TINY, "num_hidden_layers": 4}
    s = BASE.replace(model=four, parallel={"pp": 2, "pp_microbatches": 8, "pp_schedule": "interleaved",
                                           "virtual_stages": 2})  # fmt: skip
    p = parts(s)
    assert p["pipeline bubble"] == p["_"]["t_pipe"] * (2 - 1) / 2


def test_categories_add_up_to_the_step_and_tokens_match_the_global_batch():
    s = BASE.replace(grad_accum_steps=3, parallel={"dp": 4, "tp": 2, "zero": 3, "sequence_parallel": True})
    est = estimate(s)
    cats = est.time.categories()
    assert tuple(cats) == TIME_CATEGORIES
    assert sum(cats.values()) == pytest.approx(est.step_time_s, rel=1e-12)
    gpus, global_tokens = 4 * 2, 4 * 4 * 3 * 512  # dp x micro-batch x accumulation x sequence
    assert est.tokens_per_second_per_gpu * est.step_time_s * gpus == pytest.approx(global_tokens, rel=1e-12)
    peak = 312e12
    assert est.mfu == pytest.approx(est.tokens_per_second_per_gpu * est.time.model_flops_per_token / peak)


def test_communication_appears_only_with_more_than_one_gpu():
    one = parts(BASE.replace(parallel={"zero": 3}))
    assert one["data parallel"] == one["tensor/context parallel"] == 0
    many = parts(BASE.replace(parallel={"dp": 16, "zero": 3}))
    assert many["data parallel"] > 0


def test_offload_replaces_the_gpu_optimizer_step_with_pcie_and_host_adam():
    gpu = parts(BASE.replace(parallel={"dp": 2, "zero": 1}))
    host = parts(BASE.replace(parallel={"dp": 2, "zero": 1, "offload": "optimizer"}))
    assert gpu["offload"] == 0 < gpu["optimizer step"]
    assert host["optimizer step"] == 0 < host["offload"]


def test_qlora_dequantisation_costs_time_lora_does_not_pay():
    lora, qlora = estimate(BASE.replace(method="lora")), estimate(BASE.replace(method="qlora"))
    items = {(i.category, i.item): i.seconds for i in qlora.time.items}
    assert items[("memory-bound", "QLoRA dequantisation")] > 0
    assert qlora.step_time_s > lora.step_time_s


def test_qlora_fetches_its_nf4_bytes_not_16_bit_weights():
    """Parameter offload copies (and ZeRO-3 gathers) move the weights as stored: QLoRA's NF4 Linears at 4 bits plus
    an int8 absmax per 64 and an fp32 absmax per 256 blocks (and 4 B of state per tensor), the embedding, head
    and norms in 16 bits. TINY by hand: q and o 4,096 elements -> 2,048 + 64 + 4 + 4 = 2,120 B; k and v 2,048 ->
    1,064 B; gate, up and down 8,192 -> 4,232 B; per layer 19,064 B, two layers 38,128 B; embedding and head
    6,400 each and norms 5 x 64 -> 13,120 x 2 B = 26,240 B; 86,848 parameters."""
    sc = BASE.replace(method="qlora", lora={"targets": ["all-linear"]})
    k = context_time_model(Context(sc))
    assert k.fetch_bytes == (38128 + 26240) / 86848
    assert context_time_model(Context(sc.replace(method="lora"))).fetch_bytes == 2.0
    # the PCIe seconds of the fetches scale with those bytes: LoRA's over QLoRA's is 2 B over the NF4 average
    off = {"dp": 2, "zero": 3}
    fetch = {
        m: parts(sc.replace(method=m, parallel={**off, "offload": "optimizer+params"}))["offload"]
        - parts(sc.replace(method=m, parallel={**off, "offload": "optimizer"}))["offload"]
        for m in ("lora", "qlora")
    }
    assert fetch["qlora"] == pytest.approx(fetch["lora"] * k.fetch_bytes / 2.0, rel=1e-12)


# ----- Estimate, CLI ------------------------------------------------------------------------------------------
def test_estimate_json_and_text_carry_the_time():
    from memsim_widget import cli

    d = estimate(BASE).to_dict()
    for key in ("step_time_s", "tokens_per_second_per_gpu", "mfu", "mfu_convention", "time_breakdown"):
        assert key in d
    out = subprocess.run(
        [sys.executable, "-m", "memsim_widget.cli", "estimate", "--json", "--model", "llama-3.2-1b"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    data = json.loads(out)
    assert data["step_time_s"] > 0 and 0 < data["mfu"] < 1
    assert "time " in cli._table(estimate(BASE), 0.1)


def test_the_time_model_stays_pure_python():
    code = (
        "import sys\nfrom memsim_widget.engine.core import estimate\n"
        "estimate({'model': 'llama-3.2-1b'}).step_time_s\n"
        "print(sorted({'numpy', 'pandas', 'torch', 'altair'} & set(sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# ----- hours and dollars --------------------------------------------------------------------------------------
def test_hours_gpu_hours_and_dollars_by_hand():
    c = TrainingCost(tokens=7.2e9, num_gpus=8, tokens_per_second_per_gpu=1000.0, price_per_gpu_hour=2.0)
    assert c.wall_hours == 7.2e9 / 8000 / 3600 == 250.0
    assert c.gpu_hours == 2000.0
    assert c.dollars == 4000.0
    assert train_tokens(epochs=3, dataset_tokens=1e6) == 3e6
    with pytest.raises(ScenarioError):
        train_tokens(1e6, epochs=2, dataset_tokens=1e6)


def test_training_cost_uses_the_estimate_and_the_price_table():
    est = estimate(BASE.replace(parallel={"dp": 2}))
    c = training_cost(est, 1e9)
    assert c.num_gpus == 2 and c.price_per_gpu_hour == PRICES["a100-80gb"]
    assert c.tokens_per_second_per_gpu == est.tokens_per_second_per_gpu
    assert training_cost(est, 1e9, price=1.0).dollars == pytest.approx(c.gpu_hours)


# ----- the planner ranks by the same model ---------------------------------------------------------------------
def test_planner_time_equals_estimate_and_ranks_by_the_chosen_key():
    for rank_by in ("cost", "time", "memory"):
        p = plan(TINY, "a100-80gb", (1, 4), seq_len=512, rank_by=rank_by, top=None)
        p.check()  # bytes and step time of every listed candidate equal estimate's
        f = p.frame
        i = int(f.candidate.iloc[0])
        assert float(p.columns["step_time_s"][i]) == p.estimate(i).step_time_s
        if rank_by == "cost":
            assert f.tokens_per_gpu_s.is_monotonic_decreasing
        elif rank_by == "time":
            assert (f.tokens_per_gpu_s * f.num_gpus).is_monotonic_decreasing
        else:
            assert f.device_total_gib.is_monotonic_increasing
        assert (f.dollars == f.gpu_hours * PRICES["a100-80gb"]).all()


# ----- published runs ---------------------------------------------------------------------------------------------
ROWS = load()


def test_median_error_on_rows_no_constant_saw_is_within_15_percent():
    unseen = [c for c in compare(ROWS) if not c.fitted_on]
    assert len(unseen) >= 100
    assert summary(unseen)["median"] <= 0.15
    full = [c for c in unseen if c.row.group == "full"]
    assert summary(full)["median"] <= 0.10


def test_the_fit_reproduces_the_committed_constants():
    effs, att = fit_constants(ROWS)
    assert effs == MATMUL_EFFICIENCY
    assert att == ATTENTION_EFFICIENCY
    assert set(effs) == set(FIT_ROWS)


def test_time_chart_spec_holds_every_item_of_the_frame():
    from memsim_widget.charts.times import time_spec

    est = estimate(BASE.replace(activation_checkpointing="full"))
    values = time_spec(est)["data"]["values"]
    assert [v["item"] for v in values] == list(est.time_frame["item"])
    assert sum(v["seconds"] for v in values) == pytest.approx(est.step_time_s, rel=1e-12)
    assert {v["category"] for v in values} <= set(TIME_CATEGORIES)


def test_memsim_estimate_prints_hours_and_dollars_for_the_tokens_to_train():
    cmd = [
        sys.executable,
        "-m",
        "memsim_widget.cli",
        "estimate",
        "--model",
        "llama-3.2-1b",
        "--dp",
        "8",
        "--json",
    ]
    data = json.loads(subprocess.run([*cmd, "--epochs", "3", "--dataset-tokens", "1e8", "--price", "2"],
                                     capture_output=True, text=True, check=True).stdout)  # fmt: skip
    cost = data["cost"]
    assert cost["tokens"] == 3e8 and cost["num_gpus"] == 8 and cost["price_per_gpu_hour"] == 2
    assert cost["wall_hours"] == pytest.approx(
        3e8 / (data["tokens_per_second_per_gpu"] * 8) / 3600, rel=1e-12
    )
    assert cost["dollars"] == pytest.approx(cost["wall_hours"] * 8 * 2, rel=1e-12)
    assert "cost" not in json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)


def test_megatron_hides_tensor_parallel_collectives_behind_the_gemms_they_feed():
    s = BASE.replace(parallel={"dp": 2, "tp": 4, "zero": 1, "sequence_parallel": True})
    exposed = parts(s)
    hidden = parts(s.replace(framework="megatron"))
    v = hidden["_"]
    gemms = (
        v["t_lin"] + (v["lin"] + v["head"]) * 2.0 / v["rate"] + v["io"] / v["hbm"] * 2.0
    )  # forward + backward
    assert v["t_tp"] == pytest.approx(max(exposed["_"]["t_tp"] - gemms, 0.0), rel=1e-12)
    assert v["t_tp"] < exposed["_"]["t_tp"]
    assert hidden["step_time_s"] < exposed["step_time_s"]


def test_plan_json_carries_hours_and_dollars_for_the_tokens_to_train():
    p = plan(TINY, "a100-80gb", (1, 2), seq_len=512, rank_by="time", train_tokens=3.6e9, price=2.0, top=3)
    d = p.to_dict()
    assert d["train_tokens"] == 3.6e9 and d["price_per_gpu_hour"] == 2.0 and d["ranked_by"].startswith("time")
    for c in d["candidates"]:
        gpus, tok = c["scenario"]["num_gpus"], c["throughput"]["tokens_per_gpu_s"]
        assert c["cost"]["wall_hours"] == pytest.approx(3.6e9 / (tok * gpus) / 3600, rel=1e-12)
        assert c["cost"]["dollars"] == pytest.approx(c["cost"]["gpu_hours"] * 2.0, rel=1e-12)
    with pytest.raises(ScenarioError, match="rank_by"):
        plan(TINY, "a100-80gb", 1, rank_by="speed")


# ----- bounds: no method reaches more than the card's matmul efficiency -----------------------------------


@settings(max_examples=25, deadline=None)
@given(
    model=st.sampled_from(["llama-3.2-1b", "qwen2.5-0.5b", "llama-3.1-8b"]),
    gpu=st.sampled_from(["rtx-4090", "rtx-3090", "a100-80gb", "h100-sxm-80gb", "l4"]),
    method=st.sampled_from(["full", "lora", "qlora"]),
    ckpt=st.sampled_from(["none", "selective", "full"]),
    offload=st.sampled_from(["none", "optimizer", "optimizer+params"]),
    dp=st.sampled_from([1, 2, 8]),
    seq=st.sampled_from([512, 4096]),
)
def test_mfu_and_tokens_per_second_stay_under_what_the_card_computes(
    model, gpu, method, ckpt, offload, dp, seq
):
    """The time of a step is at least its matmul FLOPs at peak x efficiency, so MFU -- counting what the method
    computes (LoRA/QLoRA: no weight gradients for the base) -- stays below the efficiency, and tokens/s below
    peak / FLOPs per token, for every method, card and offload (the 90.6% of 70B QLoRA on a 4090 was 6N
    counted for a 4N step)."""
    sc = Scenario.from_dict(
        {
            "model": model,
            "gpu": gpu,
            "method": method,
            "seq_len": seq,
            "activation_checkpointing": ckpt,
            "parallel": {
                "dp": dp,
                "zero": 3 if offload == "optimizer+params" else (1 if offload != "none" else 0),
                "offload": offload,
            },
        }  # fmt: skip
    )
    ctx = Context(sc)
    k = context_time_model(ctx)
    est = estimate(sc)
    assert 0 < est.mfu <= k.efficiency
    assert est.tokens_per_second_per_gpu * est.time.model_flops_per_token <= k.peak_flops * k.efficiency * (
        1 + 1e-12
    )
    if method != "full":
        assert est.time.model_flops_per_token < model_flops(ctx.arch).model_flops_per_token(k.seq_len)
    if offload == "optimizer+params":
        # the weights cross PCIe twice per micro-batch (forward and backward), each rank its 1/dp shard, at no
        # fewer than NF4's 0.5 B per parameter (QLoRA) or 2 B (16-bit), and no faster than the link's datasheet rate
        floor = {"qlora": 0.5}.get(method, 2.0) * ctx.arch.parameters / dp * 2 / (k.speed.pcie_gb_s * 1e9)
        offloaded = sum(i.seconds for i in est.time.items if i.category == "offload")
        assert offloaded >= floor and est.step_time_s >= floor
        tokens_per_step = seq * sc.micro_batch_size * sc.grad_accum_steps
        assert est.tokens_per_second_per_gpu <= tokens_per_step / floor
