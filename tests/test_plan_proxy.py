"""The throughput proxy orders layouts the way its documented facts say (plan/proxy.py)."""

from __future__ import annotations

import numpy as np
import pytest

from memsim_widget.engine.context import Context
from memsim_widget.plan import proxy
from memsim_widget.scenario import Scenario

BASE = Scenario(model="llama-3.1-70b", gpu="h100-sxm-80gb", seq_len=8192)
ONE = {"dp": 8, "tp": 8, "pp": 1, "cp": 1, "micro_batch": 1, "grad_accum": 16, "pp_microbatches": 1,
       "checkpointing": 0, "loss": 0, "zero": 1, "offload": 0}  # fmt: skip


def run(base: Scenario = BASE, **changes: int) -> dict[str, float]:
    ctx = Context(base)
    trainable = ctx.arch.parameters if ctx.full_training else sum(a.numel for a in ctx.adapters)
    cols = {k: np.array([changes.get(k, v)]) for k, v in ONE.items()}
    return {k: float(v[0]) for k, v in proxy.throughput(base, ctx.arch, ctx.gpu, trainable, cols).items()}


def test_full_recomputation_costs_a_third_of_full_training_compute():
    none, full = run(checkpointing=0), run(checkpointing=2)
    assert full["recompute"] == pytest.approx(2 / 6)
    assert full["compute_s"] == pytest.approx(none["compute_s"] * (1 + 2 / 6))
    assert full["tokens_per_gpu_s"] < run(checkpointing=1)["tokens_per_gpu_s"] < none["tokens_per_gpu_s"]


def test_pipeline_bubble_is_p_minus_1_over_m_plus_p_minus_1():
    for m in (4, 16, 64):
        r = run(dp=2, pp=4, grad_accum=1, pp_microbatches=m)
        assert r["bubble"] == pytest.approx(3 / (m + 3))
    assert (
        run(dp=2, pp=4, grad_accum=1, pp_microbatches=64)["tokens_per_gpu_s"]
        > run(dp=2, pp=4, grad_accum=1, pp_microbatches=4)["tokens_per_gpu_s"]
    )


def test_bigger_micro_batches_use_the_gpu_better_at_the_same_global_batch():
    small, big = run(micro_batch=1, grad_accum=16), run(micro_batch=4, grad_accum=4)
    assert big["tokens_per_gpu_s"] > small["tokens_per_gpu_s"]


def test_zero3_adds_communication_and_offload_adds_host_time():
    assert run(zero=3)["communication_s"] > run(zero=2)["communication_s"] == run(zero=1)["communication_s"]
    assert run(offload=1)["offload_s"] > 0 == run(offload=0)["offload_s"]
    assert run(offload=1)["tokens_per_gpu_s"] < run(offload=0)["tokens_per_gpu_s"]


def test_tensor_parallel_across_nodes_is_slower_than_within_one():
    inside = run(dp=8, tp=8)
    across = run(dp=4, tp=16)
    assert across["communication_s"] > inside["communication_s"]


def test_adapters_cost_less_compute_than_full_training_and_qlora_more_than_lora():
    lora = run(BASE.replace(method="lora"))
    qlora = run(BASE.replace(method="qlora"))
    full = run()
    assert lora["compute_s"] == pytest.approx(full["compute_s"] * 4 / 6, rel=1e-9)
    assert qlora["compute_s"] == pytest.approx(lora["compute_s"] * proxy.QLORA_COMPUTE)


def test_moe_counts_only_routed_experts():
    ctx = Context(Scenario(model="mixtral-8x7b"))
    active = proxy.active_parameters(ctx.arch)
    assert active < ctx.arch.parameters
    experts = sum(g.numel for g in ctx.arch.params if g.expert)
    assert active == ctx.arch.parameters - experts + experts * 2 // 8
