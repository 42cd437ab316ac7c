"""The GPU catalog (catalog/gpus.json): one complete record per card, capacities as the driver reports them,
the names nvidia-smi and the clouds print, and what happens to a card registered without its speeds or price."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memsim_widget import Scenario, ScenarioError, cost, estimate
from memsim_widget.catalog.gpus import (
    CATALOG_FILE,
    DTYPES,
    GENERATIONS,
    GPU,
    GPUS,
    MEMORY_KINDS,
    GPUSpeed,
    MemorySource,
    Price,
    canonical_gpu_id,
    gpu_from_record,
    register_gpu,
    resolve_gpu,
)
from memsim_widget.cost import DEFAULT_PRICE, PRICES, price_note, price_of, set_price, training_cost
from memsim_widget.engine.speed.gpu_speed import DEFAULT_SPEED, gpu_speed

MiB, GiB = 1024**2, 1024**3
RECORDS = json.loads(CATALOG_FILE.read_text())["gpu"]
CATALOG_IDS = [r["id"] for r in RECORDS]


@pytest.mark.parametrize("rec", RECORDS, ids=CATALOG_IDS)
def test_each_record_is_complete(rec):
    """Every card: memory with its kind and a citation, generation, context, workspace, a speed record with
    16-bit and fp32 peaks and all four bandwidths, and its names."""
    assert rec["memory"]["kind"] in MEMORY_KINDS and rec["memory"]["kind"] != "user"
    assert len(rec["memory"]["source"]) > 30  # a citation, not a placeholder
    assert rec["generation"] in GENERATIONS
    assert rec["context_bytes"] > 0 and rec["cublas_workspace_bytes"] > 0
    assert rec["names"], "nvidia-smi / rocm-smi / cloud names that resolve"
    speed = rec["speed"]
    assert {"fp32", "hbm_gb_s", "link_gb_s", "net_gb_s", "pcie_gb_s", "source"} <= set(speed)
    assert "bf16" in speed or "fp16" in speed
    assert set(speed) <= {
        *DTYPES,
        "hbm_gb_s",
        "link_gb_s",
        "net_gb_s",
        "pcie_gb_s",
        "nvlink_domain",
        "source",
    }
    if "price" in rec:  # a price names its date and source; a card without one is priced as unknown
        assert set(rec["price"]) == {"usd_per_gpu_hour", "date", "source"}


def test_the_2026_cards_are_in_the_catalog():
    for gid in ("b300", "gb200", "mi325x", "mi355x", "rtx-pro-6000", "rtx-4080", "rtx-4070", "rtx-3060", "h20",
                "l40", "a40", "a800-80gb", "h800", "h100-96gb"):  # fmt: skip
        assert gid in GPUS


@pytest.mark.parametrize("gid", CATALOG_IDS)
def test_reported_capacity_is_below_the_label_and_within_ten_percent_of_it(gid):
    """The driver keeps some memory: total_memory is under the marketing label read as GiB, by at most 10%
    (the T4: 14.58 of 16; the L4 21.95 of 24; the B300 267.88 of 288, whose label is decimal GB)."""
    g = GPUS[gid]
    label = g.label_gb * GiB
    assert label * 0.9 < g.memory_bytes < label


def test_headline_capacities_are_the_measured_ones():
    """The figures people quote from torch and deviceQuery (catalog/gpus.json cites each)."""
    assert GPUS["h100-sxm-80gb"].memory_bytes == 85_045_477_376  # deviceQuery, 81106 MiB = 79.20 GiB
    assert GPUS["a100-80gb"].memory_bytes == 85_100_068_864
    assert GPUS["h200"].memory_bytes == 143_156 * MiB
    assert GPUS["mi300x"].memory_bytes == 206_141_652_992  # rocm-smi VRAM Total Memory (B)
    assert GPUS["h800"].memory_bytes == GPUS["h100-sxm-80gb"].memory_bytes  # same board


#: Public readings of a Hopper training step's memory outside PyTorch: PyTorch's OOM message in a single process
#: without NCCL prints the process's device memory in use, what PyTorch allocated, and what it reserved but left
#: unallocated; the first less the other two is the CUDA context with the kernels loaded so far
#: (docs/memory-facts.md#memory-outside-the-tensors, [ETU-h200] and [FTS-h100pcie]).
HOPPER_OOM_READINGS = {
    "h200": ((139.75, GiB), (138.59, GiB), (508.12, MiB)),  # LoRA on a 7B Mistral, first step's forward
    "h100-pcie-80gb": ((79.13, GiB), (77.91, GiB), (648.28, MiB)),  # a 538M-parameter MoE in fp32
}


@pytest.mark.parametrize("gid", sorted(HOPPER_OOM_READINGS))
def test_a_hopper_context_is_its_public_reading_to_the_hundredth_gib(gid):
    """The messages print GiB to two decimals, so the catalog takes the reading rounded to 0.01 GiB (the H200:
    139.75 - 138.59 - 0.496 = 0.664 -> 0.66 GiB; the H100 PCIe, 18 SMs fewer: 0.587 -> 0.59 GiB)."""
    (used, u), (allocated, a), (unallocated, n) = HOPPER_OOM_READINGS[gid]
    outside = used * u - allocated * a - unallocated * n
    assert GPUS[gid].context_bytes == int(round(outside / GiB, 2) * GiB)


def test_hopper_cards_with_the_h200s_132_sms_take_its_context():
    """The H100 SXM, the H800 (the same board) and the GH200's 96 GB H100 have the H200's 132 SMs; the H100 PCIe
    (114 SMs) reads less. The H20 (78 SMs) has no public reading and keeps the lazy-loading band's 0.5 GiB."""
    for gid in ("h100-sxm-80gb", "h800", "h100-96gb"):
        assert GPUS[gid].context_bytes == GPUS["h200"].context_bytes
    assert GPUS["h100-pcie-80gb"].context_bytes < GPUS["h200"].context_bytes
    assert GPUS["h20"].context_bytes == 512 * MiB


def test_a_custom_card_takes_the_default_cards_context():
    """A card known by its size alone is estimated as the default H100 SXM would be outside the allocator, so a
    custom card sized from the default card's estimate holds the same room for the allocator."""
    from memsim_widget.catalog.gpus import custom_gpu

    assert custom_gpu(48).context_bytes == GPUS["h100-sxm-80gb"].context_bytes == int(0.66 * GiB)


@pytest.mark.parametrize("rec", RECORDS, ids=CATALOG_IDS)
def test_every_printed_name_resolves_to_its_card(rec):
    for name in rec["names"]:
        assert canonical_gpu_id(name) == rec["id"], name
        assert resolve_gpu(name).id == rec["id"]


@pytest.mark.parametrize(
    ("typed", "gid"),
    [
        ("NVIDIA H100 80GB HBM3", "h100-sxm-80gb"),
        ("H100-SXM", "h100-sxm-80gb"),
        ("a3-highgpu-8g", "h100-sxm-80gb"),
        ("p5.48xlarge", "h100-sxm-80gb"),
        ("NVIDIA H100 PCIe", "h100-pcie-80gb"),
        ("NVIDIA A100-SXM4-80GB", "a100-80gb"),
        ("NVIDIA A800-SXM4-80GB", "a800-80gb"),
        ("NVIDIA B300 SXM6 AC", "b300"),
        ("NVIDIA GB200", "gb200"),
        ("NVIDIA B200", "b200"),
        ("NVIDIA L40", "l40"),
        ("NVIDIA L40S", "l40s"),
        ("NVIDIA H20", "h20"),
        ("nvidia h200", "h200"),
        ("AMD Instinct MI355X", "mi355x"),
        ("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "rtx-pro-6000"),
        ("NVIDIA GeForce RTX 3060", "rtx-3060"),
        ("Tesla T4", "t4"),
    ],
)
def test_names_people_type_resolve(typed, gid):
    assert resolve_gpu(typed).id == gid


def test_no_printed_name_belongs_to_two_cards():
    seen: dict[str, str] = {}
    for rec in RECORDS:
        for name in rec["names"]:
            assert seen.setdefault(name.lower(), rec["id"]) == rec["id"], name


def test_an_ambiguous_name_still_says_which_cards():
    with pytest.raises(ScenarioError, match="h100-pcie-80gb.*h100-sxm-80gb"):
        resolve_gpu("H100")


def test_speeds_and_prices_come_from_the_record():
    g = GPUS["h100-sxm-80gb"]
    assert gpu_speed(g) is g.speed and g.speed.tflops == 989 and dict(g.speed.peak_tflops)["fp8"] == 1979
    assert price_of("h100-sxm-80gb") == g.price.usd_per_gpu_hour == PRICES["h100-sxm-80gb"]
    assert "2025" in price_note("h100-sxm-80gb")
    assert dict(GPUS["b300"].speed.peak_tflops)["fp4"] == 14000  # fp4 where the card has it
    assert "fp8" not in dict(GPUS["a100-80gb"].speed.peak_tflops)  # not where it has not


@pytest.fixture
def restore_catalog():
    gpus, prices, user = dict(GPUS), dict(PRICES), set(cost._SET_BY_USER)
    yield
    GPUS.clear()
    GPUS.update(gpus)
    PRICES.clear()
    PRICES.update(prices)
    cost._SET_BY_USER.clear()
    cost._SET_BY_USER.update(user)
    register_gpu(GPUS["h100-sxm-80gb"])  # rebuild the printed-name table


def test_a_card_registered_without_speed_or_price_says_so(restore_catalog):
    """The documented behaviour: speed/price None = unknown; the figures use an H100 SXM's and are labelled."""
    register_gpu(GPU("my-card", "My Card 96GB", 96 * GiB, "blackwell", 550 * MiB, 32 * MiB))
    est = estimate(Scenario(model="llama-3.2-1b", gpu="my-card", seq_len=512))
    assert gpu_speed(est.gpu) is DEFAULT_SPEED
    assert any("speeds unknown" in c and "h100-sxm-80gb" in c for c in est.time_caveats)
    assert price_of("my-card") == DEFAULT_PRICE and "unknown" in price_note("my-card")
    cost = training_cost(est, 1e9)
    assert "unknown" in cost.price_source and cost.price_per_gpu_hour == DEFAULT_PRICE
    set_price("my-card", 4.0)
    assert price_of("my-card") == 4.0 and price_note("my-card") == "set with cost.set_price"


def test_a_card_registered_with_its_speed_and_price_uses_them(restore_catalog):
    speed = GPUSpeed(500, 125, 1792, 64, 12.5, 64)
    register_gpu(GPU("my-card", "My Card", 96 * GiB, "blackwell", 550 * MiB, 32 * MiB,
                     speed=speed, price=Price(1.5, "2026-12", "my quote")))  # fmt: skip
    est = estimate(Scenario(model="llama-3.2-1b", gpu="my-card", seq_len=512))
    assert gpu_speed(est.gpu) is speed and not any("speeds unknown" in c for c in est.time_caveats)
    assert price_of("my-card") == 1.5 and price_note("my-card") == "my quote, 2026-12"


def test_a_custom_size_has_unknown_speed_labelled():
    est = estimate(Scenario(model="llama-3.2-1b", gpu={"memory_gib": 24}, seq_len=512))
    assert est.gpu.speed is None and est.gpu.memory_source.kind == "user"
    assert any("speeds unknown" in c for c in est.time_caveats)
    assert not any(
        "speeds unknown" in c for c in estimate(Scenario(model="llama-3.2-1b", seq_len=512)).time_caveats
    )


H100 = GPUS["h100-sxm-80gb"]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"id": ""}, "gpu.id"),
        ({"name": 3}, "gpu.name"),
        ({"memory_bytes": 0}, "gpu.memory_bytes"),
        ({"memory_bytes": 80.5}, "gpu.memory_bytes"),
        ({"memory_bytes": 2**80}, "gpu.memory_bytes"),
        ({"generation": "hoper"}, "gpu.generation"),
        ({"context_bytes": -1}, "gpu.context_bytes"),
        ({"cublas_workspace_bytes": None}, "gpu.cublas_workspace_bytes"),
        ({"speed": {"tflops": 989}}, "gpu.speed"),
        ({"speed": GPUSpeed(float("nan"), 67, 3350, 450, 50, 64)}, "gpu.speed.tflops"),
        ({"speed": GPUSpeed(989, 67, 0, 450, 50, 64)}, "gpu.speed.hbm_gb_s"),
        ({"speed": GPUSpeed(989, 67, 3350, 450, 50, 64, nvlink_domain=0)}, "gpu.speed.nvlink_domain"),
        ({"speed": GPUSpeed(989, 67, 3350, 450, 50, 64, nvlink_domain=7.5)}, "gpu.speed.nvlink_domain"),  # type: ignore[arg-type]
        ({"price": 3.0}, "gpu.price"),
        ({"price": Price(-1, "2025", "x")}, "gpu.price.usd_per_gpu_hour"),
        ({"memory_source": MemorySource("guessed", "x")}, "gpu.memory_source"),
        ({"names": ["NVIDIA H100"]}, "gpu.names"),
    ],
)
def test_a_bad_record_is_one_error_naming_the_field(change, field, restore_catalog):
    with pytest.raises(ScenarioError) as e:
        register_gpu(dataclasses.replace(H100, **{"id": "bad", **change}))
    assert e.value.field == field
    assert "bad" not in GPUS


def test_register_gpu_refuses_what_is_not_a_record():
    with pytest.raises(ScenarioError, match="^gpu: must be a GPU"):
        register_gpu({"id": "x"})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("drop", "field"),
    [("memory", "gpus.json[h200].memory"), ("generation", "gpus.json[h200].generation")],
)
def test_a_bad_catalog_record_names_the_card_and_field(drop, field):
    rec = {k: v for k, v in next(r for r in RECORDS if r["id"] == "h200").items() if k != drop}
    with pytest.raises(ScenarioError) as e:
        gpu_from_record(rec)
    assert e.value.field == field


def test_a_bad_catalog_value_names_the_card_and_field():
    rec = next(r for r in RECORDS if r["id"] == "h200")
    with pytest.raises(ScenarioError) as e:
        gpu_from_record({**rec, "memory": {**rec["memory"], "bytes": -5}})
    assert e.value.field == "gpus.json[h200].memory_bytes"
    with pytest.raises(ScenarioError) as e:
        gpu_from_record({**rec, "speed": {**rec["speed"], "fp64": 67}})
    assert e.value.field == "gpus.json[h200].speed"
    with pytest.raises(ScenarioError) as e:
        gpu_from_record({**rec, "speed": {**rec["speed"], "fp8": "1979"}})
    assert e.value.field == "gpus.json[h200].speed.fp8"
    with pytest.raises(ScenarioError) as e:
        gpu_from_record({**rec, "price": {"usd_per_gpu_hour": 3.8}})
    assert e.value.field == "gpus.json[h200].price"
    with pytest.raises(ScenarioError) as e:
        gpu_from_record({**rec, "speed": {**rec["speed"], "nvlink_domain": "72"}})
    assert e.value.field == "gpus.json[h200].speed.nvlink_domain"


def test_a_gb200_nvl72_rack_is_one_nvlink_domain_of_72_gpus():
    """NVIDIA's GB200 NVL72 joins 72 GPUs by NVLink; every other card's record leaves the default, a DGX/HGX node
    of 8 (catalog/gpus.json)."""
    assert GPUS["gb200"].speed.nvlink_domain == 72
    assert {g.speed.nvlink_domain for gid, g in GPUS.items() if g.speed and gid != "gb200"} == {8}


def test_a_job_inside_one_nvlink_domain_gathers_over_nvlink(restore_catalog):
    """Llama 3.1 70B on 64 GB200s, ZeRO-3: inside the NVL72's domain the FSDP gathers run at the NVLink rate; the
    same card with an 8-GPU domain sends them over the network: the
    gather time scales as link / network bandwidth."""
    from memsim_widget.engine.context import Context
    from memsim_widget.engine.speed import step_time as st_
    from memsim_widget.engine.speed.time_breakdown import context_time_model

    gb = GPUS["gb200"]
    hgx = dataclasses.replace(gb.speed, nvlink_domain=8)
    register_gpu(dataclasses.replace(gb, id="gb200-hgx", names=(), speed=hgx))
    base = {
        "model": "llama-3.1-70b",
        "seq_len": 8192,
        "micro_batch_size": 2,
        "parallel": {"dp": 64, "zero": 3},
    }
    z3 = {}
    for gid in ("gb200", "gb200-hgx"):
        ctx = Context(Scenario.from_dict({**base, "gpu": gid}))
        cols = st_.scenario_columns(ctx.scenario, st_.optimizer_step_bytes(ctx.recipe, ctx.opt))
        z3[gid] = float(st_.step_parts(context_time_model(ctx), cols)["_"]["z3"])
    ratio = (gb.speed.link_gb_s * st_.NVLINK_EFFICIENCY) / (gb.speed.net_gb_s * st_.NETWORK_EFFICIENCY)
    assert z3["gb200-hgx"] / z3["gb200"] == pytest.approx(ratio, rel=1e-12)


@given(st.sampled_from(CATALOG_IDS))
def test_the_verdict_reads_the_reported_capacity(gid):
    """fits/verdict compare against memory_bytes (what the driver reports), never the label."""
    est = estimate(Scenario(model="gpt2", gpu=gid, seq_len=256))
    assert est.gpu.memory_bytes == GPUS[gid].memory_bytes < GPUS[gid].label_gb * GiB
    assert est.to_dict()["gpu_memory_bytes"] == GPUS[gid].memory_bytes


def test_the_docs_build_writes_every_record_into_docs_gpus_md():
    """docs/gpus.md holds a marker, not a copy: the docs build (scripts/mkdocs_hooks.py) writes the table from the
    records there, a row and a capacity source per card, so adding a card touches no page."""
    import importlib.util

    from memsim_widget.catalog.gpus import CATALOG_FILE as catalog

    pytest.importorskip("mkdocs")
    root = catalog.parents[2]
    spec = importlib.util.spec_from_file_location("mkdocs_hooks", root / "scripts" / "mkdocs_hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    text = (root / "docs" / "gpus.md").read_text()
    assert text.count("<!-- generated: gpu table -->") == 1
    page = hooks.fill_generated(text)
    for g in GPUS.values():
        assert f"\n| {g.id} |" not in text
        assert f"\n| {g.id} | {g.label_gb:g} GB | {g.memory_bytes:,} |" in page
        assert f"\n- **{g.id}** ({g.memory_source.kind}): " in page


def test_the_plan_states_what_it_assumes_for_a_card_without_speed_or_price():
    from memsim_widget.plan.search import plan
    from memsim_widget.plan.space import SearchSpace

    # what a plan assumes is the card's (its speeds, its price), whatever knobs it searches: a narrow space
    space = SearchSpace(tp=(1, 2), pp=(1,), cp=(1,), zero=(0, 3), micro_batch=(1, 4), checkpointing=("none",))
    known = plan("llama-3.2-1b", "h100-sxm-80gb", 8, top=1, space=space)
    assert known.assumptions == [] and "2025" in known.price_source
    new = plan("llama-3.2-1b", "b300", 8, top=1, space=space)  # speeds known, no price
    assert new.assumptions == [f"NVIDIA B300 288GB: price {price_note('b300')}"]
    assert new.to_dict(top=1)["assumptions"] == new.assumptions
    custom = plan("llama-3.2-1b", {"memory_gib": 48}, 8, top=1, space=space)
    assert any("speeds unknown" in a for a in custom.assumptions)
    assert plan("llama-3.2-1b", "b300", 8, top=1, price=7.0, space=space).assumptions == []
